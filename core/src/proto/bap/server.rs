//! BAP's server: per-iteration aggregation slots for the `s_bap + 1` open iterations,
//! closed in order when complete or timed out, over the shared [`ServerCore`].

use super::{BapConfig, MAX_OPEN, TimeoutFrom};
use crate::error::{ConfigError, Reject};
use crate::id::{MAX_WORKERS, Version, WorkerId, WorkerSet};
use crate::math::{self, Scalar};
use crate::msg::{ToServer, Values};
use crate::proto::common::queue::ServerItem;
use crate::proto::{Buffer, DropReason, ProtocolServer, Recipient, Rules, ServerCore, ServerEvent};
use crate::time::Instant;
use core::marker::PhantomData;

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
pub type BapServer<T, S> = ProtocolServer<T, S, BapRules<T, S>>;

/// BAP's own state over the shared server core: the open iterations and the parked pulls.
#[derive(Debug)]
pub struct BapRules<T, S> {
    config: BapConfig,
    s: u64,
    accs: S,
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
        let core = ServerCore::new(config.workers, config.learning_rate, config.stall_report, params, version)?;
        let dim = core.dim();
        let needed = dim.saturating_mul(s as usize + 1);
        let given = accs.as_ref().len();
        let Some(acc_slice) = accs.as_mut().get_mut(..needed) else {
            return Err(ConfigError::ScratchTooSmall { needed, given });
        };
        math::fill_zero(acc_slice);
        let rules = BapRules {
            config,
            s,
            accs,
            published: Instant::ZERO,
            slots: [Slot::EMPTY; MAX_OPEN],
            pending: [None; MAX_WORKERS],
            missed: [(0, DropReason::Stale); MAX_WORKERS],
            backlog: false,
            last_now: Instant::ZERO,
            _t: PhantomData,
        };
        Ok(Self::from_parts(core, rules))
    }

    /// The settings.
    pub fn config(&self) -> &BapConfig {
        &self.rules().config
    }

    /// The effective bound `s_bap`.
    pub fn s_bap(&self) -> u64 {
        self.rules().s
    }

    /// Workers whose gradient for iteration `j` is in, if `j` is open.
    pub fn received(&self, j: u64) -> Option<&WorkerSet> {
        let rules = self.rules();
        rules.slot_index(&self.core, j).and_then(|k| rules.slots.get(k)).map(|s| &s.got)
    }

    /// Admitted gradients waiting in open iterations (not yet applied or dropped): together
    /// with [`ServerStats::applied`](crate::proto::ServerStats::applied) and the drops they
    /// account for every admitted gradient.
    pub fn open_gradients(&self) -> u64 {
        let rules = self.rules();
        rules.slots.iter().take(rules.open() as usize).map(|s| s.got.len() as u64).sum()
    }
}

impl<T: Scalar, S: Buffer<T>> BapRules<T, S> {
    fn n(&self, core: &ServerCore<T, S>) -> usize {
        core.roster.n()
    }

    fn dim(&self, core: &ServerCore<T, S>) -> usize {
        core.params.as_ref().len()
    }

    fn open(&self) -> u64 {
        self.s + 1
    }

    /// The slot of open iteration `j` (`v + 1 ..= v + 1 + s_bap`).
    fn slot_index(&self, core: &ServerCore<T, S>, j: u64) -> Option<usize> {
        let head = core.version.0.saturating_add(1);
        (j >= head && j - head < self.open()).then(|| (j % self.open()) as usize)
    }

    fn acc(&mut self, core: &mut ServerCore<T, S>, k: usize) -> Option<&mut [T]> {
        let dim = self.dim(core);
        let start = k.checked_mul(dim)?;
        self.accs.as_mut().get_mut(start..start.checked_add(dim)?)
    }

