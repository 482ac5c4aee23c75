//! One connection's threads: the handshake under its deadlines, then a reader that hands
//! frames to the protocol thread and a writer that sends from a bounded queue; the same
//! reader and writer for the upstream session of a group server.

use super::admission::{ClaimGuard, LeaveTable, admit};
use super::admission::{Shared, Slot};
use super::events::{Conn, ConnEvent, RawFrame, SlotRef};
use super::options::Uplink;
use crate::tcp::TcpError;
use crate::tcp::frame::{FrameError, FrameReader, FrameWriter};
use crate::tcp::handshake::{self, Deadlines, HandshakeError, ServerSide};
use crate::tcp::shm::messages::{Exchange, SlotFrame};
use crate::tcp::shm::{self, Dir, Region};
use crate::tcp::writer::{write_placed, write_with_heartbeats};
use core::net::SocketAddr;
use core::sync::atomic::{AtomicBool, Ordering};
use core::time::Duration;
use crossbeam_channel::{Sender, bounded};
use std::io::BufWriter;
use std::net::{Shutdown, TcpStream};
use std::sync::{Arc, OnceLock};
use std::thread;
use std::time::Instant as StdInstant;

fn log_failure(shared: &Shared, tx: &Sender<ConnEvent>, line: String) {
    let k = shared.failures.fetch_add(1, Ordering::SeqCst);
    let _ = tx.send(ConnEvent::HandshakeFailed);
    // Rate limit: the first 20 failures, then every 100th.
    if k < 20 || k % 100 == 0 {
        let _ = tx.send(ConnEvent::Log(line));
    }
}

