//! One rank's MPI endpoint: non-blocking sends ([`Outbox`]) that never wait for their
//! recipient, and non-blocking receives of whole messages into pooled buffers.
//!
//! A message with a large tensor crosses as two MPI messages from the same sender: its head
//! (the wire header and control section, tag [`Kind::Head`]), then its payload (tag
//! [`Kind::Payload`]), so that each side reads or writes the tensor where it lives: the
//! server sends a model's payload from its encoded message, a worker sends its gradient from
//! the buffer it was computed in, and a worker receives a model's payload straight into the
//! buffer it computes from. MPI matches messages from one sender in the order they were
//! sent, so the payload a receiver takes after a head is that head's. A receiver that does
//! not land the payload elsewhere appends it to the head, which gives the message's wire
//! bytes, decoded as any other (the codec refuses a payload of another length than the
//! header announces).

use crate::outbox::{Outbox, receive_floats};
use mpi::datatype::Equivalence;
use mpi::point_to_point::{Message, Source, Status};
use mpi::topology::{Communicator, Rank, SimpleCommunicator};
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};
use syncopate::wire::{self, MessageKind};

/// Tensors of at least this many bytes cross as a head and a payload (two messages); smaller
/// messages as one.
pub(crate) const SPLIT_MIN: usize = 1024;

/// How long a receiver waits for the payload after a head (the sender starts both sends in
/// one call, so it is already on its way).
const PAYLOAD_PATIENCE: Duration = Duration::from_secs(5);

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
    /// The head of a protocol message whose payload follows (see the module docs).
    Head,
    /// The payload of the previous [`Kind::Head`] from the same sender.
    Payload,
    /// A server's word to a rank it declared lost: start a new session with the epoch it
    /// carries (a `u32`, little-endian).
    Rejoin,
    /// Rank 0's word to the other shards: the shard it carries (a `u32`, little-endian) was
    /// lost, the run stops.
    ShardStop,
    /// A shard's final report to rank 0 ([`crate::ledger::ShardSummary`]).
    ShardReport,
}

impl Kind {
    fn tag(self) -> mpi::Tag {
        match self {
            Self::Wire => 1,
            Self::Heartbeat => 2,
            Self::Tally => 3,
            Self::Head => 4,
            Self::Payload => 5,
            Self::Rejoin => 6,
            Self::ShardStop => 7,
            Self::ShardReport => 8,
        }
    }

    fn from_tag(tag: mpi::Tag) -> Option<Self> {
        [
            Self::Wire,
            Self::Heartbeat,
            Self::Tally,
            Self::Head,
            Self::Payload,
            Self::Rejoin,
            Self::ShardStop,
            Self::ShardReport,
        ]
        .into_iter()
        .find(|k| k.tag() == tag)
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
    /// Never [`Kind::Head`] or [`Kind::Payload`]: a head and its payload come as one
    /// [`Kind::Wire`] message.
    pub(crate) kind: Kind,
    /// The message from `start` on; if `landed`, only its head (the payload is in the
    /// landing buffer).
    bytes: Vec<u8>,
    start: usize,
    /// The payload of this `Model` was received into the landing buffer given to
    /// [`Link::recv_until`], which it fills exactly.
    pub(crate) landed: bool,
}

impl Incoming {
    /// The message's bytes.
    pub(crate) fn message(&self) -> &[u8] {
        self.bytes.get(self.start..).unwrap_or_default()
    }
}

/// A received payload starts at a multiple of this in memory: the kernel's copy between
/// processes (CMA) is several times slower when source and destination are not aligned
/// alike, and every sender's tensor starts at an aligned address.
const PAYLOAD_ALIGN: usize = 64;

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

    /// Like [`Link::send`] of a [`Kind::Wire`] message, as a head (its first `head` bytes)
    /// and a payload (the rest).
    pub(crate) fn send_split(&mut self, to: &[Rank], bytes: Vec<u8>, head: usize) {
        self.outbox.send_split(&self.world, to, (Kind::Head.tag(), Kind::Payload.tag()), bytes, head);
    }