    /// When the head iteration times out, if a limit is set and it has a gradient. An empty
    /// head behind a later open iteration that has one (the head's gradients were lost)
    /// counts from that later iteration's first gradient.
    fn head_deadline(&self, core: &ServerCore<T, S>) -> Option<Instant> {
        let t_max = self.config.iteration_timeout?;
        let head = self.slots.get(self.slot_index(core, core.version.0.saturating_add(1))?)?;
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
    fn close_burst(&self, core: &ServerCore<T, S>) -> usize {
        3 * self.n(core) + 1
    }

    /// Closes head iterations while they are complete or timed out.
    fn try_close(&mut self, core: &mut ServerCore<T, S>, now: Instant) {
        self.backlog = false;
        loop {
            let head = core.version.0.saturating_add(1);
            let Some(k) = self.slot_index(core, head) else { return };
            let Some(slot) = self.slots.get(k) else { return };
            let live = core.roster.live();
            // An empty head is never complete; it closes only by timeout, when a later
            // iteration has a gradient (its own were lost).
            let complete = !slot.got.is_empty()
                && (0..self.n(core)).map(|i| WorkerId(i as u32)).all(|w| !live.contains(w) || slot.got.contains(w));
            let timed_out = self.head_deadline(core).is_some_and(|d| now >= d);
            if !complete && !timed_out {
                return;
            }
            if core.queue.ensure_room(self.close_burst(core)).is_err() {
                self.backlog = true;
                return;
            }
            self.close(core, now, head, k, !complete);
        }
    }

    fn close(&mut self, core: &mut ServerCore<T, S>, now: Instant, j: u64, k: usize, by_timeout: bool) {
        // Borrowed, not copied: a slot is ~1.3 KB and this runs once per iteration.
        static EMPTY: Slot = Slot::EMPTY;
        let slot = self.slots.get(k).unwrap_or(&EMPTY);
        let count = slot.got.len().max(1);
        let a = T::from_f64(-self.config.learning_rate / count as f64);
        let dim = self.dim(core);
        let start = k.saturating_mul(dim);
        if let Some(acc) = self.accs.as_mut().get_mut(start..start.saturating_add(dim)) {
            // Lengths were fixed at construction; a mismatch is impossible here.
            let _ = math::apply_and_clear(core.params.as_mut(), a, acc);
        }
        let version = Version(j);
        for worker in slot.got.iter() {
            let i = worker.index();
            let lag = u64::from(slot.lag.get(i).copied().unwrap_or(0));
            let factor = f64::from(slot.factor.get(i).copied().unwrap_or(1.0));
            core.queue.push(ServerItem::Event(ServerEvent::Applied {
                worker,
                base: Version(j.saturating_sub(1).saturating_sub(lag)),
                version,
                staleness: lag,
                weight: factor / count as f64,
            }));
        }
        core.stats.applied += slot.got.len() as u64;
        core.stats.updates += 1;
        core.queue.push(ServerItem::Event(ServerEvent::ModelUpdated { version, contributions: slot.got.len() as u32 }));
        let reason = if by_timeout { DropReason::Aborted } else { DropReason::WorkerLost };
        for i in 0..self.n(core) {
            let worker = WorkerId(i as u32);
            if slot.got.contains(worker) {
                continue;
            }
            if let Some(m) = self.missed.get_mut(i) {
                *m = (j, reason);
            }
            if by_timeout {
                core.queue.push(ServerItem::Abort { to: worker, iteration: j });
            }
        }
        // `lag` and `factor` are written for every worker `got` gains and read only for
        // those, so emptying `got` (and `first`) empties the slot.
        if let Some(s) = self.slots.get_mut(k) {
            s.got.clear();
            s.first = None;
        }
        core.version = version;
        self.published = now;
        core.stall.progress(now);
        for i in 0..self.n(core) {
            let Some(slot) = self.pending.get_mut(i) else { continue };
            if slot.is_some_and(|min| j >= min) {
                *slot = None;
                core.queue.push(ServerItem::Model { to: Recipient::Worker(WorkerId(i as u32)) });
            }
        }
    }

    fn drop_gradient(&mut self, core: &mut ServerCore<T, S>, worker: WorkerId, base: Version, reason: DropReason) {
        core.stats.count_drop(reason);
        core.queue.push(ServerItem::Event(ServerEvent::Dropped { worker, base, reason }));
    }

    #[allow(clippy::too_many_arguments)]
    fn on_grad(
        &mut self,
        core: &mut ServerCore<T, S>,
        now: Instant,
        from: WorkerId,
        base: Version,
        j: u64,
        seq: u64,
        values: Values<'_, T>,
    ) -> Result<(), Reject> {
        core.roster.check_seq(from, seq)?;
        let factor = self.config.gradient_policy.admit(&values, self.dim(core))?;
        if base > core.version {
            return Err(Reject::FutureVersion { claimed: base, current: core.version });
        }
        if base.0 >= j {
            // Iteration `j` is computed on `w_{j−1}` or older.
            return Err(Reject::Unexpected { kind: "Grad" });
        }
        let i = from.index();
        let slot_k = self.slot_index(core, j);
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
        let outcome = if j <= core.version.0 {
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
            let acc = self.acc(core, k).ok_or(Reject::Capacity)?;
            if factor == T::one() {
                values.add_into(acc)?;
            } else {
                values.scaled_add_into(acc, factor)?;
            }
        }
        core.roster.commit_seq(from, seq);
        core.stats.accepted += 1;
        match outcome {
            Err(reason) => self.drop_gradient(core, from, base, reason),
            Ok(k) => {
                if let Some(slot) = self.slots.get_mut(k) {
                    slot.got.insert(from);
                    if let (Some(l), Some(f)) = (slot.lag.get_mut(i), slot.factor.get_mut(i)) {
                        *l = lag as u8;
                        *f = factor.to_f64() as f32;
                    }
                    slot.first.get_or_insert(now);
                }
                self.try_close(core, now);
            }
        }
        Ok(())
    }

    fn on_pull(
        &mut self,
        core: &mut ServerCore<T, S>,
        from: WorkerId,
        have: Version,
        min_clock: u64,
    ) -> Result<(), Reject> {
        if have > core.version {
            return Err(Reject::FutureVersion { claimed: have, current: core.version });
        }
        let reachable = core.version.0.saturating_add(1).saturating_add(self.s);
        if min_clock > reachable {
            return Err(Reject::FutureVersion { claimed: Version(min_clock), current: core.version });
        }
        let slot = self.pending.get_mut(from.index()).ok_or(Reject::UnknownWorker(from))?;
        if core.version.0 >= min_clock {
            *slot = None;
            if core.version > have {
                core.queue.push(ServerItem::Model { to: Recipient::Worker(from) });
            } else {
                core.queue.push(ServerItem::NotNewer { to: from, version: core.version });
            }
        } else {
            let again = slot.replace(min_clock).is_some();
            // A parked puller is past the head iteration (its next iteration is above
            // `min_clock > v`). If it pulls again (its retry after `rejoin_after`, which
            // re-sends its last gradient first) and its gradient of the head is still
            // missing, that gradient was lost: re-send the model the worker has, which tells
            // it to compute the head again (a late original or a second copy is then refused
            // as a duplicate, or dropped once the iteration closed).
            let head = core.version.0.saturating_add(1);
            let missing =
                self.slot_index(core, head).and_then(|k| self.slots.get(k)).is_some_and(|s| !s.got.contains(from));
            if again && missing {
                core.queue.push(ServerItem::Model { to: Recipient::Worker(from) });
            }
        }
        Ok(())
    }

    fn on_join(&mut self, core: &mut ServerCore<T, S>, from: WorkerId, epoch: u32) -> Result<(), Reject> {
        let fresh = core.roster.check_join(from, epoch)?;
        core.roster.commit_join(from, epoch);
        if fresh {
            core.queue.push(ServerItem::Event(ServerEvent::WorkerJoined { worker: from, epoch }));
        }
        if let Some(p) = self.pending.get_mut(from.index()) {
            *p = None;
        }
        core.queue.push(ServerItem::Model { to: Recipient::Worker(from) });
        Ok(())
    }
}

impl<T: Scalar, S: Buffer<T>> Rules<T, S> for BapRules<T, S> {
    fn burst(&self, core: &ServerCore<T, S>) -> usize {
        self.close_burst(core) + 4
    }

