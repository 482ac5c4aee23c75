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
use crate::id::{ComputeId, Version};
use crate::math::{self, Scalar};
use crate::msg::{ToServer, ToWorker};
use crate::proto::common::loss::LossTally;
use crate::proto::common::queue::WorkerItem;
use crate::proto::common::worker::{Computed, ProtocolWorker, Received, WorkerCore, WorkerRules};
use crate::proto::{Buffer, WorkerOutput, WorkerSetup};
use crate::time::Instant;

/// The WBSP worker's own state: the settings, the round its local model started from, the
/// computation and replies it waits for, and the step and upload counters. The core's
/// scratch holds the model at the last upload, or the outgoing delta.
#[derive(Debug)]
pub struct WbspWorkerRules {
    config: WbspConfig,
    /// The round (model version) the local model started from; `None` before the first model.
    have: Option<Version>,
    /// The computation the host is running.
    computing: Option<ComputeId>,
    /// An upload's reply is awaited.
    awaiting_ack: bool,
    /// A `Model` is awaited (first model, pull, or rejoin).
    awaiting_model: bool,
    /// The scratch holds the last delta, not the model at the last upload (which then equals
    /// the local model).
    scratch_is_delta: bool,
    /// A `Delta` output has been queued but not polled yet.
    delta_unpolled: bool,
    /// When the worker started waiting for the server.
    since: Instant,
    steps_since_upload: u32,
    /// The losses reported with the local steps since the last upload.
    losses: LossTally,
    local_steps: u64,
    uploads: u64,
    discarded: u64,
}

/// The WBSP worker state machine (see the [module docs](super)). `params` holds the local
/// model; `scratch` (at least the model's length) the model at the last upload, or the
/// outgoing delta.
pub type WbspWorker<T, S> = ProtocolWorker<T, S, WbspWorkerRules>;

impl<T: Scalar, S: Buffer<T>> ProtocolWorker<T, S, WbspWorkerRules> {
    /// A worker with local model storage `params` (its length is the model's) and `scratch`
    /// of at least the same length. Its first output is `Join`.
    pub fn new(config: WbspConfig, setup: WorkerSetup, params: S, scratch: S) -> Result<Self, ConfigError> {
        config.check()?;
        let core = WorkerCore::new(setup, params, Some(scratch))?;
        let rules = WbspWorkerRules {
            config,
            have: None,
            computing: None,
            awaiting_ack: false,
            awaiting_model: true,
            scratch_is_delta: false,
            delta_unpolled: false,
            losses: LossTally::new(),
            since: Instant::ZERO,
            steps_since_upload: 0,
            local_steps: 0,
            uploads: 0,
            discarded: 0,
        };
        Ok(Self::from_parts(core, rules))
    }

    /// The settings.
    pub fn config(&self) -> &WbspConfig {
        &self.rules.config
    }

    /// Local SGD steps taken so far.
    pub fn local_steps(&self) -> u64 {
        self.rules.local_steps
    }

    /// Deltas uploaded so far.
    pub fn uploads(&self) -> u64 {
        self.rules.uploads
    }

    /// Local steps overwritten by a pulled model before they were uploaded (overlap variant).
    pub fn discarded_steps(&self) -> u64 {
        self.rules.discarded
    }

    /// The round the local model started from (`None` before the first model).
    pub fn model_version(&self) -> Option<Version> {
        self.rules.have
    }

    /// The local model.
    pub fn params(&self) -> &[T] {
        self.core.params.as_ref()
    }

    /// Whether an upload's reply is awaited.
    pub fn upload_in_flight(&self) -> bool {
        self.rules.awaiting_ack
    }
}

impl WbspWorkerRules {
    fn start_compute<T: Scalar, S: Buffer<T>>(&mut self, core: &mut WorkerCore<T, S>) {
        if let (None, Some(version)) = (self.computing, self.have) {
            self.computing = Some(core.compute(version));
        }
    }

    /// Makes the scratch the model at the last upload again, before the local model changes.
    fn restore_last<T: Scalar, S: Buffer<T>>(&mut self, core: &mut WorkerCore<T, S>) {
        if self.scratch_is_delta {
            let (params, last) = core.buffers_mut();
            if last.len() == params.len() {
                last.copy_from_slice(params);
            }
            self.scratch_is_delta = false;
        }
    }

    /// Queues `Delta{w − w_last}` (computed in place in the scratch).
    fn upload<T: Scalar, S: Buffer<T>>(&mut self, core: &mut WorkerCore<T, S>, now: Instant) {
        let Some(round) = self.have else {
            return;
        };
        let (params, last) = core.buffers_mut();
        for (l, p) in last.iter_mut().zip(params.iter()) {
            *l = *p - *l;
        }
        self.scratch_is_delta = true;
        self.delta_unpolled = true;
        let seq = core.take_seq();
        let loss = self.losses.take_mean();
        core.queue.push(WorkerItem::Delta { round, local_steps: self.steps_since_upload.max(1), seq, loss });
        self.uploads += 1;
        self.steps_since_upload = 0;
        self.awaiting_ack = true;
        self.since = now;
    }

