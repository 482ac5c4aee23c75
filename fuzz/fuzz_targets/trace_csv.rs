//! Fuzz target `trace_csv`: the checks live in `shared/trace_csv_check.rs`, which
//! `tests/tests/fuzz_parsers_corpus.rs` also runs over the committed corpus.

#![no_main]

use libfuzzer_sys::fuzz_target;

#[path = "../shared/scratch.rs"]
mod scratch;
#[path = "../shared/trace_csv_check.rs"]
mod trace_csv_check;

fuzz_target!(|data: &[u8]| {
    let _ = trace_csv_check::check(data);
});
