//! Synchronous SGD with static backup workers (Chen et al. 2016, "Revisiting Distributed
//! Synchronous SGD"): the server closes each iteration after the first `k = n − b`
//! gradients computed at the current model, and the `b` slowest workers are backups whose
//! gradients for that iteration are dropped.
//!
//! Rules (PROTOCOLS.md §3.2 with a fixed `k`):
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
//! Invariants (tested, RELIABILITY.md K1–K4): each update averages exactly `k` gradients
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

use super::bsp::{Round, check_learning_rate};
use super::queue::{ServerItem, ServerQueue};
use super::roster::Roster;
use super::stall::StallWatch;
use super::{Buffer, DropReason, GradientPolicy, Recipient, Server, ServerEvent, ServerOutput, ServerStats};
use crate::error::{ConfigError, Reject};
use crate::id::{MAX_WORKERS, Version, WorkerId, WorkerSet};
use crate::math::{self, Scalar};
use crate::msg::{ToServer, Values};
use crate::time::{Duration, Instant};
use core::marker::PhantomData;

/// What happens to a straggler's computation when its iteration closes without it
/// (PROTOCOLS.md §3.2).
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

/// What [`Engine::admit`] did with an accepted gradient.
#[derive(Clone, Copy, Debug)]
pub(crate) struct Admitted {
    /// Added to the current round (otherwise dropped as stale).
    pub(crate) contributed: bool,
    /// The sender's round trip for this gradient (from the server sending it the model to
    /// now), if the model it was computed on was the last one sent to it and no sample was
    /// taken for it yet.
    pub(crate) rtt: Option<Duration>,
    /// The clipping factor the gradient was multiplied by (1 if none).
    pub(crate) factor: f64,
    /// The squared L2 norm of the gradient as received (before clipping), from admission.
    pub(crate) sq_norm: f64,
    /// The round now holds `k` gradients: the caller closes it.
    pub(crate) full: bool,
}

/// The part of a backup-worker server shared by the static and the dynamic variant: the
/// model, the round, membership, outputs, and per-worker send times (for round trips).
#[derive(Debug)]
pub(crate) struct Engine<T, S> {
    learning_rate: f64,
    policy: GradientPolicy,
    pub(crate) interrupt: Interrupt,
    params: S,
    scratch: S,
    pub(crate) version: Version,
    /// Gradients to wait for in the current iteration.
    pub(crate) k: usize,
    pub(crate) round: Round,
    pub(crate) roster: Roster,
    stall: StallWatch,
    pub(crate) stats: ServerStats,
    pub(crate) queue: ServerQueue,
    /// When the current version was produced (or the first join, for the initial one).
    pub(crate) iteration_start: Option<Instant>,
    /// Workers that joined and were not lost since.
    known: WorkerSet,
    /// When the server last sent each worker a model, and which version, while no round-trip
    /// sample has been taken for it.
    sent_at: [Instant; MAX_WORKERS],
    pending: [Option<Version>; MAX_WORKERS],
    _t: PhantomData<T>,
}

impl<T: Scalar, S: Buffer<T>> Engine<T, S> {
    /// `scratch` must hold `scratch_len` elements (at least the model's length: the first
    /// `dim` are the accumulator).
    #[allow(clippy::too_many_arguments)]
    pub(crate) fn new(
        workers: u32,
        learning_rate: f64,
        policy: GradientPolicy,
        interrupt: Interrupt,
        stall_report: Option<Duration>,
        k: usize,
        params: S,
        mut scratch: S,
        version: Version,
        scratch_len: impl FnOnce(usize) -> usize,
    ) -> Result<Self, ConfigError> {
        check_learning_rate(learning_rate)?;
        let roster = Roster::new(workers)?;
        let dim = params.as_ref().len();
        if dim == 0 {
            return Err(ConfigError::EmptyModel);
        }
        let needed = scratch_len(dim).max(dim);
        let given = scratch.as_ref().len();
        let Some(s) = scratch.as_mut().get_mut(..needed) else {
            return Err(ConfigError::ScratchTooSmall { needed, given });
        };
        math::fill_zero(s);
        let mut stall = StallWatch::new(stall_report);
        stall.progress(Instant::ZERO);
        Ok(Self {
            learning_rate,
            policy,
            interrupt,
            params,
            scratch,
            version,
            k,
            round: Round::new(),
            roster,
            stall,
            stats: ServerStats::default(),
            queue: ServerQueue::new(),
            iteration_start: None,
            known: WorkerSet::EMPTY,
            sent_at: [Instant::ZERO; MAX_WORKERS],
            pending: [None; MAX_WORKERS],
            _t: PhantomData,
        })
    }

    pub(crate) fn dim(&self) -> usize {
        self.params.as_ref().len()
    }

