//! What the connection threads hand the protocol thread: [`ConnEvent`]s, among them the
//! frames read ([`RawFrame`], a slot frame's message as a [`SlotRef`]), and the protocol
//! thread's handle on each connection ([`Conn`]).

use crate::tcp::shm::{Dir, Region};
use core::net::SocketAddr;
use core::sync::atomic::AtomicBool;
use crossbeam_channel::Sender;
use std::net::TcpStream;
use std::sync::Arc;
use syncopate::WorkerId;

/// What the connection threads (accept, readers, writers, the upstream session's) tell the
/// protocol thread, over one bounded channel.
pub(super) enum ConnEvent {
    Log(String),
    HandshakeFailed,
    Connected {
        conn: u64,
        worker: WorkerId,
        epoch: u32,
        addr: SocketAddr,
        tx: Sender<Arc<Vec<u8>>>,
        stream: TcpStream,
        done: Arc<AtomicBool>,
    },
    Frame(RawFrame),
    /// A frame for session `conn`'s writer from its reader (the shared-memory exchange).
    Reply {
        conn: u64,
        worker: WorkerId,
        bytes: Vec<u8>,
    },
    Closed {
        conn: u64,
        worker: WorkerId,
        reason: String,
    },
    Upstream {
        buf: Vec<u8>,
        start: usize,
        end: usize,
    },
    UpstreamClosed {
        reason: String,
    },
}

/// A frame read from a worker's session `conn`: its payload is `buf[start..end]`, and the
/// buffer goes back to its reader's pool through `home`.
pub(super) struct RawFrame {
    pub(super) conn: u64,
    pub(super) worker: WorkerId,
    pub(super) buf: Vec<u8>,
    pub(super) start: usize,
    pub(super) end: usize,
    pub(super) home: Sender<Vec<u8>>,
    /// For a slot frame of a session whose shared memory is on: the message in the slot.
    pub(super) slot: Option<SlotRef>,
}

impl RawFrame {
    /// The frame's payload.
    pub(super) fn payload(&self) -> &[u8] {
        self.buf.get(self.start..self.end).unwrap_or_default()
    }

    /// The message the frame carries: the slot's for a slot frame that matches its slot
    /// (the slot goes back to the worker when the frame is dropped), else the payload.
    pub(super) fn message(&self) -> &[u8] {
        self.slot.as_ref().and_then(SlotRef::bytes).unwrap_or_else(|| self.payload())
    }

    /// Gives the buffer back to its reader.
    pub(super) fn recycle(self) {
        let _ = self.home.try_send(self.buf);
    }
}

pub(super) struct Conn {
    pub(super) id: u64,
    pub(super) tx: Sender<Arc<Vec<u8>>>,
    pub(super) stream: TcpStream,
    /// Set by the writer thread when it has exited.
    pub(super) done: Arc<AtomicBool>,
}

/// The message of a slot frame from a worker whose shared memory is on; the slot goes back
/// to the worker when this is dropped.
pub(super) struct SlotRef {
    pub(super) region: Arc<Region>,
    pub(super) seq: u64,
    pub(super) len: usize,
}

impl SlotRef {
    /// The message, if the worker published exactly this one in its slot.
    pub(super) fn bytes(&self) -> Option<&[u8]> {
        self.region.read(Dir::ToServer, self.seq, self.len)
    }
}

impl Drop for SlotRef {
    fn drop(&mut self) {
        self.region.consume(Dir::ToServer, self.seq);
    }
}
