//! The WBSP worker: local SGD steps on its own copy, deltas uploaded after each step (basic)
//! or whenever the link is free (overlap), the new model pulled when the server says so.
//!
//! Basic variant, per local step: ask for a gradient at the local model, take the step
//! `w ← w − η_k g`, upload `Δ = w − w_last`, wait for the `PushAck` (a network round trip,
//! as the reference basic worker does), then either pull (`pull_now`) and continue from the
//! new model, or continue at once from the local model.
//!
//! Overlap variant: the next computation is requested as soon as a gradient arrives,
//! whatever the link is doing, so computation and upload run in parallel. At most one
//! upload is in flight; when its reply arrives without `pull_now`, the steps completed in
//! the meantime are uploaded at once as one coalesced delta (`local_steps` > 1). On
//! `pull_now` the worker sends `Pull` and starts no new computation until the model
//! arrives (the reference compute thread pauses likewise); a computation already running
//! goes on. When the model arrives it replaces the local model: local steps completed since
//! the last upload are discarded, as in the reference code (they never reached the server,
//! so nothing the server accepted is lost; [`WbspWorker::discarded_steps`] counts them),
//! and the gradient of a computation still running when the model arrived is applied to the
//! new model (the reference compute thread's step lands on the freshly loaded variables).
//!
//! Loss tolerance: with `rejoin_after` set, a worker that has waited that long for a reply
//! (the upload's `PushAck`, or a `Model`) sends `Join` again; the server answers with its
//! current model, which the worker loads as if it had pulled it.

use super::WbspConfig;
use crate::error::{ConfigError, Reject};
use crate::id::{ComputeId, Version, WorkerId};
use crate::math::{self, Scalar};
use crate::msg::{ToServer, ToWorker, Values};
use crate::proto::common::queue::{WorkerItem, WorkerQueue};
use crate::proto::{Buffer, Worker, WorkerEvent, WorkerOutput, WorkerSetup};
use crate::time::Instant;
use core::marker::PhantomData;

/// The WBSP worker state machine (see the [module docs](super)). `params` holds the local
/// model; `scratch` (at least the model's length) the model at the last upload, or the
/// outgoing delta.
#[derive(Debug)]
pub struct WbspWorker<T, S> {
    config: WbspConfig,
    setup: WorkerSetup,
    params: S,
    scratch: S,
    /// The round (model version) the local model started from; `None` before the first model.
    have: Option<Version>,
    /// The computation the host is running.
    computing: Option<ComputeId>,
    /// An upload's reply is awaited.
    awaiting_ack: bool,
    /// A `Model` is awaited (first model, pull, or rejoin).
    awaiting_model: bool,
    /// `scratch` holds the last delta, not the model at the last upload (which then equals
    /// `params`).
    scratch_is_delta: bool,
    /// A `Delta` output has been queued but not polled yet.
    delta_unpolled: bool,
    /// When the worker started waiting for the server.
    since: Instant,
    stopped: bool,
    steps_since_upload: u32,
    local_steps: u64,
    uploads: u64,
    discarded: u64,
    seq: u64,
    next_job: u64,
    queue: WorkerQueue,
    _t: PhantomData<T>,
}

impl<T: Scalar, S: Buffer<T>> WbspWorker<T, S> {
    /// A worker with local model storage `params` (its length is the model's) and `scratch`
    /// of at least the same length. Its first output is `Join`.
    pub fn new(config: WbspConfig, setup: WorkerSetup, params: S, scratch: S) -> Result<Self, ConfigError> {
        config.check()?;
        let dim = params.as_ref().len();
        if dim == 0 {
            return Err(ConfigError::EmptyModel);
        }
        let given = scratch.as_ref().len();
        if given < dim {
            return Err(ConfigError::ScratchTooSmall { needed: dim, given });
        }
        let mut queue = WorkerQueue::new();
        queue.push(WorkerItem::Join { epoch: setup.epoch });
        Ok(Self {
            config,
            setup,
            params,
            scratch,
            have: None,
            computing: None,
            awaiting_ack: false,
            awaiting_model: true,
            scratch_is_delta: false,
            delta_unpolled: false,
            since: Instant::ZERO,
            stopped: false,
            steps_since_upload: 0,
            local_steps: 0,
            uploads: 0,
            discarded: 0,
            seq: crate::id::first_seq(setup.epoch),
            next_job: 0,
            queue,
            _t: PhantomData,
        })
    }

