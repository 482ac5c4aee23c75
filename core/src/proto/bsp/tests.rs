//! BSP's unit and property tests.

use super::*;
use crate::proto::common::testkit::drain_server as drain;
use crate::proto::common::testkit::prelude::*;
use crate::proto::{LargeGradient, ServerOutput, ToWorkerOwned};
use proptest::prelude::*;
use std::vec;
use std::vec::Vec;

fn server(n: u32, dim: usize) -> BspServer<f64, Vec<f64>> {
    BspServer::new(BspConfig::new(n, 0.5), vec![1.0; dim], vec![0.0; dim]).unwrap()
}

#[test]
fn one_round_applies_the_mean_and_broadcasts() {
    let mut s = server(2, 2);
    s.handle(Instant::ZERO, WorkerId(0), grad(0, 0, &[2.0, 4.0])).unwrap();
    assert_eq!(s.version(), Version(0));
    s.handle(Instant::ZERO, WorkerId(1), grad(0, 0, &[4.0, 8.0])).unwrap();
    assert_eq!(s.version(), Version(1));
    // w = 1 - 0.5 * mean([2,4],[4,8]) = 1 - 0.5*[3,6]
    assert_eq!(s.params(), &[-0.5, -2.0]);
    let (events, sends) = drain(&mut s);
    let applied: Vec<_> = events.iter().filter(|e| matches!(e, ServerEvent::Applied { .. })).collect();
    assert_eq!(applied.len(), 2);
    assert!(events.contains(&ServerEvent::ModelUpdated { version: Version(1), contributions: 2, mean_loss: None }));
    assert_eq!(sends.len(), 1);
    assert_eq!(sends[0].0, Recipient::AllWorkers);
    assert_eq!(sends[0].1, ToWorkerOwned::Model { version: 1, clock: 1, values: vec![-0.5, -2.0] });
}

#[test]
fn refusals_change_nothing() {
    let mut s = server(2, 2);
    s.handle(Instant::ZERO, WorkerId(0), grad(0, 3, &[1.0, 1.0])).unwrap();
    let _ = drain(&mut s);
    let before = (s.params().to_vec(), s.version(), s.contributors().collect::<Vec<_>>());
    let now = Instant::ZERO;
    assert_duplicates(&mut s, now, &[3, 2, 4]);
    assert_gradient_refusals(&mut s, now, 2);
    assert_eq!(
        s.handle(now, WorkerId(1), grad(7, 0, &[1.0, 1.0])),
        Err(Reject::FutureVersion { claimed: Version(7), current: Version(0) })
    );
    let le = [0u8; 15];
    assert!(matches!(
        s.handle(
            now,
            WorkerId(1),
            ToServer::Grad { base: Version(0), iteration: 0, seq: 0, values: Values::LittleEndian(&le), loss: None }
        ),
        Err(Reject::WrongLength(_))
    ));
    assert_eq!((s.params().to_vec(), s.version(), s.contributors().collect::<Vec<_>>()), before);
    assert!(s.poll_output().is_none());
    assert_eq!(s.stats().rejected, 11);
    assert_eq!(s.stats().accepted, 1);
}

#[test]
fn stale_gradient_is_dropped_with_an_event() {
    let mut s = server(1, 1);
    s.handle(Instant::ZERO, WorkerId(0), grad(0, 0, &[1.0])).unwrap();
    let _ = drain(&mut s);
    s.handle(Instant::ZERO, WorkerId(0), grad(0, 1, &[1.0])).unwrap();
    let (events, sends) = drain(&mut s);
    assert_eq!(events, [ServerEvent::Dropped { worker: WorkerId(0), base: Version(0), reason: DropReason::Stale }]);
    assert!(sends.is_empty());
    assert_eq!(s.stats().dropped_for(DropReason::Stale), 1);
}

