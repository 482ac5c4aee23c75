//! The checks of the `shard_record` fuzz target, shared with `tests/tests/fuzz_parsers_corpus.rs`.
//!
//! Input: two bytes choosing a shard's settings (index, count, model size, run id), then the
//! bytes of the shard record next to its checkpoint (`FILE.shard`), checked as
//! `serve --shard I/S --resume` checks it. No panic; the record the shard writes itself is
//! accepted; a record is accepted exactly when it is that record byte for byte, and refused
//! with one line otherwise.

use std::collections::HashMap;
use std::sync::{Mutex, OnceLock};
use syncopate::ProtocolKind;
use syncopate_adapters::cli::{check_shard_record, write_shard_record};
use syncopate_adapters::tcp::{ProtocolSettings, RunSettings, ShardSettings};

/// Run ids the settings are drawn from.
const RUNS: [&str; 4] = ["", "a", "exp-3.b_1", "run"];

/// Each choice of settings' own record.
type OwnRecords = HashMap<(u8, u8), Vec<u8>>;

/// A shard's settings for two choice bytes.
pub(crate) fn settings(a: u8, b: u8) -> RunSettings {
    let count = 2 + u32::from(a >> 4) % 6;
    let index = u32::from(a & 15) % count;
    let dim = 8 + usize::from(b >> 2);
    let mut s = RunSettings::new(ProtocolSettings::named(ProtocolKind::Bsp, 2, 0.5), dim);
    s.shard = Some(ShardSettings { index, count, run: RUNS[usize::from(b & 3)].to_owned() });
    s
}

/// Runs every check on `data`; panics on a violation. Returns 1 if the record was accepted.
pub(crate) fn check(data: &[u8]) -> usize {
    let [a, b, record @ ..] = data else { return 0 };
    let settings = settings(*a, *b);
    let checkpoint = crate::scratch::dir("shard_record").join("fuzz.ckpt");
    let mut path = checkpoint.clone().into_os_string();
    path.push(".shard");
    let path = std::path::PathBuf::from(path);
    // The shard's own record, written and checked once per choice of settings.
    static OWN: OnceLock<Mutex<OwnRecords>> = OnceLock::new();
    let mut own_records = OWN.get_or_init(Mutex::default).lock().unwrap_or_else(std::sync::PoisonError::into_inner);
    let own = own_records.entry((*a, *b)).or_insert_with(|| {
        write_shard_record(&checkpoint, &settings, "run-1").unwrap_or_else(|e| panic!("writing a shard record: {e}"));
        let own = std::fs::read(&path).unwrap_or_else(|e| panic!("reading the written record: {e}"));
        check_shard_record(&checkpoint, &settings).unwrap_or_else(|e| panic!("a shard's own record refused: {e}"));
        own
    });
    crate::scratch::write(&path, record);
    match check_shard_record(&checkpoint, &settings) {
        Ok(()) => {
            // A record of any run id is the shard's own record of that run: with the id
            // put back, it must be the record written above.
            let text = std::str::from_utf8(record).unwrap_or_default();
            let mut after_id = false;
            let normalized: Vec<&str> = text
                .split(' ')
                .map(|w| {
                    let out = if after_id { "run-1" } else { w };
                    after_id = w == "id";
                    out
                })
                .collect();
            assert!(normalized.join(" ").as_bytes() == own.as_slice(), "accepted a record that is not the shard's own");
            1
        }
        Err(e) => {
            assert!(record != own.as_slice(), "refused the shard's own record: {e}");
            assert!(!e.contains('\n'), "a shard record error of more than one line: {e:?}");
            0
        }
    }
}
