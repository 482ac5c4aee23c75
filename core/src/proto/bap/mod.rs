//! BAP, bounded asynchronous parallel: the model changes once per iteration, when all
//! gradients of that iteration are in (or its time limit expires), while workers run ahead
//! on their cached model up to a bounded number of versions.
//!
//! Paper: "More Effective Synchronization Scheme in ML Using Stale Parameters", IEEE HPCC
//! 2016, pp. 757–764 (Beihang University). The paper itself was not reachable; the rules
//! follow the MALib documentation's description and figure of BAP (PROTOCOLS.md §5.2), and
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
//! # Decisions of this project (\[RECON\] in PROTOCOLS.md §5.2 and §9.3)
//!
//! - **The bound's off-by-one** ([`BapConfig::bound`]): [`BapBound::AtMost`] (default) reads
//!   the staleness knob `s` as "lag `≤ s`"; [`BapBound::Below`] reads it as MALib's "`< S`"
//!   (so `S` there is `s_bap + 1`, and `S = 0` is refused).
//! - **The timeout's reference point** ([`BapConfig::timeout_from`]): the default
//!   [`TimeoutFrom::LaterOfBoth`] starts the clock of iteration `j` at its first gradient,
//!   or at the publication of `w_{j−1}` if that is later (PROTOCOLS.md); the other two
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

use super::{
    Buffer, DropReason, GradientPolicy, Recipient, Server, ServerEvent, ServerOutput, ServerStats, Worker, WorkerEvent,
    WorkerOutput, WorkerSetup,
};
use crate::error::{ConfigError, Reject};
use crate::id::{ComputeId, MAX_WORKERS, Version, WorkerId, WorkerSet};
use crate::math::{self, Scalar};
use crate::msg::{ToServer, ToWorker, Values};
use crate::proto::common::queue::{ServerItem, ServerQueue, WorkerItem, WorkerQueue};
use crate::proto::common::roster::Roster;
use crate::proto::common::round::check_learning_rate;
use crate::proto::common::stall::StallWatch;
use crate::time::{Duration, Instant};
use core::marker::PhantomData;

#[cfg(test)]
mod tests;

/// The largest effective staleness bound `s_bap` (the server keeps `s_bap + 1`
/// accumulators of the model's size).
pub const MAX_BAP_STALENESS: u64 = 15;

const MAX_OPEN: usize = MAX_BAP_STALENESS as usize + 1;

/// How [`BapConfig::staleness`] is read (PROTOCOLS.md §9.3).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum BapBound {
    /// The lag may be at most `staleness`: `s_bap = staleness`.
    #[default]
    AtMost,
    /// The lag must be below `staleness` (MALib's wording): `s_bap = staleness − 1`.
    Below,
}

/// When an iteration's time limit starts counting (PROTOCOLS.md §9.3).
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

/// The aggregation state of one open iteration.
#[derive(Clone, Copy, Debug)]
struct Slot {
    got: WorkerSet,
    /// Per contributor: `(j − 1) − base`.
    lag: [u8; MAX_WORKERS],
    /// Per contributor: the clipping factor.
    factor: [f32; MAX_WORKERS],
    /// Arrival of the first gradient.
    first: Option<Instant>,
}

impl Slot {
    const EMPTY: Self = Self { got: WorkerSet::EMPTY, lag: [0; MAX_WORKERS], factor: [1.0; MAX_WORKERS], first: None };
}

/// The BAP server. `S` is the caller's storage for the model and the accumulators.
#[derive(Debug)]
pub struct BapServer<T, S> {
    config: BapConfig,
    s: u64,
    params: S,
    accs: S,
    version: Version,
    /// When `version` was published.
    published: Instant,
    slots: [Slot; MAX_OPEN],
    /// Per worker: the min version of its parked pull.
    pending: [Option<u64>; MAX_WORKERS],
    /// Per worker: the last iteration closed without it, and why.
    missed: [(u64, DropReason); MAX_WORKERS],
    /// A complete iteration waits for queue room (closed at the next `handle_timeout`).
    backlog: bool,
    last_now: Instant,
    roster: Roster,
    stall: StallWatch,
    stats: ServerStats,
    queue: ServerQueue,
    _t: PhantomData<T>,
}

