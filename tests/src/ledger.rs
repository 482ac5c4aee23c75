//! The conservation ledger: every contribution (gradient, delta, clock update) a worker sent
//! is applied, dropped with a reason, held by the server, in flight, or lost with a cause;
//! [`Ledger::check`] verifies `sent = applied + dropped + held + in flight + lost`, and that
//! the server's own counters add up (`accepted = applied + dropped + held`).
//!
//! One type for every adapter: the swarm simulator fills it after every event from the
//! workers' [`WorkerStats`], the server's [`ServerStats`] and its network ([`Tracker`]); the
//! thread and TCP tests fill it from their reports at the end of a run.

use std::collections::{BTreeMap, HashMap};
use std::string::String;
use syncopate::{DropReason, Reject, ServerStats, ToServer, WorkerStats};

/// Why a contribution that was sent has no outcome at the server.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum Loss {
    /// Every copy was lost by the network.
    Network,
    /// Every copy met a partition.
    Partition,
    /// Every copy that arrived was refused (the reason is a [`Reject`], e.g. a stale epoch).
    Refused,
    /// It was on its way to a server that crashed and restarted (the new server never saw it).
    ServerGone,
    /// Applied in a version after the last checkpoint of a server that crashed: rolled back.
    RolledBack,
    /// Accepted, not yet applied or dropped, when the server crashed.
    HeldAtCrash,
    /// Sent by a worker process that was killed, and not received by the server (TCP).
    WorkerKilled,
    /// On a connection that broke before the server read it (TCP).
    ConnectionLost,
}

impl Loss {
    /// Every cause.
    pub const ALL: [Self; 8] = [
        Self::Network,
        Self::Partition,
        Self::Refused,
        Self::ServerGone,
        Self::RolledBack,
        Self::HeldAtCrash,
        Self::WorkerKilled,
        Self::ConnectionLost,
    ];

    /// A short lowercase name.
    pub fn name(self) -> &'static str {
        match self {
            Self::Network => "network",
            Self::Partition => "partition",
            Self::Refused => "refused",
            Self::ServerGone => "server_gone",
            Self::RolledBack => "rolled_back",
            Self::HeldAtCrash => "held_at_crash",
            Self::WorkerKilled => "worker_killed",
            Self::ConnectionLost => "connection_lost",
        }
    }

    fn index(self) -> usize {
        self as usize
    }
}

/// What became of every contribution of a run (or of a run so far).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Ledger {
    /// Distinct contributions the workers sent.
    pub sent: u64,
    /// Contributions the server accepted (current server; with [`Self::applied`],
    /// [`Self::dropped`] and [`Self::held`] they must add up).
    pub accepted: u64,
    /// Applied to the model (and not rolled back).
    pub applied: u64,
    /// Dropped by the protocol, by [`DropReason`] (order of [`DropReason::ALL`]).
    pub dropped: [u64; 5],
    /// Held by the server at the end (a partial round, a cached gradient).
    pub held: u64,
    /// On their way to the server at the end.
    pub in_flight: u64,
    /// Lost, by [`Loss`] cause (order of [`Loss::ALL`]).
    pub lost: [u64; 8],
}

impl Ledger {
    /// The server's part from its counters: `accepted`, `applied`, `dropped` and `held =
    /// accepted − applied − dropped` (an error when the server reports more outcomes than it
    /// accepted).
    pub fn from_server(stats: &ServerStats) -> Result<Self, String> {
        let outcomes = stats.applied + stats.dropped_total();
        let held = stats.accepted.checked_sub(outcomes).ok_or_else(|| {
            format!("ledger: the server reports {outcomes} outcomes for {} accepted contributions", stats.accepted)
        })?;
        let mut l = Self { accepted: stats.accepted, applied: stats.applied, held, ..Self::default() };
        for r in DropReason::ALL {
            l.add_dropped(r, stats.dropped_for(r));
        }
        Ok(l)
    }

    /// Adds `n` drops for `reason`.
    pub fn add_dropped(&mut self, reason: DropReason, n: u64) {
        if let Some(i) = DropReason::ALL.iter().position(|r| *r == reason) {
            self.dropped[i] += n;
        }
    }

    /// Adds `n` losses with `cause`.
    pub fn add_lost(&mut self, cause: Loss, n: u64) {
        self.lost[cause.index()] += n;
    }

    /// Losses with `cause`.
    pub fn lost_for(&self, cause: Loss) -> u64 {
        self.lost[cause.index()]
    }

