//! Arbitrary bytes into every decoder: no panic, and what is accepted re-encodes to the
//! same bytes (the format is canonical). The checks live in `shared/decode_msg_check.rs`,
//! which `tests/tests/fuzz_corpus.rs` also runs over the committed corpus.

#![no_main]

use libfuzzer_sys::fuzz_target;

#[path = "../shared/decode_msg_check.rs"]
mod decode_msg_check;

fuzz_target!(|data: &[u8]| {
    decode_msg_check::check(data);
});
