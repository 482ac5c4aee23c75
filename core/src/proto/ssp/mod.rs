//! SSP, stale synchronous parallel: per-worker clocks, a staleness bound `s`, updates
//! applied on arrival, reads served from a worker-side cache while it is fresh enough.
//!
//! Paper: Q. Ho, J. Cipar, H. Cui, J. K. Kim, S. Lee, P. B. Gibbons, G. A. Gibson, G. R.
//! Ganger, E. P. Xing, "More Effective Distributed ML via a Stale Synchronous Parallel
//! Parameter Server", NIPS 2013. Cache and server mechanics follow Petuum Bösen
//! (`ssp_consistency_controller.cpp`, `server.cpp`), as summarised in docs/PROTOCOLS.md, "SSP".
//!
//! # Algorithm
//!
//! Every worker `p` has a clock `c_p`, the number of iterations it has completed. Iteration
//! `c` ("clock `c`") computes one gradient `g` on the worker's cached model, turns it into
//! the additive update `u = −η_step · g`, applies `u` to its own cache (read-my-writes) and
//! sends it to the server as `Clock{clock: c, values: u}`; the worker's clock becomes `c + 1`.
//!
//! The server adds every update to the model on arrival (`w += u`, one version per update)
//! and keeps each worker's clock. Its own clock is the minimum over the **live** workers'
//! clocks: every update timestamped below the server clock is in the model.
//!
//! Before computing clock `c` the worker checks its cache: a cache taken at server clock
//! `c_cache` is fresh enough when `c_cache ≥ c − s`. If it is, the worker computes at once
//! on the cache; otherwise it sends `Pull{have, min_clock: c − s}` and blocks. The server
//! parks the pull (one slot per worker) and answers with its model once its clock has
//! reached `c − s` **and** it has received the puller's own updates up to clock `c − 1`,
//! so the answer contains the reader's writes even when a pull overtakes an update. The
//! answer `Model{version, clock, values}` carries the server clock, which becomes the new
//! cache clock.
//!
//! Consequences (the SSP guarantees, tested):
//!
//! - **Bounded gap (S2).** A worker starts clock `c` only when every live worker has
//!   completed clock `c − s − 1`: the clock a worker computes is at most `s` ahead of the
//!   slowest live worker's completed clocks. (With `s = 0` a worker starts clock `c` only
//!   after everybody completed `c − 1`: BSP.) Convention: "the clock a worker is at" is the
//!   clock it is computing or blocked on, so a worker that just finished `c` and is blocked
//!   counts as being at `c + 1`, waiting.
//! - **Stale reads (S1).** A read at clock `c` contains every update with timestamp
//!   `≤ c − s − 1` from every live worker, and possibly newer ones.
//! - **Read-my-writes (S3).** It also contains all of the reader's own updates.
//! - **Exactly once (S4).** Every admitted update is applied once; nothing is ever dropped.
//! - **`s = 0` is BSP (S5)**: with [`SspStep::Averaged`] and exact arithmetic, the model at
//!   server clock `c` equals BSP's model at version `c`, and every worker computes clock `c`
//!   on exactly BSP's model `w_c`. This needs a worker's `Clock` and the `Pull` that follows
//!   it to arrive together (one network send, as every adapter does), and every worker to
//!   have joined before the first update arrives: a pull (or a join) answered later may
//!   already contain clock-`c` updates of faster workers, which SSP allows and BSP does not.
//!
//! # Decisions of this project (marked as choices in docs/PROTOCOLS.md)
//!
//! - **Who scales.** The worker sends the update `u = −η_step · g` (the `Clock` payload is
//!   additive, as in Bösen's `Inc`); the server only adds. The server's norm bound
//!   ([`SspConfig::gradient_policy`]) is still a bound on the *gradient*: the server checks
//!   `‖u‖ ≤ η_step · max_norm`. A clipped update differs from the copy the worker applied to
//!   its cache; the difference disappears at the worker's next pull.
//! - **Learning-rate normalization** ([`SspConfig::step`]): each update is its own step, so a
//!   full clock applies `n` steps. The default [`SspStep::Averaged`] uses
//!   `η_step = η / n`, which makes a full clock equal one averaged BSP step with learning
//!   rate `η` (docs/PROTOCOLS.md, "Learning rates"); [`SspStep::PerWorker`] uses `η` for every update, the
//!   paper's raw additive form (`n` times larger steps: lower `η` accordingly).
//! - **Server clock over live workers.** A worker declared lost (by the transport, a
//!   `Leave`) no longer holds the server clock back. If it comes back (a message, a join),
//!   its clock is raised to the server clock so the server clock never moves backwards.
//! - **Sessions.** A worker restarting with a new epoch starts at the server clock (the
//!   clock of the model it receives). The session starts at its `Join` or at its first
//!   `Clock`, whichever arrives first (`seq` carries the epoch, `crate::id::first_seq`); a
//!   repeated or late `Join` of the current session never lowers the worker's clock.
//! - **What [`ServerEvent::Applied`] reports.** `base` is the version of the last model the
//!   server sent to that worker (its cache's base; not the `Clock`'s clock), `staleness` the
//!   number of *other* workers' updates applied since then (the worker's own are in its
//!   cache), and `weight` only the clipping factor (1 unless clipped): the payload already
//!   is the step `u = −η_step · g`, so the model moves by `weight · u`.
//!
//! # Messages
//!
//! | direction | message | meaning |
//! |---|---|---|
//! | W→S | `Join{epoch}` | start; answered with `Model` (its `clock` is the worker's starting clock) |
//! | W→S | `Clock{clock, seq, values: u}` | clock `clock` finished with update `u` |
//! | W→S | `Pull{have, min_clock}` | the worker needs a model at server clock `≥ min_clock` |
//! | W→S | `Leave` | the worker goes away (treated as lost) |
//! | S→W | `Model{version, clock, values}` | answer to `Join` or to a pull; `clock` = server clock |
//! | S→W | `Stop` | training is over |
//!
//! SSP never sends `NotNewer` or `Abort`; the worker refuses them.
//!
//! # Knobs and how to choose them
//!
//! - [`SspConfig::staleness`] `s`: `0` is BSP; larger values let fast workers run further
//!   ahead of the slowest, on staler reads. With one persistent straggler `m` times slower
//!   than the others, fast workers stall once they are `s` clocks ahead, so throughput
//!   gains saturate quickly; `s` of 2 to 4 recovers most of the waiting time on the
//!   workloads here while keeping reads close to fresh. Past that, staleness costs accuracy
//!   per update. Ho et al. report the convergence bound grows like `√(s + 1)`.
//! - [`SspConfig::learning_rate`] and [`SspConfig::step`]: see above. Keep the BSP
//!   learning rate with the default `Averaged` step.
//! - [`SspConfig::gradient_policy`]: norm bound on gradients (see "who scales").
//! - [`SspConfig::stall_report`]: how often to report a stall.
//!
//! # Liveness under message loss
//!
//! With [`WorkerSetup::rejoin_after`] set, no lost message hangs SSP: a joining worker
//! re-sends `Join`; a blocked worker re-sends its last `Clock` (refused as a duplicate if
//! it arrived) and its `Pull` (parked again, answered when it can be). A lost earlier
//! update is not needed for progress (worker clocks only go up). Without `rejoin_after`, a
//! lost `Join`, `Clock`, `Pull` or `Model` blocks that worker for good.
//!
//! # Liveness when a worker dies
//!
//! A worker that stops answering but is not declared lost holds the server clock: the
//! others run until they are `s` clocks ahead, then block in their pulls. **SSP stalls at
//! the bound; that is the protocol.** The stall is not silent: with
//! [`SspConfig::stall_report`] set, the server emits [`ServerEvent::Stalled`] naming the
//! slowest worker while any pull is parked. Once the transport declares the worker lost
//! ([`Server::handle_worker_lost`] or `Leave`), the server clock is recomputed over the
//! live workers and the parked pulls are answered.
//!
//! # Memory
//!
//! Server: the model only (no scratch) and one record per worker in the caller's table
//! (its clock, parked pull, last model sent and session). Worker: the cached model plus one
//! scratch buffer of the model's length holding the outgoing update.
//!
//! [`Server::handle_worker_lost`]: crate::proto::Server::handle_worker_lost
//! [`ServerEvent::Applied`]: crate::proto::ServerEvent::Applied
//! [`ServerEvent::Stalled`]: crate::proto::ServerEvent::Stalled
//! [`WorkerSetup::rejoin_after`]: crate::proto::WorkerSetup::rejoin_after

