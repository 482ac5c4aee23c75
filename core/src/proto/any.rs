//! Picking a protocol from configuration: [`ProtocolConfig`], [`AnyServer`], [`AnyWorker`]
//! (enum dispatch, no trait objects, no allocation).

use super::asp::{AspConfig, AspServer};
use super::backup::{BackupConfig, BackupServer};
use super::bap::{BapConfig, BapServer, BapWorker};
use super::bsp::{BspConfig, BspServer};
use super::common::optim::UpdateRule;
use super::dbw::{DbwConfig, DbwServer};
use super::grouped::{GroupServer, GroupedConfig, GroupedServer};
use super::ssp::{SspConfig, SspServer, SspWorker};
use super::wbsp::{WbspConfig, WbspServer, WbspWorker};
use super::{
    Buffer, DEFAULT_INLINE_WORKERS, GradientWorker, GradientWorkerConfig, Inline, Optimizer, ProtocolKind, Server,
    ServerOutput, ServerStats, Storage, Worker, WorkerOutput, WorkerSetup,
};
use crate::error::{ConfigError, Reject};
use crate::id::{ComputeId, Version, WorkerId};
use crate::math::Scalar;
use crate::msg::{ToServer, ToWorker};
use crate::time::Instant;

/// A protocol and its settings.
// `Grouped` carries an explicit partition table inline (256 bytes) so that a configuration
// stays `Copy` and allocation-free.
#[allow(clippy::large_enum_variant)]
#[derive(Clone, Copy, Debug, PartialEq)]
#[non_exhaustive]
pub enum ProtocolConfig {
    /// Bulk synchronous parallel.
    Bsp(BspConfig),
    /// Asynchronous parallel.
    Asp(AspConfig),
    /// Synchronous with a static number of backup workers.
    Backup(BackupConfig),
    /// Dynamic backup workers.
    Dbw(DbwConfig),
    /// Worker-busy synchronous parallel (basic, or optimized with `overlap`).
    Wbsp(WbspConfig),
    /// Grouped hybrid: BSP inside groups, ASP between groups and a central server.
    Grouped(GroupedConfig),
    /// Stale synchronous parallel (staleness bound `s`).
    Ssp(SspConfig),
    /// Bounded asynchronous parallel (bound `s_bap`, optional iteration time limit).
    Bap(BapConfig),
}

impl ProtocolConfig {
    /// The protocol without its settings (WBSP's kind follows its `overlap` setting).
    pub fn kind(&self) -> ProtocolKind {
        match self {
            Self::Bsp(_) => ProtocolKind::Bsp,
            Self::Asp(_) => ProtocolKind::Asp,
            Self::Backup(_) => ProtocolKind::Backup,
            Self::Dbw(_) => ProtocolKind::Dbw,
            Self::Wbsp(c) if c.overlap => ProtocolKind::WbspOverlap,
            Self::Wbsp(_) => ProtocolKind::Wbsp,
            Self::Grouped(_) => ProtocolKind::Grouped,
            Self::Ssp(_) => ProtocolKind::Ssp,
            Self::Bap(_) => ProtocolKind::Bap,
        }
    }

