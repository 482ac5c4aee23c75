//! Time as an input: [`Instant`] and [`Duration`] in nanoseconds.
//!
//! The core never reads a clock. The driver picks an epoch (the start of the run, or the
//! start of a simulation) and passes `now` into every `handle_*` call. Both types are plain
//! `u64` nanosecond counts, so arithmetic saturates instead of panicking.

use core::ops::{Add, Sub};
use serde::{Deserialize, Serialize};

/// A point in time: nanoseconds since an epoch chosen by the driver.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
pub struct Instant(u64);

/// A span of time in nanoseconds.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
pub struct Duration(u64);

impl Instant {
    /// The driver's epoch.
    pub const ZERO: Self = Self(0);
    /// The latest representable instant.
    pub const MAX: Self = Self(u64::MAX);

    /// An instant `nanos` nanoseconds after the epoch.
    pub const fn from_nanos(nanos: u64) -> Self {
        Self(nanos)
    }

    /// Nanoseconds since the epoch.
    pub const fn as_nanos(self) -> u64 {
        self.0
    }

    /// Seconds since the epoch, as a float (for reports).
    pub fn as_secs_f64(self) -> f64 {
        self.0 as f64 / 1e9
    }

    /// Time elapsed from `earlier` to `self`, or zero if `earlier` is later.
    pub const fn saturating_duration_since(self, earlier: Self) -> Duration {
        Duration(self.0.saturating_sub(earlier.0))
    }

    /// `self + d`, or `None` on overflow.
    pub const fn checked_add(self, d: Duration) -> Option<Self> {
        match self.0.checked_add(d.0) {
            Some(n) => Some(Self(n)),
            None => None,
        }
    }
}

impl Duration {
    /// No time at all.
    pub const ZERO: Self = Self(0);
    /// The longest representable span.
    pub const MAX: Self = Self(u64::MAX);

    /// A span of `nanos` nanoseconds.
    pub const fn from_nanos(nanos: u64) -> Self {
        Self(nanos)
    }

    /// A span of `micros` microseconds (saturating).
    pub const fn from_micros(micros: u64) -> Self {
        Self(micros.saturating_mul(1_000))
    }

    /// A span of `millis` milliseconds (saturating).
    pub const fn from_millis(millis: u64) -> Self {
        Self(millis.saturating_mul(1_000_000))
    }

    /// A span of `secs` seconds (saturating).
    pub const fn from_secs(secs: u64) -> Self {
        Self(secs.saturating_mul(1_000_000_000))
    }

    /// A span from fractional seconds; negative or NaN gives zero, huge values saturate.
    pub fn from_secs_f64(secs: f64) -> Self {
        let nanos = secs * 1e9;
        if nanos.is_nan() || nanos <= 0.0 {
            Self(0)
        } else if nanos >= u64::MAX as f64 {
            Self(u64::MAX)
        } else {
            Self(nanos as u64)
        }
    }

    /// Nanoseconds in this span.
    pub const fn as_nanos(self) -> u64 {
        self.0
    }

    /// Seconds in this span, as a float.
    pub fn as_secs_f64(self) -> f64 {
        self.0 as f64 / 1e9
    }

    /// `self * k`, saturating.
    pub const fn saturating_mul(self, k: u64) -> Self {
        Self(self.0.saturating_mul(k))
    }
}

impl Add<Duration> for Instant {
    type Output = Self;
    /// Saturates at [`Instant::MAX`].
    fn add(self, rhs: Duration) -> Self {
        Self(self.0.saturating_add(rhs.0))
    }
}

impl Sub for Instant {
    type Output = Duration;
    /// Saturates at zero.
    fn sub(self, rhs: Self) -> Duration {
        self.saturating_duration_since(rhs)
    }
}

impl Add for Duration {
    type Output = Self;
    /// Saturates at [`Duration::MAX`].
    fn add(self, rhs: Self) -> Self {
        Self(self.0.saturating_add(rhs.0))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn arithmetic_saturates() {
        assert_eq!(Instant::MAX + Duration::from_secs(1), Instant::MAX);
        assert_eq!(Instant::ZERO - Instant::from_nanos(5), Duration::ZERO);
        assert_eq!(Duration::from_secs(u64::MAX), Duration::MAX);
        assert_eq!(Duration::from_secs_f64(f64::NAN), Duration::ZERO);
        assert_eq!(Duration::from_secs_f64(-1.0), Duration::ZERO);
        assert_eq!(Duration::from_secs_f64(1e30), Duration::MAX);
        assert_eq!(Duration::from_millis(3).as_nanos(), 3_000_000);
    }
}
