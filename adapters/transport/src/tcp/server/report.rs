//! What a run reports: its outcome, counters and loss curve.

use super::options::StopReason;
use syncopate::{ServerStats, Version, WorkerId};

/// The outcome of a run.
#[derive(Clone, Debug, PartialEq)]
pub struct ServerReport {
    /// Why it ended.
    pub reason: StopReason,
    /// The final model version.
    pub version: Version,
    /// The final model.
    pub params: Vec<f32>,
    /// The protocol's counters.
    pub stats: ServerStats,
    /// Seconds the run took, from the moment every worker had connected (or, if some never
    /// did, from the start).
    pub wall_s: f64,
    /// Seconds from the start until every worker had connected (`None` if some never did).
    pub connect_wait_s: Option<f64>,
    /// Per worker, in id order: seconds from a model's dispatch to the worker until its next
    /// gradient arrived, summed (compute time as the server sees it, network included).
    pub busy_s: Vec<f64>,
    /// Staleness of applied contributions: sum, count, max.
    pub staleness: (u64, u64, u64),
    /// `Stalled` events.
    pub stalls: u64,
    /// The last stall: the worker waited for and how many were missing.
    pub last_stall: Option<(WorkerId, u32)>,
    /// Messages refused (undecodable or refused by the protocol).
    pub refused: u64,
    /// Contributions refused for holding NaN, ±∞ or an overflowing norm (the first ends the
    /// run as [`StopReason::Diverged`]).
    pub refused_not_finite: u64,
    /// Per worker, in id order: contributions refused for a loss that is not finite.
    pub refused_loss_not_finite: Vec<u64>,
    /// Contributions per worker (applied or dropped), in id order.
    pub per_worker: Vec<u64>,
    /// Sessions established.
    pub sessions: u64,
    /// Workers declared lost.
    pub lost: u64,
    /// Handshakes refused or failed.
    pub handshake_failures: u64,
    /// Unverified connections evicted to make room for new ones.
    pub evicted: u64,
    /// Checkpoints written.
    pub checkpoints: u64,
    /// Conservation ledger: contributions (gradients, deltas, clock updates) read from the
    /// workers' current sessions and handed to the protocol (each is then accepted or
    /// refused).
    pub received: u64,
    /// Of [`Self::received`], those the protocol refused (duplicates, stale sessions…).
    pub refused_contributions: u64,
    /// Contributions read from a session that had already been replaced or cut (lost with
    /// the connection; the protocol never sees them).
    pub discarded: u64,
    /// Contributions that arrived after the run stopped (in flight at the stop).
    pub in_flight_at_stop: u64,
    /// Of [`Self::received`], those read from their session's shared-memory slot
    /// ([`shm`](crate::tcp::shm)) instead of its socket.
    pub via_shared_memory: u64,
    /// The same four counts per session (connection), in the order sessions began.
    pub session_ledgers: Vec<SessionLedger>,
    /// The loss curve: for every update whose contributions reported minibatch losses,
    /// the version it made, the seconds since the run's clock started, and the mean of those
    /// losses, in update order. Updates made before the clock started (while the last
    /// workers connect, under a protocol that trains with the workers it has) are not in it.
    pub loss_curve: Vec<LossPoint>,
    /// False only for a server that waited for worker 0's initial parameters
    /// ([`TcpServer::run_with_initial_from_worker`](super::TcpServer::run_with_initial_from_worker))
    /// and never got them: its `params` are then no model at all.
    pub initial_model_known: bool,
    /// The straggler report, per worker in id order: its median step time, its ratio to
    /// the median worker, and its contributions applied, dropped and held (see
    /// [`straggler_lines`](super::straggler_lines)).
    pub stragglers: Vec<WorkerRow>,
}

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

/// One point of [`ServerReport::loss_curve`].
#[derive(Clone, Copy, Debug, PartialEq, serde::Serialize)]
pub struct LossPoint {
    /// The version the update made.
    pub version: u64,
    /// Seconds since the run's clock started (every worker connected), when it was applied.
    pub t_s: f64,
    /// The mean minibatch loss its contributions reported.
    pub loss: f32,
}

impl ServerReport {
    /// The report of a run of `n` workers at `version` before anything happened.
    pub(super) fn empty(n: usize, version: Version) -> Self {
        Self {
            reason: StopReason::Budget,
            version,
            params: Vec::new(),
            stats: ServerStats::default(),
            wall_s: 0.0,
            connect_wait_s: None,
            busy_s: vec![0.0; n],
            staleness: (0, 0, 0),
            stalls: 0,
            last_stall: None,
            refused: 0,
            refused_not_finite: 0,
            refused_loss_not_finite: vec![0; n],
            per_worker: vec![0; n],
            sessions: 0,
            lost: 0,
            handshake_failures: 0,
            evicted: 0,
            checkpoints: 0,
            received: 0,
            refused_contributions: 0,
            discarded: 0,
            in_flight_at_stop: 0,
            via_shared_memory: 0,
            session_ledgers: Vec::new(),
            loss_curve: Vec::new(),
            initial_model_known: true,
            stragglers: Vec::new(),
        }
    }
}

/// One worker's row of the straggler report.
#[derive(Clone, Copy, Debug, PartialEq, serde::Serialize)]
pub struct WorkerRow {
    /// The worker.
    pub worker: u32,
    /// Step times it reported over the run.
    pub steps: u64,
    /// The median of its newest step times (64), in seconds (`None`: it reported none).
    pub median_step_s: Option<f64>,
    /// Its median over the median worker's (`None` without step times).
    pub ratio: Option<f64>,
    /// Its contributions applied to the model.
    pub applied: u64,
    /// Its contributions the protocol dropped (stale, late, superseded, from a lost
    /// session).
    pub dropped: u64,
    /// Its contributions accepted and neither applied nor dropped.
    pub held: u64,
}