    /// The protocol's short name, as the CLI spells it ([`ProtocolKind::as_str`]).
    pub fn name(&self) -> &'static str {
        self.kind().as_str()
    }

    /// The number of workers.
    pub fn workers(&self) -> u32 {
        match self {
            Self::Bsp(c) => c.workers,
            Self::Asp(c) => c.workers,
            Self::Backup(c) => c.workers,
            Self::Dbw(c) => c.workers,
            Self::Wbsp(c) => c.workers,
            Self::Grouped(c) => c.workers,
            Self::Ssp(c) => c.workers,
            Self::Bap(c) => c.workers,
        }
    }

    /// Elements of scratch storage the server needs for a model of `dim` elements.
    pub fn server_scratch_len(&self, dim: usize) -> usize {
        match self {
            Self::Bsp(_) => dim,
            Self::Asp(_) => 0,
            Self::Backup(_) => dim,
            Self::Dbw(c) => c.scratch_len(dim),
            Self::Wbsp(_) => dim,
            Self::Grouped(c) => c.scratch_len(dim),
            Self::Ssp(_) => 0,
            Self::Bap(c) => c.open_iterations().saturating_mul(dim),
        }
    }

    /// Elements of the optional spare accumulator ([`AnyServer::with_spare_accumulator`])
    /// that make admission and accumulation one pass over each gradient: `dim` for the
    /// protocols that use one (BSP), 0 for the others.
    pub fn spare_accumulator_len(&self, dim: usize) -> usize {
        if let Self::Bsp(_) = self { dim } else { 0 }
    }

    /// Bytes of per-worker state the server keeps beside the model buffers: its
    /// [`WorkerRecord`](super::WorkerRecord) and any other per-worker cells (BAP's
    /// contribution cells, one per open iteration; DBW's round-trip windows and estimator
    /// tables, [`DbwConfig::estimator_bytes_per_worker`], an upper bound: its windows stop
    /// growing beyond a fixed number of workers). A server's memory is at most `n` times
    /// this plus a constant (the output queue's depth does not depend on `n`).
    pub fn per_worker_bytes(&self) -> usize {
        use super::WorkerRecord;
        use core::mem::size_of;
        match self {
            Self::Bsp(_) => size_of::<WorkerRecord<super::common::table::RoundSlot>>(),
            Self::Asp(_) => size_of::<WorkerRecord<()>>(),
            Self::Backup(_) => size_of::<WorkerRecord<super::backup::BackupSlot>>(),
            Self::Dbw(_) => {
                size_of::<WorkerRecord<super::backup::BackupSlot>>() + DbwConfig::estimator_bytes_per_worker()
            }
            Self::Wbsp(_) => size_of::<WorkerRecord<()>>(),
            Self::Grouped(_) => size_of::<WorkerRecord<super::grouped::GroupedSlot>>(),
            Self::Ssp(_) => size_of::<WorkerRecord<super::ssp::SspSlot>>(),
            Self::Bap(c) => {
                size_of::<WorkerRecord<super::bap::BapSlot>>()
                    + c.open_iterations() * size_of::<super::bap::Contribution>()
            }
        }
    }

    /// The protocol as a two-level tree of servers, if it can run as one; `None` for a
    /// protocol that runs as one server only. Grouped: the central ASP server over the `G`
    /// groups ([`GroupedConfig::central_config`]) and one sub-server per group.
    pub fn tiers(&self) -> Option<Tiers> {
        match self {
            Self::Grouped(c) => Some(Tiers { central: Self::Asp(c.central_config()), subservers: c.groups }),
            _ => None,
        }
    }

    /// The sub-server `worker` talks to in the two-level deployment ([`Self::tiers`]);
    /// `None` for a protocol without one or a worker outside `0..n`.
    pub fn subserver_of(&self, worker: WorkerId) -> Option<u32> {
        match self {
            Self::Grouped(c) => c.group_of(worker),
            _ => None,
        }
    }

    /// Elements of scratch storage a sub-server ([`AnyServer::subserver`]) needs besides its
    /// model of `dim` elements (0 for a protocol without sub-servers).
    pub fn subserver_scratch_len(&self, dim: usize) -> usize {
        match self {
            Self::Grouped(c) => c.group_scratch_len(dim),
            _ => 0,
        }
    }

    /// Elements of scratch storage each worker needs for a model of `dim` elements.
    pub fn worker_scratch_len(&self, dim: usize) -> usize {
        let _ = dim;
        match self {
            Self::Bsp(_) | Self::Asp(_) | Self::Backup(_) | Self::Dbw(_) | Self::Grouped(_) => 0,
            Self::Wbsp(_) | Self::Ssp(_) | Self::Bap(_) => dim,
        }
    }
}

/// How a protocol runs as a two-level tree of servers ([`ProtocolConfig::tiers`]): a central
/// server whose workers are `subservers` sub-servers, each serving its own part of the
/// workers ([`ProtocolConfig::subserver_of`]) and acting as one worker of the central server
/// ([`AnyServer::subserver`]; sub-server `i` is the central server's `WorkerId(i)`). Where
/// each server runs, and over which links, is the deployment's choice; the servers' verbs
/// carry the links (see [Servers with an upstream](super#servers-with-an-upstream)).
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct Tiers {
    /// The central server's configuration (its workers are the sub-servers).
    pub central: ProtocolConfig,
    /// The number of sub-servers.
    pub subservers: u32,
}

