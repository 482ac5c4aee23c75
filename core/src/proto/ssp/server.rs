//! SSP's server: per-worker clocks, updates applied on arrival, pulls parked until the
//! staleness bound allows them, over the shared [`ServerCore`].

use super::SspConfig;
use crate::error::{ConfigError, Reject};
use crate::id::{Version, WorkerId};
use crate::math::Scalar;
use crate::proto::common::input::{Clock, Join, Pull};
use crate::proto::common::optim::UnitOrScaled;
use crate::proto::common::queue::{BatchKind, ServerItem};
use crate::proto::common::table::{Slot, flag};
use crate::proto::{
    Buffer, CoreOf, DEFAULT_INLINE_WORKERS, GradientPolicy, HasSlot, Inline, ProtocolServer, Recipient, Rules,
    ServerCore, ServerEvent, Storage, WorkerRecord,
};
use crate::time::Instant;
use core::marker::PhantomData;

/// The SSP server. `S` is the caller's storage for the model, `M` for the per-worker table.
pub type SspServer<T, S, M = Inline<DEFAULT_INLINE_WORKERS>> = ProtocolServer<T, S, SspRules<T, S>, M>;

/// An SSP worker's part of its record.
#[derive(Clone, Copy, Debug)]
pub struct SspSlot {
    /// Clocks completed (the next clock it will send).
    clock: u64,
    /// The `min_clock` of its parked pull + 1, or 0 when none is parked.
    pending: u64,
    /// The version of the last model sent to it.
    last_sent: u64,
    /// Its own updates applied since that model.
    own_since: u32,
    /// The epoch of its last session (valid with the [`SESSION`] flag).
    session: u32,
}

impl Slot for SspSlot {
    const INIT: Self = Self { clock: 0, pending: 0, last_sent: 0, own_since: 0, session: 0 };
}

/// The record flag of a worker whose `session` is known.
const SESSION: u8 = flag::PROTOCOL;

/// SSP's own state over the shared server core: the server clock and the parked pulls
/// (the per-worker clocks are in the records).
#[derive(Debug)]
pub struct SspRules<T, S> {
    config: SspConfig,
    policy: GradientPolicy,
    /// The server clock: min over live workers' clocks, never decreasing.
    clock: u64,
    /// Pulls parked.
    parked: usize,
    /// Live workers whose clock is the server clock, when `counted` (kept as workers join,
    /// leave and move their clocks, so that the server clock is recomputed, a pass over the
    /// table, only when it can advance: once per server clock, not once per join).
    slowest: usize,
    /// Whether `slowest` is current (false until the first pass).
    counted: bool,
    /// The mark of the last batch of answered pulls.
    answered: u64,
    _t: PhantomData<(T, S)>,
}

impl<T, S> HasSlot for SspRules<T, S> {
    type Slot = SspSlot;
}

type Core<T, S, M> = CoreOf<T, S, M, SspRules<T, S>>;

impl<T: Scalar, S: Buffer<T>, M: Storage> SspServer<T, S, M> {
    /// A server starting from the model in `params` at version 0, clock 0.
    pub fn new(config: SspConfig, params: S) -> Result<Self, ConfigError> {
        Self::resume(config, params, Version::ZERO)
    }

    /// A server resuming from a checkpoint: `params` is the model at `version`. Worker
    /// clocks restart at 0 and catch up with the workers' next `Clock` messages.
    pub fn resume(config: SspConfig, params: S, version: Version) -> Result<Self, ConfigError> {
        config.check()?;
        let mut core: Core<T, S, M> =
            ServerCore::new(config.workers, config.learning_rate, config.stall_report, params, version)?;
        core.stall.idle();
        for r in core.roster.records_mut() {
            r.ext.last_sent = version.0;
        }
        let rules = SspRules {
            config,
            policy: config.update_policy(),
            clock: 0,
            parked: 0,
            slowest: 0,
            counted: false,
            answered: 0,
            _t: PhantomData,
        };
        Ok(Self::from_parts(core, rules))
    }

    /// The settings.
    pub fn config(&self) -> &SspConfig {
        &self.rules().config
    }

    /// The server clock: every update of a clock below it, from every live worker, is in
    /// the model.
    pub fn clock(&self) -> u64 {
        self.rules().clock
    }

    /// Clocks completed by `worker`, as far as the server knows.
    pub fn worker_clock(&self, worker: WorkerId) -> Option<u64> {
        self.core.roster.ext(worker).map(|x| x.clock)
    }

    /// Whether `worker` has a pull parked (it is blocked on the staleness bound).
    pub fn is_waiting(&self, worker: WorkerId) -> bool {
        self.core.roster.ext(worker).is_some_and(|x| x.pending != 0)
    }
}

impl<T: Scalar, S: Buffer<T>> SspRules<T, S> {
    /// Min over live workers' clocks (the current clock if nobody is live).
    fn live_min<M: Storage>(&self, core: &Core<T, S, M>) -> u64 {
        core.roster.live().map(|(_, r)| r.ext.clock).min().unwrap_or(self.clock)
    }

