//! Sharded servers: the model split into `S` contiguous slices, each held by its own server
//! (a *shard*), and a worker that talks to all of them.
//!
//! A shard is an unchanged [`AnyServer`](super::AnyServer) of the run's protocol over its
//! slice: every shard decides alone (which gradients a round takes, DBW's `k`, SSP and BAP
//! clocks, grouped steps), from the slices and arrival times it sees. No message between
//! shards exists; docs/PROTOCOLS.md, "Sharded servers", says per protocol what that changes.
//! Each shard keeps its own [`ServerStats`](super::ServerStats), so the conservation ledger
//! balances per shard: a worker's gradient is `S` contributions, one per shard, each
//! applied or dropped by its shard alone.
//!
//! The worker side is a [`ShardedWorker`]: one inner [`AnyWorker`] per shard, each over its
//! slice and driven by its shard's messages exactly as an unsharded worker is by its
//! server. The host sees one worker: a computation is asked for once every inner worker
//! asks for one (the model assembled from their slices), and its gradient is split back
//! into the slices. If an inner worker abandons its computation (a newer model or an abort
//! from its shard), the assembled one is abandoned too and asked for again once every inner
//! worker computes.
//!
//! [`ShardLayout`] says which elements each shard holds: `S` contiguous slices in shard
//! order, the first `dim mod S` one element longer, every one at least one element long;
//! a model that does not split so is refused ([`ConfigError::ShardLayout`]).

use super::{AnyWorker, Buffer, Worker, WorkerEvent, WorkerOutput};
use crate::error::{ConfigError, Reject};
use crate::id::{ComputeId, Version, WorkerId};
use crate::math::{self, Scalar};
use crate::msg::{ToServer, ToWorker};
use crate::time::Instant;
use core::ops::Range;

/// How a model of `dim` elements splits over `shards` servers: contiguous slices in shard
/// order, the first `dim mod shards` one element longer than the others.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct ShardLayout {
    dim: usize,
    shards: u32,
}

impl ShardLayout {
    /// The layout of `dim` elements over `shards` shards; refused unless every shard gets at
    /// least one element (`1 <= shards <= dim`).
    pub fn new(dim: usize, shards: u32) -> Result<Self, ConfigError> {
        if shards == 0 || dim < shards as usize {
            return Err(ConfigError::ShardLayout { dim, shards });
        }
        Ok(Self { dim, shards })
    }

    /// The model's length.
    pub fn dim(&self) -> usize {
        self.dim
    }

    /// The number of shards.
    pub fn shards(&self) -> u32 {
        self.shards
    }

    /// The elements shard `shard` holds; `None` for a shard outside `0..shards`.
    pub fn range(&self, shard: u32) -> Option<Range<usize>> {
        if shard >= self.shards {
            return None;
        }
        let (s, k) = (self.shards as usize, shard as usize);
        let (base, extra) = (self.dim / s, self.dim % s);
        let start = k * base + k.min(extra);
        let len = base + usize::from(k < extra);
        Some(start..start + len)
    }

    /// The number of elements shard `shard` holds (0 outside `0..shards`).
    pub fn len(&self, shard: u32) -> usize {
        self.range(shard).map_or(0, |r| r.len())
    }

    /// Whether the layout is empty (never: every shard holds an element).
    pub fn is_empty(&self) -> bool {
        false
    }
}

/// One shard's part of a [`ShardedWorker`]: the inner worker over the shard's slice and the
/// computation it asked for, if any.
#[derive(Debug)]
pub struct ShardSlot<T, S> {
    worker: AnyWorker<T, S>,
    computing: Option<(ComputeId, Version)>,
}

impl<T: Scalar, S: Buffer<T>> ShardSlot<T, S> {
    /// The slot of an inner worker built over one shard's slice (its model buffer has the
    /// slice's length).
    pub fn new(worker: AnyWorker<T, S>) -> Self {
        Self { worker, computing: None }
    }

    /// The inner worker.
    pub fn worker(&self) -> &AnyWorker<T, S> {
        &self.worker
    }
}

