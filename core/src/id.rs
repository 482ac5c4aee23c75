//! Identifier newtypes: who a message is from, which model version it was computed on.

use core::fmt;
use serde::{Deserialize, Serialize};

/// The most workers one server takes. Per-worker state lives in a table of `n` records whose
/// storage the caller chooses (`proto::Storage`: inline with a fixed capacity, or on the
/// heap with the `alloc` feature), so a server's memory is `n` records plus a constant.
pub const MAX_WORKERS: usize = 65_535;

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
