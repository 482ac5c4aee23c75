//! DBW, dynamic backup workers (Xu, Neglia, Sebastianelli, "Dynamic Backup Workers for
//! Parallel Machine Learning", Computer Networks 2021, arXiv 2004.14696): synchronous SGD
//! with backup workers ([`super::backup`]) where the server chooses, before every
//! broadcast, how many gradients `k_t = n − b_t` the next iteration waits for, "to
//! maximize the convergence speed at each iteration".
//!
//! The iteration rules are those of [`super::backup`] (shared code): close after the first
//! `k_t` gradients computed at the current model, average those, drop and report later
//! ones, [`Interrupt`] option A (abort, default) or B (run to completion).
//!
//! # Choosing `k_t` \[RECON\]
//!
//! Only the paper's abstract was readable, so the estimator is this project's
//! reconstruction (docs/PROTOCOLS.md, "DBW"), implemented in [`crate::math::estimate`] and
//! [`crate::math::dbw_policy`], which states each rule; docs/DBW.md records what was tried,
//! measured and dropped. The paper's aim is `k_t = argmax_k` of the expected loss decrease
//! per unit of wall-clock time. The default rules (the earlier single-curvature rules
//! remain selectable, [`LEta`]):
//! * **Two bounds on `k`** (the default, [`LEta::Split`]): `k_t` is the smaller of the
//!   greedy `argmax_{k ∈ [k_min, n_live]} D(k)/τ(k)` (the next iteration's decrease per
//!   second) and the noise-scale choice `argmin_k τ(k)·(Ĝ + Ŝ/k)` (time per unit of
//!   progress when the steps needed scale as `1 + B/k`, `B = Ŝ/Ĝ`: McCandlish et al. 2018).
//!   The greedy rule alone ratchets towards `k = n` once the gradient is mostly noise; the
//!   noise-scale rule alone waits for too many gradients early. Within the noise-scale
//!   rule's flat valley the largest `k` whose predicted cost is within
//!   [`DbwConfig::flat_tolerance`] of the best is taken: the lower noise floor at almost
//!   the same speed ([`crate::math::dbw_policy`], "Flat valleys").
//! * `D(k)/η = (1 − a/2)·G − b·S/(2k)` with **separate curvatures** for the signal (`a`)
//!   and the noise (`b`), both times `η`, fitted online from the Rayleigh secant pair by
//!   regularised least squares ([`LEta::Split`], the default). The single-curvature modes
//!   use `a = b = Lη` (the descent lemma).
//! * **Reported losses** ([`DbwConfig::use_reported_losses`], off by default): when the
//!   workers report their minibatch losses, `k_t` is at most the `k` maximising
//!   `(L̂ − η·Ŝ/(4k))/τ(k)`, the loss above the noise floor of `k` per second, with `L̂`
//!   the level of a line fitted to the reported losses ([`crate::math::dbw_policy`], "The
//!   loss above the noise floor"). Without reports the rule is the one above.
//! * `k` at most **doubles** per iteration (the default; `τ(k)` above the current `k` is
//!   extrapolated from censored round trips).
//! * If **no `k` has `D(k) > 0`** the default takes the noise-scale `k`; the
//!   single-curvature modes **keep their current `k`** (clamped to the live count). Neither
//!   jumps to `k = n` merely because the model predicts no decrease.
//! * `G` and `S` come from the `k` gradients of each iteration, streaming: the server keeps
//!   `Σ‖g_i‖²` while it accumulates `Σ g_i`, then `Ŝ = (Σ‖g_i‖² − k‖ḡ‖²)/(k−1)`,
//!   `Ĝ = ‖ḡ‖² − Ŝ/k`, each smoothed by an EMA with factor [`DbwConfig::ema_beta`]
//!   (one iteration's `Ĝ` scatters by more than `Ĝ` once noise dominates;
//!   [`crate::math::dbw_policy`], "Smoothing"), bias-corrected at start-up as in Adam ([`Ema`]). Under [`LEta::Split`] `Ĝ` is averaged
//!   before it is clipped at zero (per-iteration clipping biases it upwards where noise
//!   dominates); the other modes clip each sample. The squared norms come from admission
//!   ([`GradientPolicy::admit_measured`]): no second pass over a gradient.
//! * [`LEta::Secant`] / [`LEta::Rayleigh`]: `‖ḡ_t − ḡ_{t−1}‖ / ‖ḡ_{t−1}‖` or the curvature
//!   along the last step, noise-corrected, EMA-smoothed and clipped. The estimated modes
//!   need a second scratch buffer of the model's length for `ḡ_{t−1}`.
//! * `τ(k)`, the expected `k`-th fastest round trip among the live workers: with at most
//!   [`RTT_TRACKED_WORKERS`] workers, from **per-worker windows** of the last
//!   [`crate::math::dbw_policy::RTT_PER_WORKER`] round trips each (Kaplan–Meier per worker
//!   with an exponential tail for censored mass, combined as a Poisson-binomial:
//!   non-identical workers, and forgetting within that many iterations after a regime change),
//!   re-estimated every iteration; with more workers, or while a live worker has no sample
//!   yet, from the pooled window of the last [`DbwConfig::window`] iterations
//!   ([`RttWindow`], identical workers assumed, re-estimated when a sixteenth of it is new).
//!   A worker's round trip runs from the server sending it a model to the server receiving
//!   its gradient for that model; under option A the stragglers' round trips are
//!   right-censored at the close.
//! * **Warm-up**: the first [`DbwConfig::warmup_iterations`] iterations (at least the initial
//!   one, which has no estimates yet) wait for [`DbwConfig::warmup_k`] gradients, `⌈n/4⌉`
//!   (at least 2) by default rather than all `n` (the slowest round trip is the most
//!   expensive one, [`crate::math::dbw_policy`], "Warm-up").
//!
//! Every iteration the server reports [`ServerEvent::BackupChosen`]: the `k` chosen for
//! the next version, the estimates behind it, and the observed duration of the iteration
//! that just closed, so `b_t = n − k_t` can be plotted over training.
//!
//! Invariants (tested, docs/RELIABILITY.md, "Invariants", K1–K4): each update averages exactly `k_v`
//! gradients from `k_v` distinct workers, all computed at version `v` (K1); later ones are
//! dropped with an event and never counted in another version (K2); `k` changes when an
//! iteration closes, staying within `[max(1, min(k_min, live)), live]`, or when a loss
//! makes the open iteration's `k` unreachable (K3); the server progresses while a worker is
//! live (K4). With `k_min = n` and no loss the model trace is BSP's.
//!
//! Liveness when a worker dies: the next choice is bounded by the live count; an open
//! iteration that needs more gradients than it holds plus one from each live worker not yet
//! in it lowers its `k` to that count, and closes at once if it already holds them. Only
//! with no live worker left does the server wait (reported by [`ServerEvent::Stalled`] with
//! [`DbwConfig::stall_report`]).
//!
//! Messages: those of [`super::backup`]: receives `Join`, `Grad`, `Leave`; sends `Model`
//! and `Stop`. Workers are [`GradientWorker`](super::GradientWorker)s.
//!
//! What the gradient statistics cannot see: once the high-curvature directions sit at the
//! noise equilibrium of the current `k`, every gradient statistic is stationary while the
//! loss still falls, so without loss reports the rule settles at a fixed `k`
//! ([`crate::math::dbw_policy`], "What the gradient statistics cannot see"). The ratios to
//! the best static `b` it reaches, per scenario and seed set, are in docs/DBW.md and
//! REPRODUCTION.md, "DBW". The online
//! per-arrival rule of docs/PROTOCOLS.md, "DBW" is not implemented: for memoryless round
//! trips the rate-optimal stopping rule is a fixed `k`.
//!
//! Knobs: `k_min` (2 keeps `Ŝ` defined), `window` (longer is smoother, shorter follows
//! changes in the cluster), `ema_beta` (closer to 1 is smoother and slower to follow),
//! `warmup_iterations`, `warmup_k`, `l_eta` (the estimate is sensitive to it: a larger `Lη`
//! weighs the noise more and picks larger `k`), `flat_tolerance` (0 is the plain
//! noise-scale rule), `interrupt`.