    /// Recomputes the server clock when it may have moved (the count of the slowest live
    /// workers reached zero, or membership changed); on progress restarts the stall watch and
    /// answers parked pulls: all of them if the clock moved, else only `who`'s.
    fn advance<M: Storage>(&mut self, core: &mut Core<T, S, M>, now: Instant, who: Option<WorkerId>) {
        let mut moved = false;
        if !self.counted || self.slowest == 0 {
            let min = self.live_min(core);
            if min > self.clock {
                self.clock = min;
                core.stall.progress(now);
                moved = true;
            }
            let clock = self.clock;
            self.slowest = core.roster.live().filter(|(_, r)| r.ext.clock == clock).count();
            self.counted = true;
        }
        self.answer_pulls(core, if moved { None } else { who });
        if self.parked == 0 {
            core.stall.idle();
        }
    }

    /// Keeps `slowest` current as one worker's part in it changes: before, it was live at
    /// clock `before` (`None`: not live); now it is live at clock `after` (`None`: not live).
    /// A live worker's clock is never below the server clock (it is raised to it on every
    /// return), so only a worker at the server clock counts.
    fn reclock(&mut self, before: Option<u64>, after: Option<u64>) {
        if !self.counted {
            return;
        }
        if before == Some(self.clock) {
            self.slowest = self.slowest.saturating_sub(1);
        }
        if after == Some(self.clock) {
            self.slowest += 1;
        }
    }

    /// `worker`'s clock if it is live.
    fn live_clock<M: Storage>(core: &Core<T, S, M>, worker: WorkerId) -> Option<u64> {
        core.roster.ext(worker).filter(|_| core.roster.is_live(worker)).map(|x| x.clock)
    }

    /// Whether `slowest` is what a pass over the table finds, and no live worker is behind
    /// the server clock (the invariants [`Self::reclock`] relies on).
    #[cfg(test)]
    pub(crate) fn slowest_is_current<M: Storage>(&self, core: &Core<T, S, M>) -> bool {
        let counted = core.roster.live().filter(|(_, r)| r.ext.clock == self.clock).count();
        (!self.counted || counted == self.slowest) && core.roster.live().all(|(_, r)| r.ext.clock >= self.clock)
    }

    /// Answers every parked pull the clock allows (`only`: just that worker's): the answered
    /// workers' records get a new mark, and one batch sends each of them the model. A pull
    /// of `only` is answered with one model item instead: a batch would walk the whole table
    /// for its one recipient, an O(n) cost on every such update (at n = 10,000, five times
    /// the simulator's whole cost per event; `benches/examples/sim_count.rs`).
    fn answer_pulls<M: Storage>(&mut self, core: &mut Core<T, S, M>, only: Option<WorkerId>) {
        if self.parked == 0 {
            return;
        }
        let (s, clock, version, mark) = (self.config.staleness, self.clock, core.version.0, self.answered + 1);
        let mut answered = 0;
        let records = core.roster.records_mut();
        let records = match only {
            Some(w) => records.get_mut(w.index()..w.index().saturating_add(1)).unwrap_or(&mut []),
            None => records,
        };
        for r in records {
            let Some(min_clock) = r.ext.pending.checked_sub(1) else { continue };
            // The puller is at clock `min_clock + s`; its updates up to then must be in.
            if clock >= min_clock && r.ext.clock >= min_clock.saturating_add(s) {
                r.ext.pending = 0;
                Self::mark_sent(r, version);
                r.mark = mark;
                answered += 1;
            }
        }
        if answered > 0 {
            self.parked -= answered;
            self.answered = mark;
            match only {
                Some(to) => core.queue.push(ServerItem::Model { to: Recipient::Worker(to) }),
                None => core.queue.push_batch(BatchKind::Models { mark }),
            }
        }
    }

    fn mark_sent(r: &mut WorkerRecord<SspSlot>, version: u64) {
        r.ext.last_sent = version;
        r.ext.own_since = 0;
    }

    fn send_model<M: Storage>(&mut self, core: &mut Core<T, S, M>, to: WorkerId) {
        let version = core.version.0;
        if let Some(r) = core.roster.record_mut(to) {
            Self::mark_sent(r, version);
        }
        core.queue.push(ServerItem::Model { to: Recipient::Worker(to) });
    }

    /// Forgets `r`'s parked pull, if any.
    fn unpark(&mut self, r: &mut WorkerRecord<SspSlot>) {
        if r.ext.pending != 0 {
            r.ext.pending = 0;
            self.parked -= 1;
        }
    }
}

impl<T: Scalar, S: Buffer<T>, M: Storage> Rules<T, S, M> for SspRules<T, S> {
    fn kind(&self) -> crate::proto::ProtocolKind {
        use crate::proto::ProtocolKind;
        ProtocolKind::Ssp
    }

    fn burst(&self) -> usize {
        // Every parked pull may be answered by one input (one batch), beside a join's event
        // and model, or an update's two events.
        4
    }

