//! Identifier newtypes: who a message is from, which model version it was computed on.

use core::fmt;
use serde::{Deserialize, Serialize};

/// The maximum number of workers one server tracks. Per-worker tables are fixed arrays of
/// this size, so a server's memory does not depend on its input.
pub const MAX_WORKERS: usize = 256;

/// A worker's index, `0..n`. The transport binds it to an authenticated session; it is
/// never read from a message body.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
pub struct WorkerId(pub u32);

/// A model version at a server: the number of global updates applied so far.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
pub struct Version(pub u64);

/// A token a worker hands out with each `Compute` request; the host passes it back with the
/// gradient so that a gradient for abandoned work is recognised and refused.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
pub struct ComputeId(pub u64);

/// The first sequence number of session `epoch`.
///
/// Sequence numbers are namespaced by session: a worker in epoch `e` numbers its messages
/// from `e · 2³²` up. Servers deduplicate with a per-worker high-water mark that a rejoin
/// raises to the new session's first number (never lowers), so a delayed or replayed message
/// of an earlier session can never be accepted again after the worker restarted.
pub const fn first_seq(epoch: u32) -> u64 {
    (epoch as u64) << 32
}

impl WorkerId {
    /// The id as a table index.
    pub const fn index(self) -> usize {
        self.0 as usize
    }
}

impl Version {
    /// The version before any update.
    pub const ZERO: Self = Self(0);

    /// The next version (saturating).
    pub const fn next(self) -> Self {
        Self(self.0.saturating_add(1))
    }

    /// How many versions `self` is behind `current` (zero if it is not behind).
    pub const fn lag_behind(self, current: Self) -> u64 {
        current.0.saturating_sub(self.0)
    }
}

impl fmt::Display for WorkerId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "worker {}", self.0)
    }
}

impl fmt::Display for Version {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "v{}", self.0)
    }
}

/// A fixed-size set of worker ids below [`MAX_WORKERS`].
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash)]
pub struct WorkerSet {
    bits: [u64; MAX_WORKERS / 64],
}

impl WorkerSet {
    /// The empty set.
    pub const EMPTY: Self = Self { bits: [0; MAX_WORKERS / 64] };

    /// The set `{0, .., n-1}` (capped at [`MAX_WORKERS`]).
    pub fn first(n: usize) -> Self {
        let mut set = Self::EMPTY;
        for i in 0..n.min(MAX_WORKERS) {
            set.insert(WorkerId(i as u32));
        }
        set
    }

    /// Adds `id`; returns `false` if it was already present or is out of range.
    pub fn insert(&mut self, id: WorkerId) -> bool {
        let (word, bit) = Self::locate(id);
        match self.bits.get_mut(word) {
            Some(w) if *w & bit == 0 => {
                *w |= bit;
                true
            }
            _ => false,
        }
    }

    /// Removes `id`; returns whether it was present.
    pub fn remove(&mut self, id: WorkerId) -> bool {
        let (word, bit) = Self::locate(id);
        match self.bits.get_mut(word) {
            Some(w) if *w & bit != 0 => {
                *w &= !bit;
                true
            }
            _ => false,
        }
    }

    /// Whether `id` is in the set.
    pub fn contains(&self, id: WorkerId) -> bool {
        let (word, bit) = Self::locate(id);
        self.bits.get(word).is_some_and(|w| w & bit != 0)
    }

    /// The number of ids in the set.
    pub fn len(&self) -> usize {
        self.bits.iter().map(|w| w.count_ones() as usize).sum()
    }

    /// Whether the set is empty.
    pub fn is_empty(&self) -> bool {
        self.bits.iter().all(|w| *w == 0)
    }

    /// Empties the set.
    pub fn clear(&mut self) {
        self.bits = [0; MAX_WORKERS / 64];
    }

    /// The ids in increasing order.
    pub fn iter(&self) -> impl Iterator<Item = WorkerId> + '_ {
        (0..MAX_WORKERS as u32).map(WorkerId).filter(move |id| self.contains(*id))
    }

    /// The smallest id of `{0..n-1}` not in the set, if any.
    pub fn first_missing(&self, n: usize) -> Option<WorkerId> {
        (0..n.min(MAX_WORKERS) as u32).map(WorkerId).find(|id| !self.contains(*id))
    }

    fn locate(id: WorkerId) -> (usize, u64) {
        let i = id.index();
        (i / 64, 1u64 << (i % 64))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn worker_set_ops() {
        let mut s = WorkerSet::EMPTY;
        assert!(s.insert(WorkerId(3)));
        assert!(!s.insert(WorkerId(3)));
        assert!(!s.insert(WorkerId(MAX_WORKERS as u32)));
        assert!(!s.insert(WorkerId(u32::MAX)));
        assert!(s.contains(WorkerId(3)));
        assert!(!s.contains(WorkerId(u32::MAX)));
        assert_eq!(s.len(), 1);
        assert_eq!(s.first_missing(5), Some(WorkerId(0)));
        assert_eq!(WorkerSet::first(4).first_missing(4), None);
        assert!(s.remove(WorkerId(3)));
        assert!(s.is_empty());
        assert_eq!(WorkerSet::first(3).iter().count(), 3);
    }
}
