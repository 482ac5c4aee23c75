//! BAP, bounded asynchronous parallel: the model changes once per iteration, when all
//! gradients of that iteration are in (or its time limit expires), while workers run ahead
//! on their cached model up to a bounded number of versions.
//!
//! Paper: "More Effective Synchronization Scheme in ML Using Stale Parameters", IEEE HPCC
//! 2016, pp. 757–764 (Beihang University). The paper itself was not reachable; the rules
//! follow the MALib documentation's description and figure of BAP (docs/PROTOCOLS.md, "BAP"), and
//! everything marked \[RECON\] there is a decision of this project, listed below.
//!
//! # Algorithm
//!
//! The server holds `w_v`, where `v` is the last **closed** iteration. Iteration `j ≥ 1`
//! collects one gradient from each worker; gradients of several iterations may be in
//! flight at once, each into its own accumulator. Iteration `j = v + 1` (the *head*) closes
//! when every live worker's gradient for it is in: `w_j = w_{j−1} − η · (1/k) Σ g` over the
//! `k` gradients received, `v = j`. Iterations close in order; after a close, the next one
//! closes at once if it is already complete.
//!
//! A worker computes iteration `j` on its cached model `(v_c, w_c)` and sends
//! `Grad{base: v_c, iteration: j}`, then `Pull{have: v_c, min_clock}` to refresh its cache.
//! It may start iteration `j'` only if `(j' − 1) − v_c ≤ s_bap`: the model it uses lags the
//! model the iteration ideally wants (`w_{j'−1}`) by at most `s_bap` versions. The pull asks
//! for exactly that (`min_clock = j' − 1 − s_bap`): the server answers at once with its
//! model if it is newer than `have`, with `NotNewer` if the worker's copy is current and
//! good enough, and otherwise parks the pull (one slot per worker) until the version
//! reaches `min_clock`. Workers never apply their own gradients locally.
//!
//! **Time limit** ([`BapConfig::iteration_timeout`] `t_max`): when the head iteration has
//! been open longer than `t_max`, it closes with the gradients received (their mean), and
//! every worker whose gradient is missing gets `Abort{j}`: it abandons that computation,
//! pulls the new model and continues with iteration `j + 1`. A gradient of a closed
//! iteration that still arrives is **dropped and reported** ([`ServerEvent::Dropped`] with
//! [`DropReason::Aborted`]).
//!
//! # Invariants (tested)
//!
//! - Iterations close in order, each exactly once; the version is the last closed iteration.
//! - No gradient of a closed iteration is applied; every admitted gradient is applied once
//!   (in its iteration) or dropped once, with a reason.
//! - The version lag at the start of every computation, `(j − 1) − v_c`, is at most `s_bap`.
//! - With `s_bap = 0` and no time limit the trace equals BSP's: same versions, same bits.
//!
//! # Decisions of this project (marked as choices in docs/PROTOCOLS.md, "BAP")
//!
//! - **The bound's off-by-one** ([`BapConfig::bound`]): [`BapBound::AtMost`] (default) reads
//!   the staleness knob `s` as "lag `≤ s`"; [`BapBound::Below`] reads it as MALib's "`< S`"
//!   (so `S` there is `s_bap + 1`, and `S = 0` is refused).
//! - **The timeout's reference point** ([`BapConfig::timeout_from`]): the default
//!   [`TimeoutFrom::LaterOfBoth`] starts the clock of iteration `j` at its first gradient,
//!   or at the publication of `w_{j−1}` if that is later (docs/PROTOCOLS.md); the other two
//!   variants use one of the two alone. An iteration with no gradient is closed (by
//!   timeout, the model unchanged, `ModelUpdated{contributions: 0}`) only when a later open
//!   iteration has one: its own were lost. Its deadline counts from that later gradient.
//! - **Lost workers**: an iteration is complete when every *live* worker has contributed;
//!   a worker the transport declared lost is not waited for (its late gradients are
//!   dropped with [`DropReason::WorkerLost`]). A message from it makes it live again.
//! - **Malformed bound**: a gradient whose lag exceeds `s_bap`, or whose iteration is
//!   beyond the open window `v + 1 ..= v + 1 + s_bap`, is dropped with
//!   [`DropReason::OverStalenessBound`] (a correct worker never sends one).
//! - **Pull semantics**: `min_clock` is the lowest *version* the worker can use.
//!
//! # Messages
//!
//! | direction | message | meaning |
//! |---|---|---|
//! | W→S | `Join{epoch}` | start; answered with `Model` |
//! | W→S | `Grad{base, iteration, seq, values}` | the gradient of `iteration`, computed on `base` |
//! | W→S | `Pull{have, min_clock}` | refresh: answer when the version is `≥ min_clock` |
//! | W→S | `Leave` | the worker goes away (treated as lost) |
//! | S→W | `Model{version, clock: version, values}` | answer to a join or a pull |
//! | S→W | `NotNewer{version}` | answer to a pull: the worker's copy is current |
//! | S→W | `Abort{iteration}` | the iteration closed by timeout without this worker |
//! | S→W | `Stop` | training is over |
//!
//! # Knobs and how to choose them
//!
//! - [`BapConfig::staleness`] `s_bap`: `0` is BSP (every worker waits for each iteration);
//!   `s_bap = k` lets a fast worker run `k` iterations ahead of the last closed one. With a
//!   persistent straggler `m×` slower, each iteration still waits for it, so without a time
//!   limit the bound only hides transient slowness: fast workers pile up at most `s_bap`
//!   iterations of gradients. Memory is `(s_bap + 1) · dim` server scratch; the maximum is
//!   [`MAX_BAP_STALENESS`].
//! - [`BapConfig::iteration_timeout`] `t_max`: what makes BAP tolerate a persistent
//!   straggler or a dead worker. Set it above the typical iteration time of the healthy
//!   workers (compute + round trip, say 1.5–2× the median step) and below the straggler's:
//!   each timed-out iteration then closes with the `n − 1` fast gradients and drops the
//!   straggler's. Too small and iterations close with few gradients (noisy updates, many
//!   drops); `None` waits forever.
//! - [`BapConfig::learning_rate`]: as for BSP (updates average the gradients received).
//! - [`BapConfig::gradient_policy`], [`BapConfig::stall_report`]: as for BSP.
//!
//! # Liveness under message loss
//!
//! With [`WorkerSetup::rejoin_after`] set, no lost message hangs BAP, with or without a
//! time limit: a joining worker re-sends `Join`; a pulling worker re-sends its last `Grad`
//! (refused as a duplicate if it arrived) and its `Pull`. A worker that ran ahead (`s_bap >
//! 0`) keeps only its last gradient, so an earlier lost one is recovered by the server: a
//! repeated parked pull from a worker whose gradient of the head iteration is missing is
//! answered with the model the worker already has, and a worker receiving the model it
//! holds while blocked computes iteration `version + 1` again (copies the server already
//! has are refused as duplicates). With a time limit, the head also closes without it, and
//! an empty head behind later gradients closes too (see above).
//!
//! # Liveness when a worker dies
//!
//! Without a time limit, a worker that stops answering holds the head iteration open; the
//! others run ahead `s_bap` iterations, then block in their pulls. The server reports
//! [`ServerEvent::Stalled`] (with [`BapConfig::stall_report`]) naming the missing worker.
//! With a time limit, every iteration closes at most `t_max` after it opened, without the
//! dead worker, and the server keeps sending it `Abort`s. A worker declared lost is not
//! waited for at all.
//!
//! # Memory
//!
//! Server: the model plus `(s_bap + 1) · dim` scratch (one accumulator per open
//! iteration); per-iteration tables are fixed arrays. Worker: the cached model plus one
//! scratch buffer of the model's length for the outgoing gradient.
//!
//! [`DropReason::Aborted`]: crate::proto::DropReason::Aborted
//! [`DropReason::OverStalenessBound`]: crate::proto::DropReason::OverStalenessBound
//! [`DropReason::WorkerLost`]: crate::proto::DropReason::WorkerLost
//! [`ServerEvent::Dropped`]: crate::proto::ServerEvent::Dropped
//! [`ServerEvent::Stalled`]: crate::proto::ServerEvent::Stalled
//! [`WorkerSetup::rejoin_after`]: crate::proto::WorkerSetup::rejoin_after

