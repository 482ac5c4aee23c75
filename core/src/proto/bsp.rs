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
        self.record(worker, factor);
        Ok(())
    }

    /// Records `worker`'s contribution with `factor` whose values the caller already added
    /// (the fused path: [`GradientPolicy::admit_add_to`] into a spare accumulator).
    pub(crate) fn record<T: Scalar>(&mut self, worker: WorkerId, factor: T) {
        self.got.insert(worker);
        if let Some(f) = self.factors.get_mut(worker.index()) {
            *f = factor.to_f64();
        }
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
        // Lengths were fixed at construction; a mismatch is impossible here.
        let _ = math::apply_and_clear(params, Self::rate(learning_rate, self.got.len()), acc);
        self.finish(base, queue, stats)
    }

    /// The update's factor `−lr/k` for `k` contributions (at least 1).
    fn rate<T: Scalar>(learning_rate: f64, k: usize) -> T {
        T::from_f64(-learning_rate / k.max(1) as f64)
    }

    /// [`Self::add`] of the round's last gradient fused with [`Self::close`]: one pass does
    /// `params += a · (acc + factor · values); acc = 0` (the bits of the two calls, one pass
    /// over the accumulator fewer). `worker` is not in `got`. On `Err` (a length mismatch)
    /// nothing changed.
    #[allow(clippy::too_many_arguments)]
    pub(crate) fn add_and_close<T: Scalar>(
        &mut self,
        worker: WorkerId,
        values: &Values<'_, T>,
        factor: T,
        params: &mut [T],
        acc: &mut [T],
        learning_rate: f64,
        base: Version,
        queue: &mut ServerQueue,
        stats: &mut ServerStats,
    ) -> Result<Version, Reject> {
        let k = self.got.len() + usize::from(!self.got.contains(worker));
        values.add_apply_and_clear(factor, params, Self::rate(learning_rate, k), acc)?;
        self.record(worker, factor);
        Ok(self.finish(base, queue, stats))
    }

    /// The bookkeeping of a close once the update is applied: events, stats, next version.
    fn finish(&mut self, base: Version, queue: &mut ServerQueue, stats: &mut ServerStats) -> Version {
        let k = self.got.len().max(1);
        let version = base.next();
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
    /// Optional second accumulator for the fused admission (see
    /// [`BspServer::with_spare_accumulator`]).
    spare: Option<S>,
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
            spare: None,
            version,
            round: Round::new(),
            roster,
            stall,
            stats: ServerStats::default(),
            queue: ServerQueue::new(),
            _t: PhantomData,
        })
    }

    /// Gives the server a second accumulator (at least the model's length; its contents
    /// are never read) so that each gradient costs one pass instead of two: admission
    /// (length, finiteness, norm) and accumulation run fused, writing `spare = acc + g`,
    /// and the two buffers swap when the gradient is accepted. A refused gradient still
    /// changes nothing (the accumulator is never written before the verdict) and the
    /// result has the same bits as without a spare. Costs `d` more elements of memory.
    pub fn with_spare_accumulator(mut self, spare: S) -> Result<Self, ConfigError> {
        let (dim, given) = (self.dim(), spare.as_ref().len());
        if given < dim {
            return Err(ConfigError::ScratchTooSmall { needed: dim, given });
        }
        self.spare = Some(spare);
        Ok(self)
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
        let dim = self.dim();
        if base == self.version && !self.round.got.contains(from) && self.round.got.len() + 1 == self.needed() {
            // The round's last gradient: admission (the verdict of either path below), then
            // the accumulation folded into the update, one pass over the accumulator fewer.
            let factor = self.config.gradient_policy.admit(&values, dim)?;
            let acc = self.acc.as_mut().get_mut(..dim).ok_or(Reject::Capacity)?;
            self.version = self.round.add_and_close(
                from,
                &values,
                factor,
                self.params.as_mut(),
                acc,
                self.config.learning_rate,
                self.version,
                &mut self.queue,
                &mut self.stats,
            )?;
            self.roster.commit_seq(from, seq);
            self.stats.accepted += 1;
            self.queue.push(ServerItem::Model { to: Recipient::AllWorkers });
            self.stall.progress(now);
            return Ok(());
        }
        if let Some(spare) = self.spare.as_mut().filter(|_| base == self.version && !self.round.got.contains(from)) {
            // Fused: the only checks left after admission pass here, so the verdict (and any
            // refusal) is the one of the two-pass path below.
            let (acc, out) = (self.acc.as_ref().get(..dim), spare.as_mut().get_mut(..dim));
            let (Some(acc), Some(out)) = (acc, out) else { return Err(Reject::Capacity) };
            let (factor, _) = self.config.gradient_policy.admit_add_to(&values, acc, out)?;
            core::mem::swap(&mut self.acc, spare);
            self.roster.commit_seq(from, seq);
            self.stats.accepted += 1;
            self.round.record(from, factor);
            return self.after_add(now, dim);
        }
        let factor = self.config.gradient_policy.admit(&values, dim)?;
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
        let acc = self.acc.as_mut().get_mut(..dim).ok_or(Reject::Capacity)?;
        self.round.add(from, &values, factor, acc)?;
        self.after_add(now, dim)
    }

    /// Gradients that complete a round.
    fn needed(&self) -> usize {
        #[allow(unused_mut)]
        let mut needed = self.roster.n();
        // CANARY (planted bug, test builds only): the round closes one gradient short.
        #[cfg(feature = "_canary")]
        if crate::canary::is_on(crate::canary::Canary::RoundClosesEarly) {
            needed = needed.saturating_sub(1).max(1);
        }
        needed
    }

    /// After a gradient went into the round: closes it when complete.
    fn after_add(&mut self, now: Instant, dim: usize) -> Result<(), Reject> {
        if self.round.got.len() == self.needed() {
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

#[cfg(test)]
mod tests {
    use super::*;
    use crate::proto::{LargeGradient, ServerOutput, ToWorkerOwned};
    use proptest::prelude::*;
    use std::vec;
    use std::vec::Vec;

    fn server(n: u32, dim: usize) -> BspServer<f64, Vec<f64>> {
        BspServer::new(BspConfig::new(n, 0.5), vec![1.0; dim], vec![0.0; dim]).unwrap()
    }

    fn grad(base: u64, seq: u64, values: &[f64]) -> ToServer<'_, f64> {
        ToServer::Grad { base: Version(base), iteration: 0, seq, values: Values::Slice(values) }
    }

    fn drain(s: &mut BspServer<f64, Vec<f64>>) -> (Vec<ServerEvent>, Vec<(Recipient, ToWorkerOwned)>) {
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
    fn one_round_applies_the_mean_and_broadcasts() {
        let mut s = server(2, 2);
        s.handle(Instant::ZERO, WorkerId(0), grad(0, 0, &[2.0, 4.0])).unwrap();
        assert_eq!(s.version(), Version(0));
        s.handle(Instant::ZERO, WorkerId(1), grad(0, 0, &[4.0, 8.0])).unwrap();
        assert_eq!(s.version(), Version(1));
        // w = 1 - 0.5 * mean([2,4],[4,8]) = 1 - 0.5*[3,6]
        assert_eq!(s.params(), &[-0.5, -2.0]);
        let (events, sends) = drain(&mut s);
        let applied: Vec<_> = events.iter().filter(|e| matches!(e, ServerEvent::Applied { .. })).collect();
        assert_eq!(applied.len(), 2);
        assert!(events.contains(&ServerEvent::ModelUpdated { version: Version(1), contributions: 2 }));
        assert_eq!(sends.len(), 1);
        assert_eq!(sends[0].0, Recipient::AllWorkers);
        assert_eq!(sends[0].1, ToWorkerOwned::Model { version: 1, clock: 1, values: vec![-0.5, -2.0] });
    }

    #[test]
    fn refusals_change_nothing() {
        let mut s = server(2, 2);
        s.handle(Instant::ZERO, WorkerId(0), grad(0, 3, &[1.0, 1.0])).unwrap();
        let _ = drain(&mut s);
        let before = (s.params().to_vec(), s.version(), *s.received());
        let now = Instant::ZERO;
        assert_eq!(
            s.handle(now, WorkerId(0), grad(0, 3, &[1.0, 1.0])),
            Err(Reject::Duplicate { worker: WorkerId(0), seq: 3 })
        );
        assert_eq!(
            s.handle(now, WorkerId(0), grad(0, 2, &[1.0, 1.0])),
            Err(Reject::Duplicate { worker: WorkerId(0), seq: 2 })
        );
        assert_eq!(
            s.handle(now, WorkerId(0), grad(0, 4, &[1.0, 1.0])),
            Err(Reject::Duplicate { worker: WorkerId(0), seq: 4 })
        );
        assert_eq!(s.handle(now, WorkerId(2), grad(0, 0, &[1.0, 1.0])), Err(Reject::UnknownWorker(WorkerId(2))));
        assert_eq!(
            s.handle(now, WorkerId(u32::MAX), grad(0, 0, &[1.0, 1.0])),
            Err(Reject::UnknownWorker(WorkerId(u32::MAX)))
        );
        assert!(matches!(s.handle(now, WorkerId(1), grad(0, 0, &[1.0])), Err(Reject::WrongLength(_))));
        assert_eq!(s.handle(now, WorkerId(1), grad(0, 0, &[f64::NAN, 1.0])), Err(Reject::NotFinite));
        assert_eq!(s.handle(now, WorkerId(1), grad(0, 0, &[f64::INFINITY, 1.0])), Err(Reject::NotFinite));
        assert_eq!(
            s.handle(now, WorkerId(1), grad(7, 0, &[1.0, 1.0])),
            Err(Reject::FutureVersion { claimed: Version(7), current: Version(0) })
        );
        assert_eq!(
            s.handle(now, WorkerId(1), ToServer::Pull { have: Version(0), min_clock: 0 }),
            Err(Reject::Unexpected { kind: "Pull" })
        );
        let le = [0u8; 15];
        assert!(matches!(
            s.handle(
                now,
                WorkerId(1),
                ToServer::Grad { base: Version(0), iteration: 0, seq: 0, values: Values::LittleEndian(&le) }
            ),
            Err(Reject::WrongLength(_))
        ));
        assert_eq!((s.params().to_vec(), s.version(), *s.received()), before);
        assert!(s.poll_output().is_none());
        assert_eq!(s.stats().rejected, 11);
        assert_eq!(s.stats().accepted, 1);
    }

    #[test]
    fn stale_gradient_is_dropped_with_an_event() {
        let mut s = server(1, 1);
        s.handle(Instant::ZERO, WorkerId(0), grad(0, 0, &[1.0])).unwrap();
        let _ = drain(&mut s);
        s.handle(Instant::ZERO, WorkerId(0), grad(0, 1, &[1.0])).unwrap();
        let (events, sends) = drain(&mut s);
        assert_eq!(events, [ServerEvent::Dropped { worker: WorkerId(0), base: Version(0), reason: DropReason::Stale }]);
        assert!(sends.is_empty());
        assert_eq!(s.stats().dropped_for(DropReason::Stale), 1);
    }

    #[test]
    fn stall_is_reported_naming_the_missing_worker() {
        let mut cfg = BspConfig::new(3, 0.5);
        cfg.stall_report = Some(Duration::from_secs(1));
        let mut s: BspServer<f32, Vec<f32>> = BspServer::new(cfg, vec![0.0; 1], vec![0.0; 1]).unwrap();
        s.handle(
            Instant::ZERO,
            WorkerId(0),
            ToServer::Grad { base: Version(0), iteration: 0, seq: 0, values: Values::Slice(&[1.0]) },
        )
        .unwrap();
        s.handle_worker_lost(Instant::ZERO, WorkerId(1)).unwrap();
        while s.poll_output().is_some() {}
        let at = s.poll_timeout().unwrap();
        assert_eq!(at, Instant::ZERO + Duration::from_secs(1));
        s.handle_timeout(at);
        let out = s.poll_output();
        assert!(matches!(
            out,
            Some(ServerOutput::Event(ServerEvent::Stalled { waiting_for: WorkerId(1), missing: 2, .. }))
        ));
        assert!(s.poll_timeout().unwrap() > at);
    }

    #[test]
    fn join_answers_with_the_model_and_rejects_stale_epochs() {
        let mut s = server(2, 1);
        s.handle(Instant::ZERO, WorkerId(1), ToServer::Join { epoch: 2 }).unwrap();
        let (events, sends) = drain(&mut s);
        assert_eq!(events, [ServerEvent::WorkerJoined { worker: WorkerId(1), epoch: 2 }]);
        assert_eq!(sends[0].0, Recipient::Worker(WorkerId(1)));
        assert_eq!(
            s.handle(Instant::ZERO, WorkerId(1), ToServer::Join { epoch: 1 }),
            Err(Reject::StaleEpoch { worker: WorkerId(1), epoch: 1 })
        );
    }

    #[test]
    fn config_errors() {
        let bad =
            |c: BspConfig, p: usize, a: usize| BspServer::<f32, Vec<f32>>::new(c, vec![0.0; p], vec![0.0; a]).err();
        assert_eq!(bad(BspConfig::new(0, 0.1), 1, 1), Some(ConfigError::WorkerCount(0)));
        assert_eq!(bad(BspConfig::new(1, f64::NAN), 1, 1), Some(ConfigError::LearningRate));
        assert_eq!(bad(BspConfig::new(1, -1.0), 1, 1), Some(ConfigError::LearningRate));
        assert_eq!(bad(BspConfig::new(1, 0.1), 0, 1), Some(ConfigError::EmptyModel));
        assert_eq!(bad(BspConfig::new(1, 0.1), 4, 3), Some(ConfigError::ScratchTooSmall { needed: 4, given: 3 }));
    }

    #[test]
    fn spare_accumulator_must_cover_the_model() {
        let cfg = BspConfig::new(2, 0.5);
        let s: BspServer<f32, Vec<f32>> = BspServer::new(cfg, vec![0.0; 3], vec![0.0; 3]).unwrap();
        assert_eq!(
            s.with_spare_accumulator(vec![0.0; 2]).err(),
            Some(ConfigError::ScratchTooSmall { needed: 3, given: 2 })
        );
    }

    proptest! {
        /// With a spare accumulator (fused admission and accumulation) the server behaves
        /// bit for bit as without: the same verdict on every input (refusals included:
        /// wrong length, non-finite, clipped or too large, duplicates, future and stale
        /// versions), the same outputs, the same model.
        #[test]
        fn spare_accumulator_changes_no_bit(
            n in 1u32..5,
            dim in 1usize..40,
            sends in proptest::collection::vec((0u32..5, 0u8..12, -8i32..8, 0u64..3), 1..80),
            reject_large in proptest::bool::ANY,
        ) {
            let mut cfg = BspConfig::new(n, 0.375);
            let on_large = if reject_large { LargeGradient::Reject } else { LargeGradient::Clip };
            cfg.gradient_policy = GradientPolicy { max_norm: Some(20.0), on_large };
            let mk = || BspServer::<f32, Vec<f32>>::new(cfg, vec![0.25; dim], vec![9.0; dim]).unwrap();
            let (mut plain, mut fused) = (mk(), mk().with_spare_accumulator(vec![f32::NAN; dim + 3]).unwrap());
            let mut seqs = [0u64; 5];
            for (w, kind, x, lag) in sends {
                let mut g: Vec<f32> = (0..dim).map(|i| (x as f32) * 0.75 + i as f32 * 0.125).collect();
                match kind {
                    0 => g[dim / 2] = f32::NAN,
                    1 => g[0] = f32::NEG_INFINITY,
                    2 => g.push(1.0),
                    3 => g.iter_mut().for_each(|v| *v *= 1e20),
                    4 => g.iter_mut().for_each(|v| *v *= 50.0),
                    _ => {}
                }
                let seq = if kind == 5 { seqs[w as usize % 5].saturating_sub(1) } else { seqs[w as usize % 5] };
                seqs[w as usize % 5] = seq + 1;
                let base = Version((plain.version().0 + 1).saturating_sub(lag));
                let bytes: Vec<u8> = g.iter().flat_map(|v| v.to_le_bytes()).collect();
                let values = if x % 2 == 0 { Values::Slice(&g[..]) } else { Values::LittleEndian(&bytes[..]) };
                let msg = ToServer::Grad { base, iteration: 0, seq, values };
                let (a, b) = (plain.handle(Instant::ZERO, WorkerId(w), msg), fused.handle(Instant::ZERO, WorkerId(w), msg));
                prop_assert_eq!(a, b);
                loop {
                    let (x, y) = (plain.poll_output(), fused.poll_output());
                    match (x, y) {
                        (None, None) => break,
                        (Some(ServerOutput::Event(e)), Some(ServerOutput::Event(f))) => prop_assert_eq!(e, f),
                        (Some(ServerOutput::Send { to, msg }), Some(ServerOutput::Send { to: t2, msg: m2 })) => {
                            prop_assert_eq!(to, t2);
                            prop_assert_eq!(ToWorkerOwned::from(&msg), ToWorkerOwned::from(&m2));
                        }
                        (x, y) => prop_assert!(false, "outputs differ: {:?} vs {:?}", x, y),
                    }
                }
                let bits = |s: &BspServer<f32, Vec<f32>>| s.params().iter().map(|v| v.to_bits()).collect::<Vec<_>>();
                prop_assert_eq!(bits(&plain), bits(&fused));
                prop_assert_eq!(plain.received(), fused.received());
                prop_assert_eq!(plain.stats(), fused.stats());
            }
        }

        /// The round's last gradient is folded into the update (`params += a·(acc + f·g)`),
        /// with the bits of adding it then applying: the server against a reference built
        /// from the separate kernels, on values that round, clipped or not, slices and
        /// bytes, with and without a spare accumulator; a refused closing gradient (NaN,
        /// ±∞, too large, wrong length) changes nothing, and its clean resend closes.
        #[test]
        fn folded_close_matches_add_then_apply_bitwise(
            n in 1u32..5,
            dim in 1usize..40,
            rounds in proptest::collection::vec(proptest::collection::vec((-1e3f32..1e3, 0u8..10), 4), 1..5),
            spare in proptest::bool::ANY,
            reject_large in proptest::bool::ANY,
        ) {
            let lr = 0.3;
            let mut cfg = BspConfig::new(n, lr);
            let on_large = if reject_large { LargeGradient::Reject } else { LargeGradient::Clip };
            cfg.gradient_policy = GradientPolicy { max_norm: Some(4e3), on_large };
            let mut s = BspServer::<f32, Vec<f32>>::new(cfg, vec![0.7; dim], vec![3.0; dim]).unwrap();
            if spare {
                s = s.with_spare_accumulator(vec![f32::NAN; dim]).unwrap();
            }
            let (mut params, mut acc) = (vec![0.7f32; dim], vec![0.0f32; dim]);
            for (r, round) in rounds.iter().enumerate() {
                for (w, &(x, kind)) in round.iter().take(n as usize).enumerate() {
                    let g: Vec<f32> = (0..dim).map(|i| x * 1.37 + i as f32 * 0.1234567 - 1.0 / 3.0).collect();
                    let closing = w + 1 == n as usize;
                    if closing || kind == 9 {
                        // A refused copy first: nothing changes.
                        let mut bad = g.clone();
                        match kind % 4 {
                            0 => bad[dim / 2] = f32::NAN,
                            1 => bad[dim - 1] = f32::NEG_INFINITY,
                            2 => bad.push(1.0),
                            _ => bad[0] = f32::MAX,
                        }
                        let before = (s.params().to_vec(), s.version(), *s.received(), *s.stats());
                        let msg = ToServer::Grad { base: Version(r as u64), iteration: 0, seq: 2 * r as u64, values: Values::Slice(&bad[..]) };
                        prop_assert!(s.handle(Instant::ZERO, WorkerId(w as u32), msg).is_err());
                        prop_assert!(s.poll_output().is_none());
                        prop_assert_eq!(before.0, s.params().to_vec());
                        prop_assert_eq!((before.1, before.2), (s.version(), *s.received()));
                        prop_assert_eq!(before.3.accepted, s.stats().accepted);
                    }
                    let bytes: Vec<u8> = g.iter().flat_map(|v| v.to_le_bytes()).collect();
                    let values = if kind % 2 == 0 { Values::Slice(&g[..]) } else { Values::LittleEndian(&bytes[..]) };
                    let f = cfg.gradient_policy.admit(&values, dim);
                    let msg = ToServer::Grad { base: Version(r as u64), iteration: 0, seq: 2 * r as u64 + 1, values };
                    let got = s.handle(Instant::ZERO, WorkerId(w as u32), msg);
                    prop_assert_eq!(got.is_ok(), f.is_ok());
                    let Ok(f) = f else { return Ok(()) };
                    if f == 1.0 { values.add_into(&mut acc).unwrap() } else { values.scaled_add_into(&mut acc, f).unwrap() }
                    if closing {
                        math::apply_and_clear(&mut params, f32::from_f64(-lr / f64::from(n)), &mut acc).unwrap();
                        prop_assert_eq!(s.version(), Version(r as u64 + 1));
                    }
                    let bits = |v: &[f32]| v.iter().map(|x| x.to_bits()).collect::<Vec<_>>();
                    prop_assert_eq!(bits(s.params()), bits(&params));
                    while s.poll_output().is_some() {}
                }
            }
            prop_assert_eq!(s.stats().updates, s.version().0);
        }

        /// BSP applies exactly the mean of the n gradients computed at version v, once per
        /// version, whatever the arrival order, duplicates and stale copies in between.
        #[test]
        fn applies_exactly_the_mean_of_n(
            n in 1u32..9,
            dim in 1usize..6,
            rounds in 1usize..5,
            seed in any::<u64>(),
            grads in proptest::collection::vec(-64i32..64, 9 * 6 * 5),
        ) {
            let mut s = server(n, dim);
            let mut reference = vec![1.0f64; dim];
            let mut rng = seed;
            let mut next = || { rng = rng.wrapping_mul(6364136223846793005).wrapping_add(1442695040888963407); rng >> 33 };
            let mut seqs = vec![0u64; n as usize];
            for r in 0..rounds {
                let g = |w: usize, j: usize| f64::from(grads[((r * 9 + w) * 6 + j) % grads.len()]);
                let mut order: Vec<usize> = (0..n as usize).collect();
                for i in (1..order.len()).rev() { order.swap(i, next() as usize % (i + 1)); }
                for (pos, &w) in order.iter().enumerate() {
                    let values: Vec<f64> = (0..dim).map(|j| g(w, j)).collect();
                    prop_assert_eq!(s.version(), Version(r as u64));
                    s.handle(Instant::ZERO, WorkerId(w as u32), grad(r as u64, seqs[w], &values)).unwrap();
                    seqs[w] += 1;
                    // A replay of the same message is refused and changes nothing.
                    let snapshot = s.params().to_vec();
                    prop_assert!(s.handle(Instant::ZERO, WorkerId(w as u32), grad(r as u64, seqs[w] - 1, &values)).is_err());
                    prop_assert_eq!(s.params(), &snapshot[..]);
                    if pos + 1 < order.len() { prop_assert_eq!(s.version(), Version(r as u64)); }
                }
                for (j, p) in reference.iter_mut().enumerate() {
                    let sum: f64 = (0..n as usize).map(|w| g(w, j)).sum();
                    *p += (-0.5 / f64::from(n)) * sum;
                }
                prop_assert_eq!(s.version(), Version(r as u64 + 1));
                prop_assert_eq!(s.params(), &reference[..]);
                let (events, _) = drain(&mut s);
                let mut applied: Vec<u32> = events.iter().filter_map(|e| match e {
                    ServerEvent::Applied { worker, version, staleness: 0, .. } if *version == Version(r as u64 + 1) => Some(worker.0),
                    _ => None,
                }).collect();
                applied.sort_unstable();
                prop_assert_eq!(applied, (0..n).collect::<Vec<_>>());
            }
            prop_assert_eq!(s.stats().applied, u64::from(n) * rounds as u64);
        }

        /// No input sequence panics, and the version only moves when n distinct workers sent a
        /// gradient for the current version.
        #[test]
        fn arbitrary_inputs_never_panic(ops in proptest::collection::vec((0u32..6, 0u64..4, 0u64..6, 0usize..4, -2.0f64..2.0, 0u8..8), 0..200)) {
            let mut s = server(4, 3);
            for (w, base, seq, len, x, kind) in ops {
                let values = match kind { 0 => vec![f64::NAN; len], 1 => vec![f64::INFINITY; len], _ => vec![x; len] };
                let before = s.version();
                let distinct_before = s.received().len();
                let msg = match kind {
                    6 => ToServer::Join { epoch: seq as u32 },
                    7 => ToServer::Leave,
                    _ => grad(base, seq, &values),
                };
                let _ = s.handle(Instant::from_nanos(seq), WorkerId(w), msg);
                if s.version() != before {
                    prop_assert_eq!(s.version(), before.next());
                    prop_assert_eq!(distinct_before, 3);
                }
                prop_assert!(s.params().iter().all(|p| p.is_finite()));
                while s.poll_output().is_some() {}
            }
        }
    }
}