    fn on_join(&mut self, core: &mut Core<T, S, M>, join: Join) -> Result<(), Reject> {
        let Join { now, from, epoch } = join;
        let before = Self::live_clock(core, from);
        core.join(from, epoch)?;
        let server_clock = self.clock;
        if let Some(r) = core.roster.record_mut(from) {
            if r.has(SESSION) && r.ext.session == epoch {
                // The same session again (a retransmitted or delayed `Join`): the worker may
                // be past the server clock already, and its updates are in (a repeat of its
                // last `Clock` would be refused as a duplicate), so its clock never goes down.
                r.ext.clock = r.ext.clock.max(server_clock);
            } else {
                // A new session starts from nothing: at the server clock (the clock of the
                // model it receives), with no pull of the old session parked.
                r.ext.clock = server_clock;
                self.unpark(r);
                r.ext.session = epoch;
                r.set(SESSION, true);
            }
        }
        self.reclock(before, Self::live_clock(core, from));
        self.send_model(core, from);
        self.advance(core, now, Some(from));
        Ok(())
    }

    fn on_clock(&mut self, core: &mut Core<T, S, M>, update: Clock<'_, '_, T>) -> Result<(), Reject> {
        let Clock { now, from, clock, seq, values } = update;
        core.roster.check_seq(from, seq)?;
        let factor = self.policy.admit(values, core.params.as_ref().len())?;
        // Lengths are checked: the update below cannot fail, and does nothing if it does. The
        // payload is the worker's step `−η_step·g`: the rule reads it at the rate `η_step`.
        let config = &self.config;
        core.apply(UnitOrScaled { values, factor, lr: || config.step_size() })?;
        let before = Self::live_clock(core, from);
        // Sequence numbers are namespaced by epoch (`first_seq(epoch) = epoch << 32`): an
        // update of a session the server has not seen join yet (its `Join` is late; the
        // worker started on another model sent to it) starts that session here, so the late
        // `Join` counts as a repeat and does not pull the clock back.
        let session = u32::try_from(seq >> 32).unwrap_or(u32::MAX);
        let server_clock = self.clock;
        core.roster.commit_seq(from, seq);
        core.stats.accepted += 1;
        let (current, version) = (core.version.0, core.version.next());
        let Some(r) = core.roster.record_mut(from) else { return Err(Reject::UnknownWorker(from)) };
        if before.is_none() {
            // A worker that was not live is live again: its clock rises to the server clock.
            r.ext.clock = r.ext.clock.max(server_clock);
        }
        if !(r.has(SESSION) && r.ext.session == session) {
            r.ext.session = session;
            r.set(SESSION, true);
            r.ext.clock = server_clock;
        }
        let base = r.ext.last_sent;
        let staleness = current.saturating_sub(base).saturating_sub(u64::from(r.ext.own_since));
        r.ext.own_since = r.ext.own_since.saturating_add(1);
        r.ext.clock = r.ext.clock.max(clock.saturating_add(1));
        let after = r.ext.clock;
        self.reclock(before, Some(after));
        core.version = version;
        core.stats.applied += 1;
        core.stats.updates += 1;
        core.queue.push(ServerItem::Event(ServerEvent::Applied {
            worker: from,
            base: Version(base),
            version,
            staleness,
            weight: factor.to_f64(),
        }));
        core.loss.count();
        core.updated(version, 1);
        self.advance(core, now, Some(from));
        Ok(())
    }

    fn on_pull(&mut self, core: &mut Core<T, S, M>, pull: Pull) -> Result<(), Reject> {
        let Pull { now, from, have, min_clock } = pull;
        core.check_have(have)?;
        let waiting = self.parked > 0;
        let r = core.roster.record_mut(from).ok_or(Reject::UnknownWorker(from))?;
        if r.ext.pending == 0 {
            self.parked += 1;
        }
        r.ext.pending = min_clock.saturating_add(1);
        if !waiting {
            // A wait starts now.
            core.stall.progress(now);
        }
        self.advance(core, now, Some(from));
        Ok(())
    }

    fn on_lost(&mut self, core: &mut Core<T, S, M>, now: Instant, worker: WorkerId, was_live: bool) {
        if let Some(r) = core.roster.record_mut(worker) {
            self.unpark(r);
            let clock = r.ext.clock;
            self.reclock(was_live.then_some(clock), None);
        }
        self.advance(core, now, None);
    }

    /// The live workers at the slowest clock (those a parked pull waits for).
    fn awaits(&self, core: &Core<T, S, M>, worker: WorkerId) -> bool {
        core.roster.is_live(worker) && core.roster.ext(worker).is_some_and(|x| x.clock == self.clock)
    }

    fn on_timeout(&mut self, core: &mut Core<T, S, M>, now: Instant) {
        if !core.stall.due(now) {
            return;
        }
        let slowest = || core.roster.live().filter(|(_, r)| r.ext.clock == self.clock).map(|(w, _)| w);
        let (missing, first) = (slowest().count() as u32, slowest().next());
        if let Some(waiting_for) = first {
            let since = core.stall.since();
            core.event(ServerEvent::Stalled { waiting_for, missing, since });
        }
    }

    fn model_clock(&self, _core: &Core<T, S, M>) -> u64 {
        self.clock
    }
}
