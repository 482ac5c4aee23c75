//! The ledgers: the conservation ledger of contributions (in total and per session) and the
//! counters the report takes from the protocol's events.
//!
//! Every contribution a session delivers is counted once: `received` (handed to the
//! protocol; of those, `refused`), `discarded` (read from a session already replaced or
//! cut) or `in_flight_at_stop` (arrived after the run stopped). With the workers' own counts
//! of what they sent, nothing goes unaccounted for.

use super::report::{LossPoint, ServerReport};
use std::collections::HashMap;
use syncopate::ServerEvent;

/// One session's part of the conservation ledger (see [`ServerReport::received`]).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, serde::Serialize)]
pub struct SessionLedger {
    /// The worker.
    pub worker: u32,
    /// Its session epoch.
    pub epoch: u32,
    /// Contributions read and handed to the protocol.
    pub received: u64,
    /// Of those, refused.
    pub refused: u64,
    /// Read after the session was replaced or cut.
    pub discarded: u64,
    /// Arrived after the run stopped.
    pub in_flight_at_stop: u64,
}

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
/// losses, and the loss curve (an update at `t_s` seconds of the run's clock).
pub(super) fn tally(report: &mut ServerReport, ev: &ServerEvent, t_s: f64) {
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
        ServerEvent::ModelUpdated { version, mean_loss: Some(loss), .. } => {
            report.loss_curve.push(LossPoint { version: version.0, t_s, loss });
        }
        _ => {}
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
}
