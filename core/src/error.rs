//! Typed refusals. A `handle_*` call that returns `Err` changed nothing.

use crate::id::{Version, WorkerId};
use core::fmt;

/// Why an input was refused. The state machine's state is unchanged after a refusal; the
/// caller may log it, count it, or disconnect the peer.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub enum Reject {
    /// The sender's id is not in `0..n`.
    UnknownWorker(WorkerId),
    /// A tensor had the wrong number of elements.
    WrongLength(LengthMismatch),
    /// A tensor contained NaN or ±∞.
    NotFinite,
    /// A contribution reported a minibatch loss that is NaN or ±∞.
    LossNotFinite,
    /// A gradient's norm exceeded the configured bound and the policy is to refuse.
    NormTooLarge,
    /// The same contribution was already received (same worker, round and sequence).
    Duplicate {
        /// The sender.
        worker: WorkerId,
        /// The sequence number it sent.
        seq: u64,
    },
    /// A message from an earlier session of a worker that has since rejoined.
    StaleEpoch {
        /// The sender.
        worker: WorkerId,
        /// The epoch it sent.
        epoch: u32,
    },
    /// A message refers to a version the server has not produced yet.
    FutureVersion {
        /// The version the message claimed.
        claimed: Version,
        /// The server's current version.
        current: Version,
    },
    /// The message kind is not part of this protocol, or not valid in the current phase.
    Unexpected {
        /// The message kind's name.
        kind: &'static str,
    },
    /// The worker has not joined (or has left) and may not send this.
    NotJoined(WorkerId),
    /// A gradient was handed to a worker that did not ask for one, or for an abandoned job.
    NoSuchComputation,
    /// A fixed-capacity table or queue is full; the input was not taken.
    Capacity,
    /// A worker received a model older than the one it already has.
    OutdatedModel {
        /// The version received.
        received: Version,
        /// The version the worker has.
        have: Version,
    },
    /// The state machine has stopped and takes no more input.
    Stopped,
    /// A message from an upstream server reached a server that has none
    /// ([`Server::has_upstream`](crate::proto::Server::has_upstream) is false).
    NoUpstream,
}

/// Why a configuration was refused at construction.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub enum ConfigError {
    /// `workers` must be in `1..=MAX_WORKERS`.
    WorkerCount(u32),
    /// The learning rate must be finite and positive.
    LearningRate,
    /// The model must have at least one parameter.
    EmptyModel,
    /// The scratch buffer is shorter than the protocol needs.
    ScratchTooSmall {
        /// Elements needed.
        needed: usize,
        /// Elements given.
        given: usize,
    },
    /// A protocol knob is out of range; the name says which.
    Knob(&'static str),
    /// The per-worker table the caller's [`Storage`](crate::proto::common::table::Storage)
    /// can hold is smaller than `n` (an `Inline<N>` with `N < n`, or a failed allocation,
    /// reported with capacity 0).
    TableTooSmall {
        /// Records needed (`n`).
        needed: usize,
        /// Records the storage holds.
        capacity: usize,
    },
    /// A sub-server was asked of a protocol that runs as one server only
    /// ([`ProtocolConfig::tiers`](crate::proto::ProtocolConfig::tiers) is `None`).
    NoSubservers,
    /// A model of `dim` elements does not split into `shards` slices of at least one
    /// element each (or a sharded worker's inner workers do not match that split).
    ShardLayout {
        /// The model's length.
        dim: usize,
        /// The number of shards.
        shards: u32,
    },
    /// The server's update rule cannot run under the protocol (the
    /// [`Rule::Mean`](crate::proto::Rule::Mean) relay needs every update to be one round's
    /// mean gradient: BSP, static backup workers or DBW).
    RuleUnsupported {
        /// The rule's name ([`Optimizer::rule_name`](crate::proto::Optimizer::rule_name)).
        rule: &'static str,
        /// The protocol's name ([`ProtocolKind::as_str`](crate::proto::ProtocolKind::as_str)).
        protocol: &'static str,
    },
}

impl fmt::Display for ConfigError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Self::WorkerCount(n) => write!(f, "worker count {n} is outside 1..={}", crate::id::MAX_WORKERS),
            Self::LearningRate => f.write_str("learning rate must be finite and positive"),
            Self::EmptyModel => f.write_str("the model has no parameters"),
            Self::ScratchTooSmall { needed, given } => {
                write!(f, "scratch buffer has {given} elements, the protocol needs {needed}")
            }
            Self::Knob(name) => write!(f, "protocol setting `{name}` is out of range"),
            Self::TableTooSmall { needed, capacity: 0 } => {
                write!(f, "could not allocate the per-worker table for {needed} workers")
            }
            Self::TableTooSmall { needed, capacity } => {
                write!(f, "the per-worker table holds {capacity} workers, the run has {needed}")
            }
            Self::NoSubservers => f.write_str("the protocol runs as one server only: it has no sub-servers"),
            Self::ShardLayout { dim, shards } => {
                write!(f, "a model of {dim} elements does not split into {shards} shards of at least one element each")
            }
            Self::RuleUnsupported { rule, protocol } => write!(
                f,
                "update rule `{rule}` does not run under protocol `{protocol}`: it relays one round's mean \
                 gradient, and only bsp, backup and dbw make each update one round's mean"
            ),
        }
    }
}

