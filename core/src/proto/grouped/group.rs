//! One group's step: the BSP round inside a group and the state the groups of one server
//! share (roster, counters, outputs), used by both [`GroupedServer`] and [`GroupServer`].

use crate::error::{ConfigError, Reject};
use crate::id::{Version, WorkerId};
use crate::math::{self, Scalar};
use crate::msg::{ToWorker, Values};
use crate::proto::common::loss::LossTally;
use crate::proto::common::queue::FrontQueue;
use crate::proto::common::roster::Roster;
use crate::proto::common::stall::StallWatch;
use crate::proto::common::table::{Slot, Storage, WorkerRecord};
use crate::proto::{DropReason, GradientPolicy, Recipient, ServerEvent, ServerOutput, ServerStats};
use crate::time::Instant;

use super::items::*;
use super::kernels::*;
use super::*;

/// State shared by the groups of one server, indexed by (global) worker id.
#[derive(Debug)]
pub(super) struct Shared<M: Storage> {
    pub(super) config: GroupedConfig,
    pub(super) layout: Layout,
    pub(super) roster: Roster<M, GroupedSlot>,
    /// The last step mark handed out (each open group step gets a new one).
    marks: u64,
    pub(super) stats: ServerStats,
    pub(super) queue: FrontQueue<Item, OUT_QUEUE>,
    /// Batches in `queue`.
    batches: u32,
}

impl<M: Storage> Shared<M> {
    pub(super) fn new(config: GroupedConfig) -> Result<Self, ConfigError> {
        let layout = config.layout()?;
        let mut roster = Roster::new(config.workers, GroupedSlot::INIT)?;
        for (i, r) in roster.records_mut().iter_mut().enumerate() {
            r.ext.group = config.partition.group_of(i as u32, config.workers, config.groups) as u8;
        }
        Ok(Self {
            roster,
            config,
            layout,
            marks: 0,
            stats: ServerStats::default(),
            queue: FrontQueue::new(Item::Stop),
            batches: 0,
        })
    }

    /// The group of `worker`, if it exists.
    pub(super) fn group_of(&self, worker: WorkerId) -> Option<usize> {
        self.roster.record(worker).map(|r| usize::from(r.ext.group))
    }

    /// A new step mark.
    pub(super) fn new_mark(&mut self) -> u64 {
        self.marks += 1;
        self.marks
    }

    #[inline(always)]
    pub(super) fn push(&mut self, item: Item) {
        // Room for the largest burst is checked before every input (`ensure_room`), so this
        // cannot fail; should it ever, the output is counted, never dropped silently.
        let batch = matches!(item, Item::Batch { .. });
        if !self.queue.push(item) {
            self.stats.outputs_lost += 1;
        } else if batch {
            self.batches += 1;
        }
    }

    /// Queues `batch` for the members of group `group`.
    #[inline(always)]
    pub(super) fn push_batch(&mut self, group: u32, batch: Batch) {
        let (next, end) = self.layout.span.get(group as usize).copied().unwrap_or((0, 0));
        self.push(Item::Batch { batch, next, end });
    }

    #[inline(always)]
    pub(super) fn event(&mut self, event: ServerEvent) {
        // Built in its slot (see `FrontQueue::push_with`); an event is never a batch.
        if !self.queue.push_with(|| Item::Event(event)) {
            self.stats.outputs_lost += 1;
        }
    }

    /// Refuses input while a batch is being expanded (the records it reads must not change)
    /// or the queue lacks room for the largest burst.
    pub(super) fn ensure_room(&self) -> Result<(), Reject> {
        if self.batches == 0 && OUT_QUEUE - self.queue.len() >= BURST { Ok(()) } else { Err(Reject::Capacity) }
    }

    pub(super) fn on_join(&mut self, group: &mut Group, from: WorkerId, epoch: u32) -> Result<(), Reject> {
        let fresh = self.roster.check_join(from, epoch)?;
        self.roster.commit_join(from, epoch);
        if fresh {
            self.event(ServerEvent::WorkerJoined { worker: from, epoch });
        }
        if group.phase == Phase::Collecting {
            // As in BSP: a retry of the worker's session whose gradient is already in the open
            // step lost nothing, and the step's model brings it the next one.
            let in_step = !fresh && self.roster.record(from).is_some_and(|r| r.mark == group.mark);
            if !in_step {
                self.push(Item::Model { group: group.id, to: Recipient::Worker(from) });
            }
        } else if let Some(r) = self.roster.record_mut(from).filter(|r| !r.has(WAITING)) {
            r.set(WAITING, true);
            group.waiting += 1;
        }
        Ok(())
    }

