//! The WBSP server: rounds closed by the last live uploader, deltas accumulated on arrival,
//! over the shared [`ServerCore`].

use super::WbspConfig;
use crate::error::{ConfigError, Reject};
use crate::id::{Version, WorkerId};
use crate::math::Scalar;
use crate::proto::common::input::{Delta, Join, Pull};
use crate::proto::common::optim::Cleared;
use crate::proto::common::queue::{BatchKind, ServerItem};
use crate::proto::common::roster::mark_of;
use crate::proto::common::table::flag;
use crate::proto::common::validate::zero_scratch;
use crate::proto::{
    Buffer, CoreOf, DEFAULT_INLINE_WORKERS, HasSlot, Inline, ProtocolServer, Recipient, Rules, ServerCore, ServerEvent,
    Storage, WorkerRecord,
};
use crate::time::Instant;
use core::marker::PhantomData;

/// The WBSP server (see the [module docs](super) for the rules). `S` is the caller's
/// storage for the model and the round's accumulator, `M` for the per-worker table.
pub type WbspServer<T, S, M = Inline<DEFAULT_INLINE_WORKERS>> = ProtocolServer<T, S, WbspRules<T, S>, M>;

/// The record flag of a worker declared lost by a round deadline whose `WorkerLost` event is
/// still to be polled.
const LOST_AT_DEADLINE: u8 = flag::PROTOCOL;

/// The batch of `WorkerLost` events a round deadline queues.
const LOST_BATCH: u8 = 1;

type Core<T, S, M> = CoreOf<T, S, M, WbspRules<T, S>>;

/// WBSP's own state over the shared server core: the open round (who uploaded in it is
/// in the workers' records: their mark is the round's).
#[derive(Debug)]
pub struct WbspRules<T, S> {
    config: WbspConfig,
    acc: S,
    /// Workers that uploaded during the open round.
    uploaders: usize,
    /// Deltas in the open round.
    deltas: u32,
    /// When the open round started (`None` until the first message arrives).
    round_started: Option<Instant>,
    _t: PhantomData<T>,
}

impl<T, S> HasSlot for WbspRules<T, S> {
    type Slot = ();
}

impl<T: Scalar, S: Buffer<T>, M: Storage> WbspServer<T, S, M> {
    /// A server starting from the model in `params` at version 0. `acc` is scratch space of
    /// at least the model's length (its contents are overwritten).
    pub fn new(config: WbspConfig, params: S, acc: S) -> Result<Self, ConfigError> {
        Self::resume(config, params, acc, Version::ZERO)
    }

    /// A server resuming from a checkpoint: `params` is the model at `version`.
    pub fn resume(config: WbspConfig, params: S, mut acc: S, version: Version) -> Result<Self, ConfigError> {
        config.check()?;
        let core: Core<T, S, M> = ServerCore::new(config.workers, config.learning_rate, None, params, version)?;
        let dim = core.dim();
        zero_scratch(acc.as_mut(), dim)?;
        let rules = WbspRules { config, acc, uploaders: 0, deltas: 0, round_started: None, _t: PhantomData };
        Ok(Self::from_parts(core, rules))
    }

    /// The settings.
    pub fn config(&self) -> &WbspConfig {
        &self.rules().config
    }

    /// How many workers uploaded during the open round.
    pub fn uploaded(&self) -> usize {
        self.rules().uploaders
    }

    /// Whether `worker` uploaded during the open round.
    pub fn has_uploaded(&self, worker: WorkerId) -> bool {
        self.core.roster.record(worker).is_some_and(|r| r.mark == mark_of(self.core.version))
    }

    /// Deltas accumulated in the open round.
    pub fn round_deltas(&self) -> u32 {
        self.rules().deltas
    }

    /// Whether `worker` is counted as live (a round waits for each live worker).
    pub fn is_live(&self, worker: WorkerId) -> bool {
        self.core.roster.is_live(worker)
    }

    /// The open round's accumulator (the scaled deltas not yet published).
    pub fn accumulator(&self) -> &[T] {
        let dim = self.core.dim();
        self.rules().acc.as_ref().get(..dim).unwrap_or(&[])
    }
}

impl<T: Scalar, S: Buffer<T>> WbspRules<T, S> {
    fn start_clock(&mut self, now: Instant) {
        if self.round_started.is_none() {
            self.round_started = Some(now);
        }
    }

    /// Whether every live worker uploaded in the open round (a pass over the table only when
    /// the uploaders are at least as many as the live workers). Always inlined: it runs on
    /// every delta.
    #[inline(always)]
    fn complete<M: Storage>(&self, core: &Core<T, S, M>) -> bool {
        let open = mark_of(core.version);
        // CANARY (planted bug, test builds only): a lost worker is still waited for.
        #[cfg(feature = "_canary")]
        if crate::canary::is_on(crate::canary::Canary::LostWorkerAwaited) {
            return self.uploaders >= core.n();
        }
        self.uploaders >= core.roster.live_count() && core.roster.live().all(|(_, r)| r.mark == open)
    }

    /// The lowest-numbered live worker that has not uploaded in the open round.
    fn first_missing_live<M: Storage>(&self, core: &Core<T, S, M>) -> Option<WorkerId> {
        let open = mark_of(core.version);
        if self.uploaders >= core.n() {
            return None;
        }
        core.roster.live().find(|(_, r)| r.mark != open).map(|(w, _)| w)
    }

