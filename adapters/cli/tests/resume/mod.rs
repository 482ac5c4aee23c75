//! Shared by the tests that kill a server (or a shard) and resume it from its checkpoint:
//! the checkpoint's journal, and the killed server's part of the conservation ledger.

#![allow(dead_code, unreachable_pub)]

use crate::ledger::{Ledger, Loss};
use core::time::Duration;
use std::path::{Path, PathBuf};
use std::thread;
use std::time::Instant;

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