    /// The settings.
    pub fn config(&self) -> &WbspConfig {
        &self.config
    }

    /// Local SGD steps taken so far.
    pub fn local_steps(&self) -> u64 {
        self.local_steps
    }

    /// Deltas uploaded so far.
    pub fn uploads(&self) -> u64 {
        self.uploads
    }

    /// Local steps overwritten by a pulled model before they were uploaded (overlap variant).
    pub fn discarded_steps(&self) -> u64 {
        self.discarded
    }

    /// The round the local model started from (`None` before the first model).
    pub fn model_version(&self) -> Option<Version> {
        self.have
    }

    /// The local model.
    pub fn params(&self) -> &[T] {
        self.params.as_ref()
    }

    /// Whether an upload's reply is awaited.
    pub fn upload_in_flight(&self) -> bool {
        self.awaiting_ack
    }

    fn dim(&self) -> usize {
        self.params.as_ref().len()
    }

    fn start_compute(&mut self) {
        if let (None, Some(version)) = (self.computing, self.have) {
            let id = ComputeId(self.next_job);
            self.next_job += 1;
            self.computing = Some(id);
            self.queue.push(WorkerItem::Compute { id, version });
        }
    }

    /// Makes `scratch` the model at the last upload again, before `params` changes.
    fn restore_last(&mut self) {
        if self.scratch_is_delta {
            let dim = self.dim();
            if let Some(last) = self.scratch.as_mut().get_mut(..dim) {
                last.copy_from_slice(self.params.as_ref());
            }
            self.scratch_is_delta = false;
        }
    }

    /// Queues `Delta{w − w_last}` (computed in place in `scratch`).
    fn upload(&mut self, now: Instant) {
        let Some(round) = self.have else {
            return;
        };
        let dim = self.dim();
        if let Some(last) = self.scratch.as_mut().get_mut(..dim) {
            for (l, p) in last.iter_mut().zip(self.params.as_ref()) {
                *l = *p - *l;
            }
        }
        self.scratch_is_delta = true;
        self.delta_unpolled = true;
        self.queue.push(WorkerItem::Delta { round, local_steps: self.steps_since_upload.max(1), seq: self.seq });
        self.seq += 1;
        self.uploads += 1;
        self.steps_since_upload = 0;
        self.awaiting_ack = true;
        self.since = now;
    }

    /// Refuses inputs that would reuse the delta buffer before the delta was polled.
    fn check_drained(&self) -> Result<(), Reject> {
        if self.delta_unpolled { Err(Reject::Capacity) } else { Ok(()) }
    }

    fn on_model(&mut self, now: Instant, version: Version, values: Values<'_, T>) -> Result<(), Reject> {
        values.check_len(self.dim())?;
        if let Some(have) = self.have {
            if version < have {
                return Err(Reject::OutdatedModel { received: version, have });
            }
        }
        if !self.awaiting_model {
            return Err(Reject::Unexpected { kind: "Model" });
        }
        self.check_drained()?;
        let dim = self.dim();
        values.copy_into(self.params.as_mut())?;
        if let Some(last) = self.scratch.as_mut().get_mut(..dim) {
            last.copy_from_slice(self.params.as_ref());
        }
        self.scratch_is_delta = false;
        self.discarded += u64::from(self.steps_since_upload);
        self.steps_since_upload = 0;
        self.have = Some(version);
        self.awaiting_model = false;
        // A rejoin's model also answers a lost upload reply.
        self.awaiting_ack = false;
        self.since = now;
        self.start_compute();
        Ok(())
    }

