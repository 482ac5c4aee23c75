//! SSP's server: per-worker clocks, updates applied on arrival, pulls parked until the
//! staleness bound allows them, over the shared [`ServerCore`].

use super::SspConfig;
use crate::error::{ConfigError, Reject};
use crate::id::{MAX_WORKERS, Version, WorkerId};
use crate::math::Scalar;
use crate::msg::{ToServer, Values};
use crate::proto::common::queue::ServerItem;
use crate::proto::{Buffer, GradientPolicy, ProtocolServer, Recipient, Rules, ServerCore, ServerEvent};
use crate::time::Instant;
use core::marker::PhantomData;

/// The SSP server. `S` is the caller's storage for the model.
pub type SspServer<T, S> = ProtocolServer<T, S, SspRules<T, S>>;

/// SSP's own state over the shared server core: the clocks and the parked pulls.
#[derive(Debug)]
pub struct SspRules<T, S> {
    config: SspConfig,
    policy: GradientPolicy,
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
    _t: PhantomData<(T, S)>,
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
        let mut core = ServerCore::new(config.workers, config.learning_rate, config.stall_report, params, version)?;
        core.stall.idle();
        let rules = SspRules {
            config,
            policy: config.update_policy(),
            clock: 0,
            clocks: [0; MAX_WORKERS],
            pending: [None; MAX_WORKERS],
            last_sent: [version.0; MAX_WORKERS],
            own_since: [0; MAX_WORKERS],
            epochs: [None; MAX_WORKERS],
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
        self.core.roster.check_member(worker).ok().and_then(|i| self.rules().clocks.get(i).copied())
    }

    /// Whether `worker` has a pull parked (it is blocked on the staleness bound).
    pub fn is_waiting(&self, worker: WorkerId) -> bool {
        self.rules().pending.get(worker.index()).is_some_and(Option::is_some)
    }
}

impl<T: Scalar, S: Buffer<T>> SspRules<T, S> {
    fn n(&self, core: &ServerCore<T, S>) -> usize {
        core.roster.n()
    }

    /// Min over live workers' clocks (the current clock if nobody is live).
    fn live_min(&self, core: &ServerCore<T, S>) -> u64 {
        let live = core.roster.live();
        (0..self.n(core))
            .filter(|&i| live.contains(WorkerId(i as u32)))
            .filter_map(|i| self.clocks.get(i).copied())
            .min()
            .unwrap_or(self.clock)
    }

    /// Recomputes the server clock; on progress restarts the stall watch and answers
    /// parked pulls.
    fn advance(&mut self, core: &mut ServerCore<T, S>, now: Instant) {
        let min = self.live_min(core);
        if min > self.clock {
            self.clock = min;
            core.stall.progress(now);
        }
        self.answer_pulls(core);
        if !self.pending.iter().take(self.n(core)).any(Option::is_some) {
            core.stall.idle();
        }
    }

    fn answer_pulls(&mut self, core: &mut ServerCore<T, S>) {
        let s = self.config.staleness;
        for i in 0..self.n(core) {
            let (Some(slot), Some(&own)) = (self.pending.get_mut(i), self.clocks.get(i)) else { continue };
            let Some(min_clock) = *slot else { continue };
            // The puller is at clock `min_clock + s`; its updates up to then must be in.
            if self.clock >= min_clock && own >= min_clock.saturating_add(s) {
                *slot = None;
                self.send_model(core, WorkerId(i as u32));
            }
        }
    }

    fn send_model(&mut self, core: &mut ServerCore<T, S>, to: WorkerId) {
        if let (Some(sent), Some(own)) = (self.last_sent.get_mut(to.index()), self.own_since.get_mut(to.index())) {
            *sent = core.version.0;
            *own = 0;
        }
        core.queue.push(ServerItem::Model { to: Recipient::Worker(to) });
    }

    /// A worker that was not live is live again: raise its clock to the server clock.
    fn readmit(&mut self, i: usize) {
        if let Some(c) = self.clocks.get_mut(i) {
            *c = (*c).max(self.clock);
        }
    }