#[test]
fn stall_is_reported_naming_the_missing_worker() {
    let mut cfg = BspConfig::new(3, 0.5);
    cfg.stall_report = Some(Duration::from_secs(1));
    let mut s: BspServer<f32, Vec<f32>> = BspServer::new(cfg, vec![0.0; 1], vec![0.0; 1]).unwrap();
    s.handle(
        Instant::ZERO,
        WorkerId(0),
        ToServer::Grad { base: Version(0), iteration: 0, seq: 0, values: Values::Slice(&[1.0]), loss: None },
    )
    .unwrap();
    s.handle_worker_lost(Instant::ZERO, WorkerId(1)).unwrap();
    while s.poll_output().is_some() {}
    let at = s.poll_timeout().unwrap();
    assert_eq!(at, Instant::ZERO + Duration::from_secs(1));
    s.handle_timeout(at);
    let out = s.poll_output();
    assert!(matches!(
        out,
        Some(ServerOutput::Event(ServerEvent::Stalled { waiting_for: WorkerId(1), missing: 2, .. }))
    ));
    assert!(s.poll_timeout().unwrap() > at);
}

#[test]
fn the_server_says_every_worker_the_round_awaits_live_or_not() {
    let mut s = server(4, 1);
    assert!((0..4).all(|w| s.awaits(WorkerId(w))), "a fresh round awaits everyone");
    s.handle(Instant::ZERO, WorkerId(2), grad(0, 0, &[1.0])).unwrap();
    s.handle_worker_lost(Instant::ZERO, WorkerId(3)).unwrap();
    drain(&mut s);
    let awaited: Vec<u32> = (0..6).filter(|w| s.awaits(WorkerId(*w))).collect();
    assert_eq!(awaited, [0, 1, 3], "the lost worker too; ids outside the run never");
}

#[test]
fn join_answers_with_the_model_and_rejects_stale_epochs() {
    let mut s = server(2, 1);
    s.handle(Instant::ZERO, WorkerId(1), ToServer::Join { epoch: 2 }).unwrap();
    let (events, sends) = drain(&mut s);
    assert_eq!(events, [ServerEvent::WorkerJoined { worker: WorkerId(1), epoch: 2 }]);
    assert_eq!(sends[0].0, Recipient::Worker(WorkerId(1)));
    assert_eq!(
        s.handle(Instant::ZERO, WorkerId(1), ToServer::Join { epoch: 1 }),
        Err(Reject::StaleEpoch { worker: WorkerId(1), epoch: 1 })
    );
}

#[test]
fn config_errors() {
    let bad = |c: BspConfig, p: usize, a: usize| BspServer::<f32, Vec<f32>>::new(c, vec![0.0; p], vec![0.0; a]).err();
    assert_eq!(bad(BspConfig::new(0, 0.1), 1, 1), Some(ConfigError::WorkerCount(0)));
    assert_eq!(bad(BspConfig::new(1, f64::NAN), 1, 1), Some(ConfigError::LearningRate));
    assert_eq!(bad(BspConfig::new(1, -1.0), 1, 1), Some(ConfigError::LearningRate));
    assert_eq!(bad(BspConfig::new(1, 0.1), 0, 1), Some(ConfigError::EmptyModel));
    assert_eq!(bad(BspConfig::new(1, 0.1), 4, 3), Some(ConfigError::ScratchTooSmall { needed: 4, given: 3 }));
}

#[test]
fn spare_accumulator_must_cover_the_model() {
    let cfg = BspConfig::new(2, 0.5);
    let s: BspServer<f32, Vec<f32>> = BspServer::new(cfg, vec![0.0; 3], vec![0.0; 3]).unwrap();
    assert_eq!(
        s.with_spare_accumulator(vec![0.0; 2]).err(),
        Some(ConfigError::ScratchTooSmall { needed: 3, given: 2 })
    );
}

