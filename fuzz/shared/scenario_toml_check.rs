//! The checks of the `scenario_toml` fuzz target, shared with `tests/tests/fuzz_parsers_corpus.rs`.
//!
//! Every input (as UTF-8 text) is parsed as a scenario file of `compare --scenario`. No
//! panic and no error of more than one line; parsing is deterministic; an accepted scenario
//! has runs, passes its own event budget, and gives every run a simulator configuration
//! and a label.

use syncopate_adapters::scenario::Scenario;

/// Runs every check on `data`; panics on a violation. Returns 1 if the scenario was accepted.
pub(crate) fn check(data: &[u8]) -> usize {
    let Ok(text) = std::str::from_utf8(data) else { return 0 };
    match Scenario::parse(text, "fuzz.toml") {
        Err(e) => {
            assert!(!e.contains('\n'), "a scenario error of more than one line: {e:?}");
            0
        }
        Ok(s) => {
            assert_eq!(Scenario::parse(text, "fuzz.toml").as_ref(), Ok(&s), "parsing is not deterministic");
            assert!(!s.runs.is_empty(), "a scenario without runs");
            assert_eq!(s.compute.len(), s.workers as usize);
            s.check_event_budget().unwrap_or_else(|e| panic!("an accepted scenario over its budget: {e}"));
            for run in &s.runs {
                let _ = run.label();
                s.sim_config(run, s.seeds - 1)
                    .unwrap_or_else(|e| panic!("run {} has no configuration: {e}", run.label()));
            }
            1
        }
    }
}