/// Any protocol's server. `M` is where the per-worker table lives ([`Inline<256>`] unless
/// the caller names another [`Storage`], e.g. `Heap`, feature `alloc`, for large `n`).
#[derive(Debug)]
#[non_exhaustive]
// Variants differ in size by design (DBW's estimators, the grouped server's groups); box the
// `AnyServer` itself if it must be moved around cheaply.
#[allow(clippy::large_enum_variant)]
pub enum AnyServer<T, S, M: Storage = Inline<DEFAULT_INLINE_WORKERS>> {
    /// A BSP server.
    Bsp(BspServer<T, S, M>),
    /// An ASP server.
    Asp(AspServer<T, S, M>),
    /// A static backup-worker server.
    Backup(BackupServer<T, S, M>),
    /// A DBW server.
    Dbw(DbwServer<T, S, M>),
    /// A WBSP server.
    Wbsp(WbspServer<T, S, M>),
    /// The grouped hybrid server (central and group servers in one state machine).
    Grouped(GroupedServer<T, S, M>),
    /// One group server of the grouped protocol on its own ([`AnyServer::subserver`]): it
    /// has an upstream (the central server).
    Group(GroupServer<T, S, M>),
    /// An SSP server.
    Ssp(SspServer<T, S, M>),
    /// A BAP server.
    Bap(BapServer<T, S, M>),
}

/// Any protocol's worker.
#[derive(Debug)]
#[non_exhaustive]
pub enum AnyWorker<T, S> {
    /// The worker of BSP, ASP and the backup-worker protocols.
    Gradient(GradientWorker<T, S>),
    /// The WBSP worker (local SGD steps, delta uploads).
    Wbsp(WbspWorker<T, S>),
    /// The SSP worker (cache, clock, staleness check).
    Ssp(SspWorker<T, S>),
    /// The BAP worker (runs ahead on its cache up to `s_bap` versions).
    Bap(BapWorker<T, S>),
}

impl<T: Scalar, S: Buffer<T>, M: Storage> AnyServer<T, S, M> {
    /// A server for `config` starting from the model in `params` at version 0. `scratch`
    /// must hold at least [`ProtocolConfig::server_scratch_len`] elements.
    pub fn new(config: &ProtocolConfig, params: S, scratch: S) -> Result<Self, ConfigError> {
        Self::resume(config, params, scratch, Version::ZERO)
    }

    /// Gives a protocol that can use it a second accumulator of at least the model's length
    /// (see [`BspServer::with_spare_accumulator`]): each gradient then costs one pass over its
    /// data instead of two, with the same bits and a refused gradient still changing nothing.
    /// Protocols whose [`ProtocolConfig::spare_accumulator_len`] is 0 drop `spare` unused.
    pub fn with_spare_accumulator(self, spare: S) -> Result<Self, ConfigError> {
        Ok(match self {
            Self::Bsp(server) => Self::Bsp(server.with_spare_accumulator(spare)?),
            other => other,
        })
    }

    /// The update rule `optimizer` on every update of the server's model (see
    /// [`ProtocolServer::with_optimizer`](crate::proto::ProtocolServer::with_optimizer)):
    /// `state` (caller-owned, at least [`Optimizer::state_len`] elements) is set up here. The
    /// grouped server applies it to the central model; a group server on its own
    /// ([`AnyServer::subserver`]) leaves it to its central server and drops `state`.
    pub fn with_optimizer(self, optimizer: Optimizer, state: S) -> Result<Self, ConfigError> {
        self.with_rule(optimizer, state, false)
    }

    /// [`Self::with_optimizer`] going on from a checkpoint's state (see
    /// [`ProtocolServer::with_optimizer_state`](crate::proto::ProtocolServer::with_optimizer_state)).
    pub fn with_optimizer_state(self, optimizer: Optimizer, state: S) -> Result<Self, ConfigError> {
        self.with_rule(optimizer, state, true)
    }

