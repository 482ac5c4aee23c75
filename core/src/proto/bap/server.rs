//! BAP's server: per-iteration aggregation slots for the `s_bap + 1` open iterations,
//! closed in order when complete or timed out, over the shared [`ServerCore`]. Who
//! contributed to which open iteration, with which lag and clipping factor, is in the
//! caller-sized tables (a bit per open iteration in each worker's record, and `s_bap + 1`
//! contribution cells per worker).

use super::{BapConfig, TimeoutFrom};
use crate::error::{ConfigError, Reject};
use crate::id::{Version, WorkerId};
use crate::math::Scalar;
use crate::proto::common::input::{Grad, Join, Pull};
use crate::proto::common::loss::LossTally;
use crate::proto::common::optim::Cleared;
use crate::proto::common::queue::{BatchKind, ServerItem};
use crate::proto::common::table::Slot;
use crate::proto::common::validate::zero_scratch;
use crate::proto::{
    Buffer, CoreOf, DEFAULT_INLINE_WORKERS, DropReason, HasSlot, Inline, ProtocolServer, Recipient, Rules, ServerCore,
    ServerEvent, Storage, WorkerRecord,
};
use crate::time::{Duration, Instant};
use core::marker::PhantomData;

/// The aggregation state of one open iteration (its contributors are the workers whose
/// record has the iteration's bit).
#[derive(Clone, Copy, Debug)]
struct Iteration {
    /// Contributions so far.
    count: u32,
    /// Arrival of the first gradient.
    first: Option<Instant>,
    /// The losses its contributions reported.
    loss: LossTally,
}

impl Iteration {
    const EMPTY: Self = Self { count: 0, first: None, loss: LossTally::new() };
}

/// A BAP worker's part of its record.
#[derive(Clone, Copy, Debug)]
pub struct BapSlot {
    /// The min version of its parked pull + 1, or 0 when none is parked.
    pending: u64,
    /// The last iteration closed without it.
    missed: u64,
    /// Bit `k`: its gradient is in the open iteration of slot `k`.
    got: u16,
    /// Bit `k`: the iteration of slot `k` closed by timeout without it; its abort is still
    /// to be polled.
    aborted: u16,
    /// Why it missed `missed` (an index into [`DropReason::ALL`]).
    missed_reason: u8,
}

impl Slot for BapSlot {
    const INIT: Self = Self { pending: 0, missed: 0, got: 0, aborted: 0, missed_reason: 0 };
}

/// One contribution's lag `(j − 1) − base` and clipping factor, packed (5 bytes).
#[derive(Clone, Copy, Debug)]
pub struct Contribution([u8; 5]);

impl Contribution {
    const NONE: Self = Self([0, 0, 0, 0x80, 0x3f]);

    fn new(lag: u8, factor: f32) -> Self {
        let f = factor.to_le_bytes();
        Self([lag, f[0], f[1], f[2], f[3]])
    }

    fn lag(self) -> u64 {
        u64::from(self.0[0])
    }

    fn factor(self) -> f64 {
        let [_, a, b, c, d] = self.0;
        f64::from(f32::from_le_bytes([a, b, c, d]))
    }
}

/// The batch of a close's `Applied` events (`a` = the iteration, `b` = its contributions
/// and its slot, [`pack_count_slot`]).
const APPLIED: u8 = 1;
/// The batch of a timed-out close's aborts (`a` = the iteration, `b` = its slot).
const ABORTS: u8 = 2;

/// An `APPLIED` batch's `b`: the contributions in the low 32 bits, the slot above them.
fn pack_count_slot(count: u32, slot: usize) -> u64 {
    u64::from(count) | (slot as u64) << 32
}

/// The contributions and the slot of an `APPLIED` batch's `b`.
fn unpack_count_slot(b: u64) -> (u32, usize) {
    (b as u32, (b >> 32) as usize)
}

/// The BAP server. `S` is the caller's storage for the model and the accumulators, `M` for
/// the per-worker tables.
pub type BapServer<T, S, M = Inline<DEFAULT_INLINE_WORKERS>> = ProtocolServer<T, S, BapRules<T, S, M>, M>;

type Core<T, S, M> = CoreOf<T, S, M, BapRules<T, S, M>>;

