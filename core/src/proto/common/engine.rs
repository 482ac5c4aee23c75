//! The server engine every protocol shares: the model and its version, the roster, the
//! counters, the output queue and the stall watch ([`ServerCore`]), and the one
//! implementation of the [`Server`] verbs ([`ProtocolServer`]) that screens every input
//! (output room, membership), handles `Leave` and lost workers, counts refusals and drains
//! outputs. A protocol is a [`Rules`] value: the state only it keeps and what it does with a
//! message, a lost worker and a deadline, and which per-worker outputs a queued batch
//! expands to.
//!
//! Per-worker state lives in one [`WorkerRecord`] per worker (the roster's part and the
//! protocol's [`Slot`]), in a table whose kind the caller picks with the server's last type
//! parameter `M` ([`Storage`]: [`Inline<N>`](super::table::Inline) by default, `Heap` with
//! the `alloc` feature); the output queue's depth is a constant.

use super::input::{Clock, Delta, Grad, Join, Pull};
use super::loss::LossTally;
use super::optim::{Optimizer, Rule, Update, UpdateRule};
use super::queue::{BatchKind, ServerItem, ServerQueue};
use super::roster::Roster;
use super::stall::StallWatch;
use super::table::{DEFAULT_INLINE_WORKERS, Inline, Slot, Storage, WorkerRecord};
use super::validate::check_learning_rate;
use crate::error::{ConfigError, Reject};
use crate::id::{Version, WorkerId};
use crate::math::{LengthMismatch, Scalar};
use crate::msg::ToServer;
use crate::msg::{ToWorker, Values};
use crate::proto::ProtocolKind;
use crate::proto::{Buffer, Recipient, Server, ServerEvent, ServerOutput, ServerStats};
use crate::time::{Duration, Instant};
use core::marker::PhantomData;

/// The state every server keeps, whatever its protocol. `X` is the protocol's per-worker
/// [`Slot`].
#[derive(Debug)]
pub struct ServerCore<T, S, M: Storage, X: Slot> {
    /// The model (caller's storage).
    pub(crate) params: S,
    /// Updates applied so far.
    pub(crate) version: Version,
    /// Membership, sessions, deduplication, and every worker's record.
    pub(crate) roster: Roster<M, X>,
    /// What the server received and what became of it.
    pub(crate) stats: ServerStats,
    /// Pending outputs.
    pub(crate) queue: ServerQueue,
    /// Whom the server waits for, and since when.
    pub(crate) stall: StallWatch,
    /// The reported losses of the pending update and of the message being handled.
    pub(crate) loss: LossTally,
    /// The update rule every update of the model goes through (see [`optim`](super::optim)).
    pub(crate) rule: UpdateRule<T, S>,
    _t: PhantomData<T>,
}

