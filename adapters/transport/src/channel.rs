//! In-process transport: a star of bounded crossbeam channels between one server port and
//! `n` worker ports, carrying wire-encoded messages.
//!
//! Messages cross as the same bytes the TCP adapter sends (the core's [`syncopate::wire`]
//! format), so the in-process path exercises the real codec. No message is copied more than
//! the codec needs:
//!
//! - a worker encodes its message straight into a pooled packet buffer
//!   ([`WorkerPort::send_to_server`]); the server hands the packet back with
//!   [`ServerPort::recycle`] and the buffer returns to that worker's pool;
//! - the server encodes each message once into a shared, read-only buffer
//!   ([`ServerPort::send_to_worker`]) and every recipient's packet points at those same bytes
//!   (a broadcast to `n` workers is one encode, not `n` copies). The buffer is reused once
//!   every recipient has recycled (or dropped) its packet.
//!
//! After warm-up no message allocates. Channels are bounded: a sender blocks while the
//! receiver's queue is full (backpressure), and a send to a port that was dropped (a dead
//! worker) returns [`Disconnected`].

use core::fmt;
use core::ops::Deref;
use crossbeam_channel::{Receiver, RecvTimeoutError, Sender, bounded};
use std::sync::{Arc, Mutex, PoisonError};
use std::time::Duration;
use syncopate::wire::{self, EncodeError, MAX_CONTROL_LEN};
use syncopate::{Recipient, Scalar, ToServer, ToWorker, WorkerId};

/// One message's bytes, with the way home for its buffer.
#[derive(Debug)]
pub struct Packet {
    /// The sender (`None` for the server).
    pub from: Option<WorkerId>,
    /// The wire-encoded message.
    pub bytes: PacketBytes,
    home: Option<Sender<Vec<u8>>>,
}

/// A packet's bytes (read them through `Deref<Target = [u8]>`): the packet's own pooled
/// buffer (a worker's message) or a buffer shared by every recipient of one server message.
#[derive(Debug)]
pub struct PacketBytes(Buf);

#[derive(Debug)]
enum Buf {
    Owned(Vec<u8>),
    Shared(Arc<Vec<u8>>),
}

impl Deref for PacketBytes {
    type Target = [u8];

    fn deref(&self) -> &[u8] {
        match &self.0 {
            Buf::Owned(v) => v,
            Buf::Shared(v) => v,
        }
    }
}

impl AsRef<[u8]> for PacketBytes {
    fn as_ref(&self) -> &[u8] {
        self
    }
}

/// The peer's port was dropped.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Disconnected;

impl fmt::Display for Disconnected {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("peer disconnected")
    }
}

impl core::error::Error for Disconnected {}

/// Why a worker's message was not sent.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum SendError {
    /// The server's port was dropped.
    Disconnected,
    /// The message could not be encoded (nothing was sent).
    Encode(EncodeError),
}

impl fmt::Display for SendError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Self::Disconnected => f.write_str("peer disconnected"),
            Self::Encode(e) => write!(f, "cannot encode the message: {e}"),
        }
    }
}

impl core::error::Error for SendError {}

/// Why a receive returned without a packet.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum RecvError {
    /// Nothing arrived before the timeout.
    Timeout,
    /// Every sender is gone.
    Disconnected,
}

/// Makes `buf` exactly `len` bytes long without touching (zeroing) the bytes it already
/// has: they are about to be overwritten. A buffer that must grow gets room for the largest
/// control section too: messages of one model differ only in their varint fields, so a
/// buffer grows once, not each time a counter gains a byte.
/// A length no allocation can hold (a message too large to address) leaves the buffer as it
/// is, and the encoder then refuses the short buffer.
fn fit(buf: &mut Vec<u8>, len: usize) {
    if buf.capacity() < len {
        let _ = buf.try_reserve_exact(len.saturating_add(MAX_CONTROL_LEN).saturating_sub(buf.len()));
    }
    if buf.capacity() >= len {
        buf.resize(len, 0);
    }
}

