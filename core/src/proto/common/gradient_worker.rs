//! The gradient worker: the worker side of BSP, ASP, backup workers, DBW and group members.
//!
//! It joins, waits for a model, asks its host to compute one gradient at that model, sends
//! it, and waits for the next model. A model newer than the one it is computing on makes
//! it abandon the computation and start on the new one (option A of docs/PROTOCOLS.md, "Backup workers";
//! servers that want option B simply do not send models to busy workers). An
//! `Abort{iteration}` for the current computation abandons it and waits for a model.
//!
//! Loss tolerance: with [`GradientWorkerConfig::rejoin_after`] set, a worker that has waited
//! that long for a model sends `Join` again (same epoch); the server answers with its
//! current model, so a lost gradient or a lost broadcast costs one timeout, never a hang.
//! A model with the version the worker last computed on is taken as such a retransmission
//! and computed again. The servers of rounds (BSP, backup workers, DBW) send no such model
//! when the worker's gradient on it is already in the round; otherwise the server refuses
//! the repeat as a duplicate if the first arrived.
//!
//! Memory: one caller-owned buffer of the model's length holds the model while the host
//! computes, then the gradient while it is sent. The gradient is checked (finite) while it
//! is copied in, one pass; a refused gradient changes nothing the worker or its host can
//! observe: when no output is pending, the buffer's bytes may have been overwritten, but
//! the model in it was already handed out and every later output that shows the buffer
//! comes after it has been written whole again (the next accepted gradient or model).

use super::queue::{WORKER_QUEUE, WorkerItem};
use super::worker::{Computed, ProtocolWorker, Received, WorkerCore, WorkerRules};
use crate::error::{ConfigError, Reject};
use crate::id::{ComputeId, Version, WorkerId};
use crate::math::{self, Scalar};
use crate::msg::ToWorker;
use crate::proto::{Buffer, WorkerEvent, WorkerSetup};
use crate::time::{Duration, Instant};

#[cfg(test)]
use crate::proto::{Worker, WorkerOutput};

/// Settings of a [`GradientWorker`].
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct GradientWorkerConfig {
    /// This worker's id.
    pub id: WorkerId,
    /// Session epoch: increase it every time the same id restarts.
    pub epoch: u32,
    /// Re-send `Join` after waiting this long for a model; `None` waits forever.
    pub rejoin_after: Option<Duration>,
}

impl GradientWorkerConfig {
    /// Worker `id`, epoch 0, no retries.
    pub fn new(id: WorkerId) -> Self {
        Self { id, epoch: 0, rejoin_after: None }
    }
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Phase {
    /// Waiting for a model; `sent` is the version of the last gradient sent, if any.
    Waiting { since: Instant, sent: Option<Version> },
    /// The host is computing job `id` on `version`.
    Computing { id: ComputeId, version: Version },
}

/// The gradient worker's own state (see the [module docs](self)): its phase, the newest
/// model version received and the gradients sent.
#[derive(Debug)]
pub struct GradientRules {
    phase: Phase,
    have: Option<Version>,
    steps: u64,
}

/// The gradient worker state machine. `S` is the caller's buffer of the model's length.
pub type GradientWorker<T, S> = ProtocolWorker<T, S, GradientRules>;

impl<T: Scalar, S: Buffer<T>> ProtocolWorker<T, S, GradientRules> {
    /// A worker whose model and gradient live in `buf` (its length is the model's).
    /// Its first output is `Join`.
    pub fn new(config: GradientWorkerConfig, buf: S) -> Result<Self, ConfigError> {
        let setup = WorkerSetup { id: config.id, epoch: config.epoch, rejoin_after: config.rejoin_after };
        let core = WorkerCore::new(setup, buf, None)?;
        let rules = GradientRules { phase: Phase::Waiting { since: Instant::ZERO, sent: None }, have: None, steps: 0 };
        Ok(Self::from_parts(core, rules))
    }

    /// Gradients sent so far.
    pub fn steps(&self) -> u64 {
        self.rules.steps
    }

    /// The newest model version received.
    pub fn model_version(&self) -> Option<Version> {
        self.rules.have
    }

    /// [`Worker::handle`](crate::proto::Worker::handle) of a `Model` of `version` whose values the host already
    /// holds in `buf` (e.g. received straight into it): the same screening and the same
    /// verdict, but an accepted model is not copied: `buf` and the worker's buffer trade
    /// places (`buf` then holds the worker's previous buffer, whose contents are dead). A
    /// refused model leaves both buffers as they were.
    pub fn handle_model_in(&mut self, now: Instant, version: Version, buf: &mut S) -> Result<(), Reject> {
        let _ = now;
        self.core.queue.ensure_room(3)?;
        self.rules.install(&mut self.core, version, Install::Swap(buf))
    }

