//! Synchronous SGD with static backup workers (Chen et al. 2016, "Revisiting Distributed
//! Synchronous SGD"): the server closes each iteration after the first `k = n − b`
//! gradients computed at the current model, and the `b` slowest workers are backups whose
//! gradients for that iteration are dropped.
//!
//! Rules (docs/PROTOCOLS.md, "Backup workers" with a fixed `k`):
//! 1. The server holds `w_v`. A gradient computed at `w_v` from a worker that has not yet
//!    contributed to `v` is added to the round; when `k` distinct workers have contributed,
//!    `w_{v+1} = w_v − η · (1/k) Σ g_i` and the version advances.
//! 2. A gradient computed at an older version arrives after its iteration closed: it is
//!    dropped and reported ([`ServerEvent::Dropped`] with [`DropReason::Stale`]), never
//!    counted in a later version.
//! 3. What happens to the stragglers is the [`Interrupt`] option:
//!    * [`Interrupt::Abort`] (option A, the default, this project's recommendation): the new
//!      model is broadcast to every worker; a [`GradientWorker`](super::GradientWorker) that
//!      is still computing on the old one abandons that computation and starts on the new
//!      model at once. Every worker starts every iteration at the broadcast, which is what
//!      the order-statistics model of DBW assumes.
//!    * [`Interrupt::RunToCompletion`] (option B, TensorFlow's `SyncReplicasOptimizer`):
//!      the new model goes only to the `k` contributors; a straggler finishes, its gradient
//!      is dropped, and the server answers that late gradient with the current model.
//!
//! Invariants (tested, docs/RELIABILITY.md, "Invariants", K1–K4): each update averages exactly `k` gradients
//! from `k` distinct workers, all computed at the model being updated, the first `k`
//! accepted for it (K1); a gradient arriving after the `k`-th for its version is dropped
//! with an event and never counted in a later version (K2); `k` is fixed here (K3 is
//! DBW's); the server progresses whenever `k` workers are live and delivering (K4). With
//! `b = 0` the trace (events, messages, parameter bits) is BSP's.
//!
//! Liveness when a worker dies: nothing changes while at least `k` workers are live. With
//! fewer, the iteration cannot close; with [`BackupConfig::stall_report`] set the server
//! reports [`ServerEvent::Stalled`] naming a missing worker once per interval, so the stall
//! is never silent.
//!
//! Messages: receives `Join`, `Grad`, `Leave`; sends `Model` (to a joiner; after each update
//! to all (A) or to the contributors (B); under B also in answer to a late gradient) and
//! `Stop`. Workers are [`GradientWorker`](super::GradientWorker)s
//! ([`AnyWorker::Gradient`](super::AnyWorker::Gradient)).
//!
//! Knobs: `b` (`backup_workers`): the number of stragglers not waited for. A larger `b`
//! shortens iterations (the iteration time is the `k`-th fastest round trip instead of the
//! slowest) but averages fewer gradients, so each step is noisier. The best `b` depends on
//! the round-trip distribution, the batch size and the stage of training; [`super::dbw`]
//! chooses it every iteration.
//!
//! Aggregation reuses BSP's round (sums in arrival order; exact for integer test data).

#[cfg(doc)]
use crate::proto::DropReason;
#[cfg(doc)]
use crate::proto::ServerEvent;
mod engine;
mod server;
mod worker;

pub use engine::BackupSlot;
pub(crate) use engine::{Admitted, BackupCore, Engine, backup_family_rules};
pub use server::{BackupRules, BackupServer};
pub use worker::BackupWorker;

use crate::proto::GradientPolicy;
use crate::time::Duration;

/// What happens to a straggler's computation when its iteration closes without it
/// (docs/PROTOCOLS.md, "Backup workers").
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash)]
pub enum Interrupt {
    /// Option A: broadcast the new model to every worker; workers abandon stale work and
    /// start on the new model immediately.
    #[default]
    Abort,
    /// Option B: stragglers run to completion; their gradient is dropped and answered with
    /// the current model. Only the contributors get the new model at the close.
    RunToCompletion,
}

impl Interrupt {
    /// A short lowercase name (`abort`, `run-to-completion`).
    pub fn name(self) -> &'static str {
        match self {
            Self::Abort => "abort",
            Self::RunToCompletion => "run-to-completion",
        }
    }
}

/// Settings of a [`BackupServer`].
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct BackupConfig {
    /// The number of workers `n` (ids `0..n`).
    pub workers: u32,
    /// The learning rate `η`.
    pub learning_rate: f64,
    /// `b`: how many of the slowest workers are not waited for; the server aggregates
    /// `k = n − b` gradients per update. `0..n`.
    pub backup_workers: u32,
    /// What stragglers do when their iteration closes.
    pub interrupt: Interrupt,
    /// Screening of incoming gradients.
    pub gradient_policy: GradientPolicy,
    /// Report a [`ServerEvent::Stalled`] after this long without progress (and again every
    /// interval); `None` never reports.
    pub stall_report: Option<Duration>,
}

impl BackupConfig {
    /// `n` workers, learning rate `η`, `b` backup workers, option A, no norm bound, no stall
    /// reports.
    pub fn new(workers: u32, learning_rate: f64, backup_workers: u32) -> Self {
        Self {
            workers,
            learning_rate,
            backup_workers,
            interrupt: Interrupt::Abort,
            gradient_policy: GradientPolicy::default(),
            stall_report: None,
        }
    }

    /// `k = n − b`, the number of gradients per update.
    pub fn aggregate(&self) -> u32 {
        self.workers.saturating_sub(self.backup_workers)
    }
}

#[cfg(test)]
pub(crate) mod harness;
#[cfg(test)]
mod tests;