/// One output of a [`ShardedWorker`].
#[derive(Debug)]
#[must_use]
pub enum ShardedOutput<'a, T> {
    /// Send `msg` to shard `shard`.
    Send {
        /// The shard (an index into the layout).
        shard: u32,
        /// The message; its payload is the shard's slice.
        msg: ToServer<'a, T>,
    },
    /// Compute a gradient at `params` (the whole model) and hand it back with
    /// [`ShardedWorker::handle_gradient`].
    Compute {
        /// The job's token.
        id: ComputeId,
        /// The oldest shard version `params` holds a slice of.
        version: Version,
        /// The model assembled from every shard's slice.
        params: &'a [T],
    },
    /// Something happened on the worker ([`WorkerEvent::Blocked`] is an inner worker's,
    /// with its shard's version; `Abandoned` and `Stopped` are the whole worker's).
    Event(WorkerEvent),
}

/// A worker of `S` sharded servers (see the [module docs](self)). `W` holds one
/// [`ShardSlot`] per shard, in shard order (a `Vec`, an array, a `&mut [ShardSlot]`); `S` is
/// the buffer type of the inner workers and of the assembled model.
#[derive(Debug)]
pub struct ShardedWorker<T, S, W> {
    layout: ShardLayout,
    slots: W,
    /// The model assembled from the inner workers' computations (the layout's length).
    assembled: S,
    /// The assembled computation, while every inner worker computes.
    job: Option<ComputeId>,
    /// Whether [`Self::job`]'s `Compute` is still to be output.
    job_due: bool,
    /// An emitted assembled computation that was abandoned, to report.
    abandoned: Option<ComputeId>,
    next_job: u64,
    stopped_reported: bool,
    _t: core::marker::PhantomData<T>,
}

impl<T: Scalar, S: Buffer<T>, W: AsRef<[ShardSlot<T, S>]> + AsMut<[ShardSlot<T, S>]>> ShardedWorker<T, S, W> {
    /// A worker over `layout`'s shards: `slots` holds one inner worker per shard, in shard
    /// order, each over its shard's slice and all with the same id; `assembled` has the
    /// model's length. Refused with [`ConfigError::ShardLayout`] if the slots do not match
    /// the layout (count or slice lengths), [`ConfigError::ScratchTooSmall`] if `assembled`
    /// is not the model's length, [`ConfigError::Knob`]`("shard worker id")` if the inner
    /// workers' ids differ.
    pub fn new(layout: ShardLayout, slots: W, assembled: S) -> Result<Self, ConfigError> {
        let list = slots.as_ref();
        let mismatch = ConfigError::ShardLayout { dim: layout.dim(), shards: list.len() as u32 };
        if list.len() != layout.shards() as usize {
            return Err(mismatch);
        }
        let mut id = None;
        for (k, slot) in list.iter().enumerate() {
            if slot.worker.dim() != layout.len(k as u32) {
                return Err(mismatch);
            }
            if id.is_some_and(|id| id != slot.worker.id()) {
                return Err(ConfigError::Knob("shard worker id"));
            }
            id = Some(slot.worker.id());
        }
        let given = assembled.as_ref().len();
        if given != layout.dim() {
            return Err(ConfigError::ScratchTooSmall { needed: layout.dim(), given });
        }
        Ok(Self {
            layout,
            slots,
            assembled,
            job: None,
            job_due: false,
            abandoned: None,
            next_job: 0,
            stopped_reported: false,
            _t: core::marker::PhantomData,
        })
    }

    /// The layout.
    pub fn layout(&self) -> ShardLayout {
        self.layout
    }

    /// The buffer holding the assembled model: a `Compute` output's `params` are its
    /// contents. Written only through `AsMut` (a copy-on-write buffer thus keeps a
    /// computation's input unchanged while the host reads it).
    pub fn params_buffer(&self) -> &S {
        &self.assembled
    }

    /// The inner worker of shard `shard`.
    pub fn shard(&self, shard: u32) -> Option<&AnyWorker<T, S>> {
        self.slots.as_ref().get(shard as usize).map(|s| &s.worker)
    }

    /// This worker's id.
    pub fn id(&self) -> WorkerId {
        self.slots.as_ref().first().map_or(WorkerId(0), |s| s.worker.id())
    }

    /// Whether every shard told this worker to stop.
    pub fn is_stopped(&self) -> bool {
        self.slots.as_ref().iter().all(|s| s.worker.is_stopped())
    }

