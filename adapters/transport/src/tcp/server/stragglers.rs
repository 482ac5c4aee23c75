//! The straggler report: per worker, the median of its latest step times (as it measured
//! and reported them, see [`step_times`](crate::tcp::step_times)), its ratio to the median
//! worker, and what became of its contributions: applied, dropped, or held (accepted by the
//! protocol and neither applied nor dropped yet: in an open round, or at the stop).
//!
//! Memory is bounded: each worker keeps its newest [`WINDOW`] step times. The median worker
//! is the lower middle of the workers' medians (a worker's own time, never an average of
//! two), so with one straggler among an even number of workers the ratio compares it with
//! a typical worker. A worker that reported no step time has none in its time columns; its
//! counts are still shown. The server logs the table every [`REPORT_EVERY`] once the run's
//! clock has started (when something changed), slowest workers first, at most [`NAMED`]
//! of them.

use super::report::{SessionLedger, WorkerRow};
use core::time::Duration;
use std::collections::VecDeque;
use std::fmt::Write as _;
use syncopate::ServerEvent;

/// The step times each worker's median is taken over (its newest).
pub(super) const WINDOW: usize = 64;

/// How often a running server logs the table.
pub(super) const REPORT_EVERY: Duration = Duration::from_secs(5);

/// The most workers one table names; the rest are counted.
pub(super) const NAMED: usize = 16;

/// What the report is made of, per worker.
#[derive(Debug)]
pub(super) struct Stragglers {
    times: Vec<VecDeque<f32>>,
    steps: Vec<u64>,
    applied: Vec<u64>,
    dropped: Vec<u64>,
    /// Contributions counted when the table was last logged (nothing new: no table).
    logged_at: u64,
}

impl Stragglers {
    /// Nothing yet, for `n` workers.
    pub(super) fn new(n: usize) -> Self {
        Self {
            times: vec![VecDeque::new(); n],
            steps: vec![0; n],
            applied: vec![0; n],
            dropped: vec![0; n],
            logged_at: 0,
        }
    }

    /// The step times that came with a contribution of worker `worker`.
    pub(super) fn steps(&mut self, worker: syncopate::WorkerId, seconds: &[f32]) {
        let (Some(window), Some(steps)) = (self.times.get_mut(worker.index()), self.steps.get_mut(worker.index()))
        else {
            return;
        };
        *steps += seconds.len() as u64;
        for &s in seconds.iter().rev().take(WINDOW).rev() {
            if window.len() == WINDOW {
                window.pop_front();
            }
            window.push_back(s);
        }
    }

    /// Counts a protocol event: a worker's contribution applied or dropped.
    pub(super) fn event(&mut self, ev: &ServerEvent) {
        let counter = match *ev {
            ServerEvent::Applied { worker, .. } => self.applied.get_mut(worker.index()),
            ServerEvent::Dropped { worker, .. } => self.dropped.get_mut(worker.index()),
            _ => None,
        };
        if let Some(c) = counter {
            *c += 1;
        }
    }

    /// The report's rows, in id order; `sessions` give what the protocol accepted from each
    /// worker (read less refused).
    pub(super) fn rows(&self, sessions: &[SessionLedger]) -> Vec<WorkerRow> {
        let mut accepted = vec![0u64; self.times.len()];
        for s in sessions {
            if let Some(a) = accepted.get_mut(s.worker as usize) {
                *a += s.received.saturating_sub(s.refused);
            }
        }
        let mut scratch = Vec::with_capacity(WINDOW);
        let medians: Vec<Option<f64>> = self.times.iter().map(|w| median(w.iter().copied(), &mut scratch)).collect();
        let middle = median_worker(&medians);
        (0..self.times.len())
            .map(|i| {
                let get = |v: &[u64]| v.get(i).copied().unwrap_or(0);
                let (applied, dropped) = (get(&self.applied), get(&self.dropped));
                let median_step_s = medians.get(i).copied().flatten();
                WorkerRow {
                    worker: i as u32,
                    steps: get(&self.steps),
                    median_step_s,
                    ratio: median_step_s.zip(middle).filter(|(_, m)| *m > 0.0).map(|(s, m)| s / m),
                    applied,
                    dropped,
                    held: get(&accepted).saturating_sub(applied + dropped),
                }
            })
            .collect()
    }

    /// The table's lines if it is due (the caller calls this every [`REPORT_EVERY`]) and
    /// something changed since the last one.
    pub(super) fn due_lines(&mut self, sessions: &[SessionLedger]) -> Vec<String> {
        let seen: u64 = sessions.iter().map(|s| s.received).sum();
        if seen == self.logged_at {
            return Vec::new();
        }
        self.logged_at = seen;
        lines(&self.rows(sessions))
    }
}

/// The median of `values` (the lower middle of an even count); `None` for none.
fn median(values: impl Iterator<Item = f32>, scratch: &mut Vec<f32>) -> Option<f64> {
    scratch.clear();
    scratch.extend(values.filter(|v| v.is_finite()));
    if scratch.is_empty() {
        return None;
    }
    let mid = (scratch.len() - 1) / 2;
    let (_, m, _) = scratch.select_nth_unstable_by(mid, f32::total_cmp);
    Some(f64::from(*m))
}

/// The median worker's median: the lower middle of the workers' medians.
fn median_worker(medians: &[Option<f64>]) -> Option<f64> {
    let mut known: Vec<f64> = medians.iter().filter_map(|m| *m).collect();
    if known.is_empty() {
        return None;
    }
    known.sort_by(f64::total_cmp);
    known.get((known.len() - 1) / 2).copied()
}