    /// [`Self::with_optimizer`] or (`restore`) [`Self::with_optimizer_state`].
    fn with_rule(self, o: Optimizer, state: S, restore: bool) -> Result<Self, ConfigError> {
        macro_rules! set {
            ($s:expr) => {
                if restore { $s.with_optimizer_state(o, state)? } else { $s.with_optimizer(o, state)? }
            };
        }
        Ok(match self {
            Self::Bsp(s) => Self::Bsp(set!(s)),
            Self::Asp(s) => Self::Asp(set!(s)),
            Self::Backup(s) => Self::Backup(set!(s)),
            Self::Dbw(s) => Self::Dbw(set!(s)),
            Self::Wbsp(s) => Self::Wbsp(set!(s)),
            Self::Grouped(s) => Self::Grouped(set!(s)),
            Self::Group(s) => {
                o.check()?;
                super::grouped::refuse_mean(&o)?;
                Self::Group(s)
            }
            Self::Ssp(s) => Self::Ssp(set!(s)),
            Self::Bap(s) => Self::Bap(set!(s)),
        })
    }

    /// SGD with momentum `beta` on every update (see
    /// [`ProtocolServer::with_momentum`](crate::proto::ProtocolServer::with_momentum)): `prev`
    /// (caller-owned, at least the model's length) holds the model before the last update.
    /// The grouped server applies it to the central model; a group server on its own
    /// ([`AnyServer::subserver`]) leaves it to its central server and drops `prev`.
    pub fn with_momentum(self, beta: f64, prev: S) -> Result<Self, ConfigError> {
        self.with_optimizer(Optimizer::momentum(beta), prev)
    }

    /// [`Self::with_momentum`] with `prev` already holding the model before the last update
    /// (a resumed run's checkpoint).
    pub fn with_momentum_state(self, beta: f64, prev: S) -> Result<Self, ConfigError> {
        self.with_optimizer_state(Optimizer::momentum(beta), prev)
    }

    /// The rule of the server whose model it updates (the central one of the grouped
    /// server) and that model's length, if there is one.
    fn rule(&self) -> Option<(&UpdateRule<T, S>, usize)> {
        Some(match self {
            Self::Bsp(s) => (&s.core.rule, s.core.dim()),
            Self::Asp(s) => (&s.core.rule, s.core.dim()),
            Self::Backup(s) => (&s.core.rule, s.core.dim()),
            Self::Dbw(s) => (&s.core.rule, s.core.dim()),
            Self::Wbsp(s) => (&s.core.rule, s.core.dim()),
            Self::Grouped(s) => (&s.central().core.rule, s.central().core.dim()),
            Self::Group(_) => return None,
            Self::Ssp(s) => (&s.core.rule, s.core.dim()),
            Self::Bap(s) => (&s.core.rule, s.core.dim()),
        })
    }

    /// The momentum buffer (the model before the last update), if the server's rule is
    /// heavy-ball momentum.
    pub fn momentum_buffer(&self) -> Option<&[T]> {
        self.rule().and_then(|(r, dim)| r.momentum_buffer(dim))
    }

    /// The update rule (plain SGD unless one was set).
    pub fn optimizer(&self) -> Optimizer {
        self.rule().map_or(Optimizer::SGD, |(r, dim)| r.optimizer(dim))
    }

    /// The update rule's state, for checkpoints (see
    /// [`ProtocolServer::optimizer_state`](crate::proto::ProtocolServer::optimizer_state)).
    pub fn optimizer_state(&self) -> Option<&[T]> {
        self.rule().and_then(|(r, dim)| r.state(dim))
    }

    /// Updates applied through the update rule (see
    /// [`ProtocolServer::optimizer_steps`](crate::proto::ProtocolServer::optimizer_steps)).
    pub fn optimizer_steps(&self) -> u64 {
        self.rule().map_or(0, |(r, dim)| r.steps(dim))
    }

