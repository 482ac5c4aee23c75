//! Fuzz target `journal`: the checks live in `shared/journal_check.rs`, which
//! `tests/tests/fuzz_parsers_corpus.rs` also runs over the committed corpus.

#![no_main]

use libfuzzer_sys::fuzz_target;

#[path = "../shared/journal_check.rs"]
mod journal_check;
#[path = "../shared/scratch.rs"]
mod scratch;

fuzz_target!(|data: &[u8]| {
    let _ = journal_check::check(data);
});
