//! One group's step: the BSP round inside a group and the state the groups of one server
//! share (roster, counters, outputs), used by both [`GroupedServer`] and [`GroupServer`].

use crate::error::{ConfigError, Reject};
use crate::id::{MAX_WORKERS, Version, WorkerId, WorkerSet};
use crate::math::{self, Scalar};
use crate::msg::{ToWorker, Values};
use crate::proto::common::roster::Roster;
use crate::proto::common::stall::StallWatch;
use crate::proto::{DropReason, GradientPolicy, Recipient, ServerEvent, ServerOutput, ServerStats};
use crate::time::Instant;
use heapless::Deque;

use super::*;

/// The validated partition: the group of each worker and the size of each group.
#[derive(Clone, Debug)]
pub(super) struct Layout {
    pub(super) n: u32,
    pub(super) groups: u32,
    pub(super) group_of: [u8; MAX_WORKERS],
    pub(super) size: [u16; MAX_GROUPS],
}

impl Layout {
    pub(super) fn group_of(&self, worker: WorkerId) -> Option<usize> {
        (worker.0 < self.n).then(|| self.group_of.get(worker.index()).map(|g| usize::from(*g))).flatten()
    }

    pub(super) fn members(&self, group: u32) -> impl Iterator<Item = WorkerId> + '_ {
        (0..self.n).map(WorkerId).filter(move |w| self.group_of(*w) == Some(group as usize))
    }
}

/// A grouped server's output before its payload is attached.
#[derive(Clone, Copy, Debug)]
pub(super) enum Item {
    /// Group `group`'s current model.
    Model {
        group: u32,
        to: Recipient,
    },
    Stop,
    Event(ServerEvent),
}

/// State shared by the groups of one server, indexed by (global) worker id.
#[derive(Debug)]
pub(super) struct Shared {
    pub(super) config: GroupedConfig,
    pub(super) layout: Layout,
    pub(super) roster: Roster,
    /// The admission factor (1, or a clipping factor) of each worker's gradient in its
    /// group's open step.
    pub(super) factors: [f64; MAX_WORKERS],
    pub(super) stats: ServerStats,
    pub(super) queue: Deque<Item, OUT_QUEUE>,
}

impl Shared {
    pub(super) fn new(config: GroupedConfig) -> Result<Self, ConfigError> {
        let layout = config.layout()?;
        Ok(Self {
            roster: Roster::new(config.workers)?,
            config,
            layout,
            factors: [1.0; MAX_WORKERS],
            stats: ServerStats::default(),
            queue: Deque::new(),
        })
    }

    pub(super) fn push(&mut self, item: Item) {
        // Room for the largest burst is checked before every input (`ensure_room`), so this
        // cannot fail; should it ever, the output is counted, never dropped silently.
        if self.queue.push_back(item).is_err() {
            self.stats.outputs_lost += 1;
        }
    }

    pub(super) fn event(&mut self, event: ServerEvent) {
        self.push(Item::Event(event));
    }

    pub(super) fn ensure_room(&self) -> Result<(), Reject> {
        let burst = 2 * self.layout.n as usize + 8;
        if OUT_QUEUE - self.queue.len() >= burst { Ok(()) } else { Err(Reject::Capacity) }
    }

    pub(super) fn on_join(&mut self, group: &mut Group, from: WorkerId, epoch: u32) -> Result<(), Reject> {
        let fresh = self.roster.check_join(from, epoch)?;
        self.roster.commit_join(from, epoch);
        if fresh {
            self.event(ServerEvent::WorkerJoined { worker: from, epoch });
        }
        if group.phase == Phase::Collecting {
            self.push(Item::Model { group: group.id, to: Recipient::Worker(from) });
        } else {
            group.waiting.insert(from);
        }
        Ok(())
    }

    pub(super) fn on_lost(&mut self, worker: WorkerId) -> Result<(), Reject> {
        self.roster.check_member(worker)?;
        if self.roster.lose(worker) {
            self.event(ServerEvent::WorkerLost { worker });
        }
        Ok(())
    }

