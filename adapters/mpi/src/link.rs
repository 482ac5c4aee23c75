//! One rank's MPI endpoint: non-blocking sends that keep receiving while in flight, and
//! non-blocking receives of whole messages into pooled buffers.

use mpi::datatype::Equivalence;
use mpi::point_to_point::{Destination, Source};
use mpi::request::Request;
use mpi::topology::{Communicator, Rank, SimpleCommunicator};
use std::collections::VecDeque;
use std::time::{Duration, Instant};

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
    queued: VecDeque<Incoming>,
    pool: Vec<Vec<u8>>,
    /// Messages with an unknown tag (from a foreign program sharing the communicator).
    pub(crate) unknown: u64,
}

impl Link {
    pub(crate) fn new(world: SimpleCommunicator) -> Self {
        Self { world, queued: VecDeque::new(), pool: Vec::new(), unknown: 0 }
    }

    pub(crate) fn rank(&self) -> Rank {
        self.world.rank()
    }

    pub(crate) fn size(&self) -> Rank {
        self.world.size()
    }

    fn receiver(&mut self) -> Receiver<'_> {
        Receiver { world: &self.world, queued: &mut self.queued, pool: &mut self.pool, unknown: &mut self.unknown }
    }

    /// The next message: one queued while a send was in flight, or one just arrived.
    fn next(&mut self) -> Option<Incoming> {
        if self.queued.is_empty() {
            self.receiver().receive_one();
        }
        self.queued.pop_front()
    }

    /// Waits until a message arrives or `deadline` passes. Spins briefly, then yields, then
    /// naps: an idle rank must not starve computing ranks sharing its cores.
    pub(crate) fn recv_until(&mut self, deadline: Instant) -> Option<Incoming> {
        let start = Instant::now();
        loop {
            if let Some(m) = self.next() {
                return Some(m);
            }
            let now = Instant::now();
            if now >= deadline {
                return None;
            }
            let idle = now.duration_since(start);
            if idle < Duration::from_micros(50) {
                std::hint::spin_loop();
            } else if idle < Duration::from_millis(2) {
                std::thread::yield_now();
            } else {
                std::thread::sleep(Duration::from_micros(100).min(deadline.saturating_duration_since(now)));
            }
        }
    }

    /// Returns a message's buffer to the pool.
    pub(crate) fn recycle(&mut self, m: Incoming) {
        self.pool.push(m.bytes);
    }

    /// Sends `bytes` to every rank in `to` with one `MPI_Isend` each from the same buffer,
    /// and returns once all have completed; meanwhile it keeps receiving (messages are
    /// queued for [`Link::recv_until`]), so peers that send to this rank at the same time
    /// never deadlock with it.
    pub(crate) fn send(&mut self, to: &[Rank], kind: Kind, bytes: &[u8]) {
        let mut receiver = self.receiver();
        let world = receiver.world;
        mpi::request::scope(|scope| {
            let mut pending: Vec<Request<'_, [u8], _>> = to
                .iter()
                .map(|r| world.process_at_rank(*r).immediate_send_with_tag(scope, bytes, kind.tag()))
                .collect();
            let mut spins = 0u32;
            while !pending.is_empty() {
                pending = pending.into_iter().filter_map(|r| r.test().err()).collect();
                if pending.is_empty() {
                    break;
                }
                if receiver.receive_one() {
                    spins = 0;
                } else {
                    spins += 1;
                    backoff(spins);
                }
            }
        });
    }
}

/// The receive half of a [`Link`], usable while a send borrows the rest.
struct Receiver<'a> {
    world: &'a SimpleCommunicator,
    queued: &'a mut VecDeque<Incoming>,
    pool: &'a mut Vec<Vec<u8>>,
    unknown: &'a mut u64,
}

impl Receiver<'_> {
    /// Receives one message if one has arrived (`MPI_Improbe`, then `MPI_Mrecv` of exactly
    /// its bytes into a pooled buffer) and queues it; false if none had arrived.
    fn receive_one(&mut self) -> bool {
        let Some((message, status)) = self.world.any_process().immediate_matched_probe() else {
            return false;
        };
        let len = usize::try_from(status.count(u8::equivalent_datatype())).unwrap_or(0);
        let mut bytes = self.pool.pop().unwrap_or_default();
        // Every byte is overwritten by the receive; resize only fixes the length.
        bytes.resize(len, 0);
        message.matched_receive_into(&mut bytes[..]);
        match Kind::from_tag(status.tag()) {
            Some(kind) => self.queued.push_back(Incoming { from: status.source_rank(), kind, bytes }),
            None => {
                *self.unknown += 1;
                self.pool.push(bytes);
            }
        }
        true
    }
}

fn backoff(spins: u32) {
    if spins < 64 {
        std::hint::spin_loop();
    } else if spins < 4096 {
        std::thread::yield_now();
    } else {
        std::thread::sleep(Duration::from_micros(50));
    }
}
