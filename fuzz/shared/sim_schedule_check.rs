//! The checks of the `sim_schedule` fuzz target, shared with
//! `tests/tests/fuzz_targets_corpus.rs` (included there with `#[path]`).
//!
//! The input chooses a protocol, a seed, the fault rates (loss, duplication, delay spikes,
//! partitions, server restarts) and the run length for the swarm fault simulator
//! (`tests/src/fault.rs`); the run must report no invariant violation. Worker crashes stay off
//! and SSP/BAP liveness failures (`L1`) are tolerated: both are open findings in TESTING.md
//! with their own tests; safety violations always fail.

use super::bytes::Bytes;
use syncopate_tests::fault::{Faults, Sim, SimSpec, protocols};

/// Runs `data`; panics on a violation. Returns the number of simulated events.
pub(crate) fn check(data: &[u8]) -> u64 {
    let mut b = Bytes(data);
    let all = protocols();
    let (name, config) = all[usize::from(b.u8()) % all.len()];
    let seed = b.u64();
    let rate = |b: &mut Bytes<'_>, max: f64| f64::from(b.u8()) / 255.0 * max;
    let faults = Faults {
        loss: rate(&mut b, 0.3),
        duplicate: rate(&mut b, 0.5),
        spike: rate(&mut b, 0.3),
        partition: rate(&mut b, 0.01),
        crash: 0.0,
        server_restart: rate(&mut b, 0.002),
    };
    let steps = 200 + 8 * u64::from(b.u8());
    let spec = SimSpec { protocol: config, seed, steps, faults, quiet_versions: 3, quiet_budget: 20_000 };
    let r = Sim::new(spec).run();
    if let Some(v) = r.violation {
        let open = matches!(name, "ssp" | "bap") && v.starts_with("L1");
        assert!(open, "[{name}] {v}");
    }
    r.counts.steps
}