    /// All drops.
    pub fn dropped_total(&self) -> u64 {
        self.dropped.iter().sum()
    }

    /// All losses.
    pub fn lost_total(&self) -> u64 {
        self.lost.iter().sum()
    }

    /// `applied + dropped + held + in flight + lost`.
    pub fn accounted(&self) -> u64 {
        self.applied + self.dropped_total() + self.held + self.in_flight + self.lost_total()
    }

    /// Verifies conservation: `sent = applied + dropped + held + in flight + lost`.
    pub fn check(&self) -> Result<(), String> {
        if self.sent == self.accounted() { Ok(()) } else { Err(format!("ledger does not balance: {}", self.line())) }
    }

    /// `sent 40 = applied 30 + dropped 4 (stale 4) + held 2 + in flight 1 + lost 3 (network 3)`.
    pub fn line(&self) -> String {
        let named = |names: &[&str], counts: &[u64]| -> String {
            let parts: Vec<String> =
                names.iter().zip(counts).filter(|(_, n)| **n > 0).map(|(k, n)| format!("{k} {n}")).collect();
            if parts.is_empty() { String::new() } else { format!(" ({})", parts.join(", ")) }
        };
        let drop_names: Vec<&str> = DropReason::ALL.iter().map(|r| r.name()).collect();
        let loss_names: Vec<&str> = Loss::ALL.iter().map(|c| c.name()).collect();
        format!(
            "sent {} {} applied {} + dropped {}{} + held {} + in flight {} + lost {}{}",
            self.sent,
            if self.sent == self.accounted() { "=" } else { "!=" },
            self.applied,
            self.dropped_total(),
            named(&drop_names, &self.dropped),
            self.held,
            self.in_flight,
            self.lost_total(),
            named(&loss_names, &self.lost),
        )
    }

    /// The `gradients` object of a `--json` summary (`accepted`, `applied`,
    /// `dropped_by_reason`, `held_at_stop`) as the server's part of a ledger.
    pub fn from_summary_json(gradients: &serde_json::Value) -> Result<Self, String> {
        let get = |k: &str| gradients[k].as_u64().ok_or_else(|| format!("no {k} in {gradients}"));
        let mut l = Self {
            accepted: get("accepted")?,
            applied: get("applied")?,
            held: get("held_at_stop")?,
            ..Self::default()
        };
        if let Some(by) = gradients["dropped_by_reason"].as_object() {
            for (k, v) in by {
                let r =
                    DropReason::ALL.into_iter().find(|r| r.name() == k).ok_or_else(|| format!("drop reason {k}"))?;
                l.add_dropped(r, v.as_u64().unwrap_or(0));
            }
        }
        if l.applied + l.dropped_total() + l.held != l.accepted {
            return Err(format!("summary does not add up: {gradients}"));
        }
        Ok(l)
    }
}

/// The fate of one contribution in a simulated network.
#[derive(Clone, Copy, Debug, Default)]
struct Fate {
    /// Copies on their way to the current server.
    in_flight: u32,
    /// Accepted by server incarnation `n`.
    accepted_by: Option<u32>,
    /// Refused (every copy that arrived so far).
    refused: bool,
    /// Why copies were lost.
    lost: Option<Loss>,
}

/// Where a contribution is counted.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Place {
    Accepted,
    Folded,
    InFlight,
    Lost(Loss),
    Nowhere,
}

/// Follows every contribution of a simulated network to its fate, so the swarm can fill a
/// [`Ledger`] after every event: the workers' counters (kept per worker across restarts),
/// the copies on the wire, what the network lost and why, and what server restarts took.
#[derive(Clone, Debug, Default)]
pub struct Tracker {
    workers: Vec<WorkerStats>,
    fates: HashMap<(u32, u32, u64), Fate>,
    inc: u32,
    accepted_now: u64,
    in_flight: u64,
    lost: [u64; 8],
    /// Outcomes of earlier server incarnations that a restart kept (applied up to the
    /// checkpoint, dropped).
    kept: Ledger,
    /// Applied events of the current incarnation by version.
    applied_by_version: BTreeMap<u64, u64>,
}

impl Tracker {
    /// A tracker for `n` workers.
    pub fn new(n: u32) -> Self {
        Self { workers: vec![WorkerStats::default(); n as usize], ..Self::default() }
    }

