//! The ledgers: the conservation ledger of contributions (in total and per session) and the
//! counters the report takes from the protocol's events.
//!
//! Every contribution a session delivers is counted once: `received` (handed to the
//! protocol; of those, `refused`), `discarded` (read from a session already replaced or
//! cut) or `in_flight_at_stop` (arrived after the run stopped). With the workers' own counts
//! of what they sent, nothing goes unaccounted for.

use super::report::{LossPoint, ServerReport, SessionLedger};
use std::collections::HashMap;
use syncopate::{ServerEvent, WorkerId};

/// Where a contribution ended up, for [`Ledger::count`].
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(super) enum Entry {
    /// Read from a current session and handed to the protocol.
    Received,
    /// Of those, refused by the protocol.
    Refused,
    /// Read from a session already replaced or cut.
    Discarded,
    /// Arrived after the run stopped.
    InFlightAtStop,
}

/// The conservation ledger: the report's totals and its per-session rows.
#[derive(Debug, Default)]
pub(super) struct Ledger {
    /// Connection id → index in [`ServerReport::session_ledgers`].
    rows: HashMap<u64, usize>,
}

impl Ledger {
    /// Opens the row of session `conn` of `worker` with session epoch `epoch`.
    pub(super) fn open(&mut self, report: &mut ServerReport, conn: u64, worker: u32, epoch: u32) {
        report.sessions += 1;
        self.rows.insert(conn, report.session_ledgers.len());
        report.session_ledgers.push(SessionLedger { worker, epoch, ..SessionLedger::default() });
    }

    /// Counts a contribution of session `conn` in the totals and in the session's row.
    pub(super) fn count(&self, report: &mut ServerReport, conn: u64, entry: Entry) {
        let total = match entry {
            Entry::Received => &mut report.received,
            Entry::Refused => &mut report.refused_contributions,
            Entry::Discarded => &mut report.discarded,
            Entry::InFlightAtStop => &mut report.in_flight_at_stop,
        };
        *total += 1;
        let Some(row) = self.rows.get(&conn).and_then(|i| report.session_ledgers.get_mut(*i)) else {
            return;
        };
        let cell = match entry {
            Entry::Received => &mut row.received,
            Entry::Refused => &mut row.refused,
            Entry::Discarded => &mut row.discarded,
            Entry::InFlightAtStop => &mut row.in_flight_at_stop,
        };
        *cell += 1;
    }
}

/// Counts a protocol event into the report: staleness and contributions per worker, stalls,
/// losses, and the loss curve (an update at `t_s` seconds of the run's clock; `None` before
/// the clock started).
pub(super) fn tally(report: &mut ServerReport, ev: &ServerEvent, t_s: Option<f64>) {
    match *ev {
        ServerEvent::Applied { worker, staleness, .. } => {
            let s = &mut report.staleness;
            s.0 += staleness;
            s.1 += 1;
            s.2 = s.2.max(staleness);
            if let Some(c) = report.per_worker.get_mut(worker.index()) {
                *c += 1;
            }
        }
        ServerEvent::Dropped { worker, .. } => {
            if let Some(c) = report.per_worker.get_mut(worker.index()) {
                *c += 1;
            }
        }
        ServerEvent::Stalled { waiting_for, missing, .. } => {
            report.stalls += 1;
            report.last_stall = Some((waiting_for, missing));
        }
        ServerEvent::WorkerLost { .. } => report.lost += 1,
        // The curve is on the run's clock: an update made before it started (an asynchronous
        // protocol training while the last workers connect) has no time on it and is left out.
        ServerEvent::ModelUpdated { version, mean_loss: Some(loss), .. } => {
            if let Some(t_s) = t_s {
                report.loss_curve.push(LossPoint { version: version.0, t_s, loss });
            }
        }
        _ => {}
    }
}

/// The most workers one log line names; the rest are counted.
const NAMED: usize = 8;

/// A stall report's further lines, saying why workers are missing: those not `connected`,
/// and those whose contributions were refused for a loss that is not finite (which a round
/// may wait for in vain), each list bounded to [`NAMED`] workers.
pub(super) fn stall_lines(report: &ServerReport, connected: &[bool]) -> Vec<String> {
    let gone = connected.iter().enumerate().filter(|(_, c)| !**c).map(|(w, _)| w.to_string());
    let bad = report.refused_loss_not_finite.iter().enumerate().filter(|(_, c)| **c > 0);
    let bad = bad.map(|(w, c)| format!("{w} ({c})"));
    [
        ("stalled: not connected: worker", gone.collect::<Vec<_>>()),
        ("stalled: contributions refused for a loss that is not finite: worker", bad.collect()),
    ]
    .into_iter()
    .filter(|(_, named)| !named.is_empty())
    .map(|(what, named)| format!("{what}{} {}", if named.len() > 1 { "s" } else { "" }, bounded_list(&named)))
    .collect()
}