/// A pool of byte buffers refilled by receivers (a worker's uploads).
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

    /// A packet of `len` bytes filled by `fill`, or `fill`'s error (the buffer goes back to
    /// the pool).
    fn packet<E>(
        &self,
        from: Option<WorkerId>,
        len: usize,
        fill: impl FnOnce(&mut [u8]) -> Result<usize, E>,
    ) -> Result<Packet, E> {
        let mut buf = self.returned.try_recv().unwrap_or_default();
        fit(&mut buf, len);
        match fill(&mut buf) {
            Ok(n) => {
                buf.truncate(n);
                Ok(Packet { from, bytes: PacketBytes(Buf::Owned(buf)), home: Some(self.home.clone()) })
            }
            Err(e) => {
                let _ = self.home.try_send(buf);
                Err(e)
            }
        }
    }
}

/// The server's shared buffers: one per message in flight, reused once every recipient has
/// let go of it.
#[derive(Debug)]
struct SharedPool {
    bufs: Mutex<Vec<Arc<Vec<u8>>>>,
    keep: usize,
}

impl SharedPool {
    fn new(keep: usize) -> Self {
        Self { bufs: Mutex::new(Vec::with_capacity(keep)), keep }
    }

    /// A buffer of `len` bytes filled by `fill`, ready to share; or `fill`'s error.
    fn fill<E>(&self, len: usize, fill: impl FnOnce(&mut [u8]) -> Result<usize, E>) -> Result<Arc<Vec<u8>>, E> {
        let free = {
            let mut bufs = self.bufs.lock().unwrap_or_else(PoisonError::into_inner);
            // Only this pool clones these `Arc`s, so a count of 1 cannot go back up.
            let i = bufs.iter().position(|b| Arc::strong_count(b) == 1 && Arc::weak_count(b) == 0);
            i.map(|i| bufs.swap_remove(i))
        };
        let mut shared = free.unwrap_or_default();
        let result = match Arc::get_mut(&mut shared) {
            Some(buf) => {
                fit(buf, len);
                fill(buf).map(|n| buf.truncate(n))
            }
            None => {
                let mut buf = Vec::new();
                fit(&mut buf, len);
                let r = fill(&mut buf).map(|n| buf.truncate(n));
                shared = Arc::new(buf);
                r
            }
        };
        let mut bufs = self.bufs.lock().unwrap_or_else(PoisonError::into_inner);
        if bufs.len() < self.keep {
            bufs.push(Arc::clone(&shared));
        }
        result.map(|()| shared)
    }
}

fn recycle(packet: Packet) {
    // The sender's pool is gone only when the sender is, or is full; then the buffer is freed.
    // A shared buffer just loses one reader.
    if let (Buf::Owned(buf), Some(home)) = (packet.bytes.0, packet.home) {
        let _ = home.try_send(buf);
    }
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
    pool: SharedPool,
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
    // The server's buffers kept for reuse: enough for a broadcast and a message to each
    // worker in flight. More can be in flight (a full inbox at every worker); those are
    // freed once read, so a burst does not pin its memory for good.
    let pool = SharedPool::new(2 * workers.max(1) + 2);
    (ServerPort { inbox: server_inbox, to_workers, pool }, ports)
}

impl ServerPort {
    /// Waits up to `timeout` (forever with `None`) for a packet from any worker.
    pub fn recv(&self, timeout: Option<Duration>) -> Result<Packet, RecvError> {
        recv(&self.inbox, timeout)
    }

    /// Encodes `msg` once and sends it to `to`; a broadcast goes to every worker port still
    /// connected, all sharing the one encoded buffer. Returns the workers found
    /// disconnected; on an encoding error nothing is sent.
    pub fn send_to_worker<T: Scalar>(
        &self,
        to: Recipient,
        msg: &ToWorker<'_, T>,
    ) -> Result<Vec<WorkerId>, EncodeError> {
        let shared = self.pool.fill(wire::encoded_len_to_worker(msg), |buf| wire::encode_to_worker(msg, buf))?;
        Ok(self.share(to, &shared))
    }