    pub(crate) fn params(&self) -> &[T] {
        self.params.as_ref()
    }

    /// The accumulator and the rest of the scratch buffer.
    pub(crate) fn scratch_mut(&mut self) -> (&mut [T], &mut [T]) {
        let dim = self.dim();
        let s = self.scratch.as_mut();
        if s.len() >= dim { s.split_at_mut(dim) } else { (&mut [], &mut []) }
    }

    fn mark_sent(&mut self, now: Instant, to: WorkerId) {
        if let (Some(at), Some(p)) = (self.sent_at.get_mut(to.index()), self.pending.get_mut(to.index())) {
            *at = now;
            *p = Some(self.version);
        }
    }

    /// Checks the message burst room and membership; the caller dispatches.
    pub(crate) fn precheck(&self, from: WorkerId) -> Result<(), Reject> {
        self.queue.ensure_room(2 * self.roster.n() + 8)?;
        self.roster.check_member(from).map(|_| ())
    }

    pub(crate) fn on_join(&mut self, now: Instant, from: WorkerId, epoch: u32) -> Result<(), Reject> {
        let fresh = self.roster.check_join(from, epoch)?;
        self.roster.commit_join(from, epoch);
        if fresh {
            self.queue.push(ServerItem::Event(ServerEvent::WorkerJoined { worker: from, epoch }));
        }
        self.known.insert(from);
        if self.iteration_start.is_none() {
            self.iteration_start = Some(now);
            self.stall.progress(now);
        }
        self.queue.push(ServerItem::Model { to: Recipient::Worker(from) });
        self.mark_sent(now, from);
        Ok(())
    }

    /// Screens and takes a gradient: adds it to the round or drops it as stale (with an
    /// event, and under option B a reply with the current model). An `Err` changes nothing.
    pub(crate) fn admit(
        &mut self,
        now: Instant,
        from: WorkerId,
        base: Version,
        seq: u64,
        values: &Values<'_, T>,
    ) -> Result<Admitted, Reject> {
        self.roster.check_seq(from, seq)?;
        let (factor, sq_norm) = self.policy.admit_measured(values, self.dim())?;
        if base > self.version {
            return Err(Reject::FutureVersion { claimed: base, current: self.version });
        }
        if base == self.version && self.round.got.contains(from) {
            return Err(Reject::Duplicate { worker: from, seq });
        }
        let dim = self.dim();
        if self.scratch.as_ref().len() < dim {
            return Err(Reject::Capacity);
        }
        // Accepted from here on.
        self.roster.commit_seq(from, seq);
        self.known.insert(from);
        self.stats.accepted += 1;
        let i = from.index();
        let rtt = match (self.pending.get_mut(i), self.sent_at.get(i)) {
            (Some(p), Some(at)) if *p == Some(base) => {
                *p = None;
                Some(now - *at)
            }
            _ => None,
        };
        // CANARY (planted bug, test builds only): a late gradient joins the current round.
        #[cfg(feature = "_canary")]
        let base = if crate::canary::is_on(crate::canary::Canary::LateGradientAdded) { self.version } else { base };
        if base < self.version {
            self.stats.count_drop(DropReason::Stale);
            self.queue.push(ServerItem::Event(ServerEvent::Dropped { worker: from, base, reason: DropReason::Stale }));
            if self.interrupt == Interrupt::RunToCompletion {
                self.queue.push(ServerItem::Model { to: Recipient::Worker(from) });
                self.mark_sent(now, from);
            }
            return Ok(Admitted { contributed: false, rtt, factor: factor.to_f64(), sq_norm, full: false });
        }
        let acc = self.scratch.as_mut().get_mut(..dim).ok_or(Reject::Capacity)?;
        self.round.add(from, values, factor, acc)?;
        self.stall.progress(now);
        let full = self.round.got.len() >= self.k;
        Ok(Admitted { contributed: true, rtt, factor: factor.to_f64(), sq_norm, full })
    }

    /// Applies the update from the full round. Returns the contributors and the time the
    /// iteration took (from its start to `now`). Does not send the new model: see
    /// [`Self::publish`].
    pub(crate) fn close(&mut self, now: Instant) -> (WorkerSet, Duration) {
        let contributors = self.round.got;
        let dim = self.dim();
        let (params, scratch) = (self.params.as_mut(), self.scratch.as_mut());
        let acc = scratch.get_mut(..dim).unwrap_or(&mut []);
        self.version =
            self.round.close(params, acc, self.learning_rate, self.version, &mut self.queue, &mut self.stats);
        let elapsed = self.iteration_start.map_or(Duration::ZERO, |s| now - s);
        (contributors, elapsed)
    }

