//! ASP, asynchronous parallel: the other baseline, and the limit of the bounded schemes.
//!
//! Rules (PROTOCOLS.md §1): on `Grad{base, g}` from worker `i` the server immediately sets
//! `w ← w − η g`, `v ← v + 1`, and replies `Model{v, w}` to worker `i` only. Nothing valid
//! is dropped; staleness `v − 1 − base` is unbounded (it is reported in every `Applied`
//! event).
//!
//! Invariants (tested): every admitted gradient is applied exactly once (per-worker
//! sequence numbers refuse duplicates and replays); the version grows by one per gradient.
//!
//! Messages: receives `Join`, `Grad`, `Leave`; sends `Model` (to the joiner, then to each
//! sender after its update) and `Stop`. Workers are [`GradientWorker`](super::GradientWorker)s.
//! A lost worker costs nothing: the others never wait for it.

use super::bsp::check_learning_rate;
use super::queue::{ServerItem, ServerQueue};
use super::roster::Roster;
use super::{Buffer, GradientPolicy, Recipient, Server, ServerEvent, ServerOutput, ServerStats};
use crate::error::{ConfigError, Reject};
use crate::id::{Version, WorkerId};
use crate::math::Scalar;
use crate::msg::{ToServer, Values};
use crate::time::Instant;
use core::marker::PhantomData;

/// Settings of an [`AspServer`].
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct AspConfig {
    /// The number of workers `n` (ids `0..n`).
    pub workers: u32,
    /// The learning rate `η` applied to each gradient.
    pub learning_rate: f64,
    /// Screening of incoming gradients.
    pub gradient_policy: GradientPolicy,
}

impl AspConfig {
    /// `n` workers, learning rate `η`, no norm bound.
    pub fn new(workers: u32, learning_rate: f64) -> Self {
        Self { workers, learning_rate, gradient_policy: GradientPolicy::default() }
    }
}

/// The ASP server. `S` is the caller's storage for the model.
#[derive(Debug)]
pub struct AspServer<T, S> {
    config: AspConfig,
    params: S,
    version: Version,
    roster: Roster,
    stats: ServerStats,
    queue: ServerQueue,
    _t: PhantomData<T>,
}

impl<T: Scalar, S: Buffer<T>> AspServer<T, S> {
    /// A server starting from the model in `params` at version 0.
    pub fn new(config: AspConfig, params: S) -> Result<Self, ConfigError> {
        Self::resume(config, params, Version::ZERO)
    }

    /// A server resuming from a checkpoint: `params` is the model at `version`.
    pub fn resume(config: AspConfig, params: S, version: Version) -> Result<Self, ConfigError> {
        check_learning_rate(config.learning_rate)?;
        let roster = Roster::new(config.workers)?;
        if params.as_ref().is_empty() {
            return Err(ConfigError::EmptyModel);
        }
        Ok(Self {
            config,
            params,
            version,
            roster,
            stats: ServerStats::default(),
            queue: ServerQueue::new(),
            _t: PhantomData,
        })
    }

    /// The settings.
    pub fn config(&self) -> &AspConfig {
        &self.config
    }

    fn on_grad(&mut self, from: WorkerId, base: Version, seq: u64, values: Values<'_, T>) -> Result<(), Reject> {
        self.roster.check_seq(from, seq)?;
        let factor = self.config.gradient_policy.admit(&values, self.params.as_ref().len())?;
        if base > self.version {
            return Err(Reject::FutureVersion { claimed: base, current: self.version });
        }
        self.roster.commit_seq(from, seq);
        self.stats.accepted += 1;
        let scale = T::from_f64(-self.config.learning_rate) * factor;
        values.scaled_add_into(self.params.as_mut(), scale)?;
        let staleness = base.lag_behind(self.version);
        self.version = self.version.next();
        self.stats.applied += 1;
        self.stats.updates += 1;
        let version = self.version;
        self.queue.push(ServerItem::Event(ServerEvent::Applied {
            worker: from,
            base,
            version,
            staleness,
            weight: factor.to_f64(),
        }));
        self.queue.push(ServerItem::Event(ServerEvent::ModelUpdated { version, contributions: 1 }));
        self.queue.push(ServerItem::Model { to: Recipient::Worker(from) });
        Ok(())
    }
}