impl core::error::Error for ConfigError {}

impl fmt::Display for Reject {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Self::UnknownWorker(w) => write!(f, "unknown {w}"),
            Self::WrongLength(m) => write!(f, "{m}"),
            Self::NotFinite => f.write_str("tensor contains NaN or infinity"),
            Self::LossNotFinite => f.write_str("reported loss is NaN or infinity"),
            Self::NormTooLarge => f.write_str("gradient norm above the configured bound"),
            Self::Duplicate { worker, seq } => write!(f, "duplicate message seq {seq} from {worker}"),
            Self::StaleEpoch { worker, epoch } => write!(f, "stale epoch {epoch} from {worker}"),
            Self::FutureVersion { claimed, current } => {
                write!(f, "message claims {claimed}, server is at {current}")
            }
            Self::Unexpected { kind } => write!(f, "unexpected {kind} message"),
            Self::NotJoined(w) => write!(f, "{w} has not joined"),
            Self::NoSuchComputation => {
                f.write_str("gradient for a computation that was not requested or was abandoned")
            }
            Self::Capacity => f.write_str("fixed capacity exhausted"),
            Self::OutdatedModel { received, have } => write!(f, "received model {received}, already have {have}"),
            Self::Stopped => f.write_str("stopped"),
            Self::NoUpstream => f.write_str("this server has no upstream server"),
        }
    }
}

impl core::error::Error for Reject {}

impl Reject {
    /// The name of the refusal's kind (its variant), the same for every refusal of that
    /// kind: `"Duplicate"`, `"OutdatedModel"`, …
    pub const fn kind_name(&self) -> &'static str {
        match self {
            Self::UnknownWorker(_) => "UnknownWorker",
            Self::WrongLength(_) => "WrongLength",
            Self::NotFinite => "NotFinite",
            Self::NormTooLarge => "NormTooLarge",
            Self::Duplicate { .. } => "Duplicate",
            Self::StaleEpoch { .. } => "StaleEpoch",
            Self::FutureVersion { .. } => "FutureVersion",
            Self::Unexpected { .. } => "Unexpected",
            Self::NotJoined(_) => "NotJoined",
            Self::NoSuchComputation => "NoSuchComputation",
            Self::Capacity => "Capacity",
            Self::OutdatedModel { .. } => "OutdatedModel",
            Self::Stopped => "Stopped",
            Self::NoUpstream => "NoUpstream",
            Self::LossNotFinite => "LossNotFinite",
        }
    }

    /// A bit of its own for each kind.
    const fn kind_bit(&self) -> u32 {
        1 << match self {
            Self::UnknownWorker(_) => 0,
            Self::WrongLength(_) => 1,
            Self::NotFinite => 2,
            Self::NormTooLarge => 3,
            Self::Duplicate { .. } => 4,
            Self::StaleEpoch { .. } => 5,
            Self::FutureVersion { .. } => 6,
            Self::Unexpected { .. } => 7,
            Self::NotJoined(_) => 8,
            Self::NoSuchComputation => 9,
            Self::Capacity => 10,
            Self::OutdatedModel { .. } => 11,
            Self::Stopped => 12,
            Self::NoUpstream => 13,
            Self::LossNotFinite => 14,
        }
    }
}

/// The refusals a driver met while feeding a state machine: how many, and which kinds it
/// has seen, so that it logs the first refusal of each kind and counts the rest (a refusal
/// is never dropped silently).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Refusals {
    total: u64,
    seen: u32,
}

impl Refusals {
    /// Counts `reject`; true if it is the first of its kind (the one to log).
    pub fn record(&mut self, reject: &Reject) -> bool {
        self.total = self.total.saturating_add(1);
        let bit = reject.kind_bit();
        let first = self.seen & bit == 0;
        self.seen |= bit;
        first
    }

    /// Refusals counted.
    pub const fn total(&self) -> u64 {
        self.total
    }
}

impl From<LengthMismatch> for Reject {
    fn from(m: LengthMismatch) -> Self {
        Self::WrongLength(m)
    }
}

/// Two slices that must have the same length did not.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct LengthMismatch {
    /// The length the operation expected (the destination's).
    pub expected: usize,
    /// The length it got.
    pub actual: usize,
}

impl fmt::Display for LengthMismatch {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "length mismatch: expected {} elements, got {}", self.expected, self.actual)
    }
}

impl core::error::Error for LengthMismatch {}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn refusals_count_all_and_flag_the_first_of_each_kind() {
        let mut r = Refusals::default();
        assert!(r.record(&Reject::NoSuchComputation));
        assert!(!r.record(&Reject::NoSuchComputation));
        let outdated = Reject::OutdatedModel { received: Version(1), have: Version(2) };
        assert!(r.record(&outdated));
        assert!(!r.record(&Reject::OutdatedModel { received: Version(0), have: Version(5) }));
        assert_eq!(r.total(), 4);
        assert_eq!(outdated.kind_name(), "OutdatedModel");
    }
}
