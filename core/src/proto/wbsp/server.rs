//! The WBSP server: rounds closed by the last live uploader, deltas accumulated on arrival,
//! over the shared [`ServerCore`].

use super::WbspConfig;
use crate::error::{ConfigError, Reject};
use crate::id::{Version, WorkerId, WorkerSet};
use crate::math::{self, Scalar};
use crate::msg::{ToServer, Values};
use crate::proto::common::queue::ServerItem;
use crate::proto::{Buffer, ProtocolServer, Recipient, Rules, ServerCore, ServerEvent};
use crate::time::Instant;
use core::marker::PhantomData;

/// The WBSP server (see the [module docs](super) for the rules). `S` is the caller's
/// storage for the model and the round's accumulator.
pub type WbspServer<T, S> = ProtocolServer<T, S, WbspRules<T, S>>;

/// WBSP's own state over the shared server core: the open round.
#[derive(Debug)]
pub struct WbspRules<T, S> {
    config: WbspConfig,
    acc: S,
    /// Workers that uploaded during the open round.
    got: WorkerSet,
    /// Deltas in the open round.
    deltas: u32,
    /// When the open round started (`None` until the first message arrives).
    round_started: Option<Instant>,
    _t: PhantomData<T>,
}

impl<T: Scalar, S: Buffer<T>> WbspServer<T, S> {
    /// A server starting from the model in `params` at version 0. `acc` is scratch space of
    /// at least the model's length (its contents are overwritten).
    pub fn new(config: WbspConfig, params: S, acc: S) -> Result<Self, ConfigError> {
        Self::resume(config, params, acc, Version::ZERO)
    }

    /// A server resuming from a checkpoint: `params` is the model at `version`.
    pub fn resume(config: WbspConfig, params: S, mut acc: S, version: Version) -> Result<Self, ConfigError> {
        config.check()?;
        let core = ServerCore::new(config.workers, config.learning_rate, None, params, version)?;
        let dim = core.dim();
        let given = acc.as_ref().len();
        let Some(acc_slice) = acc.as_mut().get_mut(..dim) else {
            return Err(ConfigError::ScratchTooSmall { needed: dim, given });
        };
        math::fill_zero(acc_slice);
        let rules = WbspRules { config, acc, got: WorkerSet::EMPTY, deltas: 0, round_started: None, _t: PhantomData };
        Ok(Self::from_parts(core, rules))
    }

    /// The settings.
    pub fn config(&self) -> &WbspConfig {
        &self.rules().config
    }

    /// Workers that uploaded during the open round.
    pub fn uploaded(&self) -> &WorkerSet {
        &self.rules().got
    }

    /// Deltas accumulated in the open round.
    pub fn round_deltas(&self) -> u32 {
        self.rules().deltas
    }

