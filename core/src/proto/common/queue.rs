//! Fixed-capacity output queues. Items are small descriptors; payloads are borrowed from the
//! state machine's buffers only when an item is polled, so queuing a model broadcast costs
//! no copy.

use crate::error::Reject;
use crate::id::{ComputeId, MAX_WORKERS, Version, WorkerId};
use crate::msg::{ToServer, ToWorker, Values};
use crate::proto::{Recipient, ServerEvent, ServerOutput, WorkerEvent, WorkerOutput};
use heapless::Deque;

/// Capacity of a server's output queue: one event and one message per worker, plus slack.
pub(crate) const SERVER_QUEUE: usize = 4 * MAX_WORKERS + 16;
/// Capacity of a worker's output queue.
pub(crate) const WORKER_QUEUE: usize = 16;

/// A server output before its payload is attached.
#[derive(Clone, Copy, Debug)]
pub(crate) enum ServerItem {
    /// The current model (version, clock and params read at poll time).
    Model {
        to: Recipient,
    },
    NotNewer {
        to: WorkerId,
        version: Version,
    },
    PushAck {
        to: WorkerId,
        round: Version,
        pull_now: bool,
    },
    Abort {
        to: WorkerId,
        iteration: u64,
    },
    Stop,
    Event(ServerEvent),
}

/// A server's pending outputs.
#[derive(Debug)]
pub(crate) struct ServerQueue {
    items: Deque<ServerItem, SERVER_QUEUE>,
    /// Pushes that found the queue full (never expected: see [`Self::push`]).
    lost: u64,
}

impl ServerQueue {
    pub(crate) const fn new() -> Self {
        Self { items: Deque::new(), lost: 0 }
    }

    /// Queues `item`. Every input is screened first with [`Self::ensure_room`] for the most
    /// outputs it can produce (each protocol's `burst`, proven by the capacity tests at
    /// `n = MAX_WORKERS`), and refused with [`Reject::Capacity`] before any state changes
    /// when there is not room; so a push cannot find the queue full. Should it ever, the
    /// output is counted in [`ServerStats::outputs_lost`](crate::proto::ServerStats) rather
    /// than dropped silently, and the tests fail on any count but zero.
    #[inline]
    pub(crate) fn push(&mut self, item: ServerItem) {
        if self.items.push_back(item).is_err() {
            self.lost += 1;
        }
    }

    /// Outputs that found the queue full.
    pub(crate) fn lost(&self) -> u64 {
        self.lost
    }

    /// Refuses new input while there is not room for a full burst (n events + n messages).
    #[inline]
    pub(crate) fn ensure_room(&self, burst: usize) -> Result<(), Reject> {
        if SERVER_QUEUE - self.items.len() >= burst { Ok(()) } else { Err(Reject::Capacity) }
    }

    #[inline]
    pub(crate) fn poll<'a, T>(&mut self, version: Version, clock: u64, params: &'a [T]) -> Option<ServerOutput<'a, T>> {
        let item = self.items.pop_front()?;
        // Events first: most outputs are events, and a two-way branch predicts better than
        // the jump table a six-way match compiles to.
        if let ServerItem::Event(e) = item {
            return Some(ServerOutput::Event(e));
        }
        Some(match item {
            ServerItem::Model { to } => {
                ServerOutput::Send { to, msg: ToWorker::Model { version, clock, values: Values::Slice(params) } }
            }
            ServerItem::NotNewer { to, version } => {
                ServerOutput::Send { to: Recipient::Worker(to), msg: ToWorker::NotNewer { version } }
            }
            ServerItem::PushAck { to, round, pull_now } => {
                ServerOutput::Send { to: Recipient::Worker(to), msg: ToWorker::PushAck { round, pull_now } }
            }
            ServerItem::Abort { to, iteration } => {
                ServerOutput::Send { to: Recipient::Worker(to), msg: ToWorker::Abort { iteration } }
            }
            ServerItem::Stop => ServerOutput::Send { to: Recipient::AllWorkers, msg: ToWorker::Stop },
            ServerItem::Event(e) => ServerOutput::Event(e),
        })
    }
}

/// A worker output before its payload is attached.
#[derive(Clone, Copy, Debug)]
pub(crate) enum WorkerItem {
    Join {
        epoch: u32,
    },
    /// Payload: the worker's outgoing buffer.
    Grad {
        base: Version,
        iteration: u64,
        seq: u64,
    },
    /// Payload: the worker's outgoing buffer.
    Delta {
        round: Version,
        local_steps: u32,
        seq: u64,
    },
    Pull {
        have: Version,
        min_clock: u64,
    },
    /// Payload: the worker's outgoing buffer.
    Clock {
        clock: u64,
        seq: u64,
    },
    /// Params: the worker's model buffer.
    Compute {
        id: ComputeId,
        version: Version,
    },
    Event(WorkerEvent),
}

/// A worker's pending outputs.
#[derive(Debug)]
pub(crate) struct WorkerQueue {
    items: Deque<WorkerItem, WORKER_QUEUE>,
    /// Pushes that found the queue full (never expected: see [`Self::push`]).
    lost: u64,
}

impl WorkerQueue {
    pub(crate) const fn new() -> Self {
        Self { items: Deque::new(), lost: 0 }
    }

    /// Queues `item`. A worker checks [`Self::ensure_room`] for the few outputs an input can
    /// produce before it changes any state, so a push cannot find the queue full; should it
    /// ever, the output is counted ([`Worker::outputs_lost`](crate::proto::Worker)), never
    /// dropped silently.
    #[inline]
    pub(crate) fn push(&mut self, item: WorkerItem) {
        if self.items.push_back(item).is_err() {
            self.lost += 1;
        }
    }

    /// Outputs that found the queue full.
    pub(crate) fn lost(&self) -> u64 {
        self.lost
    }

    pub(crate) fn ensure_room(&self, burst: usize) -> Result<(), Reject> {
        if WORKER_QUEUE - self.items.len() >= burst { Ok(()) } else { Err(Reject::Capacity) }
    }

    /// Attaches payloads: `params` for `Compute`, `outgoing` for tensors sent to the server.
    pub(crate) fn poll<'a, T>(&mut self, params: &'a [T], outgoing: &'a [T]) -> Option<WorkerOutput<'a, T>> {
        let item = self.items.pop_front()?;
        Some(match item {
            WorkerItem::Join { epoch } => WorkerOutput::Send(ToServer::Join { epoch }),
            WorkerItem::Grad { base, iteration, seq } => {
                WorkerOutput::Send(ToServer::Grad { base, iteration, seq, values: Values::Slice(outgoing) })
            }
            WorkerItem::Delta { round, local_steps, seq } => {
                WorkerOutput::Send(ToServer::Delta { round, local_steps, seq, values: Values::Slice(outgoing) })
            }
            WorkerItem::Pull { have, min_clock } => WorkerOutput::Send(ToServer::Pull { have, min_clock }),
            WorkerItem::Clock { clock, seq } => {
                WorkerOutput::Send(ToServer::Clock { clock, seq, values: Values::Slice(outgoing) })
            }
            WorkerItem::Compute { id, version } => WorkerOutput::Compute { id, version, params },
            WorkerItem::Event(e) => WorkerOutput::Event(e),
        })
    }
}
