//! BSP, bulk synchronous parallel: the baseline every other protocol is measured against.
//!
//! Rules (PROTOCOLS.md §2): the server holds model `w_v`; every worker computes one gradient
//! at `w_v` and sends it; when all `n` gradients of version `v` are in, the server applies
//! `w_{v+1} = w_v − η · (1/n) Σ g_i`, increments the version and broadcasts the new model.
//! Workers block between sending a gradient and receiving the next model (they are
//! [`GradientWorker`](super::GradientWorker)s).
//!
//! Invariants (tested): each update averages exactly one gradient from each of the `n`
//! workers, all computed at the same version, counted by distinct worker, never by message
//! count; nothing valid is dropped except a gradient for an already-closed version
//! ([`DropReason::Stale`], possible only through reordering or a retransmission).
//!
//! Liveness: BSP waits for every worker, including a dead one; that is the protocol. With
//! [`BspConfig::stall_report`] set, the server emits [`ServerEvent::Stalled`] naming the
//! worker it waits for, once per interval, so the stall is never silent.
//!
//! Messages: receives `Join`, `Grad`, `Leave`; sends `Model` (to a joiner, then broadcast
//! after each update) and `Stop`.
//!
//! Aggregation sums gradients in arrival order. Floating-point addition is not associative,
//! so two arrival orders can differ in the last bits; with exactly representable test data
//! (integers, a power-of-two learning rate and worker count) every order gives the same bits.

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

/// Settings of a [`BspServer`].
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct BspConfig {
    /// The number of workers `n` (ids `0..n`).
    pub workers: u32,
    /// The learning rate `η`.
    pub learning_rate: f64,
    /// Screening of incoming gradients.
    pub gradient_policy: GradientPolicy,
    /// Report a [`ServerEvent::Stalled`] after this long without progress (and again every
    /// interval); `None` never reports.
    pub stall_report: Option<Duration>,
}

impl BspConfig {
    /// `n` workers, learning rate `η`, no norm bound, no stall reports.
    pub fn new(workers: u32, learning_rate: f64) -> Self {
        Self { workers, learning_rate, gradient_policy: GradientPolicy::default(), stall_report: None }
    }
}

pub(crate) fn check_learning_rate(lr: f64) -> Result<(), ConfigError> {
    if lr.is_finite() && lr > 0.0 { Ok(()) } else { Err(ConfigError::LearningRate) }
}

/// The aggregation state of one synchronous iteration: which workers contributed, with
/// which weight, into an accumulator. Shared by BSP, backup workers and group servers.
#[derive(Clone, Debug)]
pub(crate) struct Round {
    pub(crate) got: WorkerSet,
    factors: [f64; MAX_WORKERS],
}

impl Round {
    pub(crate) fn new() -> Self {
        Self { got: WorkerSet::EMPTY, factors: [1.0; MAX_WORKERS] }
    }

    /// Adds `factor * values` into `acc` for `worker` (already checked not to be in `got`).
    pub(crate) fn add<T: Scalar>(
        &mut self,
        worker: WorkerId,
        values: &Values<'_, T>,
        factor: T,
        acc: &mut [T],
    ) -> Result<(), Reject> {
        if factor == T::one() {
            values.add_into(acc)?;
        } else {
            values.scaled_add_into(acc, factor)?;
        }
        self.got.insert(worker);
        if let Some(f) = self.factors.get_mut(worker.index()) {
            *f = factor.to_f64();
        }
        Ok(())
    }

    /// Closes the round: `params -= lr/k * acc`, `acc = 0`, queues an `Applied` event per
    /// contributor (in id order) and a `ModelUpdated`. Returns the new version.
    pub(crate) fn close<T: Scalar>(
        &mut self,
        params: &mut [T],
        acc: &mut [T],
        learning_rate: f64,
        base: Version,
        queue: &mut ServerQueue,
        stats: &mut ServerStats,
    ) -> Version {
        let k = self.got.len().max(1);
        let version = base.next();
        // Lengths were fixed at construction; a mismatch is impossible here.
        let _ = math::apply_and_clear(params, T::from_f64(-learning_rate / k as f64), acc);
        for worker in self.got.iter() {
            let factor = self.factors.get(worker.index()).copied().unwrap_or(1.0);
            queue.push(ServerItem::Event(ServerEvent::Applied {
                worker,
                base,
                version,
                staleness: 0,
                weight: factor / k as f64,
            }));
        }
        stats.applied += k as u64;
        stats.updates += 1;
        queue.push(ServerItem::Event(ServerEvent::ModelUpdated { version, contributions: k as u32 }));
        self.got.clear();
        version
    }
}

/// The BSP server. `S` is the caller's storage for the model and the accumulator.
#[derive(Debug)]
pub struct BspServer<T, S> {
    config: BspConfig,
    params: S,
    acc: S,
    version: Version,
    round: Round,
    roster: Roster,
    stall: StallWatch,
    stats: ServerStats,
    queue: ServerQueue,
    _t: PhantomData<T>,
}