    fn on_join(&mut self, core: &mut ServerCore<T, S>, now: Instant, from: WorkerId, epoch: u32) -> Result<(), Reject> {
        let fresh = core.roster.check_join(from, epoch)?;
        core.roster.commit_join(from, epoch);
        let i = from.index();
        if fresh {
            core.queue.push(ServerItem::Event(ServerEvent::WorkerJoined { worker: from, epoch }));
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
        self.send_model(core, from);
        self.advance(core, now);
        Ok(())
    }

    fn on_clock(
        &mut self,
        core: &mut ServerCore<T, S>,
        now: Instant,
        from: WorkerId,
        clock: u64,
        seq: u64,
        values: Values<'_, T>,
    ) -> Result<(), Reject> {
        core.roster.check_seq(from, seq)?;
        let factor = self.policy.admit(&values, core.params.as_ref().len())?;
        // Lengths are checked: the additions below cannot fail, and do nothing if they do.
        if factor == T::one() {
            values.add_into(core.params.as_mut())?;
        } else {
            values.scaled_add_into(core.params.as_mut(), factor)?;
        }
        let i = from.index();
        if !core.roster.is_live(from) {
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
        core.roster.commit_seq(from, seq);
        core.stats.accepted += 1;
        let base = self.last_sent.get(i).copied().unwrap_or(0);
        let own = self.own_since.get(i).copied().unwrap_or(0);
        let staleness = core.version.0.saturating_sub(base).saturating_sub(own);
        core.version = core.version.next();
        if let Some(o) = self.own_since.get_mut(i) {
            *o = o.saturating_add(1);
        }
        if let Some(c) = self.clocks.get_mut(i) {
            *c = (*c).max(clock.saturating_add(1));
        }
        core.stats.applied += 1;
        core.stats.updates += 1;
        let version = core.version;
        core.queue.push(ServerItem::Event(ServerEvent::Applied {
            worker: from,
            base: Version(base),
            version,
            staleness,
            weight: factor.to_f64(),
        }));
        core.queue.push(ServerItem::Event(ServerEvent::ModelUpdated { version, contributions: 1 }));
        self.advance(core, now);
        Ok(())
    }

    fn on_pull(
        &mut self,
        core: &mut ServerCore<T, S>,
        now: Instant,
        from: WorkerId,
        have: Version,
        min_clock: u64,
    ) -> Result<(), Reject> {
        if have > core.version {
            return Err(Reject::FutureVersion { claimed: have, current: core.version });
        }
        let waiting = self.pending.iter().take(self.n(core)).any(Option::is_some);
        let slot = self.pending.get_mut(from.index()).ok_or(Reject::UnknownWorker(from))?;
        *slot = Some(min_clock);
        if !waiting {
            // A wait starts now.
            core.stall.progress(now);
        }
        self.advance(core, now);
        Ok(())
    }
}

impl<T: Scalar, S: Buffer<T>> Rules<T, S> for SspRules<T, S> {
    fn burst(&self, core: &ServerCore<T, S>) -> usize {
        // Every parked pull may be answered by one input.
        core.n() + 4
    }

    fn on_message(
        &mut self,
        core: &mut ServerCore<T, S>,
        now: Instant,
        from: WorkerId,
        msg: ToServer<'_, T>,
    ) -> Result<(), Reject> {
        match msg {
            ToServer::Join { epoch } => self.on_join(core, now, from, epoch),
            ToServer::Clock { clock, seq, values } => self.on_clock(core, now, from, clock, seq, values),
            ToServer::Pull { have, min_clock } => self.on_pull(core, now, from, have, min_clock),
            other => Err(Reject::Unexpected { kind: other.kind_name() }),
        }
    }

    fn on_lost(&mut self, core: &mut ServerCore<T, S>, now: Instant, worker: WorkerId, _was_live: bool) {
        if let Some(p) = self.pending.get_mut(worker.index()) {
            *p = None;
        }
        self.advance(core, now);
    }

    fn on_timeout(&mut self, core: &mut ServerCore<T, S>, now: Instant) {
        if !core.stall.due(now) {
            return;
        }
        let live = *core.roster.live();
        let slowest = (0..core.n())
            .filter(|&i| live.contains(WorkerId(i as u32)) && self.clocks.get(i) == Some(&self.clock))
            .map(|i| WorkerId(i as u32));
        let missing = slowest.clone().count() as u32;
        if let Some(waiting_for) = slowest.min() {
            let since = core.stall.since();
            core.event(ServerEvent::Stalled { waiting_for, missing, since });
        }
    }

    fn model_clock(&self, _core: &ServerCore<T, S>) -> u64 {
        self.clock
    }
}
