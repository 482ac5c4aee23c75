//! Grouped hybrid sync/async: BSP inside groups, ASP between the groups and a central server.
//!
//! Paper: Basu, Saxena, Panja, Verma, "Balancing Stragglers Against Staleness in Distributed
//! Deep Learning", HiPC 2018 (PROTOCOLS.md §6). The `n` workers are partitioned into `G`
//! groups. Each group has its own parameter server (a *group server*) that runs BSP over its
//! `n_g` members; each group server is in turn an ASP worker of a *central server*, which
//! applies every group aggregate on arrival. A straggler therefore delays only its own
//! group, and `G` moves the scheme between pure BSP (`G = 1`) and pure ASP (`G = n`): the
//! staleness of a central update is about `G − 1`.
//!
//! # Rules
//!
//! Group step (BSP in group `g`, [`GroupServer`]): the group server holds the group model
//! `w_g`, based on central version `v_g`. Every member computes one gradient at `w_g`; when
//! all `n_g` are in, the group closes its step with the aggregate
//! `a_g = s_g / n_g · Σ g_i` (the mean, times the learning-rate scaling `s_g`).
//!
//! Central step (ASP over groups, the existing [`AspServer`] with `G` "workers"): the group
//! sends `Grad{base: v_g, a_g}`; the central server applies `w ← w − η · a_g`, `v ← v + 1` at
//! once and replies `Model{v, w}` to that group only; the group re-bases (`w_g ← w`,
//! `v_g ← v`) and broadcasts the new model to its members.
//!
//! # This project's decisions (\[RECON\] in PROTOCOLS.md §6.2)
//!
//! - **Partition** ([`Partition`]): static, given in the configuration: contiguous blocks
//!   (the default; worker `i` is in group `⌊i·G/n⌋`, sizes differ by at most one),
//!   round-robin (`i mod G`), or an explicit group-of-worker table. Stragglers are not taken
//!   into account; record where they are.
//! - **Learning rate** ([`LrScaling`]): each central update averages `n_g` gradients. The
//!   central rate is `η · s_g` with `s_g = 1` ([`LrScaling::None`], the default, §9.4),
//!   `n_g / n` ([`LrScaling::Linear`]: every gradient then carries weight `η / n`, as in BSP
//!   over `n`) or `√(n_g / n)` ([`LrScaling::Sqrt`]). All three agree when `G = 1`. The
//!   factor is folded into the aggregate (the central server runs with `η`), so groups of
//!   different sizes are scaled correctly.
//! - **Local steps** ([`GroupedConfig::local_steps`], `H ≥ 1`, default 1): with `H > 1` a
//!   group takes `H − 1` synchronous steps on its own model (`w_g ← w_g − η · a_g`, the
//!   rate the central server would apply) and sends, at the `H`-th close, the **sum** of its
//!   `H` aggregates `Σ_h a_{g,h}`. The central server applies `η` times that sum, so when no
//!   other group updated meanwhile the central model lands exactly where the group's model
//!   would after `H` steps (hierarchical local SGD; the displacement is `η · Σ_h a_{g,h}`).
//! - **Versions the workers see**: a group's model carries its own version, which strictly
//!   increases: after a re-base on central version `V` it becomes `max(previous + 1, V)`, and
//!   each local step adds one. With `H = 1` it always equals the central version the group
//!   model is, so `G = 1` reproduces the BSP trace and `G = n` the ASP trace, message for
//!   message (tested).
//! - **Staleness** of a central update is `v − 1 − v_g`: the central updates by other groups
//!   since the group's base. It is reported in [`ServerEvent::GroupApplied`] (one per central
//!   update) and in every member's [`ServerEvent::Applied`]; it is not bounded (a bound would
//!   need SSP-style gating; `G` is the knob).
//!
//! # Outcomes and invariants
//!
//! Every worker gradient has exactly one outcome: a [`Reject`], or one
//! [`ServerEvent::Applied`] / [`ServerEvent::Dropped`]. Its `Applied` event is emitted when
//! its group step closes: `base` is the group version it was computed on, `version` the group
//! version of the resulting model, `weight = s_g / n_g` (times any clipping factor), and
//! `staleness` the central staleness of the update that carried it (0 for the `H − 1` local
//! steps, which apply it to the very model it was computed on). With `H = 1` these are the
//! central versions. Invariants (RELIABILITY.md H1–H4, tested): inside a group, each step
//! aggregates exactly one gradient of each member computed at the group's current version
//! (by distinct worker, never by message count; the sum is in arrival order, exact for
//! exactly representable data); each group aggregate is applied to the central model exactly
//! once and the central version grows by one per aggregate; `G = 1` equals BSP and `G = n`
//! equals ASP. Drops: a gradient for a step that already closed ([`DropReason::Stale`],
//! only through reordering or a restarted worker), and, if a group aggregate would not pass
//! the central server's finiteness check (an `H > 1` sum can overflow), the gradients of
//! that last step ([`DropReason::Aborted`]; the group re-joins the central server and
//! restarts from its model; earlier local steps' work is lost with the group model).
//!
//! # Messages
//!
//! Workers are [`GradientWorker`](super::GradientWorker)s. A group server receives `Join`,
//! `Grad`, `Leave` from its members and sends them `Model` (to a joiner; to every member
//! after each step: one `AllWorkers` broadcast when the group is everyone, else one message
//! per member) and `Stop`. Toward the central server it sends `Join` and `Grad` and receives
//! `Model` and `Stop`.
//!
//! # Deployments
//!
//! - [`GroupedServer`]: the central server and all `G` group servers in one state machine
//!   with the [`Server`] verbs toward the `n` workers; group↔central exchanges are
//!   delivered internally and instantly. This is what `ProtocolConfig::Grouped` builds, so
//!   every adapter (threads, simulator, TCP) runs it unchanged.
//! - [`GroupServer`] on its own (a separate process): the [`Server`] verbs toward its
//!   members plus an upstream pair, [`GroupServer::poll_upstream`] (messages for the
//!   central server) and [`GroupServer::handle_upstream`] (messages from it). The central
//!   process runs a plain [`AspServer`] with [`GroupedConfig::central_config`] and the group
//!   index as the `WorkerId`. Driving contract: after every input on either side, drain
//!   both `poll_output` and `poll_upstream` until `None`. The upstream link must be
//!   reliable (TCP); a lost reply leaves the group waiting (its members are idle, and
//!   [`GroupedConfig::stall_report`] does not fire in that phase), so the transport should
//!   restart the group server on a broken connection.
//!
//! # Knobs
//!
//! `G` trades straggler tolerance (larger `G`: a straggler stalls `n_g = n / G` workers) for
//! staleness (about `G − 1` per update) and smaller effective batches. PROTOCOLS.md §6.1
//! reports that the smallest `G` whose accuracy stays within the budget is the one to use
//! ("progressive grouping": raise `G` as straggler delay grows). Put a known straggler's
//! group in mind when choosing the partition: with contiguous groups worker 0 is in group 0.
//!
//! # Liveness
//!
//! A group waits for all its members (BSP), so a dead member stalls its group forever;
//! the other groups and the central server go on. With [`GroupedConfig::stall_report`] set,
//! each stalled group reports [`ServerEvent::Stalled`] naming a member it waits for, once per
//! interval. A member that rejoins gets its group's current model; if its gradient for the
//! open step already arrived, its recomputed copy is refused as a duplicate. (In
//! [`GroupedServer`], a group of one member with no step in progress first takes the newest
//! central model, exactly as an ASP server answers a join.)

use super::asp::{AspConfig, AspServer};
use super::common::roster::Roster;
use super::common::round::check_learning_rate;
use super::common::stall::StallWatch;
use super::{Buffer, DropReason, GradientPolicy, Recipient, Server, ServerEvent, ServerOutput, ServerStats};
use crate::error::{ConfigError, Reject};
use crate::id::{MAX_WORKERS, Version, WorkerId, WorkerSet};
use crate::math::{self, Scalar};
use crate::msg::{ToServer, ToWorker, Values};
use crate::time::{Duration, Instant};
use core::marker::PhantomData;
use heapless::Deque;
use num_traits::Float;

/// The most groups one configuration may have (`G = n` needs one per worker).
pub const MAX_GROUPS: usize = MAX_WORKERS;

// Explicit partitions store group indices as `u8`.
const _: () = assert!(MAX_GROUPS <= 256);

/// Capacity of a grouped server's output queue: one event and one message per worker for
/// the largest burst (a group step closing), plus slack.
const OUT_QUEUE: usize = 4 * MAX_WORKERS + 16;

/// How the `n` workers are split into `G` groups.
// The explicit table is 256 bytes of plain configuration data, kept inline so that a
// configuration stays `Copy` and allocation-free.
#[allow(clippy::large_enum_variant)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum Partition {
    /// Contiguous blocks: worker `i` is in group `⌊i·G/n⌋` (equal sizes when `G` divides `n`,
    /// otherwise sizes differ by at most one).
    #[default]
    Contiguous,
    /// Worker `i` is in group `i mod G`.
    RoundRobin,
    /// Worker `i` is in group `table[i]`; every group `0..G` must have at least one member.
    Explicit([u8; MAX_WORKERS]),
}

impl Partition {
    /// An explicit partition from the group of each worker (`groups_of[i]` is worker `i`'s
    /// group). `None` if there are more than [`MAX_WORKERS`] entries.
    pub fn explicit(groups_of: &[u8]) -> Option<Self> {
        let mut table = [0u8; MAX_WORKERS];
        table.get_mut(..groups_of.len())?.copy_from_slice(groups_of);
        Some(Self::Explicit(table))
    }

    /// The group of `worker` among `workers` split into `groups` (no range checks beyond
    /// avoiding division by zero; [`GroupedConfig`] validates).
    pub fn group_of(&self, worker: u32, workers: u32, groups: u32) -> u32 {
        match self {
            Self::Contiguous => (u64::from(worker) * u64::from(groups) / u64::from(workers.max(1))) as u32,
            Self::RoundRobin => worker % groups.max(1),
            Self::Explicit(table) => u32::from(table.get(worker as usize).copied().unwrap_or(u8::MAX)),
        }
    }

