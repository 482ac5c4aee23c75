//! Fuzz target `sim_schedule`: the checks live in `shared/sim_schedule_check.rs`, which
//! `tests/tests/fuzz_targets_corpus.rs` also runs over the committed corpus.

#![no_main]

use libfuzzer_sys::fuzz_target;

#[path = "../shared/bytes.rs"]
mod bytes;
#[path = "../shared/sim_schedule_check.rs"]
mod sim_schedule_check;

fuzz_target!(|data: &[u8]| {
    let _ = sim_schedule_check::check(data);
});
