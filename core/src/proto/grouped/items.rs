//! The grouped servers' vocabulary: the partition, a member's record, and the output items
//! and batches queued before their payload is attached.

use crate::id::Version;
use crate::proto::common::table::{Slot, flag};
use crate::proto::{Recipient, ServerEvent};

/// The most groups one configuration may have.
pub const MAX_GROUPS: usize = 256;

// Group indices are stored as `u8`.
const _: () = assert!(MAX_GROUPS <= 256);

/// The validated partition: the number of groups and the size of each (each worker's group
/// is in its record).
#[derive(Clone, Debug)]
pub(super) struct Layout {
    pub(super) groups: u32,
    pub(super) size: [u32; MAX_GROUPS],
    /// Each group's lowest member id and one past its highest: a batch for a group's
    /// members looks at no record outside it.
    pub(super) span: [(u32, u32); MAX_GROUPS],
}

/// A grouped server worker's part of its record.
#[derive(Clone, Copy, Debug)]
pub struct GroupedSlot {
    /// The admission factor (1, or a clipping factor) of its gradient in its group's open
    /// step.
    pub(super) factor: f32,
    /// Its group.
    pub(super) group: u8,
}

impl Slot for GroupedSlot {
    const INIT: Self = Self { factor: 1.0, group: 0 };

    fn factor(&self) -> f32 {
        self.factor
    }

    fn set_factor(&mut self, factor: f32) {
        self.factor = factor;
    }
}

/// The record flag of a member that joined while its group had no model to give it.
pub(super) const WAITING: u8 = flag::PROTOCOL;

/// Capacity of a grouped server's output queue: a constant burst (per-member outputs are
/// batched) plus a stall report per group.
pub(super) const OUT_QUEUE: usize = 16 + MAX_GROUPS;

/// The most items one input can queue (a batch counts as one).
pub(super) const BURST: usize = 12;

/// A grouped server's output before its payload is attached.
#[derive(Clone, Copy, Debug)]
pub(super) enum Item {
    /// Group `group`'s current model.
    Model {
        group: u32,
        to: Recipient,
    },
    Stop,
    Event(ServerEvent),
    /// Expanded at poll time, one output per selected member, from worker `next` to `end`
    /// (the group's span).
    Batch {
        batch: Batch,
        next: u32,
        end: u32,
    },
}

/// Per-member outputs queued as one item (see [`Item::Batch`]).
#[derive(Clone, Copy, Debug)]
pub(super) enum Batch {
    /// `Applied` for every worker whose mark is `mark` (the members of a closed step).
    Applied { mark: u64, base: Version, version: Version, staleness: u64, weight: f64 },
    /// `Dropped(Aborted)` for every worker whose mark is `mark` (a dropped step).
    Aborted { mark: u64, base: Version },
    /// Group `group`'s model to its members (only those waiting for one if `waiting`);
    /// clears their waiting flag.
    Models { group: u32, waiting: bool },
}