    /// Sends the head `head` of a wire message (whose header announces the payload's
    /// length) and then `payload` from its own buffer, which stays shared until the sends
    /// completed, to every rank of `to`. False if it was not sent.
    pub(crate) fn send_lent(&mut self, to: &[Rank], head: Vec<u8>, payload: std::sync::Arc<Vec<f32>>) -> bool {
        self.outbox.send_lent(&self.world, to, (Kind::Head.tag(), Kind::Payload.tag()), head, payload)
    }

    /// Gives up on the sends still in flight to a lost rank.
    pub(crate) fn abandon(&mut self, rank: Rank) {
        self.outbox.abandon(rank);
    }

    /// Receives one message if one has arrived: `MPI_Improbe`, then `MPI_Mrecv` of exactly
    /// its bytes into a pooled buffer; after a head, its payload too (into `landing` if it
    /// is a `Model` payload of exactly that length).
    fn try_receive(&mut self, landing: Option<&mut [f32]>) -> Option<Incoming> {
        let (message, status) = self.world.any_process().immediate_matched_probe()?;
        let (mut bytes, len) = self.receive_bytes(message, status);
        let from = status.source_rank();
        match Kind::from_tag(status.tag()) {
            Some(Kind::Head) => {
                let (start, landed) = self.receive_payload(from, &mut bytes, len, landing);
                Some(Incoming { from, kind: Kind::Wire, bytes, start, landed })
            }
            Some(
                kind
                @ (Kind::Wire | Kind::Heartbeat | Kind::Tally | Kind::Rejoin | Kind::ShardStop | Kind::ShardReport),
            ) => {
                bytes.truncate(len);
                Some(Incoming { from, kind, bytes, start: 0, landed: false })
            }
            // A payload without its head (the head's payload never came in time), or a tag
            // of another program sharing the communicator.
            Some(Kind::Payload) | None => {
                self.unknown += 1;
                self.pool.push(bytes);
                None
            }
        }
    }

    /// Receives the probed `message` into the first bytes of a pooled buffer; returns the
    /// buffer (not truncated: a head's payload goes after it, and a pooled buffer keeps
    /// the length of its last message, so that growing it again zero-fills nothing) and the
    /// message's length.
    fn receive_bytes(&mut self, message: Message, status: Status) -> (Vec<u8>, usize) {
        let len = usize::try_from(status.count(u8::equivalent_datatype())).unwrap_or(0);
        let mut bytes = self.pool.pop().unwrap_or_default();
        if bytes.len() < len {
            // Every byte up to `len` is overwritten by the receive; resize only fixes the length.
            bytes.resize(len, 0);
        }
        message.matched_receive_into(&mut bytes[..len]);
        (bytes, len)
    }

    /// Receives the payload that follows the head in `bytes[..head]` from `from`: into
    /// `landing` if the head is a `Model`'s announcing exactly its length (`bytes` is then
    /// cut to the head), else after the head in `bytes`, moved so that the payload starts at
    /// a multiple of [`PAYLOAD_ALIGN`]. Returns where the message starts in `bytes` and
    /// whether it landed. Gives up after [`PAYLOAD_PATIENCE`] (the head alone then fails to
    /// decode).
    fn receive_payload(
        &mut self,
        from: Rank,
        bytes: &mut Vec<u8>,
        head: usize,
        landing: Option<&mut [f32]>,
    ) -> (usize, bool) {
        let start = Instant::now();
        let (message, status) = loop {
            if let Some(m) = self.world.process_at_rank(from).immediate_matched_probe_with_tag(Kind::Payload.tag()) {
                break m;
            }
            let waited = start.elapsed();
            if waited > PAYLOAD_PATIENCE {
                bytes.truncate(head);
                return (0, false);
            }
            self.outbox.progress();
            // The same polling as `recv_until`: on an oversubscribed node the sender may need
            // this core to send the payload.
            if waited < self.poll_for {
                std::hint::spin_loop();
            } else {
                std::thread::sleep(NAP);
            }
        };
        let len = usize::try_from(status.count(u8::equivalent_datatype())).unwrap_or(0);
        let model = bytes.get(..head).and_then(|h| wire::peek_header(h).ok()).is_some_and(|h| {
            h.kind == MessageKind::Model && h.payload_len == len && h.control_len + wire::HEADER_LEN == head
        });
        if let Some(into) = landing.filter(|l| model && size_of_val(*l) == len) {
            bytes.truncate(head);
            return (0, receive_floats(message, into));
        }
        let room = PAYLOAD_ALIGN + head + len;
        if bytes.len() < room {
            // Every byte the message uses is written below; resize only fixes the length.
            bytes.resize(room, 0);
        }
        let pad = (PAYLOAD_ALIGN - (bytes.as_ptr() as usize + head) % PAYLOAD_ALIGN) % PAYLOAD_ALIGN;
        bytes.copy_within(..head, pad);
        let (at, end) = (pad + head, pad + head + len);
        message.matched_receive_into(&mut bytes[at..end]);
        bytes.truncate(end);
        (pad, false)
    }

