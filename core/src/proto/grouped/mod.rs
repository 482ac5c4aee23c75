//! Grouped hybrid sync/async: BSP inside groups, ASP between the groups and a central server.
//!
//! Paper: Basu, Saxena, Panja, Verma, "Balancing Stragglers Against Staleness in Distributed
//! Deep Learning", HiPC 2018 (docs/PROTOCOLS.md, "Grouped"). The `n` workers are partitioned into `G`
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
//! # This project's decisions (marked as choices in docs/PROTOCOLS.md, "Grouped")
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
//! central versions. Invariants (docs/RELIABILITY.md, "Invariants", H1–H4, tested): inside a group, each step
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
//! - [`GroupServer`] on its own (a separate process, or a node of a simulated network):
//!   the [`Server`] verbs toward its members, and its link to the central server through
//!   the same verbs ([Servers with an upstream](crate::proto#servers-with-an-upstream)):
//!   messages for the central server are [`ServerOutput::Upstream`] outputs (after the
//!   members' outputs of the same input), its replies go to [`Server::handle_upstream`].
//!   Adapters build it generically with [`AnyServer::subserver`] from
//!   [`ProtocolConfig::tiers`]; the central process runs a plain [`AspServer`] with
//!   [`GroupedConfig::central_config`] (the `Tiers::central` configuration) and the group
//!   index as the `WorkerId`. The upstream queue holds at most 4 messages (an input that
//!   could not queue its message is refused with [`Reject::Capacity`]); the link must be
//!   reliable (TCP): a lost reply leaves the group waiting (its members are idle, and
//!   [`GroupedConfig::stall_report`] does not fire in that phase), so the transport should
//!   restart the group server on a broken connection.
//!
//! # Knobs
//!
//! `G` trades straggler tolerance (larger `G`: a straggler stalls `n_g = n / G` workers) for
//! staleness (about `G − 1` per update) and smaller effective batches. docs/PROTOCOLS.md, "Grouped"
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
//!
//! [`AspServer`]: crate::proto::asp::AspServer
//! [`AnyServer::subserver`]: crate::proto::AnyServer::subserver
//! [`ProtocolConfig::tiers`]: crate::proto::ProtocolConfig::tiers
//! [`ServerOutput::Upstream`]: crate::proto::ServerOutput::Upstream
//! [`Server::handle_upstream`]: crate::proto::Server::handle_upstream
//! [`Reject::Capacity`]: crate::error::Reject::Capacity
//! [`DropReason::Aborted`]: crate::proto::DropReason::Aborted
//! [`DropReason::Stale`]: crate::proto::DropReason::Stale
//! [`Reject`]: crate::error::Reject
//! [`Server`]: crate::proto::Server
//! [`ServerEvent::Applied`]: crate::proto::ServerEvent::Applied
//! [`ServerEvent::Dropped`]: crate::proto::ServerEvent::Dropped
//! [`ServerEvent::GroupApplied`]: crate::proto::ServerEvent::GroupApplied
//! [`ServerEvent::Stalled`]: crate::proto::ServerEvent::Stalled

#[cfg(doc)]
use crate::proto::ServerEvent;
#[cfg(doc)]
use crate::proto::asp::AspServer;
mod group;
mod group_server;
mod items;
mod kernels;
mod server;
#[cfg(test)]
mod tests;

pub use group_server::GroupServer;
pub use server::GroupedServer;
pub(crate) use server::refuse_mean;

use crate::error::ConfigError;
use crate::id::{MAX_WORKERS, WorkerId};
use crate::proto::GradientPolicy;
use crate::proto::asp::AspConfig;
use crate::proto::common::validate::check_learning_rate;
use crate::time::Duration;
use items::Layout;
pub use items::{GroupedSlot, MAX_GROUPS};
use num_traits::Float;

/// The most workers an [`Partition::Explicit`] table lists.
pub const MAX_EXPLICIT_WORKERS: usize = 256;

/// How the `n` workers are split into `G` groups.
// The explicit table (for at most MAX_EXPLICIT_WORKERS workers) is 256 bytes of plain configuration data, kept inline so that a
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
    /// Worker `i` is in group `table[i]`; every group `0..G` must have at least one member
    /// (for at most [`MAX_EXPLICIT_WORKERS`] workers).
    Explicit([u8; MAX_EXPLICIT_WORKERS]),
}

impl Partition {
    /// An explicit partition from the group of each worker (`groups_of[i]` is worker `i`'s
    /// group). `None` if there are more than [`MAX_EXPLICIT_WORKERS`] entries.
    pub fn explicit(groups_of: &[u8]) -> Option<Self> {
        let mut table = [0u8; MAX_EXPLICIT_WORKERS];
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
    /// `η` for every central update (docs/PROTOCOLS.md, "Learning rates" default).
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
        if matches!(self.partition, Partition::Explicit(_)) && n as usize > MAX_EXPLICIT_WORKERS {
            return Err(ConfigError::Knob("partition"));
        }
        let mut layout = Layout { groups: self.groups, size: [0; MAX_GROUPS], span: [(0, 0); MAX_GROUPS] };
        for i in 0..n {
            let g = self.partition.group_of(i, n, self.groups);
            if g >= self.groups {
                return Err(ConfigError::Knob("partition"));
            }
            if let (Some(size), Some(span)) = (layout.size.get_mut(g as usize), layout.span.get_mut(g as usize)) {
                if *size == 0 {
                    span.0 = i;
                }
                span.1 = i + 1;
                *size += 1;
            }
        }
        if layout.size.iter().take(self.groups as usize).any(|s| *s == 0) {
            return Err(ConfigError::Knob("partition"));
        }
        Ok(layout)
    }
}
