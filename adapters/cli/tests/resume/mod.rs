//! Shared by the tests that kill a server (or a shard) and resume it from its checkpoint:
//! the checkpoint's journal, and the killed server's part of the conservation ledger.

#![allow(dead_code, unreachable_pub)]

use crate::ledger::{Ledger, Loss};
use core::time::Duration;
use std::path::{Path, PathBuf};
use std::thread;
use std::time::Instant;

/// The flags of `protocol` for the kill and resume runs: 3 workers on softmax, one backup
/// worker for backup, staleness 2 for SSP.
pub fn knobs(protocol: &'static str) -> Vec<&'static str> {
    let mut k = vec!["--protocol", protocol, "--workers", "3", "--model", "softmax"];
    match protocol {
        "backup" => k.extend(["--backup-workers", "1"]),
        "ssp" => k.extend(["--staleness", "2"]),
        _ => {}
    }
    k
}

/// The journal beside `checkpoint` (`<checkpoint>.journal`).
pub fn journal(checkpoint: &Path) -> PathBuf {
    let mut p = checkpoint.as_os_str().to_owned();
    p.push(".journal");
    PathBuf::from(p)
}

/// Waits (30 s at most, else the test fails) until the journal of `ckpt` starts at a
/// checkpoint of at least `version` and `also` holds of its text.
pub fn wait_for_checkpoint(ckpt: &Path, version: u64, also: impl Fn(&str) -> bool) {
    let end = Instant::now() + Duration::from_secs(30);
    loop {
        let text = std::fs::read_to_string(journal(ckpt)).unwrap_or_default();
        let v = text.lines().next().and_then(|l| l.strip_prefix("checkpoint ")?.split(' ').next()?.parse().ok());
        if v.is_some_and(|v: u64| v >= version) && also(&text) {
            return;
        }
        assert!(Instant::now() < end, "no checkpoint at version {version} or later (and as asked): {text}");
        thread::sleep(Duration::from_millis(2));
    }
}

/// Whether the journal text has an update after its checkpoint.
pub fn has_update(text: &str) -> bool {
    text.lines().any(|l| l.starts_with("update"))
}

/// Adds to `ledger` the killed server's part, from the resumed server's `resumed` summary
/// (the journal's totals `[received, handed, applied, dropped]` at the checkpoint and at the
/// last update): what it applied up to its checkpoint, what it dropped and refused, the
/// `rolled_back` contributions applied after the checkpoint, and what it held at the kill.
pub fn add_killed_server(ledger: &mut Ledger, resumed: &serde_json::Value, rolled_back: u64) {
    let at = |k: &str, i: usize| resumed[k][i].as_u64().unwrap();
    ledger.applied += at("at_checkpoint", 2);
    ledger.dropped[0] += at("at_last_update", 3);
    ledger.add_lost(Loss::Refused, at("at_last_update", 0) - at("at_last_update", 1));
    ledger.add_lost(Loss::RolledBack, rolled_back);
    ledger.add_lost(Loss::HeldAtCrash, at("at_last_update", 1) - at("at_last_update", 2) - at("at_last_update", 3));
}

/// Checks the conservation ledger across a kill and resume: what the workers `sent` to the
/// killed server and the resumed one against the resumed server's `summary` (its own counts,
/// and the killed server's part from the journal). What neither accounts for went with the
/// killed server (read after its last journaled update, or never read): at most `bound`.
/// `what` names the run in messages.
pub fn check_ledger_across_kill(summary: &serde_json::Value, sent: u64, bound: u64, what: &str) {
    let l = &summary["ledger"];
    let mut ledger = Ledger::from_summary_json(&summary["gradients"]).unwrap();
    ledger.sent = sent;
    // The killed server's drops are its journal's total (not the reasons).
    add_killed_server(&mut ledger, &l["resumed"], l["resumed"]["lost_contributions"].as_u64().unwrap());
    ledger.in_flight = l["in_flight_at_stop"].as_u64().unwrap();
    ledger.add_lost(Loss::Refused, l["refused"].as_u64().unwrap());
    ledger.add_lost(Loss::ConnectionLost, l["discarded"].as_u64().unwrap());
    let gone = sent.checked_sub(ledger.accounted()).unwrap_or_else(|| panic!("{what}: {}", ledger.line()));
    ledger.add_lost(Loss::ServerGone, gone);
    eprintln!("{what}: {}", ledger.line());
    assert!(gone <= bound, "{what}: {gone} contributions unaccounted for at the kill");
    ledger.check().unwrap_or_else(|e| panic!("{what}: {e}"));
}
