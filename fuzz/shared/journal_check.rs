//! The checks of the `journal` fuzz target, shared with `tests/tests/fuzz_parsers_corpus.rs`.
//!
//! Input: one byte choosing the checkpoint's version, then the bytes of the journal next to
//! the checkpoint (`FILE.journal`), read by [`lost_since`] as `serve --resume` reads it. No
//! panic and no error of more than one line; what it reports is consistent: lost versions
//! only after the checkpoint, and a per-worker count only with lost versions. For a choice
//! byte that is a multiple of 16, a journal the server writes itself ([`Journal`], its
//! counts taken from the input) reads back as what it wrote.

use syncopate::Version;
use syncopate_adapters::tcp::checkpoint::{Journal, Totals, lost_since};

/// The checkpoint's version for a choice byte.
pub(crate) fn version(choice: u8) -> Version {
    match choice {
        255 => Version(u64::MAX),
        254 => Version(0),
        b => Version(u64::from(b) * 10),
    }
}

/// Runs every check on `data`; panics on a violation. Returns 1 if the journal was read.
pub(crate) fn check(data: &[u8]) -> usize {
    let Some((&choice, journal)) = data.split_first() else { return 0 };
    let checkpoint = crate::scratch::dir("journal").join("fuzz.ckpt");
    let at = version(choice);
    crate::scratch::write(&Journal::path_for(&checkpoint), journal);
    let read = match lost_since(&checkpoint, at, None) {
        Err(e) => {
            assert!(!e.to_string().contains('\n'), "a journal error of more than one line: {e}");
            0
        }
        Ok(lost) => {
            assert_eq!(lost.checkpoint, at);
            if let Some((first, last)) = lost.versions {
                assert!(first > at && last > at, "lost versions {first:?}..={last:?} not after {at:?}");
            } else {
                assert!(lost.by_worker.is_empty() && lost.contributions == 0);
            }
            assert!(!lost.line().contains('\n'));
            1
        }
    };
    // Writing a journal costs several file operations: one input in 16 checks it.
    if choice % 16 == 0 {
        check_written(&checkpoint, journal);
    }
    read
}

/// The server's own journal, with counts from the input, reads back as written.
fn check_written(checkpoint: &std::path::Path, data: &[u8]) {
    let mut words = data.chunks(8).map(|c| c.iter().fold(0u64, |a, b| (a << 8) | u64::from(*b)) >> 8);
    let mut next = || words.next().unwrap_or(1);
    let start = next() % 1000;
    let totals = Totals { received: next(), accepted: next(), applied: next(), dropped: next() };
    let mut journal = Journal::start(checkpoint, Version(start), &totals, "run-1").unwrap_or_else(|e| panic!("{e}"));
    let by_worker: Vec<u64> = (0..1 + next() % 4).map(|_| next() % 1000).collect();
    let updates = next() % 4;
    let last = Totals { received: next(), accepted: next(), applied: next(), dropped: next() };
    for u in 1..=updates {
        journal.update(Version(start + u), &by_worker, &last).unwrap_or_else(|e| panic!("{e}"));
    }
    let lost = lost_since(checkpoint, Version(start), Some("run-1"))
        .unwrap_or_else(|e| panic!("the server's journal refused: {e}"));
    assert_eq!(lost.at_checkpoint, totals);
    if updates == 0 {
        assert_eq!((lost.versions, lost.at_last), (None, totals));
    } else {
        assert_eq!(lost.versions, Some((Version(start + 1), Version(start + updates))));
        assert_eq!(lost.contributions, by_worker.iter().sum::<u64>() * updates);
        assert_eq!(lost.at_last, last);
        let want: Vec<u64> = by_worker.iter().map(|n| n * updates).collect();
        assert_eq!(lost.by_worker, want);
    }
}
