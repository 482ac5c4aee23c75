//! Fuzz target `session_payloads`: the checks live in `shared/session_payloads_check.rs`, which
//! `tests/tests/fuzz_parsers_corpus.rs` also runs over the committed corpus.

#![no_main]

use libfuzzer_sys::fuzz_target;

#[path = "../shared/session_payloads_check.rs"]
mod session_payloads_check;

fuzz_target!(|data: &[u8]| {
    let _ = session_payloads_check::check(data);
});
