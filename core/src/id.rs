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

/// A fixed-size set of worker ids below [`MAX_WORKERS`]: a bitmap plus a count, so
/// [`Self::len`] is O(1) and iteration skips empty words.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash)]
pub struct WorkerSet {
    bits: [u64; WORDS],
    /// The number of set bits (always `Σ bits.count_ones()`).
    count: u16,
}

/// 64-bit words of a [`WorkerSet`].
const WORDS: usize = MAX_WORKERS / 64;

impl WorkerSet {
    /// The empty set.
    pub const EMPTY: Self = Self { bits: [0; WORDS], count: 0 };

    /// The set `{0, .., n-1}` (capped at [`MAX_WORKERS`]).
    pub fn first(n: usize) -> Self {
        let n = n.min(MAX_WORKERS);
        let mut set = Self::EMPTY;
        for (i, w) in set.bits.iter_mut().enumerate() {
            let below = n.saturating_sub(i * 64);
            *w = if below >= 64 { u64::MAX } else { (1u64 << below) - 1 };
        }
        set.count = n as u16;
        set
    }

    /// Adds `id`; returns `false` if it was already present or is out of range.
    pub fn insert(&mut self, id: WorkerId) -> bool {
        let (word, bit) = Self::locate(id);
        match self.bits.get_mut(word) {
            Some(w) if *w & bit == 0 => {
                *w |= bit;
                self.count += 1;
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
                self.count -= 1;
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
        usize::from(self.count)
    }

    /// Whether the set is empty.
    pub fn is_empty(&self) -> bool {
        self.count == 0
    }

    /// Empties the set.
    pub fn clear(&mut self) {
        *self = Self::EMPTY;
    }

    /// The ids in increasing order.
    pub fn iter(&self) -> impl Iterator<Item = WorkerId> + '_ {
        Iter { bits: self.bits, word: 0 }
    }

    /// The smallest id of `{0..n-1}` not in the set, if any.
    pub fn first_missing(&self, n: usize) -> Option<WorkerId> {
        let n = n.min(MAX_WORKERS);
        self.bits
            .iter()
            .enumerate()
            .find_map(|(i, w)| {
                let id = i * 64 + (!w).trailing_zeros() as usize;
                (w != &u64::MAX).then_some(id)
            })
            .filter(|id| *id < n)
            .map(|id| WorkerId(id as u32))
    }

    fn locate(id: WorkerId) -> (usize, u64) {
        let i = id.index();
        (i / 64, 1u64 << (i % 64))
    }
}

/// Iterator over a [`WorkerSet`]'s ids: one `trailing_zeros` per id, empty words skipped.
struct Iter {
    bits: [u64; WORDS],
    word: usize,
}

impl Iterator for Iter {
    type Item = WorkerId;

    fn next(&mut self) -> Option<WorkerId> {
        loop {
            let w = self.bits.get_mut(self.word)?;
            if *w != 0 {
                let bit = w.trailing_zeros();
                *w &= *w - 1;
                return Some(WorkerId((self.word * 64) as u32 + bit));
            }
            self.word += 1;
        }
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
        assert_eq!(WorkerSet::first(0), WorkerSet::EMPTY);
        assert_eq!(WorkerSet::first(usize::MAX).len(), MAX_WORKERS);
        assert_eq!(WorkerSet::first(MAX_WORKERS).first_missing(usize::MAX), None);
    }

    proptest::proptest! {
        // The bitmap-and-count set behaves like a plain set of ids.
        #[test]
        fn worker_set_matches_a_reference_set(
            ops in proptest::collection::vec((0u32..300, proptest::bool::ANY), 0..200),
            first in 0usize..300,
            n in 0usize..300,
        ) {
            let mut s = WorkerSet::first(first);
            let mut reference: std::collections::BTreeSet<u32> = (0..first.min(MAX_WORKERS) as u32).collect();
            for (id, add) in ops {
                let in_range = (id as usize) < MAX_WORKERS;
                if add {
                    proptest::prop_assert_eq!(s.insert(WorkerId(id)), in_range && reference.insert(id));
                } else {
                    proptest::prop_assert_eq!(s.remove(WorkerId(id)), reference.remove(&id));
                }
                proptest::prop_assert_eq!(s.len(), reference.len());
                proptest::prop_assert_eq!(s.is_empty(), reference.is_empty());
            }
            let ids: std::vec::Vec<u32> = s.iter().map(|w| w.0).collect();
            proptest::prop_assert_eq!(ids, reference.iter().copied().collect::<std::vec::Vec<_>>());
            let missing = (0..n.min(MAX_WORKERS) as u32).find(|i| !reference.contains(i)).map(WorkerId);
            proptest::prop_assert_eq!(s.first_missing(n), missing);
            for id in 0..300u32 {
                proptest::prop_assert_eq!(s.contains(WorkerId(id)), reference.contains(&id));
            }
        }
    }
}
