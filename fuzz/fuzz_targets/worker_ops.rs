//! Fuzz target `worker_ops`: the checks live in `shared/worker_ops_check.rs`, which
//! `tests/tests/fuzz_targets_corpus.rs` also runs over the committed corpus.

#![no_main]

use libfuzzer_sys::fuzz_target;

#[path = "../shared/bytes.rs"]
mod bytes;
#[path = "../shared/worker_ops_check.rs"]
mod worker_ops_check;

fuzz_target!(|data: &[u8]| {
    let _ = worker_ops_check::check(data);
});
