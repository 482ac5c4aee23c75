//! What a protocol's [`Rules`](super::engine::Rules) receive for each kind of message: the
//! time, the sender and the message's fields, after the engine screened the message (room
//! for its outputs, a member sender, a finite loss) and dispatched it by kind. A gradient's
//! values stay by reference where the caller put them, never copied.

use crate::id::{Version, WorkerId};
use crate::msg::Values;
use crate::time::Instant;

/// A `Join`: `from` starts (or repeats) session `epoch`.
#[derive(Clone, Copy, Debug)]
pub struct Join {
    /// When it arrived.
    pub now: Instant,
    /// The sender.
    pub from: WorkerId,
    /// The session it joins with.
    pub epoch: u32,
}

/// A `Grad`: a gradient computed on model `base` for `iteration`.
#[derive(Clone, Copy, Debug)]
pub struct Grad<'a, 'v, T> {
    /// When it arrived.
    pub now: Instant,
    /// The sender.
    pub from: WorkerId,
    /// The model version it was computed on.
    pub base: Version,
    /// The iteration it is for (BAP's; the others read `base`).
    pub iteration: u64,
    /// Its sequence number.
    pub seq: u64,
    /// The gradient.
    pub values: &'a Values<'v, T>,
}

/// A `Delta`: a model change after `local_steps` steps from the model of `round`.
#[derive(Clone, Copy, Debug)]
pub struct Delta<'a, 'v, T> {
    /// When it arrived.
    pub now: Instant,
    /// The sender.
    pub from: WorkerId,
    /// The round (model version) it started from.
    pub round: Version,
    /// Local steps it sums.
    pub local_steps: u32,
    /// Its sequence number.
    pub seq: u64,
    /// The change.
    pub values: &'a Values<'v, T>,
}

/// A `Clock`: the update that completes the sender's clock `clock`.
#[derive(Clone, Copy, Debug)]
pub struct Clock<'a, 'v, T> {
    /// When it arrived.
    pub now: Instant,
    /// The sender.
    pub from: WorkerId,
    /// The clock it completes.
    pub clock: u64,
    /// Its sequence number.
    pub seq: u64,
    /// The update.
    pub values: &'a Values<'v, T>,
}

/// A `Pull`: the sender has model `have` and waits for one of clock `min_clock` or later.
#[derive(Clone, Copy, Debug)]
pub struct Pull {
    /// When it arrived.
    pub now: Instant,
    /// The sender.
    pub from: WorkerId,
    /// The version it has.
    pub have: Version,
    /// The clock (SSP) or iteration (BAP) it needs; 0 for any newer model.
    pub min_clock: u64,
}