    /// Outputs the inner workers lost (zero by construction).
    pub fn outputs_lost(&self) -> u64 {
        self.slots.as_ref().iter().map(|s| s.worker.outputs_lost()).sum()
    }

    /// A message from shard `shard` arrived at `now`. Refused with
    /// [`Reject::Unexpected`] for a shard outside the layout; otherwise the shard's inner
    /// worker's verdict.
    pub fn handle(&mut self, now: Instant, shard: u32, msg: ToWorker<'_, T>) -> Result<(), Reject> {
        let slot = self.slots.as_mut().get_mut(shard as usize).ok_or(Reject::Unexpected { kind: "shard" })?;
        slot.worker.handle(now, msg)
    }

    /// Shard `shard`'s inner worker is replaced by `worker` (a new session with that shard:
    /// a reconnection, a restarted shard). The old inner worker's computation, if any, is
    /// forgotten, and with it the assembled one (reported abandoned if it was output); the
    /// new worker starts as any worker does. Refused with [`ConfigError::ShardLayout`] for a
    /// shard outside the layout or a worker over another slice length, and with
    /// [`ConfigError::Knob`]`("shard worker id")` for a worker of another id.
    pub fn restart_shard(&mut self, shard: u32, worker: AnyWorker<T, S>) -> Result<(), ConfigError> {
        let id = self.id();
        let mismatch = ConfigError::ShardLayout { dim: self.layout.dim(), shards: self.layout.shards() };
        if worker.dim() != self.layout.len(shard) || shard >= self.layout.shards() {
            return Err(mismatch);
        }
        if worker.id() != id {
            return Err(ConfigError::Knob("shard worker id"));
        }
        let slot = self.slots.as_mut().get_mut(shard as usize).ok_or(mismatch)?;
        *slot = ShardSlot::new(worker);
        self.drop_job();
        self.stopped_reported = false;
        Ok(())
    }

    /// The host finished the assembled computation `id`: its gradient is split into the
    /// shards' slices and each handed to its inner worker. Checked whole first (the
    /// computation named, the model's length, every element finite, room in every inner
    /// worker's queue), so a refused gradient reaches no shard.
    pub fn handle_gradient(&mut self, now: Instant, id: ComputeId, grad: &[T]) -> Result<(), Reject> {
        self.handle_gradient_with_loss(now, id, grad, None)
    }

    /// [`Self::handle_gradient`] with the minibatch loss the gradient was computed on: every
    /// shard's slice carries it (each shard's server keeps the whole model's loss). A loss
    /// that is NaN or infinite is refused with [`Reject::LossNotFinite`] before any shard
    /// sees the gradient.
    pub fn handle_gradient_with_loss(
        &mut self,
        now: Instant,
        id: ComputeId,
        grad: &[T],
        loss: Option<f32>,
    ) -> Result<(), Reject> {
        if self.job != Some(id) || self.job_due {
            return Err(Reject::NoSuchComputation);
        }
        if grad.len() != self.layout.dim() {
            return Err(Reject::WrongLength(math::LengthMismatch { expected: self.layout.dim(), actual: grad.len() }));
        }
        if !math::all_finite(grad) {
            return Err(Reject::NotFinite);
        }
        if loss.is_some_and(|l| !l.is_finite()) {
            return Err(Reject::LossNotFinite);
        }
        if self.slots.as_ref().iter().any(|s| !s.worker.has_room(3)) {
            return Err(Reject::Capacity);
        }
        self.job = None;
        let layout = self.layout;
        let mut result = Ok(());
        for (k, slot) in self.slots.as_mut().iter_mut().enumerate() {
            let (Some((inner, _)), Some(range)) = (slot.computing.take(), layout.range(k as u32)) else { continue };
            let part = grad.get(range).unwrap_or_default();
            // Every check an inner worker makes passed above: it refuses only on a bug.
            if let Err(e) = slot.worker.handle_gradient_with_loss(now, inner, part, loss) {
                result = result.and(Err(e));
            }
        }
        result
    }

