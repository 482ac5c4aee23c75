//! A worker's steps, the same for the unsharded and the sharded worker: the job computes a
//! gradient into the worker's buffer, which is held until the job's emulated step time has
//! passed; the report counts the steps, the time spent and the refusals.

use super::job::{WorkerJob, WorkerReport};
use core::time::Duration;
use std::time::Instant as StdInstant;
use syncopate::{ComputeId, Reject, Version};

/// A computed gradient waiting for its emulated step time to pass.
pub(crate) struct Held {
    /// The computation the protocol asked for.
    pub id: ComputeId,
    /// When the job started it.
    pub started: StdInstant,
    /// When it may be handed over.
    pub ready: StdInstant,
    /// The job's minibatch loss for this gradient, if it reports one.
    pub loss: Option<f32>,
}

impl Held {
    /// Whether its step time has passed.
    pub(crate) fn is_due(&self) -> bool {
        StdInstant::now() >= self.ready
    }

    /// Hands it over: its time counts as busy; returns how long the step took.
    pub(crate) fn finish(self, report: &mut WorkerReport) -> Duration {
        let took = self.started.elapsed();
        report.busy_s += took.as_secs_f64();
        took
    }

    /// Drops it unsent (the protocol abandoned it, or a newer computation replaces it).
    pub(crate) fn abandon(self, report: &mut WorkerReport) {
        report.busy_s += self.started.elapsed().as_secs_f64();
        report.abandoned += 1;
    }
}

/// Runs the job on `params` for computation `id` on model `version`; its gradient is held
/// in `grad` until the job's emulated step time has passed. A gradient still held is
/// abandoned (a newer computation replaces it).
#[allow(clippy::too_many_arguments)]
pub(crate) fn compute(
    job: &mut dyn WorkerJob,
    report: &mut WorkerReport,
    held: &mut Option<Held>,
    grad: &mut [f32],
    id: ComputeId,
    version: Version,
    params: &[f32],
) {
    if let Some(old) = held.take() {
        old.abandon(report);
    }
    let started = StdInstant::now();
    let extra = job.gradient(params, grad);
    let loss = job.loss();
    report.last_version = Some(report.last_version.unwrap_or(0).max(version.0));
    *held = Some(Held { id, started, ready: StdInstant::now() + extra, loss });
}

/// Counts a refusal of the worker's state machine; the first of each kind is logged.
pub(crate) fn refused(me: u32, log: &mut dyn FnMut(&str), report: &mut WorkerReport, what: &str, e: &Reject) {
    if report.refusals.record(e) {
        log(&format!("worker {me}: the protocol refused {what}: {e} (the first {}; more are counted)", e.kind_name()));
    }
    report.refused = report.refusals.total();
}