impl<T: Scalar, S: Buffer<T>> BapServer<T, S> {
    /// A server starting from the model in `params` at version 0. `accs` is scratch space
    /// of at least `(s_bap + 1) · dim` elements ([`BapConfig::open_iterations`]).
    pub fn new(config: BapConfig, params: S, accs: S) -> Result<Self, ConfigError> {
        Self::resume(config, params, accs, Version::ZERO)
    }

    /// A server resuming from a checkpoint: `params` is the model at `version`.
    pub fn resume(config: BapConfig, params: S, mut accs: S, version: Version) -> Result<Self, ConfigError> {
        let s = config.check()?;
        let roster = Roster::new(config.workers)?;
        let dim = params.as_ref().len();
        if dim == 0 {
            return Err(ConfigError::EmptyModel);
        }
        let needed = dim.saturating_mul(s as usize + 1);
        let given = accs.as_ref().len();
        let Some(acc_slice) = accs.as_mut().get_mut(..needed) else {
            return Err(ConfigError::ScratchTooSmall { needed, given });
        };
        math::fill_zero(acc_slice);
        let mut stall = StallWatch::new(config.stall_report);
        stall.progress(Instant::ZERO);
        Ok(Self {
            config,
            s,
            params,
            accs,
            version,
            published: Instant::ZERO,
            slots: [Slot::EMPTY; MAX_OPEN],
            pending: [None; MAX_WORKERS],
            missed: [(0, DropReason::Stale); MAX_WORKERS],
            backlog: false,
            last_now: Instant::ZERO,
            roster,
            stall,
            stats: ServerStats::default(),
            queue: ServerQueue::new(),
            _t: PhantomData,
        })
    }

    /// The settings.
    pub fn config(&self) -> &BapConfig {
        &self.config
    }

    /// The effective bound `s_bap`.
    pub fn s_bap(&self) -> u64 {
        self.s
    }

    /// Workers whose gradient for iteration `j` is in, if `j` is open.
    pub fn received(&self, j: u64) -> Option<&WorkerSet> {
        self.slot_index(j).and_then(|k| self.slots.get(k)).map(|s| &s.got)
    }

    /// Admitted gradients waiting in open iterations (not yet applied or dropped): together
    /// with [`ServerStats::applied`] and the drops they account for every admitted gradient.
    pub fn open_gradients(&self) -> u64 {
        self.slots.iter().take(self.open() as usize).map(|s| s.got.len() as u64).sum()
    }

    fn n(&self) -> usize {
        self.roster.n()
    }

    fn dim(&self) -> usize {
        self.params.as_ref().len()
    }

    fn open(&self) -> u64 {
        self.s + 1
    }

    /// The slot of open iteration `j` (`v + 1 ..= v + 1 + s_bap`).
    fn slot_index(&self, j: u64) -> Option<usize> {
        let head = self.version.0.saturating_add(1);
        (j >= head && j - head < self.open()).then(|| (j % self.open()) as usize)
    }

    fn acc(&mut self, k: usize) -> Option<&mut [T]> {
        let dim = self.dim();
        let start = k.checked_mul(dim)?;
        self.accs.as_mut().get_mut(start..start.checked_add(dim)?)
    }

    /// When the head iteration times out, if a limit is set and it has a gradient. An empty
    /// head behind a later open iteration that has one (the head's gradients were lost)
    /// counts from that later iteration's first gradient.
    fn head_deadline(&self) -> Option<Instant> {
        let t_max = self.config.iteration_timeout?;
        let head = self.slots.get(self.slot_index(self.version.0.saturating_add(1))?)?;
        let first = match head.first {
            Some(first) => first,
            None => self.slots.iter().take(self.open() as usize).filter_map(|s| s.first).min()?,
        };
        let from = match self.config.timeout_from {
            TimeoutFrom::LaterOfBoth => first.max(self.published),
            TimeoutFrom::FirstGradient => first,
            TimeoutFrom::Publication => self.published,
        };
        Some(from + t_max)
    }

    /// The outputs of one close: an event per worker, an abort per worker, a model per
    /// parked pull, one `ModelUpdated`.
    fn close_burst(&self) -> usize {
        3 * self.n() + 1
    }