impl<T: Scalar, S: Buffer<T>, M: Storage, X: Slot> ServerCore<T, S, M, X> {
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
        let roster = Roster::new(workers, X::INIT)?;
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
            loss: LossTally::new(),
            rule: UpdateRule::plain(),
            _t: PhantomData,
        })
    }

    /// The model's length.
    pub(crate) fn dim(&self) -> usize {
        self.params.as_ref().len()
    }

    /// Applies an update to the model through the server's rule (the protocol's plain step
    /// without one). On `Err` (a length mismatch) nothing changed.
    #[inline(always)]
    pub(crate) fn apply<U: Update<T>>(&mut self, update: U) -> Result<(), LengthMismatch> {
        self.rule.apply(self.params.as_mut(), update)
    }

    /// The minibatch loss the message being handled reports, if any (finite): what a
    /// protocol's rules see with the contribution they take.
    pub fn reported_loss(&self) -> Option<f32> {
        self.loss.incoming()
    }

    /// Queues the [`ServerEvent::ModelUpdated`] of the update that made `version` from
    /// `contributions` contributions, with the mean of the losses counted into it.
    #[inline]
    pub(crate) fn updated(&mut self, version: Version, contributions: u32) {
        let mean_loss = self.loss.take_mean();
        self.event(ServerEvent::ModelUpdated { version, contributions, mean_loss });
    }

    /// The number of workers, `n`.
    pub(crate) fn n(&self) -> usize {
        self.roster.n()
    }

    /// Queues an event.
    #[inline]
    pub(crate) fn event(&mut self, event: ServerEvent) {
        self.queue.push(ServerItem::Event(event));
    }

    /// Queues the current model for `to`.
    #[inline]
    pub(crate) fn send_model(&mut self, to: Recipient) {
        self.queue.push(ServerItem::Model { to });
    }

    /// The common screening of a `Pull`: a worker cannot have a version the server has not
    /// published.
    pub(crate) fn check_have(&self, have: Version) -> Result<(), Reject> {
        if have > self.version {
            return Err(Reject::FutureVersion { claimed: have, current: self.version });
        }
        Ok(())
    }

    /// The common answer to a pull the server can serve now: the model if it is newer than
    /// `have`, otherwise `NotNewer`. Inlined into the protocols' pull handlers, which run on
    /// every pull.
    #[inline]
    pub(crate) fn answer_pull(&mut self, to: WorkerId, have: Version) {
        if self.version > have {
            self.send_model(Recipient::Worker(to));
        } else {
            self.queue.push(ServerItem::NotNewer { to, version: self.version });
        }
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

    /// Whether a `Join` needs no answer in a protocol of rounds (BSP, backup workers, DBW):
    /// it repeats the worker's session (a retry after waiting, not a new session) and the
    /// worker's gradient on the current model is already in the open round. Such a worker lost
    /// nothing; the model it would get is the one it computed on, so it would compute the same
    /// step again only for the server to refuse the repeat as a duplicate. The round's update
    /// brings it the next model.
    pub(crate) fn join_waits_for_round(&self, from: WorkerId, fresh: bool) -> bool {
        !fresh && self.roster.in_round(from, self.version)
    }
}

/// A protocol's per-worker part: the [`Slot`] type every one of its worker records holds.
pub trait HasSlot {
    /// The protocol's part of a worker's record.
    type Slot: Slot;
}

/// The core of the server of rules `R` over storage `M`.
pub type CoreOf<T, S, M, R> = ServerCore<T, S, M, <R as HasSlot>::Slot>;

/// What makes a protocol: the state only it keeps and its reactions, over a [`ServerCore`].
///
/// [`ProtocolServer`] calls these only after the input passed the common screening (room for
/// [`Self::burst`] outputs, no batch being expanded, the sender is a member); an `Err` must
/// leave both the rules and the core unchanged.
pub trait Rules<T: Scalar, S: Buffer<T>, M: Storage>: HasSlot {
    /// The most queue items one input can add (a batch counts as one; checked before every
    /// input, so no push can find the queue full). A constant: nothing may queue per-worker
    /// items but through a batch.
    fn burst(&self) -> usize;

    /// The protocol, named in errors.
    fn kind(&self) -> ProtocolKind;

