//! BAP's worker: runs ahead on its cached model up to `s_bap` versions, sending one
//! gradient per iteration, and pulls when the cache is too old.

use super::BapConfig;
use crate::error::{ConfigError, Reject};
use crate::id::{ComputeId, Version, WorkerId};
use crate::math::{self, Scalar};
use crate::msg::{ToWorker, Values};
use crate::proto::common::queue::{WorkerItem, WorkerQueue};
use crate::proto::{Buffer, Worker, WorkerEvent, WorkerOutput, WorkerSetup};
use crate::time::Instant;
use core::marker::PhantomData;

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Phase {
    /// Sent `Join`, waiting for the first model.
    Joining {
        since: Instant,
    },
    /// The host computes job `id`, iteration `iteration`, on version `base`.
    Computing {
        id: ComputeId,
        iteration: u64,
        base: Version,
    },
    /// A pull for `min` is out; the next iteration starts when its answer allows.
    Pulling {
        since: Instant,
        min: u64,
    },
    Stopped,
}

/// The BAP worker: computes iteration after iteration on its cached model, pulls after
/// each gradient, blocks when the cache lags more than `s_bap` versions. `S` is the
/// caller's storage: the cache and one scratch buffer of the same length for the outgoing
/// gradient.
#[derive(Debug)]
pub struct BapWorker<T, S> {
    setup: WorkerSetup,
    s: u64,
    cache: S,
    out: S,
    phase: Phase,
    has_model: bool,
    cache_version: Version,
    /// The iteration being computed, or the next one.
    next: u64,
    seq: u64,
    next_job: u64,
    /// The last `Grad` sent (base, iteration, seq); its payload stays in `out` while pulling.
    last_grad: Option<(Version, u64, u64)>,
    queue: WorkerQueue,
    _t: PhantomData<T>,
}

impl<T: Scalar, S: Buffer<T>> BapWorker<T, S> {
    /// A worker for `config`: `cache` has the model's length, `scratch` at least as many
    /// elements. Its first output is `Join`.
    pub fn new(config: BapConfig, setup: WorkerSetup, cache: S, scratch: S) -> Result<Self, ConfigError> {
        let s = config.check()?;
        let dim = cache.as_ref().len();
        if dim == 0 {
            return Err(ConfigError::EmptyModel);
        }
        if scratch.as_ref().len() < dim {
            return Err(ConfigError::ScratchTooSmall { needed: dim, given: scratch.as_ref().len() });
        }
        let mut queue = WorkerQueue::new();
        queue.push(WorkerItem::Join { epoch: setup.epoch });
        Ok(Self {
            setup,
            s,
            cache,
            out: scratch,
            phase: Phase::Joining { since: Instant::ZERO },
            has_model: false,
            cache_version: Version::ZERO,
            next: 1,
            seq: crate::id::first_seq(setup.epoch),
            next_job: 0,
            last_grad: None,
            queue,
            _t: PhantomData,
        })
    }

    /// The iteration being computed, or the next one to compute.
    pub fn iteration(&self) -> u64 {
        self.next
    }

    /// The version of the cached model.
    pub fn model_version(&self) -> Version {
        self.cache_version
    }

    fn dim(&self) -> usize {
        self.cache.as_ref().len()
    }

    /// The lowest version the next iteration may be computed on.
    fn needed(&self) -> u64 {
        self.next.saturating_sub(1).saturating_sub(self.s)
    }

    fn pull(&mut self, now: Instant, min: u64) {
        self.queue.push(WorkerItem::Pull { have: self.cache_version, min_clock: min });
        if min > self.cache_version.0 {
            self.queue.push(WorkerItem::Event(WorkerEvent::Blocked { have: self.cache_version }));
        }
        self.phase = Phase::Pulling { since: now, min };
    }

    /// Starts the next iteration if the bound allows, else pulls for the needed version.
    fn proceed(&mut self, now: Instant) {
        self.next = self.next.max(self.cache_version.0.saturating_add(1));
        let needed = self.needed();
        if self.cache_version.0 >= needed {
            let id = ComputeId(self.next_job);
            self.next_job += 1;
            self.phase = Phase::Computing { id, iteration: self.next, base: self.cache_version };
            self.queue.push(WorkerItem::Compute { id, version: self.cache_version });
        } else {
            self.pull(now, needed);
        }
    }

