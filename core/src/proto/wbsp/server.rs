//! The WBSP server: rounds closed by the last live uploader, deltas accumulated on arrival.

use super::WbspConfig;
use crate::error::{ConfigError, Reject};
use crate::id::{Version, WorkerId, WorkerSet};
use crate::math::{self, Scalar};
use crate::msg::{ToServer, Values};
use crate::proto::common::queue::{ServerItem, ServerQueue};
use crate::proto::common::roster::Roster;
use crate::proto::{Buffer, Recipient, Server, ServerEvent, ServerOutput, ServerStats};
use crate::time::Instant;
use core::marker::PhantomData;

/// The WBSP server (see the [module docs](super) for the rules). `S` is the caller's
/// storage for the model and the round's accumulator.
#[derive(Debug)]
pub struct WbspServer<T, S> {
    config: WbspConfig,
    params: S,
    acc: S,
    version: Version,
    /// Workers that uploaded during the open round.
    got: WorkerSet,
    /// Deltas in the open round.
    deltas: u32,
    /// When the open round started (`None` until the first message arrives).
    round_started: Option<Instant>,
    roster: Roster,
    stats: ServerStats,
    queue: ServerQueue,
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
        let roster = Roster::new(config.workers)?;
        let dim = params.as_ref().len();
        if dim == 0 {
            return Err(ConfigError::EmptyModel);
        }
        let given = acc.as_ref().len();
        let Some(acc_slice) = acc.as_mut().get_mut(..dim) else {
            return Err(ConfigError::ScratchTooSmall { needed: dim, given });
        };
        math::fill_zero(acc_slice);
        Ok(Self {
            config,
            params,
            acc,
            version,
            got: WorkerSet::EMPTY,
            deltas: 0,
            round_started: None,
            roster,
            stats: ServerStats::default(),
            queue: ServerQueue::new(),
            _t: PhantomData,
        })
    }

    /// The settings.
    pub fn config(&self) -> &WbspConfig {
        &self.config
    }

    /// Workers that uploaded during the open round.
    pub fn uploaded(&self) -> &WorkerSet {
        &self.got
    }

    /// Deltas accumulated in the open round.
    pub fn round_deltas(&self) -> u32 {
        self.deltas
    }

    /// Workers currently counted as live (a round waits for each of them).
    pub fn live(&self) -> &WorkerSet {
        self.roster.live()
    }

    /// The open round's accumulator (the scaled deltas not yet published).
    pub fn accumulator(&self) -> &[T] {
        let dim = self.dim();
        self.acc.as_ref().get(..dim).unwrap_or(&[])
    }

    fn dim(&self) -> usize {
        self.params.as_ref().len()
    }

    fn start_clock(&mut self, now: Instant) {
        if self.round_started.is_none() {
            self.round_started = Some(now);
        }
    }

    /// Whether every live worker uploaded in the open round.
    fn complete(&self) -> bool {
        let n = self.roster.n();
        // CANARY (planted bug, test builds only): a lost worker is still waited for.
        #[cfg(feature = "_canary")]
        if crate::canary::is_on(crate::canary::Canary::LostWorkerAwaited) {
            return (0..n as u32).map(WorkerId).all(|w| self.got.contains(w));
        }
        (0..n as u32).map(WorkerId).all(|w| self.got.contains(w) || !self.roster.is_live(w))
    }

    /// The lowest-numbered live worker that has not uploaded in the open round.
    fn first_missing_live(&self) -> Option<WorkerId> {
        let n = self.roster.n();
        (0..n as u32).map(WorkerId).find(|w| !self.got.contains(*w) && self.roster.is_live(*w))
    }

    /// Publishes the open round: `w += A`, `A = 0`, version + 1.
    fn close(&mut self, now: Instant) {
        let dim = self.dim();
        if let Some(acc) = self.acc.as_mut().get_mut(..dim) {
            // Lengths were fixed at construction; a mismatch is impossible here.
            let _ = math::apply_and_clear(self.params.as_mut(), T::one(), acc);
        }
        self.version = self.version.next();
        self.stats.updates += 1;
        self.queue
            .push(ServerItem::Event(ServerEvent::ModelUpdated { version: self.version, contributions: self.deltas }));
        self.got.clear();
        self.deltas = 0;
        self.round_started = Some(now);
    }

    fn close_if_complete(&mut self, now: Instant) {
        if self.deltas > 0 && self.complete() {
            self.close(now);
        }
    }

    fn on_join(&mut self, now: Instant, from: WorkerId, epoch: u32) -> Result<(), Reject> {
        let fresh = self.roster.check_join(from, epoch)?;
        self.roster.commit_join(from, epoch);
        self.start_clock(now);
        if fresh {
            self.queue.push(ServerItem::Event(ServerEvent::WorkerJoined { worker: from, epoch }));
        }
        self.queue.push(ServerItem::Model { to: Recipient::Worker(from) });
        Ok(())
    }

    fn on_delta(
        &mut self,
        now: Instant,
        from: WorkerId,
        round: Version,
        local_steps: u32,
        seq: u64,
        values: Values<'_, T>,
    ) -> Result<(), Reject> {
        self.roster.check_seq(from, seq)?;
        if local_steps == 0 {
            return Err(Reject::Unexpected { kind: "Delta with local_steps = 0" });
        }
        if round > self.version {
            return Err(Reject::FutureVersion { claimed: round, current: self.version });
        }
        let dim = self.dim();
        let clip = self.config.gradient_policy.admit(&values, dim)?;
        let weight = clip.to_f64() * self.config.delta_scaling.factor(self.config.workers, local_steps);
        let acc = self.acc.as_mut().get_mut(..dim).ok_or(Reject::Capacity)?;
        // Cannot fail: the length was checked by `admit`.
        values.scaled_add_into(acc, T::from_f64(weight))?;
        self.roster.commit_seq(from, seq);
        self.start_clock(now);
        self.stats.accepted += 1;
        self.stats.applied += 1;
        self.got.insert(from);
        self.deltas = self.deltas.saturating_add(1);
        self.queue.push(ServerItem::Event(ServerEvent::Applied {
            worker: from,
            base: round,
            version: self.version.next(),
            staleness: round.lag_behind(self.version),
            weight,
        }));
        self.close_if_complete(now);
        self.queue.push(ServerItem::PushAck { to: from, round: self.version, pull_now: round < self.version });
        Ok(())
    }

    fn on_pull(&mut self, from: WorkerId, have: Version) -> Result<(), Reject> {
        if have > self.version {
            return Err(Reject::FutureVersion { claimed: have, current: self.version });
        }
        if have < self.version {
            self.queue.push(ServerItem::Model { to: Recipient::Worker(from) });
        } else {
            self.queue.push(ServerItem::NotNewer { to: from, version: self.version });
        }
        Ok(())
    }
}

