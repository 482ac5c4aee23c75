//! Planted bugs for the reliability suite's canary tests (feature `_canary`, never enable it in
//! production). Each [`Canary`] is a tiny `#[cfg(feature = "_canary")]` branch in a protocol
//! that reintroduces one known class of bug when switched on at run time, so the test suite can
//! show it notices every one of them. All are compiled in together; at most one is active at a
//! time ([`set`]), chosen through a process-wide atomic (no allocation, no `std`).

use core::sync::atomic::{AtomicU8, Ordering};

/// One planted bug.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
#[repr(u8)]
pub enum Canary {
    /// No canary active: the protocols behave normally.
    Off = 0,
    /// The roster's sequence-number deduplication accepts everything (a duplicate or a replay
    /// is counted again).
    DedupOff = 1,
    /// Backup/DBW: a stale gradient (for a closed version) is added to the current round
    /// instead of being dropped.
    LateGradientAdded = 2,
    /// BAP: the server accepts a gradient whose lag is one above the staleness bound.
    StalenessBoundPlusOne = 3,
    /// WBSP: a round waits for workers declared lost (it counts them as missing).
    LostWorkerAwaited = 4,
    /// BSP: a round closes one gradient short (`n − 1` of `n`).
    RoundClosesEarly = 5,
}

impl Canary {
    /// Every planted bug (without [`Self::Off`]).
    pub const ALL: [Self; 5] = [
        Self::DedupOff,
        Self::LateGradientAdded,
        Self::StalenessBoundPlusOne,
        Self::LostWorkerAwaited,
        Self::RoundClosesEarly,
    ];

    /// A short lowercase name.
    pub fn name(self) -> &'static str {
        match self {
            Self::Off => "off",
            Self::DedupOff => "dedup_off",
            Self::LateGradientAdded => "late_gradient_added",
            Self::StalenessBoundPlusOne => "staleness_bound_plus_one",
            Self::LostWorkerAwaited => "lost_worker_awaited",
            Self::RoundClosesEarly => "round_closes_early",
        }
    }
}

static ACTIVE: AtomicU8 = AtomicU8::new(0);

/// Activates `which` (and deactivates any other); [`Canary::Off`] turns all off.
pub fn set(which: Canary) {
    ACTIVE.store(which as u8, Ordering::SeqCst);
}

/// Whether `which` is the active canary.
pub fn is_on(which: Canary) -> bool {
    which != Canary::Off && ACTIVE.load(Ordering::SeqCst) == which as u8
}