    /// Sub-server `index` of `config`'s two-level deployment ([`ProtocolConfig::tiers`]),
    /// joining its central server with session `epoch` (increase it on every restart): its
    /// first output is [`ServerOutput::Upstream`]`(Join)`. `model` has the model's length (its
    /// contents are replaced by the central server's first model); `scratch` at least
    /// [`ProtocolConfig::subserver_scratch_len`] elements. Refused with
    /// [`ConfigError::NoSubservers`] for a protocol that runs as one server only.
    pub fn subserver(
        config: &ProtocolConfig,
        index: u32,
        epoch: u32,
        model: S,
        scratch: S,
    ) -> Result<Self, ConfigError> {
        match config {
            ProtocolConfig::Grouped(c) => Ok(Self::Group(GroupServer::new(*c, index, epoch, model, scratch)?)),
            _ => Err(ConfigError::NoSubservers),
        }
    }

    /// The buffer holding the model ([`Server::params`] is its contents), for a transport
    /// that sends a `Model` straight from it rather than from a copy; `None` for the grouped
    /// servers. The server writes the model only through `AsMut` (a copy-on-write buffer
    /// thus keeps a model in flight unchanged).
    pub fn params_buffer(&self) -> Option<&S> {
        match self {
            Self::Grouped(_) | Self::Group(_) => None,
            Self::Bsp(s) => Some(&s.core.params),
            Self::Asp(s) => Some(&s.core.params),
            Self::Backup(s) => Some(&s.core.params),
            Self::Dbw(s) => Some(&s.core.params),
            Self::Wbsp(s) => Some(&s.core.params),
            Self::Ssp(s) => Some(&s.core.params),
            Self::Bap(s) => Some(&s.core.params),
        }
    }

    /// A server for `config` resuming from `params` at `version` (a checkpoint).
    pub fn resume(config: &ProtocolConfig, params: S, scratch: S, version: Version) -> Result<Self, ConfigError> {
        Ok(match config {
            ProtocolConfig::Bsp(c) => Self::Bsp(BspServer::resume(*c, params, scratch, version)?),
            ProtocolConfig::Asp(c) => Self::Asp(AspServer::resume(*c, params, version)?),
            ProtocolConfig::Backup(c) => Self::Backup(BackupServer::resume(*c, params, scratch, version)?),
            ProtocolConfig::Dbw(c) => Self::Dbw(DbwServer::resume(*c, params, scratch, version)?),
            ProtocolConfig::Wbsp(c) => Self::Wbsp(WbspServer::resume(*c, params, scratch, version)?),
            ProtocolConfig::Grouped(c) => Self::Grouped(GroupedServer::resume(*c, params, scratch, version)?),
            ProtocolConfig::Ssp(c) => Self::Ssp(SspServer::resume(*c, params, version)?),
            ProtocolConfig::Bap(c) => Self::Bap(BapServer::resume(*c, params, scratch, version)?),
        })
    }
}

impl<T: Scalar, S: Buffer<T>> AnyWorker<T, S> {
    /// A worker for `config`. `params` has the model's length; `scratch` at least
    /// [`ProtocolConfig::worker_scratch_len`] elements.
    pub fn new(config: &ProtocolConfig, setup: WorkerSetup, params: S, scratch: S) -> Result<Self, ConfigError> {
        let _ = scratch;
        let gradient = GradientWorkerConfig { id: setup.id, epoch: setup.epoch, rejoin_after: setup.rejoin_after };
        Ok(match config {
            ProtocolConfig::Bsp(_)
            | ProtocolConfig::Asp(_)
            | ProtocolConfig::Backup(_)
            | ProtocolConfig::Dbw(_)
            | ProtocolConfig::Grouped(_) => Self::Gradient(GradientWorker::new(gradient, params)?),
            ProtocolConfig::Wbsp(c) => Self::Wbsp(WbspWorker::new(*c, setup, params, scratch)?),
            ProtocolConfig::Ssp(c) => Self::Ssp(SspWorker::new(*c, setup, params, scratch)?),
            ProtocolConfig::Bap(c) => Self::Bap(BapWorker::new(*c, setup, params, scratch)?),
        })
    }
}

macro_rules! dispatch {
    ($self:expr, $s:ident => $e:expr, $($variant:ident),+) => {
        match $self { $(Self::$variant($s) => $e,)+ }
    };
}

