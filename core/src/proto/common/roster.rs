//! Per-worker bookkeeping shared by servers: membership, session epochs, deduplication.

use crate::error::{ConfigError, Reject};
use crate::id::{MAX_WORKERS, WorkerId, WorkerSet, first_seq};

/// Who the workers are, which session each is in, and the lowest sequence number each may
/// still send. Deduplication is a per-worker high-water mark: a sequence number at or
/// below the last accepted one is a duplicate or a replay (workers number their messages
/// with strictly increasing `seq` within an epoch; gaps from lost messages are fine).
#[derive(Clone, Debug)]
pub(crate) struct Roster {
    n: usize,
    epoch: [u32; MAX_WORKERS],
    next_seq: [u64; MAX_WORKERS],
    joined: WorkerSet,
    live: WorkerSet,
}

impl Roster {
    pub(crate) fn new(workers: u32) -> Result<Self, ConfigError> {
        let n = workers as usize;
        if n == 0 || n > MAX_WORKERS {
            return Err(ConfigError::WorkerCount(workers));
        }
        Ok(Self {
            n,
            epoch: [0; MAX_WORKERS],
            next_seq: [0; MAX_WORKERS],
            joined: WorkerSet::EMPTY,
            live: WorkerSet::first(n),
        })
    }

    /// The number of workers, `n`.
    pub(crate) fn n(&self) -> usize {
        self.n
    }

    /// Refuses ids outside `0..n`.
    pub(crate) fn check_member(&self, id: WorkerId) -> Result<usize, Reject> {
        let i = id.index();
        if i < self.n { Ok(i) } else { Err(Reject::UnknownWorker(id)) }
    }

    /// Checks a `Join`. `Ok(true)` for a first join or a new epoch (the caller then calls
    /// [`Self::commit_join`]), `Ok(false)` for a repeated join of the current session.
    pub(crate) fn check_join(&self, id: WorkerId, epoch: u32) -> Result<bool, Reject> {
        let i = self.check_member(id)?;
        let current = self.epoch.get(i).copied().unwrap_or(0);
        if self.joined.contains(id) {
            if epoch < current {
                Err(Reject::StaleEpoch { worker: id, epoch })
            } else {
                Ok(epoch > current || !self.live.contains(id))
            }
        } else {
            Ok(true)
        }
    }

    /// Records a join in `epoch`. A new epoch raises the worker's sequence high-water mark to
    /// the epoch's first number ([`first_seq`]), never lowering it, so messages of earlier
    /// sessions stay refused.
    pub(crate) fn commit_join(&mut self, id: WorkerId, epoch: u32) {
        let i = id.index();
        if let (Some(e), Some(s)) = (self.epoch.get_mut(i), self.next_seq.get_mut(i)) {
            *s = (*s).max(first_seq(epoch));
            *e = epoch;
        }
        self.joined.insert(id);
        self.live.insert(id);
    }

    /// Refuses a sequence number already used (duplicate or replay).
    pub(crate) fn check_seq(&self, id: WorkerId, seq: u64) -> Result<(), Reject> {
        let i = self.check_member(id)?;
        // CANARY (planted bug, test builds only): deduplication off, a replay is accepted.
        #[cfg(feature = "_canary")]
        if crate::canary::is_on(crate::canary::Canary::DedupOff) {
            return Ok(());
        }
        match self.next_seq.get(i) {
            // `u64::MAX` is never accepted: the high-water mark saturates there, so once used
            // it could not refuse its own replay.
            Some(next) if seq >= *next && seq != u64::MAX => Ok(()),
            _ => Err(Reject::Duplicate { worker: id, seq }),
        }
    }

    /// Marks `seq` used.
    pub(crate) fn commit_seq(&mut self, id: WorkerId, seq: u64) {
        if let Some(next) = self.next_seq.get_mut(id.index()) {
            *next = seq.saturating_add(1);
        }
        // A message from a worker proves it is there.
        if id.index() < self.n {
            self.live.insert(id);
        }
    }

    /// Marks a worker lost; returns whether it was live.
    pub(crate) fn lose(&mut self, id: WorkerId) -> bool {
        self.live.remove(id)
    }

    /// Workers not declared lost.
    pub(crate) fn live(&self) -> &WorkerSet {
        &self.live
    }

    /// Whether `id` is live.
    pub(crate) fn is_live(&self, id: WorkerId) -> bool {
        self.live.contains(id)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn dedup_and_epochs() {
        let mut r = Roster::new(2).unwrap();
        assert!(Roster::new(0).is_err());
        assert!(Roster::new(MAX_WORKERS as u32 + 1).is_err());
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
}
