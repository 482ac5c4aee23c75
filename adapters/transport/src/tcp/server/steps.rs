//! Step times: what each worker's current session sent (as `"STEP"` messages, see
//! [`step_times`](crate::tcp::step_times)) for its next contribution, paired with that
//! contribution when it arrives. Times without a contribution are dropped when the session
//! ends.

use crate::tcp::step_times::MAX_STEPS;
use syncopate::WorkerId;

/// Per worker, the step times sent since its last contribution (at most [`MAX_STEPS`], the
/// newest kept).
#[derive(Debug)]
pub(super) struct PendingSteps(Vec<Vec<f32>>);

impl PendingSteps {
    /// None yet, for `n` workers.
    pub(super) fn new(n: usize) -> Self {
        Self(vec![Vec::new(); n])
    }

    /// Adds `seconds` from `worker`.
    pub(super) fn add(&mut self, worker: WorkerId, seconds: &[f32]) {
        if let Some(pending) = self.0.get_mut(worker.index()) {
            pending.extend_from_slice(seconds);
            let excess = pending.len().saturating_sub(MAX_STEPS);
            pending.drain(..excess);
        }
    }

    /// The times that go with `worker`'s contribution now arriving.
    pub(super) fn of(&self, worker: WorkerId) -> &[f32] {
        self.0.get(worker.index()).map_or(&[][..], Vec::as_slice)
    }

    /// Forgets `worker`'s times (paired, or its session ended).
    pub(super) fn clear(&mut self, worker: WorkerId) {
        if let Some(pending) = self.0.get_mut(worker.index()) {
            pending.clear();
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn times_gather_per_worker_up_to_the_newest_max_and_clear() {
        let mut p = PendingSteps::new(2);
        p.add(WorkerId(1), &[1.0, 2.0]);
        p.add(WorkerId(1), &[3.0]);
        p.add(WorkerId(5), &[9.0]);
        assert_eq!(p.of(WorkerId(1)), [1.0, 2.0, 3.0]);
        assert!(p.of(WorkerId(0)).is_empty() && p.of(WorkerId(5)).is_empty());
        p.add(WorkerId(0), &vec![0.5; MAX_STEPS]);
        p.add(WorkerId(0), &[7.0]);
        assert_eq!(p.of(WorkerId(0)).len(), MAX_STEPS);
        assert_eq!(p.of(WorkerId(0)).last(), Some(&7.0));
        p.clear(WorkerId(1));
        assert!(p.of(WorkerId(1)).is_empty());
    }
}