    /// [`Worker::handle_gradient`](crate::proto::Worker::handle_gradient) of the gradient in `buf`: the same screening and verdict
    /// (one read pass checks that every element is finite), but an accepted gradient is not
    /// copied: `buf` and the worker's buffer trade places, so the `Grad` it sends reads the
    /// host's own buffer, and `buf` holds the worker's previous buffer (the model the host
    /// computed on, now dead). A refused gradient leaves both buffers as they were. `loss`
    /// is the minibatch loss sent with the gradient, if reported (as
    /// [`Worker::handle_gradient_with_loss`](crate::proto::Worker::handle_gradient_with_loss)).
    pub fn handle_gradient_in(
        &mut self,
        now: Instant,
        id: ComputeId,
        buf: &mut S,
        loss: Option<f32>,
    ) -> Result<(), Reject> {
        self.check_computation(id)?;
        crate::proto::common::loss::LossTally::check(loss)?;
        let version = self.rules.gradient_base(&mut self.core, buf.as_ref().len())?;
        if !math::all_finite(buf.as_ref()) {
            return Err(Reject::NotFinite);
        }
        core::mem::swap(&mut self.core.params, buf);
        self.rules.sent(&mut self.core, now, version, loss);
        Ok(())
    }
}

/// How an accepted model reaches the worker's buffer.
enum Install<'v, 'b, T, S> {
    /// Copied from a message's values.
    Copy(crate::msg::Values<'v, T>),
    /// Already in the host's buffer: the two buffers trade places.
    Swap(&'b mut S),
}

impl GradientRules {
    fn start<T: Scalar, S: Buffer<T>>(&mut self, core: &mut WorkerCore<T, S>, version: Version) {
        let id = core.compute(version);
        self.phase = Phase::Computing { id, version };
    }

    /// The checks a gradient of `len` values passes before its values are read: a
    /// computation is running (its model version is returned), its `Grad` has room in the
    /// queue, and the length is the model's.
    fn gradient_base<T: Scalar, S: Buffer<T>>(
        &self,
        core: &mut WorkerCore<T, S>,
        len: usize,
    ) -> Result<Version, Reject> {
        let Phase::Computing { version, .. } = self.phase else {
            return Err(Reject::NoSuchComputation);
        };
        core.queue.ensure_room(1)?;
        let dim = core.dim();
        if len != dim {
            return Err(Reject::WrongLength(math::LengthMismatch { expected: dim, actual: len }));
        }
        Ok(version)
    }

    /// A gradient of the computation on `version` was accepted into the worker's buffer:
    /// queue its `Grad` and wait for the next model.
    fn sent<T: Scalar, S: Buffer<T>>(
        &mut self,
        core: &mut WorkerCore<T, S>,
        now: Instant,
        version: Version,
        loss: Option<f32>,
    ) {
        let seq = core.take_seq();
        core.queue.push(WorkerItem::Grad { base: version, iteration: self.steps, seq, loss });
        self.steps += 1;
        self.phase = Phase::Waiting { since: now, sent: Some(version) };
    }

    fn install<T: Scalar, S: Buffer<T>>(
        &mut self,
        core: &mut WorkerCore<T, S>,
        version: Version,
        values: Install<'_, '_, T, S>,
    ) -> Result<(), Reject> {
        match &values {
            Install::Copy(v) => core.check_model_age(v, version, self.have)?,
            Install::Swap(b) => core.check_model_age(&crate::msg::Values::Slice(b.as_ref()), version, self.have)?,
        }
        if core.stopped {
            return Err(Reject::Stopped);
        }
        if let Phase::Computing { id, version: current } = self.phase {
            if version <= current {
                return Err(Reject::Duplicate { worker: core.id(), seq: version.0 });
            }
            core.event(WorkerEvent::Abandoned { id });
        }
        match values {
            Install::Copy(v) => v.copy_into(core.params.as_mut())?,
            Install::Swap(b) => core::mem::swap(&mut core.params, b),
        }
        self.have = Some(version);
        self.start(core, version);
        Ok(())
    }
}

impl<T: Scalar, S: Buffer<T>> WorkerRules<T, S> for GradientRules {
    fn on_model(&mut self, core: &mut WorkerCore<T, S>, _: Instant, model: Received<'_, T>) -> Result<(), Reject> {
        self.install(core, model.version, Install::Copy(model.values))
    }

    fn on_message(&mut self, core: &mut WorkerCore<T, S>, now: Instant, msg: ToWorker<'_, T>) -> Result<(), Reject> {
        match msg {
            ToWorker::Abort { iteration } => {
                if let (false, Phase::Computing { id, version }) = (core.stopped, self.phase) {
                    if version.0 == iteration {
                        self.phase = Phase::Waiting { since: now, sent: None };
                        core.event(WorkerEvent::Abandoned { id });
                    }
                }
                Ok(())
            }
            other => Err(Reject::Unexpected { kind: other.kind_name() }),
        }
    }

    fn computing(&self) -> Option<ComputeId> {
        match self.phase {
            Phase::Computing { id, .. } => Some(id),
            Phase::Waiting { .. } => None,
        }
    }

    fn on_gradient(&mut self, core: &mut WorkerCore<T, S>, now: Instant, done: Computed<'_, T>) -> Result<(), Reject> {
        let Computed { grad, loss } = done;
        let version = self.gradient_base(core, grad.len())?;
        if core.queue.ensure_room(WORKER_QUEUE).is_ok() {
            // No pending output reads the buffer (the host already has its `Compute`), and
            // every later output that does is preceded by a write of the whole buffer (this
            // gradient accepted, or the next model): the model in it is dead, so copy and
            // check in one pass. A refused gradient leaves bytes nothing reads.
            if !math::copy_finite(core.params.as_mut(), grad)? {
                return Err(Reject::NotFinite);
            }
        } else {
            if !math::all_finite(grad) {
                return Err(Reject::NotFinite);
            }
            core.params.as_mut().copy_from_slice(grad);
        }
        self.sent(core, now, version, loss);
        Ok(())
    }

    fn waiting_since(&self, core: &WorkerCore<T, S>) -> Option<Instant> {
        let _ = core;
        match self.phase {
            Phase::Waiting { since, .. } => Some(since),
            Phase::Computing { .. } => None,
        }
    }

    fn on_rejoin(&mut self, core: &mut WorkerCore<T, S>, now: Instant) {
        if let Phase::Waiting { sent, .. } = self.phase {
            self.phase = Phase::Waiting { since: now, sent };
            core.rejoin();
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::msg::{ToServer, Values};
    use std::vec;
    use std::vec::Vec;

    fn model(version: u64, values: &[f32]) -> ToWorker<'_, f32> {
        ToWorker::Model { version: Version(version), clock: version, values: Values::Slice(values) }
    }

    fn drain(w: &mut GradientWorker<f32, Vec<f32>>) -> Vec<std::string::String> {
        let mut out = Vec::new();
        while let Some(o) = w.poll_output() {
            out.push(match o {
                WorkerOutput::Send(ToServer::Grad { base, seq, values, .. }) => {
                    std::format!("grad v{} seq{} {:?}", base.0, seq, values.get(0))
                }
                WorkerOutput::Send(m) => std::format!("send {}", m.kind_name()),
                WorkerOutput::Compute { id, version, params } => {
                    std::format!("compute {} v{} {:?}", id.0, version.0, params.first())
                }
                WorkerOutput::Event(e) => std::format!("{e:?}"),
            });
        }
        out
    }

    #[test]
    fn join_compute_send_wait() {
        let mut w = GradientWorker::new(GradientWorkerConfig::new(WorkerId(3)), vec![0.0f32; 2]).unwrap();
        assert_eq!(drain(&mut w), ["send Join"]);
        w.handle(Instant::ZERO, model(0, &[5.0, 6.0])).unwrap();
        assert_eq!(drain(&mut w), ["compute 0 v0 Some(5.0)"]);
        assert_eq!(w.handle_gradient(Instant::ZERO, ComputeId(9), &[1.0, 1.0]), Err(Reject::NoSuchComputation));
        assert!(matches!(w.handle_gradient(Instant::ZERO, ComputeId(0), &[1.0]), Err(Reject::WrongLength(_))));
        assert_eq!(w.handle_gradient(Instant::ZERO, ComputeId(0), &[f32::NAN, 1.0]), Err(Reject::NotFinite));
        w.handle_gradient(Instant::ZERO, ComputeId(0), &[7.0, 8.0]).unwrap();
        assert_eq!(drain(&mut w), ["grad v0 seq0 Some(7.0)"]);
        assert_eq!(w.handle_gradient(Instant::ZERO, ComputeId(0), &[7.0, 8.0]), Err(Reject::NoSuchComputation));
        assert_eq!(
            w.handle(Instant::ZERO, model(0, &[1.0])),
            Err(Reject::WrongLength(math::LengthMismatch { expected: 2, actual: 1 }))
        );
        w.handle(Instant::ZERO, model(1, &[1.0, 1.0])).unwrap();
        assert_eq!(drain(&mut w), ["compute 1 v1 Some(1.0)"]);
        assert_eq!(w.steps(), 1);
    }

    #[test]
    fn a_refused_gradient_changes_nothing_observable() {
        let dim = 40;
        let model_a: Vec<f32> = (0..dim).map(|i| i as f32).collect();
        let model_b: Vec<f32> = (0..dim).map(|i| -(i as f32)).collect();
        let good: Vec<f32> = (0..dim).map(|i| 0.5 + i as f32).collect();
        for bad_at in [0, 1, 15, 16, 33, 39] {
            for bad in [f32::NAN, f32::INFINITY, f32::from_bits(0xff80_0001)] {
                let mut nan = good.clone();
                nan[bad_at] = bad;
                // The fused path (outputs drained): the trace equals a clean run's, with
                // every payload compared whole.
                let trace = |refuse: bool| {
                    let mut w = GradientWorker::new(GradientWorkerConfig::new(WorkerId(1)), vec![0.0f32; dim]).unwrap();
                    let mut seen: Vec<Vec<f32>> = Vec::new();
                    let pull = |w: &mut GradientWorker<f32, Vec<f32>>, seen: &mut Vec<Vec<f32>>| {
                        while let Some(o) = w.poll_output() {
                            match o {
                                WorkerOutput::Send(ToServer::Grad { values, .. }) => {
                                    let mut v = vec![0.0; dim];
                                    values.copy_into(&mut v).unwrap();
                                    seen.push(v);
                                }
                                WorkerOutput::Compute { params, .. } => seen.push(params.to_vec()),
                                _ => {}
                            }
                        }
                    };
                    pull(&mut w, &mut seen);
                    w.handle(Instant::ZERO, model(0, &model_a)).unwrap();
                    pull(&mut w, &mut seen);
                    if refuse {
                        assert_eq!(w.handle_gradient(Instant::ZERO, ComputeId(0), &nan), Err(Reject::NotFinite));
                        pull(&mut w, &mut seen);
                    }
                    w.handle_gradient(Instant::ZERO, ComputeId(0), &good).unwrap();
                    pull(&mut w, &mut seen);
                    w.handle(Instant::ZERO, model(1, &model_b)).unwrap();
                    pull(&mut w, &mut seen);
                    if refuse {
                        assert_eq!(w.handle_gradient(Instant::ZERO, ComputeId(1), &nan), Err(Reject::NotFinite));
                        pull(&mut w, &mut seen);
                    }
                    // A newer model while computing (after a refused gradient) abandons.
                    w.handle(Instant::ZERO, model(2, &model_a)).unwrap();
                    pull(&mut w, &mut seen);
                    w.handle_gradient(Instant::ZERO, ComputeId(2), &good).unwrap();
                    pull(&mut w, &mut seen);
                    (seen, w.steps(), w.model_version())
                };
                let clean = trace(false);
                assert_eq!(clean.0.len(), 5);
                assert_eq!(trace(true), clean);
                // The two-pass path (the model's `Compute` not yet polled): the buffer still
                // holds the model when the host reads it.
                let mut w = GradientWorker::new(GradientWorkerConfig::new(WorkerId(1)), vec![0.0f32; dim]).unwrap();
                let _ = drain(&mut w);
                w.handle(Instant::ZERO, model(0, &model_a)).unwrap();
                assert_eq!(w.handle_gradient(Instant::ZERO, ComputeId(0), &nan), Err(Reject::NotFinite));
                match w.poll_output() {
                    Some(WorkerOutput::Compute { params, .. }) => assert_eq!(params, &model_a[..]),
                    _ => panic!("expected the Compute"),
                }
            }
        }
    }

    #[test]
    fn lent_buffers_give_the_copying_paths_verdicts_and_outputs() {
        let a = [1.0f32, 2.0];
        let b = [3.0f32, 4.0];
        // The same inputs through handle / handle_gradient and through the lending calls.
        let run = |lend: bool| {
            let mut w = GradientWorker::new(GradientWorkerConfig::new(WorkerId(2)), vec![0.0f32; 2]).unwrap();
            let mut log = drain(&mut w);
            let mut verdicts = Vec::new();
            let model = |w: &mut GradientWorker<f32, Vec<f32>>, v: u64, x: &[f32]| {
                if lend {
                    let mut buf = x.to_vec();
                    let r = w.handle_model_in(Instant::ZERO, Version(v), &mut buf);
                    // A refused model leaves the host's buffer as it was.
                    if r.is_err() {
                        assert_eq!(buf, x);
                    }
                    r
                } else {
                    w.handle(Instant::ZERO, model(v, x))
                }
            };
            let grad = |w: &mut GradientWorker<f32, Vec<f32>>, id: u64, g: &[f32]| {
                if lend {
                    let mut buf = g.to_vec();
                    let r = w.handle_gradient_in(Instant::ZERO, ComputeId(id), &mut buf, None);
                    if r.is_err() {
                        assert_eq!(buf, g);
                    }
                    r
                } else {
                    w.handle_gradient(Instant::ZERO, ComputeId(id), g)
                }
            };
            verdicts.push(grad(&mut w, 0, &a));
            verdicts.push(model(&mut w, 1, &a));
            log.extend(drain(&mut w));
            verdicts.push(model(&mut w, 0, &b));
            verdicts.push(model(&mut w, 1, &[1.0]));
            verdicts.push(grad(&mut w, 0, &[1.0]));
            verdicts.push(grad(&mut w, 0, &[f32::INFINITY, 1.0]));
            verdicts.push(grad(&mut w, 1, &b));
            verdicts.push(grad(&mut w, 0, &b));
            log.extend(drain(&mut w));
            verdicts.push(grad(&mut w, 0, &b));
            verdicts.push(model(&mut w, 2, &b));
            verdicts.push(model(&mut w, 3, &a));
            log.extend(drain(&mut w));
            verdicts.push(model(&mut w, 3, &a));
            w.handle(Instant::ZERO, ToWorker::Stop).unwrap();
            verdicts.push(grad(&mut w, 2, &a));
            verdicts.push(model(&mut w, 4, &a));
            log.extend(drain(&mut w));
            (log, verdicts, w.steps(), w.model_version())
        };
        let copied = run(false);
        assert_eq!(
            copied.0,
            [
                "send Join",
                "compute 0 v1 Some(1.0)",
                "grad v1 seq0 Some(3.0)",
                // Polled after model 3 replaced model 2 in the buffer.
                "compute 1 v2 Some(1.0)",
                "Abandoned { id: ComputeId(1) }",
                "compute 2 v3 Some(1.0)",
                "Stopped"
            ]
        );
        assert_eq!(run(true), copied);
    }

    #[test]
    fn newer_model_abandons_and_old_model_is_refused() {
        let mut w = GradientWorker::new(GradientWorkerConfig::new(WorkerId(0)), vec![0.0f32; 1]).unwrap();
        let _ = drain(&mut w);
        w.handle(Instant::ZERO, model(2, &[1.0])).unwrap();
        let _ = drain(&mut w);
        assert_eq!(
            w.handle(Instant::ZERO, model(1, &[1.0])),
            Err(Reject::OutdatedModel { received: Version(1), have: Version(2) })
        );
        w.handle(Instant::ZERO, model(3, &[2.0])).unwrap();
        assert_eq!(drain(&mut w), ["Abandoned { id: ComputeId(0) }", "compute 1 v3 Some(2.0)"]);
        w.handle(Instant::ZERO, ToWorker::Abort { iteration: 3 }).unwrap();
        assert_eq!(drain(&mut w), ["Abandoned { id: ComputeId(1) }"]);
        assert_eq!(w.handle_gradient(Instant::ZERO, ComputeId(1), &[0.0]), Err(Reject::NoSuchComputation));
        w.handle(Instant::ZERO, ToWorker::Stop).unwrap();
        assert!(w.is_stopped());
        assert_eq!(w.handle(Instant::ZERO, model(4, &[2.0])), Err(Reject::Stopped));
    }

    #[test]
    fn rejoins_after_waiting_too_long() {
        let mut cfg = GradientWorkerConfig::new(WorkerId(0));
        cfg.rejoin_after = Some(Duration::from_millis(10));
        let mut w = GradientWorker::new(cfg, vec![0.0f32; 1]).unwrap();
        let _ = drain(&mut w);
        let at = w.poll_timeout().unwrap();
        assert_eq!(at, Instant::ZERO + Duration::from_millis(10));
        w.handle_timeout(Instant::from_nanos(5));
        assert!(drain(&mut w).is_empty());
        w.handle_timeout(at);
        assert_eq!(drain(&mut w), ["send Join"]);
        // A retransmitted model of the version already computed on is computed again.
        w.handle(Instant::ZERO, model(0, &[1.0])).unwrap();
        let _ = drain(&mut w);
        w.handle_gradient(Instant::ZERO, ComputeId(0), &[1.0]).unwrap();
        let _ = drain(&mut w);
        w.handle(Instant::ZERO, model(0, &[1.0])).unwrap();
        assert_eq!(drain(&mut w), ["compute 1 v0 Some(1.0)"]);
        let _ = vec![0];
    }
}
