//! The checks of the `server_ops` fuzz target, shared with `tests/tests/fuzz_targets_corpus.rs`
//! (included there with `#[path]`).
//!
//! The input picks a protocol (the fault suite's configurations) and a list of operations:
//! `Join`, `Grad`, `Delta`, `Pull`, `Clock`, `Leave`, a transport loss, a timeout, each with
//! fuzzer-chosen fields (ids in and out of range, epochs, versions and sequence numbers near
//! the valid ones or extreme, small integer values with the occasional NaN/∞/huge). After every
//! operation: no panic; an `Err` produced no output and changed nothing (version, model bits,
//! counters except `rejected`); the version grew by at most one (BAP: at most `s_bap + 1`, it may close several ready
//! iterations at once) and matches the `ModelUpdated` events; the model stays finite; the
//! outputs drain.

use super::bytes::Bytes;
use syncopate::{Duration, Server, ServerEvent, ToServer, Values, Version, WorkerId};
use syncopate_tests::drive::{DIM, Snapshot, drain, server};
use syncopate_tests::fault::protocols;

/// Runs `data`; panics on a violation. Returns the number of operations executed.
pub(crate) fn check(data: &[u8]) -> usize {
    let mut b = Bytes(data);
    let all = protocols();
    let (name, config) = all[usize::from(b.u8()) % all.len()];
    let n = config.workers();
    let mut s = server(&config);
    let mut now = syncopate::Instant::ZERO;
    let mut ops = 0;
    while !b.is_empty() && ops < 512 {
        ops += 1;
        now = now + Duration::from_millis(u64::from(b.u8() % 64));
        let op = b.u8();
        let w = match b.u8() {
            255 => WorkerId(u32::MAX),
            x => WorkerId(u32::from(x) % (n + 1)),
        };
        let epoch = u32::from(b.u8() % 4);
        let v = s.version().0;
        let mut values = [0.0; DIM];
        let before = Snapshot::of(&s);
        let rejected = s.stats().rejected;
        let (what, result) = match op % 8 {
            0 => ("join", s.handle(now, w, ToServer::Join { epoch })),
            1 | 2 | 4 => {
                let base = b.version(v);
                let iteration = match b.u8() {
                    255 => u64::MAX,
                    x => base.saturating_add(u64::from(x % 4)),
                };
                let seq = b.seq(epoch);
                let len = if b.u8() == 255 { DIM - 1 } else { DIM };
                for x in &mut values {
                    *x = b.value();
                }
                let vals = Values::Slice(&values[..len]);
                let loss = match b.u8() % 4 {
                    0 => None,
                    1 => Some(f32::from_bits(0x7f80_0000 | u32::from(b.u8()))),
                    _ => Some(f32::from(b.u8()) - 100.0),
                };
                let msg = match op % 8 {
                    1 => ToServer::Grad { base: Version(base), iteration, seq, values: vals, loss },
                    2 => ToServer::Delta {
                        round: Version(base),
                        local_steps: u32::from(b.u8() % 3),
                        seq,
                        values: vals,
                        loss,
                    },
                    _ => ToServer::Clock { clock: iteration, seq, values: vals, loss },
                };
                ("contribution", s.handle(now, w, msg))
            }
            3 => {
                let have = b.version(v);
                let min_clock = u64::from(b.u8() % 8);
                ("pull", s.handle(now, w, ToServer::Pull { have: Version(have), min_clock }))
            }
            5 => ("leave", s.handle(now, w, ToServer::Leave)),
            6 => ("lost", s.handle_worker_lost(now, w)),
            _ => {
                if let Some(t) = s.poll_timeout() {
                    now = now.max(t);
                }
                s.handle_timeout(now);
                ("timeout", Ok(()))
            }
        };
        if let Err(e) = result {
            assert!(s.poll_output().is_none(), "[{name}] {what} refused with {e:?} but produced output");
            let mut after = Snapshot::of(&s);
            after.stats.rejected = 0;
            assert_eq!(after, before, "[{name}] {what} refused with {e:?} but changed state");
            let grew = s.stats().rejected - rejected;
            assert!(what == "lost" || grew == 1, "[{name}] rejected counter grew by {grew}");
        }
        let v2 = s.version().0;
        // One input makes at most one update, except in BAP: closing iteration `v + 1` (by a
        // gradient, a timeout or a loss) also closes the later open iterations that were
        // already complete, at most `s_bap + 1 = 3` in the fuzzed configuration.
        let most = if name == "bap" { 3 } else { 1 };
        assert!(v2 >= v && v2 - v <= most, "[{name}] {what} moved the version from {v} to {v2}");
        let updates = drain(&mut s)
            .iter()
            .filter_map(|e| match e {
                ServerEvent::ModelUpdated { version, .. } => Some(version.0),
                _ => None,
            })
            .collect::<Vec<_>>();
        if !matches!(name, "grouped") {
            let expect: Vec<u64> = (v + 1..=v2).collect();
            assert_eq!(updates, expect, "[{name}] {what}: ModelUpdated events do not match the version");
        }
        assert!(s.params().iter().all(|x| x.is_finite()), "[{name}] {what} made the model non-finite");
        assert!(s.poll_output().is_none());
    }
    ops
}
