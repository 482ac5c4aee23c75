//! Canaries: the core's planted bugs (feature `_canary`, see `core/src/canary.rs`) must each be
//! caught by the general methods, without the targeted tests: the swarm fault simulator
//! (`tests/src/fault.rs`, invariants and the conservation ledger after every event) or the
//! model-based tests (`tests/src/model.rs`, each protocol against its reference model). One
//! canary at a time is switched on; for each, the swarm scans seeds of the affected protocols
//! until it reports a violation that the same seed does not report with every canary off, and
//! the model-based search runs its (deterministic) sequences on the affected protocols. A
//! targeted test that drives the buggy path by hand is run too and reported, but does not
//! count. Reports, per canary, which method caught it and after how many runs.
//!
//! Run: `cargo test -p syncopate-tests --features canary --test canaries -- --nocapture`.
//! Everything is in one `#[test]`: the active canary is process-wide.

use syncopate::canary::{self, Canary};
use syncopate::proto::asp::AspConfig;
use syncopate::proto::backup::BackupConfig;
use syncopate::proto::bap::BapConfig;
use syncopate::proto::bsp::BspConfig;
use syncopate::proto::wbsp::WbspConfig;
use syncopate::{DropReason, ProtocolConfig, Server, ServerEvent, ToServer, Values, Version, WorkerId};
use syncopate_tests::drive::{DIM, at_ms, drain, grad, join_all, seq, server};
use syncopate_tests::fault::{Sim, SimSpec, protocols};
use syncopate_tests::model;

/// Seeds the swarm may try per canary before giving up.
const MAX_SEEDS: u64 = 150;
/// Events per swarm run.
const STEPS: u64 = 3000;

const G: [f64; DIM] = [1.0, -2.0, 0.0, 3.0];

/// The protocols (names in `fault::protocols`) whose code path a canary touches.
fn affected(c: Canary) -> &'static [&'static str] {
    match c {
        Canary::DedupOff => &["asp", "bsp"],
        Canary::LateGradientAdded => &["backup", "dbw"],
        Canary::StalenessBoundPlusOne => &["bap"],
        Canary::LostWorkerAwaited => &["wbsp", "wbsp-overlap"],
        Canary::RoundClosesEarly => &["bsp"],
        Canary::Off => &[],
    }
}

/// Targeted check: `true` when the protocol misbehaves (the canary is caught).
fn targeted(c: Canary) -> bool {
    match c {
        Canary::DedupOff => {
            // ASP: a replayed gradient (same seq) must be refused as a duplicate.
            let mut s = server(&ProtocolConfig::Asp(AspConfig::new(2, 0.25)));
            join_all(&mut s, 2);
            s.handle(at_ms(1), WorkerId(0), grad(0, 0, seq(1, 0), &G)).expect("first copy");
            let replay = s.handle(at_ms(2), WorkerId(0), grad(0, 0, seq(1, 0), &G));
            replay.is_ok() || s.version().0 != 1
        }
        Canary::LateGradientAdded => {
            // Backup n = 3, b = 1: version 0 closes with 2 gradients; the third (base 0) is late
            // and must be dropped as stale, not added to version 1's round.
            let mut s = server(&ProtocolConfig::Backup(BackupConfig::new(3, 0.25, 1)));
            join_all(&mut s, 3);
            s.handle(at_ms(1), WorkerId(0), grad(0, 0, seq(1, 0), &G)).expect("g0");
            s.handle(at_ms(1), WorkerId(1), grad(0, 0, seq(1, 0), &G)).expect("g1");
            let _ = drain(&mut s);
            s.handle(at_ms(2), WorkerId(2), grad(0, 0, seq(1, 0), &G)).expect("late");
            let ev = drain(&mut s);
            let dropped = ev
                .iter()
                .any(|e| matches!(e, ServerEvent::Dropped { worker: WorkerId(2), reason: DropReason::Stale, .. }));
            !dropped
        }
        Canary::StalenessBoundPlusOne => {
            // BAP n = 2, s = 0: after version 1, a gradient for iteration 2 computed on version 0
            // lags by 1 > s and must be dropped over the bound.
            let mut s = server(&ProtocolConfig::Bap(BapConfig::new(2, 0.25, 0)));
            join_all(&mut s, 2);
            s.handle(at_ms(1), WorkerId(0), grad(0, 1, seq(1, 0), &G)).expect("g0");
            s.handle(at_ms(1), WorkerId(1), grad(0, 1, seq(1, 0), &G)).expect("g1");
            assert_eq!(s.version(), Version(1));
            let _ = drain(&mut s);
            let r = s.handle(at_ms(2), WorkerId(0), grad(0, 2, seq(1, 1), &G));
            let ev = drain(&mut s);
            let over =
                ev.iter().any(|e| matches!(e, ServerEvent::Dropped { reason: DropReason::OverStalenessBound, .. }));
            r.is_ok() && !over
        }
        Canary::LostWorkerAwaited => {
            // WBSP n = 2: worker 0 uploads, worker 1 is lost; the round must close.
            let mut s = server(&ProtocolConfig::Wbsp(WbspConfig::new(2, 0.25)));
            join_all(&mut s, 2);
            let delta = ToServer::Delta {
                round: Version(0),
                local_steps: 1,
                seq: seq(1, 0),
                values: Values::Slice(&G),
                loss: None,
            };
            s.handle(at_ms(1), WorkerId(0), delta).expect("delta");
            s.handle_worker_lost(at_ms(2), WorkerId(1)).expect("lost");
            let _ = drain(&mut s);
            s.version() != Version(1)
        }
        Canary::RoundClosesEarly => {
            // BSP n = 3: two gradients must not close the round.
            let mut s = server(&ProtocolConfig::Bsp(BspConfig::new(3, 0.25)));
            join_all(&mut s, 3);
            s.handle(at_ms(1), WorkerId(0), grad(0, 0, seq(1, 0), &G)).expect("g0");
            s.handle(at_ms(1), WorkerId(1), grad(0, 0, seq(1, 0), &G)).expect("g1");
            s.version() != Version(0)
        }
        Canary::Off => false,
    }
}

