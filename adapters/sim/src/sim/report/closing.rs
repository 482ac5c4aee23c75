//! What both engines (one server, and sharded) compute the same way when a run ends.

use super::{CurvePoint, FaultStats, Fnv, SimReport, StalenessStats, WorkerReport};
use crate::sim::SimConfig;
use std::collections::BTreeMap;
use syncopate::{DropReason, Instant, ServerStats};

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

/// What a run ended with, as both engines keep it: [`report`] makes the parts of a
/// [`SimReport`] both compute the same way.
pub(crate) struct Ending<'c, H> {
    /// The run's settings.
    pub(crate) config: &'c SimConfig,
    /// Why the run stopped.
    pub(crate) stop_reason: &'static str,
    /// The virtual time it stopped at.
    pub(crate) now: Instant,
    /// The accuracy curve (its last point is the final model's).
    pub(crate) curve: Vec<CurvePoint>,
    /// When (virtual seconds) and at which version the target was first reached.
    pub(crate) time_to_target: Option<(f64, u64)>,
    /// The server counters (summed over shards).
    pub(crate) stats: ServerStats,
    /// Each worker's report and its compute seconds.
    pub(crate) hosts: H,
    /// The trace hash so far.
    pub(crate) hash: Fnv,
    /// The final model.
    pub(crate) final_params: Vec<f32>,
}

/// The report of a run that ended as `e` says; the fields only one engine keeps (events,
/// messages, faults, staleness, shards, …) are zero or empty, for the caller to fill with
/// struct update syntax.
pub(crate) fn report<H: Iterator<Item = (WorkerReport, f64)>>(e: Ending<'_, H>) -> SimReport {
    let total = e.now.as_secs_f64();
    let (per_worker, mean_compute_share) = workers(total, e.hosts);
    let last = e.curve.last().copied();
    let (trace_hash, final_params_hash) = hashes(e.hash, &e.final_params);
    SimReport {
        protocol: e.config.protocol.name().to_string(),
        seed: e.config.seed,
        workers: e.config.workers(),
        stop_reason: e.stop_reason,
        target_accuracy: e.config.target_accuracy,
        time_to_target: e.time_to_target.map(|t| t.0),
        updates_to_target: e.time_to_target.map(|t| t.1),
        final_accuracy: last.map_or(0.0, |p| p.accuracy),
        final_loss: last.map_or(f64::NAN, |p| p.loss),
        curve: e.curve,
        virtual_time_s: total,
        updates: e.stats.updates,
        accepted: e.stats.accepted,
        applied: e.stats.applied,
        dropped: dropped(&e.stats),
        rejected: e.stats.rejected,
        stalls: 0,
        worker_rejects: 0,
        not_finite: 0,
        per_worker,
        mean_compute_share,
        staleness: StalenessStats::new(),
        events: 0,
        messages_delivered: 0,
        messages_lost: 0,
        faults: FaultStats::default(),
        bytes_moved: 0,
        buffers_allocated: 0,
        codec_errors: 0,
        trace_hash,
        final_params_hash,
        compute_trace: Vec::new(),
        final_params: e.final_params,
        shards: Vec::new(),
    }
}