proptest! {
    /// With a spare accumulator (fused admission and accumulation) the server behaves
    /// bit for bit as without: the same verdict on every input (refusals included:
    /// wrong length, non-finite, clipped or too large, duplicates, future and stale
    /// versions), the same outputs, the same model.
    #[test]
    fn spare_accumulator_changes_no_bit(
        n in 1u32..5,
        dim in 1usize..40,
        sends in proptest::collection::vec((0u32..5, 0u8..12, -8i32..8, 0u64..3), 1..80),
        reject_large in proptest::bool::ANY,
    ) {
        let mut cfg = BspConfig::new(n, 0.375);
        let on_large = if reject_large { LargeGradient::Reject } else { LargeGradient::Clip };
        cfg.gradient_policy = GradientPolicy { max_norm: Some(20.0), on_large };
        let mk = || BspServer::<f32, Vec<f32>>::new(cfg, vec![0.25; dim], vec![9.0; dim]).unwrap();
        let (mut plain, mut fused) = (mk(), mk().with_spare_accumulator(vec![f32::NAN; dim + 3]).unwrap());
        let mut seqs = [0u64; 5];
        for (w, kind, x, lag) in sends {
            let mut g: Vec<f32> = (0..dim).map(|i| (x as f32) * 0.75 + i as f32 * 0.125).collect();
            match kind {
                0 => g[dim / 2] = f32::NAN,
                1 => g[0] = f32::NEG_INFINITY,
                2 => g.push(1.0),
                3 => g.iter_mut().for_each(|v| *v *= 1e20),
                4 => g.iter_mut().for_each(|v| *v *= 50.0),
                _ => {}
            }
            let seq = if kind == 5 { seqs[w as usize % 5].saturating_sub(1) } else { seqs[w as usize % 5] };
            seqs[w as usize % 5] = seq + 1;
            let base = Version((plain.version().0 + 1).saturating_sub(lag));
            let bytes: Vec<u8> = g.iter().flat_map(|v| v.to_le_bytes()).collect();
            let values = if x % 2 == 0 { Values::Slice(&g[..]) } else { Values::LittleEndian(&bytes[..]) };
            let msg = ToServer::Grad { base, iteration: 0, seq, values, loss: None };
            let (a, b) = (plain.handle(Instant::ZERO, WorkerId(w), msg), fused.handle(Instant::ZERO, WorkerId(w), msg));
            prop_assert_eq!(a, b);
            loop {
                let (x, y) = (plain.poll_output(), fused.poll_output());
                match (x, y) {
                    (None, None) => break,
                    (Some(ServerOutput::Event(e)), Some(ServerOutput::Event(f))) => prop_assert_eq!(e, f),
                    (Some(ServerOutput::Send { to, msg }), Some(ServerOutput::Send { to: t2, msg: m2 })) => {
                        prop_assert_eq!(to, t2);
                        prop_assert_eq!(ToWorkerOwned::from(&msg), ToWorkerOwned::from(&m2));
                    }
                    (x, y) => prop_assert!(false, "outputs differ: {:?} vs {:?}", x, y),
                }
            }
            let bits = |s: &BspServer<f32, Vec<f32>>| s.params().iter().map(|v| v.to_bits()).collect::<Vec<_>>();
            prop_assert_eq!(bits(&plain), bits(&fused));
            prop_assert_eq!(plain.contributors().collect::<Vec<_>>(), fused.contributors().collect::<Vec<_>>());
            prop_assert_eq!(plain.stats(), fused.stats());
        }
    }

    /// The round's last gradient is folded into the update (`params += a·(acc + f·g)`),
    /// with the bits of adding it then applying: the server against a reference built
    /// from the separate kernels, on values that round, clipped or not, slices and
    /// bytes, with and without a spare accumulator; a refused closing gradient (NaN,
    /// ±∞, too large, wrong length) changes nothing, and its clean resend closes.
    #[test]
    fn folded_close_matches_add_then_apply_bitwise(
        n in 1u32..5,
        dim in 1usize..40,
        rounds in proptest::collection::vec(proptest::collection::vec((-1e3f32..1e3, 0u8..10), 4), 1..5),
        spare in proptest::bool::ANY,
        reject_large in proptest::bool::ANY,
    ) {
        let lr = 0.3;
        let mut cfg = BspConfig::new(n, lr);
        let on_large = if reject_large { LargeGradient::Reject } else { LargeGradient::Clip };
        cfg.gradient_policy = GradientPolicy { max_norm: Some(4e3), on_large };
        let mut s = BspServer::<f32, Vec<f32>>::new(cfg, vec![0.7; dim], vec![3.0; dim]).unwrap();
        if spare {
            s = s.with_spare_accumulator(vec![f32::NAN; dim]).unwrap();
        }
        let (mut params, mut acc) = (vec![0.7f32; dim], vec![0.0f32; dim]);
        for (r, round) in rounds.iter().enumerate() {
            for (w, &(x, kind)) in round.iter().take(n as usize).enumerate() {
                let g: Vec<f32> = (0..dim).map(|i| x * 1.37 + i as f32 * 0.1234567 - 1.0 / 3.0).collect();
                let closing = w + 1 == n as usize;
                if closing || kind == 9 {
                    // A refused copy first: nothing changes.
                    let mut bad = g.clone();
                    match kind % 4 {
                        0 => bad[dim / 2] = f32::NAN,
                        1 => bad[dim - 1] = f32::NEG_INFINITY,
                        2 => bad.push(1.0),
                        _ => bad[0] = f32::MAX,
                    }
                    let before = (s.params().to_vec(), s.version(), s.contributors().collect::<Vec<_>>(), *s.stats());
                    let msg = ToServer::Grad { base: Version(r as u64), iteration: 0, seq: 2 * r as u64, values: Values::Slice(&bad[..]), loss: None };
                    prop_assert!(s.handle(Instant::ZERO, WorkerId(w as u32), msg).is_err());
                    prop_assert!(s.poll_output().is_none());
                    prop_assert_eq!(before.0, s.params().to_vec());
                    prop_assert_eq!((before.1, before.2), (s.version(), s.contributors().collect::<Vec<_>>()));
                    prop_assert_eq!(before.3.accepted, s.stats().accepted);
                }
                let bytes: Vec<u8> = g.iter().flat_map(|v| v.to_le_bytes()).collect();
                let values = if kind % 2 == 0 { Values::Slice(&g[..]) } else { Values::LittleEndian(&bytes[..]) };
                let f = cfg.gradient_policy.admit(&values, dim);
                let msg = ToServer::Grad { base: Version(r as u64), iteration: 0, seq: 2 * r as u64 + 1, values, loss: None };
                let got = s.handle(Instant::ZERO, WorkerId(w as u32), msg);
                prop_assert_eq!(got.is_ok(), f.is_ok());
                let Ok(f) = f else { return Ok(()) };
                if f == 1.0 { values.add_into(&mut acc).unwrap() } else { values.scaled_add_into(&mut acc, f).unwrap() }
                if closing {
                    math::apply_and_clear(&mut params, f32::from_f64(-lr / f64::from(n)), &mut acc).unwrap();
                    prop_assert_eq!(s.version(), Version(r as u64 + 1));
                }
                let bits = |v: &[f32]| v.iter().map(|x| x.to_bits()).collect::<Vec<_>>();
                prop_assert_eq!(bits(s.params()), bits(&params));
                while s.poll_output().is_some() {}
            }
        }
        prop_assert_eq!(s.stats().updates, s.version().0);
    }

    /// BSP applies exactly the mean of the n gradients computed at version v, once per
    /// version, whatever the arrival order, duplicates and stale copies in between.
    #[test]
    fn applies_exactly_the_mean_of_n(
        n in 1u32..9,
        dim in 1usize..6,
        rounds in 1usize..5,
        seed in any::<u64>(),
        grads in proptest::collection::vec(-64i32..64, 9 * 6 * 5),
    ) {
        let mut s = server(n, dim);
        let mut reference = vec![1.0f64; dim];
        let mut rng = seed;
        let mut next = || { rng = rng.wrapping_mul(6364136223846793005).wrapping_add(1442695040888963407); rng >> 33 };
        let mut seqs = vec![0u64; n as usize];
        for r in 0..rounds {
            let g = |w: usize, j: usize| f64::from(grads[((r * 9 + w) * 6 + j) % grads.len()]);
            let mut order: Vec<usize> = (0..n as usize).collect();
            for i in (1..order.len()).rev() { order.swap(i, next() as usize % (i + 1)); }
            for (pos, &w) in order.iter().enumerate() {
                let values: Vec<f64> = (0..dim).map(|j| g(w, j)).collect();
                prop_assert_eq!(s.version(), Version(r as u64));
                s.handle(Instant::ZERO, WorkerId(w as u32), grad(r as u64, seqs[w], &values)).unwrap();
                seqs[w] += 1;
                // A replay of the same message is refused and changes nothing.
                let snapshot = s.params().to_vec();
                prop_assert!(s.handle(Instant::ZERO, WorkerId(w as u32), grad(r as u64, seqs[w] - 1, &values)).is_err());
                prop_assert_eq!(s.params(), &snapshot[..]);
                if pos + 1 < order.len() { prop_assert_eq!(s.version(), Version(r as u64)); }
            }
            for (j, p) in reference.iter_mut().enumerate() {
                let sum: f64 = (0..n as usize).map(|w| g(w, j)).sum();
                *p += (-0.5 / f64::from(n)) * sum;
            }
            prop_assert_eq!(s.version(), Version(r as u64 + 1));
            prop_assert_eq!(s.params(), &reference[..]);
            let (events, _) = drain(&mut s);
            let mut applied: Vec<u32> = events.iter().filter_map(|e| match e {
                ServerEvent::Applied { worker, version, staleness: 0, .. } if *version == Version(r as u64 + 1) => Some(worker.0),
                _ => None,
            }).collect();
            applied.sort_unstable();
            prop_assert_eq!(applied, (0..n).collect::<Vec<_>>());
        }
        prop_assert_eq!(s.stats().applied, u64::from(n) * rounds as u64);
    }

    /// No input sequence panics, and the version only moves when n distinct workers sent a
    /// gradient for the current version.
    #[test]
    fn arbitrary_inputs_never_panic(ops in proptest::collection::vec((0u32..6, 0u64..4, 0u64..6, 0usize..4, -2.0f64..2.0, 0u8..8), 0..200)) {
        check_arbitrary_inputs(&mut server(4, 3), &ops, |s| s.received(), 3)?;
    }
}

