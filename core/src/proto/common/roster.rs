//! Per-worker bookkeeping shared by servers: membership, session epochs, deduplication and
//! liveness, kept in the caller-sized table of [`WorkerRecord`]s that also holds each
//! protocol's own per-worker state.

use super::table::{Storage, WorkerRecord, flag};
use crate::error::{ConfigError, Reject};
use crate::id::{MAX_WORKERS, Version, WorkerId, first_seq};
use crate::time::Instant;
use core::fmt::Debug;

/// The mark of the round open while the model is at `version`: a worker is in it when its
/// record's mark equals this. Moving to the next version empties the round without touching
/// the records.
pub(crate) const fn mark_of(version: Version) -> u64 {
    version.0.saturating_add(1)
}

/// Who the workers are, which session each is in, and the lowest sequence number each may
/// still send. Deduplication is a per-worker high-water mark: a sequence number at or
/// below the last accepted one is a duplicate or a replay (workers number their messages
/// with strictly increasing `seq` within an epoch; gaps from lost messages are fine).
///
/// A loss is never refused for want of output room: one reported while a batch is being
/// expanded is recorded in the worker's record ([`flag::LOSS_PENDING`], see
/// [`Self::defer_loss`]) and applied by the server once its outputs have drained, so a
/// driver that reports several losses back to back loses none of them.
#[derive(Debug)]
pub(crate) struct Roster<M: Storage, X: Copy + Debug> {
    records: M::Table<WorkerRecord<X>>,
    /// Workers whose [`flag::LIVE`] bit is set.
    live: usize,
    /// Workers whose [`flag::LOSS_PENDING`] bit is set.
    pending_losses: usize,
    /// When the latest of the pending losses was reported.
    reported_at: Instant,
}

impl<M: Storage, X: Copy + Debug> Roster<M, X> {
    /// `workers` records, each with the protocol part `ext`.
    pub(crate) fn new(workers: u32, ext: X) -> Result<Self, ConfigError> {
        let n = workers as usize;
        if n == 0 || n > MAX_WORKERS {
            return Err(ConfigError::WorkerCount(workers));
        }
        Ok(Self {
            records: M::table(n, WorkerRecord::new(ext))?,
            live: n,
            pending_losses: 0,
            reported_at: Instant::ZERO,
        })
    }

    /// The number of workers, `n`.
    pub(crate) fn n(&self) -> usize {
        self.records.as_ref().len()
    }

    /// Every worker's record, in id order.
    pub(crate) fn records(&self) -> &[WorkerRecord<X>] {
        self.records.as_ref()
    }

    /// Every worker's record, in id order, for changes that keep the live count (the
    /// [`flag::LIVE`] bit is the roster's: see [`Self::lose`], [`Self::commit_join`]).
    pub(crate) fn records_mut(&mut self) -> &mut [WorkerRecord<X>] {
        self.records.as_mut()
    }

    /// `id`'s record.
    pub(crate) fn record(&self, id: WorkerId) -> Option<&WorkerRecord<X>> {
        self.records.as_ref().get(id.index())
    }

    /// Whether `id` contributed to the round open while the model is at `version` (its
    /// record's mark is [`mark_of`] that version).
    pub(crate) fn in_round(&self, id: WorkerId, version: Version) -> bool {
        self.record(id).is_some_and(|r| r.mark == mark_of(version))
    }

    /// `id`'s record, mutable.
    pub(crate) fn record_mut(&mut self, id: WorkerId) -> Option<&mut WorkerRecord<X>> {
        self.records.as_mut().get_mut(id.index())
    }

    /// `id`'s protocol part.
    pub(crate) fn ext(&self, id: WorkerId) -> Option<&X> {
        self.record(id).map(|r| &r.ext)
    }

    /// `id`'s protocol part, mutable.
    pub(crate) fn ext_mut(&mut self, id: WorkerId) -> Option<&mut X> {
        self.record_mut(id).map(|r| &mut r.ext)
    }

    /// Refuses ids outside `0..n`.
    pub(crate) fn check_member(&self, id: WorkerId) -> Result<usize, Reject> {
        let i = id.index();
        if i < self.n() { Ok(i) } else { Err(Reject::UnknownWorker(id)) }
    }

