//! SSP's worker: a cached model, a clock, local steps on the cache and pulls when the cache
//! falls more than `s` clocks behind.

use super::SspConfig;
use crate::error::{ConfigError, Reject};
use crate::id::{ComputeId, Version};
use crate::math::{self, Scalar};
use crate::proto::common::queue::WorkerItem;
use crate::proto::common::worker::{CachePhase, Computed, ProtocolWorker, Received, WorkerCore, WorkerRules};
use crate::proto::{Buffer, WorkerEvent, WorkerSetup};
use crate::time::Instant;

/// The SSP worker's own state: the staleness bound, the step, the clock, the cache's server
/// clock and version, and the last `Clock` sent.
#[derive(Debug)]
pub struct SspWorkerRules<T> {
    staleness: u64,
    /// `−η_step`.
    step: T,
    /// Pulling: the cache is too stale for the current clock; a pull for `min` is out.
    phase: CachePhase<ComputeId>,
    clock: u64,
    cache_version: Version,
    cache_clock: u64,
    /// The last `Clock` sent; its payload stays in the scratch while blocked.
    last_clock: Option<WorkerItem>,
}

/// The SSP worker: a cached model, a clock, and the staleness check before every
/// computation. `S` is the caller's storage: the cache and one scratch buffer of the same
/// length for the outgoing update.
pub type SspWorker<T, S> = ProtocolWorker<T, S, SspWorkerRules<T>>;

impl<T: Scalar, S: Buffer<T>> ProtocolWorker<T, S, SspWorkerRules<T>> {
    /// A worker for `config`: `cache` has the model's length, `scratch` at least as many
    /// elements (the extra is unused). Its first output is `Join`.
    pub fn new(config: SspConfig, setup: WorkerSetup, cache: S, scratch: S) -> Result<Self, ConfigError> {
        config.check()?;
        let core = WorkerCore::new(setup, cache, Some(scratch))?;
        let rules = SspWorkerRules {
            staleness: config.staleness,
            step: T::from_f64(-config.step_size()),
            phase: CachePhase::Joining { since: Instant::ZERO },
            clock: 0,
            cache_version: Version::ZERO,
            cache_clock: 0,
            last_clock: None,
        };
        Ok(Self::from_parts(core, rules))
    }

    /// The worker's clock: clocks completed, i.e. the clock it computes or waits to compute.
    pub fn clock(&self) -> u64 {
        self.rules.clock
    }

    /// The server clock of the cached model.
    pub fn cache_clock(&self) -> u64 {
        self.rules.cache_clock
    }

    /// The server version the cache was taken from (the worker's own later updates are
    /// applied on top).
    pub fn model_version(&self) -> Version {
        self.rules.cache_version
    }

    /// Whether the worker waits for a fresher model.
    pub fn is_blocked(&self) -> bool {
        matches!(self.rules.phase, CachePhase::Pulling { .. })
    }
}

impl<T: Scalar> SspWorkerRules<T> {
    /// Starts the next clock if the cache is fresh enough, else pulls and blocks.
    fn proceed<S: Buffer<T>>(&mut self, core: &mut WorkerCore<T, S>, now: Instant) {
        if self.cache_clock.saturating_add(self.staleness) >= self.clock {
            self.phase = CachePhase::Computing(core.compute(self.cache_version));
        } else {
            let min_clock = self.clock - self.staleness;
            core.queue.push(WorkerItem::Pull { have: self.cache_version, min_clock });
            core.event(WorkerEvent::Blocked { have: self.cache_version });
            self.phase = CachePhase::Pulling { since: now, min: min_clock };
        }
    }
}

impl<T: Scalar, S: Buffer<T>> WorkerRules<T, S> for SspWorkerRules<T> {
    fn on_model(&mut self, core: &mut WorkerCore<T, S>, now: Instant, model: Received<'_, T>) -> Result<(), Reject> {
        let Received { version, clock, values } = model;
        core.check_model(&values)?;
        match self.phase {
            CachePhase::Computing(_) => {
                return Err(if version <= self.cache_version {
                    Reject::Duplicate { worker: core.id(), seq: version.0 }
                } else {
                    Reject::Unexpected { kind: "Model" }
                });
            }
            CachePhase::Pulling { min: min_clock, .. } => {
                if version < self.cache_version {
                    return Err(Reject::OutdatedModel { received: version, have: self.cache_version });
                }
                if clock < min_clock {
                    return Err(Reject::Unexpected { kind: "Model" });
                }
            }
            CachePhase::Joining { .. } => {}
        }
        values.copy_into(core.params.as_mut())?;
        self.cache_version = version;
        self.cache_clock = clock;
        // A joining worker starts at the server clock; an evicted one catches up.
        self.clock = self.clock.max(clock);
        self.proceed(core, now);
        Ok(())
    }

    fn computing(&self) -> Option<ComputeId> {
        self.phase.job()
    }

    fn on_gradient(&mut self, core: &mut WorkerCore<T, S>, now: Instant, done: Computed<'_, T>) -> Result<(), Reject> {
        let Computed { grad, loss } = done;
        core.queue.ensure_room(3)?;
        core.check_gradient(grad)?;
        let (cache, out) = core.buffers_mut();
        for (u, g) in out.iter_mut().zip(grad) {
            *u = self.step * *g;
        }
        // Read-my-writes: the cache carries the worker's own updates.
        math::add(cache, out)?;
        let clock = WorkerItem::Clock { clock: self.clock, seq: core.take_seq(), loss };
        core.queue.push(clock);
        self.last_clock = Some(clock);
        self.clock = self.clock.saturating_add(1);
        self.proceed(core, now);
        Ok(())
    }

    fn waiting_since(&self, _: &WorkerCore<T, S>) -> Option<Instant> {
        self.phase.waiting_since()
    }

    fn on_rejoin(&mut self, core: &mut WorkerCore<T, S>, now: Instant) {
        self.phase.rejoin(core, now, self.last_clock, self.cache_version);
    }
}