    /// Refuses inputs that would reuse the delta buffer before the delta was polled.
    fn check_drained(&self) -> Result<(), Reject> {
        if self.delta_unpolled { Err(Reject::Capacity) } else { Ok(()) }
    }

    fn on_push_ack<T: Scalar, S: Buffer<T>>(
        &mut self,
        core: &mut WorkerCore<T, S>,
        now: Instant,
        pull_now: bool,
    ) -> Result<(), Reject> {
        if !self.awaiting_ack || self.delta_unpolled {
            return Err(Reject::Unexpected { kind: "PushAck" });
        }
        self.awaiting_ack = false;
        self.since = now;
        if pull_now && !self.awaiting_model {
            let have = self.have.unwrap_or(Version::ZERO);
            core.queue.push(WorkerItem::Pull { have, min_clock: 0 });
            self.awaiting_model = true;
        }
        if self.awaiting_model {
            return Ok(());
        }
        if self.config.overlap && self.steps_since_upload > 0 {
            self.upload(core, now);
        }
        self.start_compute(core);
        Ok(())
    }
}

impl<T: Scalar, S: Buffer<T>> WorkerRules<T, S> for WbspWorkerRules {
    const REFUSE_WHEN_STOPPED: bool = true;
    const STOPPED_GRADIENT: Reject = Reject::Stopped;

    fn on_model(&mut self, core: &mut WorkerCore<T, S>, now: Instant, model: Received<'_, T>) -> Result<(), Reject> {
        let Received { version, values, .. } = model;
        core.check_model_age(&values, version, self.have)?;
        if !self.awaiting_model {
            return Err(Reject::Unexpected { kind: "Model" });
        }
        self.check_drained()?;
        let (params, last) = core.buffers_mut();
        values.copy_into(params)?;
        if last.len() == params.len() {
            last.copy_from_slice(params);
        }
        self.scratch_is_delta = false;
        self.discarded += u64::from(self.steps_since_upload);
        self.steps_since_upload = 0;
        let _ = self.losses.take_mean();
        self.have = Some(version);
        self.awaiting_model = false;
        // A rejoin's model also answers a lost upload reply.
        self.awaiting_ack = false;
        self.since = now;
        self.start_compute(core);
        Ok(())
    }

    fn on_message(&mut self, core: &mut WorkerCore<T, S>, now: Instant, msg: ToWorker<'_, T>) -> Result<(), Reject> {
        match msg {
            ToWorker::PushAck { pull_now, .. } => self.on_push_ack(core, now, pull_now),
            ToWorker::NotNewer { .. } => {
                if !self.awaiting_model || self.have.is_none() {
                    return Err(Reject::Unexpected { kind: "NotNewer" });
                }
                self.awaiting_model = false;
                self.since = now;
                if !self.awaiting_ack {
                    self.start_compute(core);
                }
                Ok(())
            }
            other => Err(Reject::Unexpected { kind: other.kind_name() }),
        }
    }

    fn computing(&self) -> Option<ComputeId> {
        self.computing
    }

    fn on_gradient(&mut self, core: &mut WorkerCore<T, S>, now: Instant, done: Computed<'_, T>) -> Result<(), Reject> {
        let Computed { grad, loss } = done;
        core.check_gradient(grad)?;
        core.queue.ensure_room(3)?;
        self.check_drained()?;
        self.restore_last(core);
        let round = self.have.map_or(0, |v| v.0);
        let lr = self.config.lr_schedule.rate(self.config.learning_rate, self.local_steps, round);
        math::scaled_add(core.params.as_mut(), T::from_f64(-lr), grad)?;
        self.computing = None;
        self.losses.add(loss);
        self.local_steps += 1;
        self.steps_since_upload = self.steps_since_upload.saturating_add(1);
        if !self.awaiting_ack && !self.awaiting_model {
            self.upload(core, now);
        }
        if self.config.overlap && !self.awaiting_model {
            self.start_compute(core);
        }
        Ok(())
    }

    fn waiting_since(&self, core: &WorkerCore<T, S>) -> Option<Instant> {
        let _ = core;
        (self.awaiting_ack || self.awaiting_model).then_some(self.since)
    }

    fn on_rejoin(&mut self, core: &mut WorkerCore<T, S>, now: Instant) {
        if !self.delta_unpolled && core.queue.ensure_room(1).is_ok() {
            core.rejoin();
            self.awaiting_model = true;
            self.since = now;
        }
    }

    fn on_polled(&mut self, out: &WorkerOutput<'_, T>) {
        if let WorkerOutput::Send(ToServer::Delta { .. }) = out {
            self.delta_unpolled = false;
        }
    }
}
