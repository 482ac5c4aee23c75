//! Fuzz target `handshake`: the checks live in `shared/handshake_check.rs`, which
//! `tests/tests/fuzz_parsers_corpus.rs` also runs over the committed corpus.

#![no_main]

use libfuzzer_sys::fuzz_target;

#[path = "../shared/handshake_check.rs"]
mod handshake_check;

fuzz_target!(|data: &[u8]| {
    let _ = handshake_check::check(data);
});
