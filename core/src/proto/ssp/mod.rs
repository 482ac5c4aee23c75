//! SSP, stale synchronous parallel: per-worker clocks, a staleness bound `s`, updates
//! applied on arrival, reads served from a worker-side cache while it is fresh enough.
//!
//! Paper: Q. Ho, J. Cipar, H. Cui, J. K. Kim, S. Lee, P. B. Gibbons, G. A. Gibson, G. R.
//! Ganger, E. P. Xing, "More Effective Distributed ML via a Stale Synchronous Parallel
//! Parameter Server", NIPS 2013. Cache and server mechanics follow Petuum Bösen
//! (`ssp_consistency_controller.cpp`, `server.cpp`), as summarised in PROTOCOLS.md §5.1.
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
//! # Decisions of this project (\[RECON\] in PROTOCOLS.md)
//!
//! - **Who scales.** The worker sends the update `u = −η_step · g` (the `Clock` payload is
//!   additive, as in Bösen's `Inc`); the server only adds. The server's norm bound
//!   ([`SspConfig::gradient_policy`]) is still a bound on the *gradient*: the server checks
//!   `‖u‖ ≤ η_step · max_norm`. A clipped update differs from the copy the worker applied to
//!   its cache; the difference disappears at the worker's next pull.
//! - **Learning-rate normalization** ([`SspConfig::step`]): each update is its own step, so a
//!   full clock applies `n` steps. The default [`SspStep::Averaged`] uses
//!   `η_step = η / n`, which makes a full clock equal one averaged BSP step with learning
//!   rate `η` (PROTOCOLS.md §9.5); [`SspStep::PerWorker`] uses `η` for every update, the
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
//! Server: the model only (no scratch); per-worker tables are fixed arrays of
//! [`MAX_WORKERS`]. Worker: the cached model plus one scratch buffer of the model's length
//! holding the outgoing update.

use crate::proto::common::round::check_learning_rate;
use crate::proto::common::queue::{ServerItem, ServerQueue, WorkerItem, WorkerQueue};
use crate::proto::common::roster::Roster;
use crate::proto::common::stall::StallWatch;
use super::{
    Buffer, GradientPolicy, Recipient, Server, ServerEvent, ServerOutput, ServerStats, Worker, WorkerEvent,
    WorkerOutput, WorkerSetup,
};
use crate::error::{ConfigError, Reject};
use crate::id::{ComputeId, MAX_WORKERS, Version, WorkerId};
use crate::math::{self, Scalar};
use crate::msg::{ToServer, ToWorker, Values};
use crate::time::{Duration, Instant};
use core::marker::PhantomData;

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

/// The SSP server. `S` is the caller's storage for the model.
#[derive(Debug)]
pub struct SspServer<T, S> {
    config: SspConfig,
    policy: GradientPolicy,
    params: S,
    version: Version,
    /// The server clock: min over live workers of `clocks`, never decreasing.
    clock: u64,
    /// Per worker: clocks completed (the next clock it will send).
    clocks: [u64; MAX_WORKERS],
    /// Per worker: the `min_clock` of its parked pull.
    pending: [Option<u64>; MAX_WORKERS],
    /// Per worker: the version of the last model sent to it.
    last_sent: [u64; MAX_WORKERS],
    /// Per worker: its own updates applied since that model.
    own_since: [u64; MAX_WORKERS],
    /// Per worker: the epoch of its last `Join`.
    epochs: [Option<u32>; MAX_WORKERS],
    roster: Roster,
    stall: StallWatch,
    stats: ServerStats,
    queue: ServerQueue,
    _t: PhantomData<T>,
}

impl<T: Scalar, S: Buffer<T>> SspServer<T, S> {
    /// A server starting from the model in `params` at version 0, clock 0.
    pub fn new(config: SspConfig, params: S) -> Result<Self, ConfigError> {
        Self::resume(config, params, Version::ZERO)
    }

    /// A server resuming from a checkpoint: `params` is the model at `version`. Worker
    /// clocks restart at 0 and catch up with the workers' next `Clock` messages.
    pub fn resume(config: SspConfig, params: S, version: Version) -> Result<Self, ConfigError> {
        config.check()?;
        let roster = Roster::new(config.workers)?;
        if params.as_ref().is_empty() {
            return Err(ConfigError::EmptyModel);
        }
        let mut stall = StallWatch::new(config.stall_report);
        stall.idle();
        Ok(Self {
            config,
            policy: config.update_policy(),
            params,
            version,
            clock: 0,
            clocks: [0; MAX_WORKERS],
            pending: [None; MAX_WORKERS],
            last_sent: [version.0; MAX_WORKERS],
            own_since: [0; MAX_WORKERS],
            epochs: [None; MAX_WORKERS],
            roster,
            stall,
            stats: ServerStats::default(),
            queue: ServerQueue::new(),
            _t: PhantomData,
        })
    }