impl<T: Scalar, S: Buffer<T>> BspServer<T, S> {
    /// A server starting from the model in `params` at version 0. `acc` is scratch space of
    /// the same length (its contents are overwritten).
    pub fn new(config: BspConfig, params: S, acc: S) -> Result<Self, ConfigError> {
        Self::resume(config, params, acc, Version::ZERO)
    }

    /// A server resuming from a checkpoint: `params` is the model at `version`.
    pub fn resume(config: BspConfig, params: S, mut acc: S, version: Version) -> Result<Self, ConfigError> {
        check_learning_rate(config.learning_rate)?;
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
        let mut stall = StallWatch::new(config.stall_report);
        stall.progress(Instant::ZERO);
        Ok(Self {
            config,
            params,
            acc,
            version,
            round: Round::new(),
            roster,
            stall,
            stats: ServerStats::default(),
            queue: ServerQueue::new(),
            _t: PhantomData,
        })
    }

    /// The settings.
    pub fn config(&self) -> &BspConfig {
        &self.config
    }

    /// Workers whose gradient for the current version is in.
    pub fn received(&self) -> &WorkerSet {
        &self.round.got
    }

    fn dim(&self) -> usize {
        self.params.as_ref().len()
    }

    fn on_join(&mut self, from: WorkerId, epoch: u32) -> Result<(), Reject> {
        let fresh = self.roster.check_join(from, epoch)?;
        self.roster.commit_join(from, epoch);
        if fresh {
            self.queue.push(ServerItem::Event(ServerEvent::WorkerJoined { worker: from, epoch }));
        }
        self.queue.push(ServerItem::Model { to: Recipient::Worker(from) });
        Ok(())
    }

    fn on_grad(
        &mut self,
        now: Instant,
        from: WorkerId,
        base: Version,
        seq: u64,
        values: Values<'_, T>,
    ) -> Result<(), Reject> {
        self.roster.check_seq(from, seq)?;
        let factor = self.config.gradient_policy.admit(&values, self.dim())?;
        if base > self.version {
            return Err(Reject::FutureVersion { claimed: base, current: self.version });
        }
        if base == self.version && self.round.got.contains(from) {
            return Err(Reject::Duplicate { worker: from, seq });
        }
        self.roster.commit_seq(from, seq);
        self.stats.accepted += 1;
        if base < self.version {
            self.stats.count_drop(DropReason::Stale);
            self.queue.push(ServerItem::Event(ServerEvent::Dropped { worker: from, base, reason: DropReason::Stale }));
            return Ok(());
        }
        let dim = self.dim();
        let acc = self.acc.as_mut().get_mut(..dim).ok_or(Reject::Capacity)?;
        self.round.add(from, &values, factor, acc)?;
        if self.round.got.len() == self.roster.n() {
            let acc = self.acc.as_mut().get_mut(..dim).ok_or(Reject::Capacity)?;
            self.version = self.round.close(
                self.params.as_mut(),
                acc,
                self.config.learning_rate,
                self.version,
                &mut self.queue,
                &mut self.stats,
            );
            self.queue.push(ServerItem::Model { to: Recipient::AllWorkers });
        }
        self.stall.progress(now);
        Ok(())
    }
}

impl<T: Scalar, S: Buffer<T>> Server<T> for BspServer<T, S> {
    fn handle(&mut self, now: Instant, from: WorkerId, msg: ToServer<'_, T>) -> Result<(), Reject> {
        let result = self.queue.ensure_room(2 * self.roster.n() + 4).and_then(|()| {
            self.roster.check_member(from)?;
            match msg {
                ToServer::Join { epoch } => self.on_join(from, epoch),
                ToServer::Grad { base, seq, values, .. } => self.on_grad(now, from, base, seq, values),
                ToServer::Leave => self.handle_worker_lost(now, from),
                other => Err(Reject::Unexpected { kind: other.kind_name() }),
            }
        });
        if result.is_err() {
            self.stats.rejected += 1;
        }
        result
    }

    fn handle_worker_lost(&mut self, _now: Instant, worker: WorkerId) -> Result<(), Reject> {
        self.roster.check_member(worker)?;
        if self.roster.lose(worker) {
            self.queue.push(ServerItem::Event(ServerEvent::WorkerLost { worker }));
        }
        Ok(())
    }

    fn handle_timeout(&mut self, now: Instant) {
        if self.stall.due(now) {
            if let Some(waiting_for) = self.round.got.first_missing(self.roster.n()) {
                let missing = (self.roster.n() - self.round.got.len()) as u32;
                self.queue.push(ServerItem::Event(ServerEvent::Stalled {
                    waiting_for,
                    missing,
                    since: self.stall.since(),
                }));
            }
        }
    }

    fn poll_output(&mut self) -> Option<ServerOutput<'_, T>> {
        self.queue.poll(self.version, self.version.0, self.params.as_ref())
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