    /// A short lowercase name.
    pub fn name(&self) -> &'static str {
        match self {
            Self::Contiguous => "contiguous",
            Self::RoundRobin => "round-robin",
            Self::Explicit(_) => "explicit",
        }
    }
}

/// How the central learning rate scales with the group size `n_g` (out of `n` workers).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum LrScaling {
    /// `η` for every central update (PROTOCOLS.md §9.4 default).
    #[default]
    None,
    /// `η · n_g / n`: each worker gradient carries weight `η / n`, as in BSP over all `n`.
    Linear,
    /// `η · √(n_g / n)`.
    Sqrt,
}

impl LrScaling {
    /// The factor `s_g` for a group of `size` out of `workers`.
    pub fn factor(self, size: u32, workers: u32) -> f64 {
        let ratio = f64::from(size) / f64::from(workers.max(1));
        match self {
            Self::None => 1.0,
            Self::Linear => ratio,
            Self::Sqrt => Float::sqrt(ratio),
        }
    }
}

/// Settings of the grouped protocol ([`GroupedServer`], [`GroupServer`]).
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct GroupedConfig {
    /// The number of workers `n` (ids `0..n`).
    pub workers: u32,
    /// The central learning rate `η`.
    pub learning_rate: f64,
    /// The number of groups `G`, `1..=n`.
    pub groups: u32,
    /// Which worker is in which group.
    pub partition: Partition,
    /// `H`: synchronous group steps per central exchange (`≥ 1`).
    pub local_steps: u32,
    /// How the central learning rate scales with the group size.
    pub lr_scaling: LrScaling,
    /// Screening of incoming worker gradients.
    pub gradient_policy: GradientPolicy,
    /// Report a [`ServerEvent::Stalled`] for a group whose step has made no progress for this
    /// long (and again every interval); `None` never reports.
    pub stall_report: Option<Duration>,
}

impl GroupedConfig {
    /// `n` workers in `G` contiguous groups, learning rate `η`, one group step per exchange,
    /// unscaled learning rate, no norm bound, no stall reports.
    pub fn new(workers: u32, learning_rate: f64, groups: u32) -> Self {
        Self {
            workers,
            learning_rate,
            groups,
            partition: Partition::Contiguous,
            local_steps: 1,
            lr_scaling: LrScaling::None,
            gradient_policy: GradientPolicy::default(),
            stall_report: None,
        }
    }

    /// The configuration of the central server: an [`AspServer`] whose `G` workers are the
    /// group servers (group `g` is `WorkerId(g)`), learning rate `η`.
    pub fn central_config(&self) -> AspConfig {
        AspConfig::new(self.groups, self.learning_rate)
    }

    /// The group of `worker`, if the worker exists.
    pub fn group_of(&self, worker: WorkerId) -> Option<u32> {
        (worker.0 < self.workers).then(|| self.partition.group_of(worker.0, self.workers, self.groups))
    }

    /// Tensors of the model's length one group needs besides its model: the step
    /// accumulator, plus the sum of aggregates when `H > 1`.
    fn group_buffers(&self) -> usize {
        if self.local_steps > 1 { 2 } else { 1 }
    }

    /// Elements of scratch a [`GroupedServer`] needs for a model of `dim` elements:
    /// `G · (2 or 3) · dim` (each group's model and accumulator, plus the sum of aggregates
    /// when `H > 1`). Saturates instead of overflowing.
    pub fn scratch_len(&self, dim: usize) -> usize {
        (self.groups as usize).saturating_mul(self.group_buffers() + 1).saturating_mul(dim)
    }

    /// Elements of scratch a stand-alone [`GroupServer`] needs besides its model: `dim`, or
    /// `2 · dim` when `H > 1`.
    pub fn group_scratch_len(&self, dim: usize) -> usize {
        self.group_buffers().saturating_mul(dim)
    }

    fn layout(&self) -> Result<Layout, ConfigError> {
        check_learning_rate(self.learning_rate)?;
        let n = self.workers;
        if n == 0 || n as usize > MAX_WORKERS {
            return Err(ConfigError::WorkerCount(n));
        }
        if self.groups == 0 || self.groups > n || self.groups as usize > MAX_GROUPS {
            return Err(ConfigError::Knob("groups"));
        }
        if self.local_steps == 0 {
            return Err(ConfigError::Knob("local_steps"));
        }
        let mut layout = Layout { n, groups: self.groups, group_of: [0; MAX_WORKERS], size: [0; MAX_GROUPS] };
        for i in 0..n {
            let g = self.partition.group_of(i, n, self.groups);
            if g >= self.groups {
                return Err(ConfigError::Knob("partition"));
            }
            if let (Some(slot), Some(size)) = (layout.group_of.get_mut(i as usize), layout.size.get_mut(g as usize)) {
                *slot = g as u8;
                *size += 1;
            }
        }
        if layout.size.iter().take(self.groups as usize).any(|s| *s == 0) {
            return Err(ConfigError::Knob("partition"));
        }
        Ok(layout)
    }
}

/// The validated partition: the group of each worker and the size of each group.
#[derive(Clone, Debug)]
struct Layout {
    n: u32,
    groups: u32,
    group_of: [u8; MAX_WORKERS],
    size: [u16; MAX_GROUPS],
}

impl Layout {
    fn group_of(&self, worker: WorkerId) -> Option<usize> {
        (worker.0 < self.n).then(|| self.group_of.get(worker.index()).map(|g| usize::from(*g))).flatten()
    }

    fn members(&self, group: u32) -> impl Iterator<Item = WorkerId> + '_ {
        (0..self.n).map(WorkerId).filter(move |w| self.group_of(*w) == Some(group as usize))
    }
}