    /// The settings.
    pub fn config(&self) -> &SspConfig {
        &self.config
    }

    /// The server clock: every update of a clock below it, from every live worker, is in
    /// the model.
    pub fn clock(&self) -> u64 {
        self.clock
    }

    /// Clocks completed by `worker`, as far as the server knows.
    pub fn worker_clock(&self, worker: WorkerId) -> Option<u64> {
        self.roster.check_member(worker).ok().and_then(|i| self.clocks.get(i).copied())
    }

    /// Whether `worker` has a pull parked (it is blocked on the staleness bound).
    pub fn is_waiting(&self, worker: WorkerId) -> bool {
        self.pending.get(worker.index()).is_some_and(Option::is_some)
    }

    fn n(&self) -> usize {
        self.roster.n()
    }

    /// Min over live workers' clocks (the current clock if nobody is live).
    fn live_min(&self) -> u64 {
        let live = self.roster.live();
        (0..self.n())
            .filter(|&i| live.contains(WorkerId(i as u32)))
            .filter_map(|i| self.clocks.get(i).copied())
            .min()
            .unwrap_or(self.clock)
    }

    /// Recomputes the server clock; on progress restarts the stall watch and answers
    /// parked pulls.
    fn advance(&mut self, now: Instant) {
        let min = self.live_min();
        if min > self.clock {
            self.clock = min;
            self.stall.progress(now);
        }
        self.answer_pulls();
        if !self.pending.iter().take(self.n()).any(Option::is_some) {
            self.stall.idle();
        }
    }

    fn answer_pulls(&mut self) {
        let s = self.config.staleness;
        for i in 0..self.n() {
            let (Some(slot), Some(&own)) = (self.pending.get_mut(i), self.clocks.get(i)) else { continue };
            let Some(min_clock) = *slot else { continue };
            // The puller is at clock `min_clock + s`; its updates up to then must be in.
            if self.clock >= min_clock && own >= min_clock.saturating_add(s) {
                *slot = None;
                self.send_model(WorkerId(i as u32));
            }
        }
    }

    fn send_model(&mut self, to: WorkerId) {
        if let (Some(sent), Some(own)) = (self.last_sent.get_mut(to.index()), self.own_since.get_mut(to.index())) {
            *sent = self.version.0;
            *own = 0;
        }
        self.queue.push(ServerItem::Model { to: Recipient::Worker(to) });
    }

    /// A worker that was not live is live again: raise its clock to the server clock.
    fn readmit(&mut self, i: usize) {
        if let Some(c) = self.clocks.get_mut(i) {
            *c = (*c).max(self.clock);
        }
    }

    fn on_join(&mut self, now: Instant, from: WorkerId, epoch: u32) -> Result<(), Reject> {
        let fresh = self.roster.check_join(from, epoch)?;
        self.roster.commit_join(from, epoch);
        let i = from.index();
        if fresh {
            self.queue.push(ServerItem::Event(ServerEvent::WorkerJoined { worker: from, epoch }));
        }
        let server_clock = self.clock;
        if let (Some(c), Some(e), Some(p)) = (self.clocks.get_mut(i), self.epochs.get_mut(i), self.pending.get_mut(i)) {
            if *e == Some(epoch) {
                // The same session again (a retransmitted or delayed `Join`): the worker may
                // be past the server clock already, and its updates are in (a repeat of its
                // last `Clock` would be refused as a duplicate), so its clock never goes down.
                *c = (*c).max(server_clock);
            } else {
                // A new session starts from nothing: at the server clock (the clock of the
                // model it receives), with no pull of the old session parked.
                *c = server_clock;
                *p = None;
                *e = Some(epoch);
            }
        }
        self.send_model(from);
        self.advance(now);
        Ok(())
    }

