//! The stall watchdog: a server that waits for workers reports whom it waits for, once per
//! interval, instead of hanging silently (docs/RELIABILITY.md, "Failure classes").

use crate::time::{Duration, Instant};

/// When the current wait started and when to report it next.
#[derive(Clone, Copy, Debug)]
pub(crate) struct StallWatch {
    interval: Option<Duration>,
    since: Instant,
    next_report: Option<Instant>,
}

impl StallWatch {
    pub(crate) fn new(interval: Option<Duration>) -> Self {
        Self { interval, since: Instant::ZERO, next_report: None }
    }

    /// Progress was made at `now`: the wait restarts.
    pub(crate) fn progress(&mut self, now: Instant) {
        self.since = now;
        self.next_report = self.interval.map(|d| now + d);
    }

    /// Stops watching (nothing is awaited).
    pub(crate) fn idle(&mut self) {
        self.next_report = None;
    }

    /// When the wait started.
    pub(crate) fn since(&self) -> Instant {
        self.since
    }

    /// The next report deadline.
    pub(crate) fn deadline(&self) -> Option<Instant> {
        self.next_report
    }

    /// Whether a report is due at `now`; if so, schedules the next one.
    pub(crate) fn due(&mut self, now: Instant) -> bool {
        match (self.next_report, self.interval) {
            (Some(at), Some(d)) if now >= at => {
                self.next_report = Some(now + d);
                true
            }
            _ => false,
        }
    }
}