#[cfg(doc)]
use crate::math::dbw_policy::RTT_TRACKED_WORKERS;
#[cfg(doc)]
use crate::math::estimate::Ema;
#[cfg(doc)]
use crate::math::estimate::MAX_RTT_SAMPLES;
#[cfg(doc)]
use crate::math::estimate::RTT_CHUNK;
#[cfg(doc)]
use crate::math::estimate::RttWindow;
#[cfg(doc)]
use crate::proto::ServerEvent;
mod server;
mod worker;

pub use server::{DbwRules, DbwServer};
pub use worker::DbwWorker;

use crate::error::ConfigError;

/// Bytes of one pooled-window entry (a chunk of round trips).
const RTT_CHUNK_BYTES: usize = size_of::<[u32; crate::math::estimate::RTT_CHUNK]>();
use crate::proto::GradientPolicy;
use crate::proto::backup::Interrupt;
use crate::time::Duration;

/// How DBW gets the smoothness product `Lη`.
#[derive(Clone, Copy, Debug, PartialEq)]
pub enum LEta {
    /// A fixed value (a hyper-parameter; 1.0 when `η` was tuned near the stability limit).
    Fixed(f64),
    /// The secant estimate `‖ḡ_t − ḡ_{t−1}‖ / ‖ḡ_{t−1}‖` (the largest-curvature flavour),
    /// starting at `initial`, clipped to `[min, max]`.
    Secant {
        /// Used until the first estimate.
        initial: f64,
        /// Lower clip.
        min: f64,
        /// Upper clip.
        max: f64,
    },
    /// The curvature along the last step, from the same secant pair:
    /// `⟨ḡ_{t−1} − ḡ_t, ḡ_{t−1}⟩ / ‖ḡ_{t−1}‖²` (a Rayleigh quotient: the mean curvature
    /// seen by the step rather than the largest), starting at `initial`, clipped to
    /// `[min, max]`.
    Rayleigh {
        /// Used until the first estimate.
        initial: f64,
        /// Lower clip.
        min: f64,
        /// Upper clip.
        max: f64,
    },
    /// Separate curvatures for the signal and the noise term, both from the Rayleigh secant
    /// pair by online least squares ([`crate::math::dbw_policy::CurvatureSplit`]), each
    /// clipped to `[min, max]`; `initial` until the first estimate.
    Split {
        /// Used until the first estimate.
        initial: f64,
        /// Lower clip.
        min: f64,
        /// Upper clip.
        max: f64,
    },
}