    fn on_clock(
        &mut self,
        now: Instant,
        from: WorkerId,
        clock: u64,
        seq: u64,
        values: Values<'_, T>,
    ) -> Result<(), Reject> {
        self.roster.check_seq(from, seq)?;
        let factor = self.policy.admit(&values, self.params.as_ref().len())?;
        // Lengths are checked: the additions below cannot fail, and do nothing if they do.
        if factor == T::one() {
            values.add_into(self.params.as_mut())?;
        } else {
            values.scaled_add_into(self.params.as_mut(), factor)?;
        }
        let i = from.index();
        if !self.roster.is_live(from) {
            self.readmit(i);
        }
        // Sequence numbers are namespaced by epoch (`first_seq(epoch) = epoch << 32`): an
        // update of a session the server has not seen join yet (its `Join` is late; the
        // worker started on another model sent to it) starts that session here, so the late
        // `Join` counts as a repeat and does not pull the clock back.
        let session = u32::try_from(seq >> 32).unwrap_or(u32::MAX);
        let server_clock = self.clock;
        if let (Some(e), Some(c)) = (self.epochs.get_mut(i), self.clocks.get_mut(i)) {
            if *e != Some(session) {
                *e = Some(session);
                *c = server_clock;
            }
        }
        self.roster.commit_seq(from, seq);
        self.stats.accepted += 1;
        let base = self.last_sent.get(i).copied().unwrap_or(0);
        let own = self.own_since.get(i).copied().unwrap_or(0);
        let staleness = self.version.0.saturating_sub(base).saturating_sub(own);
        self.version = self.version.next();
        if let Some(o) = self.own_since.get_mut(i) {
            *o = o.saturating_add(1);
        }
        if let Some(c) = self.clocks.get_mut(i) {
            *c = (*c).max(clock.saturating_add(1));
        }
        self.stats.applied += 1;
        self.stats.updates += 1;
        let version = self.version;
        self.queue.push(ServerItem::Event(ServerEvent::Applied {
            worker: from,
            base: Version(base),
            version,
            staleness,
            weight: factor.to_f64(),
        }));
        self.queue.push(ServerItem::Event(ServerEvent::ModelUpdated { version, contributions: 1 }));
        self.advance(now);
        Ok(())
    }

    fn on_pull(&mut self, now: Instant, from: WorkerId, have: Version, min_clock: u64) -> Result<(), Reject> {
        if have > self.version {
            return Err(Reject::FutureVersion { claimed: have, current: self.version });
        }
        let waiting = self.pending.iter().take(self.n()).any(Option::is_some);
        let slot = self.pending.get_mut(from.index()).ok_or(Reject::UnknownWorker(from))?;
        *slot = Some(min_clock);
        if !waiting {
            // A wait starts now.
            self.stall.progress(now);
        }
        self.advance(now);
        Ok(())
    }
}

impl<T: Scalar, S: Buffer<T>> Server<T> for SspServer<T, S> {
    fn handle(&mut self, now: Instant, from: WorkerId, msg: ToServer<'_, T>) -> Result<(), Reject> {
        let result = self.queue.ensure_room(self.n() + 4).and_then(|()| {
            self.roster.check_member(from)?;
            match msg {
                ToServer::Join { epoch } => self.on_join(now, from, epoch),
                ToServer::Clock { clock, seq, values } => self.on_clock(now, from, clock, seq, values),
                ToServer::Pull { have, min_clock } => self.on_pull(now, from, have, min_clock),
                ToServer::Leave => self.handle_worker_lost(now, from),
                other => Err(Reject::Unexpected { kind: other.kind_name() }),
            }
        });
        if result.is_err() {
            self.stats.rejected += 1;
        }
        result
    }

    fn handle_worker_lost(&mut self, now: Instant, worker: WorkerId) -> Result<(), Reject> {
        self.roster.check_member(worker)?;
        self.queue.ensure_room(self.n() + 2)?;
        if self.roster.lose(worker) {
            self.queue.push(ServerItem::Event(ServerEvent::WorkerLost { worker }));
        }
        if let Some(p) = self.pending.get_mut(worker.index()) {
            *p = None;
        }
        self.advance(now);
        Ok(())
    }

    fn handle_timeout(&mut self, now: Instant) {
        if !self.stall.due(now) {
            return;
        }
        let live = *self.roster.live();
        let slowest = (0..self.n())
            .filter(|&i| live.contains(WorkerId(i as u32)) && self.clocks.get(i) == Some(&self.clock))
            .map(|i| WorkerId(i as u32));
        let missing = slowest.clone().count() as u32;
        if let Some(waiting_for) = slowest.min() {
            self.queue.push(ServerItem::Event(ServerEvent::Stalled {
                waiting_for,
                missing,
                since: self.stall.since(),
            }));
        }
    }