    fn place(&self, f: &Fate) -> Place {
        match f.accepted_by {
            Some(i) if i == self.inc => Place::Accepted,
            Some(_) => Place::Folded,
            None if f.in_flight > 0 => Place::InFlight,
            None if f.refused => Place::Lost(Loss::Refused),
            None => f.lost.map_or(Place::Nowhere, Place::Lost),
        }
    }

    fn count(&mut self, p: Place, add: bool) {
        let c = match p {
            Place::Accepted => &mut self.accepted_now,
            Place::InFlight => &mut self.in_flight,
            Place::Lost(l) => &mut self.lost[l.index()],
            Place::Folded | Place::Nowhere => return,
        };
        if add {
            *c += 1;
        } else {
            *c = c.saturating_sub(1);
        }
    }

    fn update(&mut self, key: (u32, u32, u64), f: impl FnOnce(&mut Fate)) {
        let mut fate = self.fates.get(&key).copied().unwrap_or_default();
        let before = self.place(&fate);
        f(&mut fate);
        let after = self.place(&fate);
        if before != after {
            self.count(before, false);
            self.count(after, true);
        }
        self.fates.insert(key, fate);
    }

    fn key(from: u32, epoch: u32, msg: &ToServer<'_, f64>) -> Option<(u32, u32, u64)> {
        match *msg {
            ToServer::Grad { seq, .. } | ToServer::Delta { seq, .. } | ToServer::Clock { seq, .. } => {
                Some((from, epoch, seq))
            }
            _ => None,
        }
    }

    /// Worker `w` sent `msg` (its counters).
    pub fn worker_sent(&mut self, w: u32, msg: &ToServer<'_, f64>) {
        if let Some(s) = self.workers.get_mut(w as usize) {
            s.record(msg);
        }
    }

    /// The network put a copy of `msg` from `from` (session `epoch`) on the wire.
    pub fn copy_sent(&mut self, from: u32, epoch: u32, msg: &ToServer<'_, f64>) {
        if let Some(k) = Self::key(from, epoch, msg) {
            self.update(k, |f| f.in_flight += 1);
        }
    }

    /// The network lost a copy of `msg` before it left (`cause`).
    pub fn copy_lost(&mut self, from: u32, epoch: u32, msg: &ToServer<'_, f64>, cause: Loss) {
        if let Some(k) = Self::key(from, epoch, msg) {
            self.update(k, |f| {
                f.lost.get_or_insert(cause);
            });
        }
    }

    /// A copy arrived at a server that is no longer running.
    pub fn copy_missed_server(&mut self, from: u32, epoch: u32, msg: &ToServer<'_, f64>) {
        if let Some(k) = Self::key(from, epoch, msg) {
            self.update(k, |f| {
                f.in_flight = f.in_flight.saturating_sub(1);
                f.lost = Some(Loss::ServerGone);
            });
        }
    }

    /// A copy reached the current server, which answered `result`.
    pub fn copy_handled(&mut self, from: u32, epoch: u32, msg: &ToServer<'_, f64>, result: Result<(), Reject>) {
        let inc = self.inc;
        if let Some(k) = Self::key(from, epoch, msg) {
            self.update(k, |f| {
                f.in_flight = f.in_flight.saturating_sub(1);
                match result {
                    Ok(()) => f.accepted_by = f.accepted_by.or(Some(inc)),
                    Err(_) => f.refused = true,
                }
            });
        }
    }

    /// A server event (applied contributions are counted by version, for restarts).
    pub fn event(&mut self, e: &syncopate::ServerEvent) {
        if let syncopate::ServerEvent::Applied { version, .. } = *e {
            *self.applied_by_version.entry(version.0).or_insert(0) += 1;
        }
    }

    /// The server crashed with `stats` and restarted from the checkpoint of `checkpoint`:
    /// what it applied up to the checkpoint and what it dropped are kept; what it applied
    /// after is rolled back; what it held is lost; copies on the wire to it are lost.
    pub fn server_restarted(&mut self, stats: &ServerStats, checkpoint: u64) {
        let rolled: u64 = self.applied_by_version.range(checkpoint + 1..).map(|(_, n)| *n).sum();
        self.kept.applied += stats.applied.saturating_sub(rolled);
        for r in DropReason::ALL {
            self.kept.add_dropped(r, stats.dropped_for(r));
        }
        self.lost[Loss::RolledBack.index()] += rolled;
        let held = stats.accepted.saturating_sub(stats.applied + stats.dropped_total());
        self.lost[Loss::HeldAtCrash.index()] += held;
        self.inc += 1;
        self.accepted_now = 0;
        self.applied_by_version.clear();
        let keys: Vec<_> = self.fates.iter().filter(|(_, f)| f.in_flight > 0).map(|(k, _)| *k).collect();
        for k in keys {
            self.update(k, |f| {
                f.in_flight = 0;
                f.lost = Some(Loss::ServerGone);
            });
        }
    }