fn spec(name: &str, seed: u64) -> SimSpec {
    let p = protocols().into_iter().find(|(n, _)| *n == name).expect("known protocol").1;
    let mut spec = SimSpec::swarm(p, seed, STEPS);
    // Worker crashes have an open C1 finding of their own (TESTING.md); keep them off.
    spec.faults.crash = 0.0;
    spec
}

/// Scans seeds round-robin over the affected protocols; returns the number of runs until a
/// violation the same run does not show with every canary off, and the violation.
fn swarm(c: Canary) -> Option<(u64, String)> {
    let names = affected(c);
    let mut runs = 0;
    for seed in 1..=MAX_SEEDS {
        for name in names {
            runs += 1;
            canary::set(c);
            let bad = Sim::new(spec(name, seed)).run().violation;
            canary::set(Canary::Off);
            if let Some(v) = bad {
                if Sim::new(spec(name, seed)).run().violation.is_none() {
                    return Some((runs, v));
                }
            }
        }
    }
    None
}

/// The model-based tests' configurations of the protocols a canary touches (those of
/// `tests/tests/model_protocols.rs`).
fn model_configs(c: Canary) -> Vec<ProtocolConfig> {
    use syncopate::proto::dbw::DbwConfig;
    match c {
        Canary::DedupOff => {
            vec![ProtocolConfig::Asp(AspConfig::new(3, 0.25)), ProtocolConfig::Bsp(BspConfig::new(3, 0.25))]
        }
        Canary::LateGradientAdded => {
            vec![ProtocolConfig::Backup(BackupConfig::new(4, 0.25, 1)), ProtocolConfig::Dbw(DbwConfig::new(4, 0.25))]
        }
        Canary::StalenessBoundPlusOne => vec![ProtocolConfig::Bap(BapConfig::new(3, 0.25, 1))],
        Canary::LostWorkerAwaited => vec![ProtocolConfig::Wbsp(WbspConfig::new(3, 0.25))],
        Canary::RoundClosesEarly => vec![ProtocolConfig::Bsp(BspConfig::new(3, 0.25))],
        Canary::Off => Vec::new(),
    }
}

/// Sequences the model-based search runs per protocol.
const MODEL_CASES: u32 = 256;

/// The model-based search on the affected protocols: the first disagreement (the canary on).
fn by_model(c: Canary) -> Option<String> {
    for config in model_configs(c) {
        canary::set(c);
        let r = model::search(&config, MODEL_CASES, 120);
        canary::set(Canary::Off);
        if let Err(e) = r {
            return Some(e.lines().take(3).collect::<Vec<_>>().join(" / "));
        }
    }
    None
}

#[test]
fn every_canary_is_caught() {
    // With every canary off, the targeted checks see correct behaviour.
    canary::set(Canary::Off);
    for c in Canary::ALL {
        assert!(!targeted(c), "{}: targeted check fails without the canary", c.name());
        for config in model_configs(c) {
            model::search(&config, MODEL_CASES, 120).unwrap_or_else(|e| panic!("fails without the canary: {e}"));
        }
    }
    let mut missed = Vec::new();
    for c in Canary::ALL {
        canary::set(c);
        let by_test = targeted(c);
        canary::set(Canary::Off);
        let by_swarm = swarm(c);
        let by_model = by_model(c);
        let runs =
            by_swarm.as_ref().map_or_else(|| format!(">{}", MAX_SEEDS * affected(c).len() as u64), |r| r.0.to_string());
        println!(
            "canary {:<26} swarm={} swarm_runs_to_detection={} model={} targeted={}\n    swarm: {}\n    model: {}",
            c.name(),
            if by_swarm.is_some() { "caught" } else { "missed" },
            runs,
            if by_model.is_some() { "caught" } else { "missed" },
            if by_test { "caught" } else { "missed" },
            by_swarm.as_ref().map_or("-", |r| r.1.as_str()),
            by_model.as_deref().unwrap_or("-"),
        );
        // The targeted test does not count: the general methods must catch every canary.
        if by_swarm.is_none() && by_model.is_none() {
            missed.push(c.name());
        }
    }
    canary::set(Canary::Off);
    assert!(missed.is_empty(), "canaries not caught: {missed:?}");
}
