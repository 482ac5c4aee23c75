//! Model-based (state-machine) tests: each protocol's real server (grouped: the composite
//! server, through the `Server` verbs) against its reference model
//! (`syncopate_tests::model`) under arbitrary input sequences — joins (same, new and stale
//! epochs), gradients/deltas/clock updates (current, stale, future, NaN), replays, pulls,
//! lost workers, leaves, unknown senders and time passing. Deterministic (fixed proptest
//! seed); a disagreement fails with the shrunk input sequence.
//!
//! `SYNCOPATE_MODEL_CASES` (default 256) sets the sequences per protocol.

use syncopate::proto::asp::AspConfig;
use syncopate::proto::backup::BackupConfig;
use syncopate::proto::bap::BapConfig;
use syncopate::proto::bsp::BspConfig;
use syncopate::proto::dbw::DbwConfig;
use syncopate::proto::grouped::{GroupedConfig, Partition};
use syncopate::proto::ssp::SspConfig;
use syncopate::proto::wbsp::WbspConfig;
use syncopate::{Duration, ProtocolConfig};
use syncopate_tests::model::search;

const LR: f64 = 0.25;
const LEN: usize = 120;

fn cases() -> u32 {
    std::env::var("SYNCOPATE_MODEL_CASES").ok().and_then(|v| v.parse().ok()).unwrap_or(256)
}

/// Runs the sequences; the models must agree, and the sequences must reach the states that
/// matter (versions made, gradients applied, dropped and refused, workers lost).
fn check(config: ProtocolConfig) {
    let c = search(&config, cases(), LEN).unwrap_or_else(|e| panic!("{e}"));
    println!("{}: {c:?}", config.name());
    assert!(c.max_version >= 5 && c.applied > 100 && c.refused > 100 && c.lost > 10, "{}: {c:?}", config.name());
    let drops = !matches!(config, ProtocolConfig::Asp(_) | ProtocolConfig::Ssp(_) | ProtocolConfig::Wbsp(_));
    assert!(!drops || c.dropped > 10, "{}: {c:?}", config.name());
}

#[test]
fn asp_matches_its_model() {
    check(ProtocolConfig::Asp(AspConfig::new(3, LR)));
}

#[test]
fn bsp_matches_its_model() {
    check(ProtocolConfig::Bsp(BspConfig::new(3, LR)));
}

#[test]
fn backup_matches_its_model() {
    check(ProtocolConfig::Backup(BackupConfig::new(4, LR, 1)));
}

#[test]
fn dbw_matches_its_model_with_the_k_it_chooses() {
    check(ProtocolConfig::Dbw(DbwConfig::new(4, LR)));
}

#[test]
fn wbsp_matches_its_model_with_a_round_deadline() {
    let mut w = WbspConfig::new(3, LR);
    w.round_deadline = Some(Duration::from_millis(150));
    check(ProtocolConfig::Wbsp(w));
    check(ProtocolConfig::Wbsp(WbspConfig::new(3, LR).with_overlap()));
}

#[test]
fn ssp_matches_its_model() {
    check(ProtocolConfig::Ssp(SspConfig::new(3, LR, 1)));
}

#[test]
fn bap_matches_its_model() {
    check(ProtocolConfig::Bap(BapConfig::new(3, LR, 1)));
    check(ProtocolConfig::Bap(BapConfig::new(2, LR, 2)));
}

#[test]
fn grouped_matches_its_model() {
    // Groups of 2 and 1 (contiguous: workers 0, 1 | 2), and of 2 and 2 round-robin.
    check(ProtocolConfig::Grouped(GroupedConfig::new(3, LR, 2)));
    let mut rr = GroupedConfig::new(4, LR, 2);
    rr.partition = Partition::RoundRobin;
    check(ProtocolConfig::Grouped(rr));
}