    /// Publishes the open round: `w += A`, `A = 0`, version + 1.
    fn close<M: Storage>(&mut self, core: &mut Core<T, S, M>, now: Instant) {
        let dim = core.dim();
        if let Some(acc) = self.acc.as_mut().get_mut(..dim) {
            // Lengths were fixed at construction; a mismatch is impossible here. The summed
            // deltas are a model change made at the workers' rate: the rule reads the
            // direction `−A/η`.
            let _ = core.apply(Cleared { acc, a: T::one(), lr: self.config.learning_rate });
        }
        core.version = core.version.next();
        core.stats.updates += 1;
        core.updated(core.version, self.deltas);
        self.uploaders = 0;
        self.deltas = 0;
        self.round_started = Some(now);
    }

    fn close_if_complete<M: Storage>(&mut self, core: &mut Core<T, S, M>, now: Instant) {
        if self.deltas > 0 && self.complete(core) {
            self.close(core, now);
        }
    }
}

impl<T: Scalar, S: Buffer<T>, M: Storage> Rules<T, S, M> for WbspRules<T, S> {
    fn kind(&self) -> crate::proto::ProtocolKind {
        use crate::proto::ProtocolKind;
        if self.config.overlap { ProtocolKind::WbspOverlap } else { ProtocolKind::Wbsp }
    }

    fn burst(&self) -> usize {
        4
    }

    fn on_join(&mut self, core: &mut Core<T, S, M>, join: Join) -> Result<(), Reject> {
        core.join(join.from, join.epoch)?;
        self.start_clock(join.now);
        core.send_model(Recipient::Worker(join.from));
        Ok(())
    }

    fn on_delta(&mut self, core: &mut Core<T, S, M>, delta: Delta<'_, '_, T>) -> Result<(), Reject> {
        let Delta { now, from, round, local_steps, seq, values } = delta;
        core.roster.check_seq(from, seq)?;
        if local_steps == 0 {
            return Err(Reject::Unexpected { kind: "Delta with local_steps = 0" });
        }
        if round > core.version {
            return Err(Reject::FutureVersion { claimed: round, current: core.version });
        }
        let dim = core.dim();
        let clip = self.config.gradient_policy.admit(values, dim)?;
        let weight = clip.to_f64() * self.config.delta_scaling.factor(self.config.workers, local_steps);
        let acc = self.acc.as_mut().get_mut(..dim).ok_or(Reject::Capacity)?;
        // Cannot fail: the length was checked by `admit`.
        values.scaled_add_into(acc, T::from_f64(weight))?;
        core.roster.commit_seq(from, seq);
        self.start_clock(now);
        core.stats.accepted += 1;
        core.stats.applied += 1;
        core.loss.count();
        let open = mark_of(core.version);
        if let Some(r) = core.roster.record_mut(from).filter(|r| r.mark != open) {
            r.mark = open;
            self.uploaders += 1;
        }
        self.deltas = self.deltas.saturating_add(1);
        core.event(ServerEvent::Applied {
            worker: from,
            base: round,
            version: core.version.next(),
            staleness: round.lag_behind(core.version),
            weight,
        });
        // `close_if_complete` inlined, without its `deltas > 0` test (this delta is one).
        if self.complete(core) {
            self.close(core, now);
        }
        core.queue.push(ServerItem::PushAck { to: from, round: core.version, pull_now: round < core.version });
        Ok(())
    }

    fn on_pull(&mut self, core: &mut Core<T, S, M>, pull: Pull) -> Result<(), Reject> {
        core.check_have(pull.have)?;
        core.answer_pull(pull.from, pull.have);
        Ok(())
    }

    fn on_lost(&mut self, core: &mut Core<T, S, M>, now: Instant, _worker: WorkerId, was_live: bool) {
        if was_live {
            self.close_if_complete(core, now);
        }
    }

    fn on_timeout(&mut self, core: &mut Core<T, S, M>, now: Instant) {
        let Some(deadline) = self.poll_timeout(core) else {
            return;
        };
        if now < deadline {
            return;
        }
        // Every live worker missing from the round is lost: one batch of `WorkerLost` events.
        let open = mark_of(core.version);
        let mut lost = 0usize;
        for r in core.roster.records_mut() {
            if r.has(flag::LIVE) && r.mark != open {
                r.set(LOST_AT_DEADLINE, true);
                lost += 1;
            }
        }
        for i in 0..core.n() {
            let w = WorkerId(i as u32);
            if core.roster.record(w).is_some_and(|r| r.has(LOST_AT_DEADLINE)) {
                core.roster.lose(w);
            }
        }
        if lost > 0 {
            core.queue.push_batch(BatchKind::Protocol { tag: LOST_BATCH, a: 0, b: 0 });
        }
        self.close_if_complete(core, now);
    }

    fn expand(&self, kind: BatchKind, worker: WorkerId, record: &mut WorkerRecord<()>) -> Option<ServerItem> {
        match kind {
            BatchKind::Protocol { tag: LOST_BATCH, .. } if record.has(LOST_AT_DEADLINE) => {
                record.set(LOST_AT_DEADLINE, false);
                Some(ServerItem::Event(ServerEvent::WorkerLost { worker }))
            }
            kind => crate::proto::common::engine::expand_common(kind, worker, record),
        }
    }

    /// The round deadline, while a round is open with a live worker missing.
    fn poll_timeout(&self, core: &Core<T, S, M>) -> Option<Instant> {
        let (Some(deadline), Some(started)) = (self.config.round_deadline, self.round_started) else {
            return None;
        };
        self.first_missing_live(core).map(|_| started + deadline)
    }

    fn on_stop(&mut self, _core: &mut Core<T, S, M>) {
        self.round_started = None;
    }
}