    /// Whether every update of the model is one round's mean gradient and every live worker
    /// receives every round's model, in order (BSP; static backup workers and DBW whose
    /// stragglers abort): what the [`Rule::Mean`] relay needs. `Err`: the protocol as the
    /// refusal names it (by default [`Self::kind`]'s name).
    fn relays_means(&self) -> Result<(), &'static str> {
        Err(self.kind().as_str())
    }

    /// A `Join` from the member `join.from`.
    fn on_join(&mut self, core: &mut CoreOf<T, S, M, Self>, join: Join) -> Result<(), Reject>;

    /// A `Grad` (by reference: see [`ProtocolServer`]'s `handle`); refused unless the
    /// protocol takes gradients.
    fn on_grad(&mut self, core: &mut CoreOf<T, S, M, Self>, grad: Grad<'_, '_, T>) -> Result<(), Reject> {
        let _ = (core, grad);
        Err(Reject::Unexpected { kind: "Grad" })
    }

    /// A `Delta`; refused unless the protocol takes deltas.
    fn on_delta(&mut self, core: &mut CoreOf<T, S, M, Self>, delta: Delta<'_, '_, T>) -> Result<(), Reject> {
        let _ = (core, delta);
        Err(Reject::Unexpected { kind: "Delta" })
    }

    /// A `Clock`; refused unless the protocol takes clocks.
    fn on_clock(&mut self, core: &mut CoreOf<T, S, M, Self>, clock: Clock<'_, '_, T>) -> Result<(), Reject> {
        let _ = (core, clock);
        Err(Reject::Unexpected { kind: "Clock" })
    }

    /// A `Pull`; refused unless the protocol answers pulls.
    fn on_pull(&mut self, core: &mut CoreOf<T, S, M, Self>, pull: Pull) -> Result<(), Reject> {
        let _ = (core, pull);
        Err(Reject::Unexpected { kind: "Pull" })
    }

    /// `worker` was declared lost (the roster already marked it and, if it was live, the
    /// [`ServerEvent::WorkerLost`] event is queued).
    fn on_lost(&mut self, core: &mut CoreOf<T, S, M, Self>, now: Instant, worker: WorkerId, was_live: bool) {
        let _ = (core, now, worker, was_live);
    }

    /// A deadline passed.
    fn on_timeout(&mut self, core: &mut CoreOf<T, S, M, Self>, now: Instant) {
        let _ = (core, now);
    }

    /// The next deadline.
    fn poll_timeout(&self, core: &CoreOf<T, S, M, Self>) -> Option<Instant> {
        core.stall.deadline()
    }

    /// Whether the step the server waits for lacks `worker`'s contribution (the workers a
    /// stall report counts); `false` by default.
    fn awaits(&self, core: &CoreOf<T, S, M, Self>, worker: WorkerId) -> bool {
        let _ = (core, worker);
        false
    }

    /// The clock a `Model` message carries (the version, except for SSP).
    fn model_clock(&self, core: &CoreOf<T, S, M, Self>) -> u64 {
        core.version.0
    }

    /// Training ends: the protocol stops its timers.
    fn on_stop(&mut self, core: &mut CoreOf<T, S, M, Self>) {
        core.stall.idle();
    }

    /// What a queued batch of `kind` emits for `worker`, whose record is `record`, if
    /// anything. The default expands the common kinds ([`expand_common`]); protocols with
    /// batches of their own ([`BatchKind::Protocol`]) expand those and defer the rest.
    fn expand(&self, kind: BatchKind, worker: WorkerId, record: &mut WorkerRecord<Self::Slot>) -> Option<ServerItem> {
        expand_common(kind, worker, record)
    }
}

/// The common batches: `Applied` for a round's contributors, the model for marked workers.
pub fn expand_common<X: Slot>(kind: BatchKind, worker: WorkerId, record: &WorkerRecord<X>) -> Option<ServerItem> {
    match kind {
        BatchKind::Applied { base, version, k } if record.mark == version.0 => {
            Some(ServerItem::Event(ServerEvent::Applied {
                worker,
                base,
                version,
                staleness: 0,
                weight: f64::from(record.ext.factor()) / f64::from(k.max(1)),
            }))
        }
        BatchKind::Models { mark } if record.mark == mark => Some(ServerItem::Model { to: Recipient::Worker(worker) }),
        _ => None,
    }
}

/// A server: the shared [`ServerCore`] driven by a protocol's [`Rules`]. Every protocol's
/// server type (`BspServer`, `AspServer`, …) is one of these; `M` says where its per-worker
/// table lives ([`Inline<256>`](super::table::Inline) unless the caller names another).
#[derive(Debug)]
pub struct ProtocolServer<T, S, R: HasSlot, M: Storage = Inline<DEFAULT_INLINE_WORKERS>> {
    pub(crate) core: ServerCore<T, S, M, R::Slot>,
    pub(crate) rules: R,
}

impl<T: Scalar, S: Buffer<T>, M: Storage, R: Rules<T, S, M>> ProtocolServer<T, S, R, M> {
    pub(crate) fn from_parts(core: ServerCore<T, S, M, R::Slot>, rules: R) -> Self {
        Self { core, rules }
    }