    /// Under option A, calls `f(worker, elapsed)` for every live worker still computing on the
    /// version that just closed (its round trip is right-censored at `elapsed`) and forgets
    /// it. Under option B those workers will still deliver, so nothing is censored.
    pub(crate) fn censor_stragglers(&mut self, now: Instant, closed: Version, mut f: impl FnMut(WorkerId, Duration)) {
        if self.interrupt != Interrupt::Abort {
            return;
        }
        for w in self.known.iter() {
            let i = w.index();
            if let (Some(p), Some(at)) = (self.pending.get_mut(i), self.sent_at.get(i)) {
                if *p == Some(closed) {
                    *p = None;
                    f(w, now - *at);
                }
            }
        }
    }

    /// Sends the new model: to every worker (option A) or to the contributors (option B).
    pub(crate) fn publish(&mut self, now: Instant, contributors: &WorkerSet) {
        self.iteration_start = Some(now);
        self.stall.progress(now);
        match self.interrupt {
            Interrupt::Abort => {
                self.queue.push(ServerItem::Model { to: Recipient::AllWorkers });
                let known = self.known;
                for w in known.iter() {
                    self.mark_sent(now, w);
                }
            }
            Interrupt::RunToCompletion => {
                for w in contributors.iter() {
                    self.queue.push(ServerItem::Model { to: Recipient::Worker(w) });
                    self.mark_sent(now, w);
                }
            }
        }
    }

    pub(crate) fn lose(&mut self, worker: WorkerId) -> Result<(), Reject> {
        self.roster.check_member(worker)?;
        self.known.remove(worker);
        if let Some(p) = self.pending.get_mut(worker.index()) {
            *p = None;
        }
        if self.roster.lose(worker) {
            self.queue.push(ServerItem::Event(ServerEvent::WorkerLost { worker }));
        }
        Ok(())
    }

    pub(crate) fn timeout(&mut self, now: Instant) {
        if !self.stall.due(now) {
            return;
        }
        let got = &self.round.got;
        let n = self.roster.n();
        let live = self.roster.live();
        let waiting = (0..n as u32).map(WorkerId).find(|w| !got.contains(*w) && live.contains(*w));
        if let Some(waiting_for) = waiting.or_else(|| got.first_missing(n)) {
            let missing = self.k.saturating_sub(got.len()) as u32;
            self.queue.push(ServerItem::Event(ServerEvent::Stalled {
                waiting_for,
                missing,
                since: self.stall.since(),
            }));
        }
    }

    pub(crate) fn poll(&mut self) -> Option<ServerOutput<'_, T>> {
        self.queue.poll(self.version, self.version.0, self.params.as_ref())
    }

    pub(crate) fn poll_timeout(&self) -> Option<Instant> {
        self.stall.deadline()
    }

    pub(crate) fn stop(&mut self) {
        self.stall.idle();
        self.queue.push(ServerItem::Stop);
    }
}

/// The static backup-worker server. `S` is the caller's storage for the model and the
/// accumulator (scratch of the model's length).
#[derive(Debug)]
pub struct BackupServer<T, S> {
    config: BackupConfig,
    engine: Engine<T, S>,
}

impl<T: Scalar, S: Buffer<T>> BackupServer<T, S> {
    /// A server starting from the model in `params` at version 0. `scratch` holds at least
    /// the model's length (its contents are overwritten).
    pub fn new(config: BackupConfig, params: S, scratch: S) -> Result<Self, ConfigError> {
        Self::resume(config, params, scratch, Version::ZERO)
    }

    /// A server resuming from a checkpoint: `params` is the model at `version`.
    pub fn resume(config: BackupConfig, params: S, scratch: S, version: Version) -> Result<Self, ConfigError> {
        if config.backup_workers >= config.workers && config.workers > 0 {
            return Err(ConfigError::Knob("backup_workers"));
        }
        let k = config.aggregate() as usize;
        let engine = Engine::new(
            config.workers,
            config.learning_rate,
            config.gradient_policy,
            config.interrupt,
            config.stall_report,
            k,
            params,
            scratch,
            version,
            |dim| dim,
        )?;
        Ok(Self { config, engine })
    }

    /// The settings.
    pub fn config(&self) -> &BackupConfig {
        &self.config
    }

    /// Workers whose gradient for the current version is in.
    pub fn received(&self) -> &WorkerSet {
        &self.engine.round.got
    }

    fn on_grad(
        &mut self,
        now: Instant,
        from: WorkerId,
        base: Version,
        seq: u64,
        values: &Values<'_, T>,
    ) -> Result<(), Reject> {
        let admitted = self.engine.admit(now, from, base, seq, values)?;
        if admitted.full {
            let (contributors, _) = self.engine.close(now);
            self.engine.publish(now, &contributors);
        }
        Ok(())
    }
}