/// BAP's own state over the shared server core: the open iterations and their
/// contributions (the parked pulls are in the records).
#[derive(Debug)]
pub struct BapRules<T, S, M: Storage> {
    config: BapConfig,
    s: u64,
    accs: S,
    /// When `version` was published.
    published: Instant,
    iterations: [Iteration; super::MAX_BAP_STALENESS as usize + 1],
    /// `s_bap + 1` cells per worker: worker `i`'s contribution to slot `k` at `i·(s+1) + k`.
    contributions: M::Table<Contribution>,
    _t: PhantomData<T>,
}

impl<T, S, M: Storage> HasSlot for BapRules<T, S, M> {
    type Slot = BapSlot;
}

impl<T: Scalar, S: Buffer<T>, M: Storage> BapServer<T, S, M> {
    /// A server starting from the model in `params` at version 0. `accs` is scratch space
    /// of at least `(s_bap + 1) · dim` elements ([`BapConfig::open_iterations`]).
    pub fn new(config: BapConfig, params: S, accs: S) -> Result<Self, ConfigError> {
        Self::resume(config, params, accs, Version::ZERO)
    }

    /// A server resuming from a checkpoint: `params` is the model at `version`.
    pub fn resume(config: BapConfig, params: S, mut accs: S, version: Version) -> Result<Self, ConfigError> {
        let s = config.check()?;
        let core: Core<T, S, M> =
            ServerCore::new(config.workers, config.learning_rate, config.stall_report, params, version)?;
        let dim = core.dim();
        let needed = dim.saturating_mul(s as usize + 1);
        zero_scratch(accs.as_mut(), needed)?;
        let rules = BapRules {
            config,
            s,
            accs,
            published: Instant::ZERO,
            iterations: [Iteration::EMPTY; super::MAX_BAP_STALENESS as usize + 1],
            contributions: M::table(core.n().saturating_mul(s as usize + 1), Contribution::NONE)?,
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

    /// How many workers' gradients for iteration `j` are in, if `j` is open.
    pub fn received(&self, j: u64) -> Option<usize> {
        let rules = self.rules();
        rules.slot_index(&self.core, j).and_then(|k| rules.iterations.get(k)).map(|it| it.count as usize)
    }

    /// Whether `worker`'s gradient for iteration `j` is in (`false` if `j` is not open).
    pub fn has_received(&self, worker: WorkerId, j: u64) -> bool {
        let rules = self.rules();
        rules.slot_index(&self.core, j).is_some_and(|k| rules.contributed(&self.core, worker, k))
    }

    /// Admitted gradients waiting in open iterations (not yet applied or dropped): together
    /// with [`ServerStats::applied`](crate::proto::ServerStats::applied) and the drops they
    /// account for every admitted gradient.
    pub fn open_gradients(&self) -> u64 {
        let rules = self.rules();
        rules.iterations.iter().take(rules.open() as usize).map(|it| u64::from(it.count)).sum()
    }
}

impl<T: Scalar, S: Buffer<T>, M: Storage> BapRules<T, S, M> {
    fn dim(&self, core: &Core<T, S, M>) -> usize {
        core.params.as_ref().len()
    }

    fn open(&self) -> u64 {
        self.s + 1
    }

    /// The slot of open iteration `j` (`v + 1 ..= v + 1 + s_bap`).
    fn slot_index(&self, core: &Core<T, S, M>, j: u64) -> Option<usize> {
        let head = core.version.0.saturating_add(1);
        (j >= head && j - head < self.open()).then(|| (j % self.open()) as usize)
    }

    /// Whether `worker`'s gradient is in the open iteration of slot `k`.
    fn contributed(&self, core: &Core<T, S, M>, worker: WorkerId, k: usize) -> bool {
        core.roster.ext(worker).is_some_and(|x| x.got & (1 << k) != 0)
    }

    /// Worker `i`'s contribution cell for slot `k`. Plain arithmetic: `i < n ≤ MAX_WORKERS`
    /// and `k < s_bap + 1 ≤ 16` cannot overflow, and the cell is looked up with `get`.
    fn cell(&self, i: usize, k: usize) -> usize {
        i.wrapping_mul(self.open() as usize).wrapping_add(k)
    }

    fn acc(&mut self, core: &mut Core<T, S, M>, k: usize) -> Option<&mut [T]> {
        let dim = self.dim(core);
        let start = k.checked_mul(dim)?;
        self.accs.as_mut().get_mut(start..start.checked_add(dim)?)
    }

    /// When the head iteration times out, if a limit is set and it has a gradient. An empty
    /// head behind a later open iteration that has one (the head's gradients were lost)
    /// counts from that later iteration's first gradient.
    #[inline(always)]
    fn head_deadline(&self, core: &Core<T, S, M>) -> Option<Instant> {
        let t_max = self.config.iteration_timeout?;
        self.head_deadline_after(core, t_max)
    }

    /// [`Self::head_deadline`] when the limit is `t_max` (out of line: without a limit, the
    /// test above is all there is).
    #[inline(never)]
    fn head_deadline_after(&self, core: &Core<T, S, M>, t_max: Duration) -> Option<Instant> {
        let head = self.iterations.get(self.slot_index(core, core.version.0.saturating_add(1))?)?;
        let first = match head.first {
            Some(first) => first,
            None => self.iterations.iter().take(self.open() as usize).filter_map(|s| s.first).min()?,
        };
        let from = match self.config.timeout_from {
            TimeoutFrom::LaterOfBoth => first.max(self.published),
            TimeoutFrom::FirstGradient => first,
            TimeoutFrom::Publication => self.published,
        };
        Some(from + t_max)
    }

    /// Whether every live worker's gradient is in the open iteration of slot `k` (a pass
    /// over the table only when it has at least as many gradients as there are live workers).
    #[inline(always)]
    fn complete(&self, core: &Core<T, S, M>, k: usize) -> bool {
        let count = self.iterations.get(k).map_or(0, |it| it.count as usize);
        count > 0 && count >= core.roster.live_count() && Self::all_live_in(core, k)
    }

    /// Whether every live worker's gradient is in slot `k` ([`Self::complete`]'s pass over
    /// the table, out of line: most gradients do not reach it).
    #[inline(never)]
    fn all_live_in(core: &Core<T, S, M>, k: usize) -> bool {
        core.roster.live().all(|(_, r)| r.ext.got & (1 << k) != 0)
    }

    /// Closes head iterations while they are complete or timed out (at most `s_bap + 1`:
    /// each close queues its per-worker outputs as batches keyed by its own slot, which no
    /// later close of the same input touches). The test that the head stays open, which is
    /// what most gradients find, runs in the caller; the closes are out of line.
    #[inline(always)]
    fn try_close(&mut self, core: &mut Core<T, S, M>, now: Instant) {
        if let Some((k, by_timeout)) = self.head_closing(core, now) {
            self.close_heads(core, now, k, by_timeout);
        }
    }

    /// The head iteration's slot and whether it closes by timeout, if it closes now: when it
    /// is complete, or else timed out. An empty head is never complete; it closes only by
    /// timeout, when a later iteration has a gradient (its own were lost).
    #[inline(always)]
    fn head_closing(&self, core: &Core<T, S, M>, now: Instant) -> Option<(usize, bool)> {
        let k = self.slot_index(core, core.version.0.saturating_add(1))?;
        if self.complete(core, k) {
            return Some((k, false));
        }
        self.head_deadline(core).is_some_and(|d| now >= d).then_some((k, true))
    }

    /// [`Self::try_close`]'s closes: the head of slot `k` (by timeout if `by_timeout`), then
    /// each next head that [`Self::head_closing`] finds closing, `s_bap + 1` in all at most.
    #[inline(never)]
    fn close_heads(&mut self, core: &mut Core<T, S, M>, now: Instant, mut k: usize, mut by_timeout: bool) {
        for closed in 1..=self.open() {
            self.close(core, now, core.version.0.saturating_add(1), k, by_timeout);
            if closed == self.open() {
                return;
            }
            let Some(next) = self.head_closing(core, now) else { return };
            (k, by_timeout) = next;
        }
    }

    fn close(&mut self, core: &mut Core<T, S, M>, now: Instant, j: u64, k: usize, by_timeout: bool) {
        let count = self.iterations.get(k).map_or(0, |it| it.count);
        let a = T::from_f64(-self.config.learning_rate / f64::from(count.max(1)));
        let dim = self.dim(core);
        let start = k.saturating_mul(dim);
        if let Some(acc) = self.accs.as_mut().get_mut(start..start.saturating_add(dim)) {
            // Lengths were fixed at construction; a mismatch is impossible here.
            let _ = core.apply(Cleared { acc, a, lr: self.config.learning_rate });
        }
        let version = Version(j);
        // The contributors' events: one batch, which clears their bit for slot `k` (`b` holds
        // the count and the slot, so expanding it divides nothing).
        core.queue.push_batch(BatchKind::Protocol { tag: APPLIED, a: j, b: pack_count_slot(count, k) });
        core.stats.applied += u64::from(count);
        core.stats.updates += 1;
        let mean_loss = self.iterations.get_mut(k).and_then(|it| it.loss.take_mean());
        core.queue.push(ServerItem::Event(ServerEvent::ModelUpdated { version, contributions: count, mean_loss }));
        let reason = if by_timeout { DropReason::Aborted } else { DropReason::WorkerLost };
        let reason_index = DropReason::ALL.iter().position(|r| *r == reason).unwrap_or(0) as u8;
        let mut answered = false;
        for r in core.roster.records_mut() {
            if r.ext.got & (1 << k) == 0 {
                r.ext.missed = j;
                r.ext.missed_reason = reason_index;
                if by_timeout {
                    r.ext.aborted |= 1 << k;
                }
            }
            // Parked pulls the new version satisfies are answered (one batch: mark `j`).
            if r.ext.pending.checked_sub(1).is_some_and(|min| j >= min) {
                r.ext.pending = 0;
                r.mark = j;
                answered = true;
            }
        }
        if by_timeout {
            core.queue.push_batch(BatchKind::Protocol { tag: ABORTS, a: j, b: k as u64 });
        }
        if let Some(it) = self.iterations.get_mut(k) {
            *it = Iteration::EMPTY;
        }
        core.version = version;
        self.published = now;
        core.stall.progress(now);
        if answered {
            core.queue.push_batch(BatchKind::Models { mark: j });
        }
    }

    fn drop_gradient(&mut self, core: &mut Core<T, S, M>, worker: WorkerId, base: Version, reason: DropReason) {
        core.stats.count_drop(reason);
        core.queue.push(ServerItem::Event(ServerEvent::Dropped { worker, base, reason }));
    }
}

impl<T: Scalar, S: Buffer<T>, M: Storage> Rules<T, S, M> for BapRules<T, S, M> {
    fn kind(&self) -> crate::proto::ProtocolKind {
        use crate::proto::ProtocolKind;
        ProtocolKind::Bap
    }

    fn burst(&self) -> usize {
        // Up to `s_bap + 1` closes (three batches and the update event each), a drop, a
        // join's or pull's answer.
        4 * self.open() as usize + 4
    }

    #[inline(never)]
    fn on_join(&mut self, core: &mut Core<T, S, M>, join: Join) -> Result<(), Reject> {
        let Join { from, epoch, .. } = join;
        core.join_and_send_model(from, epoch)?;
        if let Some(x) = core.roster.ext_mut(from) {
            x.pending = 0;
        }
        Ok(())
    }

    // Left to the compiler to inline into the engine's dispatch, never forced out of line
    // (docs/perf-log.md, "Per-kind methods").
    fn on_grad(&mut self, core: &mut Core<T, S, M>, grad: Grad<'_, '_, T>) -> Result<(), Reject> {
        let Grad { now, from, base, iteration: j, seq, values } = grad;
        core.roster.check_seq(from, seq)?;
        let factor = self.config.gradient_policy.admit(values, self.dim(core))?;
        if base > core.version {
            return Err(Reject::FutureVersion { claimed: base, current: core.version });
        }
        if base.0 >= j {
            // Iteration `j` is computed on `w_{j−1}` or older.
            return Err(Reject::Unexpected { kind: "Grad" });
        }
        let i = from.index();
        let slot_k = self.slot_index(core, j);
        if slot_k.is_some_and(|k| self.contributed(core, from, k)) {
            return Err(Reject::Duplicate { worker: from, seq });
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
            Err(match core.roster.ext(from) {
                Some(x) if x.missed >= j => {
                    DropReason::ALL.get(usize::from(x.missed_reason)).copied().unwrap_or(DropReason::Stale)
                }
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
                if let Some(x) = core.roster.ext_mut(from) {
                    x.got |= 1 << k;
                }
                let cell = self.cell(i, k);
                if let Some(c) = self.contributions.as_mut().get_mut(cell) {
                    *c = Contribution::new(lag as u8, factor.to_f64() as f32);
                }
                if let Some(it) = self.iterations.get_mut(k) {
                    it.count += 1;
                    it.first.get_or_insert(now);
                    it.loss.add(core.loss.incoming());
                }
                self.try_close(core, now);
            }
        }
        Ok(())
    }

    fn on_pull(&mut self, core: &mut Core<T, S, M>, pull: Pull) -> Result<(), Reject> {
        let Pull { from, have, min_clock, .. } = pull;
        core.check_have(have)?;
        let reachable = core.version.0.saturating_add(1).saturating_add(self.s);
        if min_clock > reachable {
            return Err(Reject::FutureVersion { claimed: Version(min_clock), current: core.version });
        }
        let version = core.version;
        let x = core.roster.ext_mut(from).ok_or(Reject::UnknownWorker(from))?;
        if version.0 >= min_clock {
            x.pending = 0;
            core.answer_pull(from, have);
        } else {
            let again = x.pending != 0;
            x.pending = min_clock.saturating_add(1);
            // Whether its gradient of the head is missing (computed here, where it is used:
            // pulls answered at once do not need it).
            let head = version.0.saturating_add(1);
            let missing = self.slot_index(core, head).is_some_and(|k| !self.contributed(core, from, k));
            // A parked puller is past the head iteration (its next iteration is above
            // `min_clock > v`). If it pulls again (its retry after `rejoin_after`, which
            // re-sends its last gradient first) and its gradient of the head is still
            // missing, that gradient was lost: re-send the model the worker has, which tells
            // it to compute the head again (a late original or a second copy is then refused
            // as a duplicate, or dropped once the iteration closed).
            if again && missing {
                core.send_model(Recipient::Worker(from));
            }
        }
        Ok(())
    }

    fn on_lost(&mut self, core: &mut Core<T, S, M>, now: Instant, worker: WorkerId, _was_live: bool) {
        if let Some(x) = core.roster.ext_mut(worker) {
            x.pending = 0;
        }
        self.try_close(core, now);
    }

    /// The live workers whose gradient the head iteration lacks.
    fn awaits(&self, core: &Core<T, S, M>, worker: WorkerId) -> bool {
        let head = core.version.0.saturating_add(1);
        let bit = self.slot_index(core, head).map_or(0, |k| 1u16 << k);
        core.roster.is_live(worker) && core.roster.ext(worker).is_some_and(|x| x.got & bit == 0)
    }

    fn on_timeout(&mut self, core: &mut Core<T, S, M>, now: Instant) {
        self.try_close(core, now);
        if core.stall.due(now) {
            let head = core.version.0.saturating_add(1);
            let bit = self.slot_index(core, head).map_or(0, |k| 1u16 << k);
            let missing = || core.roster.live().filter(|(_, r)| r.ext.got & bit == 0).map(|(w, _)| w);
            let (count, first) = (missing().count() as u32, missing().next());
            if let Some(waiting_for) = first {
                let since = core.stall.since();
                core.event(ServerEvent::Stalled { waiting_for, missing: count, since });
            }
        }
    }

    fn expand(&self, kind: BatchKind, worker: WorkerId, record: &mut WorkerRecord<BapSlot>) -> Option<ServerItem> {
        match kind {
            BatchKind::Protocol { tag: APPLIED, a: j, b } => {
                let (count, k) = unpack_count_slot(b);
                let bit = 1u16.checked_shl(k as u32).unwrap_or(0);
                if record.ext.got & bit == 0 {
                    return None;
                }
                record.ext.got &= !bit;
                let c = self.contributions.as_ref().get(self.cell(worker.index(), k)).copied();
                let c = c.unwrap_or(Contribution::NONE);
                Some(ServerItem::Event(ServerEvent::Applied {
                    worker,
                    base: Version(j.saturating_sub(1).saturating_sub(c.lag())),
                    version: Version(j),
                    staleness: c.lag(),
                    weight: c.factor() / count.max(1) as f64,
                }))
            }
            BatchKind::Protocol { tag: ABORTS, a: j, b: k } => {
                let bit = 1u16.checked_shl(k as u32).unwrap_or(0);
                if record.ext.aborted & bit == 0 {
                    return None;
                }
                record.ext.aborted &= !bit;
                Some(ServerItem::Abort { to: worker, iteration: j })
            }
            kind => crate::proto::common::engine::expand_common(kind, worker, record),
        }
    }

    fn poll_timeout(&self, core: &Core<T, S, M>) -> Option<Instant> {
        [core.stall.deadline(), self.head_deadline(core)].into_iter().flatten().min()
    }
}