impl LEta {
    fn valid(self) -> bool {
        let ok = |x: f64| x.is_finite() && x > 0.0;
        match self {
            Self::Fixed(x) => ok(x),
            Self::Secant { initial, min, max }
            | Self::Rayleigh { initial, min, max }
            | Self::Split { initial, min, max } => {
                ok(initial) && ok(min) && ok(max) && min <= initial && initial <= max
            }
        }
    }

    /// `(initial, min, max)` of an estimated mode.
    fn estimated(self) -> Option<(f64, f64, f64)> {
        match self {
            Self::Fixed(_) => None,
            Self::Secant { initial, min, max }
            | Self::Rayleigh { initial, min, max }
            | Self::Split { initial, min, max } => Some((initial, min, max)),
        }
    }
}

/// Settings of a [`DbwServer`].
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct DbwConfig {
    /// The number of workers `n` (ids `0..n`).
    pub workers: u32,
    /// The learning rate `η`.
    pub learning_rate: f64,
    /// The smallest `k` DBW may choose, `1..=n` (2 keeps the variance estimate defined).
    pub k_min: u32,
    /// Round-trip window length in iterations (≥ 1) of the pooled window: it keeps
    /// `window · n` samples, at most [`MAX_RTT_SAMPLES`] and at most [`RTT_CHUNK`] per entry
    /// of the caller's tables (`Inline<N>`: `RTT_CHUNK · N`).
    pub window: u32,
    /// EMA factor `β` for the `G`, `S` (and secant `Lη`) estimates and the forgetting factor
    /// of the curvature fit, in `[0, 1)`; 0.98 by default ([`crate::math::dbw_policy`],
    /// "Smoothing").
    pub ema_beta: f64,
    /// Iterations at the start that wait for every live worker (the initial iteration
    /// always does).
    pub warmup_iterations: u32,
    /// How many gradients the warm-up iterations wait for (capped by the live count);
    /// `None`: all live workers. Default `⌈n/4⌉`, at least 2 ([`crate::math::dbw_policy`], "Warm-up").
    pub warmup_k: Option<u32>,
    /// Where `Lη` comes from.
    pub l_eta: LEta,
    /// Flat-valley tolerance of the noise-scale bound ([`LEta::Split`] only): the largest
    /// `k` whose predicted time per unit of progress is within `1 + flat_tolerance` of the
    /// smallest is taken ([`crate::math::dbw_policy`], "Flat valleys"); finite, `≥ 0`.
    pub flat_tolerance: f64,
    /// Whether the choice uses the workers' reported minibatch losses (a trend fitted with
    /// forgetting factor [`Self::ema_beta`]; [`crate::math::dbw_policy`], "The loss above
    /// the noise floor"). Off by default: the rule takes the loss as its excess over the
    /// optimum, right where the optimum is 0 (the NQM) and biased towards small `k` where
    /// it is not (cross-entropy). Without reports the rule is the same either way.
    pub use_reported_losses: bool,
    /// What stragglers do when their iteration closes.
    pub interrupt: Interrupt,
    /// Screening of incoming gradients.
    pub gradient_policy: GradientPolicy,
    /// Report a [`ServerEvent::Stalled`] after this long without progress; `None` never.
    pub stall_report: Option<Duration>,
}