    /// Checks a `Join`. `Ok(true)` for a first join or a new epoch (the caller then calls
    /// [`Self::commit_join`]), `Ok(false)` for a repeated join of the current session.
    pub(crate) fn check_join(&self, id: WorkerId, epoch: u32) -> Result<bool, Reject> {
        let r = self.record(id).ok_or(Reject::UnknownWorker(id))?;
        if r.has(flag::JOINED) {
            if epoch < r.epoch {
                Err(Reject::StaleEpoch { worker: id, epoch })
            } else {
                Ok(epoch > r.epoch || !r.has(flag::LIVE))
            }
        } else {
            Ok(true)
        }
    }

    /// Records a join in `epoch`. A new epoch raises the worker's sequence high-water mark to
    /// the epoch's first number ([`first_seq`]), never lowering it, so messages of earlier
    /// sessions stay refused.
    pub(crate) fn commit_join(&mut self, id: WorkerId, epoch: u32) {
        if let Some(r) = self.records.as_mut().get_mut(id.index()) {
            r.next_seq = r.next_seq.max(first_seq(epoch));
            r.epoch = epoch;
            r.set(flag::JOINED, true);
            if !r.has(flag::LIVE) {
                r.set(flag::LIVE, true);
                self.live += 1;
            }
        }
    }

    /// Refuses a sequence number already used (duplicate or replay).
    pub(crate) fn check_seq(&self, id: WorkerId, seq: u64) -> Result<(), Reject> {
        let r = self.record(id).ok_or(Reject::UnknownWorker(id))?;
        // CANARY (planted bug, test builds only): deduplication off, a replay is accepted.
        #[cfg(feature = "_canary")]
        if crate::canary::is_on(crate::canary::Canary::DedupOff) {
            return Ok(());
        }
        // `u64::MAX` is never accepted: the high-water mark saturates there, so once used
        // it could not refuse its own replay.
        if seq >= r.next_seq && seq != u64::MAX { Ok(()) } else { Err(Reject::Duplicate { worker: id, seq }) }
    }

    /// Marks `seq` used. A message from a worker proves it is there: it is live again.
    pub(crate) fn commit_seq(&mut self, id: WorkerId, seq: u64) {
        if let Some(r) = self.records.as_mut().get_mut(id.index()) {
            r.next_seq = seq.saturating_add(1);
            if !r.has(flag::LIVE) {
                r.set(flag::LIVE, true);
                self.live += 1;
            }
        }
    }

    /// Marks a worker lost; returns whether it was live.
    pub(crate) fn lose(&mut self, id: WorkerId) -> bool {
        match self.records.as_mut().get_mut(id.index()) {
            Some(r) if r.has(flag::LIVE) => {
                r.set(flag::LIVE, false);
                self.live -= 1;
                true
            }
            _ => false,
        }
    }

    /// Records that `id` was reported lost at `now` while the server could not act on it;
    /// a second report of the same pending loss is one loss. Returns whether `id` is a
    /// member.
    pub(crate) fn defer_loss(&mut self, id: WorkerId, now: Instant) -> bool {
        let Some(r) = self.records.as_mut().get_mut(id.index()) else {
            return false;
        };
        if !r.has(flag::LOSS_PENDING) {
            r.set(flag::LOSS_PENDING, true);
            self.pending_losses += 1;
        }
        self.reported_at = self.reported_at.max(now);
        true
    }

    /// How many losses wait to be applied.
    #[inline]
    pub(crate) fn pending_losses(&self) -> usize {
        self.pending_losses
    }

    /// Takes the pending loss of the lowest worker id, with the time the latest pending loss
    /// was reported.
    pub(crate) fn take_pending_loss(&mut self) -> Option<(WorkerId, Instant)> {
        if self.pending_losses == 0 {
            return None;
        }
        let (i, r) = self.records.as_mut().iter_mut().enumerate().find(|(_, r)| r.has(flag::LOSS_PENDING))?;
        r.set(flag::LOSS_PENDING, false);
        self.pending_losses -= 1;
        Some((WorkerId(i as u32), self.reported_at))
    }

    /// Whether `id` is live.
    pub(crate) fn is_live(&self, id: WorkerId) -> bool {
        self.record(id).is_some_and(|r| r.has(flag::LIVE))
    }