    /// A loss reported by the transport: applied now if the server takes input, otherwise
    /// recorded and applied once the outputs have drained ([`Self::apply_pending_losses`]),
    /// never refused for want of room.
    pub(super) fn report_lost(&mut self, now: Instant, worker: WorkerId) -> Result<(), Reject> {
        self.roster.check_member(worker)?;
        if self.roster.pending_losses() == 0 && self.ensure_room().is_ok() {
            return self.on_lost(worker);
        }
        self.roster.defer_loss(worker, now);
        self.apply_pending_losses();
        Ok(())
    }

    /// Applies the recorded losses, lowest worker id first, while the server takes input.
    #[cold]
    #[inline(never)]
    pub(super) fn apply_pending_losses(&mut self) {
        while self.roster.pending_losses() != 0 && self.ensure_room().is_ok() {
            let Some((worker, _)) = self.roster.take_pending_loss() else {
                break;
            };
            let _ = self.on_lost(worker);
        }
    }

    pub(super) fn on_lost(&mut self, worker: WorkerId) -> Result<(), Reject> {
        self.roster.check_member(worker)?;
        if self.roster.lose(worker) {
            self.event(ServerEvent::WorkerLost { worker });
        }
        Ok(())
    }

    /// Sends group `group`'s model to all its members.
    #[inline(always)]
    pub(super) fn broadcast(&mut self, group: u32) {
        if self.layout.groups == 1 {
            for r in self.roster.records_mut() {
                r.set(WAITING, false);
            }
            self.push(Item::Model { group, to: Recipient::AllWorkers });
        } else {
            self.push_batch(group, Batch::Models { group, waiting: false });
        }
    }

    /// What `batch` emits for `worker` (`Err` for a member's model: the caller attaches
    /// the payload).
    #[inline(always)]
    fn expand(batch: &Batch, worker: WorkerId, r: &mut WorkerRecord<GroupedSlot>) -> Option<Result<ServerEvent, u32>> {
        match *batch {
            Batch::Applied { mark, base, version, staleness, weight } if r.mark == mark => {
                Some(Ok(ServerEvent::Applied {
                    worker,
                    base,
                    version,
                    staleness,
                    weight: f64::from(r.ext.factor) * weight,
                }))
            }
            Batch::Aborted { mark, base } if r.mark == mark => {
                Some(Ok(ServerEvent::Dropped { worker, base, reason: DropReason::Aborted }))
            }
            Batch::Models { group, waiting } if u32::from(r.ext.group) == group && (!waiting || r.has(WAITING)) => {
                r.set(WAITING, false);
                Some(Err(group))
            }
            _ => None,
        }
    }

