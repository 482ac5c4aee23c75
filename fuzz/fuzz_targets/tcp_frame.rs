//! Fuzz target `tcp_frame`: the checks live in `shared/tcp_frame_check.rs`, which
//! `tests/tests/fuzz_parsers_corpus.rs` also runs over the committed corpus.

#![no_main]

use libfuzzer_sys::fuzz_target;

#[path = "../shared/tcp_frame_check.rs"]
mod tcp_frame_check;

fuzz_target!(|data: &[u8]| {
    let _ = tcp_frame_check::check(data);
});