pub(super) fn connection(
    stream: TcpStream,
    addr: SocketAddr,
    pending: u64,
    shared: &Arc<Shared>,
    tx: &Sender<ConnEvent>,
) {
    let table = LeaveTable { shared, pending };
    let opts = &shared.options;
    let _ = stream.set_nodelay(true);
    let _ = stream.set_write_timeout(Some(opts.write_timeout.min(opts.handshake_timeout)));
    let (Ok(read_half), Ok(write_half)) = (stream.try_clone(), stream.try_clone()) else {
        return;
    };
    let mut reader = FrameReader::new(read_half, handshake::HANDSHAKE_MAX_LEN, opts.frame_timeout);
    let mut writer = FrameWriter::new(BufWriter::with_capacity(1 << 16, write_half), handshake::HANDSHAKE_MAX_LEN);
    let a = &shared.announce;
    let side = ServerSide {
        settings: &a.bytes,
        digest: a.digest,
        label: &a.label,
        peers: a.config.workers(),
        role: a.role,
        secret: opts.secret.as_ref(),
        server_id: shared.server_id,
        version: shared.version.load(Ordering::SeqCst),
        dim: a.dim as u64,
        lost_after: opts.lost_after,
        wire: opts.wire,
    };
    let now = StdInstant::now();
    let deadlines =
        Deadlines { hello: now + opts.hello_timeout.min(opts.handshake_timeout), done: now + opts.handshake_timeout };
    let admitted = core::cell::Cell::new(None);
    let result = handshake::server_handshake(&mut reader, &mut writer, &side, deadlines, shared.session_max_len, |h| {
        let epoch = admit(shared, pending, h)?;
        admitted.set(Some(h.worker));
        Ok(epoch)
    });
    drop(table);
    let _slot = admitted.get().map(|_| Slot(&shared.connections));
    let claim = admitted.get().map(|worker| ClaimGuard { shared, worker });
    let session = match result {
        Ok(s) => s,
        Err(e) => {
            let who = match &e {
                HandshakeError::Refusing { worker: Some(w), .. } => format!(" (worker {})", w.0),
                _ => String::new(),
            };
            log_failure(shared, tx, format!("handshake with {addr}{who} failed: {e}"));
            let _ = stream.shutdown(Shutdown::Both);
            return;
        }
    };
    let _ = stream.set_write_timeout(Some(opts.write_timeout));
    // Only now, for an authenticated session: large socket buffers for large frames.
    if let Err(e) = crate::tcp::frame::tune_stream(&stream, shared.session_max_len) {
        let _ = tx.send(ConnEvent::Log(format!("worker {}: cannot size the socket buffers: {e}", session.worker.0)));
    }
    let conn = shared.next_conn.fetch_add(1, Ordering::SeqCst);
    let worker = session.worker;
    let (out_tx, out_rx) = bounded::<Arc<Vec<u8>>>(opts.send_queue.max(1));
    let Ok(stream2) = stream.try_clone() else {
        return;
    };
    let writer_tx = tx.clone();
    let done = Arc::new(AtomicBool::new(false));
    let done2 = Arc::clone(&done);
    let beat = session.beat(opts.lost_after);
    // The session's shared-memory region, once its worker proved it mapped it.
    let on: Arc<OnceLock<Arc<Region>>> = Arc::default();
    let placed = Arc::clone(&on);
    let spawned = thread::Builder::new().name(format!("syncopate-write-{}", worker.0)).spawn(move || {
        let place = |p: &[u8]| placed.get().and_then(|r| place_model(r, p));
        if let Err(e) = write_placed(&mut writer, &out_rx, beat, drop, place) {
            let _ = writer_tx.send(ConnEvent::Closed { conn, worker, reason: format!("write failed: {e}") });
            let _ = stream2.shutdown(Shutdown::Both);
            done2.store(true, Ordering::SeqCst);
            return;
        }
        let _ = stream2.shutdown(Shutdown::Write);
        done2.store(true, Ordering::SeqCst);
    });
    let Ok(writer_thread) = spawned else {
        return;
    };
    let Ok(stream3) = stream.try_clone() else {
        return;
    };
    let connected =
        ConnEvent::Connected { conn, worker, epoch: session.epoch, addr, tx: out_tx, stream: stream3, done };
    if tx.send(connected).is_err() {
        return;
    }
    // Read frames until the connection ends; buffers come back through `home`.
    let (home, pool) = bounded::<Vec<u8>>(8);
    // Whether the worker asked for a region (once per session), and the region offered
    // and not yet answered for.
    let (mut asked, mut offered) = (false, None::<Arc<Region>>);
    let reason = loop {
        let mut buf = pool.try_recv().unwrap_or_default();
        match reader.read_frame(&mut buf, Some(StdInstant::now() + opts.lost_after)) {
            // A heartbeat: the worker is there.
            Ok(p) if p.start == p.end => {
                let _ = home.try_send(buf);
            }
            Ok(p) if Exchange::is(p.of(&buf)) => {
                let reply = exchange(shared, (&mut asked, &mut offered), &on, p.of(&buf));
                let _ = home.try_send(buf);
                match reply {
                    Ok((bytes, log)) => {
                        if let Some(line) = log {
                            let _ = tx.send(ConnEvent::Log(format!("worker {}: {line}", worker.0)));
                        }
                        if let Some(bytes) = bytes {
                            let _ = tx.send(ConnEvent::Reply { conn, worker, bytes });
                        }
                    }
                    Err(e) => break Some(e),
                }
            }
            Ok(p) => {
                let slot = SlotFrame::decode(p.of(&buf)).and_then(|f| {
                    let region = Arc::clone(on.get()?);
                    Some(SlotRef { region, seq: f.seq, len: f.len as usize })
                });
                let (buf, start, end) = crate::tcp::payload::widened(buf, p.start..p.end, &pool, opts.wire, &home);
                let frame = RawFrame { conn, worker, buf, start, end, home: home.clone(), slot };
                if tx.send(ConnEvent::Frame(frame)).is_err() {
                    break None;
                }
            }
            Err(FrameError::Closed) => break Some("connection closed".to_owned()),
            Err(FrameError::Idle) => break Some(silent(opts.lost_after)),
            Err(e) => break Some(e.to_string()),
        }
    };
    drop(offered);
    if let Some(region) = on.get() {
        region.unlink();
    }
    // The session is over once its reader stops: its worker id is free for the next session
    // before the protocol thread hears of the end (and closes the socket, which the worker
    // may be waiting for before it reconnects), not only once the writer has finished.
    drop(claim);
    if let Some(reason) = reason {
        let _ = tx.send(ConnEvent::Closed { conn, worker, reason });
    }
    // The writer ends once the protocol thread lets go of the connection; let it send what
    // it has (a final Stop) before the socket closes.
    let _ = writer_thread.join();
    let _ = stream.shutdown(Shutdown::Both);
}

/// What the writer sends in place of `payload` when the session's shared memory is on: a
/// slot frame, for a model message placed in the worker's slot while that is free.
fn place_model(region: &Region, payload: &[u8]) -> Option<[u8; SlotFrame::LEN]> {
    // A core message of kind `Model` (`core/WIRE.md`).
    if payload.get(..2) != Some(b"SY") || payload.get(3) != Some(&0x81) {
        return None;
    }
    let (seq, len) = region.try_write(Dir::ToWorker, |slot| {
        slot.get_mut(..payload.len()).map(|s| s.copy_from_slice(payload)).map(|()| payload.len()).ok_or(())
    })?;
    Some(SlotFrame { seq, len: u32::try_from(len).ok()? }.encode())
}