impl<T: Scalar, S: Buffer<T>> Server<T> for AspServer<T, S> {
    fn handle(&mut self, now: Instant, from: WorkerId, msg: ToServer<'_, T>) -> Result<(), Reject> {
        let result = self.queue.ensure_room(4).and_then(|()| {
            self.roster.check_member(from)?;
            match msg {
                ToServer::Join { epoch } => {
                    let fresh = self.roster.check_join(from, epoch)?;
                    self.roster.commit_join(from, epoch);
                    if fresh {
                        self.queue.push(ServerItem::Event(ServerEvent::WorkerJoined { worker: from, epoch }));
                    }
                    self.queue.push(ServerItem::Model { to: Recipient::Worker(from) });
                    Ok(())
                }
                ToServer::Grad { base, seq, values, .. } => self.on_grad(from, base, seq, values),
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

    fn handle_timeout(&mut self, _now: Instant) {}

    fn poll_output(&mut self) -> Option<ServerOutput<'_, T>> {
        self.queue.poll(self.version, self.version.0, self.params.as_ref())
    }

    fn poll_timeout(&self) -> Option<Instant> {
        None
    }

    fn stop(&mut self) {
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
    use crate::proto::{DropReason, ServerOutput};
    use proptest::prelude::*;
    use std::vec;
    use std::vec::Vec;

    fn grad(base: u64, seq: u64, values: &[f64]) -> ToServer<'_, f64> {
        ToServer::Grad { base: Version(base), iteration: 0, seq, values: Values::Slice(values) }
    }

    #[test]
    fn applies_on_arrival_and_replies_to_the_sender_only() {
        let mut s: AspServer<f64, Vec<f64>> = AspServer::new(AspConfig::new(3, 0.25), vec![1.0; 2]).unwrap();
        s.handle(Instant::ZERO, WorkerId(2), grad(0, 0, &[4.0, -4.0])).unwrap();
        s.handle(Instant::ZERO, WorkerId(1), grad(0, 0, &[4.0, 4.0])).unwrap();
        assert_eq!(s.version(), Version(2));
        assert_eq!(s.params(), &[-1.0, 1.0]);
        let mut seen = Vec::new();
        while let Some(out) = s.poll_output() {
            match out {
                ServerOutput::Send { to, .. } => seen.push(to),
                ServerOutput::Event(ServerEvent::Applied { worker, staleness, .. }) => {
                    assert_eq!(staleness, if worker == WorkerId(1) { 1 } else { 0 });
                }
                ServerOutput::Event(_) => {}
            }
        }
        assert_eq!(seen, [Recipient::Worker(WorkerId(2)), Recipient::Worker(WorkerId(1))]);
        assert_eq!(s.stats().dropped_for(DropReason::Stale), 0);
    }

    #[test]
    fn refusals_change_nothing() {
        let mut s: AspServer<f32, Vec<f32>> = AspServer::new(AspConfig::new(2, 0.5), vec![0.0; 2]).unwrap();
        let g =
            |seq, v: &'static [f32]| ToServer::Grad { base: Version(0), iteration: 0, seq, values: Values::Slice(v) };
        s.handle(Instant::ZERO, WorkerId(0), g(0, &[1.0, 1.0])).unwrap();
        while s.poll_output().is_some() {}
        let before = (s.params().to_vec(), s.version());
        assert!(matches!(s.handle(Instant::ZERO, WorkerId(0), g(0, &[1.0, 1.0])), Err(Reject::Duplicate { .. })));
        assert!(matches!(s.handle(Instant::ZERO, WorkerId(9), g(5, &[1.0, 1.0])), Err(Reject::UnknownWorker(_))));
        assert!(matches!(s.handle(Instant::ZERO, WorkerId(1), g(0, &[1.0])), Err(Reject::WrongLength(_))));
        assert!(matches!(s.handle(Instant::ZERO, WorkerId(1), g(0, &[f32::NAN, 0.0])), Err(Reject::NotFinite)));
        assert!(matches!(
            s.handle(Instant::ZERO, WorkerId(1), g(0, &[f32::NEG_INFINITY, 0.0])),
            Err(Reject::NotFinite)
        ));
        let future =
            ToServer::Grad { base: Version(9), iteration: 0, seq: 1, values: Values::Slice(&[0.0f32, 0.0][..]) };
        assert!(matches!(s.handle(Instant::ZERO, WorkerId(1), future), Err(Reject::FutureVersion { .. })));
        assert_eq!((s.params().to_vec(), s.version()), before);
        assert!(s.poll_output().is_none());
    }

    proptest! {
        /// Every valid gradient is applied exactly once, replays and duplicates never; the
        /// final model is the initial one minus η times the sum of the admitted gradients.
        #[test]
        fn every_valid_gradient_applied_exactly_once(
            sends in proptest::collection::vec((0u32..4, -50i32..50, 0u8..4), 1..120)
        ) {
            let mut s: AspServer<f64, Vec<f64>> = AspServer::new(AspConfig::new(4, 0.5), vec![0.0; 1]).unwrap();
            let mut next_seq = [0u64; 4];
            let mut sent: Vec<(u32, u64, f64)> = Vec::new();
            let mut expected = 0.0f64;
            let mut applied_events = 0u64;
            for (w, g, action) in sends {
                let x = f64::from(g);
                // action 0: replay an earlier message of this worker (if any); otherwise a new one.
                let (seq, value, fresh) = match sent.iter().rev().find(|m| m.0 == w) {
                    Some(m) if action == 0 => (m.1, m.2, false),
                    _ => { let q = next_seq[w as usize]; next_seq[w as usize] += 1; (q, x, true) }
                };
                let result = s.handle(Instant::ZERO, WorkerId(w), grad(s.version().0, seq, &[value]));
                prop_assert_eq!(result.is_ok(), fresh);
                if fresh { sent.push((w, seq, value)); expected -= 0.5 * value; }
                while let Some(out) = s.poll_output() {
                    if let ServerOutput::Event(ServerEvent::Applied { .. }) = out { applied_events += 1; }
                }
            }
            prop_assert_eq!(applied_events, sent.len() as u64);
            prop_assert_eq!(s.version(), Version(sent.len() as u64));
            prop_assert_eq!(s.params(), &[expected][..]);
        }
    }
}