    fn poll_output(&mut self) -> Option<ServerOutput<'_, T>> {
        self.queue.poll(self.version, self.clock, self.params.as_ref())
    }

    fn poll_timeout(&self) -> Option<Instant> {
        self.stall.deadline()
    }

    fn stop(&mut self) {
        self.stall.idle();
        self.queue.push(ServerItem::Stop);
    }

    fn version(&self) -> Version {
        self.version
    }

    fn params(&self) -> &[T] {
        self.params.as_ref()
    }

    fn stats(&self) -> &ServerStats {
        &self.stats
    }
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Phase {
    /// Sent `Join`, waiting for the first model.
    Joining {
        since: Instant,
    },
    /// The host computes job `id` for the worker's current clock.
    Computing {
        id: ComputeId,
    },
    /// The cache is too stale for the current clock; a pull for `min_clock` is out.
    Blocked {
        since: Instant,
        min_clock: u64,
    },
    Stopped,
}

/// The SSP worker: a cached model, a clock, and the staleness check before every
/// computation. `S` is the caller's storage: the cache and one scratch buffer of the same
/// length for the outgoing update.
#[derive(Debug)]
pub struct SspWorker<T, S> {
    setup: WorkerSetup,
    staleness: u64,
    /// `−η_step`.
    step: T,
    cache: S,
    out: S,
    phase: Phase,
    clock: u64,
    cache_version: Version,
    cache_clock: u64,
    seq: u64,
    next_job: u64,
    /// The last `Clock` sent, (clock, seq); its payload stays in `out` while blocked.
    last_clock: Option<(u64, u64)>,
    queue: WorkerQueue,
    _t: PhantomData<T>,
}

impl<T: Scalar, S: Buffer<T>> SspWorker<T, S> {
    /// A worker for `config`: `cache` has the model's length, `scratch` at least as many
    /// elements (the extra is unused). Its first output is `Join`.
    pub fn new(config: SspConfig, setup: WorkerSetup, cache: S, scratch: S) -> Result<Self, ConfigError> {
        config.check()?;
        let dim = cache.as_ref().len();
        if dim == 0 {
            return Err(ConfigError::EmptyModel);
        }
        if scratch.as_ref().len() < dim {
            return Err(ConfigError::ScratchTooSmall { needed: dim, given: scratch.as_ref().len() });
        }
        let mut queue = WorkerQueue::new();
        queue.push(WorkerItem::Join { epoch: setup.epoch });
        Ok(Self {
            setup,
            staleness: config.staleness,
            step: T::from_f64(-config.step_size()),
            cache,
            out: scratch,
            phase: Phase::Joining { since: Instant::ZERO },
            clock: 0,
            cache_version: Version::ZERO,
            cache_clock: 0,
            seq: crate::id::first_seq(setup.epoch),
            next_job: 0,
            last_clock: None,
            queue,
            _t: PhantomData,
        })
    }

    /// The worker's clock: clocks completed, i.e. the clock it computes or waits to compute.
    pub fn clock(&self) -> u64 {
        self.clock
    }

    /// The server clock of the cached model.
    pub fn cache_clock(&self) -> u64 {
        self.cache_clock
    }

    /// The server version the cache was taken from (the worker's own later updates are
    /// applied on top).
    pub fn model_version(&self) -> Version {
        self.cache_version
    }

    /// Whether the worker waits for a fresher model.
    pub fn is_blocked(&self) -> bool {
        matches!(self.phase, Phase::Blocked { .. })
    }

    fn dim(&self) -> usize {
        self.cache.as_ref().len()
    }

    /// Starts the next clock if the cache is fresh enough, else pulls and blocks.
    fn proceed(&mut self, now: Instant) {
        if self.cache_clock.saturating_add(self.staleness) >= self.clock {
            let id = ComputeId(self.next_job);
            self.next_job += 1;
            self.phase = Phase::Computing { id };
            self.queue.push(WorkerItem::Compute { id, version: self.cache_version });
        } else {
            let min_clock = self.clock - self.staleness;
            self.queue.push(WorkerItem::Pull { have: self.cache_version, min_clock });
            self.queue.push(WorkerItem::Event(WorkerEvent::Blocked { have: self.cache_version }));
            self.phase = Phase::Blocked { since: now, min_clock };
        }
    }

