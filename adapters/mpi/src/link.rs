//! One rank's MPI endpoint: non-blocking sends ([`Outbox`]) that never wait for their
//! recipient, and non-blocking receives of whole messages into pooled buffers.

use crate::outbox::Outbox;
use mpi::datatype::Equivalence;
use mpi::point_to_point::Source;
use mpi::topology::{Communicator, Rank, SimpleCommunicator};
use std::time::{Duration, Instant};

/// How long a waiting rank on an oversubscribed node polls without pause before it naps
/// between polls.
const POLL_FOR: Duration = Duration::from_micros(30);

/// How long a waiting rank that has a core of its own polls before it naps between polls
/// (so that a rank waiting long, for a straggler, leaves the core to others).
const POLL_FOR_ALONE: Duration = Duration::from_millis(20);

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

/// Whether this node runs more ranks than it has cores: OpenMPI's own verdict when mpirun
/// gives one (`OMPI_MCA_mpi_oversubscribe`, the criterion of its `mpi_yield_when_idle`),
/// else the ranks on this node (`MPI_Comm_split_type(MPI_COMM_TYPE_SHARED)`, collective)
/// against the cores this rank may use.
fn oversubscribed(world: &SimpleCommunicator) -> bool {
    let on_node = usize::try_from(world.split_shared(world.rank()).size()).unwrap_or(usize::MAX);
    match std::env::var("OMPI_MCA_mpi_oversubscribe").as_deref() {
        Ok("1") => true,
        Ok("0") => false,
        _ => on_node > std::thread::available_parallelism().map_or(1, core::num::NonZero::get),
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
    /// How long a wait polls before it naps between polls: [`POLL_FOR`] when this node runs
    /// more ranks than it has cores, else [`POLL_FOR_ALONE`].
    poll_for: Duration,
    /// Messages with an unknown tag (from a foreign program sharing the communicator).
    pub(crate) unknown: u64,
}

impl Link {
    /// The endpoint of this rank. Collective: every rank of `world` calls it once, at the
    /// start (see [`oversubscribed`]).
    pub(crate) fn new(world: SimpleCommunicator) -> Self {
        let poll_for = if oversubscribed(&world) { POLL_FOR } else { POLL_FOR_ALONE };
        Self { world, outbox: Outbox::default(), pool: Vec::new(), poll_for, unknown: 0 }
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
    /// meanwhile. Polls, then naps [`NAP`] between polls. On a node with more ranks than
    /// cores it polls only [`POLL_FOR`], so a waiting rank leaves the cores to the ranks
    /// with work: a parameter server runs n + 1 ranks, and a round alternates between the
    /// workers' work and the server's; a rank that polls on (even yielding, as MPI's own
    /// blocking calls do when oversubscribed) takes up to half a core from the one the round
    /// waits for, while a nap costs at most ~70 µs of latency per message (nap plus timer
    /// slack). A rank with a core of its own polls for [`POLL_FOR_ALONE`] first.
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
            if now.duration_since(start) < self.poll_for {
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