    /// How many workers are live.
    pub(crate) fn live_count(&self) -> usize {
        self.live
    }

    /// The live workers, in id order.
    pub(crate) fn live(&self) -> impl Iterator<Item = (WorkerId, &WorkerRecord<X>)> + '_ {
        self.records
            .as_ref()
            .iter()
            .enumerate()
            .filter(|(_, r)| r.has(flag::LIVE))
            .map(|(i, r)| (WorkerId(i as u32), r))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::proto::common::table::Inline;

    #[test]
    fn dedup_and_epochs() {
        let mut r = Roster::<Inline<4>, ()>::new(2, ()).unwrap();
        assert!(Roster::<Inline<4>, ()>::new(0, ()).is_err());
        assert_eq!(
            Roster::<Inline<4>, ()>::new(5, ()).err(),
            Some(ConfigError::TableTooSmall { needed: 5, capacity: 4 })
        );
        assert!(Roster::<Inline<4>, ()>::new(MAX_WORKERS as u32 + 1, ()).is_err());
        assert_eq!(r.check_member(WorkerId(2)), Err(Reject::UnknownWorker(WorkerId(2))));
        assert_eq!(r.check_join(WorkerId(0), 1), Ok(true));
        r.commit_join(WorkerId(0), 1);
        assert_eq!(r.check_join(WorkerId(0), 1), Ok(false));
        assert!(r.check_join(WorkerId(0), 0).is_err());
        let base = first_seq(1);
        assert!(r.check_seq(WorkerId(0), 0).is_err(), "epoch 1 numbers from first_seq(1)");
        r.check_seq(WorkerId(0), base).unwrap();
        r.commit_seq(WorkerId(0), base);
        assert!(r.check_seq(WorkerId(0), base).is_err());
        r.check_seq(WorkerId(0), base + 5).unwrap();
        r.commit_seq(WorkerId(0), base + 5);
        r.commit_join(WorkerId(0), 2);
        // A message of the old session (a replay, or a delayed one) is refused after the
        // rejoin; the new session numbers from first_seq(2).
        assert!(r.check_seq(WorkerId(0), 5).is_err());
        assert!(r.check_seq(WorkerId(0), first_seq(2) - 1).is_err());
        r.check_seq(WorkerId(0), first_seq(2)).unwrap();
        // The last number is reserved: accepting it would make its replay indistinguishable.
        assert!(r.check_seq(WorkerId(0), u64::MAX).is_err());
    }

    #[test]
    fn deferred_losses_are_taken_once_each_in_id_order() {
        let mut r = Roster::<Inline<4>, ()>::new(3, ()).unwrap();
        assert!(r.defer_loss(WorkerId(2), Instant::from_nanos(5)));
        assert!(r.defer_loss(WorkerId(0), Instant::from_nanos(3)));
        assert!(r.defer_loss(WorkerId(2), Instant::from_nanos(4)));
        assert!(!r.defer_loss(WorkerId(3), Instant::from_nanos(9)));
        assert_eq!(r.pending_losses(), 2);
        assert_eq!(r.take_pending_loss(), Some((WorkerId(0), Instant::from_nanos(5))));
        assert_eq!(r.take_pending_loss(), Some((WorkerId(2), Instant::from_nanos(5))));
        assert_eq!(r.take_pending_loss(), None);
        assert_eq!(r.pending_losses(), 0);
    }

    #[test]
    fn the_live_count_follows_losses_and_returns() {
        let mut r = Roster::<Inline<4>, ()>::new(3, ()).unwrap();
        assert_eq!(r.live_count(), 3);
        assert!(r.lose(WorkerId(1)));
        assert!(!r.lose(WorkerId(1)));
        assert!(!r.lose(WorkerId(9)));
        assert_eq!(r.live_count(), 2);
        assert_eq!(r.live().map(|(w, _)| w.0).collect::<std::vec::Vec<_>>(), [0, 2]);
        r.commit_seq(WorkerId(1), first_seq(1));
        assert_eq!(r.live_count(), 3);
        assert!(r.lose(WorkerId(2)));
        r.commit_join(WorkerId(2), 1);
        assert_eq!(r.live_count(), 3);
    }
}