impl<T: Scalar, S: Buffer<T>> Server<T> for BackupServer<T, S> {
    fn handle(&mut self, now: Instant, from: WorkerId, msg: ToServer<'_, T>) -> Result<(), Reject> {
        let result = self.engine.precheck(from).and_then(|()| match msg {
            ToServer::Join { epoch } => self.engine.on_join(now, from, epoch),
            ToServer::Grad { base, seq, values, .. } => self.on_grad(now, from, base, seq, &values),
            ToServer::Leave => self.engine.lose(from),
            other => Err(Reject::Unexpected { kind: other.kind_name() }),
        });
        if result.is_err() {
            self.engine.stats.rejected += 1;
        }
        result
    }

    fn handle_worker_lost(&mut self, _now: Instant, worker: WorkerId) -> Result<(), Reject> {
        self.engine.lose(worker)
    }

    fn handle_timeout(&mut self, now: Instant) {
        self.engine.timeout(now);
    }

    fn poll_output(&mut self) -> Option<ServerOutput<'_, T>> {
        self.engine.poll()
    }

    fn poll_timeout(&self) -> Option<Instant> {
        self.engine.poll_timeout()
    }

    fn stop(&mut self) {
        self.engine.stop();
    }

    fn version(&self) -> Version {
        self.engine.version
    }

    fn params(&self) -> &[T] {
        self.engine.params()
    }

    fn stats(&self) -> &ServerStats {
        &self.engine.stats
    }
}

/// A deterministic discrete-event harness for the backup-worker tests (shared with DBW's):
/// `n` [`GradientWorker`](super::GradientWorker)s, seeded message latencies and
/// shifted-exponential compute times, integer-valued gradients (so every sum is exact),
/// cancellation of abandoned computations, and a record of everything the server did.
#[cfg(test)]
pub(crate) mod harness {
    use crate::id::{ComputeId, Version, WorkerId};
    use crate::proto::{
        GradientWorker, GradientWorkerConfig, Recipient, Server, ServerEvent, ServerOutput, ToServerOwned,
        ToWorkerOwned, Worker, WorkerEvent, WorkerOutput,
    };
    use crate::time::{Duration, Instant};
    use std::vec;
    use std::vec::Vec;

    /// SplitMix64.
    pub(crate) struct Rng(pub(crate) u64);

    impl Rng {
        pub(crate) fn next(&mut self) -> u64 {
            self.0 = self.0.wrapping_add(0x9E37_79B9_7F4A_7C15);
            let mut z = self.0;
            z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
            z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
            z ^ (z >> 31)
        }
        pub(crate) fn uniform(&mut self) -> f64 {
            (self.next() >> 11) as f64 / (1u64 << 53) as f64
        }
    }

    /// The gradient worker `w` computes at version `v`: small integers, a pure function.
    pub(crate) fn grad_of(w: u32, v: u64, dim: usize) -> Vec<f64> {
        (0..dim)
            .map(|j| {
                let mut r = Rng(u64::from(w) << 40 ^ v << 8 ^ j as u64);
                (r.next() % 17) as f64 - 8.0
            })
            .collect()
    }

    enum Action {
        ToServer(u32, ToServerOwned),
        ToWorker(u32, ToWorkerOwned),
        Done(u32, ComputeId, u64),
    }

    /// What a run produced.
    #[derive(Debug, Default, PartialEq)]
    pub(crate) struct Trace {
        pub(crate) events: Vec<ServerEvent>,
        pub(crate) sends: Vec<(Recipient, ToWorkerOwned)>,
        /// (version, parameter bits) after every update.
        pub(crate) updates: Vec<(u64, Vec<u64>)>,
        /// Gradients the server accepted (`Ok` from `handle`).
        pub(crate) accepted: u64,
    }