    /// Closes head iterations while they are complete or timed out.
    fn try_close(&mut self, now: Instant) {
        self.backlog = false;
        loop {
            let head = self.version.0.saturating_add(1);
            let Some(k) = self.slot_index(head) else { return };
            let Some(slot) = self.slots.get(k) else { return };
            let live = self.roster.live();
            // An empty head is never complete; it closes only by timeout, when a later
            // iteration has a gradient (its own were lost).
            let complete = !slot.got.is_empty()
                && (0..self.n()).map(|i| WorkerId(i as u32)).all(|w| !live.contains(w) || slot.got.contains(w));
            let timed_out = self.head_deadline().is_some_and(|d| now >= d);
            if !complete && !timed_out {
                return;
            }
            if self.queue.ensure_room(self.close_burst()).is_err() {
                self.backlog = true;
                return;
            }
            self.close(now, head, k, !complete);
        }
    }

    fn close(&mut self, now: Instant, j: u64, k: usize, by_timeout: bool) {
        // Borrowed, not copied: a slot is ~1.3 KB and this runs once per iteration.
        static EMPTY: Slot = Slot::EMPTY;
        let slot = self.slots.get(k).unwrap_or(&EMPTY);
        let count = slot.got.len().max(1);
        let a = T::from_f64(-self.config.learning_rate / count as f64);
        let dim = self.dim();
        let start = k.saturating_mul(dim);
        if let Some(acc) = self.accs.as_mut().get_mut(start..start.saturating_add(dim)) {
            // Lengths were fixed at construction; a mismatch is impossible here.
            let _ = math::apply_and_clear(self.params.as_mut(), a, acc);
        }
        let version = Version(j);
        for worker in slot.got.iter() {
            let i = worker.index();
            let lag = u64::from(slot.lag.get(i).copied().unwrap_or(0));
            let factor = f64::from(slot.factor.get(i).copied().unwrap_or(1.0));
            self.queue.push(ServerItem::Event(ServerEvent::Applied {
                worker,
                base: Version(j.saturating_sub(1).saturating_sub(lag)),
                version,
                staleness: lag,
                weight: factor / count as f64,
            }));
        }
        self.stats.applied += slot.got.len() as u64;
        self.stats.updates += 1;
        self.queue.push(ServerItem::Event(ServerEvent::ModelUpdated { version, contributions: slot.got.len() as u32 }));
        let reason = if by_timeout { DropReason::Aborted } else { DropReason::WorkerLost };
        for i in 0..self.n() {
            let worker = WorkerId(i as u32);
            if slot.got.contains(worker) {
                continue;
            }
            if let Some(m) = self.missed.get_mut(i) {
                *m = (j, reason);
            }
            if by_timeout {
                self.queue.push(ServerItem::Abort { to: worker, iteration: j });
            }
        }
        // `lag` and `factor` are written for every worker `got` gains and read only for
        // those, so emptying `got` (and `first`) empties the slot.
        if let Some(s) = self.slots.get_mut(k) {
            s.got.clear();
            s.first = None;
        }
        self.version = version;
        self.published = now;
        self.stall.progress(now);
        for i in 0..self.n() {
            let Some(slot) = self.pending.get_mut(i) else { continue };
            if slot.is_some_and(|min| j >= min) {
                *slot = None;
                self.queue.push(ServerItem::Model { to: Recipient::Worker(WorkerId(i as u32)) });
            }
        }
    }

    fn drop_gradient(&mut self, worker: WorkerId, base: Version, reason: DropReason) {
        self.stats.count_drop(reason);
        self.queue.push(ServerItem::Event(ServerEvent::Dropped { worker, base, reason }));
    }