impl<T: Scalar, S: Buffer<T>> AnyWorker<T, S> {
    /// The buffer holding the model (or cache) the host computes on: a `Compute` output's
    /// `params` are its contents. For a transport that hands them to another thread rather
    /// than a copy; the worker writes it only through `AsMut` (a copy-on-write buffer thus
    /// keeps a computation's input unchanged while the host reads it).
    pub fn params_buffer(&self) -> &S {
        dispatch!(self, w => &w.core.params, Gradient, Wbsp, Ssp, Bap)
    }

    /// The model's length.
    pub(crate) fn dim(&self) -> usize {
        dispatch!(self, w => w.dim(), Gradient, Wbsp, Ssp, Bap)
    }

    /// Whether the next output is a message to the server (`None`: no output pending).
    pub(crate) fn next_is_send(&self) -> Option<bool> {
        dispatch!(self, w => w.next_is_send(), Gradient, Wbsp, Ssp, Bap)
    }

    /// Whether the output queue has room for `burst` more outputs.
    pub(crate) fn has_room(&self, burst: usize) -> bool {
        dispatch!(self, w => w.has_room(burst), Gradient, Wbsp, Ssp, Bap)
    }
}

impl<T: Scalar, S: Buffer<T>, M: Storage> Server<T> for AnyServer<T, S, M> {
    fn handle(&mut self, now: Instant, from: WorkerId, msg: ToServer<'_, T>) -> Result<(), Reject> {
        dispatch!(self, s => s.handle(now, from, msg), Bsp, Asp, Backup, Dbw, Wbsp, Grouped, Group, Ssp, Bap)
    }
    fn handle_worker_lost(&mut self, now: Instant, worker: WorkerId) -> Result<(), Reject> {
        dispatch!(self, s => s.handle_worker_lost(now, worker), Bsp, Asp, Backup, Dbw, Wbsp, Grouped, Group, Ssp, Bap)
    }
    fn handle_timeout(&mut self, now: Instant) {
        dispatch!(self, s => s.handle_timeout(now), Bsp, Asp, Backup, Dbw, Wbsp, Grouped, Group, Ssp, Bap)
    }
    fn poll_output(&mut self) -> Option<ServerOutput<'_, T>> {
        dispatch!(self, s => s.poll_output(), Bsp, Asp, Backup, Dbw, Wbsp, Grouped, Group, Ssp, Bap)
    }
    fn poll_timeout(&self) -> Option<Instant> {
        dispatch!(self, s => s.poll_timeout(), Bsp, Asp, Backup, Dbw, Wbsp, Grouped, Group, Ssp, Bap)
    }
    fn stop(&mut self) {
        dispatch!(self, s => s.stop(), Bsp, Asp, Backup, Dbw, Wbsp, Grouped, Group, Ssp, Bap)
    }
    fn version(&self) -> Version {
        dispatch!(self, s => s.version(), Bsp, Asp, Backup, Dbw, Wbsp, Grouped, Group, Ssp, Bap)
    }
    fn params(&self) -> &[T] {
        dispatch!(self, s => s.params(), Bsp, Asp, Backup, Dbw, Wbsp, Grouped, Group, Ssp, Bap)
    }
    fn momentum_buffer(&self) -> Option<&[T]> {
        Self::momentum_buffer(self)
    }
    fn optimizer_state(&self) -> Option<&[T]> {
        Self::optimizer_state(self)
    }
    fn optimizer_steps(&self) -> u64 {
        Self::optimizer_steps(self)
    }
    fn stats(&self) -> &ServerStats {
        dispatch!(self, s => s.stats(), Bsp, Asp, Backup, Dbw, Wbsp, Grouped, Group, Ssp, Bap)
    }
    fn has_upstream(&self) -> bool {
        dispatch!(self, s => s.has_upstream(), Bsp, Asp, Backup, Dbw, Wbsp, Grouped, Group, Ssp, Bap)
    }
    fn handle_upstream(&mut self, now: Instant, msg: ToWorker<'_, T>) -> Result<(), Reject> {
        dispatch!(self, s => s.handle_upstream(now, msg), Bsp, Asp, Backup, Dbw, Wbsp, Grouped, Group, Ssp, Bap)
    }
}

