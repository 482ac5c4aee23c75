//! The aggregation state of one synchronous iteration, shared by every protocol that averages
//! a round of gradients (BSP, backup workers, DBW, group servers): which workers contributed,
//! with which weight, into a caller-owned accumulator; and the close that applies the mean
//! and reports one outcome per contribution.

use super::queue::{ServerItem, ServerQueue};
use crate::error::{ConfigError, Reject};
use crate::id::{MAX_WORKERS, Version, WorkerId, WorkerSet};
use crate::math::{self, Scalar};
use crate::msg::Values;
use crate::proto::{ServerEvent, ServerStats};

/// Refuses a learning rate that is not finite and positive.
pub(crate) fn check_learning_rate(lr: f64) -> Result<(), ConfigError> {
    if lr.is_finite() && lr > 0.0 { Ok(()) } else { Err(ConfigError::LearningRate) }
}

/// The aggregation state of one synchronous iteration: which workers contributed, with
/// which weight, into an accumulator. Shared by BSP, backup workers and group servers.
#[derive(Clone, Debug)]
pub(crate) struct Round {
    pub(crate) got: WorkerSet,
    factors: [f64; MAX_WORKERS],
}

impl Round {
    pub(crate) fn new() -> Self {
        Self { got: WorkerSet::EMPTY, factors: [1.0; MAX_WORKERS] }
    }

    /// Adds `factor * values` into `acc` for `worker` (already checked not to be in `got`).
    pub(crate) fn add<T: Scalar>(
        &mut self,
        worker: WorkerId,
        values: &Values<'_, T>,
        factor: T,
        acc: &mut [T],
    ) -> Result<(), Reject> {
        if factor == T::one() {
            values.add_into(acc)?;
        } else {
            values.scaled_add_into(acc, factor)?;
        }
        self.record(worker, factor);
        Ok(())
    }

    /// Records `worker`'s contribution with `factor` whose values the caller already added
    /// (the fused path: [`GradientPolicy::admit_add_to`] into a spare accumulator).
    pub(crate) fn record<T: Scalar>(&mut self, worker: WorkerId, factor: T) {
        self.got.insert(worker);
        if let Some(f) = self.factors.get_mut(worker.index()) {
            *f = factor.to_f64();
        }
    }

    /// Closes the round: `params -= lr/k * acc`, `acc = 0`, queues an `Applied` event per
    /// contributor (in id order) and a `ModelUpdated`. Returns the new version.
    pub(crate) fn close<T: Scalar>(
        &mut self,
        params: &mut [T],
        acc: &mut [T],
        learning_rate: f64,
        base: Version,
        queue: &mut ServerQueue,
        stats: &mut ServerStats,
    ) -> Version {
        // Lengths were fixed at construction; a mismatch is impossible here.
        let _ = math::apply_and_clear(params, Self::rate(learning_rate, self.got.len()), acc);
        self.finish(base, queue, stats)
    }

    /// The update's factor `−lr/k` for `k` contributions (at least 1).
    fn rate<T: Scalar>(learning_rate: f64, k: usize) -> T {
        T::from_f64(-learning_rate / k.max(1) as f64)
    }

    /// [`Self::add`] of the round's last gradient fused with [`Self::close`]: one pass does
    /// `params += a · (acc + factor · values); acc = 0` (the bits of the two calls, one pass
    /// over the accumulator fewer). `worker` is not in `got`. On `Err` (a length mismatch)
    /// nothing changed.
    #[allow(clippy::too_many_arguments)]
    pub(crate) fn add_and_close<T: Scalar>(
        &mut self,
        worker: WorkerId,
        values: &Values<'_, T>,
        factor: T,
        params: &mut [T],
        acc: &mut [T],
        learning_rate: f64,
        base: Version,
        queue: &mut ServerQueue,
        stats: &mut ServerStats,
    ) -> Result<Version, Reject> {
        let k = self.got.len() + usize::from(!self.got.contains(worker));
        values.add_apply_and_clear(factor, params, Self::rate(learning_rate, k), acc)?;
        self.record(worker, factor);
        Ok(self.finish(base, queue, stats))
    }

    /// The bookkeeping of a close once the update is applied: events, stats, next version.
    fn finish(&mut self, base: Version, queue: &mut ServerQueue, stats: &mut ServerStats) -> Version {
        let k = self.got.len().max(1);
        let version = base.next();
        for worker in self.got.iter() {
            let factor = self.factors.get(worker.index()).copied().unwrap_or(1.0);
            queue.push(ServerItem::Event(ServerEvent::Applied {
                worker,
                base,
                version,
                staleness: 0,
                weight: factor / k as f64,
            }));
        }
        stats.applied += k as u64;
        stats.updates += 1;
        queue.push(ServerItem::Event(ServerEvent::ModelUpdated { version, contributions: k as u32 }));
        self.got.clear();
        version
    }
}
