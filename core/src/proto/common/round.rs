//! The aggregation state of one synchronous iteration, shared by every protocol that averages
//! a round of gradients (BSP, backup workers, DBW, WBSP, group servers): which workers
//! contributed (each worker record's mark), with which weight (its slot's factor), into a
//! caller-owned accumulator; and the close that applies the mean and reports one outcome per
//! contribution as one batched item.

use super::engine::ServerCore;
use super::loss::LossTally;
use super::optim::{Cleared, FoldedLast};
use super::queue::{BatchKind, ServerItem};
use super::roster::{Roster, mark_of};
use super::table::{Slot, Storage};
use crate::error::Reject;
use crate::id::{Version, WorkerId};
use crate::math::Scalar;
use crate::msg::Values;
use crate::proto::{Buffer, ServerEvent};

/// The aggregation state of one synchronous iteration: how many workers contributed (who
/// they are is in their records' marks) into an accumulator.
#[derive(Clone, Copy, Debug, Default)]
pub(crate) struct Round {
    count: usize,
}

impl Round {
    pub(crate) const fn new() -> Self {
        Self { count: 0 }
    }

    /// Contributions so far.
    pub(crate) fn len(&self) -> usize {
        self.count
    }

    /// Whether `worker` contributed to the round open at `version`.
    pub(crate) fn contains<M: Storage, X: Slot>(roster: &Roster<M, X>, worker: WorkerId, version: Version) -> bool {
        roster.in_round(worker, version)
    }

    /// The workers of `roster` in the round open at `version`, in id order.
    pub(crate) fn members<M: Storage, X: Slot>(
        roster: &Roster<M, X>,
        version: Version,
    ) -> impl Iterator<Item = WorkerId> + '_ {
        let mark = mark_of(version);
        roster.records().iter().enumerate().filter(move |(_, r)| r.mark == mark).map(|(i, _)| WorkerId(i as u32))
    }

    /// The lowest live worker of `roster` that has not contributed to the round open at
    /// `version`, if any (for stall reports).
    pub(crate) fn first_missing<M: Storage, X: Slot>(roster: &Roster<M, X>, version: Version) -> Option<WorkerId> {
        roster.live().find(|(_, r)| r.mark != mark_of(version)).map(|(w, _)| w)
    }

    /// The lowest worker of `roster`, live or not, that has not contributed to the round
    /// open at `version`, if any.
    pub(crate) fn first_missing_any<M: Storage, X: Slot>(roster: &Roster<M, X>, version: Version) -> Option<WorkerId> {
        roster.records().iter().position(|r| r.mark != mark_of(version)).map(|i| WorkerId(i as u32))
    }

    /// Adds `factor * values` into `acc` for `worker` (already checked not to be in the
    /// round open at `version`), and its reported loss into `loss`.
    #[allow(clippy::too_many_arguments)]
    pub(crate) fn add<T: Scalar, M: Storage, X: Slot>(
        &mut self,
        roster: &mut Roster<M, X>,
        version: Version,
        worker: WorkerId,
        values: &Values<'_, T>,
        factor: T,
        acc: &mut [T],
        loss: &mut LossTally,
    ) -> Result<(), Reject> {
        if factor == T::one() {
            values.add_into(acc)?;
        } else {
            values.scaled_add_into(acc, factor)?;
        }
        self.record(roster, version, worker, factor, loss);
        Ok(())
    }

    /// Records `worker`'s contribution with `factor` whose values the caller already added
    /// (the fused path: [`GradientPolicy::admit_add_to`] into a spare accumulator), and its
    /// reported loss into `loss`.
    pub(crate) fn record<T: Scalar, M: Storage, X: Slot>(
        &mut self,
        roster: &mut Roster<M, X>,
        version: Version,
        worker: WorkerId,
        factor: T,
        loss: &mut LossTally,
    ) {
        if let Some(r) = roster.record_mut(worker) {
            if r.mark != mark_of(version) {
                self.count += 1;
                loss.count();
            }
            r.mark = mark_of(version);
            r.ext.set_factor(factor.to_f64() as f32);
        }
    }

    /// Closes the round: `params -= lr/k * acc` by the core's rule, `acc = 0`, queues the
    /// contributors' `Applied` events (one batch, expanded in id order) and a `ModelUpdated`
    /// with the mean of the losses counted, and moves the core to the next version.
    pub(crate) fn close<T: Scalar, S: Buffer<T>, M: Storage, X: Slot>(
        &mut self,
        core: &mut ServerCore<T, S, M, X>,
        acc: &mut [T],
        learning_rate: f64,
    ) {
        // Lengths were fixed at construction; a mismatch is impossible here.
        let (a, k) = (Self::rate(learning_rate, self.count), self.count);
        let _ = core.rule.apply_round(core.params.as_mut(), Cleared { acc, a, lr: learning_rate }, k);
        self.finish(core);
    }

    /// The update's factor `−lr/k` for `k` contributions (at least 1).
    fn rate<T: Scalar>(learning_rate: f64, k: usize) -> T {
        T::from_f64(-learning_rate / k.max(1) as f64)
    }

    /// [`Self::add`] of the round's last gradient fused with [`Self::close`]: one pass does
    /// `params += a · (acc + factor · values); acc = 0` by the core's rule (without one, the
    /// bits of the two calls, one pass over the accumulator fewer). `worker` is not in the
    /// round. On `Err` (a length mismatch) nothing changed.
    pub(crate) fn add_and_close<T: Scalar, S: Buffer<T>, M: Storage, X: Slot>(
        &mut self,
        core: &mut ServerCore<T, S, M, X>,
        worker: WorkerId,
        values: &Values<'_, T>,
        factor: T,
        acc: &mut [T],
        learning_rate: f64,
    ) -> Result<(), Reject> {
        let k = self.count + usize::from(!Self::contains(&core.roster, worker, core.version));
        let a = Self::rate(learning_rate, k);
        core.rule.apply_round(core.params.as_mut(), FoldedLast { acc, values, factor, a, lr: learning_rate }, k)?;
        self.record(&mut core.roster, core.version, worker, factor, &mut core.loss);
        self.finish(core);
        Ok(())
    }

    /// The bookkeeping of a close once the update is applied: events, stats, next version.
    fn finish<T, S, M: Storage, X: Slot>(&mut self, core: &mut ServerCore<T, S, M, X>) {
        let k = self.count.max(1);
        let (base, version) = (core.version, core.version.next());
        core.queue.push_batch(BatchKind::Applied { base, version, k: k as u32 });
        core.stats.applied += k as u64;
        core.stats.updates += 1;
        let mean_loss = core.loss.take_mean();
        core.queue.push(ServerItem::Event(ServerEvent::ModelUpdated { version, contributions: k as u32, mean_loss }));
        self.count = 0;
        core.version = version;
    }
}
