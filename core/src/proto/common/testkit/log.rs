//! What the test network records: every [`Entry`] of a run in order, why a message was lost
//! ([`CopyLoss`]), and the totals of what it injected ([`NetCounts`]).

use super::{ToServerOwned, ToWorkerOwned};
use crate::error::Reject;
use crate::proto::{Recipient, ServerEvent};
use std::vec::Vec;

/// One thing that happened, in order.
#[derive(Clone, Debug, PartialEq)]
pub enum Entry {
    /// Worker `worker` was asked for its `k`-th gradient at `params` (model `version`).
    Compute {
        /// The worker.
        worker: usize,
        /// Computations it finished before.
        k: u64,
        /// The version it named.
        version: u64,
        /// The worker's iteration probe at that moment (see
        /// [`Cluster::with_probes`](super::Cluster::with_probes)).
        iteration: u64,
        /// The parameters.
        params: Vec<f64>,
        /// Per worker, the contributions applied in the last model this worker took
        /// (`None` before its first model, or
        /// [`Cluster::without_snapshots`](super::Cluster::without_snapshots)).
        snap: Option<Vec<u64>>,
        /// Per worker, computations finished so far (empty with
        /// [`Cluster::without_snapshots`](super::Cluster::without_snapshots)).
        done: Vec<u64>,
    },
    /// Worker `worker` (session `epoch`) sent `msg` (before the network's faults).
    Up {
        /// The worker.
        worker: usize,
        /// Its session epoch.
        epoch: u32,
        /// The message.
        msg: ToServerOwned,
    },
    /// The server handled `msg` from `worker` at version `before`.
    ServerIn {
        /// The sender.
        worker: usize,
        /// The sender's session epoch when it sent it.
        epoch: u32,
        /// The message.
        msg: ToServerOwned,
        /// The server's version before.
        before: u64,
        /// What `handle` answered.
        result: Result<(), Reject>,
    },
    /// The server sent `msg` to `to`.
    Sent {
        /// The recipient.
        to: Recipient,
        /// The message.
        msg: ToWorkerOwned,
    },
    /// The server reported an event.
    Event(ServerEvent),
    /// The server's probe (its version unless
    /// [`Cluster::with_probes`](super::Cluster::with_probes)) moved to `tick`; the model at
    /// that moment.
    Tick {
        /// The new probe value.
        tick: u64,
        /// The model.
        params: Vec<f64>,
    },
    /// A worker refused a message.
    WorkerRefused {
        /// The worker.
        worker: usize,
        /// The message.
        msg: ToWorkerOwned,
        /// Why.
        reason: Reject,
    },
    /// The server was told `worker` is lost (a crash, or [`Cluster::lose`](super::Cluster::lose)).
    Lost {
        /// The worker.
        worker: usize,
    },
    /// A new server replaced the old one
    /// ([`Cluster::restart_server`](super::Cluster::restart_server)).
    ServerRestarted,
    /// The network put one copy of `msg` (logged before as [`Entry::Up`]) on the wire to the
    /// server; a duplicated message has two.
    UpCopy {
        /// The sender.
        worker: usize,
        /// The sender's session epoch.
        epoch: u32,
        /// The message.
        msg: ToServerOwned,
    },
    /// The network lost `msg` (logged before as [`Entry::Up`]) before it left: no copy is on
    /// the wire.
    UpLost {
        /// The sender.
        worker: usize,
        /// The sender's session epoch.
        epoch: u32,
        /// The message.
        msg: ToServerOwned,
        /// Why.
        cause: CopyLoss,
    },
    /// The server sent `msg` to the server above it. The cluster has no upstream server:
    /// the message is logged here and goes nowhere (a server with an upstream needs a
    /// harness that wires one).
    ToUpstream(ToServerOwned),
    /// A copy of `msg` arrived after the server it was sent to was replaced
    /// ([`Cluster::restart_server`](super::Cluster::restart_server)): no server handled it.
    UpMissed {
        /// The sender.
        worker: usize,
        /// The sender's session epoch.
        epoch: u32,
        /// The message.
        msg: ToServerOwned,
    },
}

/// Why the network lost a message ([`Entry::UpLost`]).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum CopyLoss {
    /// The loss fault ([`Faults::loss`](super::Faults::loss)).
    Dropped,
    /// A one-way partition of the link ([`Faults::partition`](super::Faults::partition)).
    Partition,
}

/// What the network injected.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct NetCounts {
    /// Events handled.
    pub steps: u64,
    /// Messages sent.
    pub sent: u64,
    /// Messages lost (faults and partitions).
    pub lost: u64,
    /// Extra copies delivered.
    pub duplicated: u64,
    /// Messages given a delay spike.
    pub delayed: u64,
    /// One-way partitions started.
    pub partitions: u64,
    /// Worker crashes.
    pub crashes: u64,
    /// Server restarts.
    pub server_restarts: u64,
}

impl NetCounts {
    /// Adds `o` into `self` (totals over several runs).
    pub fn add(&mut self, o: &Self) {
        self.steps += o.steps;
        self.sent += o.sent;
        self.lost += o.lost;
        self.duplicated += o.duplicated;
        self.delayed += o.delayed;
        self.partitions += o.partitions;
        self.crashes += o.crashes;
        self.server_restarts += o.server_restarts;
    }
}