    /// Runs until the server reaches `rounds` updates. `slow` workers compute 5× slower.
    pub(crate) fn run<S: Server<f64>>(
        server: &mut S,
        n: u32,
        dim: usize,
        rounds: u64,
        seed: u64,
        slow: &[u32],
    ) -> Trace {
        let mut rng = Rng(seed);
        let mut workers: Vec<GradientWorker<f64, Vec<f64>>> = (0..n)
            .map(|i| GradientWorker::new(GradientWorkerConfig::new(WorkerId(i)), vec![0.0; dim]).unwrap())
            .collect();
        let mut queue: Vec<(Instant, u64, Action)> = Vec::new();
        let mut order = 0u64;
        let mut trace = Trace::default();
        let mut now = Instant::ZERO;
        let latency = |rng: &mut Rng| Duration::from_micros(rng.next() % 200);
        macro_rules! drain_worker {
            ($i:expr) => {{
                let i: u32 = $i;
                let w = &mut workers[i as usize];
                while let Some(out) = w.poll_output() {
                    match out {
                        WorkerOutput::Send(msg) => {
                            order += 1;
                            queue.push((now + latency(&mut rng), order, Action::ToServer(i, ToServerOwned::from(&msg))));
                        }
                        WorkerOutput::Compute { id, version, .. } => {
                            let factor = if slow.contains(&i) { 5.0 } else { 1.0 };
                            let t = factor * (1.0 - libm::log(1.0 - rng.uniform()));
                            order += 1;
                            queue.push((now + Duration::from_secs_f64(t * 1e-3), order, Action::Done(i, id, version.0)));
                        }
                        WorkerOutput::Event(WorkerEvent::Abandoned { id }) => {
                            queue.retain(|(_, _, a)| !matches!(a, Action::Done(j, c, _) if *j == i && *c == id));
                        }
                        WorkerOutput::Event(_) => {}
                    }
                }
            }};
        }
        for i in 0..n {
            drain_worker!(i);
        }
        let mut steps = 0;
        while server.version().0 < rounds {
            steps += 1;
            assert!(steps < 1_000_000, "no progress");
            let Some(pos) = (0..queue.len()).min_by_key(|&p| (queue[p].0, queue[p].1)) else {
                panic!("deadlock at {:?}", server.version());
            };
            let (at, _, action) = queue.swap_remove(pos);
            now = now.max(at);
            match action {
                Action::ToServer(i, msg) => {
                    let mut buf = Vec::new();
                    let before = server.version();
                    let is_grad = matches!(msg, ToServerOwned::Grad { .. });
                    if server.handle(now, WorkerId(i), msg.as_msg(&mut buf)).is_ok() && is_grad {
                        trace.accepted += 1;
                    }
                    if server.version() != before {
                        trace.updates.push((server.version().0, server.params().iter().map(|p| p.to_bits()).collect()));
                    }
                    while let Some(out) = server.poll_output() {
                        match out {
                            ServerOutput::Event(e) => trace.events.push(e),
                            ServerOutput::Send { to, msg } => {
                                let owned = ToWorkerOwned::from(&msg);
                                let targets: Vec<u32> = match to {
                                    Recipient::AllWorkers => (0..n).collect(),
                                    Recipient::Worker(w) => vec![w.0],
                                };
                                for t in targets {
                                    order += 1;
                                    queue.push((now + latency(&mut rng), order, Action::ToWorker(t, owned.clone())));
                                }
                                trace.sends.push((to, owned));
                            }
                        }
                    }
                }
                Action::ToWorker(i, msg) => {
                    let mut buf = Vec::new();
                    let _ = workers[i as usize].handle(now, msg.as_msg(&mut buf));
                    drain_worker!(i);
                }
                Action::Done(i, id, version) => {
                    let g = grad_of(i, version, dim);
                    let _ = workers[i as usize].handle_gradient(now, id, &g);
                    drain_worker!(i);
                }
            }
        }
        trace
    }

    /// Checks K1, K2, one outcome per accepted gradient, and conservation against a
    /// reference replay. `k_of(v)` is the number of gradients version `v`'s iteration waits
    /// for. Returns the number of dropped gradients.
    pub(crate) fn check(trace: &Trace, dim: usize, lr: f64, init: f64, k_of: impl Fn(u64) -> usize) -> u64 {
        let mut applied: Vec<(u32, u64, u64)> = Vec::new();
        let mut dropped = 0u64;
        for e in &trace.events {
            match *e {
                ServerEvent::Applied { worker, base, version, staleness, .. } => {
                    assert_eq!(staleness, 0);
                    assert_eq!(base.next(), version, "K1: only gradients computed at the model being updated");
                    applied.push((worker.0, base.0, version.0));
                }
                ServerEvent::Dropped { worker, base, .. } => {
                    dropped += 1;
                    assert!(
                        !applied.iter().any(|a| a.0 == worker.0 && a.1 == base.0),
                        "K2: a gradient both applied and dropped"
                    );
                }
                _ => {}
            }
        }
        assert_eq!(trace.accepted, applied.len() as u64 + dropped, "one outcome per accepted gradient");
        let mut params = vec![init; dim];
        for (v, bits) in &trace.updates {
            let mut who: Vec<u32> = applied.iter().filter(|a| a.2 == *v).map(|a| a.0).collect();
            let k = who.len();
            assert_eq!(k, k_of(v - 1), "K1: exactly k gradients for version {}", v - 1);
            assert!(
                trace.events.contains(&ServerEvent::ModelUpdated { version: Version(*v), contributions: k as u32 })
            );
            who.sort_unstable();
            who.dedup();
            assert_eq!(who.len(), k, "K1: k distinct workers");
            let mut acc = vec![0.0f64; dim];
            for w in &who {
                for (a, g) in acc.iter_mut().zip(grad_of(*w, v - 1, dim)) {
                    *a += g;
                }
            }
            crate::math::apply_and_clear(&mut params, -lr / k as f64, &mut acc).unwrap();
            let expect: Vec<u64> = params.iter().map(|p| p.to_bits()).collect();
            assert_eq!(&expect, bits, "C2: model after version {v}");
        }
        dropped
    }
}