    /// The deadline from [`Self::poll_timeout`] passed: every inner worker whose deadline
    /// is due acts on it.
    pub fn handle_timeout(&mut self, now: Instant) {
        for slot in self.slots.as_mut() {
            slot.worker.handle_timeout(now);
        }
    }

    /// The earliest deadline of the inner workers.
    pub fn poll_timeout(&self) -> Option<Instant> {
        self.slots.as_ref().iter().filter_map(|s| s.worker.poll_timeout()).min()
    }

    /// The next output; `None` when drained.
    pub fn poll_output(&mut self) -> Option<ShardedOutput<'_, T>> {
        loop {
            if let Some(id) = self.abandoned.take() {
                return Some(ShardedOutput::Event(WorkerEvent::Abandoned { id }));
            }
            if self.job_due {
                self.job_due = false;
                let id = self.job?;
                let version = self.slots.as_ref().iter().filter_map(|s| s.computing.map(|c| c.1)).min()?;
                return Some(ShardedOutput::Compute { id, version, params: self.assembled.as_ref() });
            }
            let k = self.slots.as_ref().iter().position(|s| s.worker.next_is_send().is_some());
            let Some(k) = k else {
                if !self.stopped_reported && self.is_stopped() {
                    self.stopped_reported = true;
                    return Some(ShardedOutput::Event(WorkerEvent::Stopped));
                }
                return None;
            };
            if self.slots.as_ref().get(k)?.worker.next_is_send() == Some(true) {
                return match self.slots.as_mut().get_mut(k)?.worker.poll_output()? {
                    WorkerOutput::Send(msg) => Some(ShardedOutput::Send { shard: k as u32, msg }),
                    _ => None,
                };
            }
            let range = self.layout.range(k as u32)?;
            let slot = self.slots.as_mut().get_mut(k)?;
            match slot.worker.poll_output()? {
                WorkerOutput::Compute { id, version, params } => {
                    if let Some(dst) = self.assembled.as_mut().get_mut(range) {
                        dst.copy_from_slice(params);
                    }
                    slot.computing = Some((id, version));
                    self.drop_job();
                    if self.slots.as_ref().iter().all(|s| s.computing.is_some()) {
                        self.job = Some(ComputeId(self.next_job));
                        self.next_job += 1;
                        self.job_due = true;
                    }
                }
                WorkerOutput::Event(WorkerEvent::Abandoned { id }) => {
                    if slot.computing.is_some_and(|c| c.0 == id) {
                        slot.computing = None;
                        self.drop_job();
                    }
                }
                WorkerOutput::Event(WorkerEvent::Stopped) => {}
                WorkerOutput::Event(e) => return Some(ShardedOutput::Event(e)),
                WorkerOutput::Send(_) => {}
            }
        }
    }

    /// The assembled computation no longer stands (an inner worker changed its own): an
    /// emitted one is reported abandoned, one not yet emitted is forgotten.
    fn drop_job(&mut self) {
        if let Some(id) = self.job.take() {
            if !self.job_due {
                self.abandoned = Some(id);
            }
            self.job_due = false;
        }
    }
}

/// A [`ShardedWorker`] whose buffers are `Vec`s (feature `alloc`).
#[cfg(any(feature = "alloc", test))]
pub type HeapShardedWorker<T> = ShardedWorker<T, alloc::vec::Vec<T>, alloc::vec::Vec<ShardSlot<T, alloc::vec::Vec<T>>>>;

#[cfg(any(feature = "alloc", test))]
impl<T: Scalar> HeapShardedWorker<T> {
    /// A worker of `config` over `layout`'s shards, its buffers allocated (feature `alloc`).
    pub fn allocated(
        config: &super::ProtocolConfig,
        setup: super::WorkerSetup,
        layout: ShardLayout,
    ) -> Result<Self, ConfigError> {
        use alloc::vec;
        let mut slots = vec::Vec::with_capacity(layout.shards() as usize);
        for k in 0..layout.shards() {
            let len = layout.len(k);
            let inner =
                AnyWorker::new(config, setup, vec![T::zero(); len], vec![T::zero(); config.worker_scratch_len(len)])?;
            slots.push(ShardSlot::new(inner));
        }
        Self::new(layout, slots, vec![T::zero(); layout.dim()])
    }
}

#[cfg(test)]
mod tests;
