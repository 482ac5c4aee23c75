//! One rank's MPI endpoint: non-blocking sends ([`Outbox`]) that never wait for their
//! recipient, and non-blocking receives of whole messages into pooled buffers.

use crate::outbox::Outbox;
use mpi::datatype::Equivalence;
use mpi::point_to_point::Source;
use mpi::topology::{Communicator, Rank, SimpleCommunicator};
use std::time::{Duration, Instant};

/// How long a waiting rank polls without pause before it naps between polls.
const POLL_FOR: Duration = Duration::from_micros(30);

/// The nap between polls of a waiting rank (the kernel's timer slack, 50 µs by default,
/// comes on top).
const NAP: Duration = Duration::from_micros(20);

/// Message tags: what a message carries.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Kind {
    /// A protocol message in the core's wire format.
    Wire,
    /// A worker's heartbeat (no payload).
    Heartbeat,
    /// A worker's final [`crate::Tally`].
    Tally,
}

impl Kind {
    fn tag(self) -> mpi::Tag {
        match self {
            Self::Wire => 1,
            Self::Heartbeat => 2,
            Self::Tally => 3,
        }
    }

    fn from_tag(tag: mpi::Tag) -> Option<Self> {
        [Self::Wire, Self::Heartbeat, Self::Tally].into_iter().find(|k| k.tag() == tag)
    }
}

/// A received message; give its buffer back with [`Link::recycle`].
#[derive(Debug)]
pub(crate) struct Incoming {
    pub(crate) from: Rank,
    pub(crate) kind: Kind,
    pub(crate) bytes: Vec<u8>,
}

/// One rank's endpoint on `world`.
pub(crate) struct Link {
    world: SimpleCommunicator,
    outbox: Outbox,
    pool: Vec<Vec<u8>>,
    /// Messages with an unknown tag (from a foreign program sharing the communicator).
    pub(crate) unknown: u64,
}

impl Link {
    pub(crate) fn new(world: SimpleCommunicator) -> Self {
        Self { world, outbox: Outbox::default(), pool: Vec::new(), unknown: 0 }
    }

    pub(crate) fn rank(&self) -> Rank {
        self.world.rank()
    }

    pub(crate) fn size(&self) -> Rank {
        self.world.size()
    }

    /// A buffer to encode the next message into (reused once its sends completed).
    pub(crate) fn buffer(&mut self) -> Vec<u8> {
        self.outbox.buffer()
    }

    /// Starts sending `bytes` to every rank of `to` (one `MPI_Isend` each, all from the
    /// same buffer) and returns at once.
    pub(crate) fn send(&mut self, to: &[Rank], kind: Kind, bytes: Vec<u8>) {
        self.outbox.send(&self.world, to, kind.tag(), bytes);
    }

    /// Gives up on the sends still in flight to a lost rank.
    pub(crate) fn abandon(&mut self, rank: Rank) {
        self.outbox.abandon(rank);
    }

    /// Receives one message if one has arrived: `MPI_Improbe`, then `MPI_Mrecv` of exactly
    /// its bytes into a pooled buffer.
    fn try_receive(&mut self) -> Option<Incoming> {
        let (message, status) = self.world.any_process().immediate_matched_probe()?;
        let len = usize::try_from(status.count(u8::equivalent_datatype())).unwrap_or(0);
        let mut bytes = self.pool.pop().unwrap_or_default();
        // Every byte is overwritten by the receive; resize only fixes the length.
        bytes.resize(len, 0);
        message.matched_receive_into(&mut bytes[..]);
        match Kind::from_tag(status.tag()) {
            Some(kind) => Some(Incoming { from: status.source_rank(), kind, bytes }),
            None => {
                self.unknown += 1;
                self.pool.push(bytes);
                None
            }
        }
    }

    /// Waits until a message arrives or `deadline` passes, driving the sends in flight
    /// meanwhile. Polls for [`POLL_FOR`], then naps [`NAP`] between polls: a waiting rank
    /// leaves the cores to the ranks with work. A parameter server runs n + 1 ranks, often
    /// on fewer cores (2 here), and a round alternates between the workers' work and the
    /// server's; a rank that polls on (even yielding, as MPI's own blocking calls do when
    /// oversubscribed) takes up to half a core from the one the round waits for, while a
    /// nap costs at most ~70 µs of latency per message (nap plus timer slack).
    pub(crate) fn recv_until(&mut self, deadline: Instant) -> Option<Incoming> {
        let start = Instant::now();
        loop {
            self.outbox.progress();
            if let Some(m) = self.try_receive() {
                return Some(m);
            }
            let now = Instant::now();
            if now >= deadline {
                return None;
            }
            if now.duration_since(start) < POLL_FOR {
                std::hint::spin_loop();
            } else {
                std::thread::sleep(NAP.min(deadline.saturating_duration_since(now)));
            }
        }
    }

    /// Drives the sends in flight until all completed or `deadline` passed; messages that
    /// arrive meanwhile are received and dropped (the run is over). True if all completed.
    pub(crate) fn flush(&mut self, deadline: Instant) -> bool {
        while self.outbox.progress() > 0 {
            if Instant::now() >= deadline {
                return false;
            }
            if let Some(m) = self.try_receive() {
                self.recycle(m);
            } else {
                std::thread::sleep(Duration::from_micros(50));
            }
        }
        true
    }

    /// Returns a message's buffer to the pool.
    pub(crate) fn recycle(&mut self, m: Incoming) {
        self.pool.push(m.bytes);
    }
}