/// The most workers a stall report's first line names; `…` stands for the rest.
const AWAITED: usize = 16;

/// A stall report's first line: the first worker the step waits for, how many are
/// missing, and every worker the server says it awaits (`awaited`, in id order; at most
/// [`AWAITED`] named, then `…`). A server that names none (or only the first) gets the
/// event's line alone.
pub(super) fn awaited_line(awaited: &[u32], waiting_for: WorkerId, missing: u32) -> String {
    let first = format!("stalled: waiting for worker {} ({missing} missing", waiting_for.0);
    if awaited.len() <= 1 {
        return format!("{first})");
    }
    let mut names = awaited.iter().take(AWAITED).map(u32::to_string).collect::<Vec<_>>().join(", ");
    if awaited.len() > AWAITED {
        names.push_str(", …");
    }
    // A backup round waits for any `missing` of the workers not in it.
    let which = if awaited.len() == missing as usize { ":" } else { ", any of" };
    format!("{first}{which} workers {names})")
}

/// `names` joined by commas, the first [`NAMED`] of them, then how many more.
fn bounded_list(names: &[String]) -> String {
    let shown = names.iter().take(NAMED).cloned().collect::<Vec<_>>().join(", ");
    match names.len().saturating_sub(NAMED) {
        0 => shown,
        more => format!("{shown} +{more} more"),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use syncopate::Version;

    #[test]
    fn a_contribution_counts_in_the_total_and_in_its_session_row() {
        let mut report = ServerReport::empty(2, Version::ZERO);
        let mut ledger = Ledger::default();
        ledger.open(&mut report, 7, 1, 3);
        ledger.count(&mut report, 7, Entry::Received);
        ledger.count(&mut report, 7, Entry::Refused);
        ledger.count(&mut report, 9, Entry::Discarded);
        ledger.count(&mut report, 7, Entry::InFlightAtStop);
        assert_eq!(
            (report.received, report.refused_contributions, report.discarded, report.in_flight_at_stop),
            (1, 1, 1, 1)
        );
        let row = SessionLedger { worker: 1, epoch: 3, received: 1, refused: 1, discarded: 0, in_flight_at_stop: 1 };
        assert_eq!(report.session_ledgers, [row], "an unknown session counts in the totals only");
        assert_eq!(report.sessions, 1);
    }

    #[test]
    fn stall_lines_name_every_worker_gone_or_refused_up_to_eight() {
        let mut report = ServerReport::empty(11, Version::ZERO);
        assert!(stall_lines(&report, &[true; 11]).is_empty());
        report.refused_loss_not_finite[4] = 2;
        let mut connected = [false; 11];
        connected[1] = true;
        assert_eq!(
            stall_lines(&report, &connected),
            [
                "stalled: not connected: workers 0, 2, 3, 4, 5, 6, 7, 8 +2 more",
                "stalled: contributions refused for a loss that is not finite: worker 4 (2)",
            ]
        );
        let names: Vec<String> = (0..8).map(|i| i.to_string()).collect();
        assert_eq!(bounded_list(&names), "0, 1, 2, 3, 4, 5, 6, 7");
    }

    #[test]
    fn the_stall_line_names_every_awaited_worker_up_to_sixteen() {
        let line =
            |awaited: &[u32], missing| awaited_line(awaited, WorkerId(awaited.first().copied().unwrap_or(4)), missing);
        assert_eq!(line(&[], 2), "stalled: waiting for worker 4 (2 missing)", "a server that names none");
        assert_eq!(line(&[2], 1), "stalled: waiting for worker 2 (1 missing)");
        assert_eq!(line(&[0, 3, 5], 3), "stalled: waiting for worker 0 (3 missing: workers 0, 3, 5)");
        assert_eq!(line(&[0, 2], 1), "stalled: waiting for worker 0 (1 missing, any of workers 0, 2)");
        let many: Vec<u32> = (0..20).collect();
        assert_eq!(
            line(&many, 20),
            "stalled: waiting for worker 0 (20 missing: workers 0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15, …)"
        );
    }
}
