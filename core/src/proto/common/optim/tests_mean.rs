//! Rule `Mean`: under BSP, static backup workers and DBW the model after each round is the
//! round's mean gradient, bit for bit (the accumulated gradients in arrival order, divided by
//! the round's count); every other protocol refuses the rule, naming it and the protocol.

use super::{Optimizer, Schedule};
use crate::error::ConfigError;
use crate::id::{Version, WorkerId};
use crate::msg::{ToServer, Values};
use crate::proto::backup::{BackupConfig, BackupServer, Interrupt};
use crate::proto::bsp::{BspConfig, BspServer};
use crate::proto::dbw::{DbwConfig, DbwServer};
use crate::proto::{AnyServer, Heap, ProtocolConfig, ProtocolKind, Server};
use crate::time::Instant;
use proptest::prelude::*;
use std::vec;
use std::vec::Vec;

#[test]
fn only_the_protocols_of_round_means_run_it() {
    let o = Optimizer::MEAN;
    for config in crate::proto::common::capacity_tests::configs(16) {
        let kind = config.kind();
        let server: AnyServer<f32, Vec<f32>, Heap> =
            AnyServer::new(&config, vec![0.0; 4], vec![0.0; config.server_scratch_len(4)]).unwrap();
        let fresh = server.with_optimizer(o, vec![0.0; o.state_len(4)]);
        let runs = match config {
            ProtocolConfig::Bsp(_) => true,
            ProtocolConfig::Backup(c) => c.interrupt == Interrupt::Abort,
            ProtocolConfig::Dbw(c) => c.interrupt == Interrupt::Abort,
            _ => false,
        };
        let name = match kind {
            ProtocolKind::Backup => "backup with interrupt complete",
            ProtocolKind::Dbw => "dbw with interrupt complete",
            other => other.as_str(),
        };
        let state = match fresh {
            Ok(s) => {
                assert!(runs, "{kind:?} took rule mean");
                assert_eq!(s.optimizer(), o);
                s.optimizer_state().unwrap().to_vec()
            }
            Err(e) => {
                assert!(!runs, "{kind:?} refused rule mean: {e}");
                assert_eq!(e, ConfigError::RuleUnsupported { rule: "mean", protocol: name });
                vec![0.0; o.state_len(4)]
            }
        };
        // Resuming from a checkpoint's state is refused the same way.
        let restored = server_with(&config).with_optimizer_state(o, state);
        assert_eq!(restored.is_ok(), runs, "{kind:?}");
        if let ProtocolConfig::Grouped(_) = config {
            let group: AnyServer<f32, Vec<f32>, Heap> =
                AnyServer::subserver(&config, 0, 1, vec![0.0; 4], vec![0.0; config.subserver_scratch_len(4)]).unwrap();
            let e = group.with_optimizer(o, vec![0.0; 40]).unwrap_err();
            assert_eq!(e, ConfigError::RuleUnsupported { rule: "mean", protocol: "grouped" });
        }
    }
}

fn server_with(config: &ProtocolConfig) -> AnyServer<f32, Vec<f32>, Heap> {
    AnyServer::new(config, vec![0.0; 4], vec![0.0; config.server_scratch_len(4)]).unwrap()
}

#[test]
fn stragglers_that_run_to_completion_refuse_it() {
    // Such a straggler gets only the newest model after its late gradient: it would miss rounds.
    let mut backup = BackupConfig::new(3, 0.1, 1);
    backup.interrupt = Interrupt::RunToCompletion;
    let mut dbw = DbwConfig::new(3, 0.1);
    dbw.interrupt = Interrupt::RunToCompletion;
    for (config, protocol) in [
        (ProtocolConfig::Backup(backup), "backup with interrupt complete"),
        (ProtocolConfig::Dbw(dbw), "dbw with interrupt complete"),
    ] {
        let e = server_with(&config).with_optimizer(Optimizer::MEAN, vec![0.0; 40]).unwrap_err();
        assert_eq!(e, ConfigError::RuleUnsupported { rule: "mean", protocol });
    }
}

#[test]
fn a_schedule_under_mean_is_refused() {
    let o = Optimizer::MEAN.with_schedule(Schedule::Step { every: 1, gamma: 0.5 });
    assert_eq!(o.check(), Err(ConfigError::Knob("schedule")));
}