    fn on_model(&mut self, now: Instant, version: Version, values: Values<'_, T>) -> Result<(), Reject> {
        values.check_len(self.dim())?;
        if self.phase == Phase::Stopped {
            return Err(Reject::Stopped);
        }
        if let Phase::Pulling { min, .. } = self.phase {
            if self.has_model && version == self.cache_version && version.0 < min {
                // The server re-sent the model we hold without satisfying the pull: it lacks
                // our gradient of iteration `version + 1` (lost). Compute it again.
                self.next = version.0.saturating_add(1);
                self.proceed(now);
                return Ok(());
            }
        }
        if self.has_model && version <= self.cache_version {
            return Err(if version == self.cache_version {
                Reject::Duplicate { worker: self.setup.id, seq: version.0 }
            } else {
                Reject::OutdatedModel { received: version, have: self.cache_version }
            });
        }
        values.copy_into(self.cache.as_mut())?;
        self.cache_version = version;
        self.has_model = true;
        // While computing, the fresher model only serves the next iteration.
        if !matches!(self.phase, Phase::Computing { .. }) {
            self.proceed(now);
        }
        Ok(())
    }
}

impl<T: Scalar, S: Buffer<T>> Worker<T> for BapWorker<T, S> {
    fn handle(&mut self, now: Instant, msg: ToWorker<'_, T>) -> Result<(), Reject> {
        self.queue.ensure_room(3)?;
        match msg {
            ToWorker::Model { version, values, .. } => self.on_model(now, version, values),
            ToWorker::NotNewer { version } => {
                match self.phase {
                    Phase::Stopped => return Err(Reject::Stopped),
                    Phase::Pulling { .. } if version <= self.cache_version && self.has_model => self.proceed(now),
                    // A reply to an older pull, or an inconsistent one: nothing to do.
                    _ => {}
                }
                Ok(())
            }
            ToWorker::Abort { iteration } => {
                if let Phase::Computing { id, iteration: current, .. } = self.phase {
                    if current == iteration {
                        self.queue.push(WorkerItem::Event(WorkerEvent::Abandoned { id }));
                        self.next = iteration.saturating_add(1);
                        // Iteration `iteration` is closed: the server has at least that version.
                        self.pull(now, iteration.max(self.needed()));
                    }
                }
                Ok(())
            }
            ToWorker::Stop => {
                if self.phase != Phase::Stopped {
                    self.phase = Phase::Stopped;
                    self.queue.push(WorkerItem::Event(WorkerEvent::Stopped));
                }
                Ok(())
            }
            other => Err(Reject::Unexpected { kind: other.kind_name() }),
        }
    }

    fn handle_gradient(&mut self, now: Instant, id: ComputeId, grad: &[T]) -> Result<(), Reject> {
        let Phase::Computing { id: current, iteration, base } = self.phase else {
            return Err(Reject::NoSuchComputation);
        };
        if id != current {
            return Err(Reject::NoSuchComputation);
        }
        self.queue.ensure_room(3)?;
        let dim = self.dim();
        if grad.len() != dim {
            return Err(Reject::WrongLength(math::LengthMismatch { expected: dim, actual: grad.len() }));
        }
        if !math::all_finite(grad) {
            return Err(Reject::NotFinite);
        }
        let out = self.out.as_mut().get_mut(..dim).ok_or(Reject::Capacity)?;
        out.copy_from_slice(grad);
        // `base` is the cache the job started on (a model that arrived meanwhile is newer).
        self.queue.push(WorkerItem::Grad { base, iteration, seq: self.seq });
        self.last_grad = Some((base, iteration, self.seq));
        self.seq += 1;
        self.next = iteration.saturating_add(1);
        // Always ask for a fresher model; the answer (or `NotNewer`) starts the next iteration.
        let needed = self.needed();
        self.pull(now, needed);
        Ok(())
    }

    fn handle_timeout(&mut self, now: Instant) {
        let Some(after) = self.setup.rejoin_after else { return };
        if self.queue.ensure_room(3).is_err() {
            return;
        }
        match self.phase {
            Phase::Joining { since } if now >= since + after => {
                self.phase = Phase::Joining { since: now };
                self.queue.push(WorkerItem::Join { epoch: self.setup.epoch });
            }
            Phase::Pulling { since, min } if now >= since + after => {
                if let Some((base, iteration, seq)) = self.last_grad {
                    self.queue.push(WorkerItem::Grad { base, iteration, seq });
                }
                self.queue.push(WorkerItem::Pull { have: self.cache_version, min_clock: min });
                self.phase = Phase::Pulling { since: now, min };
            }
            _ => {}
        }
    }

    fn poll_output(&mut self) -> Option<WorkerOutput<'_, T>> {
        let dim = self.dim();
        let out = self.out.as_ref();
        self.queue.poll(self.cache.as_ref(), out.get(..dim).unwrap_or(out))
    }

    fn poll_timeout(&self) -> Option<Instant> {
        let after = self.setup.rejoin_after?;
        match self.phase {
            Phase::Joining { since } | Phase::Pulling { since, .. } => Some(since + after),
            _ => None,
        }
    }

    fn id(&self) -> WorkerId {
        self.setup.id
    }

    fn is_stopped(&self) -> bool {
        self.phase == Phase::Stopped
    }

    fn outputs_lost(&self) -> u64 {
        self.queue.lost()
    }
}
