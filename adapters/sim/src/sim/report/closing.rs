//! What both engines (one server, and sharded) compute the same way when a run ends.

use super::{Fnv, WorkerReport};
use std::collections::BTreeMap;
use syncopate::{DropReason, ServerStats};

/// Adds `s` into `total` (every shard's counters, for the run's).
pub(crate) fn add_stats(total: &mut ServerStats, s: &ServerStats) {
    total.accepted += s.accepted;
    total.applied += s.applied;
    for (t, d) in total.dropped.iter_mut().zip(s.dropped) {
        *t += d;
    }
    total.rejected += s.rejected;
    total.updates += s.updates;
}

/// Each worker's report with its compute time `busy` seconds over a run of `total`
/// seconds, and the mean of their compute shares (0 without workers).
pub(crate) fn workers(total: f64, hosts: impl Iterator<Item = (WorkerReport, f64)>) -> (Vec<WorkerReport>, f64) {
    let per_worker: Vec<WorkerReport> = hosts
        .map(|(report, busy)| WorkerReport {
            compute_time_s: busy,
            compute_share: if total > 0.0 { busy / total } else { 0.0 },
            ..report
        })
        .collect();
    let mean = per_worker.iter().map(|w| w.compute_share).sum::<f64>() / per_worker.len().max(1) as f64;
    (per_worker, mean)
}

/// The dropped contributions by reason.
pub(crate) fn dropped(stats: &ServerStats) -> BTreeMap<&'static str, u64> {
    DropReason::ALL.iter().map(|&r| (r.name(), stats.dropped_for(r))).collect()
}

/// The hash of `final_params` and the run's `trace` hash with it folded in:
/// `(trace_hash, final_params_hash)`.
pub(crate) fn hashes(mut trace: Fnv, final_params: &[f32]) -> (u64, u64) {
    let mut h = Fnv::new();
    for p in final_params {
        h.bytes(&p.to_bits().to_le_bytes());
    }
    trace.u64(h.0);
    (trace.0, h.0)
}