impl DbwConfig {
    /// `n` workers, learning rate `η`, and defaults: `k_min = 2` (1 when `n = 1`), a window
    /// of 100 iterations, `β = 0.98`, 1 warm-up iteration waiting for `⌈n/4⌉` gradients (at
    /// least `k_min`),
    /// separate signal and noise curvatures ([`LEta::Split`], from 1.0, clipped to
    /// `[0.001, 1.9]`), a flat-valley tolerance of 2% on the noise-scale bound
    /// ([`DbwConfig::flat_tolerance`]), the reported losses not used
    /// ([`DbwConfig::use_reported_losses`]), option A.
    ///
    /// These differ from docs/PROTOCOLS.md, "DBW" (a fixed `Lη`, `β = 0.9`): the split
    /// curvatures, the two bounds on `k`, the flat-valley tolerance, the loss bound, the
    /// `⌈n/4⌉` warm-up and `β = 0.98` are this project's reconstruction ([`crate::math::dbw_policy`]), each
    /// chosen on seeds 1–5 of `syncopate reproduce dbw` (docs/DBW.md).
    pub fn new(workers: u32, learning_rate: f64) -> Self {
        Self {
            workers,
            learning_rate,
            k_min: workers.clamp(1, 2),
            window: 100,
            ema_beta: 0.98,
            warmup_iterations: 1,
            warmup_k: Some(workers.div_ceil(4).max(workers.clamp(1, 2))),
            l_eta: LEta::Split { initial: 1.0, min: 0.001, max: 1.9 },
            flat_tolerance: 0.02,
            use_reported_losses: false,
            interrupt: Interrupt::Abort,
            gradient_policy: GradientPolicy::default(),
            stall_report: None,
        }
    }

    /// Elements of scratch storage the server needs for a model of `dim` elements: the
    /// accumulator, plus `ḡ_{t−1}` in secant mode.
    pub fn scratch_len(&self, dim: usize) -> usize {
        match self.l_eta {
            LEta::Fixed(_) => dim,
            LEta::Secant { .. } | LEta::Rayleigh { .. } | LEta::Split { .. } => dim.saturating_mul(2),
        }
    }

    /// Bytes of estimator state per worker beside the worker table: the per-worker round-trip
    /// window and its fit, the pooled window's share, and the `f64` tables of `n` entries
    /// (`τ̂(k)`, the last order statistics, the binomial and Poisson-binomial work space).
    pub fn estimator_bytes_per_worker() -> usize {
        use core::mem::size_of;
        size_of::<crate::math::dbw_policy::WorkerWindow>() + 2 * RTT_CHUNK_BYTES + 5 * size_of::<f64>()
    }

    fn check(&self) -> Result<(), ConfigError> {
        if self.k_min == 0 || self.k_min > self.workers.max(1) {
            return Err(ConfigError::Knob("k_min"));
        }
        if self.window == 0 {
            return Err(ConfigError::Knob("window"));
        }
        if !(self.ema_beta >= 0.0 && self.ema_beta < 1.0) {
            return Err(ConfigError::Knob("ema_beta"));
        }
        if !self.l_eta.valid() {
            return Err(ConfigError::Knob("l_eta"));
        }
        if !(self.flat_tolerance >= 0.0 && self.flat_tolerance.is_finite()) {
            return Err(ConfigError::Knob("flat_tolerance"));
        }

        Ok(())
    }
}

#[cfg(test)]
mod tests;
