//! Picking a protocol from configuration: [`ProtocolConfig`], [`AnyServer`], [`AnyWorker`]
//! (enum dispatch, no trait objects, no allocation).

use super::asp::{AspConfig, AspServer};
use super::bsp::{BspConfig, BspServer};
use super::{Buffer, GradientWorker, GradientWorkerConfig, Server, ServerOutput, ServerStats, Worker, WorkerOutput};
use crate::error::{ConfigError, Reject};
use crate::id::{ComputeId, Version, WorkerId};
use crate::math::Scalar;
use crate::msg::{ToServer, ToWorker};
use crate::time::{Duration, Instant};

/// A protocol and its settings.
#[derive(Clone, Copy, Debug, PartialEq)]
#[non_exhaustive]
pub enum ProtocolConfig {
    /// Bulk synchronous parallel.
    Bsp(BspConfig),
    /// Asynchronous parallel.
    Asp(AspConfig),
}

impl ProtocolConfig {
    /// The protocol's short name, as the CLI spells it.
    pub fn name(&self) -> &'static str {
        match self {
            Self::Bsp(_) => "bsp",
            Self::Asp(_) => "asp",
        }
    }

    /// The number of workers.
    pub fn workers(&self) -> u32 {
        match self {
            Self::Bsp(c) => c.workers,
            Self::Asp(c) => c.workers,
        }
    }

    /// Elements of scratch storage the server needs for a model of `dim` elements.
    pub fn server_scratch_len(&self, dim: usize) -> usize {
        match self {
            Self::Bsp(_) => dim,
            Self::Asp(_) => 0,
        }
    }

    /// Elements of scratch storage each worker needs for a model of `dim` elements.
    pub fn worker_scratch_len(&self, dim: usize) -> usize {
        let _ = dim;
        match self {
            Self::Bsp(_) | Self::Asp(_) => 0,
        }
    }
}

/// Any protocol's server.
#[derive(Debug)]
#[non_exhaustive]
pub enum AnyServer<T, S> {
    /// A BSP server.
    Bsp(BspServer<T, S>),
    /// An ASP server.
    Asp(AspServer<T, S>),
}

/// Any protocol's worker.
#[derive(Debug)]
#[non_exhaustive]
pub enum AnyWorker<T, S> {
    /// The worker of BSP, ASP and the backup-worker protocols.
    Gradient(GradientWorker<T, S>),
}

/// Settings every worker takes whatever the protocol.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct WorkerSetup {
    /// The worker's id.
    pub id: WorkerId,
    /// Its session epoch (increase on every restart).
    pub epoch: u32,
    /// Re-send `Join` after waiting this long for the server; `None` never retries.
    pub rejoin_after: Option<Duration>,
}

impl<T: Scalar, S: Buffer<T>> AnyServer<T, S> {
    /// A server for `config` starting from the model in `params` at version 0. `scratch`
    /// must hold at least [`ProtocolConfig::server_scratch_len`] elements.
    pub fn new(config: &ProtocolConfig, params: S, scratch: S) -> Result<Self, ConfigError> {
        Self::resume(config, params, scratch, Version::ZERO)
    }

    /// A server for `config` resuming from `params` at `version` (a checkpoint).
    pub fn resume(config: &ProtocolConfig, params: S, scratch: S, version: Version) -> Result<Self, ConfigError> {
        Ok(match config {
            ProtocolConfig::Bsp(c) => Self::Bsp(BspServer::resume(*c, params, scratch, version)?),
            ProtocolConfig::Asp(c) => Self::Asp(AspServer::resume(*c, params, version)?),
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
            ProtocolConfig::Bsp(_) | ProtocolConfig::Asp(_) => Self::Gradient(GradientWorker::new(gradient, params)?),
        })
    }
}

macro_rules! dispatch {
    ($self:expr, $s:ident => $e:expr, $($variant:ident),+) => {
        match $self { $(Self::$variant($s) => $e,)+ }
    };
}

impl<T: Scalar, S: Buffer<T>> Server<T> for AnyServer<T, S> {
    fn handle(&mut self, now: Instant, from: WorkerId, msg: ToServer<'_, T>) -> Result<(), Reject> {
        dispatch!(self, s => s.handle(now, from, msg), Bsp, Asp)
    }
    fn handle_worker_lost(&mut self, now: Instant, worker: WorkerId) -> Result<(), Reject> {
        dispatch!(self, s => s.handle_worker_lost(now, worker), Bsp, Asp)
    }
    fn handle_timeout(&mut self, now: Instant) {
        dispatch!(self, s => s.handle_timeout(now), Bsp, Asp)
    }
    fn poll_output(&mut self) -> Option<ServerOutput<'_, T>> {
        dispatch!(self, s => s.poll_output(), Bsp, Asp)
    }
    fn poll_timeout(&self) -> Option<Instant> {
        dispatch!(self, s => s.poll_timeout(), Bsp, Asp)
    }
    fn stop(&mut self) {
        dispatch!(self, s => s.stop(), Bsp, Asp)
    }
    fn version(&self) -> Version {
        dispatch!(self, s => s.version(), Bsp, Asp)
    }
    fn params(&self) -> &[T] {
        dispatch!(self, s => s.params(), Bsp, Asp)
    }
    fn stats(&self) -> &ServerStats {
        dispatch!(self, s => s.stats(), Bsp, Asp)
    }
}

impl<T: Scalar, S: Buffer<T>> Worker<T> for AnyWorker<T, S> {
    fn handle(&mut self, now: Instant, msg: ToWorker<'_, T>) -> Result<(), Reject> {
        dispatch!(self, w => w.handle(now, msg), Gradient)
    }
    fn handle_gradient(&mut self, now: Instant, id: ComputeId, grad: &[T]) -> Result<(), Reject> {
        dispatch!(self, w => w.handle_gradient(now, id, grad), Gradient)
    }
    fn handle_timeout(&mut self, now: Instant) {
        dispatch!(self, w => w.handle_timeout(now), Gradient)
    }
    fn poll_output(&mut self) -> Option<WorkerOutput<'_, T>> {
        dispatch!(self, w => w.poll_output(), Gradient)
    }
    fn poll_timeout(&self) -> Option<Instant> {
        dispatch!(self, w => w.poll_timeout(), Gradient)
    }
    fn id(&self) -> WorkerId {
        dispatch!(self, w => w.id(), Gradient)
    }
    fn is_stopped(&self) -> bool {
        dispatch!(self, w => w.is_stopped(), Gradient)
    }
}