    /// Hands a screened message other than `Leave` to the rules' verb for its kind.
    #[inline]
    fn dispatch(&mut self, now: Instant, from: WorkerId, msg: &ToServer<'_, T>) -> Result<(), Reject> {
        let core = &mut self.core;
        match *msg {
            ToServer::Join { epoch } => self.rules.on_join(core, Join { now, from, epoch }),
            ToServer::Grad { base, iteration, seq, ref values, .. } => {
                self.rules.on_grad(core, Grad { now, from, base, iteration, seq, values })
            }
            ToServer::Delta { round, local_steps, seq, ref values, .. } => {
                self.rules.on_delta(core, Delta { now, from, round, local_steps, seq, values })
            }
            ToServer::Clock { clock, seq, ref values, .. } => {
                self.rules.on_clock(core, Clock { now, from, clock, seq, values })
            }
            ToServer::Pull { have, min_clock } => self.rules.on_pull(core, Pull { now, from, have, min_clock }),
            ToServer::Leave => Err(Reject::Unexpected { kind: "Leave" }),
        }
    }

    /// The protocol's own state.
    pub(crate) fn rules(&self) -> &R {
        &self.rules
    }

    /// The update rule `optimizer` on every update (see [`optim`](super::optim)), over the
    /// caller-owned `state` of at least [`Optimizer::state_len`] elements, set up here
    /// (momentum: the current model, no velocity; Nesterov and AdamW: zero). To resume a
    /// run use [`Self::with_optimizer_state`]. Plain SGD at a constant rate (momentum 0
    /// included) leaves the server's updates as they are, bit for bit, and drops `state`.
    pub fn with_optimizer(mut self, optimizer: Optimizer, state: S) -> Result<Self, ConfigError> {
        self.check_rule(&optimizer)?;
        self.core.rule = UpdateRule::new(optimizer, state, self.core.params.as_ref(), true)?;
        Ok(self)
    }

    /// [`Self::with_optimizer`] going on from a checkpoint: `state` holds what
    /// [`Self::optimizer_state`] read (its header, the settings and the update count). A
    /// state that is not finite, an AdamW second moment below 0, or a header that is not
    /// one or holds other settings than `optimizer` is refused
    /// ([`ConfigError::Knob`]`("optimizer state")`).
    pub fn with_optimizer_state(mut self, optimizer: Optimizer, state: S) -> Result<Self, ConfigError> {
        self.check_rule(&optimizer)?;
        self.core.rule = UpdateRule::new(optimizer, state, self.core.params.as_ref(), false)?;
        Ok(self)
    }

    /// Refuses a rule the protocol cannot run: [`Rule::Mean`] unless every update is one
    /// round's mean ([`ConfigError::RuleUnsupported`]).
    fn check_rule(&self, optimizer: &Optimizer) -> Result<(), ConfigError> {
        match self.rules.relays_means() {
            Err(protocol) if optimizer.rule == Rule::Mean => {
                Err(ConfigError::RuleUnsupported { rule: optimizer.rule_name(), protocol })
            }
            _ => Ok(()),
        }
    }

    /// The update rule (plain SGD unless one was set).
    pub fn optimizer(&self) -> Optimizer {
        self.core.rule.optimizer(self.core.dim())
    }

    /// The rule's state ([`Optimizer::state_len`] elements), for checkpoints; `None` for a
    /// rule without state.
    pub fn optimizer_state(&self) -> Option<&[T]> {
        self.core.rule.state(self.core.dim())
    }

    /// Updates applied through the rule (kept in its state's header, so a restored rule goes
    /// on counting): the schedule's and AdamW's step count. 0 for plain SGD at a constant
    /// rate and for momentum at a constant rate, which keep no count.
    pub fn optimizer_steps(&self) -> u64 {
        self.core.rule.steps(self.core.dim())
    }