/// A worker's shared-memory exchange message: the reply for its writer (if any) and a line
/// for the log (if any), or why the session ends. The one request of a session gets a new
/// region (or a reason why not); an answer unlinks it and, with the right proof, turns the
/// path on.
fn exchange(
    shared: &Shared,
    (asked, offered): (&mut bool, &mut Option<Arc<Region>>),
    on: &OnceLock<Arc<Region>>,
    payload: &[u8],
) -> Result<(Option<Vec<u8>>, Option<String>), String> {
    let msg = Exchange::decode(payload).map_err(|e| format!("sent {e}"))?;
    match msg {
        Exchange::Request if core::mem::replace(asked, true) => Err("asked for a second shared-memory region".into()),
        Exchange::Request if !shared.options.shared_memory => {
            Ok((Some(Exchange::Declined("the server runs without shared memory").encode()), None))
        }
        // A compressed wire is for links: slots carry `f32` messages only.
        Exchange::Request if shared.options.wire != syncopate::wire::Encoding::F32 => {
            Ok((Some(Exchange::Declined("the server's wire is compressed; shared memory carries f32").encode()), None))
        }
        Exchange::Request => match Region::create(&shm::default_dir(), shared.announce.dim) {
            Ok(region) => {
                let region = Arc::new(region);
                shared.shm.add(&region);
                let path = region.path().map(|p| p.to_string_lossy().into_owned()).unwrap_or_default();
                let size = shm::region_len(shared.announce.dim) as u64;
                let offer = Exchange::Offer { size, path: &path }.encode();
                *offered = Some(region);
                Ok((Some(offer), None))
            }
            Err(e) => {
                let line = format!("cannot create a shared-memory region ({e}): the session stays on TCP");
                Ok((Some(Exchange::Declined("the server could not create a region").encode()), Some(line)))
            }
        },
        Exchange::Answer(proof) => {
            let region = offered.take().ok_or("answered a shared-memory offer it did not get")?;
            region.unlink();
            if proof == region.proof() {
                let _ = on.set(region);
                let line = "gradients and models through shared memory (same host)".to_owned();
                return Ok((Some(Exchange::On.encode()), Some(line)));
            }
            let why = if proof == [0; 32] {
                "declined the shared-memory region"
            } else {
                "gave a wrong proof for the shared-memory region"
            };
            Ok((None, Some(format!("{why}: the session stays on TCP"))))
        }
        _ => Err("sent a server's shared-memory message".into()),
    }
}

/// Starts the reader and writer threads of the upstream session: frames from upstream go to
/// the protocol thread as [`ConnEvent::Upstream`], a closed or broken connection as
/// [`ConnEvent::UpstreamClosed`].
pub(super) fn start_uplink(
    link: Uplink,
    tx: &Sender<ConnEvent>,
    queue: usize,
    lost_after: Duration,
) -> Result<Conn, TcpError> {
    let Uplink { addr, stream, mut reader, mut writer, beat } = link;
    let clone = |s: &TcpStream| s.try_clone().map_err(|e| TcpError(format!("upstream connection: {e}")));
    let (stream2, stream3) = (clone(&stream)?, clone(&stream)?);
    let (out_tx, out_rx) = bounded::<Arc<Vec<u8>>>(queue);
    let done = Arc::new(AtomicBool::new(false));
    let (done2, writer_tx) = (Arc::clone(&done), tx.clone());
    thread::Builder::new()
        .name("syncopate-up-write".into())
        .spawn(move || {
            if let Err(e) = write_with_heartbeats(&mut writer, &out_rx, beat, drop) {
                let _ = writer_tx.send(ConnEvent::UpstreamClosed { reason: format!("write failed: {e}") });
                let _ = stream2.shutdown(Shutdown::Both);
                done2.store(true, Ordering::SeqCst);
                return;
            }
            let _ = stream2.shutdown(Shutdown::Write);
            done2.store(true, Ordering::SeqCst);
        })
        .map_err(|e| TcpError(format!("cannot start the upstream writer: {e}")))?;
    let reader_tx = tx.clone();
    thread::Builder::new()
        .name("syncopate-up-read".into())
        .spawn(move || {
            let reason = loop {
                let mut buf = Vec::new();
                match reader.read_frame(&mut buf, Some(StdInstant::now() + lost_after)) {
                    // A heartbeat: the upstream server is there.
                    Ok(p) if p.start == p.end => {}
                    Ok(p) => {
                        if reader_tx.send(ConnEvent::Upstream { buf, start: p.start, end: p.end }).is_err() {
                            return;
                        }
                    }
                    Err(FrameError::Closed) => break format!("{addr} closed the connection"),
                    Err(FrameError::Idle) => break format!("{addr}: {}", silent(lost_after)),
                    Err(e) => break format!("{addr}: {e}"),
                }
            };
            let _ = reader_tx.send(ConnEvent::UpstreamClosed { reason });
        })
        .map_err(|e| TcpError(format!("cannot start the upstream reader: {e}")))?;
    Ok(Conn { id: u64::MAX, tx: out_tx, stream: stream3, done })
}

/// The reason a silent session is lost.
fn silent(lost_after: Duration) -> String {
    format!("silent for {:.1} s (no frame, no heartbeat)", lost_after.as_secs_f64())
}