    /// The next output: the front item's, read in place (a batch is expanded where it lies),
    /// payloads attached.
    #[inline(always)]
    pub(super) fn poll<'a, T>(
        &mut self,
        version: impl Fn(u32) -> Version,
        model: impl Fn(u32) -> &'a [T],
    ) -> Option<ServerOutput<'a, T>> {
        let send_model = |group: u32, to: Recipient| {
            let version = version(group);
            ServerOutput::Send {
                to,
                msg: ToWorker::Model { version, clock: version.0, values: Values::Slice(model(group)) },
            }
        };
        loop {
            let Some(front) = self.queue.front_mut() else {
                // Drained: the losses that waited for it are applied, and what they queue is
                // part of this drain.
                if self.roster.pending_losses() == 0 {
                    return None;
                }
                self.apply_pending_losses();
                if self.queue.len() == 0 {
                    return None;
                }
                continue;
            };
            let (batch, next, end) = match front {
                Item::Event(e) => {
                    // Built in the caller's slot straight from the queue before the queue
                    // moves on, never copied through the stack.
                    let out = Some(ServerOutput::Event(*e));
                    self.queue.advance();
                    return out;
                }
                Item::Batch { batch, next, end } => (batch, next, *end as usize),
                Item::Model { .. } | Item::Stop => {
                    return Some(match self.queue.pop()? {
                        Item::Model { group, to } => send_model(group, to),
                        _ => ServerOutput::Send { to: Recipient::AllWorkers, msg: ToWorker::Stop },
                    });
                }
            };
            // The span's records from where the batch stopped, as one slice: no bound check
            // per record.
            let start = *next as usize;
            let records = self.roster.records_mut();
            let end = end.min(records.len());
            let records = records.get_mut(start..end).unwrap_or(&mut []);
            let mut i = start;
            let mut out = None;
            for r in records {
                i += 1;
                if let Some(o) = Self::expand(batch, WorkerId(i as u32 - 1), r) {
                    out = Some(o);
                    break;
                }
            }
            match out {
                Some(Ok(event)) => {
                    *next = i as u32;
                    return Some(ServerOutput::Event(event));
                }
                Some(Err(group)) => {
                    *next = i as u32;
                    return Some(send_model(group, Recipient::Worker(WorkerId(i as u32 - 1))));
                }
                // Every member was looked at: the batch is done (input is refused until then).
                None => {
                    self.queue.advance();
                    self.batches = self.batches.saturating_sub(1);
                }
            }
        }
    }
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(super) enum Phase {
    /// Waiting for a model from the central server (at start, or after an aborted step).
    Joining,
    /// A group step is open: members' gradients are collected.
    Collecting,
    /// The step closed and its aggregate went to the central server; waiting for the reply.
    Exchanging,
}

/// What closing a group step asks the owner to do.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(super) enum Closed {
    /// A local step (`H > 1`): the group model moved; nothing to send upstream.
    Local,
    /// Send the aggregate upstream as `Grad`.
    Exchange,
    /// The aggregate would be refused; the step was dropped: send `Join` upstream.
    Rejoin,
}

/// What a member's gradient did to its group's step ([`Group::on_grad`]).
#[derive(Clone, Copy, Debug, PartialEq)]
pub(super) enum Added<T> {
    /// The step is still open (or the gradient was stale).
    Open,
    /// The step is complete: the accumulator holds the sum of its gradients.
    Complete,
    /// The step is complete and an exchange closes it (`H = 1`): the accumulator already
    /// holds the aggregate (the sum times the group weight), whose squared norm this is
    /// (the central screening's measure).
    Scaled(T),
}

impl<T> Added<T> {
    /// Whether the step is complete (the owner closes it).
    pub(super) fn complete(&self) -> bool {
        !matches!(self, Self::Open)
    }
}

/// One group's protocol state (its tensors live in the owner's buffers).
#[derive(Clone, Copy, Debug)]
pub(super) struct Group {
    pub(super) id: u32,
    pub(super) size: u32,
    /// `s_g / n_g`: each member gradient's weight in the aggregate.
    pub(super) weight: f64,
    /// The version of the group model, as its members see it.
    pub(super) version: Version,
    /// The central version the group model is based on.
    pub(super) base: Version,
    pub(super) has_model: bool,
    /// The last step was dropped ([`Closed::Rejoin`]): the next model must be a new version.
    pub(super) aborted: bool,
    pub(super) phase: Phase,
    /// Group steps closed since the last exchange.
    pub(super) step: u32,
    /// The mark of the open (or exchanging) step: members whose record has it contributed.
    pub(super) mark: u64,
    /// Members whose gradient for the open (or exchanging) step is in.
    pub(super) count: u32,
    /// Members that joined while the group had no model to give them.
    pub(super) waiting: u32,
    /// The losses its members reported with the gradients of the steps since the last
    /// exchange.
    pub(super) loss: LossTally,
    /// Exchanges sent (the upstream `Grad`'s `iteration`).
    pub(super) exchanges: u64,
    /// The next upstream sequence number.
    pub(super) seq: u64,
    pub(super) stall: StallWatch,
}

impl Group {
    pub(super) fn new<M: Storage>(id: u32, shared: &mut Shared<M>) -> Self {
        let size = shared.layout.size.get(id as usize).copied().unwrap_or(1);
        let config = &shared.config;
        let mut stall = StallWatch::new(config.stall_report);
        stall.progress(Instant::ZERO);
        Self {
            id,
            size,
            weight: config.lr_scaling.factor(size, config.workers) / f64::from(size.max(1)),
            version: Version::ZERO,
            base: Version::ZERO,
            has_model: false,
            aborted: false,
            phase: Phase::Joining,
            step: 0,
            mark: shared.new_mark(),
            count: 0,
            waiting: 0,
            loss: LossTally::new(),
            exchanges: 0,
            seq: 0,
            stall,
        }
    }