#[cfg(doc)]
use crate::proto::ServerEvent;
mod server;
mod worker;

pub use server::{BapRules, BapServer, BapSlot, Contribution};
pub use worker::{BapWorker, BapWorkerRules};

use crate::error::ConfigError;
use crate::proto::GradientPolicy;
use crate::proto::common::validate::check_learning_rate;
use crate::time::Duration;

#[cfg(test)]
mod tests;

/// The largest effective staleness bound `s_bap` (the server keeps `s_bap + 1`
/// accumulators of the model's size).
pub const MAX_BAP_STALENESS: u64 = 15;

/// How [`BapConfig::staleness`] is read (docs/PROTOCOLS.md, "BAP").
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum BapBound {
    /// The lag may be at most `staleness`: `s_bap = staleness`.
    #[default]
    AtMost,
    /// The lag must be below `staleness` (MALib's wording): `s_bap = staleness − 1`.
    Below,
}

/// When an iteration's time limit starts counting (docs/PROTOCOLS.md, "BAP").
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum TimeoutFrom {
    /// At the iteration's first gradient, or the publication of the previous version if
    /// that is later.
    #[default]
    LaterOfBoth,
    /// At the iteration's first gradient.
    FirstGradient,
    /// At the publication of the previous version.
    Publication,
}