#[cfg(test)]
mod tests {
    use super::harness::{check, grad_of, run};
    use super::*;
    use crate::msg::ToWorker;
    use crate::proto::bsp::{BspConfig, BspServer};
    use crate::proto::{ToWorkerOwned, WorkerEvent};
    use proptest::prelude::*;
    use std::vec;
    use std::vec::Vec;

    fn server(n: u32, b: u32, interrupt: Interrupt, dim: usize) -> BackupServer<f64, Vec<f64>> {
        let mut c = BackupConfig::new(n, 0.5, b);
        c.interrupt = interrupt;
        BackupServer::new(c, vec![1.0; dim], vec![0.0; dim]).unwrap()
    }

    fn grad(base: u64, seq: u64, values: &[f64]) -> ToServer<'_, f64> {
        ToServer::Grad { base: Version(base), iteration: 0, seq, values: Values::Slice(values) }
    }

    fn drain<S: Server<f64>>(s: &mut S) -> (Vec<ServerEvent>, Vec<(Recipient, ToWorkerOwned)>) {
        let (mut events, mut sends) = (Vec::new(), Vec::new());
        while let Some(out) = s.poll_output() {
            match out {
                ServerOutput::Event(e) => events.push(e),
                ServerOutput::Send { to, msg } => sends.push((to, ToWorkerOwned::from(&msg))),
            }
        }
        (events, sends)
    }

    #[test]
    fn closes_after_k_and_drops_the_rest() {
        for interrupt in [Interrupt::Abort, Interrupt::RunToCompletion] {
            let mut s = server(3, 1, interrupt, 2);
            let t = Instant::from_nanos(10);
            for w in 0..3 {
                s.handle(Instant::ZERO, WorkerId(w), ToServer::Join { epoch: 0 }).unwrap();
            }
            let _ = drain(&mut s);
            s.handle(t, WorkerId(2), grad(0, 0, &[2.0, 4.0])).unwrap();
            assert_eq!(s.version(), Version(0));
            s.handle(t, WorkerId(0), grad(0, 0, &[4.0, 8.0])).unwrap();
            assert_eq!(s.version(), Version(1));
            assert_eq!(s.params(), &[-0.5, -2.0]);
            let (events, sends) = drain(&mut s);
            assert!(events.contains(&ServerEvent::ModelUpdated { version: Version(1), contributions: 2 }));
            let model = ToWorkerOwned::Model { version: 1, clock: 1, values: vec![-0.5, -2.0] };
            match interrupt {
                Interrupt::Abort => assert_eq!(sends, [(Recipient::AllWorkers, model.clone())]),
                Interrupt::RunToCompletion => assert_eq!(
                    sends,
                    [(Recipient::Worker(WorkerId(0)), model.clone()), (Recipient::Worker(WorkerId(2)), model.clone())]
                ),
            }
            // The backup worker's late gradient is dropped, reported, never counted later.
            s.handle(t, WorkerId(1), grad(0, 0, &[100.0, 100.0])).unwrap();
            let (events, sends) = drain(&mut s);
            assert_eq!(
                events,
                [ServerEvent::Dropped { worker: WorkerId(1), base: Version(0), reason: DropReason::Stale }]
            );
            match interrupt {
                Interrupt::Abort => assert!(sends.is_empty()),
                Interrupt::RunToCompletion => assert_eq!(sends, [(Recipient::Worker(WorkerId(1)), model)]),
            }
            assert_eq!(s.received().len(), 0);
            assert_eq!(s.stats().dropped_for(DropReason::Stale), 1);
            assert_eq!((s.stats().accepted, s.stats().applied), (3, 2));
        }
    }

    #[test]
    fn refusals_change_nothing() {
        let mut s = server(3, 1, Interrupt::Abort, 2);
        let now = Instant::ZERO;
        s.handle(now, WorkerId(0), ToServer::Join { epoch: 1 }).unwrap();
        let seq = crate::id::first_seq(1) + 3;
        s.handle(now, WorkerId(0), grad(0, seq, &[1.0, 1.0])).unwrap();
        let _ = drain(&mut s);
        let before = (s.params().to_vec(), s.version(), *s.received(), *s.stats());
        assert_eq!(
            s.handle(now, WorkerId(0), grad(0, seq, &[1.0, 1.0])),
            Err(Reject::Duplicate { worker: WorkerId(0), seq })
        );
        // A message of the earlier session (seq below first_seq(1)) is a replay.
        assert_eq!(
            s.handle(now, WorkerId(0), grad(0, 4, &[1.0, 1.0])),
            Err(Reject::Duplicate { worker: WorkerId(0), seq: 4 })
        );
        assert_eq!(
            s.handle(now, WorkerId(0), grad(0, seq + 1, &[1.0, 1.0])),
            Err(Reject::Duplicate { worker: WorkerId(0), seq: seq + 1 })
        );
        assert_eq!(s.handle(now, WorkerId(3), grad(0, 0, &[1.0, 1.0])), Err(Reject::UnknownWorker(WorkerId(3))));
        assert!(matches!(s.handle(now, WorkerId(1), grad(0, 0, &[1.0])), Err(Reject::WrongLength(_))));
        assert_eq!(s.handle(now, WorkerId(1), grad(0, 0, &[f64::NAN, 1.0])), Err(Reject::NotFinite));
        assert_eq!(
            s.handle(now, WorkerId(1), grad(5, 0, &[1.0, 1.0])),
            Err(Reject::FutureVersion { claimed: Version(5), current: Version(0) })
        );
        assert_eq!(
            s.handle(now, WorkerId(1), ToServer::Pull { have: Version(0), min_clock: 0 }),
            Err(Reject::Unexpected { kind: "Pull" })
        );
        assert_eq!(
            s.handle(now, WorkerId(0), ToServer::Join { epoch: 0 }),
            Err(Reject::StaleEpoch { worker: WorkerId(0), epoch: 0 })
        );
        assert_eq!(s.handle_worker_lost(now, WorkerId(9)), Err(Reject::UnknownWorker(WorkerId(9))));
        let after = (s.params().to_vec(), s.version(), *s.received());
        assert_eq!(after, (before.0, before.1, before.2));
        assert!(s.poll_output().is_none());
        assert_eq!(s.stats().rejected, before.3.rejected + 9);
        assert_eq!(s.stats().accepted, before.3.accepted);
    }

    #[test]
    fn config_errors() {
        let bad = |c: BackupConfig, p: usize, a: usize| {
            BackupServer::<f32, Vec<f32>>::new(c, vec![0.0; p], vec![0.0; a]).err()
        };
        assert_eq!(bad(BackupConfig::new(3, 0.1, 3), 1, 1), Some(ConfigError::Knob("backup_workers")));
        assert_eq!(bad(BackupConfig::new(0, 0.1, 0), 1, 1), Some(ConfigError::WorkerCount(0)));
        assert_eq!(bad(BackupConfig::new(2, 0.0, 1), 1, 1), Some(ConfigError::LearningRate));
        assert_eq!(bad(BackupConfig::new(2, 0.1, 1), 0, 1), Some(ConfigError::EmptyModel));
        assert_eq!(bad(BackupConfig::new(2, 0.1, 1), 4, 3), Some(ConfigError::ScratchTooSmall { needed: 4, given: 3 }));
        assert_eq!(BackupConfig::new(16, 0.1, 5).aggregate(), 11);
        assert_eq!(Interrupt::default(), Interrupt::Abort);
        assert_eq!(Interrupt::RunToCompletion.name(), "run-to-completion");
    }

    /// K4: with `b = 1`, losing one worker costs nothing; losing two stalls, and the stall
    /// is reported naming a live missing worker.
    #[test]
    fn progress_with_k_live_and_a_reported_stall_below() {
        let mut c = BackupConfig::new(3, 0.5, 1);
        c.stall_report = Some(Duration::from_secs(1));
        let mut s: BackupServer<f64, Vec<f64>> = BackupServer::new(c, vec![0.0], vec![0.0]).unwrap();
        let t0 = Instant::ZERO;
        s.handle_worker_lost(t0, WorkerId(2)).unwrap();
        s.handle(t0, WorkerId(0), grad(0, 0, &[1.0])).unwrap();
        s.handle(t0, WorkerId(1), grad(0, 0, &[1.0])).unwrap();
        assert_eq!(s.version(), Version(1));
        s.handle(t0, WorkerId(1), ToServer::Leave).unwrap();
        s.handle(t0, WorkerId(0), grad(1, 1, &[1.0])).unwrap();
        let (events, _) = drain(&mut s);
        assert!(events.contains(&ServerEvent::WorkerLost { worker: WorkerId(1) }));
        let at = s.poll_timeout().unwrap();
        s.handle_timeout(at);
        let (events, _) = drain(&mut s);
        assert_eq!(events.len(), 1);
        assert!(matches!(events[0], ServerEvent::Stalled { missing: 1, .. }));
        assert!(s.poll_timeout().unwrap() > at);
        s.stop();
        assert!(matches!(s.poll_output(), Some(ServerOutput::Send { to: Recipient::AllWorkers, msg: ToWorker::Stop })));
        assert_eq!(s.poll_timeout(), None);
    }

    /// Option A: a straggler's computation is abandoned when the new model arrives.
    #[test]
    fn option_a_makes_stragglers_abandon() {
        use crate::proto::{GradientWorker, GradientWorkerConfig, Worker, WorkerOutput};
        let mut s = server(2, 1, Interrupt::Abort, 1);
        let mut w = GradientWorker::new(GradientWorkerConfig::new(WorkerId(1)), vec![0.0f64]).unwrap();
        let _ = w.poll_output();
        s.handle(Instant::ZERO, WorkerId(1), ToServer::Join { epoch: 0 }).unwrap();
        let (_, sends) = drain(&mut s);
        let mut buf = Vec::new();
        w.handle(Instant::ZERO, sends[0].1.as_msg(&mut buf)).unwrap();
        assert!(matches!(w.poll_output(), Some(WorkerOutput::Compute { .. })));
        s.handle(Instant::ZERO, WorkerId(0), grad(0, 0, &[1.0])).unwrap();
        let (_, sends) = drain(&mut s);
        assert_eq!(sends[0].0, Recipient::AllWorkers);
        w.handle(Instant::ZERO, sends[0].1.as_msg(&mut buf)).unwrap();
        assert!(matches!(w.poll_output(), Some(WorkerOutput::Event(WorkerEvent::Abandoned { .. }))));
        assert!(matches!(w.poll_output(), Some(WorkerOutput::Compute { version: Version(1), .. })));
    }

    #[test]
    fn harness_gradients_are_small_integers() {
        let g = grad_of(3, 7, 5);
        assert!(g.iter().all(|x| x.fract() == 0.0 && x.abs() <= 8.0));
        assert_eq!(g, grad_of(3, 7, 5));
    }

    proptest! {
        #![proptest_config(ProptestConfig::with_cases(48))]

        /// K1, K2, one outcome per gradient and conservation, for random n, b, interrupt
        /// option, delivery order and stragglers.
        #[test]
        fn k_invariants_hold(n in 1u32..7, b in 0u32..6, abort in any::<bool>(), seed in any::<u64>(), dim in 1usize..4, slow in 0u32..7) {
            let b = b % n;
            let interrupt = if abort { Interrupt::Abort } else { Interrupt::RunToCompletion };
            let mut s = server(n, b, interrupt, dim);
            let trace = run(&mut s, n, dim, 6, seed, &[slow]);
            let dropped = check(&trace, dim, 0.5, 1.0, |_| (n - b) as usize);
            prop_assert_eq!(dropped, s.stats().dropped_total());
            prop_assert_eq!(trace.updates.len(), 6);
        }

        /// `b = 0` under option A is BSP, event for event and bit for bit; under option B
        /// the model trace is BSP's (only the addressing of the model messages differs).
        #[test]
        fn zero_backups_is_bsp(n in 1u32..7, seed in any::<u64>(), dim in 1usize..4) {
            let mut bsp: BspServer<f64, Vec<f64>> = BspServer::new(BspConfig::new(n, 0.5), vec![1.0; dim], vec![0.0; dim]).unwrap();
            let reference = run(&mut bsp, n, dim, 5, seed, &[0]);
            let mut a = server(n, 0, Interrupt::Abort, dim);
            prop_assert_eq!(&run(&mut a, n, dim, 5, seed, &[0]), &reference);
            let mut b = server(n, 0, Interrupt::RunToCompletion, dim);
            prop_assert_eq!(&run(&mut b, n, dim, 5, seed, &[0]).updates, &reference.updates);
        }

        /// No input sequence panics; an update happens only when k distinct gradients of
        /// the current version are in.
        #[test]
        fn arbitrary_inputs_never_panic(ops in proptest::collection::vec((0u32..6, 0u64..4, 0u64..6, 0usize..4, -2.0f64..2.0, 0u8..9), 0..200)) {
            let mut s = server(4, 1, Interrupt::RunToCompletion, 3);
            for (w, base, seq, len, x, kind) in ops {
                let values = match kind { 0 => vec![f64::NAN; len], 1 => vec![f64::INFINITY; len], _ => vec![x; len] };
                let before = s.version();
                let distinct_before = s.received().len();
                let msg = match kind {
                    6 => ToServer::Join { epoch: seq as u32 },
                    7 => ToServer::Leave,
                    8 => ToServer::Pull { have: Version(base), min_clock: 0 },
                    _ => grad(base, seq, &values),
                };
                let _ = s.handle(Instant::from_nanos(seq), WorkerId(w), msg);
                if s.version() != before {
                    prop_assert_eq!(s.version(), before.next());
                    prop_assert_eq!(distinct_before, 2);
                }
                prop_assert!(s.params().iter().all(|p| p.is_finite()));
                while s.poll_output().is_some() {}
            }
        }
    }
}