    /// A member's gradient: [`Added::Open`] unless it completed the group step (the owner
    /// then calls [`Self::close`] with what it returned).
    ///
    /// Two fused paths, taken only once every check but admission has passed (so the
    /// verdict, and any refusal, is the two-pass path's), with the same bits: a step's first
    /// gradient under a policy without norm bound is measured while it is added (the
    /// accumulator is all zero when no gradient is in, so a refused one is undone exactly
    /// by zeroing it again); the last gradient of a step that an exchange closes (`H = 1`)
    /// is added, scaled by the group weight and measured for the central screening in one
    /// pass ([`Added::Scaled`]).
    #[allow(clippy::too_many_arguments)]
    #[inline(always)]
    pub(super) fn on_grad<T: Scalar, M: Storage>(
        &mut self,
        sh: &mut Shared<M>,
        now: Instant,
        from: WorkerId,
        base: Version,
        seq: u64,
        values: &Values<'_, T>,
        loss: Option<f32>,
        acc: &mut [T],
    ) -> Result<Added<T>, Reject> {
        LossTally::check(loss)?;
        sh.roster.check_seq(from, seq)?;
        let open = self.phase == Phase::Collecting && base == self.version;
        let mut scaled = None;
        let factor = match values {
            Values::Slice(x)
                if open
                    && self.has_model
                    && x.len() == acc.len()
                    && sh.roster.record(from).is_none_or(|r| r.mark != self.mark) =>
            {
                if self.count + 1 == self.size && sh.config.local_steps == 1 {
                    let policy = &sh.config.gradient_policy;
                    // What `admit` returns for a finite norm without a bound; otherwise its
                    // verdict (and refusal).
                    let factor = if policy.max_norm.is_none() && math::squared_norm(x).is_finite() {
                        T::one()
                    } else {
                        policy.admit(values, acc.len())?
                    };
                    scaled = Some(add_scale_measured(acc, x, factor, T::from_f64(self.weight)));
                    factor
                } else if self.count == 0 && sh.config.gradient_policy.max_norm.is_none() {
                    if add_measured(acc, x).is_finite() {
                        // What `admit` returns for a finite norm without a bound.
                        T::one()
                    } else {
                        math::fill_zero(acc);
                        self.add(sh, from, base, seq, values, acc)?
                    }
                } else {
                    self.add(sh, from, base, seq, values, acc)?
                }
            }
            _ => self.add(sh, from, base, seq, values, acc)?,
        };
        sh.roster.commit_seq(from, seq);
        sh.stats.accepted += 1;
        if !open {
            sh.stats.count_drop(DropReason::Stale);
            sh.event(ServerEvent::Dropped { worker: from, base, reason: DropReason::Stale });
            return Ok(Added::Open);
        }
        if let Some(r) = sh.roster.record_mut(from) {
            r.mark = self.mark;
            r.ext.factor = factor.to_f64() as f32;
        }
        self.count += 1;
        self.loss.add(loss);
        self.stall.progress(now);
        Ok(match scaled {
            Some(sq) => Added::Scaled(sq),
            None if self.count == self.size => Added::Complete,
            None => Added::Open,
        })
    }

    /// The two-pass path of [`Self::on_grad`]: admission, the checks, then (for the open
    /// step) the accumulation. Returns the admission factor.
    #[allow(clippy::too_many_arguments)]
    fn add<T: Scalar, M: Storage>(
        &self,
        sh: &Shared<M>,
        from: WorkerId,
        base: Version,
        seq: u64,
        values: &Values<'_, T>,
        acc: &mut [T],
    ) -> Result<T, Reject> {
        let factor = sh.config.gradient_policy.admit(values, acc.len())?;
        if !self.has_model {
            return Err(Reject::Unexpected { kind: "Grad" });
        }
        if base > self.version {
            return Err(Reject::FutureVersion { claimed: base, current: self.version });
        }
        if self.phase == Phase::Collecting && base == self.version {
            if sh.roster.record(from).is_some_and(|r| r.mark == self.mark) {
                return Err(Reject::Duplicate { worker: from, seq });
            }
            if factor == T::one() {
                values.add_into(acc)?;
            } else {
                values.scaled_add_into(acc, factor)?;
            }
        }
        Ok(factor)
    }

