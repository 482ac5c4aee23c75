//! The worker engine every protocol shares: the worker's identity and session (id, epoch,
//! rejoin delay), its sequence numbering, job numbering, model and outgoing buffers, output
//! queue and stop flag ([`WorkerCore`]), and the one implementation of the [`Worker`] verbs
//! ([`ProtocolWorker`]) that screens every input (stopped, output room, the computation
//! named), answers `Stop`, runs the rejoin timer and drains outputs. A protocol's worker is
//! a [`WorkerRules`] value: the state only it keeps (its phase, cache clock, last upload…)
//! and what it does with a message, a gradient and a rejoin deadline. It mirrors the
//! server engine ([`ServerCore`](super::engine::ServerCore) and
//! [`ProtocolServer`](super::engine::ProtocolServer)).

use super::queue::{WorkerItem, WorkerQueue};
use crate::error::{ConfigError, Reject};
use crate::id::{ComputeId, Version, WorkerId};
use crate::math::{self, Scalar};
use crate::msg::{ToWorker, Values};
use crate::proto::{Buffer, Worker, WorkerEvent, WorkerOutput};
use crate::time::{Duration, Instant};
use core::marker::PhantomData;

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

/// The state every worker keeps, whatever its protocol.
#[derive(Debug)]
pub struct WorkerCore<T, S> {
    /// Id, session epoch and rejoin delay.
    pub(crate) setup: WorkerSetup,
    /// The model (or cache) the host computes on; its length is the model's.
    pub(crate) params: S,
    /// The outgoing tensor (gradient, step or delta), at least the model's length; `None`
    /// when the protocol sends from `params` itself (the gradient worker).
    pub(crate) scratch: Option<S>,
    /// The sequence number of the next contribution sent.
    pub(crate) seq: u64,
    /// The token of the next computation asked for.
    pub(crate) next_job: u64,
    /// Pending outputs.
    pub(crate) queue: WorkerQueue,
    /// The server said training is over.
    pub(crate) stopped: bool,
    _t: PhantomData<T>,
}

impl<T: Scalar, S: Buffer<T>> WorkerCore<T, S> {
    /// Checks the buffers (a non-empty model; `scratch`, if any, at least as long) and sets up
    /// a worker whose first output is `Join`.
    pub(crate) fn new(setup: WorkerSetup, params: S, scratch: Option<S>) -> Result<Self, ConfigError> {
        let dim = params.as_ref().len();
        if dim == 0 {
            return Err(ConfigError::EmptyModel);
        }
        if let Some(given) = scratch.as_ref().map(|s| s.as_ref().len()) {
            if given < dim {
                return Err(ConfigError::ScratchTooSmall { needed: dim, given });
            }
        }
        let mut queue = WorkerQueue::new();
        queue.push(WorkerItem::Join { epoch: setup.epoch });
        Ok(Self {
            setup,
            params,
            scratch,
            seq: crate::id::first_seq(setup.epoch),
            next_job: 0,
            queue,
            stopped: false,
            _t: PhantomData,
        })
    }

    /// The common screening of a `Model` for a worker that refuses input once stopped:
    /// its length, then whether the worker still runs.
    pub(crate) fn check_model(&self, values: &Values<'_, T>) -> Result<(), Reject> {
        values.check_len(self.dim())?;
        if self.stopped {
            return Err(Reject::Stopped);
        }
        Ok(())
    }

    /// The common screening of a `Model` for a worker that keeps the version it last took
    /// (`have`): its length, then that it is not older.
    pub(crate) fn check_model_age(
        &self,
        values: &Values<'_, T>,
        version: Version,
        have: Option<Version>,
    ) -> Result<(), Reject> {
        values.check_len(self.dim())?;
        match have {
            Some(have) if version < have => Err(Reject::OutdatedModel { received: version, have }),
            _ => Ok(()),
        }
    }

    /// The model's length.
    pub(crate) fn dim(&self) -> usize {
        self.params.as_ref().len()
    }

    /// This worker's id.
    pub(crate) fn id(&self) -> WorkerId {
        self.setup.id
    }

    /// The model buffer and the outgoing buffer (the first `dim` elements of the scratch;
    /// empty when the protocol has none), borrowed together.
    pub(crate) fn buffers_mut(&mut self) -> (&mut [T], &mut [T]) {
        let params = self.params.as_mut();
        let dim = params.len();
        let out = match self.scratch.as_mut() {
            Some(s) => s.as_mut().get_mut(..dim).unwrap_or_default(),
            None => &mut [],
        };
        (params, out)
    }

    /// Asks the host to compute on the model buffer (tagged `version`); returns the job's token.
    pub(crate) fn compute(&mut self, version: Version) -> ComputeId {
        let id = ComputeId(self.next_job);
        self.next_job += 1;
        self.queue.push(WorkerItem::Compute { id, version });
        id
    }