/// Settings of a BAP server and its workers.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct BapConfig {
    /// The number of workers `n` (ids `0..n`).
    pub workers: u32,
    /// The learning rate `η` (applied to the mean of an iteration's gradients).
    pub learning_rate: f64,
    /// The staleness knob; see [`Self::bound`] for how it becomes `s_bap`.
    pub staleness: u64,
    /// How `staleness` is read.
    pub bound: BapBound,
    /// The per-iteration time limit `t_max`; `None` waits for every live worker.
    pub iteration_timeout: Option<Duration>,
    /// Where `t_max` counts from.
    pub timeout_from: TimeoutFrom,
    /// Screening of incoming gradients.
    pub gradient_policy: GradientPolicy,
    /// Report a [`ServerEvent::Stalled`] after this long without a close (and again every
    /// interval); `None` never reports.
    pub stall_report: Option<Duration>,
}

impl BapConfig {
    /// `n` workers, learning rate `η`, bound `s_bap = staleness`; no time limit, no norm
    /// bound, no stall reports.
    pub fn new(workers: u32, learning_rate: f64, staleness: u64) -> Self {
        Self {
            workers,
            learning_rate,
            staleness,
            bound: BapBound::AtMost,
            iteration_timeout: None,
            timeout_from: TimeoutFrom::LaterOfBoth,
            gradient_policy: GradientPolicy::default(),
            stall_report: None,
        }
    }

    /// The effective bound `s_bap` (the largest lag allowed), or an error when out of range.
    pub fn s_bap(&self) -> Result<u64, ConfigError> {
        let s = match self.bound {
            BapBound::AtMost => Some(self.staleness),
            BapBound::Below => self.staleness.checked_sub(1),
        };
        match s {
            Some(s) if s <= MAX_BAP_STALENESS => Ok(s),
            _ => Err(ConfigError::Knob("staleness")),
        }
    }

    /// Accumulators the server keeps (`s_bap + 1`; 1 when the bound is out of range).
    pub fn open_iterations(&self) -> usize {
        self.s_bap().map_or(1, |s| s as usize + 1)
    }

    fn check(&self) -> Result<u64, ConfigError> {
        check_learning_rate(self.learning_rate)?;
        if self.iteration_timeout == Some(Duration::ZERO) {
            return Err(ConfigError::Knob("iteration_timeout"));
        }
        self.s_bap()
    }
}