impl<T: Scalar, S: Buffer<T>> Server<T> for WbspServer<T, S> {
    fn handle(&mut self, now: Instant, from: WorkerId, msg: ToServer<'_, T>) -> Result<(), Reject> {
        let result = self.queue.ensure_room(4).and_then(|()| {
            self.roster.check_member(from)?;
            match msg {
                ToServer::Join { epoch } => self.on_join(now, from, epoch),
                ToServer::Delta { round, local_steps, seq, values } => {
                    self.on_delta(now, from, round, local_steps, seq, values)
                }
                ToServer::Pull { have, .. } => self.on_pull(from, have),
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
        self.queue.ensure_room(2)?;
        if self.roster.lose(worker) {
            self.queue.push(ServerItem::Event(ServerEvent::WorkerLost { worker }));
            self.close_if_complete(now);
        }
        Ok(())
    }

    fn handle_timeout(&mut self, now: Instant) {
        let Some(deadline) = self.poll_timeout() else {
            return;
        };
        // Room for one event per worker and the update; a caller that did not drain gets the
        // deadline again on its next call.
        if now < deadline || self.queue.ensure_room(self.roster.n() + 1).is_err() {
            return;
        }
        while let Some(worker) = self.first_missing_live() {
            self.roster.lose(worker);
            self.queue.push(ServerItem::Event(ServerEvent::WorkerLost { worker }));
        }
        self.close_if_complete(now);
    }

    fn poll_output(&mut self) -> Option<ServerOutput<'_, T>> {
        self.queue.poll(self.version, self.version.0, self.params.as_ref())
    }

    /// The round deadline, while a round is open with a live worker missing.
    fn poll_timeout(&self) -> Option<Instant> {
        let (Some(deadline), Some(started)) = (self.config.round_deadline, self.round_started) else {
            return None;
        };
        self.first_missing_live().map(|_| started + deadline)
    }

    fn stop(&mut self) {
        self.round_started = None;
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