/// Feeds one round: `grads[i]` from worker `order[i]` on `base`, then drains the outputs.
fn feed<S: Server<f32>>(s: &mut S, base: u64, order: &[u32], grads: &[Vec<f32>], seq: u64) {
    for (w, g) in order.iter().zip(grads) {
        let bytes: Vec<u8> = g.iter().flat_map(|v| v.to_le_bytes()).collect();
        // Alternate the two payload shapes: the mean must not depend on it.
        let values = if w % 2 == 0 { Values::Slice(&g[..]) } else { Values::LittleEndian(&bytes[..]) };
        let msg = ToServer::Grad { base: Version(base), iteration: base, seq, values, loss: None };
        // A gradient past the round's close (a backup worker's) is dropped, not an error.
        let _ = s.handle(Instant::ZERO, WorkerId(*w), msg);
        while s.poll_output().is_some() {}
    }
}

/// The round's mean as the server must publish it: the sum in arrival order, divided by `k`.
fn mean(grads: &[Vec<f32>], k: usize) -> Vec<f32> {
    let mut acc = vec![0.0f32; grads[0].len()];
    for g in &grads[..k] {
        for (a, v) in acc.iter_mut().zip(g) {
            *a += *v;
        }
    }
    acc.iter().map(|a| a / k as f32).collect()
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 64, ..ProptestConfig::default() })]

    #[test]
    fn every_round_publishes_its_exact_mean(
        n in 1u32..6,
        b in 0u32..3,
        dim in 1usize..9,
        rounds in proptest::collection::vec(
            (proptest::collection::vec(-1.0e6f32..1.0e6, 48), 0u64..1000), 1..5),
        which in 0u8..4,
    ) {
        let b = b.min(n - 1);
        let k = (n - b) as usize;
        let initial: Vec<f32> = (0..dim).map(|i| i as f32 + 0.5).collect();
        let o = Optimizer::MEAN;
        let mut s: AnyServer<f32, Vec<f32>, Heap> = match which {
            0 => AnyServer::Bsp(BspServer::new(BspConfig::new(n, 0.3), initial.clone(), vec![0.0; dim]).unwrap()),
            // BSP with its spare accumulator: the fused close of the last gradient.
            1 => AnyServer::Bsp(
                BspServer::new(BspConfig::new(n, 0.3), initial.clone(), vec![0.0; dim])
                    .unwrap()
                    .with_spare_accumulator(vec![0.0; dim])
                    .unwrap(),
            ),
            2 => {
                let c = BackupConfig::new(n, 0.3, b);
                let scratch = vec![0.0; ProtocolConfig::Backup(c).server_scratch_len(dim)];
                AnyServer::Backup(BackupServer::new(c, initial.clone(), scratch).unwrap())
            }
            _ => {
                let mut c = DbwConfig::new(n, 0.3);
                c.k_min = n;
                let scratch = vec![0.0; ProtocolConfig::Dbw(c).server_scratch_len(dim)];
                AnyServer::Dbw(DbwServer::new(c, initial.clone(), scratch).unwrap())
            }
        };
        let k = if which == 3 { n as usize } else if which == 2 { k } else { n as usize };
        s = s.with_optimizer(o, vec![f32::NAN; o.state_len(dim)]).unwrap();
        prop_assert_eq!(s.params(), &initial[..]);
        for (r, (pool, shuffle)) in rounds.iter().enumerate() {
            let grads: Vec<Vec<f32>> =
                (0..n as usize).map(|w| pool.iter().cycle().skip(w * 7).take(dim).copied().collect()).collect();
            let mut order: Vec<u32> = (0..n).collect();
            // A rotation of the workers by the round's draw: arrival order varies.
            order.rotate_left((*shuffle % u64::from(n)) as usize);
            let ordered: Vec<Vec<f32>> = order.iter().map(|w| grads[*w as usize].clone()).collect();
            feed(&mut s, r as u64, &order, &ordered, r as u64);
            prop_assert_eq!(s.version(), Version(r as u64 + 1));
            let want = mean(&ordered, k);
            prop_assert_eq!(s.params(), &want[..], "round {}", r);
        }
        prop_assert_eq!(s.optimizer_steps(), rounds.len() as u64);
    }
}