    /// Closes the group step. For a local step, updates `model` and queues the events and
    /// the broadcast; for an exchange, leaves the aggregate in `acc` (`H = 1`) or `total`.
    /// `added` is what [`Self::on_grad`] returned for the step's last gradient: with
    /// [`Added::Scaled`], `acc` already holds the scaled aggregate and its squared norm.
    #[inline(always)]
    pub(super) fn close<T: Scalar, M: Storage>(
        &mut self,
        sh: &mut Shared<M>,
        now: Instant,
        model: &mut [T],
        acc: &mut [T],
        total: &mut [T],
        added: Added<T>,
    ) -> Closed {
        let w = T::from_f64(self.weight);
        self.step = self.step.saturating_add(1);
        if self.step < sh.config.local_steps {
            let rate = T::from_f64(-sh.config.learning_rate);
            for ((m, a), t) in model.iter_mut().zip(acc.iter_mut()).zip(total.iter_mut()) {
                let x = *a * w;
                *t = *t + x;
                *m = *m + rate * x;
                *a = T::zero();
            }
            let version = self.version.next();
            self.report_applied(sh, version, 0);
            self.version = version;
            self.open_step(sh);
            sh.broadcast(self.id);
            self.stall.progress(now);
            return Closed::Local;
        }
        // The central server's policy is the default: an aggregate passes it when its length
        // is the model's and its squared norm is finite. A mean of admitted gradients can
        // still fail it (their sum can overflow, and so can a sum of H aggregates), so every
        // aggregate is screened here, once (the central server does not screen it again):
        // drop this step rather than send what would be refused.
        let passes = if sh.config.local_steps > 1 {
            for (t, a) in total.iter_mut().zip(acc.iter_mut()) {
                *t = *t + *a * w;
                *a = T::zero();
            }
            GradientPolicy::default().admit(&Values::Slice(&*total), model.len()).is_ok()
        } else if let Added::Scaled(sq) = added {
            acc.len() == model.len() && sq.is_finite()
        } else {
            acc.len() == model.len() && scale_measured(acc, w).is_finite()
        };
        if !passes {
            math::fill_zero(acc);
            math::fill_zero(total);
            for _ in 0..self.count {
                sh.stats.count_drop(DropReason::Aborted);
            }
            sh.push_batch(self.id, Batch::Aborted { mark: self.mark, base: self.version });
            let _ = self.loss.take_mean();
            self.open_step(sh);
            self.step = 0;
            self.phase = Phase::Joining;
            self.aborted = true;
            return Closed::Rejoin;
        }
        self.phase = Phase::Exchanging;
        Closed::Exchange
    }

    /// Queues an `Applied` event for each member of the closed step (one batch).
    pub(super) fn report_applied<M: Storage>(&self, sh: &mut Shared<M>, version: Version, staleness: u64) {
        if self.count > 0 {
            let (mark, base, weight) = (self.mark, self.version, self.weight);
            sh.push_batch(self.id, Batch::Applied { mark, base, version, staleness, weight });
            sh.stats.applied += u64::from(self.count);
        }
    }

    /// Opens a new step: no member has contributed to it.
    fn open_step<M: Storage>(&mut self, sh: &mut Shared<M>) {
        self.mark = sh.new_mark();
        self.count = 0;
    }

    /// The upstream `Grad` for the pending exchange (payload: the aggregate) and advances the
    /// upstream counters.
    pub(super) fn take_exchange(&mut self) -> (Version, u64, u64) {
        let out = (self.base, self.exchanges, self.seq);
        self.exchanges += 1;
        self.seq += 1;
        out
    }

