//! A worker rank's state machine: the protocol's worker of one server, or a
//! [`ShardedWorker`] of `S` shards (one inner worker per shard). The worker loop drives
//! either through the same few verbs.

use crate::Shared;
use syncopate::proto::GradientWorker;
use syncopate::proto::sharded::{ShardLayout, ShardSlot, ShardedOutput, ShardedWorker};
use syncopate::{
    AnyWorker, ComputeId, ConfigError, Instant, ProtocolConfig, Reject, ToServer, ToWorker, Worker, WorkerEvent,
    WorkerOutput, WorkerSetup,
};

/// One output of a [`Machine`].
pub(crate) enum Out<'a> {
    /// Send `msg` to shard `shard` (0 with one server).
    Send { shard: u32, msg: ToServer<'a, f32> },
    /// Compute a gradient at `params`.
    Compute { id: ComputeId, params: &'a [f32] },
    /// The computation `id` was abandoned.
    Abandoned(ComputeId),
    /// Nothing the loop acts on.
    Other,
}

/// The worker state machine of a rank.
#[allow(clippy::large_enum_variant, reason = "one per rank, built at the start and at a rejoin")]
pub(crate) enum Machine {
    One(AnyWorker<f32, Shared>),
    Sharded(ShardedWorker<f32, Shared, Vec<ShardSlot<f32, Shared>>>),
}

impl Machine {
    /// The worker of `setup` for `protocol` over a model of `dim` parameters, split over
    /// `layout`'s shards if it has more than one.
    pub(crate) fn new(
        protocol: &ProtocolConfig,
        setup: WorkerSetup,
        dim: usize,
        layout: ShardLayout,
    ) -> Result<Self, ConfigError> {
        let inner = |len: usize| {
            AnyWorker::new(protocol, setup, Shared::zeroed(len), Shared::zeroed(protocol.worker_scratch_len(len)))
        };
        if layout.shards() <= 1 {
            return inner(dim).map(Self::One);
        }
        let slots = (0..layout.shards()).map(|k| inner(layout.len(k)).map(ShardSlot::new)).collect::<Result<_, _>>()?;
        ShardedWorker::new(layout, slots, Shared::zeroed(dim)).map(Self::Sharded)
    }

    /// The gradient worker of one server (BSP, ASP, backup, DBW, grouped), whose buffers
    /// the loop may trade instead of copying.
    pub(crate) fn gradient(&mut self) -> Option<&mut GradientWorker<f32, Shared>> {
        match self {
            Self::One(AnyWorker::Gradient(w)) => Some(w),
            _ => None,
        }
    }

    /// The buffer a `Compute`'s params are read from.
    pub(crate) fn params_buffer(&self) -> &Shared {
        match self {
            Self::One(w) => w.params_buffer(),
            Self::Sharded(w) => w.params_buffer(),
        }
    }

    pub(crate) fn poll_output(&mut self) -> Option<Out<'_>> {
        Some(match self {
            Self::One(w) => match w.poll_output()? {
                WorkerOutput::Send(msg) => Out::Send { shard: 0, msg },
                WorkerOutput::Compute { id, params, .. } => Out::Compute { id, params },
                WorkerOutput::Event(WorkerEvent::Abandoned { id }) => Out::Abandoned(id),
                WorkerOutput::Event(_) => Out::Other,
            },
            Self::Sharded(w) => match w.poll_output()? {
                ShardedOutput::Send { shard, msg } => Out::Send { shard, msg },
                ShardedOutput::Compute { id, params, .. } => Out::Compute { id, params },
                ShardedOutput::Event(WorkerEvent::Abandoned { id }) => Out::Abandoned(id),
                ShardedOutput::Event(_) => Out::Other,
            },
        })
    }

    /// A message from shard `shard` (0 with one server).
    pub(crate) fn handle(&mut self, now: Instant, shard: u32, msg: ToWorker<'_, f32>) -> Result<(), Reject> {
        match self {
            Self::One(w) if shard == 0 => w.handle(now, msg),
            Self::One(_) => Err(Reject::Unexpected { kind: "shard" }),
            Self::Sharded(w) => w.handle(now, shard, msg),
        }
    }

    pub(crate) fn handle_gradient(
        &mut self,
        now: Instant,
        id: ComputeId,
        grad: &[f32],
        loss: Option<f32>,
    ) -> Result<(), Reject> {
        match self {
            Self::One(w) => w.handle_gradient_with_loss(now, id, grad, loss),
            Self::Sharded(w) => w.handle_gradient_with_loss(now, id, grad, loss),
        }
    }

    pub(crate) fn handle_timeout(&mut self, now: Instant) {
        match self {
            Self::One(w) => w.handle_timeout(now),
            Self::Sharded(w) => w.handle_timeout(now),
        }
    }

    pub(crate) fn poll_timeout(&self) -> Option<Instant> {
        match self {
            Self::One(w) => w.poll_timeout(),
            Self::Sharded(w) => w.poll_timeout(),
        }
    }

    /// Whether some server (with shards, some shard) told this worker to stop.
    pub(crate) fn any_stopped(&self) -> bool {
        match self {
            Self::One(w) => w.is_stopped(),
            Self::Sharded(w) => (0..w.layout().shards()).any(|k| w.shard(k).is_some_and(Worker::is_stopped)),
        }
    }

    pub(crate) fn is_stopped(&self) -> bool {
        match self {
            Self::One(w) => w.is_stopped(),
            Self::Sharded(w) => w.is_stopped(),
        }
    }
}
