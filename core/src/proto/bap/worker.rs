//! BAP's worker: runs ahead on its cached model up to `s_bap` versions, sending one
//! gradient per iteration, and pulls when the cache is too old.

use super::BapConfig;
use crate::error::{ConfigError, Reject};
use crate::id::{ComputeId, Version};
use crate::math::Scalar;
use crate::msg::ToWorker;
use crate::proto::common::queue::WorkerItem;
use crate::proto::common::worker::{CachePhase, Computed, ProtocolWorker, Received, WorkerCore, WorkerRules};
use crate::proto::{Buffer, WorkerEvent, WorkerSetup};
use crate::time::Instant;

/// A running computation: job `id`, iteration `iteration`, on version `base`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
struct Job {
    id: ComputeId,
    iteration: u64,
    base: Version,
}

/// The BAP worker's own state: the bound `s_bap`, its phase, the cache's version, the next
/// iteration and the last gradient sent.
#[derive(Debug)]
pub struct BapWorkerRules {
    s: u64,
    /// Pulling: a pull for `min` is out; the next iteration starts when its answer allows.
    phase: CachePhase<Job>,
    has_model: bool,
    cache_version: Version,
    /// The iteration being computed, or the next one.
    next: u64,
    /// The last `Grad` sent; its payload stays in the scratch while pulling.
    last_grad: Option<WorkerItem>,
}

/// The BAP worker: computes iteration after iteration on its cached model, pulls after
/// each gradient, blocks when the cache lags more than `s_bap` versions. `S` is the
/// caller's storage: the cache and one scratch buffer of the same length for the outgoing
/// gradient.
pub type BapWorker<T, S> = ProtocolWorker<T, S, BapWorkerRules>;

impl<T: Scalar, S: Buffer<T>> ProtocolWorker<T, S, BapWorkerRules> {
    /// A worker for `config`: `cache` has the model's length, `scratch` at least as many
    /// elements. Its first output is `Join`.
    pub fn new(config: BapConfig, setup: WorkerSetup, cache: S, scratch: S) -> Result<Self, ConfigError> {
        let s = config.check()?;
        let core = WorkerCore::new(setup, cache, Some(scratch))?;
        let rules = BapWorkerRules {
            s,
            phase: CachePhase::Joining { since: Instant::ZERO },
            has_model: false,
            cache_version: Version::ZERO,
            next: 1,
            last_grad: None,
        };
        Ok(Self::from_parts(core, rules))
    }

    /// The iteration being computed, or the next one to compute.
    pub fn iteration(&self) -> u64 {
        self.rules.next
    }

    /// The version of the cached model.
    pub fn model_version(&self) -> Version {
        self.rules.cache_version
    }
}

impl BapWorkerRules {
    /// The lowest version the next iteration may be computed on.
    fn needed(&self) -> u64 {
        self.next.saturating_sub(1).saturating_sub(self.s)
    }

    fn pull<T: Scalar, S: Buffer<T>>(&mut self, core: &mut WorkerCore<T, S>, now: Instant, min: u64) {
        core.queue.push(WorkerItem::Pull { have: self.cache_version, min_clock: min });
        if min > self.cache_version.0 {
            core.event(WorkerEvent::Blocked { have: self.cache_version });
        }
        self.phase = CachePhase::Pulling { since: now, min };
    }

    /// Starts the next iteration if the bound allows, else pulls for the needed version.
    fn proceed<T: Scalar, S: Buffer<T>>(&mut self, core: &mut WorkerCore<T, S>, now: Instant) {
        self.next = self.next.max(self.cache_version.0.saturating_add(1));
        let needed = self.needed();
        if self.cache_version.0 >= needed {
            let id = core.compute(self.cache_version);
            self.phase = CachePhase::Computing(Job { id, iteration: self.next, base: self.cache_version });
        } else {
            self.pull(core, now, needed);
        }
    }
}

impl<T: Scalar, S: Buffer<T>> WorkerRules<T, S> for BapWorkerRules {
    fn on_model(&mut self, core: &mut WorkerCore<T, S>, now: Instant, model: Received<'_, T>) -> Result<(), Reject> {
        let Received { version, values, .. } = model;
        core.check_model(&values)?;
        if let CachePhase::Pulling { min, .. } = self.phase {
            if self.has_model && version == self.cache_version && version.0 < min {
                // The server re-sent the model we hold without satisfying the pull: it lacks
                // our gradient of iteration `version + 1` (lost). Compute it again.
                self.next = version.0.saturating_add(1);
                self.proceed(core, now);
                return Ok(());
            }
        }
        if self.has_model && version <= self.cache_version {
            return Err(if version == self.cache_version {
                Reject::Duplicate { worker: core.id(), seq: version.0 }
            } else {
                Reject::OutdatedModel { received: version, have: self.cache_version }
            });
        }
        values.copy_into(core.params.as_mut())?;
        self.cache_version = version;
        self.has_model = true;
        // While computing, the fresher model only serves the next iteration.
        if !matches!(self.phase, CachePhase::Computing(_)) {
            self.proceed(core, now);
        }
        Ok(())
    }

    fn on_message(&mut self, core: &mut WorkerCore<T, S>, now: Instant, msg: ToWorker<'_, T>) -> Result<(), Reject> {
        match msg {
            ToWorker::NotNewer { version } => {
                if core.stopped {
                    return Err(Reject::Stopped);
                }
                // Otherwise a reply to an older pull, or an inconsistent one: nothing to do.
                if matches!(self.phase, CachePhase::Pulling { .. }) && version <= self.cache_version && self.has_model {
                    self.proceed(core, now);
                }
                Ok(())
            }
            ToWorker::Abort { iteration } => {
                if let (false, CachePhase::Computing(Job { id, iteration: current, .. })) = (core.stopped, self.phase) {
                    if current == iteration {
                        core.event(WorkerEvent::Abandoned { id });
                        self.next = iteration.saturating_add(1);
                        // Iteration `iteration` is closed: the server has at least that version.
                        let min = iteration.max(self.needed());
                        self.pull(core, now, min);
                    }
                }
                Ok(())
            }
            other => Err(Reject::Unexpected { kind: other.kind_name() }),
        }
    }

    fn computing(&self) -> Option<ComputeId> {
        self.phase.job().map(|job| job.id)
    }

    fn on_gradient(&mut self, core: &mut WorkerCore<T, S>, now: Instant, done: Computed<'_, T>) -> Result<(), Reject> {
        let Computed { grad, loss } = done;
        let CachePhase::Computing(Job { iteration, base, .. }) = self.phase else {
            return Err(Reject::NoSuchComputation);
        };
        core.queue.ensure_room(3)?;
        core.check_gradient(grad)?;
        let (_, out) = core.buffers_mut();
        if out.len() != grad.len() {
            return Err(Reject::Capacity);
        }
        out.copy_from_slice(grad);
        // `base` is the cache the job started on (a model that arrived meanwhile is newer).
        let sent = WorkerItem::Grad { base, iteration, seq: core.take_seq(), loss };
        core.queue.push(sent);
        self.last_grad = Some(sent);
        self.next = iteration.saturating_add(1);
        // Always ask for a fresher model; the answer (or `NotNewer`) starts the next iteration.
        let needed = self.needed();
        self.pull(core, now, needed);
        Ok(())
    }

    fn waiting_since(&self, _: &WorkerCore<T, S>) -> Option<Instant> {
        self.phase.waiting_since()
    }

    fn on_rejoin(&mut self, core: &mut WorkerCore<T, S>, now: Instant) {
        self.phase.rejoin(core, now, self.last_grad, self.cache_version);
    }
}