    /// SGD with momentum `beta` (in `[0, 1)`) on every update: `x ← x + β(x − x_prev)`
    /// before each update's step, PyTorch's `v ← βv + g; x ← x − ηv` for a constant step.
    /// `prev` (at least the model's length, caller-owned) holds the model before the last
    /// update; it is set here to the current model (no velocity yet), or, to resume a run,
    /// use [`Self::with_momentum_state`]. `beta == 0` leaves the server plain SGD, bit for
    /// bit. [`Self::with_optimizer`] with [`Optimizer::momentum`].
    pub fn with_momentum(self, beta: f64, prev: S) -> Result<Self, ConfigError> {
        self.with_optimizer(Optimizer::momentum(beta), prev)
    }

    /// [`Self::with_momentum`] with `prev` already holding the model before the last update
    /// (from a checkpoint).
    pub fn with_momentum_state(self, beta: f64, prev: S) -> Result<Self, ConfigError> {
        self.with_optimizer_state(Optimizer::momentum(beta), prev)
    }

    /// The momentum buffer (the model before the last update, for checkpoints), if the
    /// server's rule is heavy-ball momentum.
    pub fn momentum_buffer(&self) -> Option<&[T]> {
        self.core.rule.momentum_buffer(self.core.dim())
    }

    /// Out of line: a rare path, kept out of `handle`'s body so that the common message pays
    /// nothing for it (docs/perf-log.md, "Hot-path shapes").
    #[inline(never)]
    fn lose(&mut self, now: Instant, worker: WorkerId) -> Result<(), Reject> {
        let was_live = self.core.roster.lose(worker);
        if was_live {
            self.core.event(ServerEvent::WorkerLost { worker });
        }
        self.rules.on_lost(&mut self.core, now, worker, was_live);
        Ok(())
    }

    /// Applies the losses reported while the server could take no input, lowest worker id
    /// first, as long as there is room for what each can queue; the rest wait for the next
    /// drain.
    #[cold]
    #[inline(never)]
    fn apply_pending_losses(&mut self) {
        while self.core.roster.pending_losses() != 0 && self.core.queue.ensure_room(self.rules.burst()).is_ok() {
            let Some((worker, at)) = self.core.roster.take_pending_loss() else {
                break;
            };
            let _ = self.lose(at, worker);
        }
        self.core.stats.outputs_lost = self.core.queue.lost();
    }

    /// The next output of the batches at the queue's front: walks the front batch's worker
    /// records from where it stopped to the next one the protocol's
    /// [`Rules::expand`] selects, taking out every batch it finishes; `None` when the
    /// queue empties.
    ///
    /// Each item becomes an output where it is found, so an event the protocol's inlined
    /// expansion builds is stored straight into the output, never returned through the stack
    /// and matched again after the loop.
    #[inline(always)]
    fn expand_front(&mut self) -> Option<ServerOutput<'_, T>> {
        loop {
            let Some(front) = self.core.queue.front_mut() else {
                return self.after_drain();
            };
            let ServerItem::Batch(batch) = front else {
                let item = *self.core.queue.front_mut()?;
                self.core.queue.advance();
                return self.output_of(&item);
            };
            let (kind, mut i) = (batch.kind, batch.next as usize);
            let records = self.core.roster.records_mut();
            while let Some(record) = records.get_mut(i) {
                i += 1;
                if let Some(item) = self.rules.expand(kind, WorkerId(i as u32 - 1), record) {
                    batch.next = i as u32;
                    return self.output_of(&item);
                }
            }
            self.core.queue.finish_batch();
        }
    }

    /// The queue is empty: the losses that waited for the drain are applied now, and what
    /// they queue is part of this drain (`None` if nothing).
    #[cold]
    #[inline(never)]
    fn after_drain(&mut self) -> Option<ServerOutput<'_, T>> {
        if self.core.roster.pending_losses() == 0 {
            return None;
        }
        self.apply_pending_losses();
        if self.core.queue.len() == 0 {
            return None;
        }
        self.poll_output()
    }

    /// The output of a queued item other than a batch, its payload attached.
    #[inline(always)]
    fn output_of(&self, item: &ServerItem) -> Option<ServerOutput<'_, T>> {
        let version = self.core.version;
        Some(match *item {
            ServerItem::Model { to } => {
                let (clock, values) = (self.rules.model_clock(&self.core), Values::Slice(self.core.params.as_ref()));
                ServerOutput::Send { to, msg: ToWorker::Model { version, clock, values } }
            }
            ServerItem::NotNewer { to, version } => {
                ServerOutput::Send { to: Recipient::Worker(to), msg: ToWorker::NotNewer { version } }
            }
            ServerItem::PushAck { to, round, pull_now } => {
                ServerOutput::Send { to: Recipient::Worker(to), msg: ToWorker::PushAck { round, pull_now } }
            }
            ServerItem::Abort { to, iteration } => {
                ServerOutput::Send { to: Recipient::Worker(to), msg: ToWorker::Abort { iteration } }
            }
            ServerItem::Stop => ServerOutput::Send { to: Recipient::AllWorkers, msg: ToWorker::Stop },
            ServerItem::Event(e) => ServerOutput::Event(e),
            // A protocol's expansion yields single outputs, never a batch.
            ServerItem::Batch(_) => return None,
        })
    }
}