    /// The central server's `Model{central, values}`: the reply to an exchange or a join.
    #[allow(clippy::too_many_arguments)]
    pub(super) fn rebase<T: Scalar, M: Storage>(
        &mut self,
        sh: &mut Shared<M>,
        now: Instant,
        central: Version,
        values: &Values<'_, T>,
        model: &mut [T],
        acc: &mut [T],
        total: &mut [T],
    ) -> Result<(), Reject> {
        values.check_len(model.len())?;
        let exchanged = self.phase == Phase::Exchanging;
        let version = self.rebased_version(sh, central)?;
        if exchanged {
            math::fill_zero(acc);
            math::fill_zero(total);
        }
        values.copy_into(model)?;
        self.finish_rebase(sh, now, central, version);
        Ok(())
    }

    /// The reply to an exchange (central version `central`) whose tensors the caller
    /// already moved: the group model is the central model and the aggregate is cleared
    /// ([`apply_copy_clear`]). Refused, with the group's state unchanged, unless an
    /// exchange is pending and `central` is newer than the group's base (which an accepted
    /// update always makes it, so the caller's tensors never move without the state).
    #[inline(always)]
    pub(super) fn rebase_applied<M: Storage>(
        &mut self,
        sh: &mut Shared<M>,
        now: Instant,
        central: Version,
    ) -> Result<(), Reject> {
        if self.phase != Phase::Exchanging {
            return Err(Reject::Unexpected { kind: "Model" });
        }
        let version = self.rebased_version(sh, central)?;
        self.finish_rebase(sh, now, central, version);
        Ok(())
    }

    /// The group version a re-base on `central` gives; for the reply to an exchange, also
    /// queues its outcomes (`GroupApplied`, the members' `Applied`, `ModelUpdated`).
    #[inline(always)]
    fn rebased_version<M: Storage>(&mut self, sh: &mut Shared<M>, central: Version) -> Result<Version, Reject> {
        Ok(match self.phase {
            Phase::Collecting => return Err(Reject::Unexpected { kind: "Model" }),
            Phase::Exchanging => {
                if central <= self.base {
                    return Err(Reject::OutdatedModel { received: central, have: self.base });
                }
                let staleness = central.0 - 1 - self.base.0;
                let contributions = self.size.saturating_mul(sh.config.local_steps);
                let version = self.version.next().max(central);
                sh.event(ServerEvent::GroupApplied {
                    group: self.id,
                    base: self.base,
                    version: central,
                    staleness,
                    contributions,
                });
                self.report_applied(sh, version, staleness);
                sh.stats.updates += 1;
                let mean_loss = self.loss.take_mean();
                sh.event(ServerEvent::ModelUpdated { version: central, contributions, mean_loss });
                version
            }
            // After a dropped step, or when the central model moved: a new version. A refresh
            // that found the central model unchanged keeps the version (same model).
            Phase::Joining if self.has_model && (self.aborted || central > self.base) => {
                self.version.next().max(central)
            }
            Phase::Joining if self.has_model => self.version,
            Phase::Joining => central,
        })
    }

    /// The state change of a re-base once the group model is the central model `central`:
    /// the group is at `version` and collects again; its members get the model.
    #[inline(always)]
    fn finish_rebase<M: Storage>(&mut self, sh: &mut Shared<M>, now: Instant, central: Version, version: Version) {
        let quiet = !self.has_model || version == self.version;
        self.aborted = false;
        self.base = central;
        self.version = version;
        self.has_model = true;
        self.phase = Phase::Collecting;
        self.step = 0;
        self.open_step(sh);
        if quiet {
            // Nobody has this group's model yet, or it did not change: answer those who asked.
            if self.waiting > 0 {
                sh.push_batch(self.id, Batch::Models { group: self.id, waiting: true });
            }
        } else {
            sh.broadcast(self.id);
        }
        self.waiting = 0;
        self.stall.progress(now);
    }

    pub(super) fn check_stall<M: Storage>(&mut self, sh: &mut Shared<M>, now: Instant) {
        if self.stall.due(now) && self.phase == Phase::Collecting {
            let missing = self.size.saturating_sub(self.count);
            let (id, mark) = (self.id, self.mark);
            let waiting_for = sh
                .roster
                .records()
                .iter()
                .enumerate()
                .find_map(|(i, r)| (u32::from(r.ext.group) == id && r.mark != mark).then_some(WorkerId(i as u32)));
            if let Some(waiting_for) = waiting_for {
                sh.event(ServerEvent::Stalled { waiting_for, missing, since: self.stall.since() });
            }
        }
    }
}
