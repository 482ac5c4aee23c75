//! Fuzz target `checkpoint`: the checks live in `shared/checkpoint_check.rs`, which
//! `tests/tests/fuzz_parsers_corpus.rs` also runs over the committed corpus.

#![no_main]

use libfuzzer_sys::fuzz_target;

#[path = "../shared/checkpoint_check.rs"]
mod checkpoint_check;

fuzz_target!(|data: &[u8]| {
    let _ = checkpoint_check::check(data);
});
