//! Fuzz target `scenario_toml`: the checks live in `shared/scenario_toml_check.rs`, which
//! `tests/tests/fuzz_parsers_corpus.rs` also runs over the committed corpus.

#![no_main]

use libfuzzer_sys::fuzz_target;

#[path = "../shared/scenario_toml_check.rs"]
mod scenario_toml_check;

fuzz_target!(|data: &[u8]| {
    let _ = scenario_toml_check::check(data);
});
