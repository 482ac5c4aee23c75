//! Fuzz target `shard_record`: the checks live in `shared/shard_record_check.rs`, which
//! `tests/tests/fuzz_parsers_corpus.rs` also runs over the committed corpus.

#![no_main]

use libfuzzer_sys::fuzz_target;

#[path = "../shared/scratch.rs"]
mod scratch;
#[path = "../shared/shard_record_check.rs"]
mod shard_record_check;

fuzz_target!(|data: &[u8]| {
    let _ = shard_record_check::check(data);
});