impl<T: Scalar, S: Buffer<T>> Worker<T> for AnyWorker<T, S> {
    fn handle(&mut self, now: Instant, msg: ToWorker<'_, T>) -> Result<(), Reject> {
        dispatch!(self, w => w.handle(now, msg), Gradient, Wbsp, Ssp, Bap)
    }
    fn handle_gradient_with_loss(
        &mut self,
        now: Instant,
        id: ComputeId,
        grad: &[T],
        loss: Option<f32>,
    ) -> Result<(), Reject> {
        dispatch!(self, w => w.handle_gradient_with_loss(now, id, grad, loss), Gradient, Wbsp, Ssp, Bap)
    }
    fn handle_timeout(&mut self, now: Instant) {
        dispatch!(self, w => w.handle_timeout(now), Gradient, Wbsp, Ssp, Bap)
    }
    fn poll_output(&mut self) -> Option<WorkerOutput<'_, T>> {
        dispatch!(self, w => w.poll_output(), Gradient, Wbsp, Ssp, Bap)
    }
    fn poll_timeout(&self) -> Option<Instant> {
        dispatch!(self, w => w.poll_timeout(), Gradient, Wbsp, Ssp, Bap)
    }
    fn id(&self) -> WorkerId {
        dispatch!(self, w => w.id(), Gradient, Wbsp, Ssp, Bap)
    }
    fn is_stopped(&self) -> bool {
        dispatch!(self, w => w.is_stopped(), Gradient, Wbsp, Ssp, Bap)
    }
    fn outputs_lost(&self) -> u64 {
        dispatch!(self, w => w.outputs_lost(), Gradient, Wbsp, Ssp, Bap)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::proto::asp::AspConfig;
    use crate::proto::bsp::BspConfig;
    use std::vec;
    use std::vec::Vec;

    #[test]
    fn only_protocols_that_use_a_spare_accumulator_ask_for_one() {
        let bsp = ProtocolConfig::Bsp(BspConfig::new(2, 0.5));
        let asp = ProtocolConfig::Asp(AspConfig::new(2, 0.5));
        assert_eq!(bsp.spare_accumulator_len(3), 3);
        assert_eq!(asp.spare_accumulator_len(3), 0);
        let server = AnyServer::<f32, Vec<f32>>::new(&bsp, vec![0.0f32; 3], vec![0.0; 3])
            .and_then(|s| s.with_spare_accumulator(vec![0.0; 3]));
        assert!(server.is_ok());
        let short = AnyServer::<f32, Vec<f32>>::new(&bsp, vec![0.0f32; 3], vec![0.0; 3])
            .and_then(|s| s.with_spare_accumulator(vec![0.0; 2]));
        assert!(matches!(short, Err(ConfigError::ScratchTooSmall { needed: 3, given: 2 })));
        let ignored = AnyServer::<f32, Vec<f32>>::new(&asp, vec![0.0f32; 3], vec![0.0; 3])
            .and_then(|s| s.with_spare_accumulator(Vec::new()));
        assert!(ignored.is_ok());
    }

    #[test]
    fn the_params_buffer_is_the_model_the_server_shows() {
        let bsp = ProtocolConfig::Bsp(BspConfig::new(2, 0.5));
        let server = AnyServer::<f32, Vec<f32>>::new(&bsp, vec![1.0f32, 2.0, 3.0], vec![0.0; 3]).unwrap();
        let buf = server.params_buffer().expect("BSP keeps its model in a buffer");
        assert_eq!(buf.as_ptr(), server.params().as_ptr());
        assert_eq!(buf[..], [1.0, 2.0, 3.0]);
        let grouped = ProtocolConfig::Grouped(GroupedConfig::new(4, 0.5, 2));
        let scratch = vec![0.0; grouped.server_scratch_len(3)];
        let g = AnyServer::<f32, Vec<f32>>::new(&grouped, vec![0.0f32; 3], scratch).unwrap();
        assert!(g.params_buffer().is_none());
    }
}