    /// Sends group `group`'s model to all its members.
    pub(super) fn broadcast(&mut self, group: u32) {
        if self.layout.groups == 1 {
            self.push(Item::Model { group, to: Recipient::AllWorkers });
        } else {
            for i in 0..self.layout.n {
                if self.layout.group_of(WorkerId(i)) == Some(group as usize) {
                    self.push(Item::Model { group, to: Recipient::Worker(WorkerId(i)) });
                }
            }
        }
    }

    pub(super) fn poll<'a, T>(
        &mut self,
        version: impl Fn(u32) -> Version,
        model: impl Fn(u32) -> &'a [T],
    ) -> Option<ServerOutput<'a, T>> {
        let item = self.queue.pop_front()?;
        Some(match item {
            Item::Model { group, to } => {
                let version = version(group);
                ServerOutput::Send {
                    to,
                    msg: ToWorker::Model { version, clock: version.0, values: Values::Slice(model(group)) },
                }
            }
            Item::Stop => ServerOutput::Send { to: Recipient::AllWorkers, msg: ToWorker::Stop },
            Item::Event(e) => ServerOutput::Event(e),
        })
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
    /// Members whose gradient for the open (or exchanging) step is in.
    pub(super) got: WorkerSet,
    /// Members that joined while the group had no model to give them.
    pub(super) waiting: WorkerSet,
    /// Exchanges sent (the upstream `Grad`'s `iteration`).
    pub(super) exchanges: u64,
    /// The next upstream sequence number.
    pub(super) seq: u64,
    pub(super) stall: StallWatch,
}

