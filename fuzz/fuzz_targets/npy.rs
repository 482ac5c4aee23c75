//! Fuzz target `npy`: the checks live in `shared/npy_check.rs`, which
//! `tests/tests/fuzz_parsers_corpus.rs` also runs over the committed corpus.

#![no_main]

use libfuzzer_sys::fuzz_target;

#[path = "../shared/npy_check.rs"]
mod npy_check;

fuzz_target!(|data: &[u8]| {
    let _ = npy_check::check(data);
});