    /// Takes the next sequence number for a contribution.
    pub(crate) fn take_seq(&mut self) -> u64 {
        let seq = self.seq;
        self.seq += 1;
        seq
    }

    /// Queues `Join` again (same epoch): the server answers with its current model.
    pub(crate) fn rejoin(&mut self) {
        self.queue.push(WorkerItem::Join { epoch: self.setup.epoch });
    }

    /// Queues a worker event.
    pub(crate) fn event(&mut self, event: WorkerEvent) {
        self.queue.push(WorkerItem::Event(event));
    }

    /// Checks a gradient from the host: the model's length, every element finite.
    pub(crate) fn check_gradient(&self, grad: &[T]) -> Result<(), Reject> {
        let dim = self.dim();
        if grad.len() != dim {
            return Err(Reject::WrongLength(math::LengthMismatch { expected: dim, actual: grad.len() }));
        }
        if !math::all_finite(grad) {
            return Err(Reject::NotFinite);
        }
        Ok(())
    }

    fn stop(&mut self) {
        if !self.stopped {
            self.stopped = true;
            self.event(WorkerEvent::Stopped);
        }
    }
}

/// The phases of a worker that computes on a cached model and pulls a fresher one when the
/// cache is too old (SSP, BAP). `J` is what a protocol keeps about the running computation.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum CachePhase<J> {
    /// Sent `Join`, waiting for the first model.
    Joining { since: Instant },
    /// The host computes a job.
    Computing(J),
    /// A pull for a model of at least `min` is out.
    Pulling { since: Instant, min: u64 },
}

impl<J: Copy> CachePhase<J> {
    /// Since when the worker waits for the server, if it waits.
    pub(crate) fn waiting_since(&self) -> Option<Instant> {
        match *self {
            Self::Joining { since } | Self::Pulling { since, .. } => Some(since),
            Self::Computing(_) => None,
        }
    }

    /// The running job, if any.
    pub(crate) fn job(&self) -> Option<J> {
        match *self {
            Self::Computing(job) => Some(job),
            _ => None,
        }
    }

    /// The rejoin deadline passed (with room for three outputs): a joining worker sends
    /// `Join` again; a pulling one re-sends its last contribution `last` (the server refuses
    /// a repeat it has as a duplicate) and the pull, since either may have been lost.
    pub(crate) fn rejoin<T: Scalar, S: Buffer<T>>(
        &mut self,
        core: &mut WorkerCore<T, S>,
        now: Instant,
        last: Option<WorkerItem>,
        have: Version,
    ) {
        if core.queue.ensure_room(3).is_err() {
            return;
        }
        match *self {
            Self::Joining { .. } => {
                *self = Self::Joining { since: now };
                core.rejoin();
            }
            Self::Pulling { min, .. } => {
                if let Some(item) = last {
                    core.queue.push(item);
                }
                core.queue.push(WorkerItem::Pull { have, min_clock: min });
                *self = Self::Pulling { since: now, min };
            }
            Self::Computing(_) => {}
        }
    }
}

/// A model from the server as a protocol's worker rules receive it: its version, the clock
/// it carries (SSP's server clock; the version for the others) and its values.
#[derive(Clone, Copy, Debug)]
pub struct Received<'a, T> {
    /// The model's version.
    pub version: Version,
    /// The clock it carries.
    pub clock: u64,
    /// The model.
    pub values: Values<'a, T>,
}

/// A finished computation as a protocol's worker rules receive it: the host's gradient and
/// its minibatch loss, if reported (finite: the engine refused any other).
#[derive(Clone, Copy, Debug)]
pub struct Computed<'a, T> {
    /// The gradient.
    pub grad: &'a [T],
    /// The minibatch loss it was computed with.
    pub loss: Option<f32>,
}

/// What makes a protocol's worker: the state only it keeps and its reactions, over a
/// [`WorkerCore`].
///
/// [`ProtocolWorker`] calls these only after the common screening: a message is not `Stop`
/// (the engine answers it), the queue has room for three outputs and, where
/// [`Self::REFUSE_WHEN_STOPPED`], the worker is not stopped; a gradient names the
/// computation [`Self::computing`] reports and the worker is not stopped. An `Err` must
/// leave both the rules and the core unchanged.
pub trait WorkerRules<T: Scalar, S: Buffer<T>> {
    /// Whether a stopped worker refuses every message with [`Reject::Stopped`] (before any
    /// other check); otherwise the rules decide per message.
    const REFUSE_WHEN_STOPPED: bool = false;
    /// What a stopped worker answers to a gradient.
    const STOPPED_GRADIENT: Reject = Reject::NoSuchComputation;

