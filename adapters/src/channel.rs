//! In-process transport: a star of bounded crossbeam channels between one server port and
//! `n` worker ports, carrying wire-encoded messages.
//!
//! Messages cross as the same bytes the TCP adapter sends (the core's [`syncopate::wire`]
//! format), so the in-process path exercises the real codec. Buffers are recycled: the
//! receiver hands each packet back with [`ServerPort::recycle`] / [`WorkerPort::recycle`] and
//! it returns to the sender's pool, so after warm-up no message allocates.
//!
//! Channels are bounded: a sender blocks while the receiver's queue is full (backpressure),
//! and a send to a port that was dropped (a dead worker) returns [`Disconnected`].

use crossbeam_channel::{Receiver, RecvTimeoutError, Sender, bounded};
use std::fmt;
use std::time::Duration;
use syncopate::{Recipient, WorkerId};

/// One message's bytes, with the way home for its buffer.
#[derive(Debug)]
pub struct Packet {
    /// The sender (`None` for the server).
    pub from: Option<WorkerId>,
    /// The wire-encoded message.
    pub bytes: Vec<u8>,
    home: Sender<Vec<u8>>,
}

/// The peer's port was dropped.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Disconnected;

impl fmt::Display for Disconnected {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("peer disconnected")
    }
}

impl std::error::Error for Disconnected {}

/// Why a receive returned without a packet.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum RecvError {
    /// Nothing arrived before the timeout.
    Timeout,
    /// Every sender is gone.
    Disconnected,
}

/// A pool of byte buffers refilled by receivers.
#[derive(Debug)]
struct Pool {
    returned: Receiver<Vec<u8>>,
    home: Sender<Vec<u8>>,
}

impl Pool {
    /// A pool that keeps up to `keep` returned buffers (more are freed). Bounded, so
    /// returning a buffer never allocates (an unbounded channel allocates a block every
    /// 31 sends); `keep` covers every buffer of this sender that can be in flight.
    fn new(keep: usize) -> Self {
        let (home, returned) = bounded(keep.max(1));
        Self { returned, home }
    }

    fn packet(&self, from: Option<WorkerId>, bytes: &[u8]) -> Packet {
        let mut buf = self.returned.try_recv().unwrap_or_default();
        buf.clear();
        if buf.capacity() < bytes.len() {
            // Room for the largest control section too: messages of one model differ only in
            // their varint fields, so a buffer grows once, not each time a counter gains a byte.
            buf.reserve_exact(bytes.len() + syncopate::wire::MAX_CONTROL_LEN);
        }
        buf.extend_from_slice(bytes);
        Packet { from, bytes: buf, home: self.home.clone() }
    }
}

fn recycle(packet: Packet) {
    // The sender's pool is gone only when the sender is, or is full; then the buffer is freed.
    let _ = packet.home.try_send(packet.bytes);
}

fn recv(rx: &Receiver<Packet>, timeout: Option<Duration>) -> Result<Packet, RecvError> {
    match timeout {
        Some(t) => rx.recv_timeout(t).map_err(|e| match e {
            RecvTimeoutError::Timeout => RecvError::Timeout,
            RecvTimeoutError::Disconnected => RecvError::Disconnected,
        }),
        None => rx.recv().map_err(|_| RecvError::Disconnected),
    }
}

/// The server's end of the star.
#[derive(Debug)]
pub struct ServerPort {
    inbox: Receiver<Packet>,
    to_workers: Vec<Sender<Packet>>,
    pool: Pool,
}

/// A worker's end of the star.
#[derive(Debug)]
pub struct WorkerPort {
    id: WorkerId,
    inbox: Receiver<Packet>,
    to_server: Sender<Packet>,
    pool: Pool,
}

/// Builds a star: one server port and `workers` worker ports with ids `0..workers`; each
/// queue holds at most `capacity` packets.
pub fn star(workers: usize, capacity: usize) -> (ServerPort, Vec<WorkerPort>) {
    let (to_server, server_inbox) = bounded(capacity.max(1) * workers.max(1));
    let mut to_workers = Vec::with_capacity(workers);
    let mut ports = Vec::with_capacity(workers);
    for i in 0..workers {
        let (tx, rx) = bounded(capacity.max(1));
        to_workers.push(tx);
        // A worker's packets in flight: at most the server's whole inbox, plus one held.
        let pool = Pool::new(capacity.max(1) * workers.max(1) + 1);
        ports.push(WorkerPort { id: WorkerId(i as u32), inbox: rx, to_server: to_server.clone(), pool });
    }
    // The server's: every worker's full inbox, plus one held by each worker.
    let pool = Pool::new((capacity.max(1) + 1) * workers.max(1));
    (ServerPort { inbox: server_inbox, to_workers, pool }, ports)
}

impl ServerPort {
    /// Waits up to `timeout` (forever with `None`) for a packet from any worker.
    pub fn recv(&self, timeout: Option<Duration>) -> Result<Packet, RecvError> {
        recv(&self.inbox, timeout)
    }

    /// Sends `bytes` to `to`; a broadcast goes to every worker port still connected. Returns
    /// the workers found disconnected.
    pub fn send(&self, to: Recipient, bytes: &[u8]) -> Vec<WorkerId> {
        let mut lost = Vec::new();
        let mut send_one = |i: usize| {
            if let Some(tx) = self.to_workers.get(i) {
                if tx.send(self.pool.packet(None, bytes)).is_err() {
                    lost.push(WorkerId(i as u32));
                }
            }
        };
        match to {
            Recipient::Worker(w) => send_one(w.index()),
            Recipient::AllWorkers => (0..self.to_workers.len()).for_each(send_one),
        }
        lost
    }

    /// Returns a packet's buffer to its sender's pool.
    pub fn recycle(&self, packet: Packet) {
        recycle(packet);
    }
}

impl WorkerPort {
    /// This port's worker id.
    pub fn id(&self) -> WorkerId {
        self.id
    }

    /// Sends `bytes` to the server.
    pub fn send(&self, bytes: &[u8]) -> Result<(), Disconnected> {
        self.to_server.send(self.pool.packet(Some(self.id), bytes)).map_err(|_| Disconnected)
    }

    /// Waits up to `timeout` (forever with `None`) for a packet from the server.
    pub fn recv(&self, timeout: Option<Duration>) -> Result<Packet, RecvError> {
        recv(&self.inbox, timeout)
    }

    /// Returns a packet's buffer to its sender's pool.
    pub fn recycle(&self, packet: Packet) {
        recycle(packet);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn star_routes_and_recycles() {
        let (server, workers) = star(2, 4);
        workers[1].send(b"hello").unwrap();
        let p = server.recv(Some(Duration::from_secs(1))).unwrap();
        assert_eq!((p.from, p.bytes.as_slice()), (Some(WorkerId(1)), &b"hello"[..]));
        server.recycle(p);
        // The recycled buffer comes back to worker 1's pool and is reused.
        workers[1].send(b"again").unwrap();
        let p = server.recv(None).unwrap();
        assert!(p.bytes.capacity() >= 5);
        assert!(server.send(Recipient::AllWorkers, b"model").is_empty());
        for w in &workers {
            assert_eq!(w.recv(Some(Duration::from_secs(1))).unwrap().bytes, b"model");
        }
        assert_eq!(server.recv(Some(Duration::from_millis(1))).unwrap_err(), RecvError::Timeout);
        let mut workers = workers;
        drop(workers.remove(0));
        assert_eq!(server.send(Recipient::AllWorkers, b"x"), [WorkerId(0)]);
    }
}
