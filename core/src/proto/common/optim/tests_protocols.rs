//! Every protocol routes every update of its model through the rule exactly once: on the test
//! network with a constant gradient, the rule's update count equals the server's updates,
//! and the model lands where the rule's closed form over that many updates puts it.

use super::{AdamW, Optimizer, Schedule};
use crate::id::WorkerId;
use crate::proto::{AnyServer, Heap, ProtocolConfig, Server};
use std::vec;
use std::vec::Vec;

const GRADIENT: [f64; 4] = [1.0, -1.0, 0.5, 0.25];

/// Every protocol on the test network (lock-step workers, the constant gradient) for a fixed
/// number of steps under `optimizer`: the final model, the server's updates and the rule's.
fn cluster_run(config: &ProtocolConfig, optimizer: Optimizer) -> (Vec<f64>, u64, u64) {
    let dim = GRADIENT.len();
    let mut server: AnyServer<f64, Vec<f64>, Heap> =
        AnyServer::new(config, vec![0.0; dim], vec![0.0; config.server_scratch_len(dim)]).unwrap();
    server = server.with_optimizer(optimizer, vec![0.0; optimizer.state_len(dim)]).unwrap();
    let server = super::tests_momentum::run_lockstep(config, server, |_| GRADIENT.to_vec());
    let updates = server.stats().updates;
    (server.params().to_vec(), updates, server.optimizer_steps())
}

/// The rate the rule steps with on `config`: the protocol's learning rate, for SSP the
/// worker's step (its payloads are `−η_step·g`).
fn rate(config: &ProtocolConfig) -> f64 {
    match config {
        ProtocolConfig::Ssp(c) => c.step_size(),
        _ => 0.1,
    }
}

/// Whether every update of `config` on this network carries the gradient as its direction.
/// Not WBSP's: a round holds the deltas that arrived while it was open, one or two per worker
/// here, so its direction varies (checked on hand-fed rounds below).
fn constant_direction(config: &ProtocolConfig) -> bool {
    !matches!(config, ProtocolConfig::Wbsp(_))
}

/// Nesterov's closed form for a constant direction: the displacement of `updates`
/// updates in units of `−η·g` under `schedule`.
fn nesterov_units(beta: f64, schedule: Schedule, updates: u64) -> f64 {
    (1..=updates).map(|t| schedule.factor(t - 1) * (1.0 + beta * (1.0 - beta.powi(t as i32)) / (1.0 - beta))).sum()
}

#[test]
fn wbsp_applies_nesterov_once_per_round_to_the_rounds_deltas() {
    use crate::id::Version;
    use crate::msg::{ToServer, Values};
    use crate::proto::wbsp::{WbspConfig, WbspServer};
    use crate::time::Instant;
    // Two workers, one delta `−η·g` each per round (scaled 1/2): the round's direction is g.
    let (beta, schedule) = (0.5, Schedule::Step { every: 2, gamma: 0.5 });
    let o = Optimizer::nesterov(beta).with_schedule(schedule);
    let mut s: WbspServer<f64, Vec<f64>> =
        WbspServer::new(WbspConfig::new(2, 0.1), vec![0.0; 4], vec![0.0; 4]).unwrap();
    s = s.with_optimizer(o, vec![0.0; o.state_len(4)]).unwrap();
    let delta: Vec<f64> = GRADIENT.iter().map(|g| -0.1 * g).collect();
    for r in 0..5u64 {
        for w in 0..2 {
            let msg = ToServer::Delta {
                round: Version(r),
                local_steps: 1,
                seq: r,
                values: Values::Slice(&delta),
                loss: None,
            };
            s.handle(Instant::ZERO, WorkerId(w), msg).unwrap();
            while s.poll_output().is_some() {}
        }
    }
    assert_eq!((s.version(), s.optimizer_steps()), (Version(5), 5));
    for (x, g) in s.params().iter().zip(GRADIENT) {
        let want = -0.1 * g * nesterov_units(beta, schedule, 5);
        assert!((x - want).abs() < 1e-12, "{x} vs {want}");
    }
}

#[test]
fn every_protocol_applies_adamw_once_per_update() {
    // Each update's direction is the gradient (a round's mean, one gradient, a one-member
    // group's aggregate, an SSP step or a WBSP round of one delta per worker over its rate):
    // m̂ = d and √v̂ = |d| at every step, so without weight decay each update moves every
    // coordinate by η·|d|/(|d| + ε) against the sign of d.
    let o = Optimizer::adamw(AdamW { weight_decay: 0.0, ..AdamW::default() });
    for config in crate::proto::common::capacity_tests::configs(16) {
        let name = config.name();
        let (x, updates, steps) = cluster_run(&config, o);
        assert!(updates >= 3, "{name}: only {updates} updates");
        assert_eq!(steps, updates, "{name}: the rule's steps and the server's updates");
        if !constant_direction(&config) {
            continue;
        }
        for (x, g) in x.iter().zip(GRADIENT) {
            let d = g.abs();
            let want = -g.signum() * rate(&config) * updates as f64 * d / (d + 1e-8);
            assert!((x - want).abs() < 1e-9 * want.abs(), "{name}: {x} vs {want} after {updates} updates");
        }
    }
}

#[test]
fn every_protocol_applies_nesterov_and_the_schedule_once_per_update() {
    // Constant d = g: b_t = g·(1 − β^t)/(1 − β) after update t (from 1), and update t moves
    // by −η·s(t − 1)·(g + β·b_t).
    let (beta, schedule) = (0.5, Schedule::Step { every: 2, gamma: 0.5 });
    let o = Optimizer::nesterov(beta).with_schedule(schedule);
    for config in crate::proto::common::capacity_tests::configs(16) {
        let name = config.name();
        let (x, updates, steps) = cluster_run(&config, o);
        assert_eq!(steps, updates, "{name}: the rule's steps and the server's updates");
        if !constant_direction(&config) {
            continue;
        }
        let per_unit = nesterov_units(beta, schedule, updates);
        for (x, g) in x.iter().zip(GRADIENT) {
            let want = -rate(&config) * g * per_unit;
            assert!((x - want).abs() < 1e-9 * want.abs(), "{name}: {x} vs {want} after {updates} updates");
        }
    }
}
