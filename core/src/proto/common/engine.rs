//! The server engine every protocol shares: the model and its version, the roster, the
//! counters, the output queue and the stall watch ([`ServerCore`]), and the one
//! implementation of the [`Server`] verbs ([`ProtocolServer`]) that screens every input
//! (output room, membership), handles `Leave` and lost workers, counts refusals and drains
//! outputs. A protocol is a [`Rules`] value: the state only it keeps and what it does with a
//! message, a lost worker and a deadline.

use super::queue::{ServerItem, ServerQueue};
use super::roster::Roster;
use super::round::check_learning_rate;
use super::stall::StallWatch;
use crate::error::{ConfigError, Reject};
use crate::id::{Version, WorkerId};
use crate::math::Scalar;
use crate::msg::ToServer;
use crate::proto::{Buffer, Recipient, Server, ServerEvent, ServerOutput, ServerStats};
use crate::time::{Duration, Instant};
use core::marker::PhantomData;

/// The state every server keeps, whatever its protocol.
#[derive(Debug)]
pub struct ServerCore<T, S> {
    /// The model (caller's storage).
    pub(crate) params: S,
    /// Updates applied so far.
    pub(crate) version: Version,
    /// Membership, sessions, deduplication.
    pub(crate) roster: Roster,
    /// What the server received and what became of it.
    pub(crate) stats: ServerStats,
    /// Pending outputs.
    pub(crate) queue: ServerQueue,
    /// Whom the server waits for, and since when.
    pub(crate) stall: StallWatch,
    _t: PhantomData<T>,
}

impl<T: Scalar, S: Buffer<T>> ServerCore<T, S> {
    /// Checks the settings every protocol has and sets up a server whose model `params` is at
    /// `version`. The stall watch starts at time zero.
    pub(crate) fn new(
        workers: u32,
        learning_rate: f64,
        stall_report: Option<Duration>,
        params: S,
        version: Version,
    ) -> Result<Self, ConfigError> {
        check_learning_rate(learning_rate)?;
        let roster = Roster::new(workers)?;
        if params.as_ref().is_empty() {
            return Err(ConfigError::EmptyModel);
        }
        let mut stall = StallWatch::new(stall_report);
        stall.progress(Instant::ZERO);
        Ok(Self {
            params,
            version,
            roster,
            stats: ServerStats::default(),
            queue: ServerQueue::new(),
            stall,
            _t: PhantomData,
        })
    }

    /// The model's length.
    pub(crate) fn dim(&self) -> usize {
        self.params.as_ref().len()
    }

    /// The number of workers, `n`.
    pub(crate) fn n(&self) -> usize {
        self.roster.n()
    }

    /// Queues an event.
    pub(crate) fn event(&mut self, event: ServerEvent) {
        self.queue.push(ServerItem::Event(event));
    }

    /// Queues the current model for `to`.
    pub(crate) fn send_model(&mut self, to: Recipient) {
        self.queue.push(ServerItem::Model { to });
    }

    /// The common part of a `Join`: checks the session, records it, reports a new session.
    /// Returns whether the join was a new session (first join, new epoch, or back from lost).
    /// The protocol then answers (usually with the model).
    pub(crate) fn join(&mut self, from: WorkerId, epoch: u32) -> Result<bool, Reject> {
        let fresh = self.roster.check_join(from, epoch)?;
        self.roster.commit_join(from, epoch);
        if fresh {
            self.event(ServerEvent::WorkerJoined { worker: from, epoch });
        }
        Ok(fresh)
    }

    /// The common answer to a `Join`: [`Self::join`], then the current model to the joiner.
    pub(crate) fn join_and_send_model(&mut self, from: WorkerId, epoch: u32) -> Result<bool, Reject> {
        let fresh = self.join(from, epoch)?;
        self.send_model(Recipient::Worker(from));
        Ok(fresh)
    }
}

/// What makes a protocol: the state only it keeps and its reactions, over a [`ServerCore`].
///
/// [`ProtocolServer`] calls these only after the input passed the common screening (room for
/// [`Self::burst`] outputs, the sender is a member); an `Err` must leave both the rules and
/// the core unchanged.
pub trait Rules<T: Scalar, S: Buffer<T>> {
    /// The most outputs one input can queue (checked before every input, so no push can
    /// find the queue full).
    fn burst(&self, core: &ServerCore<T, S>) -> usize;