    /// A model from the server.
    fn on_model(&mut self, core: &mut WorkerCore<T, S>, now: Instant, model: Received<'_, T>) -> Result<(), Reject>;

    /// A message from the server other than `Model` and `Stop`; refused unless the protocol
    /// takes it.
    fn on_message(&mut self, core: &mut WorkerCore<T, S>, now: Instant, msg: ToWorker<'_, T>) -> Result<(), Reject> {
        let _ = (core, now);
        Err(Reject::Unexpected { kind: msg.kind_name() })
    }

    /// The computation the host is running for this worker, if any.
    fn computing(&self) -> Option<ComputeId>;

    /// The host's gradient for [`Self::computing`], with its minibatch loss if reported
    /// (finite: the engine refused any other).
    fn on_gradient(&mut self, core: &mut WorkerCore<T, S>, now: Instant, done: Computed<'_, T>) -> Result<(), Reject>;

    /// Since when the worker waits for the server (the rejoin timer runs from there), if it
    /// waits.
    fn waiting_since(&self, core: &WorkerCore<T, S>) -> Option<Instant>;

    /// The worker has waited `rejoin_after` for the server: ask again.
    fn on_rejoin(&mut self, core: &mut WorkerCore<T, S>, now: Instant);

    /// An output was just polled.
    fn on_polled(&mut self, out: &WorkerOutput<'_, T>) {
        let _ = out;
    }
}

/// A worker: the shared [`WorkerCore`] driven by a protocol's [`WorkerRules`]. Every
/// protocol's worker type (`GradientWorker`, `SspWorker`, …) is one of these.
#[derive(Debug)]
pub struct ProtocolWorker<T, S, P> {
    pub(crate) core: WorkerCore<T, S>,
    pub(crate) rules: P,
}

impl<T: Scalar, S: Buffer<T>, P: WorkerRules<T, S>> ProtocolWorker<T, S, P> {
    /// The model's length.
    pub(crate) fn dim(&self) -> usize {
        self.core.dim()
    }

    /// Whether the next output is a message to the server (`None`: no output pending).
    pub(crate) fn next_is_send(&self) -> Option<bool> {
        self.core.queue.next_is_send()
    }

    /// Whether the output queue has room for `burst` more outputs.
    pub(crate) fn has_room(&self, burst: usize) -> bool {
        self.core.queue.ensure_room(burst).is_ok()
    }

    pub(crate) fn from_parts(core: WorkerCore<T, S>, rules: P) -> Self {
        Self { core, rules }
    }

    /// The checks every gradient from the host passes first: the worker is not stopped and
    /// `id` is the computation it is running.
    pub(crate) fn check_computation(&self, id: ComputeId) -> Result<(), Reject> {
        if self.core.stopped {
            return Err(P::STOPPED_GRADIENT);
        }
        if self.rules.computing() != Some(id) {
            return Err(Reject::NoSuchComputation);
        }
        Ok(())
    }
}

impl<T: Scalar, S: Buffer<T>, P: WorkerRules<T, S>> Worker<T> for ProtocolWorker<T, S, P> {
    fn handle(&mut self, now: Instant, msg: ToWorker<'_, T>) -> Result<(), Reject> {
        if P::REFUSE_WHEN_STOPPED && self.core.stopped {
            return Err(Reject::Stopped);
        }
        self.core.queue.ensure_room(3)?;
        match msg {
            ToWorker::Stop => {
                self.core.stop();
                Ok(())
            }
            ToWorker::Model { version, clock, values } => {
                self.rules.on_model(&mut self.core, now, Received { version, clock, values })
            }
            msg => self.rules.on_message(&mut self.core, now, msg),
        }
    }

    fn handle_gradient_with_loss(
        &mut self,
        now: Instant,
        id: ComputeId,
        grad: &[T],
        loss: Option<f32>,
    ) -> Result<(), Reject> {
        self.check_computation(id)?;
        crate::proto::common::loss::LossTally::check(loss)?;
        self.rules.on_gradient(&mut self.core, now, Computed { grad, loss })
    }

    fn handle_timeout(&mut self, now: Instant) {
        if self.poll_timeout().is_some_and(|at| now >= at) {
            self.rules.on_rejoin(&mut self.core, now);
        }
    }

    fn poll_output(&mut self) -> Option<WorkerOutput<'_, T>> {
        let core = &mut self.core;
        let params = core.params.as_ref();
        let outgoing = match core.scratch.as_ref() {
            Some(s) => s.as_ref().get(..params.len()).unwrap_or_default(),
            None => params,
        };
        let out = core.queue.poll(params, outgoing);
        if let Some(o) = &out {
            self.rules.on_polled(o);
        }
        out
    }

    fn poll_timeout(&self) -> Option<Instant> {
        if self.core.stopped {
            return None;
        }
        let after = self.core.setup.rejoin_after?;
        self.rules.waiting_since(&self.core).map(|since| since + after)
    }

    fn id(&self) -> WorkerId {
        self.core.setup.id
    }

    fn is_stopped(&self) -> bool {
        self.core.stopped
    }

    fn outputs_lost(&self) -> u64 {
        self.core.queue.lost()
    }
}