/// `seconds` in milliseconds, for the table.
fn ms(seconds: f64) -> String {
    format!("{:.2} ms", seconds * 1e3)
}

/// The straggler report's table as log lines: a heading, then the workers slowest first
/// (those without step times last), at most 16, then how many more.
pub fn lines(rows: &[WorkerRow]) -> Vec<String> {
    let mut order: Vec<&WorkerRow> = rows.iter().collect();
    order.sort_by(|a, b| b.ratio.unwrap_or(-1.0).total_cmp(&a.ratio.unwrap_or(-1.0)).then(a.worker.cmp(&b.worker)));
    let middle = median_worker(&rows.iter().map(|r| r.median_step_s).collect::<Vec<_>>());
    let mut out = vec![match middle {
        Some(m) => format!(
            "stragglers: median worker {} (each worker's median of its last {WINDOW} steps); slowest first, \
             contributions applied/dropped/held",
            ms(m)
        ),
        None => "stragglers: step times none (the workers reported none); contributions applied/dropped/held".into(),
    }];
    for r in order.iter().take(NAMED) {
        let mut line = format!("  worker {}: ", r.worker);
        match (r.median_step_s, r.ratio) {
            (Some(s), Some(x)) => {
                let _ = write!(line, "{} {x:.2}x", ms(s));
            }
            (Some(s), None) => {
                let _ = write!(line, "{}", ms(s));
            }
            _ => line.push_str("step times none"),
        }
        let _ = write!(line, ", {}/{}/{}", r.applied, r.dropped, r.held);
        out.push(line);
    }
    if let Some(more) = order.len().checked_sub(NAMED).filter(|m| *m > 0) {
        out.push(format!("  … {more} more workers, none slower than those above"));
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use syncopate::{DropReason, Version, WorkerId};

    fn session(worker: u32, received: u64, refused: u64) -> SessionLedger {
        SessionLedger { worker, received, refused, ..SessionLedger::default() }
    }

    #[test]
    fn medians_ratios_and_counts_per_worker() {
        let mut s = Stragglers::new(4);
        s.steps(WorkerId(0), &[0.010, 0.012, 0.011]);
        s.steps(WorkerId(1), &[0.010, 0.009]);
        s.steps(WorkerId(2), &[0.040, 0.050, 0.045]);
        s.steps(WorkerId(9), &[1.0]);
        let applied = |w| ServerEvent::Applied {
            worker: WorkerId(w),
            base: Version(0),
            version: Version(1),
            staleness: 0,
            weight: 1.0,
        };
        s.event(&applied(0));
        s.event(&applied(0));
        s.event(&applied(2));
        s.event(&ServerEvent::Dropped { worker: WorkerId(2), base: Version(0), reason: DropReason::Stale });
        let rows = s.rows(&[session(0, 2, 0), session(2, 3, 0), session(2, 1, 1), session(3, 1, 0)]);
        let medians: Vec<Option<f64>> = rows.iter().map(|r| r.median_step_s).collect();
        assert_eq!(medians, [Some(0.011f32.into()), Some(0.009f32.into()), Some(0.045f32.into()), None]);
        // The lower middle of 9, 11 and 45 ms is 11 ms: worker 0 is the median worker.
        assert_eq!(rows[0].ratio, Some(1.0));
        assert!((rows[2].ratio.unwrap() - 0.045 / 0.011).abs() < 1e-6);
        assert_eq!(rows[3].ratio, None, "no step times, no ratio");
        let counts: Vec<(u64, u64, u64, u64)> = rows.iter().map(|r| (r.steps, r.applied, r.dropped, r.held)).collect();
        assert_eq!(counts, [(3, 2, 0, 0), (2, 0, 0, 0), (3, 1, 1, 1), (0, 0, 0, 1)]);
    }

    #[test]
    fn a_window_keeps_the_newest_times_only() {
        let mut s = Stragglers::new(1);
        s.steps(WorkerId(0), &[1.0; 3 * WINDOW]);
        s.steps(WorkerId(0), &[0.001; WINDOW / 2 + 1]);
        let row = s.rows(&[])[0];
        assert_eq!(row.steps, 3 * WINDOW as u64 + WINDOW as u64 / 2 + 1);
        assert_eq!(row.median_step_s, Some(0.001f32.into()), "the newest times are the majority");
        assert_eq!(s.times[0].len(), WINDOW);
    }

    #[test]
    fn the_table_names_the_slowest_first_and_is_bounded() {
        let mut s = Stragglers::new(20);
        for w in 0..20u32 {
            if w != 7 {
                s.steps(WorkerId(w), &[0.001 * (1.0 + w as f32 / 100.0)]);
            }
        }
        s.steps(WorkerId(3), &[0.1, 0.1]);
        let sessions = [session(3, 1, 0)];
        let table = s.due_lines(&sessions);
        assert!(table[0].starts_with("stragglers: median worker 1.11 ms"), "{table:?}");
        assert!(table[1].starts_with("  worker 3: 100.00 ms ") && table[1].ends_with(", 0/0/1"), "{table:?}");
        assert_eq!(table.len(), 1 + NAMED + 1);
        assert_eq!(table[NAMED + 1], "  … 4 more workers, none slower than those above");
        assert!(s.due_lines(&sessions).is_empty(), "nothing new, no table");
        let none = lines(&Stragglers::new(2).rows(&[session(1, 2, 0)]));
        assert_eq!(
            none,
            [
                "stragglers: step times none (the workers reported none); contributions applied/dropped/held",
                "  worker 0: step times none, 0/0/0",
                "  worker 1: step times none, 0/0/2",
            ]
        );
    }
}