    fn on_model(&mut self, now: Instant, version: Version, clock: u64, values: Values<'_, T>) -> Result<(), Reject> {
        values.check_len(self.dim())?;
        match self.phase {
            Phase::Stopped => return Err(Reject::Stopped),
            Phase::Computing { .. } => {
                return Err(if version <= self.cache_version {
                    Reject::Duplicate { worker: self.setup.id, seq: version.0 }
                } else {
                    Reject::Unexpected { kind: "Model" }
                });
            }
            Phase::Blocked { min_clock, .. } => {
                if version < self.cache_version {
                    return Err(Reject::OutdatedModel { received: version, have: self.cache_version });
                }
                if clock < min_clock {
                    return Err(Reject::Unexpected { kind: "Model" });
                }
            }
            Phase::Joining { .. } => {}
        }
        values.copy_into(self.cache.as_mut())?;
        self.cache_version = version;
        self.cache_clock = clock;
        // A joining worker starts at the server clock; an evicted one catches up.
        self.clock = self.clock.max(clock);
        self.proceed(now);
        Ok(())
    }
}

impl<T: Scalar, S: Buffer<T>> Worker<T> for SspWorker<T, S> {
    fn handle(&mut self, now: Instant, msg: ToWorker<'_, T>) -> Result<(), Reject> {
        self.queue.ensure_room(3)?;
        match msg {
            ToWorker::Model { version, clock, values } => self.on_model(now, version, clock, values),
            ToWorker::Stop => {
                if self.phase != Phase::Stopped {
                    self.phase = Phase::Stopped;
                    self.queue.push(WorkerItem::Event(WorkerEvent::Stopped));
                }
                Ok(())
            }
            other => Err(Reject::Unexpected { kind: other.kind_name() }),
        }
    }

    fn handle_gradient(&mut self, now: Instant, id: ComputeId, grad: &[T]) -> Result<(), Reject> {
        match self.phase {
            Phase::Computing { id: current } if current == id => {}
            _ => return Err(Reject::NoSuchComputation),
        }
        self.queue.ensure_room(3)?;
        let dim = self.dim();
        if grad.len() != dim {
            return Err(Reject::WrongLength(math::LengthMismatch { expected: dim, actual: grad.len() }));
        }
        if !math::all_finite(grad) {
            return Err(Reject::NotFinite);
        }
        let out = self.out.as_mut().get_mut(..dim).ok_or(Reject::Capacity)?;
        for (u, g) in out.iter_mut().zip(grad) {
            *u = self.step * *g;
        }
        // Read-my-writes: the cache carries the worker's own updates.
        math::add(self.cache.as_mut(), out)?;
        self.queue.push(WorkerItem::Clock { clock: self.clock, seq: self.seq });
        self.last_clock = Some((self.clock, self.seq));
        self.seq += 1;
        self.clock = self.clock.saturating_add(1);
        self.proceed(now);
        Ok(())
    }

    fn handle_timeout(&mut self, now: Instant) {
        let Some(after) = self.setup.rejoin_after else { return };
        if self.queue.ensure_room(3).is_err() {
            return;
        }
        match self.phase {
            Phase::Joining { since } if now >= since + after => {
                self.phase = Phase::Joining { since: now };
                self.queue.push(WorkerItem::Join { epoch: self.setup.epoch });
            }
            Phase::Blocked { since, min_clock } if now >= since + after => {
                // The update or the pull may have been lost: send both again (the server
                // refuses a repeat of an update it has as a duplicate).
                if let Some((clock, seq)) = self.last_clock {
                    self.queue.push(WorkerItem::Clock { clock, seq });
                }
                self.queue.push(WorkerItem::Pull { have: self.cache_version, min_clock });
                self.phase = Phase::Blocked { since: now, min_clock };
            }
            _ => {}
        }
    }

    fn poll_output(&mut self) -> Option<WorkerOutput<'_, T>> {
        let dim = self.dim();
        let out = self.out.as_ref();
        self.queue.poll(self.cache.as_ref(), out.get(..dim).unwrap_or(out))
    }

    fn poll_timeout(&self) -> Option<Instant> {
        let after = self.setup.rejoin_after?;
        match self.phase {
            Phase::Joining { since } | Phase::Blocked { since, .. } => Some(since + after),
            _ => None,
        }
    }

    fn id(&self) -> WorkerId {
        self.setup.id
    }

    fn is_stopped(&self) -> bool {
        self.phase == Phase::Stopped
    }
}