    /// Sends `bytes` to `to` (copied once into a shared buffer, whatever the number of
    /// recipients); a broadcast goes to every worker port still connected. Returns the
    /// workers found disconnected.
    pub fn send(&self, to: Recipient, bytes: &[u8]) -> Vec<WorkerId> {
        let copy = |buf: &mut [u8]| -> Result<usize, core::convert::Infallible> {
            buf.copy_from_slice(bytes);
            Ok(bytes.len())
        };
        match self.pool.fill(bytes.len(), copy) {
            Ok(shared) => self.share(to, &shared),
            Err(never) => match never {},
        }
    }

    fn share(&self, to: Recipient, shared: &Arc<Vec<u8>>) -> Vec<WorkerId> {
        let mut lost = Vec::new();
        let mut send_one = |i: usize| {
            if let Some(tx) = self.to_workers.get(i) {
                let packet = Packet { from: None, bytes: PacketBytes(Buf::Shared(Arc::clone(shared))), home: None };
                if tx.send(packet).is_err() {
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

    /// Encodes `msg` straight into a pooled packet and sends it to the server.
    pub fn send_to_server<T: Scalar>(&self, msg: &ToServer<'_, T>) -> Result<(), SendError> {
        let packet = self
            .pool
            .packet(Some(self.id), wire::encoded_len_to_server(msg), |buf| wire::encode_to_server(msg, buf))
            .map_err(SendError::Encode)?;
        self.to_server.send(packet).map_err(|_| SendError::Disconnected)
    }

    /// Sends `bytes` to the server (copied into a pooled packet).
    pub fn send(&self, bytes: &[u8]) -> Result<(), Disconnected> {
        let copy = |buf: &mut [u8]| -> Result<usize, core::convert::Infallible> {
            buf.copy_from_slice(bytes);
            Ok(bytes.len())
        };
        match self.pool.packet(Some(self.id), bytes.len(), copy) {
            Ok(packet) => self.to_server.send(packet).map_err(|_| Disconnected),
            Err(never) => match never {},
        }
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
    use syncopate::wire::Limits;
    use syncopate::{Values, Version};

    #[test]
    fn star_routes_and_recycles() {
        let (server, workers) = star(2, 4);
        workers[1].send(b"hello").unwrap();
        let p = server.recv(Some(Duration::from_secs(1))).unwrap();
        assert_eq!((p.from, &*p.bytes), (Some(WorkerId(1)), &b"hello"[..]));
        let first = p.bytes.as_ptr();
        server.recycle(p);
        // The recycled buffer comes back to worker 1's pool and is reused.
        workers[1].send(b"again").unwrap();
        let p = server.recv(None).unwrap();
        assert_eq!((p.bytes.as_ptr(), &*p.bytes), (first, &b"again"[..]));
        assert!(server.send(Recipient::AllWorkers, b"model").is_empty());
        for w in &workers {
            assert_eq!(&*w.recv(Some(Duration::from_secs(1))).unwrap().bytes, b"model");
        }
        assert_eq!(server.recv(Some(Duration::from_millis(1))).unwrap_err(), RecvError::Timeout);
        let mut workers = workers;
        drop(workers.remove(0));
        assert_eq!(server.send(Recipient::AllWorkers, b"x"), [WorkerId(0)]);
    }

    #[test]
    fn a_broadcast_is_encoded_once_and_shared_then_reused() {
        let (server, workers) = star(3, 2);
        let limits = Limits::for_model(4);
        let model =
            |v: u64, x: &'static [f32; 4]| ToWorker::Model { version: Version(v), clock: v, values: Values::Slice(x) };
        assert!(server.send_to_worker(Recipient::AllWorkers, &model(1, &[1.0, 2.0, 3.0, 4.0])).unwrap().is_empty());
        let packets: Vec<Packet> = workers.iter().map(|w| w.recv(Some(Duration::from_secs(1))).unwrap()).collect();
        let ptr = packets[0].bytes.as_ptr();
        for p in &packets {
            assert_eq!(p.bytes.as_ptr(), ptr, "every recipient reads the same bytes");
            match wire::decode_to_worker::<f32>(&p.bytes, &limits).unwrap() {
                ToWorker::Model { version, values, .. } => {
                    assert_eq!((version, values.get(3)), (Version(1), Some(4.0)));
                }
                other => panic!("{other:?}"),
            }
        }
        // While one recipient still holds the buffer, the next message gets another one.
        let mut packets = packets.into_iter();
        let held = packets.next().unwrap();
        let held_ptr = held.bytes.as_ptr();
        for p in packets {
            workers[0].recycle(p);
        }
        server.send_to_worker(Recipient::Worker(WorkerId(1)), &model(2, &[5.0; 4])).unwrap();
        let p = workers[1].recv(Some(Duration::from_secs(1))).unwrap();
        assert_ne!(p.bytes.as_ptr(), held_ptr);
        let second = p.bytes.as_ptr();
        workers[1].recycle(p);
        workers[0].recycle(held);
        // Both are free again: the next message reuses one of them, allocating nothing new.
        server.send_to_worker(Recipient::Worker(WorkerId(2)), &model(3, &[6.0; 4])).unwrap();
        let p = workers[2].recv(Some(Duration::from_secs(1))).unwrap();
        assert!(p.bytes.as_ptr() == second || p.bytes.as_ptr() == held_ptr);
        assert!(matches!(
            wire::decode_to_worker::<f32>(&p.bytes, &limits).unwrap(),
            ToWorker::Model { version: Version(3), .. }
        ));
    }

    #[test]
    fn workers_encode_into_pooled_packets() {
        let (server, workers) = star(1, 2);
        let limits = Limits::for_model(3);
        let grad = [0.5f32, -1.0, 2.0];
        let msg = ToServer::Grad { base: Version(7), iteration: 1, seq: 300, values: Values::Slice(&grad), loss: None };
        workers[0].send_to_server(&msg).unwrap();
        let p = server.recv(Some(Duration::from_secs(1))).unwrap();
        let mut expect = vec![0u8; wire::encoded_len_to_server(&msg)];
        wire::encode_to_server(&msg, &mut expect).unwrap();
        assert_eq!((p.from, &*p.bytes), (Some(WorkerId(0)), expect.as_slice()));
        let ptr = p.bytes.as_ptr();
        server.recycle(p);
        // A shorter message (smaller varints) reuses the same buffer.
        let msg = ToServer::Grad { base: Version(1), iteration: 2, seq: 1, values: Values::Slice(&grad), loss: None };
        workers[0].send_to_server(&msg).unwrap();
        let p = server.recv(None).unwrap();
        assert_eq!(p.bytes.as_ptr(), ptr);
        assert!(matches!(
            wire::decode_to_server::<f32>(&p.bytes, &limits).unwrap(),
            ToServer::Grad { base: Version(1), seq: 1, .. }
        ));
        // A message that cannot be encoded is not sent.
        let odd = [0u8; 5];
        let bad = ToServer::Grad {
            base: Version(1),
            iteration: 3,
            seq: 2,
            values: Values::<f32>::LittleEndian(&odd),
            loss: None,
        };
        assert_eq!(workers[0].send_to_server(&bad), Err(SendError::Encode(EncodeError::PayloadNotMultiple { len: 5 })));
        assert_eq!(server.recv(Some(Duration::from_millis(1))).unwrap_err(), RecvError::Timeout);
        drop(server);
        assert_eq!(workers[0].send_to_server(&msg), Err(SendError::Disconnected));
    }
}