impl<T: Scalar, S: Buffer<T>, M: Storage, R: Rules<T, S, M>> Server<T> for ProtocolServer<T, S, R, M> {
    // Out of line: `AnyServer`'s dispatch calls one `handle` per protocol and never inlines
    // them all into its match.
    #[inline(never)]
    fn handle(&mut self, now: Instant, from: WorkerId, msg: ToServer<'_, T>) -> Result<(), Reject> {
        // A loss reported before this message is applied before it (a caller that drains
        // after every input finds none pending here).
        if self.core.roster.pending_losses() != 0 {
            self.apply_pending_losses();
        }
        let result = self.core.queue.ensure_room(self.rules.burst()).and_then(|()| {
            self.core.roster.check_member(from)?;
            // The message is read by reference where the caller put it, never copied.
            match msg {
                ToServer::Leave => self.lose(now, from),
                ToServer::Grad { loss: Some(l), .. }
                | ToServer::Delta { loss: Some(l), .. }
                | ToServer::Clock { loss: Some(l), .. } => {
                    if !l.is_finite() {
                        return Err(Reject::LossNotFinite);
                    }
                    self.core.loss.incoming = Some(l);
                    let result = self.dispatch(now, from, &msg);
                    self.core.loss.incoming = None;
                    result
                }
                _ => self.dispatch(now, from, &msg),
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
        if self.core.roster.pending_losses() == 0 && self.core.queue.ensure_room(self.rules.burst()).is_ok() {
            let result = self.lose(now, worker);
            self.core.stats.outputs_lost = self.core.queue.lost();
            return result;
        }
        // No room now (a batch is being expanded): the loss is recorded and applied once
        // the outputs have drained, never refused.
        self.core.roster.defer_loss(worker, now);
        self.apply_pending_losses();
        Ok(())
    }

    fn awaits(&self, worker: WorkerId) -> bool {
        self.rules.awaits(&self.core, worker)
    }

    fn handle_timeout(&mut self, now: Instant) {
        if self.core.roster.pending_losses() != 0 {
            self.apply_pending_losses();
        }
        // A deadline met while a batch is still being expanded waits for the drain: the
        // deadline stays due, so the next `handle_timeout` after it acts on it.
        if self.core.queue.ensure_room(self.rules.burst()).is_ok() {
            self.rules.on_timeout(&mut self.core, now);
        }
        self.core.stats.outputs_lost = self.core.queue.lost();
    }

    fn poll_output(&mut self) -> Option<ServerOutput<'_, T>> {
        // A batch is expanded here, each item it yields made an output where it is found.
        // Any other item is taken out of the queue first and then read where it lies (its
        // slot is not written before the next push), each kind only its own fields, never
        // copied out whole first and read back in pieces. The grouped server's poll is its
        // own. An empty queue is where the losses that waited for the drain are applied.
        match self.core.queue.front_mut() {
            Some(ServerItem::Batch(_)) => return self.expand_front(),
            Some(_) => {}
            None => return self.after_drain(),
        }
        let taken = self.core.queue.take_front()?;
        self.output_of(self.core.queue.taken(taken)?)
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