    fn on_push_ack(&mut self, now: Instant, pull_now: bool) -> Result<(), Reject> {
        if !self.awaiting_ack || self.delta_unpolled {
            return Err(Reject::Unexpected { kind: "PushAck" });
        }
        self.awaiting_ack = false;
        self.since = now;
        if pull_now && !self.awaiting_model {
            let have = self.have.unwrap_or(Version::ZERO);
            self.queue.push(WorkerItem::Pull { have, min_clock: 0 });
            self.awaiting_model = true;
        }
        if self.awaiting_model {
            return Ok(());
        }
        if self.config.overlap && self.steps_since_upload > 0 {
            self.upload(now);
        }
        self.start_compute();
        Ok(())
    }
}

impl<T: Scalar, S: Buffer<T>> Worker<T> for WbspWorker<T, S> {
    fn handle(&mut self, now: Instant, msg: ToWorker<'_, T>) -> Result<(), Reject> {
        if self.stopped {
            return Err(Reject::Stopped);
        }
        self.queue.ensure_room(3)?;
        match msg {
            ToWorker::Model { version, values, .. } => self.on_model(now, version, values),
            ToWorker::PushAck { pull_now, .. } => self.on_push_ack(now, pull_now),
            ToWorker::NotNewer { .. } => {
                if !self.awaiting_model || self.have.is_none() {
                    return Err(Reject::Unexpected { kind: "NotNewer" });
                }
                self.awaiting_model = false;
                self.since = now;
                if !self.awaiting_ack {
                    self.start_compute();
                }
                Ok(())
            }
            ToWorker::Stop => {
                self.stopped = true;
                self.queue.push(WorkerItem::Event(WorkerEvent::Stopped));
                Ok(())
            }
            other => Err(Reject::Unexpected { kind: other.kind_name() }),
        }
    }

    fn handle_gradient(&mut self, now: Instant, id: ComputeId, grad: &[T]) -> Result<(), Reject> {
        if self.stopped {
            return Err(Reject::Stopped);
        }
        if self.computing != Some(id) {
            return Err(Reject::NoSuchComputation);
        }
        let dim = self.dim();
        if grad.len() != dim {
            return Err(Reject::WrongLength(math::LengthMismatch { expected: dim, actual: grad.len() }));
        }
        if !math::all_finite(grad) {
            return Err(Reject::NotFinite);
        }
        self.queue.ensure_room(3)?;
        self.check_drained()?;
        self.restore_last();
        let round = self.have.map_or(0, |v| v.0);
        let lr = self.config.lr_schedule.rate(self.config.learning_rate, self.local_steps, round);
        math::scaled_add(self.params.as_mut(), T::from_f64(-lr), grad)?;
        self.computing = None;
        self.local_steps += 1;
        self.steps_since_upload = self.steps_since_upload.saturating_add(1);
        if !self.awaiting_ack && !self.awaiting_model {
            self.upload(now);
        }
        if self.config.overlap && !self.awaiting_model {
            self.start_compute();
        }
        Ok(())
    }

    fn handle_timeout(&mut self, now: Instant) {
        let Some(at) = self.poll_timeout() else {
            return;
        };
        if now >= at && !self.delta_unpolled && self.queue.ensure_room(1).is_ok() {
            self.queue.push(WorkerItem::Join { epoch: self.setup.epoch });
            self.awaiting_model = true;
            self.since = now;
        }
    }

    fn poll_output(&mut self) -> Option<WorkerOutput<'_, T>> {
        let dim = self.params.as_ref().len();
        let outgoing = self.scratch.as_ref().get(..dim).unwrap_or(&[]);
        let out = self.queue.poll(self.params.as_ref(), outgoing);
        if let Some(WorkerOutput::Send(ToServer::Delta { .. })) = out {
            self.delta_unpolled = false;
        }
        out
    }

    fn poll_timeout(&self) -> Option<Instant> {
        let after = self.setup.rejoin_after?;
        (!self.stopped && (self.awaiting_ack || self.awaiting_model)).then(|| self.since + after)
    }

    fn id(&self) -> WorkerId {
        self.setup.id
    }

    fn is_stopped(&self) -> bool {
        self.stopped
    }

    fn outputs_lost(&self) -> u64 {
        self.queue.lost()
    }
}