    fn on_message(
        &mut self,
        core: &mut ServerCore<T, S>,
        now: Instant,
        from: WorkerId,
        msg: ToServer<'_, T>,
    ) -> Result<(), Reject> {
        self.last_now = self.last_now.max(now);
        match msg {
            ToServer::Join { epoch } => self.on_join(core, from, epoch),
            ToServer::Grad { base, iteration, seq, values } => {
                self.on_grad(core, now, from, base, iteration, seq, values)
            }
            ToServer::Pull { have, min_clock } => self.on_pull(core, from, have, min_clock),
            other => Err(Reject::Unexpected { kind: other.kind_name() }),
        }
    }

    fn on_lost(&mut self, core: &mut ServerCore<T, S>, now: Instant, worker: WorkerId, _was_live: bool) {
        self.last_now = self.last_now.max(now);
        if let Some(p) = self.pending.get_mut(worker.index()) {
            *p = None;
        }
        self.try_close(core, now);
    }

    fn on_timeout(&mut self, core: &mut ServerCore<T, S>, now: Instant) {
        self.last_now = self.last_now.max(now);
        self.try_close(core, now);
        if core.stall.due(now) {
            let head = core.version.0.saturating_add(1);
            let got = self.slot_index(core, head).and_then(|k| self.slots.get(k)).map_or(WorkerSet::EMPTY, |s| s.got);
            let live = core.roster.live();
            let missing = (0..core.n()).map(|i| WorkerId(i as u32)).filter(|w| live.contains(*w) && !got.contains(*w));
            let count = missing.clone().count() as u32;
            if let Some(waiting_for) = missing.min() {
                if core.queue.ensure_room(1).is_ok() {
                    let since = core.stall.since();
                    core.event(ServerEvent::Stalled { waiting_for, missing: count, since });
                }
            }
        }
    }

    fn poll_timeout(&self, core: &ServerCore<T, S>) -> Option<Instant> {
        let backlog = self.backlog.then_some(self.last_now);
        [core.stall.deadline(), self.head_deadline(core), backlog].into_iter().flatten().min()
    }
}