    /// A message other than `Leave` from the member `from`.
    fn on_message(
        &mut self,
        core: &mut ServerCore<T, S>,
        now: Instant,
        from: WorkerId,
        msg: ToServer<'_, T>,
    ) -> Result<(), Reject>;

    /// `worker` was declared lost (the roster already marked it and, if it was live, the
    /// [`ServerEvent::WorkerLost`] event is queued).
    fn on_lost(&mut self, core: &mut ServerCore<T, S>, now: Instant, worker: WorkerId, was_live: bool) {
        let _ = (core, now, worker, was_live);
    }

    /// A deadline passed.
    fn on_timeout(&mut self, core: &mut ServerCore<T, S>, now: Instant) {
        let _ = (core, now);
    }

    /// The next deadline.
    fn poll_timeout(&self, core: &ServerCore<T, S>) -> Option<Instant> {
        core.stall.deadline()
    }

    /// The clock a `Model` message carries (the version, except for SSP).
    fn model_clock(&self, core: &ServerCore<T, S>) -> u64 {
        core.version.0
    }

    /// Training ends: the protocol stops its timers.
    fn on_stop(&mut self, core: &mut ServerCore<T, S>) {
        core.stall.idle();
    }
}

/// A server: the shared [`ServerCore`] driven by a protocol's [`Rules`]. Every protocol's
/// server type (`BspServer`, `AspServer`, …) is one of these.
#[derive(Debug)]
pub struct ProtocolServer<T, S, R> {
    pub(crate) core: ServerCore<T, S>,
    pub(crate) rules: R,
}

impl<T: Scalar, S: Buffer<T>, R: Rules<T, S>> ProtocolServer<T, S, R> {
    pub(crate) fn from_parts(core: ServerCore<T, S>, rules: R) -> Self {
        Self { core, rules }
    }

    /// The protocol's own state.
    pub(crate) fn rules(&self) -> &R {
        &self.rules
    }

    fn lose(&mut self, now: Instant, worker: WorkerId) -> Result<(), Reject> {
        let was_live = self.core.roster.lose(worker);
        if was_live {
            self.core.event(ServerEvent::WorkerLost { worker });
        }
        self.rules.on_lost(&mut self.core, now, worker, was_live);
        Ok(())
    }
}

impl<T: Scalar, S: Buffer<T>, R: Rules<T, S>> Server<T> for ProtocolServer<T, S, R> {
    fn handle(&mut self, now: Instant, from: WorkerId, msg: ToServer<'_, T>) -> Result<(), Reject> {
        let result = self.core.queue.ensure_room(self.rules.burst(&self.core)).and_then(|()| {
            self.core.roster.check_member(from)?;
            match msg {
                ToServer::Leave => self.lose(now, from),
                msg => self.rules.on_message(&mut self.core, now, from, msg),
            }
        });
        if result.is_err() {
            self.core.stats.rejected += 1;
        }
        self.core.stats.outputs_lost = self.core.queue.lost();
        result
    }

    fn handle_worker_lost(&mut self, now: Instant, worker: WorkerId) -> Result<(), Reject> {
        self.core.roster.check_member(worker)?;
        self.core.queue.ensure_room(self.rules.burst(&self.core))?;
        let result = self.lose(now, worker);
        self.core.stats.outputs_lost = self.core.queue.lost();
        result
    }

    fn handle_timeout(&mut self, now: Instant) {
        self.rules.on_timeout(&mut self.core, now);
        self.core.stats.outputs_lost = self.core.queue.lost();
    }

    fn poll_output(&mut self) -> Option<ServerOutput<'_, T>> {
        let clock = self.rules.model_clock(&self.core);
        let core = &mut self.core;
        core.queue.poll(core.version, clock, core.params.as_ref())
    }

    fn poll_timeout(&self) -> Option<Instant> {
        self.rules.poll_timeout(&self.core)
    }

    fn stop(&mut self) {
        self.rules.on_stop(&mut self.core);
        self.core.queue.push(ServerItem::Stop);
        self.core.stats.outputs_lost = self.core.queue.lost();
    }

    fn version(&self) -> Version {
        self.core.version
    }

    fn params(&self) -> &[T] {
        self.core.params.as_ref()
    }

    fn stats(&self) -> &ServerStats {
        &self.core.stats
    }
}
