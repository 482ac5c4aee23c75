//! Caller-sized storage for a server's per-worker state: one [`WorkerRecord`] per worker,
//! kept in a table whose kind the caller picks with a [`Storage`] type, sized for the run's
//! `n` when the server is built.
//!
//! - [`Inline<N>`]: a fixed-capacity table inside the server (no allocation, for
//!   microcontrollers and C callers), refusing `n > N` with
//!   [`ConfigError::TableTooSmall`](crate::ConfigError::TableTooSmall). The default of every
//!   server type is [`Inline<DEFAULT_INLINE_WORKERS>`].
//! - `Heap` (feature `alloc`): a `Vec` of exactly `n` records, for std users and for large
//!   `n` (up to [`MAX_WORKERS`](crate::MAX_WORKERS)).
//!
//! Server state beside the caller's model buffers is then `n` records plus a constant
//! (the output queue's depth does not depend on `n`: a round's per-worker outputs are one
//! queued item, expanded when polled).
//! [`ProtocolConfig::per_worker_bytes`](crate::ProtocolConfig::per_worker_bytes) gives a
//! protocol's record size.

#[cfg(any(feature = "alloc", test))]
pub use crate::storage::Heap;
pub use crate::storage::{DEFAULT_INLINE_WORKERS, Inline, Storage};
use core::fmt::Debug;

/// A protocol's own part of a [`WorkerRecord`].
pub trait Slot: Copy + Debug {
    /// A worker's part before anything happened.
    const INIT: Self;

    /// The clipping factor of the worker's gradient in the open round (1 if the protocol
    /// keeps none).
    fn factor(&self) -> f32 {
        1.0
    }

    /// Records the clipping factor of the worker's gradient in the open round (protocols
    /// with rounds keep it for the round's `Applied` events).
    fn set_factor(&mut self, factor: f32) {
        let _ = factor;
    }
}

impl Slot for () {
    const INIT: Self = ();
}

/// The part of a round-based protocol's record: the clipping factor of the worker's
/// gradient in the open round.
#[derive(Clone, Copy, Debug)]
pub struct RoundSlot {
    factor: f32,
}

impl Slot for RoundSlot {
    const INIT: Self = Self { factor: 1.0 };

    fn factor(&self) -> f32 {
        self.factor
    }

    fn set_factor(&mut self, factor: f32) {
        self.factor = factor;
    }
}

/// Flag bits of a [`WorkerRecord`].
pub(crate) mod flag {
    /// The worker joined at least once.
    pub(crate) const JOINED: u8 = 1;
    /// The worker was not declared lost since it last joined or sent.
    pub(crate) const LIVE: u8 = 2;
    /// The worker was reported lost while the server could take no input; the loss is
    /// applied once the outputs have drained (see `Roster::defer_loss`).
    pub(crate) const LOSS_PENDING: u8 = 4;
    /// Protocol-specific bits start here.
    pub(crate) const PROTOCOL: u8 = 8;
}

/// One worker's state at a server: what every protocol keeps (its session, the
/// deduplication mark, liveness, its part in the open round) and the protocol's own part
/// `X`.
#[derive(Clone, Copy, Debug)]
pub struct WorkerRecord<X> {
    /// The lowest sequence number the worker may still send.
    pub(crate) next_seq: u64,
    /// The batch the worker is part of: for the synchronous protocols the round (the
    /// version plus one) its gradient went into, so membership of the open round is
    /// `mark == version + 1` and a round empties by moving on, with no pass over the table.
    pub(crate) mark: u64,
    /// The epoch of its last `Join`.
    pub(crate) epoch: u32,
    /// [`flag`] bits.
    pub(crate) flags: u8,
    /// The protocol's own per-worker state.
    pub(crate) ext: X,
}

impl<X> WorkerRecord<X> {
    /// A worker that never joined and is presumed live.
    pub(crate) const fn new(ext: X) -> Self {
        Self { next_seq: 0, mark: 0, epoch: 0, flags: flag::LIVE, ext }
    }

    /// Whether bit `f` is set.
    pub(crate) fn has(&self, f: u8) -> bool {
        self.flags & f != 0
    }

    /// Sets or clears bit `f`.
    pub(crate) fn set(&mut self, f: u8, on: bool) {
        if on {
            self.flags |= f;
        } else {
            self.flags &= !f;
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::error::ConfigError;

    #[test]
    fn inline_tables_refuse_more_than_their_capacity() {
        assert_eq!(Inline::<4>::table(4, 7u8).map(|t| t.len()), Ok(4));
        assert_eq!(
            Inline::<4>::table(5, 7u8).map(|t| t.len()),
            Err(ConfigError::TableTooSmall { needed: 5, capacity: 4 })
        );
    }

    #[test]
    fn heap_tables_have_the_length_asked_for() {
        let t = Heap::table(65_535, 1u16).unwrap();
        assert_eq!(t.len(), 65_535);
        assert!(t.iter().all(|x| *x == 1));
    }
}