/// A grouped server's output before its payload is attached.
#[derive(Clone, Copy, Debug)]
enum Item {
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
struct Shared {
    config: GroupedConfig,
    layout: Layout,
    roster: Roster,
    /// The admission factor (1, or a clipping factor) of each worker's gradient in its
    /// group's open step.
    factors: [f64; MAX_WORKERS],
    stats: ServerStats,
    queue: Deque<Item, OUT_QUEUE>,
}

impl Shared {
    fn new(config: GroupedConfig) -> Result<Self, ConfigError> {
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

    fn push(&mut self, item: Item) {
        // Room for the largest burst is checked before every input (`ensure_room`), so this
        // cannot fail; should it ever, the output is counted, never dropped silently.
        if self.queue.push_back(item).is_err() {
            self.stats.outputs_lost += 1;
        }
    }

    fn event(&mut self, event: ServerEvent) {
        self.push(Item::Event(event));
    }

    fn ensure_room(&self) -> Result<(), Reject> {
        let burst = 2 * self.layout.n as usize + 8;
        if OUT_QUEUE - self.queue.len() >= burst { Ok(()) } else { Err(Reject::Capacity) }
    }

    fn on_join(&mut self, group: &mut Group, from: WorkerId, epoch: u32) -> Result<(), Reject> {
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

    fn on_lost(&mut self, worker: WorkerId) -> Result<(), Reject> {
        self.roster.check_member(worker)?;
        if self.roster.lose(worker) {
            self.event(ServerEvent::WorkerLost { worker });
        }
        Ok(())
    }

    /// Sends group `group`'s model to all its members.
    fn broadcast(&mut self, group: u32) {
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

    fn poll<'a, T>(
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
enum Phase {
    /// Waiting for a model from the central server (at start, or after an aborted step).
    Joining,
    /// A group step is open: members' gradients are collected.
    Collecting,
    /// The step closed and its aggregate went to the central server; waiting for the reply.
    Exchanging,
}

/// What closing a group step asks the owner to do.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Closed {
    /// A local step (`H > 1`): the group model moved; nothing to send upstream.
    Local,
    /// Send the aggregate upstream as `Grad`.
    Exchange,
    /// The aggregate would be refused; the step was dropped: send `Join` upstream.
    Rejoin,
}

/// One group's protocol state (its tensors live in the owner's buffers).
#[derive(Clone, Copy, Debug)]
struct Group {
    id: u32,
    size: u32,
    /// `s_g / n_g`: each member gradient's weight in the aggregate.
    weight: f64,
    /// The version of the group model, as its members see it.
    version: Version,
    /// The central version the group model is based on.
    base: Version,
    has_model: bool,
    /// The last step was dropped ([`Closed::Rejoin`]): the next model must be a new version.
    aborted: bool,
    phase: Phase,
    /// Group steps closed since the last exchange.
    step: u32,
    /// Members whose gradient for the open (or exchanging) step is in.
    got: WorkerSet,
    /// Members that joined while the group had no model to give them.
    waiting: WorkerSet,
    /// Exchanges sent (the upstream `Grad`'s `iteration`).
    exchanges: u64,
    /// The next upstream sequence number.
    seq: u64,
    stall: StallWatch,
}

impl Group {
    fn new(id: u32, shared: &Shared) -> Self {
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
    fn on_grad<T: Scalar>(
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
    fn close<T: Scalar>(
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
    fn report_applied(&self, sh: &mut Shared, version: Version, staleness: u64) {
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
    fn take_exchange(&mut self) -> (Version, u64, u64) {
        let out = (self.base, self.exchanges, self.seq);
        self.exchanges += 1;
        self.seq += 1;
        out
    }

    /// The central server's `Model{central, values}`: the reply to an exchange or a join.
    #[allow(clippy::too_many_arguments)]
    fn rebase<T: Scalar>(
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

    fn check_stall(&mut self, sh: &mut Shared, now: Instant) {
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
fn parts<T>(scratch: &mut [T], g: usize, dim: usize, per: usize) -> Option<(&mut [T], &mut [T], &mut [T])> {
    let len = per.checked_mul(dim)?;
    let start = g.checked_mul(len)?;
    let region = scratch.get_mut(start..start.checked_add(len)?)?;
    let (model, rest) = region.split_at_mut_checked(dim)?;
    let (acc, total) = rest.split_at_mut_checked(dim)?;
    Some((model, acc, total))
}

fn part<T>(scratch: &[T], g: usize, dim: usize, per: usize) -> &[T] {
    let start = g.saturating_mul(per).saturating_mul(dim);
    scratch.get(start..start.saturating_add(dim)).unwrap_or(&[])
}

/// The grouped protocol in one state machine: the central [`AspServer`] and the `G` group
/// servers, exchanging instantly and internally, with the [`Server`] verbs toward the `n`
/// workers. `S` is the caller's storage: `params` holds the central model; `scratch` at
/// least [`GroupedConfig::scratch_len`] elements (each group's model and accumulators).
///
/// [`Server::version`] and [`Server::params`] are the central model's; [`Server::stats`]
/// counts worker gradients (`updates` counts central updates).
#[derive(Debug)]
pub struct GroupedServer<T, S> {
    central: AspServer<T, S>,
    scratch: S,
    groups: [Group; MAX_GROUPS],
    shared: Shared,
    dim: usize,
    per: usize,
    _t: PhantomData<T>,
}

impl<T: Scalar, S: Buffer<T>> GroupedServer<T, S> {
    /// A server starting from the model in `params` at version 0.
    pub fn new(config: GroupedConfig, params: S, scratch: S) -> Result<Self, ConfigError> {
        Self::resume(config, params, scratch, Version::ZERO)
    }

    /// A server resuming from a checkpoint: `params` is the central model at `version`.
    pub fn resume(config: GroupedConfig, params: S, mut scratch: S, version: Version) -> Result<Self, ConfigError> {
        let shared = Shared::new(config)?;
        let dim = params.as_ref().len();
        let central = AspServer::resume(config.central_config(), params, version)?;
        let needed = config.scratch_len(dim);
        let given = scratch.as_ref().len();
        let Some(area) = scratch.as_mut().get_mut(..needed) else {
            return Err(ConfigError::ScratchTooSmall { needed, given });
        };
        math::fill_zero(area);
        let mut groups = [Group::new(0, &shared); MAX_GROUPS];
        for (g, group) in groups.iter_mut().enumerate().take(config.groups as usize) {
            *group = Group::new(g as u32, &shared);
        }
        let mut server =
            Self { central, scratch, groups, shared, dim, per: config.group_buffers() + 1, _t: PhantomData };
        for g in 0..config.groups {
            server.exchange(Instant::ZERO, g as usize, Closed::Rejoin);
        }
        Ok(server)
    }

    /// The settings.
    pub fn config(&self) -> &GroupedConfig {
        &self.shared.config
    }

    /// The central server.
    pub fn central(&self) -> &AspServer<T, S> {
        &self.central
    }

    /// Group `g`'s model version (as its members see it), if `g < G`.
    pub fn group_version(&self, g: u32) -> Option<Version> {
        self.groups.get(g as usize).filter(|_| g < self.shared.layout.groups).map(|gr| gr.version)
    }

    /// The central version group `g`'s model is based on, if `g < G`.
    pub fn group_base(&self, g: u32) -> Option<Version> {
        self.groups.get(g as usize).filter(|_| g < self.shared.layout.groups).map(|gr| gr.base)
    }

    /// Group `g`'s model, if `g < G`.
    pub fn group_model(&self, g: u32) -> Option<&[T]> {
        (g < self.shared.layout.groups).then(|| part(self.scratch.as_ref(), g as usize, self.dim, self.per))
    }

    /// Sends group `g`'s pending upstream message (`Grad` after [`Closed::Exchange`], `Join`
    /// after [`Closed::Rejoin`]) to the central server and delivers its reply.
    fn exchange(&mut self, now: Instant, g: usize, closed: Closed) {
        let Self { central, scratch, groups, shared, dim, per, .. } = self;
        let (Some(group), Some((model, acc, total))) = (groups.get_mut(g), parts(scratch.as_mut(), g, *dim, *per))
        else {
            return;
        };
        let from = WorkerId(group.id);
        let sent = match closed {
            Closed::Local => return,
            Closed::Exchange => {
                let (base, iteration, seq) = group.take_exchange();
                let aggregate: &[T] = if shared.config.local_steps > 1 { &*total } else { &*acc };
                central.handle(now, from, ToServer::Grad { base, iteration, seq, values: Values::Slice(aggregate) })
            }
            Closed::Rejoin => central.handle(now, from, ToServer::Join { epoch: 0 }),
        };
        // The central server takes every aggregate that passed the same screening, and
        // answers a join of a known member with its model.
        debug_assert!(sent.is_ok(), "central server refused a group message: {sent:?}");
        while let Some(out) = central.poll_output() {
            if let ServerOutput::Send { to: Recipient::Worker(to), msg: ToWorker::Model { version, values, .. } } = out
            {
                if to == from {
                    let result = group.rebase(shared, now, version, &values, model, acc, total);
                    debug_assert!(result.is_ok(), "group re-base failed: {result:?}");
                }
            }
        }
    }

    /// A group of one member that is (re)joining, with no step in progress, takes the newest
    /// central model first (no other member can be computing on the old one), as an ASP
    /// worker would.
    fn refresh_single(&mut self, g: usize) {
        let Self { central, scratch, groups, dim, per, .. } = self;
        let Some(group) = groups.get_mut(g) else { return };
        let current = central.version();
        if group.size != 1
            || group.step != 0
            || !group.got.is_empty()
            || group.phase != Phase::Collecting
            || current <= group.base
        {
            return;
        }
        if let Some((model, _, _)) = parts(scratch.as_mut(), g, *dim, *per) {
            if math::copy(model, central.params()).is_ok() {
                group.base = current;
                group.version = group.version.next().max(current);
            }
        }
    }

    fn on_grad(
        &mut self,
        now: Instant,
        g: usize,
        from: WorkerId,
        base: Version,
        seq: u64,
        values: &Values<'_, T>,
    ) -> Result<(), Reject> {
        let Self { scratch, groups, shared, dim, per, .. } = self;
        let group = groups.get_mut(g).ok_or(Reject::UnknownWorker(from))?;
        let (model, acc, total) = parts(scratch.as_mut(), g, *dim, *per).ok_or(Reject::Capacity)?;
        if group.on_grad(shared, now, from, base, seq, values, acc)? {
            let closed = group.close(shared, now, model, acc, total);
            self.exchange(now, g, closed);
        }
        Ok(())
    }
}

impl<T: Scalar, S: Buffer<T>> Server<T> for GroupedServer<T, S> {
    fn handle(&mut self, now: Instant, from: WorkerId, msg: ToServer<'_, T>) -> Result<(), Reject> {
        let result = self.shared.ensure_room().and_then(|()| {
            self.shared.roster.check_member(from)?;
            let g = self.shared.layout.group_of(from).ok_or(Reject::UnknownWorker(from))?;
            match msg {
                ToServer::Join { epoch } => {
                    self.shared.roster.check_join(from, epoch)?;
                    self.refresh_single(g);
                    let group = self.groups.get_mut(g).ok_or(Reject::UnknownWorker(from))?;
                    self.shared.on_join(group, from, epoch)
                }
                ToServer::Grad { base, seq, values, .. } => self.on_grad(now, g, from, base, seq, &values),
                ToServer::Leave => self.shared.on_lost(from),
                other => Err(Reject::Unexpected { kind: other.kind_name() }),
            }
        });
        if result.is_err() {
            self.shared.stats.rejected += 1;
        }
        result
    }

    fn handle_worker_lost(&mut self, _now: Instant, worker: WorkerId) -> Result<(), Reject> {
        self.shared.on_lost(worker)
    }

    fn handle_timeout(&mut self, now: Instant) {
        let g = self.shared.layout.groups as usize;
        for group in self.groups.iter_mut().take(g) {
            group.check_stall(&mut self.shared, now);
        }
    }

    fn poll_output(&mut self) -> Option<ServerOutput<'_, T>> {
        let scratch = self.scratch.as_ref();
        let groups = &self.groups;
        let (dim, per) = (self.dim, self.per);
        self.shared.poll(
            |g| groups.get(g as usize).map_or(Version::ZERO, |gr| gr.version),
            |g| part(scratch, g as usize, dim, per),
        )
    }

    fn poll_timeout(&self) -> Option<Instant> {
        let g = self.shared.layout.groups as usize;
        self.groups.iter().take(g).filter_map(|gr| gr.stall.deadline()).min()
    }

    fn stop(&mut self) {
        for group in self.groups.iter_mut() {
            group.stall.idle();
        }
        self.shared.push(Item::Stop);
    }

    fn version(&self) -> Version {
        self.central.version()
    }

    fn params(&self) -> &[T] {
        self.central.params()
    }

    fn stats(&self) -> &ServerStats {
        &self.shared.stats
    }
}

/// An upstream message before its payload is attached.
#[derive(Clone, Copy, Debug)]
enum Up {
    Join,
    Grad { base: Version, iteration: u64, seq: u64 },
}

/// One group server on its own (for a group server in its own process): BSP toward its
/// members, an ASP worker of the central server upstream. See the [module docs](self) for
/// the driving contract. `S` is the caller's storage: `model` (the model's length; its
/// contents are replaced by the central server's first `Model`) and `scratch` of at least
/// [`GroupedConfig::group_scratch_len`] elements.
///
/// Members keep their global worker ids; ids outside the group are refused as unknown.
/// [`Server::version`] and [`Server::params`] are the group model's.
#[derive(Debug)]
pub struct GroupServer<T, S> {
    group: Group,
    shared: Shared,
    epoch: u32,
    model: S,
    scratch: S,
    up: Deque<Up, 4>,
    _t: PhantomData<T>,
}

impl<T: Scalar, S: Buffer<T>> GroupServer<T, S> {
    /// Group `group` of `config`, joining the central server with session `epoch` (increase
    /// it on every restart). Its first upstream output is `Join`.
    pub fn new(config: GroupedConfig, group: u32, epoch: u32, model: S, mut scratch: S) -> Result<Self, ConfigError> {
        let mut shared = Shared::new(config)?;
        if group >= config.groups {
            return Err(ConfigError::Knob("group"));
        }
        let dim = model.as_ref().len();
        if dim == 0 {
            return Err(ConfigError::EmptyModel);
        }
        let needed = config.group_scratch_len(dim);
        let given = scratch.as_ref().len();
        let Some(area) = scratch.as_mut().get_mut(..needed) else {
            return Err(ConfigError::ScratchTooSmall { needed, given });
        };
        math::fill_zero(area);
        let mut up = Deque::new();
        // The first item of an empty queue: cannot fail, and is counted if it does.
        if up.push_back(Up::Join).is_err() {
            shared.stats.outputs_lost += 1;
        }
        let mut group = Group::new(group, &shared);
        group.seq = crate::id::first_seq(epoch);
        Ok(Self { group, shared, epoch, model, scratch, up, _t: PhantomData })
    }

    /// The settings.
    pub fn config(&self) -> &GroupedConfig {
        &self.shared.config
    }

    /// This group's index.
    pub fn group(&self) -> u32 {
        self.group.id
    }

    /// The central version the group model is based on.
    pub fn central_base(&self) -> Version {
        self.group.base
    }

    /// Whether an exchange (or a join) awaits the central server's reply.
    pub fn awaiting_central(&self) -> bool {
        self.group.phase != Phase::Collecting
    }

    /// The next message for the central server (payloads borrow the group's buffers);
    /// `None` when drained.
    pub fn poll_upstream(&mut self) -> Option<ToServer<'_, T>> {
        let item = self.up.pop_front()?;
        Some(match item {
            Up::Join => ToServer::Join { epoch: self.epoch },
            Up::Grad { base, iteration, seq } => {
                let dim = self.model.as_ref().len();
                let scratch = self.scratch.as_ref();
                let aggregate =
                    if self.shared.config.local_steps > 1 { scratch.get(dim..2 * dim) } else { scratch.get(..dim) };
                ToServer::Grad { base, iteration, seq, values: Values::Slice(aggregate.unwrap_or(&[])) }
            }
        })
    }

    /// A message from the central server arrived at `now`: `Model` (the reply to a `Join` or
    /// to an exchange) or `Stop` (passed on to the members).
    pub fn handle_upstream(&mut self, now: Instant, msg: ToWorker<'_, T>) -> Result<(), Reject> {
        self.shared.ensure_room()?;
        match msg {
            ToWorker::Model { version, values, .. } => {
                let (model, acc, total) = {
                    let dim = self.model.as_ref().len();
                    let total_len = if self.shared.config.local_steps > 1 { dim } else { 0 };
                    let (acc, total) = self.scratch.as_mut().split_at_mut_checked(dim).ok_or(Reject::Capacity)?;
                    (self.model.as_mut(), acc, total.get_mut(..total_len).ok_or(Reject::Capacity)?)
                };
                self.group.rebase(&mut self.shared, now, version, &values, model, acc, total)
            }
            ToWorker::Stop => {
                self.stop();
                Ok(())
            }
            other => Err(Reject::Unexpected { kind: other.kind_name() }),
        }
    }
}

impl<T: Scalar, S: Buffer<T>> Server<T> for GroupServer<T, S> {
    fn handle(&mut self, now: Instant, from: WorkerId, msg: ToServer<'_, T>) -> Result<(), Reject> {
        let result = self.shared.ensure_room().and_then(|()| {
            if self.shared.layout.group_of(from) != Some(self.group.id as usize) {
                return Err(Reject::UnknownWorker(from));
            }
            match msg {
                ToServer::Join { epoch } => {
                    self.shared.roster.check_join(from, epoch)?;
                    let g = &mut self.group;
                    if g.size == 1 && g.step == 0 && g.got.is_empty() && g.phase == Phase::Collecting {
                        // A group of one with no step in progress refreshes from the central
                        // server first (as an ASP server answers a join); see `GroupedServer`.
                        if self.up.is_full() {
                            return Err(Reject::Capacity);
                        }
                        g.phase = Phase::Joining;
                        if self.up.push_back(Up::Join).is_err() {
                            self.shared.stats.outputs_lost += 1;
                        }
                    }
                    self.shared.on_join(&mut self.group, from, epoch)
                }
                ToServer::Grad { base, seq, values, .. } => {
                    if self.up.len() + 1 > self.up.capacity() {
                        return Err(Reject::Capacity);
                    }
                    let shared = &mut self.shared;
                    let group = &mut self.group;
                    let dim = self.model.as_ref().len();
                    let total_len = if shared.config.local_steps > 1 { dim } else { 0 };
                    let (acc, total) = self.scratch.as_mut().split_at_mut_checked(dim).ok_or(Reject::Capacity)?;
                    let total = total.get_mut(..total_len).ok_or(Reject::Capacity)?;
                    if group.on_grad(shared, now, from, base, seq, &values, acc)? {
                        let up = match group.close(shared, now, self.model.as_mut(), acc, total) {
                            Closed::Local => None,
                            Closed::Exchange => {
                                let (base, iteration, seq) = group.take_exchange();
                                Some(Up::Grad { base, iteration, seq })
                            }
                            Closed::Rejoin => Some(Up::Join),
                        };
                        // Room was checked above: this cannot fail, and is counted if it does.
                        if up.is_some_and(|item| self.up.push_back(item).is_err()) {
                            shared.stats.outputs_lost += 1;
                        }
                    }
                    Ok(())
                }
                ToServer::Leave => self.shared.on_lost(from),
                other => Err(Reject::Unexpected { kind: other.kind_name() }),
            }
        });
        if result.is_err() {
            self.shared.stats.rejected += 1;
        }
        result
    }

    fn handle_worker_lost(&mut self, _now: Instant, worker: WorkerId) -> Result<(), Reject> {
        if self.shared.layout.group_of(worker) != Some(self.group.id as usize) {
            return Err(Reject::UnknownWorker(worker));
        }
        self.shared.on_lost(worker)
    }

    fn handle_timeout(&mut self, now: Instant) {
        self.group.check_stall(&mut self.shared, now);
    }

    fn poll_output(&mut self) -> Option<ServerOutput<'_, T>> {
        let version = self.group.version;
        let model = self.model.as_ref();
        self.shared.poll(|_| version, |_| model)
    }

    fn poll_timeout(&self) -> Option<Instant> {
        self.group.stall.deadline()
    }

    fn stop(&mut self) {
        self.group.stall.idle();
        self.shared.push(Item::Stop);
    }

    fn version(&self) -> Version {
        self.group.version
    }

    fn params(&self) -> &[T] {
        self.model.as_ref()
    }

    fn stats(&self) -> &ServerStats {
        &self.shared.stats
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::proto::asp::AspServer;
    use crate::proto::bsp::{BspConfig, BspServer};
    use crate::proto::{GradientWorker, GradientWorkerConfig, ToServerOwned, ToWorkerOwned, Worker, WorkerOutput};
    use core::cmp::Reverse;
    use proptest::prelude::*;
    use std::collections::{BTreeMap, BinaryHeap};
    use std::vec;
    use std::vec::Vec;

    type Grouped = GroupedServer<f64, Vec<f64>>;

    fn grouped(config: GroupedConfig, dim: usize) -> Grouped {
        GroupedServer::new(config, vec![1.0; dim], vec![0.0; config.scratch_len(dim)]).unwrap()
    }

    fn grad(base: u64, seq: u64, values: &[f64]) -> ToServer<'_, f64> {
        ToServer::Grad { base: Version(base), iteration: 0, seq, values: Values::Slice(values) }
    }

    /// An output with its payload copied.
    #[derive(Clone, Debug, PartialEq)]
    enum Out {
        Event(ServerEvent),
        Send(Recipient, ToWorkerOwned),
    }

    fn drain_server<S: Server<f64>>(s: &mut S) -> Vec<Out> {
        let mut outs = Vec::new();
        while let Some(out) = s.poll_output() {
            outs.push(match out {
                ServerOutput::Event(e) => Out::Event(e),
                ServerOutput::Send { to, msg } => Out::Send(to, ToWorkerOwned::from(&msg)),
            });
        }
        outs
    }

    /// Anything the harness can drive: a server, or hand-wired group servers and a central one.
    trait Harnessed {
        fn feed(&mut self, now: Instant, from: WorkerId, msg: ToServer<'_, f64>) -> Result<(), Reject>;
        fn drain(&mut self) -> Vec<Out>;
        fn central(&self) -> (Version, Vec<f64>);
        fn stats(&self) -> ServerStats;
    }

    struct Plain<S>(S);

    impl<S: Server<f64>> Harnessed for Plain<S> {
        fn feed(&mut self, now: Instant, from: WorkerId, msg: ToServer<'_, f64>) -> Result<(), Reject> {
            self.0.handle(now, from, msg)
        }
        fn drain(&mut self) -> Vec<Out> {
            drain_server(&mut self.0)
        }
        fn central(&self) -> (Version, Vec<f64>) {
            (self.0.version(), self.0.params().to_vec())
        }
        fn stats(&self) -> ServerStats {
            *self.0.stats()
        }
    }

    /// The distributed deployment in miniature: stand-alone [`GroupServer`]s and a plain
    /// [`AspServer`] central, their upstream messages delivered instantly by hand.
    struct Wired {
        config: GroupedConfig,
        groups: Vec<GroupServer<f64, Vec<f64>>>,
        central: AspServer<f64, Vec<f64>>,
        stats: ServerStats,
    }

    impl Wired {
        fn new(config: GroupedConfig, dim: usize) -> Self {
            let groups = (0..config.groups)
                .map(|g| {
                    GroupServer::new(config, g, 0, vec![0.0; dim], vec![0.0; config.group_scratch_len(dim)]).unwrap()
                })
                .collect();
            let central = AspServer::new(config.central_config(), vec![1.0; dim]).unwrap();
            let mut wired = Self { config, groups, central, stats: ServerStats::default() };
            for g in 0..config.groups as usize {
                wired.pump(g);
            }
            // Joining the central server produced no output toward the workers.
            assert!(wired.drain().is_empty());
            wired
        }

        fn pump(&mut self, g: usize) {
            let mut buf = Vec::new();
            while let Some(up) = self.groups[g].poll_upstream() {
                let up = ToServerOwned::from(&up);
                self.central.handle(Instant::ZERO, WorkerId(g as u32), up.as_msg(&mut buf)).unwrap();
                let replies: Vec<_> = drain_server(&mut self.central);
                for reply in replies {
                    if let Out::Send(Recipient::Worker(to), msg) = reply {
                        assert_eq!(to, WorkerId(g as u32));
                        self.groups[g].handle_upstream(Instant::ZERO, msg.as_msg(&mut buf)).unwrap();
                    }
                }
            }
        }
    }

    impl Harnessed for Wired {
        fn feed(&mut self, now: Instant, from: WorkerId, msg: ToServer<'_, f64>) -> Result<(), Reject> {
            let Some(g) = self.config.group_of(from) else {
                self.stats.rejected += 1;
                return Err(Reject::UnknownWorker(from));
            };
            let result = self.groups[g as usize].handle(now, from, msg);
            self.pump(g as usize);
            result
        }
        fn drain(&mut self) -> Vec<Out> {
            self.groups.iter_mut().flat_map(drain_server).collect()
        }
        fn central(&self) -> (Version, Vec<f64>) {
            (self.central.version(), self.central.params().to_vec())
        }
        fn stats(&self) -> ServerStats {
            let mut total = self.stats;
            for g in &self.groups {
                let s = g.stats();
                total.accepted += s.accepted;
                total.applied += s.applied;
                total.rejected += s.rejected;
                total.updates += s.updates;
                for (t, d) in total.dropped.iter_mut().zip(s.dropped) {
                    *t += d;
                }
            }
            total
        }
    }

    /// What the harness records: every output, the central model after every update, and
    /// what became of every message a worker sent.
    #[derive(Clone, Debug, PartialEq)]
    enum Rec {
        Out(Out),
        Central(u64, Vec<u64>),
        Fed(u32, Result<(), Reject>),
    }

    enum Msg {
        Up(u32, ToServerOwned),
        Down(u32, ToWorkerOwned),
    }

    struct Run {
        trace: Vec<Rec>,
        /// Every gradient sent: (worker, base) → values.
        sent: BTreeMap<(u32, u64), Vec<f64>>,
        /// Gradient messages the server took (`Ok`).
        admitted: u64,
    }

    /// An integer-valued gradient that depends on the worker, the version and the model.
    fn gradient(worker: u32, version: u64, params: &[f64]) -> Vec<f64> {
        params
            .iter()
            .enumerate()
            .map(|(j, p)| {
                let k = (u64::from(worker) * 31 + version * 7 + j as u64 * 3) % 17;
                k as f64 - 8.0 + p.floor().rem_euclid(3.0)
            })
            .collect()
    }

    /// Runs `n` gradient workers against `h`, delivering messages in a seeded random order
    /// (and, with `dup_percent`, delivering some messages twice: any message if `dup_all`,
    /// else only gradients), until the central model reaches `updates` versions or nothing is
    /// in flight.
    fn run(h: &mut impl Harnessed, n: u32, seed: u64, updates: u64, dup_percent: u64, dup_all: bool) -> Run {
        let mut rng = seed | 1;
        let mut next = move || {
            rng ^= rng << 13;
            rng ^= rng >> 7;
            rng ^= rng << 17;
            rng
        };
        let dim = h.central().1.len();
        let mut workers: Vec<_> = (0..n)
            .map(|i| GradientWorker::new(GradientWorkerConfig::new(WorkerId(i)), vec![0.0f64; dim]).unwrap())
            .collect();
        let mut inflight = Vec::new();
        let mut out = Run { trace: Vec::new(), sent: BTreeMap::new(), admitted: 0 };
        let mut buf = Vec::new();
        let now = Instant::ZERO;
        fn pump_worker(
            w: &mut GradientWorker<f64, Vec<f64>>,
            inflight: &mut Vec<Msg>,
            sent: &mut BTreeMap<(u32, u64), Vec<f64>>,
        ) {
            let mut job = None;
            let me = w.id().0;
            while let Some(o) = w.poll_output() {
                match o {
                    WorkerOutput::Send(msg) => {
                        if let ToServer::Grad { base, values, .. } = &msg {
                            let mut v = vec![0.0; values.len()];
                            values.copy_into(&mut v).unwrap();
                            sent.insert((me, base.0), v);
                        }
                        inflight.push(Msg::Up(me, ToServerOwned::from(&msg)));
                    }
                    WorkerOutput::Compute { id, version, params } => {
                        job = Some((id, gradient(me, version.0, params)));
                    }
                    WorkerOutput::Event(_) => {}
                }
            }
            if let Some((id, g)) = job {
                w.handle_gradient(Instant::ZERO, id, &g).unwrap();
                pump_worker(w, inflight, sent);
            }
        }
        for w in workers.iter_mut() {
            pump_worker(w, &mut inflight, &mut out.sent);
        }
        while !inflight.is_empty() && h.central().0.0 < updates {
            let i = (next() % inflight.len() as u64) as usize;
            let duplicate = next() % 100 < dup_percent
                && (dup_all || matches!(inflight[i], Msg::Up(_, ToServerOwned::Grad { .. })));
            let msg = if duplicate {
                match &inflight[i] {
                    Msg::Up(w, m) => Msg::Up(*w, m.clone()),
                    Msg::Down(w, m) => Msg::Down(*w, m.clone()),
                }
            } else {
                inflight.swap_remove(i)
            };
            match msg {
                Msg::Up(w, m) => {
                    let result = h.feed(now, WorkerId(w), m.as_msg(&mut buf));
                    if result.is_ok() && matches!(m, ToServerOwned::Grad { .. }) {
                        out.admitted += 1;
                    }
                    out.trace.push(Rec::Fed(w, result));
                    for o in h.drain() {
                        match &o {
                            Out::Event(ServerEvent::ModelUpdated { .. }) => {
                                let (v, p) = h.central();
                                out.trace.push(Rec::Out(o.clone()));
                                out.trace.push(Rec::Central(v.0, p.iter().map(|x| x.to_bits()).collect()));
                                continue;
                            }
                            Out::Send(Recipient::AllWorkers, m) => {
                                for i in 0..n {
                                    inflight.push(Msg::Down(i, m.clone()));
                                }
                            }
                            Out::Send(Recipient::Worker(to), m) => inflight.push(Msg::Down(to.0, m.clone())),
                            Out::Event(_) => {}
                        }
                        out.trace.push(Rec::Out(o));
                    }
                }
                Msg::Down(w, m) => {
                    let worker = &mut workers[w as usize];
                    let _ = worker.handle(now, m.as_msg(&mut buf));
                    pump_worker(worker, &mut inflight, &mut out.sent);
                }
            }
        }
        out
    }

    fn without_group_events(trace: &[Rec]) -> Vec<Rec> {
        trace.iter().filter(|r| !matches!(r, Rec::Out(Out::Event(ServerEvent::GroupApplied { .. })))).cloned().collect()
    }

    #[test]
    fn partitions() {
        let groups = |p: Partition, n: u32, g: u32| (0..n).map(|i| p.group_of(i, n, g)).collect::<Vec<_>>();
        assert_eq!(groups(Partition::Contiguous, 8, 4), [0, 0, 1, 1, 2, 2, 3, 3]);
        assert_eq!(groups(Partition::Contiguous, 5, 2), [0, 0, 0, 1, 1]);
        assert_eq!(groups(Partition::RoundRobin, 5, 2), [0, 1, 0, 1, 0]);
        let explicit = Partition::explicit(&[1, 0, 1]).unwrap();
        assert_eq!(groups(explicit, 3, 2), [1, 0, 1]);
        assert!(Partition::explicit(&[0; MAX_WORKERS + 1]).is_none());
        let mut c = GroupedConfig::new(3, 0.5, 2);
        c.partition = explicit;
        assert_eq!(c.group_of(WorkerId(0)), Some(1));
        assert_eq!(c.group_of(WorkerId(3)), None);
        assert_eq!(LrScaling::Linear.factor(4, 16), 0.25);
        assert_eq!(LrScaling::Sqrt.factor(4, 16), 0.5);
        assert_eq!(LrScaling::None.factor(4, 16), 1.0);
    }

    #[test]
    fn config_errors() {
        let bad = |c: GroupedConfig, scratch: usize| {
            GroupedServer::<f32, Vec<f32>>::new(c, vec![0.0; 2], vec![0.0; scratch]).err()
        };
        assert_eq!(bad(GroupedConfig::new(4, 0.5, 0), 100), Some(ConfigError::Knob("groups")));
        assert_eq!(bad(GroupedConfig::new(4, 0.5, 5), 100), Some(ConfigError::Knob("groups")));
        assert_eq!(bad(GroupedConfig::new(0, 0.5, 1), 100), Some(ConfigError::WorkerCount(0)));
        assert_eq!(bad(GroupedConfig::new(4, 0.0, 2), 100), Some(ConfigError::LearningRate));
        let mut c = GroupedConfig::new(4, 0.5, 2);
        c.local_steps = 0;
        assert_eq!(bad(c, 100), Some(ConfigError::Knob("local_steps")));
        let mut c = GroupedConfig::new(4, 0.5, 2);
        c.partition = Partition::explicit(&[0, 0, 0, 0]).unwrap();
        assert_eq!(bad(c, 100), Some(ConfigError::Knob("partition")), "group 1 is empty");
        c.partition = Partition::explicit(&[0, 1, 2, 1]).unwrap();
        assert_eq!(bad(c, 100), Some(ConfigError::Knob("partition")), "group 2 does not exist");
        let c = GroupedConfig::new(4, 0.5, 2);
        assert_eq!(c.scratch_len(2), 8);
        assert_eq!(bad(c, 7), Some(ConfigError::ScratchTooSmall { needed: 8, given: 7 }));
        let mut h = GroupedConfig::new(4, 0.5, 2);
        h.local_steps = 3;
        assert_eq!((h.scratch_len(2), h.group_scratch_len(2)), (12, 4));
        assert!(GroupedServer::<f32, Vec<f32>>::new(c, vec![], vec![0.0; 8]).is_err());
        let standalone =
            |g, m: usize, s: usize| GroupServer::<f32, Vec<f32>>::new(c, g, 0, vec![0.0; m], vec![0.0; s]).err();
        assert_eq!(standalone(2, 2, 2), Some(ConfigError::Knob("group")));
        assert_eq!(standalone(0, 0, 2), Some(ConfigError::EmptyModel));
        assert_eq!(standalone(0, 2, 1), Some(ConfigError::ScratchTooSmall { needed: 2, given: 1 }));
        assert!(standalone(1, 2, 2).is_none());
    }

    #[test]
    fn a_group_step_updates_the_central_model_on_arrival() {
        // 4 workers in 2 groups {0,1} {2,3}; η = 0.5.
        let mut s = grouped(GroupedConfig::new(4, 0.5, 2), 1);
        s.handle(Instant::ZERO, WorkerId(2), grad(0, 0, &[2.0])).unwrap();
        s.handle(Instant::ZERO, WorkerId(0), grad(0, 0, &[4.0])).unwrap();
        assert_eq!(s.version(), Version(0));
        let _ = drain_server(&mut s);
        s.handle(Instant::ZERO, WorkerId(3), grad(0, 0, &[6.0])).unwrap();
        // Group 1 closed: mean 4, w = 1 - 0.5 * 4 = -1.
        assert_eq!((s.version(), s.params()), (Version(1), &[-1.0][..]));
        assert_eq!(s.group_version(1), Some(Version(1)));
        assert_eq!(s.group_version(0), Some(Version(0)));
        let outs = drain_server(&mut s);
        assert_eq!(
            outs,
            [
                Out::Event(ServerEvent::GroupApplied {
                    group: 1,
                    base: Version(0),
                    version: Version(1),
                    staleness: 0,
                    contributions: 2
                }),
                Out::Event(ServerEvent::Applied {
                    worker: WorkerId(2),
                    base: Version(0),
                    version: Version(1),
                    staleness: 0,
                    weight: 0.5
                }),
                Out::Event(ServerEvent::Applied {
                    worker: WorkerId(3),
                    base: Version(0),
                    version: Version(1),
                    staleness: 0,
                    weight: 0.5
                }),
                Out::Event(ServerEvent::ModelUpdated { version: Version(1), contributions: 2 }),
                Out::Send(
                    Recipient::Worker(WorkerId(2)),
                    ToWorkerOwned::Model { version: 1, clock: 1, values: vec![-1.0] }
                ),
                Out::Send(
                    Recipient::Worker(WorkerId(3)),
                    ToWorkerOwned::Model { version: 1, clock: 1, values: vec![-1.0] }
                ),
            ]
        );
        // Group 0 closes on its old base: staleness 1, applied to the current central model.
        s.handle(Instant::ZERO, WorkerId(1), grad(0, 0, &[8.0])).unwrap();
        assert_eq!((s.version(), s.params()), (Version(2), &[-4.0][..]));
        let outs = drain_server(&mut s);
        assert!(outs.contains(&Out::Event(ServerEvent::GroupApplied {
            group: 0,
            base: Version(0),
            version: Version(2),
            staleness: 1,
            contributions: 2
        })));
        assert!(outs.contains(&Out::Send(
            Recipient::Worker(WorkerId(0)),
            ToWorkerOwned::Model { version: 2, clock: 2, values: vec![-4.0] }
        )));
        assert_eq!(s.group_base(0), Some(Version(2)));
        assert_eq!(s.group_model(0), Some(&[-4.0][..]));
        assert_eq!(s.group_model(1), Some(&[-1.0][..]));
        assert_eq!(s.group_model(2), None);
        assert_eq!((s.stats().accepted, s.stats().applied, s.stats().updates), (4, 4, 2));
    }

    #[test]
    fn refusals_change_nothing() {
        let mut s = grouped(GroupedConfig::new(4, 0.5, 2), 2);
        let now = Instant::ZERO;
        s.handle(now, WorkerId(0), grad(0, 3, &[1.0, 1.0])).unwrap();
        let _ = drain_server(&mut s);
        let snapshot = |s: &Grouped| {
            (s.params().to_vec(), s.version(), s.group_version(0), s.groups[0].got, s.group_model(0).unwrap().to_vec())
        };
        let before = snapshot(&s);
        let acc_before = parts(s.scratch.as_mut(), 0, 2, 2).unwrap().1.to_vec();
        assert_eq!(
            s.handle(now, WorkerId(0), grad(0, 3, &[1.0, 1.0])),
            Err(Reject::Duplicate { worker: WorkerId(0), seq: 3 })
        );
        assert_eq!(
            s.handle(now, WorkerId(0), grad(0, 4, &[1.0, 1.0])),
            Err(Reject::Duplicate { worker: WorkerId(0), seq: 4 })
        );
        assert_eq!(s.handle(now, WorkerId(4), grad(0, 0, &[1.0, 1.0])), Err(Reject::UnknownWorker(WorkerId(4))));
        assert_eq!(
            s.handle(now, WorkerId(u32::MAX), grad(0, 0, &[1.0, 1.0])),
            Err(Reject::UnknownWorker(WorkerId(u32::MAX)))
        );
        assert!(matches!(s.handle(now, WorkerId(1), grad(0, 0, &[1.0])), Err(Reject::WrongLength(_))));
        assert_eq!(s.handle(now, WorkerId(1), grad(0, 0, &[f64::NAN, 1.0])), Err(Reject::NotFinite));
        assert_eq!(s.handle(now, WorkerId(1), grad(0, 0, &[f64::INFINITY, 1.0])), Err(Reject::NotFinite));
        assert_eq!(s.handle(now, WorkerId(1), grad(0, 0, &[1e300, 1e300])), Err(Reject::NormTooLarge));
        assert_eq!(
            s.handle(now, WorkerId(1), grad(1, 0, &[1.0, 1.0])),
            Err(Reject::FutureVersion { claimed: Version(1), current: Version(0) })
        );
        assert_eq!(
            s.handle(now, WorkerId(1), ToServer::Pull { have: Version(0), min_clock: 0 }),
            Err(Reject::Unexpected { kind: "Pull" })
        );
        assert_eq!(s.handle(now, WorkerId(1), ToServer::Join { epoch: 2 }), Ok(()));
        let _ = drain_server(&mut s);
        assert_eq!(
            s.handle(now, WorkerId(1), ToServer::Join { epoch: 1 }),
            Err(Reject::StaleEpoch { worker: WorkerId(1), epoch: 1 })
        );
        assert_eq!(s.handle_worker_lost(now, WorkerId(9)), Err(Reject::UnknownWorker(WorkerId(9))));
        assert_eq!(snapshot(&s), before);
        assert_eq!(parts(s.scratch.as_mut(), 0, 2, 2).unwrap().1.to_vec(), acc_before);
        assert!(s.poll_output().is_none());
        assert_eq!(s.stats().rejected, 11);
        assert_eq!(s.stats().accepted, 1);
    }

    #[test]
    fn a_gradient_for_a_closed_step_is_dropped_as_stale() {
        let mut s = grouped(GroupedConfig::new(2, 0.5, 2), 1);
        s.handle(Instant::ZERO, WorkerId(0), grad(0, 0, &[1.0])).unwrap();
        let _ = drain_server(&mut s);
        s.handle(Instant::ZERO, WorkerId(0), grad(0, 1, &[1.0])).unwrap();
        assert_eq!(
            drain_server(&mut s),
            [Out::Event(ServerEvent::Dropped { worker: WorkerId(0), base: Version(0), reason: DropReason::Stale })]
        );
        assert_eq!(s.stats().dropped_for(DropReason::Stale), 1);
        assert_eq!(s.version(), Version(1));
    }

    #[test]
    fn joins_losses_and_stall_reports_are_per_group() {
        let mut c = GroupedConfig::new(4, 0.5, 2);
        c.stall_report = Some(Duration::from_secs(1));
        let mut s = grouped(c, 1);
        s.handle(Instant::ZERO, WorkerId(3), ToServer::Join { epoch: 0 }).unwrap();
        assert_eq!(
            drain_server(&mut s),
            [
                Out::Event(ServerEvent::WorkerJoined { worker: WorkerId(3), epoch: 0 }),
                Out::Send(
                    Recipient::Worker(WorkerId(3)),
                    ToWorkerOwned::Model { version: 0, clock: 0, values: vec![1.0] }
                ),
            ]
        );
        s.handle(Instant::ZERO, WorkerId(2), grad(0, 0, &[1.0])).unwrap();
        s.handle(Instant::ZERO, WorkerId(3), grad(0, 0, &[1.0])).unwrap();
        s.handle(Instant::ZERO, WorkerId(1), grad(0, 0, &[1.0])).unwrap();
        s.handle(Instant::ZERO, WorkerId(0), ToServer::Leave).unwrap();
        let outs = drain_server(&mut s);
        assert!(outs.contains(&Out::Event(ServerEvent::WorkerLost { worker: WorkerId(0) })));
        let at = s.poll_timeout().unwrap();
        assert_eq!(at, Instant::ZERO + Duration::from_secs(1));
        s.handle_timeout(at);
        // Group 0 waits for worker 0; group 1 has an open step with nobody in: it waits for 2.
        let outs = drain_server(&mut s);
        let t0 = Instant::ZERO;
        assert_eq!(
            outs,
            [
                Out::Event(ServerEvent::Stalled { waiting_for: WorkerId(0), missing: 1, since: t0 }),
                Out::Event(ServerEvent::Stalled { waiting_for: WorkerId(2), missing: 2, since: t0 }),
            ]
        );
        assert!(s.poll_timeout().unwrap() > at);
        s.stop();
        assert_eq!(s.poll_timeout(), None);
        assert_eq!(drain_server(&mut s), [Out::Send(Recipient::AllWorkers, ToWorkerOwned::Stop)]);
    }

    #[test]
    fn local_steps_move_the_group_model_and_send_the_sum() {
        // One group of 2, H = 2: two BSP steps on the group model, then one central update
        // that lands where the group model would be after both.
        let mut c = GroupedConfig::new(2, 0.5, 1);
        c.local_steps = 2;
        let mut s = grouped(c, 1);
        s.handle(Instant::ZERO, WorkerId(0), grad(0, 0, &[2.0])).unwrap();
        s.handle(Instant::ZERO, WorkerId(1), grad(0, 0, &[4.0])).unwrap();
        assert_eq!(
            (s.version(), s.group_version(0), s.group_model(0)),
            (Version(0), Some(Version(1)), Some(&[-0.5][..]))
        );
        let outs = drain_server(&mut s);
        assert_eq!(outs.len(), 3, "{outs:?}");
        assert!(outs.contains(&Out::Event(ServerEvent::Applied {
            worker: WorkerId(0),
            base: Version(0),
            version: Version(1),
            staleness: 0,
            weight: 0.5
        })));
        assert_eq!(
            outs[2],
            Out::Send(Recipient::AllWorkers, ToWorkerOwned::Model { version: 1, clock: 1, values: vec![-0.5] })
        );
        s.handle(Instant::ZERO, WorkerId(0), grad(1, 1, &[6.0])).unwrap();
        s.handle(Instant::ZERO, WorkerId(1), grad(1, 1, &[2.0])).unwrap();
        // Central: 1 - 0.5 * (3 + 4) = -2.5; the group re-bases at central version 1, but its
        // own version must grow: max(1 + 1, 1) = 2.
        assert_eq!((s.version(), s.params()), (Version(1), &[-2.5][..]));
        assert_eq!((s.group_version(0), s.group_base(0)), (Some(Version(2)), Some(Version(1))));
        let outs = drain_server(&mut s);
        assert_eq!(
            outs[0],
            Out::Event(ServerEvent::GroupApplied {
                group: 0,
                base: Version(0),
                version: Version(1),
                staleness: 0,
                contributions: 4
            })
        );
        assert!(outs.contains(&Out::Event(ServerEvent::ModelUpdated { version: Version(1), contributions: 4 })));
        assert!(outs.contains(&Out::Send(
            Recipient::AllWorkers,
            ToWorkerOwned::Model { version: 2, clock: 2, values: vec![-2.5] }
        )));
        assert_eq!(s.stats().applied, 4);
    }

    #[test]
    fn an_aggregate_that_would_overflow_is_dropped_and_the_group_restarts() {
        let mut c = GroupedConfig::new(1, 0.5, 1);
        c.local_steps = 2;
        let mut s: GroupedServer<f32, Vec<f32>> = GroupedServer::new(c, vec![0.0; 1], vec![0.0; 3]).unwrap();
        // Its square is finite; the square of twice it is not.
        const BIG: [f32; 1] = [1.5e19];
        let g =
            |seq, base: u64| ToServer::Grad { base: Version(base), iteration: 0, seq, values: Values::Slice(&BIG[..]) };
        s.handle(Instant::ZERO, WorkerId(0), g(0, 0)).unwrap();
        let _ = drain_server_f32(&mut s);
        s.handle(Instant::ZERO, WorkerId(0), g(1, 1)).unwrap();
        let outs = drain_server_f32(&mut s);
        assert_eq!(
            outs[0],
            Out::Event(ServerEvent::Dropped { worker: WorkerId(0), base: Version(1), reason: DropReason::Aborted })
        );
        // The group re-joined: it is back on the central model (unchanged), with a newer version.
        assert_eq!((s.version(), s.params()), (Version(0), &[0.0f32][..]));
        assert_eq!((s.group_version(0), s.group_model(0)), (Some(Version(2)), Some(&[0.0f32][..])));
        assert!(matches!(outs.last(), Some(Out::Send(Recipient::AllWorkers, ToWorkerOwned::Model { version: 2, .. }))));
        assert_eq!(s.stats().dropped_for(DropReason::Aborted), 1);
        assert_eq!(s.stats().applied, 1);
    }

    fn drain_server_f32<S: Server<f32>>(s: &mut S) -> Vec<Out> {
        let mut outs = Vec::new();
        while let Some(out) = s.poll_output() {
            outs.push(match out {
                ServerOutput::Event(e) => Out::Event(e),
                ServerOutput::Send { to, msg } => Out::Send(to, ToWorkerOwned::from(&msg)),
            });
        }
        outs
    }

    #[test]
    fn standalone_group_server_speaks_to_a_central_asp_server() {
        let c = GroupedConfig::new(4, 0.5, 2);
        let mut g1: GroupServer<f64, Vec<f64>> = GroupServer::new(c, 1, 7, vec![0.0; 1], vec![0.0; 1]).unwrap();
        let mut buf = Vec::new();
        assert_eq!(g1.group(), 1);
        assert!(g1.awaiting_central());
        assert!(matches!(g1.poll_upstream(), Some(ToServer::Join { epoch: 7 })));
        assert!(g1.poll_upstream().is_none());
        // Members only; no gradient before the group has a model.
        assert_eq!(
            g1.handle(Instant::ZERO, WorkerId(0), ToServer::Join { epoch: 0 }),
            Err(Reject::UnknownWorker(WorkerId(0)))
        );
        assert_eq!(g1.handle(Instant::ZERO, WorkerId(2), grad(0, 0, &[1.0])), Err(Reject::Unexpected { kind: "Grad" }));
        g1.handle(Instant::ZERO, WorkerId(2), ToServer::Join { epoch: 0 }).unwrap();
        let outs = drain_server(&mut g1);
        assert_eq!(outs, [Out::Event(ServerEvent::WorkerJoined { worker: WorkerId(2), epoch: 0 })], "model deferred");
        let model = ToWorkerOwned::Model { version: 5, clock: 5, values: vec![3.0] };
        g1.handle_upstream(Instant::ZERO, model.as_msg(&mut buf)).unwrap();
        assert_eq!(drain_server(&mut g1), [Out::Send(Recipient::Worker(WorkerId(2)), model.clone())]);
        assert_eq!(
            g1.handle_upstream(Instant::ZERO, model.as_msg(&mut buf)),
            Err(Reject::Unexpected { kind: "Model" })
        );
        assert_eq!(
            g1.handle_upstream(Instant::ZERO, ToWorker::Abort { iteration: 0 }),
            Err(Reject::Unexpected { kind: "Abort" })
        );
        g1.handle(Instant::ZERO, WorkerId(2), grad(5, 0, &[2.0])).unwrap();
        g1.handle(Instant::ZERO, WorkerId(3), grad(5, 0, &[4.0])).unwrap();
        let up = g1.poll_upstream().map(|m| ToServerOwned::from(&m));
        assert_eq!(
            up,
            Some(ToServerOwned::Grad { base: 5, iteration: 0, seq: crate::id::first_seq(7), values: vec![3.0] })
        );
        // While the exchange is out, the closed step takes nothing more.
        g1.handle(Instant::ZERO, WorkerId(2), grad(5, 1, &[2.0])).unwrap();
        assert!(drain_server(&mut g1).contains(&Out::Event(ServerEvent::Dropped {
            worker: WorkerId(2),
            base: Version(5),
            reason: DropReason::Stale
        })));
        let stale = ToWorkerOwned::Model { version: 5, clock: 5, values: vec![0.0] };
        assert_eq!(
            g1.handle_upstream(Instant::ZERO, stale.as_msg(&mut buf)),
            Err(Reject::OutdatedModel { received: Version(5), have: Version(5) })
        );
        let reply = ToWorkerOwned::Model { version: 9, clock: 9, values: vec![-1.0] };
        g1.handle_upstream(Instant::ZERO, reply.as_msg(&mut buf)).unwrap();
        let outs = drain_server(&mut g1);
        assert_eq!(
            outs[0],
            Out::Event(ServerEvent::GroupApplied {
                group: 1,
                base: Version(5),
                version: Version(9),
                staleness: 3,
                contributions: 2
            })
        );
        assert_eq!((g1.version(), g1.central_base(), g1.params()), (Version(9), Version(9), &[-1.0][..]));
        g1.handle_upstream(Instant::ZERO, ToWorker::Stop).unwrap();
        assert_eq!(drain_server(&mut g1).last(), Some(&Out::Send(Recipient::AllWorkers, ToWorkerOwned::Stop)));
    }

    /// A discrete-event run with instant messages: worker `i`'s gradient takes `cost[i]` ticks.
    /// Returns the gradients applied per worker by time `until`.
    fn timed(config: GroupedConfig, cost: &[u64], until: u64) -> Vec<u64> {
        let n = config.workers;
        let mut s = grouped(config, 1);
        let mut workers: Vec<_> = (0..n)
            .map(|i| GradientWorker::new(GradientWorkerConfig::new(WorkerId(i)), vec![0.0f64; 1]).unwrap())
            .collect();
        let mut queue = BinaryHeap::new();
        let mut applied = vec![0u64; n as usize];
        let mut ups: Vec<(u32, ToServerOwned)> = Vec::new();
        let mut at = 0u64;
        let mut buf = Vec::new();
        let step = |w: &mut GradientWorker<f64, Vec<f64>>, now: u64, queue: &mut BinaryHeap<_>, ups: &mut Vec<_>| {
            let me = w.id();
            while let Some(o) = w.poll_output() {
                match o {
                    WorkerOutput::Send(m) => ups.push((me.0, ToServerOwned::from(&m))),
                    WorkerOutput::Compute { id, .. } => queue.push(Reverse((now + cost[me.index()], me.0, id))),
                    WorkerOutput::Event(_) => {}
                }
            }
        };
        for w in workers.iter_mut() {
            step(w, 0, &mut queue, &mut ups);
        }
        loop {
            while let Some((from, m)) = ups.pop() {
                s.handle(Instant::from_nanos(at), WorkerId(from), m.as_msg(&mut buf)).unwrap();
                for o in drain_server(&mut s) {
                    let (targets, m) = match o {
                        Out::Event(ServerEvent::Applied { worker, .. }) => {
                            applied[worker.index()] += 1;
                            continue;
                        }
                        Out::Send(Recipient::AllWorkers, m) => ((0..n).collect::<Vec<_>>(), m),
                        Out::Send(Recipient::Worker(w), m) => (vec![w.0], m),
                        Out::Event(_) => continue,
                    };
                    for t in targets {
                        let w = &mut workers[t as usize];
                        w.handle(Instant::from_nanos(at), m.as_msg(&mut buf)).unwrap();
                        step(w, at, &mut queue, &mut ups);
                    }
                }
            }
            let Some(Reverse((t, w, id))) = queue.pop() else { break };
            if t > until {
                break;
            }
            at = t;
            let worker = &mut workers[w as usize];
            worker.handle_gradient(Instant::from_nanos(t), id, &[1.0]).unwrap();
            step(worker, t, &mut queue, &mut ups);
        }
        applied
    }

    #[test]
    fn a_straggler_delays_only_its_own_group() {
        // 8 workers, worker 0 four times slower, 100 ticks of one-tick steps.
        let mut cost = vec![1u64; 8];
        cost[0] = 4;
        let bsp = timed(GroupedConfig::new(8, 0.5, 1), &cost, 100);
        assert!(bsp.iter().all(|a| *a == 25), "G = 1 is BSP: everyone at the straggler's pace: {bsp:?}");
        let g4 = timed(GroupedConfig::new(8, 0.5, 4), &cost, 100);
        assert_eq!(&g4[..2], &[25, 25], "the straggler's group (contiguous: workers 0 and 1)");
        assert!(g4[2..].iter().all(|a| *a == 100), "the other groups run at full speed: {g4:?}");
        let mut rr = GroupedConfig::new(8, 0.5, 4);
        rr.partition = Partition::RoundRobin;
        let rr = timed(rr, &cost, 100);
        assert_eq!((rr[0], rr[4]), (25, 25), "round-robin: worker 0's group is {{0, 4}}: {rr:?}");
        assert!(rr.iter().enumerate().filter(|(i, _)| i % 4 != 0).all(|(_, a)| *a == 100));
    }

    proptest! {
        #![proptest_config(ProptestConfig::with_cases(48))]

        /// H4: one group of n is BSP, message for message and bit for bit, under any
        /// delivery order and with duplicated messages.
        #[test]
        fn one_group_is_bsp(log_n in 0u32..4, dim in 1usize..4, seed in any::<u64>(), dup in 0u64..30, scaling in 0u8..3) {
            let n = 1u32 << log_n;
            let mut c = GroupedConfig::new(n, 0.5, 1);
            c.lr_scaling = [LrScaling::None, LrScaling::Linear, LrScaling::Sqrt][scaling as usize];
            let mut bsp = Plain(BspServer::new(BspConfig::new(n, 0.5), vec![1.0; dim], vec![0.0; dim]).unwrap());
            let mut g = Plain(grouped(c, dim));
            let a = run(&mut bsp, n, seed, 12, dup, true);
            let b = run(&mut g, n, seed, 12, dup, true);
            prop_assert!(a.trace.len() > 10);
            prop_assert_eq!(&a.trace, &without_group_events(&b.trace));
            prop_assert_eq!(bsp.stats(), g.stats());
            // The stand-alone group server wired to a plain ASP central does the same.
            let mut w = Wired::new(c, dim);
            let d = run(&mut w, n, seed, 12, dup, true);
            prop_assert_eq!(&b.trace, &d.trace);
        }

        /// H4: n groups of one are ASP, message for message and bit for bit, under any delivery
        /// order and with duplicated gradients. (Not with duplicated models or joins: a worker
        /// handed a model twice, or answered twice, may compute on a model its group has since
        /// replaced; ASP applies that gradient with its staleness, a group drops it as stale,
        /// because its step on that version has closed.)
        #[test]
        fn n_groups_of_one_are_asp(n in 2u32..9, dim in 1usize..4, seed in any::<u64>(), dup in 0u64..30) {
            let mut asp = Plain(AspServer::new(AspConfig::new(n, 0.5), vec![1.0; dim]).unwrap());
            let mut g = Plain(grouped(GroupedConfig::new(n, 0.5, n), dim));
            let a = run(&mut asp, n, seed, 40, dup, false);
            let b = run(&mut g, n, seed, 40, dup, false);
            prop_assert!(a.trace.len() > 40);
            prop_assert_eq!(&a.trace, &without_group_events(&b.trace));
            prop_assert_eq!(asp.stats(), g.stats());
            let mut w = Wired::new(GroupedConfig::new(n, 0.5, n), dim);
            let d = run(&mut w, n, seed, 40, dup, false);
            prop_assert_eq!(&b.trace, &d.trace);
        }

        /// H1–H3: every admitted worker gradient has exactly one outcome; each group step
        /// takes one gradient from each member at the group's version; each aggregate reaches
        /// the central model exactly once (C2: the central model is the initial one minus η
        /// times the weighted sum of exactly the gradients reported applied and exchanged);
        /// staleness is `version − 1 − base`. Any partition, G, H and scaling; the stand-alone
        /// deployment gives the same trace.
        #[test]
        fn every_gradient_reaches_the_central_model_once_through_its_group(
            n in 1u32..9,
            g_pick in any::<u32>(),
            h in 1u32..4,
            part in 0u8..3,
            table in proptest::collection::vec(any::<u8>(), 8),
            scaling in 0u8..3,
            seed in any::<u64>(),
            dup in 0u64..30,
        ) {
            let groups = 1 + g_pick % n;
            let mut c = GroupedConfig::new(n, 0.25, groups);
            c.local_steps = h;
            c.lr_scaling = [LrScaling::None, LrScaling::Linear, LrScaling::Sqrt][scaling as usize];
            c.partition = match part {
                0 => Partition::Contiguous,
                1 => Partition::RoundRobin,
                _ => {
                    // A random table in which every group has a member.
                    let mut t: Vec<u8> = (0..n).map(|i| (table[i as usize] as u32 % groups) as u8).collect();
                    for g in 0..groups { t[g as usize] = g as u8; }
                    Partition::explicit(&t).unwrap()
                }
            };
            let dim = 2;
            let mut s = Plain(grouped(c, dim));
            let r = run(&mut s, n, seed, 30, dup, true);
            let outcomes: Vec<&ServerEvent> = r.trace.iter().filter_map(|x| match x {
                Rec::Out(Out::Event(e @ (ServerEvent::Applied { .. } | ServerEvent::Dropped { .. }))) => Some(e),
                _ => None,
            }).collect();
            // Gradients in steps still open at the end have no outcome yet.
            let open: u64 = s.0.groups.iter().map(|g| g.got.len() as u64).sum();
            prop_assert_eq!(outcomes.len() as u64 + open, r.admitted);
            let stats = s.stats();
            prop_assert_eq!(stats.accepted, r.admitted);
            prop_assert_eq!(stats.applied + stats.dropped_total() + open, r.admitted);
            prop_assert_eq!(stats.dropped_total(), stats.dropped_for(DropReason::Stale));
            // Conservation and per-step membership.
            let mut expected = vec![1.0f64; dim];
            let mut pending: Vec<Vec<(f64, Vec<f64>)>> = vec![Vec::new(); groups as usize];
            let mut step_members: BTreeMap<(u32, u64), Vec<u32>> = BTreeMap::new();
            let mut last_group = None;
            let mut exchanges = 0u64;
            for x in &r.trace {
                match x {
                    Rec::Out(Out::Event(ServerEvent::GroupApplied { group, base, version, staleness, contributions })) => {
                        prop_assert_eq!(*staleness, version.0 - 1 - base.0);
                        prop_assert_eq!(*contributions, c.local_steps * s.0.shared.layout.size[*group as usize] as u32);
                        last_group = Some(*group);
                        exchanges += 1;
                    }
                    Rec::Out(Out::Event(ServerEvent::Applied { worker, base, weight, .. })) => {
                        let g = c.group_of(*worker).unwrap();
                        let values = r.sent.get(&(worker.0, base.0)).unwrap().clone();
                        pending[g as usize].push((*weight, values));
                        step_members.entry((g, base.0)).or_default().push(worker.0);
                    }
                    Rec::Out(Out::Event(ServerEvent::ModelUpdated { version, .. })) => {
                        let g = last_group.take().unwrap() as usize;
                        for (weight, values) in pending[g].drain(..) {
                            for (e, v) in expected.iter_mut().zip(values) { *e -= 0.25 * weight * v; }
                        }
                        let (cv, params) = s.central();
                        if cv == *version {
                            for (p, e) in params.iter().zip(&expected) {
                                prop_assert!((p - e).abs() <= 1e-9 * (1.0 + e.abs()), "{:?} vs {:?}", params, expected);
                            }
                        }
                    }
                    _ => {}
                }
            }
            prop_assert_eq!(s.central().0, Version(exchanges));
            for ((g, _), members) in &step_members {
                let mut m = members.clone();
                m.sort_unstable();
                let expected: Vec<u32> = (0..n).filter(|w| c.group_of(WorkerId(*w)) == Some(*g)).collect();
                prop_assert_eq!(m, expected);
            }
            let mut w = Wired::new(c, dim);
            let d = run(&mut w, n, seed, 30, dup, true);
            prop_assert_eq!(&r.trace, &d.trace);
        }
    }
}
