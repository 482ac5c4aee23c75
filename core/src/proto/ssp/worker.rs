//! SSP's worker: a cached model, a clock, local steps on the cache and pulls when the cache
//! falls more than `s` clocks behind.

use super::SspConfig;
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
    /// The host computes job `id` for the worker's current clock.
    Computing {
        id: ComputeId,
    },
    /// The cache is too stale for the current clock; a pull for `min_clock` is out.
    Blocked {
        since: Instant,
        min_clock: u64,
    },
    Stopped,
}

/// The SSP worker: a cached model, a clock, and the staleness check before every
/// computation. `S` is the caller's storage: the cache and one scratch buffer of the same
/// length for the outgoing update.
#[derive(Debug)]
pub struct SspWorker<T, S> {
    setup: WorkerSetup,
    staleness: u64,
    /// `−η_step`.
    step: T,
    cache: S,
    out: S,
    phase: Phase,
    clock: u64,
    cache_version: Version,
    cache_clock: u64,
    seq: u64,
    next_job: u64,
    /// The last `Clock` sent, (clock, seq); its payload stays in `out` while blocked.
    last_clock: Option<(u64, u64)>,
    queue: WorkerQueue,
    _t: PhantomData<T>,
}

impl<T: Scalar, S: Buffer<T>> SspWorker<T, S> {
    /// A worker for `config`: `cache` has the model's length, `scratch` at least as many
    /// elements (the extra is unused). Its first output is `Join`.
    pub fn new(config: SspConfig, setup: WorkerSetup, cache: S, scratch: S) -> Result<Self, ConfigError> {
        config.check()?;
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
            staleness: config.staleness,
            step: T::from_f64(-config.step_size()),
            cache,
            out: scratch,
            phase: Phase::Joining { since: Instant::ZERO },
            clock: 0,
            cache_version: Version::ZERO,
            cache_clock: 0,
            seq: crate::id::first_seq(setup.epoch),
            next_job: 0,
            last_clock: None,
            queue,
            _t: PhantomData,
        })
    }

    /// The worker's clock: clocks completed, i.e. the clock it computes or waits to compute.
    pub fn clock(&self) -> u64 {
        self.clock
    }

    /// The server clock of the cached model.
    pub fn cache_clock(&self) -> u64 {
        self.cache_clock
    }

    /// The server version the cache was taken from (the worker's own later updates are
    /// applied on top).
    pub fn model_version(&self) -> Version {
        self.cache_version
    }

    /// Whether the worker waits for a fresher model.
    pub fn is_blocked(&self) -> bool {
        matches!(self.phase, Phase::Blocked { .. })
    }

    fn dim(&self) -> usize {
        self.cache.as_ref().len()
    }

    /// Starts the next clock if the cache is fresh enough, else pulls and blocks.
    fn proceed(&mut self, now: Instant) {
        if self.cache_clock.saturating_add(self.staleness) >= self.clock {
            let id = ComputeId(self.next_job);
            self.next_job += 1;
            self.phase = Phase::Computing { id };
            self.queue.push(WorkerItem::Compute { id, version: self.cache_version });
        } else {
            let min_clock = self.clock - self.staleness;
            self.queue.push(WorkerItem::Pull { have: self.cache_version, min_clock });
            self.queue.push(WorkerItem::Event(WorkerEvent::Blocked { have: self.cache_version }));
            self.phase = Phase::Blocked { since: now, min_clock };
        }
    }

    fn on_model(&mut self, now: Instant, version: Version, clock: u64, values: Values<'_, T>) -> Result<(), Reject> {
        values.check_len(self.dim())?;
        match self.phase {
            Phase::Stopped => return Err(Reject::Stopped),
            Phase::Computing { .. } => {
                return Err(if version <= self.cache_version {
                    Reject::Duplicate { worker: self.setup.id, seq: version.0 }
                } else {
                    Reject::Unexpected { kind: "Model" }
                });
            }
            Phase::Blocked { min_clock, .. } => {
                if version < self.cache_version {
                    return Err(Reject::OutdatedModel { received: version, have: self.cache_version });
                }
                if clock < min_clock {
                    return Err(Reject::Unexpected { kind: "Model" });
                }
            }
            Phase::Joining { .. } => {}
        }
        values.copy_into(self.cache.as_mut())?;
        self.cache_version = version;
        self.cache_clock = clock;
        // A joining worker starts at the server clock; an evicted one catches up.
        self.clock = self.clock.max(clock);
        self.proceed(now);
        Ok(())
    }
}

impl<T: Scalar, S: Buffer<T>> Worker<T> for SspWorker<T, S> {
    fn handle(&mut self, now: Instant, msg: ToWorker<'_, T>) -> Result<(), Reject> {
        self.queue.ensure_room(3)?;
        match msg {
            ToWorker::Model { version, clock, values } => self.on_model(now, version, clock, values),
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
        match self.phase {
            Phase::Computing { id: current } if current == id => {}
            _ => return Err(Reject::NoSuchComputation),
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
        for (u, g) in out.iter_mut().zip(grad) {
            *u = self.step * *g;
        }
        // Read-my-writes: the cache carries the worker's own updates.
        math::add(self.cache.as_mut(), out)?;
        self.queue.push(WorkerItem::Clock { clock: self.clock, seq: self.seq });
        self.last_clock = Some((self.clock, self.seq));
        self.seq += 1;
        self.clock = self.clock.saturating_add(1);
        self.proceed(now);
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
            Phase::Blocked { since, min_clock } if now >= since + after => {
                // The update or the pull may have been lost: send both again (the server
                // refuses a repeat of an update it has as a duplicate).
                if let Some((clock, seq)) = self.last_clock {
                    self.queue.push(WorkerItem::Clock { clock, seq });
                }
                self.queue.push(WorkerItem::Pull { have: self.cache_version, min_clock });
                self.phase = Phase::Blocked { since: now, min_clock };
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
            Phase::Joining { since } | Phase::Blocked { since, .. } => Some(since + after),
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