#[cfg(doc)]
use crate::proto::ServerEvent;
mod server;
mod worker;

pub use server::{SspRules, SspServer, SspSlot};
pub use worker::{SspWorker, SspWorkerRules};

use crate::error::ConfigError;
use crate::proto::GradientPolicy;
use crate::proto::common::validate::check_learning_rate;
use crate::time::Duration;

#[cfg(test)]
pub(crate) mod harness;
#[cfg(test)]
mod tests;

/// How the learning rate is turned into the step of one worker's update.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum SspStep {
    /// `η_step = η / n`: a full clock of `n` updates equals one averaged BSP step.
    #[default]
    Averaged,
    /// `η_step = η`: every update is a full SGD step (the paper's additive form).
    PerWorker,
}

/// Settings of an SSP server and its workers.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct SspConfig {
    /// The number of workers `n` (ids `0..n`).
    pub workers: u32,
    /// The learning rate `η` (see [`Self::step`] for how it is applied).
    pub learning_rate: f64,
    /// The staleness bound `s`: a worker computes clock `c` only on a model containing
    /// every update of clocks `≤ c − s − 1`.
    pub staleness: u64,
    /// How `η` becomes the per-update step.
    pub step: SspStep,
    /// Screening of incoming updates; `max_norm` bounds the norm of the *gradient*.
    pub gradient_policy: GradientPolicy,
    /// Report a [`ServerEvent::Stalled`] after this long with a pull parked and the server
    /// clock not moving (and again every interval); `None` never reports.
    pub stall_report: Option<Duration>,
}

impl SspConfig {
    /// `n` workers, learning rate `η`, staleness bound `s`; averaged steps, no norm bound,
    /// no stall reports.
    pub fn new(workers: u32, learning_rate: f64, staleness: u64) -> Self {
        Self {
            workers,
            learning_rate,
            staleness,
            step: SspStep::Averaged,
            gradient_policy: GradientPolicy::default(),
            stall_report: None,
        }
    }

    /// The step applied to each update: `u = −step_size · g`.
    pub fn step_size(&self) -> f64 {
        match self.step {
            SspStep::Averaged => self.learning_rate / f64::from(self.workers.max(1)),
            SspStep::PerWorker => self.learning_rate,
        }
    }

    /// The policy the server applies to updates `u = −step · g`: the gradient bound scaled
    /// by the step.
    fn update_policy(&self) -> GradientPolicy {
        let step = self.step_size();
        GradientPolicy { max_norm: self.gradient_policy.max_norm.map(|m| m * step), ..self.gradient_policy }
    }

    fn check(&self) -> Result<(), ConfigError> {
        check_learning_rate(self.learning_rate)?;
        if !(self.step_size().is_finite() && self.step_size() > 0.0) {
            return Err(ConfigError::LearningRate);
        }
        Ok(())
    }
}
