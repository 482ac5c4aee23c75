//! What a server rank reports at the end of a run, and why the run ended.

use crate::Tally;
use crate::ledger::ShardLedger;
use syncopate::{ServerStats, Version, WorkerId};

/// Why the server ended the run.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum StopReason {
    /// The gradient budget was reached.
    Budget,
    /// The time limit passed.
    TimeLimit,
    /// Every worker rank was lost.
    AllWorkersLost,
    /// Every live worker stopped (it sent its final tally): another shard ended the run.
    WorkersDone,
    /// The shard of this index (its rank) fell silent: the run stops.
    ShardLost(u32),
}

/// The outcome of a run at a server rank.
#[derive(Clone, Debug)]
pub struct ServerReport {
    /// Why the run ended.
    pub reason: StopReason,
    /// The final model version (with shards, the lowest of the shards').
    pub version: Version,
    /// The final model (at rank 0 of a sharded run, assembled from every shard's slice; at
    /// another shard, its slice).
    pub params: Vec<f32>,
    /// The server's counters (at rank 0 of a sharded run, summed over the shards).
    pub stats: ServerStats,
    /// Staleness of each applied contribution: sum, count and maximum.
    pub staleness: (u64, u64, u64),
    /// Stall reports the server made.
    pub stalls: u64,
    /// Inputs refused (undecodable, refused by the protocol, or from a lost rank).
    pub refused: u64,
    /// Wall-clock seconds from the start of the loop to the stop.
    pub wall_s: f64,
    /// Each worker's tally (`None`: its rank was lost, or its tally did not arrive).
    pub workers: Vec<Option<Tally>>,
    /// Workers declared lost, in the order they were.
    pub lost: Vec<WorkerId>,
    /// Workers that rejoined after being declared lost, in the order they did.
    pub rejoined: Vec<WorkerId>,
    /// The ledger of every shard whose report arrived (one entry without shards), in
    /// shard order.
    pub shards: Vec<ShardLedger>,
    /// Per model update whose contributions reported losses: the version, the seconds since
    /// the loop started and the mean reported loss (this shard's updates; every shard's
    /// workers report the whole model's loss).
    pub loss_curve: Vec<(u64, f64, f32)>,
}

impl ServerReport {
    /// The report of a run of `workers` workers before it starts: nothing counted yet.
    pub(crate) fn empty(workers: usize) -> Self {
        Self {
            reason: StopReason::Budget,
            version: Version::ZERO,
            params: Vec::new(),
            stats: ServerStats::default(),
            staleness: (0, 0, 0),
            stalls: 0,
            refused: 0,
            wall_s: 0.0,
            workers: vec![None; workers],
            lost: Vec::new(),
            rejoined: Vec::new(),
            shards: Vec::new(),
            loss_curve: Vec::new(),
        }
    }
}