    fn on_grad(
        &mut self,
        now: Instant,
        from: WorkerId,
        base: Version,
        j: u64,
        seq: u64,
        values: Values<'_, T>,
    ) -> Result<(), Reject> {
        self.roster.check_seq(from, seq)?;
        let factor = self.config.gradient_policy.admit(&values, self.dim())?;
        if base > self.version {
            return Err(Reject::FutureVersion { claimed: base, current: self.version });
        }
        if base.0 >= j {
            // Iteration `j` is computed on `w_{j−1}` or older.
            return Err(Reject::Unexpected { kind: "Grad" });
        }
        let i = from.index();
        let slot_k = self.slot_index(j);
        if let Some(slot) = slot_k.and_then(|k| self.slots.get(k)) {
            if slot.got.contains(from) {
                return Err(Reject::Duplicate { worker: from, seq });
            }
        }
        let lag = j - 1 - base.0;
        #[allow(unused_mut)]
        let mut bound = self.s;
        // CANARY (planted bug, test builds only): the staleness bound is off by one.
        #[cfg(feature = "_canary")]
        if crate::canary::is_on(crate::canary::Canary::StalenessBoundPlusOne) {
            bound = bound.saturating_add(1);
        }
        let outcome = if j <= self.version.0 {
            Err(match self.missed.get(i) {
                Some(&(it, reason)) if it >= j => reason,
                _ => DropReason::Stale,
            })
        } else {
            match slot_k {
                Some(k) if lag <= bound => Ok(k),
                _ => Err(DropReason::OverStalenessBound),
            }
        };
        if let Ok(k) = outcome {
            let acc = self.acc(k).ok_or(Reject::Capacity)?;
            if factor == T::one() {
                values.add_into(acc)?;
            } else {
                values.scaled_add_into(acc, factor)?;
            }
        }
        self.roster.commit_seq(from, seq);
        self.stats.accepted += 1;
        match outcome {
            Err(reason) => self.drop_gradient(from, base, reason),
            Ok(k) => {
                if let Some(slot) = self.slots.get_mut(k) {
                    slot.got.insert(from);
                    if let (Some(l), Some(f)) = (slot.lag.get_mut(i), slot.factor.get_mut(i)) {
                        *l = lag as u8;
                        *f = factor.to_f64() as f32;
                    }
                    slot.first.get_or_insert(now);
                }
                self.try_close(now);
            }
        }
        Ok(())
    }

    fn on_pull(&mut self, from: WorkerId, have: Version, min_clock: u64) -> Result<(), Reject> {
        if have > self.version {
            return Err(Reject::FutureVersion { claimed: have, current: self.version });
        }
        let reachable = self.version.0.saturating_add(1).saturating_add(self.s);
        if min_clock > reachable {
            return Err(Reject::FutureVersion { claimed: Version(min_clock), current: self.version });
        }
        let slot = self.pending.get_mut(from.index()).ok_or(Reject::UnknownWorker(from))?;
        if self.version.0 >= min_clock {
            *slot = None;
            if self.version > have {
                self.queue.push(ServerItem::Model { to: Recipient::Worker(from) });
            } else {
                self.queue.push(ServerItem::NotNewer { to: from, version: self.version });
            }
        } else {
            let again = slot.replace(min_clock).is_some();
            // A parked puller is past the head iteration (its next iteration is above
            // `min_clock > v`). If it pulls again (its retry after `rejoin_after`, which
            // re-sends its last gradient first) and its gradient of the head is still
            // missing, that gradient was lost: re-send the model the worker has, which tells
            // it to compute the head again (a late original or a second copy is then refused
            // as a duplicate, or dropped once the iteration closed).
            let head = self.version.0.saturating_add(1);
            let missing = self.slot_index(head).and_then(|k| self.slots.get(k)).is_some_and(|s| !s.got.contains(from));
            if again && missing {
                self.queue.push(ServerItem::Model { to: Recipient::Worker(from) });
            }
        }
        Ok(())
    }

    fn on_join(&mut self, from: WorkerId, epoch: u32) -> Result<(), Reject> {
        let fresh = self.roster.check_join(from, epoch)?;
        self.roster.commit_join(from, epoch);
        if fresh {
            self.queue.push(ServerItem::Event(ServerEvent::WorkerJoined { worker: from, epoch }));
        }
        if let Some(p) = self.pending.get_mut(from.index()) {
            *p = None;
        }
        self.queue.push(ServerItem::Model { to: Recipient::Worker(from) });
        Ok(())
    }
}