impl Group {
    pub(super) fn new(id: u32, shared: &Shared) -> Self {
        let size = shared.layout.size.get(id as usize).copied().map_or(1, u32::from);
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
            got: WorkerSet::EMPTY,
            waiting: WorkerSet::EMPTY,
            exchanges: 0,
            seq: 0,
            stall,
        }
    }

    /// A member's gradient. `Ok(true)` when it completed the group step (the owner then
    /// calls [`Self::close`]).
    #[allow(clippy::too_many_arguments)]
    pub(super) fn on_grad<T: Scalar>(
        &mut self,
        sh: &mut Shared,
        now: Instant,
        from: WorkerId,
        base: Version,
        seq: u64,
        values: &Values<'_, T>,
        acc: &mut [T],
    ) -> Result<bool, Reject> {
        sh.roster.check_seq(from, seq)?;
        let factor = sh.config.gradient_policy.admit(values, acc.len())?;
        if !self.has_model {
            return Err(Reject::Unexpected { kind: "Grad" });
        }
        if base > self.version {
            return Err(Reject::FutureVersion { claimed: base, current: self.version });
        }
        let open = self.phase == Phase::Collecting && base == self.version;
        if open {
            if self.got.contains(from) {
                return Err(Reject::Duplicate { worker: from, seq });
            }
            if factor == T::one() {
                values.add_into(acc)?;
            } else {
                values.scaled_add_into(acc, factor)?;
            }
        }
        sh.roster.commit_seq(from, seq);
        sh.stats.accepted += 1;
        if !open {
            sh.stats.count_drop(DropReason::Stale);
            sh.event(ServerEvent::Dropped { worker: from, base, reason: DropReason::Stale });
            return Ok(false);
        }
        self.got.insert(from);
        if let Some(f) = sh.factors.get_mut(from.index()) {
            *f = factor.to_f64();
        }
        self.stall.progress(now);
        Ok(self.got.len() == self.size as usize)
    }

    /// Closes the group step. For a local step, updates `model` and queues the events and
    /// the broadcast; for an exchange, leaves the aggregate in `acc` (`H = 1`) or `total`.
    pub(super) fn close<T: Scalar>(
        &mut self,
        sh: &mut Shared,
        now: Instant,
        model: &mut [T],
        acc: &mut [T],
        total: &mut [T],
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
            self.got.clear();
            sh.broadcast(self.id);
            self.stall.progress(now);
            return Closed::Local;
        }
        let aggregate: &[T] = if sh.config.local_steps > 1 {
            for (t, a) in total.iter_mut().zip(acc.iter_mut()) {
                *t = *t + *a * w;
                *a = T::zero();
            }
            total
        } else {
            math::scale(acc, w);
            acc
        };
        // The central server screens what it receives like any gradient; a sum of H
        // aggregates can overflow. Drop this step rather than send what would be refused.
        if GradientPolicy::default().admit(&Values::Slice(aggregate), model.len()).is_err() {
            math::fill_zero(acc);
            math::fill_zero(total);
            for worker in self.got.iter() {
                sh.stats.count_drop(DropReason::Aborted);
                sh.event(ServerEvent::Dropped { worker, base: self.version, reason: DropReason::Aborted });
            }
            self.got.clear();
            self.step = 0;
            self.phase = Phase::Joining;
            self.aborted = true;
            return Closed::Rejoin;
        }
        self.phase = Phase::Exchanging;
        Closed::Exchange
    }

    /// Queues an `Applied` event for each member of the closed step.
    pub(super) fn report_applied(&self, sh: &mut Shared, version: Version, staleness: u64) {
        for worker in self.got.iter() {
            let factor = sh.factors.get(worker.index()).copied().unwrap_or(1.0);
            sh.event(ServerEvent::Applied {
                worker,
                base: self.version,
                version,
                staleness,
                weight: factor * self.weight,
            });
            sh.stats.applied += 1;
        }
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
    pub(super) fn rebase<T: Scalar>(
        &mut self,
        sh: &mut Shared,
        now: Instant,
        central: Version,
        values: &Values<'_, T>,
        model: &mut [T],
        acc: &mut [T],
        total: &mut [T],
    ) -> Result<(), Reject> {
        values.check_len(model.len())?;
        let version = match self.phase {
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
                sh.event(ServerEvent::ModelUpdated { version: central, contributions });
                math::fill_zero(acc);
                math::fill_zero(total);
                version
            }
            // After a dropped step, or when the central model moved: a new version. A refresh
            // that found the central model unchanged keeps the version (same model).
            Phase::Joining if self.has_model && (self.aborted || central > self.base) => {
                self.version.next().max(central)
            }
            Phase::Joining if self.has_model => self.version,
            Phase::Joining => central,
        };
        values.copy_into(model)?;
        let quiet = !self.has_model || version == self.version;
        self.aborted = false;
        self.base = central;
        self.version = version;
        self.has_model = true;
        self.phase = Phase::Collecting;
        self.step = 0;
        self.got.clear();
        if quiet {
            // Nobody has this group's model yet, or it did not change: answer those who asked.
            for worker in self.waiting.iter() {
                sh.push(Item::Model { group: self.id, to: Recipient::Worker(worker) });
            }
        } else {
            sh.broadcast(self.id);
        }
        self.waiting.clear();
        self.stall.progress(now);
        Ok(())
    }

    pub(super) fn check_stall(&mut self, sh: &mut Shared, now: Instant) {
        if self.stall.due(now) && self.phase == Phase::Collecting {
            let missing = self.size.saturating_sub(self.got.len() as u32);
            let waiting_for = sh.layout.members(self.id).find(|w| !self.got.contains(*w));
            if let Some(waiting_for) = waiting_for {
                sh.event(ServerEvent::Stalled { waiting_for, missing, since: self.stall.since() });
            }
        }
    }
}

/// Splits group `g`'s part of a [`GroupedServer`]'s scratch into (model, accumulator, sum).
pub(super) fn parts<T>(scratch: &mut [T], g: usize, dim: usize, per: usize) -> Option<(&mut [T], &mut [T], &mut [T])> {
    let len = per.checked_mul(dim)?;
    let start = g.checked_mul(len)?;
    let region = scratch.get_mut(start..start.checked_add(len)?)?;
    let (model, rest) = region.split_at_mut_checked(dim)?;
    let (acc, total) = rest.split_at_mut_checked(dim)?;
    Some((model, acc, total))
}

pub(super) fn part<T>(scratch: &[T], g: usize, dim: usize, per: usize) -> &[T] {
    let start = g.saturating_mul(per).saturating_mul(dim);
    scratch.get(start..start.saturating_add(dim)).unwrap_or(&[])
}
