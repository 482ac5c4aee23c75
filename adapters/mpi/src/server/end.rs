//! The end of a run at a server rank: the workers' final tallies, this shard's report and,
//! at rank 0 of a sharded run, the model and counters assembled from every shard's.

use super::report::{ServerReport, StopReason};
use super::side::{Side, is_contribution};
use crate::Shared;
use crate::ledger::ShardSummary;
use crate::link::Kind;
use std::time::{Duration, Instant};
use syncopate::proto::Heap;
use syncopate::wire::Limits;
use syncopate::{AnyServer, Server, Version};

/// This shard's report; a shard other than rank 0 sends it to rank 0 too.
pub(super) fn finish(
    side: &mut Side<'_>,
    server: &AnyServer<f32, Shared, Heap>,
    reason: StopReason,
    wall_s: f64,
    patience: Duration,
) -> ServerReport {
    let stats = *server.stats();
    let tallies = side.report.workers.iter().flatten();
    side.ledger.live = side.ranks.live.len() as u32;
    side.ledger.tallies = tallies.clone().count() as u32;
    side.ledger.sent = tallies.map(|t| t.sent).sum();
    side.ledger.accepted = stats.accepted;
    side.ledger.applied = stats.applied;
    side.ledger.dropped = stats.dropped_total();
    side.ledger.updates = stats.updates;
    let mut report = side.report.clone();
    report.reason = reason;
    report.wall_s = wall_s;
    report.version = server.version();
    report.stats = stats;
    report.params = server.params().to_vec();
    report.shards = vec![side.ledger];
    if side.shard > 0 && !matches!(reason, StopReason::ShardLost(0)) {
        let summary = ShardSummary {
            ledger: side.ledger,
            stats,
            version: server.version().0,
            staleness: report.staleness,
            stalls: report.stalls,
            refused: report.refused,
            params: report.params.clone(),
        };
        side.link.send(&[0], Kind::ShardReport, summary.to_bytes());
    }
    if side.shard == 0 && side.layout.shards() > 1 {
        // The other shards' reports (a lost shard's never comes).
        let deadline = Instant::now() + patience;
        let lost = match reason {
            StopReason::ShardLost(k) => Some(k as usize),
            _ => None,
        };
        let missing =
            |side: &Side<'_>| side.summaries.iter().enumerate().skip(1).any(|(k, s)| s.is_none() && Some(k) != lost);
        while missing(side) {
            let Some(m) = side.link.recv_until(deadline, None, None) else { break };
            if m.from < side.ranks.first {
                side.feed_from_shard(&m);
            }
            side.link.recycle(m);
        }
    }
    report
}

/// At rank 0 of a sharded run: the model assembled from every shard's slice (a shard whose
/// report did not arrive keeps its initial slice, logged), the counters summed over the
/// shards, and every shard's ledger.
pub(super) fn assemble(side: &mut Side<'_>, report: &mut ServerReport, initial: &[f32]) {
    let mut params = initial.to_vec();
    if let Some(dst) = side.layout.range(0).and_then(|r| params.get_mut(r)) {
        dst.copy_from_slice(&report.params);
    }
    for k in 1..side.layout.shards() {
        let Some(s) = side.summaries.get(k as usize).and_then(Option::as_ref) else {
            (side.log)(&format!("shard {k}: its report did not arrive; the model keeps its initial slice"));
            continue;
        };
        if let Some(dst) = side.layout.range(k).and_then(|r| params.get_mut(r)) {
            if dst.len() == s.params.len() {
                dst.copy_from_slice(&s.params);
            }
        }
        let t = &mut report.stats;
        t.accepted += s.stats.accepted;
        t.applied += s.stats.applied;
        for (a, b) in t.dropped.iter_mut().zip(s.stats.dropped) {
            *a += b;
        }
        t.rejected += s.stats.rejected;
        t.updates = t.updates.min(s.stats.updates);
        t.outputs_lost += s.stats.outputs_lost;
        report.version = Version(report.version.0.min(s.version));
        report.staleness.0 += s.staleness.0;
        report.staleness.1 += s.staleness.1;
        report.staleness.2 = report.staleness.2.max(s.staleness.2);
        report.stalls += s.stalls;
        report.refused += s.refused;
        report.shards.push(s.ledger);
    }
    report.params = params;
}

/// Waits up to `patience` for the tally of every live worker; contributions that arrive
/// meanwhile are counted late.
pub(super) fn collect_tallies(
    side: &mut Side<'_>,
    server: &mut AnyServer<f32, Shared, Heap>,
    limits: &Limits,
    origin: Instant,
    patience: Duration,
) {
    let deadline = Instant::now() + patience;
    let missing = |side: &Side<'_>| {
        side.ranks.live.iter().any(|r| {
            side.ranks.worker(*r).and_then(|w| side.report.workers.get(w.index())).is_some_and(Option::is_none)
        })
    };
    while missing(side) {
        let Some(m) = side.link.recv_until(deadline, None, None) else { break };
        match m.kind {
            Kind::Tally => side.feed(server, &m, limits, origin),
            Kind::Wire if m.from >= side.ranks.first && is_contribution(m.message()) => side.ledger.late += 1,
            Kind::ShardReport | Kind::ShardStop | Kind::Heartbeat if m.from < side.ranks.first => {
                side.feed_from_shard(&m);
            }
            _ => {}
        }
        side.link.recycle(m);
    }
}