#[test]
fn a_retried_join_after_the_gradient_arrived_gets_no_model() {
    // A worker that waited for the round and asks again (same session) lost nothing: the
    // model it would get is the one it computed on. A retry before its gradient arrived, or
    // after the round closed, still gets the model.
    let mut s = server(2, 2);
    let now = Instant::ZERO;
    s.handle(now, WorkerId(0), ToServer::Join { epoch: 0 }).unwrap();
    s.handle(now, WorkerId(0), ToServer::Join { epoch: 0 }).unwrap();
    assert_eq!(drain(&mut s).1.len(), 2);
    s.handle(now, WorkerId(0), grad(0, 0, &[1.0, 1.0])).unwrap();
    let _ = drain(&mut s);
    s.handle(now, WorkerId(0), ToServer::Join { epoch: 0 }).unwrap();
    assert!(drain(&mut s).1.is_empty());
    // A new session is answered: it may have lost the model the round's update brings.
    s.handle(now, WorkerId(0), ToServer::Join { epoch: 1 }).unwrap();
    assert_eq!(drain(&mut s).1.len(), 1);
    s.handle(now, WorkerId(1), grad(0, 0, &[1.0, 1.0])).unwrap();
    let _ = drain(&mut s);
    s.handle(now, WorkerId(1), ToServer::Join { epoch: 0 }).unwrap();
    let (_, sends) = drain(&mut s);
    assert_eq!(sends.len(), 1);
    assert_eq!(sends[0].0, Recipient::Worker(WorkerId(1)));
}