    /// Contributions the current server accepted, by the network's count.
    pub fn accepted_now(&self) -> u64 {
        self.accepted_now
    }

    /// The workers' counters.
    pub fn workers(&self) -> &[WorkerStats] {
        &self.workers
    }

    /// The ledger now, with the current server's counters.
    pub fn ledger(&self, stats: &ServerStats) -> Result<Ledger, String> {
        let mut l = Ledger::from_server(stats)?;
        l.sent = self.workers.iter().map(|w| w.contributions).sum();
        l.applied += self.kept.applied;
        for (d, k) in l.dropped.iter_mut().zip(&self.kept.dropped) {
            *d += k;
        }
        l.in_flight = self.in_flight;
        l.lost = self.lost;
        if self.accepted_now != stats.accepted {
            return Err(format!(
                "ledger: the server counts {} accepted contributions, the network delivered {} that it accepted",
                stats.accepted, self.accepted_now
            ));
        }
        Ok(l)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_ledger_balances_only_when_every_contribution_is_accounted_for() {
        let mut l = Ledger { sent: 10, accepted: 7, applied: 5, held: 1, in_flight: 1, ..Ledger::default() };
        l.add_dropped(DropReason::Stale, 1);
        l.add_lost(Loss::Network, 2);
        assert_eq!(l.check(), Ok(()));
        assert_eq!(l.line(), "sent 10 = applied 5 + dropped 1 (stale 1) + held 1 + in flight 1 + lost 2 (network 2)");
        l.sent = 11;
        assert!(l.check().unwrap_err().contains("sent 11 != applied 5"));
        let stats = ServerStats { accepted: 3, applied: 3, dropped: [1, 0, 0, 0, 0], ..ServerStats::default() };
        assert!(Ledger::from_server(&stats).is_err(), "more outcomes than accepted");
    }

    #[test]
    fn the_tracker_follows_copies_to_their_fate() {
        let v = [1.0, 2.0];
        let g = |seq| ToServer::Grad {
            base: syncopate::Version(0),
            iteration: 1,
            seq,
            values: syncopate::Values::Slice(&v),
            loss: None,
        };
        let mut t = Tracker::new(2);
        let stats = |accepted, applied| ServerStats { accepted, applied, ..ServerStats::default() };
        // Worker 0 sends seq 1 twice (a duplicate copy on the wire), worker 1 sends seq 1 and loses it.
        t.worker_sent(0, &g(1));
        t.copy_sent(0, 1, &g(1));
        t.copy_sent(0, 1, &g(1));
        t.worker_sent(1, &g(1));
        t.copy_lost(1, 1, &g(1), Loss::Network);
        let l = t.ledger(&stats(0, 0)).unwrap();
        assert_eq!((l.sent, l.in_flight, l.lost_for(Loss::Network)), (2, 1, 1));
        l.check().unwrap();
        t.copy_handled(0, 1, &g(1), Ok(()));
        t.copy_handled(0, 1, &g(1), Err(Reject::Duplicate { worker: syncopate::WorkerId(0), seq: 1 }));
        let l = t.ledger(&stats(1, 0)).unwrap();
        assert_eq!((l.held, l.in_flight, l.lost_for(Loss::Refused)), (1, 0, 0));
        l.check().unwrap();
        assert!(t.ledger(&stats(2, 0)).is_err(), "the server counts an acceptance the network did not deliver");
        // The server applies it in version 1, then restarts from a checkpoint at version 0.
        t.event(&syncopate::ServerEvent::Applied {
            worker: syncopate::WorkerId(0),
            base: syncopate::Version(0),
            version: syncopate::Version(1),
            staleness: 0,
            weight: 1.0,
        });
        t.server_restarted(&stats(1, 1), 0);
        let l = t.ledger(&ServerStats::default()).unwrap();
        assert_eq!((l.applied, l.lost_for(Loss::RolledBack)), (0, 1));
        l.check().unwrap();
    }
}