    /// Waits until a message arrives or `deadline` passes, driving the sends in flight
    /// meanwhile. Polls, then naps [`NAP`] between polls. On a node with more ranks than
    /// cores it polls only [`POLL_FOR`], so a waiting rank leaves the cores to the ranks
    /// with work: a parameter server runs n + 1 ranks, and a round alternates between the
    /// workers' work and the server's; a rank that polls on (even yielding, as MPI's own
    /// blocking calls do when oversubscribed) takes up to half a core from the one the round
    /// waits for, while a nap costs at most [`NAP`] plus the kernel's timer slack of
    /// latency per message. A rank with a core of its own polls for [`POLL_FOR_ALONE`] first.
    ///
    /// A `Model` payload of exactly `landing`'s length is received into `landing` (see
    /// [`Incoming::landed`]). Returns `None` early, too, once `wake` is set (another thread
    /// of the rank has something for the loop).
    pub(crate) fn recv_until(
        &mut self,
        deadline: Instant,
        mut landing: Option<&mut [f32]>,
        wake: Option<&AtomicBool>,
    ) -> Option<Incoming> {
        let start = Instant::now();
        loop {
            self.outbox.progress();
            if let Some(m) = self.try_receive(landing.as_deref_mut()) {
                return Some(m);
            }
            let now = Instant::now();
            if now >= deadline || wake.is_some_and(|w| w.load(Ordering::Acquire)) {
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
            if let Some(m) = self.try_receive(None) {
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

/// Sets the payload length field of the wire header at the start of `head` (bytes 7..11,
/// `u32` little-endian; core/WIRE.md) to `len` bytes: a message's head sent or decoded
/// apart from its payload. False if `head` is shorter than a header or `len` does not fit.
pub(crate) fn set_payload_len(head: &mut [u8], len: usize) -> bool {
    match (head.get_mut(7..wire::HEADER_LEN), u32::try_from(len)) {
        (Some(field), Ok(len)) => {
            field.copy_from_slice(&len.to_le_bytes());
            true
        }
        _ => false,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use syncopate::wire::Limits;
    use syncopate::{ToServer, Values, Version};

    #[test]
    fn a_head_with_its_payload_length_set_is_the_message_without_its_payload() {
        let grad = [0.5f32; 8];
        let msg = ToServer::Grad { base: Version(3), iteration: 4, seq: 5, values: Values::Slice(&grad), loss: None };
        let mut whole = vec![0u8; wire::encoded_len_to_server(&msg)];
        wire::encode_to_server(&msg, &mut whole).unwrap();
        let empty =
            ToServer::Grad { base: Version(3), iteration: 4, seq: 5, values: Values::<f32>::Slice(&[]), loss: None };
        let mut head = vec![0u8; wire::encoded_len_to_server(&empty)];
        wire::encode_to_server(&empty, &mut head).unwrap();
        assert!(set_payload_len(&mut head, 32));
        assert_eq!(head[..], whole[..head.len()]);
        head.extend(grad.iter().flat_map(|x| x.to_le_bytes()));
        assert_eq!(head, whole);
        assert!(wire::decode_to_server::<f32>(&head, &Limits::for_model(8)).is_ok());
        assert!(!set_payload_len(&mut [0u8; 10], 0));
    }
}