impl<T: Scalar, S: Buffer<T>> Server<T> for BapServer<T, S> {
    fn handle(&mut self, now: Instant, from: WorkerId, msg: ToServer<'_, T>) -> Result<(), Reject> {
        self.last_now = self.last_now.max(now);
        let result = self.queue.ensure_room(self.close_burst() + 4).and_then(|()| {
            self.roster.check_member(from)?;
            match msg {
                ToServer::Join { epoch } => self.on_join(from, epoch),
                ToServer::Grad { base, iteration, seq, values } => {
                    self.on_grad(now, from, base, iteration, seq, values)
                }
                ToServer::Pull { have, min_clock } => self.on_pull(from, have, min_clock),
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
        self.queue.ensure_room(1)?;
        if self.roster.lose(worker) {
            self.queue.push(ServerItem::Event(ServerEvent::WorkerLost { worker }));
        }
        if let Some(p) = self.pending.get_mut(worker.index()) {
            *p = None;
        }
        self.try_close(now);
        Ok(())
    }

    fn handle_timeout(&mut self, now: Instant) {
        self.last_now = self.last_now.max(now);
        self.try_close(now);
        if self.stall.due(now) {
            let head = self.version.0.saturating_add(1);
            let got = self.slot_index(head).and_then(|k| self.slots.get(k)).map_or(WorkerSet::EMPTY, |s| s.got);
            let live = self.roster.live();
            let missing = (0..self.n()).map(|i| WorkerId(i as u32)).filter(|w| live.contains(*w) && !got.contains(*w));
            let count = missing.clone().count() as u32;
            if let Some(waiting_for) = missing.min() {
                if self.queue.ensure_room(1).is_ok() {
                    self.queue.push(ServerItem::Event(ServerEvent::Stalled {
                        waiting_for,
                        missing: count,
                        since: self.stall.since(),
                    }));
                }
            }
        }
    }

    fn poll_output(&mut self) -> Option<ServerOutput<'_, T>> {
        self.queue.poll(self.version, self.version.0, self.params.as_ref())
    }

    fn poll_timeout(&self) -> Option<Instant> {
        let backlog = self.backlog.then_some(self.last_now);
        [self.stall.deadline(), self.head_deadline(), backlog].into_iter().flatten().min()
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
    /// The host computes job `id`, iteration `iteration`, on version `base`.
    Computing {
        id: ComputeId,
        iteration: u64,
        base: Version,
    },
    /// A pull for `min` is out; the next iteration starts when its answer allows.
    Pulling {
        since: Instant,
        min: u64,
    },
    Stopped,
}

/// The BAP worker: computes iteration after iteration on its cached model, pulls after
/// each gradient, blocks when the cache lags more than `s_bap` versions. `S` is the
/// caller's storage: the cache and one scratch buffer of the same length for the outgoing
/// gradient.
#[derive(Debug)]
pub struct BapWorker<T, S> {
    setup: WorkerSetup,
    s: u64,
    cache: S,
    out: S,
    phase: Phase,
    has_model: bool,
    cache_version: Version,
    /// The iteration being computed, or the next one.
    next: u64,
    seq: u64,
    next_job: u64,
    /// The last `Grad` sent (base, iteration, seq); its payload stays in `out` while pulling.
    last_grad: Option<(Version, u64, u64)>,
    queue: WorkerQueue,
    _t: PhantomData<T>,
}

impl<T: Scalar, S: Buffer<T>> BapWorker<T, S> {
    /// A worker for `config`: `cache` has the model's length, `scratch` at least as many
    /// elements. Its first output is `Join`.
    pub fn new(config: BapConfig, setup: WorkerSetup, cache: S, scratch: S) -> Result<Self, ConfigError> {
        let s = config.check()?;
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
            s,
            cache,
            out: scratch,
            phase: Phase::Joining { since: Instant::ZERO },
            has_model: false,
            cache_version: Version::ZERO,
            next: 1,
            seq: crate::id::first_seq(setup.epoch),
            next_job: 0,
            last_grad: None,
            queue,
            _t: PhantomData,
        })
    }

    /// The iteration being computed, or the next one to compute.
    pub fn iteration(&self) -> u64 {
        self.next
    }

    /// The version of the cached model.
    pub fn model_version(&self) -> Version {
        self.cache_version
    }

    fn dim(&self) -> usize {
        self.cache.as_ref().len()
    }

    /// The lowest version the next iteration may be computed on.
    fn needed(&self) -> u64 {
        self.next.saturating_sub(1).saturating_sub(self.s)
    }

    fn pull(&mut self, now: Instant, min: u64) {
        self.queue.push(WorkerItem::Pull { have: self.cache_version, min_clock: min });
        if min > self.cache_version.0 {
            self.queue.push(WorkerItem::Event(WorkerEvent::Blocked { have: self.cache_version }));
        }
        self.phase = Phase::Pulling { since: now, min };
    }

    /// Starts the next iteration if the bound allows, else pulls for the needed version.
    fn proceed(&mut self, now: Instant) {
        self.next = self.next.max(self.cache_version.0.saturating_add(1));
        let needed = self.needed();
        if self.cache_version.0 >= needed {
            let id = ComputeId(self.next_job);
            self.next_job += 1;
            self.phase = Phase::Computing { id, iteration: self.next, base: self.cache_version };
            self.queue.push(WorkerItem::Compute { id, version: self.cache_version });
        } else {
            self.pull(now, needed);
        }
    }

    fn on_model(&mut self, now: Instant, version: Version, values: Values<'_, T>) -> Result<(), Reject> {
        values.check_len(self.dim())?;
        if self.phase == Phase::Stopped {
            return Err(Reject::Stopped);
        }
        if let Phase::Pulling { min, .. } = self.phase {
            if self.has_model && version == self.cache_version && version.0 < min {
                // The server re-sent the model we hold without satisfying the pull: it lacks
                // our gradient of iteration `version + 1` (lost). Compute it again.
                self.next = version.0.saturating_add(1);
                self.proceed(now);
                return Ok(());
            }
        }
        if self.has_model && version <= self.cache_version {
            return Err(if version == self.cache_version {
                Reject::Duplicate { worker: self.setup.id, seq: version.0 }
            } else {
                Reject::OutdatedModel { received: version, have: self.cache_version }
            });
        }
        values.copy_into(self.cache.as_mut())?;
        self.cache_version = version;
        self.has_model = true;
        // While computing, the fresher model only serves the next iteration.
        if !matches!(self.phase, Phase::Computing { .. }) {
            self.proceed(now);
        }
        Ok(())
    }
}

impl<T: Scalar, S: Buffer<T>> Worker<T> for BapWorker<T, S> {
    fn handle(&mut self, now: Instant, msg: ToWorker<'_, T>) -> Result<(), Reject> {
        self.queue.ensure_room(3)?;
        match msg {
            ToWorker::Model { version, values, .. } => self.on_model(now, version, values),
            ToWorker::NotNewer { version } => {
                match self.phase {
                    Phase::Stopped => return Err(Reject::Stopped),
                    Phase::Pulling { .. } if version <= self.cache_version && self.has_model => self.proceed(now),
                    // A reply to an older pull, or an inconsistent one: nothing to do.
                    _ => {}
                }
                Ok(())
            }
            ToWorker::Abort { iteration } => {
                if let Phase::Computing { id, iteration: current, .. } = self.phase {
                    if current == iteration {
                        self.queue.push(WorkerItem::Event(WorkerEvent::Abandoned { id }));
                        self.next = iteration.saturating_add(1);
                        // Iteration `iteration` is closed: the server has at least that version.
                        self.pull(now, iteration.max(self.needed()));
                    }
                }
                Ok(())
            }
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
        let Phase::Computing { id: current, iteration, base } = self.phase else {
            return Err(Reject::NoSuchComputation);
        };
        if id != current {
            return Err(Reject::NoSuchComputation);
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
        out.copy_from_slice(grad);
        // `base` is the cache the job started on (a model that arrived meanwhile is newer).
        self.queue.push(WorkerItem::Grad { base, iteration, seq: self.seq });
        self.last_grad = Some((base, iteration, self.seq));
        self.seq += 1;
        self.next = iteration.saturating_add(1);
        // Always ask for a fresher model; the answer (or `NotNewer`) starts the next iteration.
        let needed = self.needed();
        self.pull(now, needed);
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
            Phase::Pulling { since, min } if now >= since + after => {
                if let Some((base, iteration, seq)) = self.last_grad {
                    self.queue.push(WorkerItem::Grad { base, iteration, seq });
                }
                self.queue.push(WorkerItem::Pull { have: self.cache_version, min_clock: min });
                self.phase = Phase::Pulling { since: now, min };
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
            Phase::Joining { since } | Phase::Pulling { since, .. } => Some(since + after),
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