    /// Workers currently counted as live (a round waits for each of them).
    pub fn live(&self) -> &WorkerSet {
        self.core.roster.live()
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

    /// Whether every live worker uploaded in the open round.
    fn complete(&self, core: &ServerCore<T, S>) -> bool {
        let n = core.n();
        // CANARY (planted bug, test builds only): a lost worker is still waited for.
        #[cfg(feature = "_canary")]
        if crate::canary::is_on(crate::canary::Canary::LostWorkerAwaited) {
            return (0..n as u32).map(WorkerId).all(|w| self.got.contains(w));
        }
        (0..n as u32).map(WorkerId).all(|w| self.got.contains(w) || !core.roster.is_live(w))
    }

    /// The lowest-numbered live worker that has not uploaded in the open round.
    fn first_missing_live(&self, core: &ServerCore<T, S>) -> Option<WorkerId> {
        (0..core.n() as u32).map(WorkerId).find(|w| !self.got.contains(*w) && core.roster.is_live(*w))
    }

    /// Publishes the open round: `w += A`, `A = 0`, version + 1.
    fn close(&mut self, core: &mut ServerCore<T, S>, now: Instant) {
        let dim = core.dim();
        if let Some(acc) = self.acc.as_mut().get_mut(..dim) {
            // Lengths were fixed at construction; a mismatch is impossible here.
            let _ = math::apply_and_clear(core.params.as_mut(), T::one(), acc);
        }
        core.version = core.version.next();
        core.stats.updates += 1;
        core.event(ServerEvent::ModelUpdated { version: core.version, contributions: self.deltas });
        self.got.clear();
        self.deltas = 0;
        self.round_started = Some(now);
    }

    fn close_if_complete(&mut self, core: &mut ServerCore<T, S>, now: Instant) {
        if self.deltas > 0 && self.complete(core) {
            self.close(core, now);
        }
    }

    #[allow(clippy::too_many_arguments)]
    fn on_delta(
        &mut self,
        core: &mut ServerCore<T, S>,
        now: Instant,
        from: WorkerId,
        round: Version,
        local_steps: u32,
        seq: u64,
        values: Values<'_, T>,
    ) -> Result<(), Reject> {
        core.roster.check_seq(from, seq)?;
        if local_steps == 0 {
            return Err(Reject::Unexpected { kind: "Delta with local_steps = 0" });
        }
        if round > core.version {
            return Err(Reject::FutureVersion { claimed: round, current: core.version });
        }
        let dim = core.dim();
        let clip = self.config.gradient_policy.admit(&values, dim)?;
        let weight = clip.to_f64() * self.config.delta_scaling.factor(self.config.workers, local_steps);
        let acc = self.acc.as_mut().get_mut(..dim).ok_or(Reject::Capacity)?;
        // Cannot fail: the length was checked by `admit`.
        values.scaled_add_into(acc, T::from_f64(weight))?;
        core.roster.commit_seq(from, seq);
        self.start_clock(now);
        core.stats.accepted += 1;
        core.stats.applied += 1;
        self.got.insert(from);
        self.deltas = self.deltas.saturating_add(1);
        core.event(ServerEvent::Applied {
            worker: from,
            base: round,
            version: core.version.next(),
            staleness: round.lag_behind(core.version),
            weight,
        });
        self.close_if_complete(core, now);
        core.queue.push(ServerItem::PushAck { to: from, round: core.version, pull_now: round < core.version });
        Ok(())
    }

    fn on_pull(&mut self, core: &mut ServerCore<T, S>, from: WorkerId, have: Version) -> Result<(), Reject> {
        if have > core.version {
            return Err(Reject::FutureVersion { claimed: have, current: core.version });
        }
        if have < core.version {
            core.send_model(Recipient::Worker(from));
        } else {
            core.queue.push(ServerItem::NotNewer { to: from, version: core.version });
        }
        Ok(())
    }
}

impl<T: Scalar, S: Buffer<T>> Rules<T, S> for WbspRules<T, S> {
    fn burst(&self, _core: &ServerCore<T, S>) -> usize {
        4
    }

    fn on_message(
        &mut self,
        core: &mut ServerCore<T, S>,
        now: Instant,
        from: WorkerId,
        msg: ToServer<'_, T>,
    ) -> Result<(), Reject> {
        match msg {
            ToServer::Join { epoch } => {
                core.join(from, epoch)?;
                self.start_clock(now);
                core.send_model(Recipient::Worker(from));
                Ok(())
            }
            ToServer::Delta { round, local_steps, seq, values } => {
                self.on_delta(core, now, from, round, local_steps, seq, values)
            }
            ToServer::Pull { have, .. } => self.on_pull(core, from, have),
            other => Err(Reject::Unexpected { kind: other.kind_name() }),
        }
    }

    fn on_lost(&mut self, core: &mut ServerCore<T, S>, now: Instant, _worker: WorkerId, was_live: bool) {
        if was_live {
            self.close_if_complete(core, now);
        }
    }

    fn on_timeout(&mut self, core: &mut ServerCore<T, S>, now: Instant) {
        let Some(deadline) = self.poll_timeout(core) else {
            return;
        };
        // Room for one event per worker and the update; a caller that did not drain gets the
        // deadline again on its next call.
        if now < deadline || core.queue.ensure_room(core.n() + 1).is_err() {
            return;
        }
        while let Some(worker) = self.first_missing_live(core) {
            core.roster.lose(worker);
            core.event(ServerEvent::WorkerLost { worker });
        }
        self.close_if_complete(core, now);
    }

    /// The round deadline, while a round is open with a live worker missing.
    fn poll_timeout(&self, core: &ServerCore<T, S>) -> Option<Instant> {
        let (Some(deadline), Some(started)) = (self.config.round_deadline, self.round_started) else {
            return None;
        };
        self.first_missing_live(core).map(|_| started + deadline)
    }

    fn on_stop(&mut self, _core: &mut ServerCore<T, S>) {
        self.round_started = None;
    }
}
