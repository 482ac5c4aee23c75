//! The lingering close at the end of a run: the writers send what is queued (the `Stop`
//! last), then each peer gets a moment to close its end before the server closes its own.
//! Closing first while a late frame of the peer sits unread would reset the connection, and
//! a reset can discard the `Stop` before the peer has read it.

use super::events::{Conn, ConnEvent, RawFrame};
use core::sync::atomic::Ordering;
use core::time::Duration;
use crossbeam_channel::Receiver;
use std::net::Shutdown;
use std::sync::Arc;
use std::thread;
use std::time::Instant;

/// How long the writers and the peers get, together.
const LINGER: Duration = Duration::from_secs(2);

/// Cuts every connection of `conns` at once (the server vanishes without a word).
pub(super) fn cut(conns: Vec<Conn>) {
    for c in conns {
        let _ = c.stream.shutdown(Shutdown::Both);
    }
}

/// Tells a session whose handshake completed while the run ended to stop, as the others
/// were (it would otherwise see its connection closed without a word and retry a server
/// that is gone): the queued `Connected` events get `stop` and join `conns`; a peer whose
/// `Closed` is queued leaves `conns`; every other queued event goes to `other`.
pub(super) fn stop_late(
    conns: &mut Vec<Conn>,
    from_conns: &Receiver<ConnEvent>,
    stop: Option<Arc<Vec<u8>>>,
    other: &mut dyn FnMut(ConnEvent),
) {
    while let Ok(event) = from_conns.try_recv() {
        match event {
            ConnEvent::Connected { conn, tx, stream, done, .. } => {
                if let Some(bytes) = &stop {
                    let _ = tx.send(bytes.clone());
                }
                conns.push(Conn { id: conn, tx, stream, done });
            }
            // Its peer has closed already: nothing to linger for.
            ConnEvent::Closed { conn, .. } => conns.retain(|c| {
                if c.id == conn {
                    let _ = c.stream.shutdown(Shutdown::Both);
                }
                c.id != conn
            }),
            event => other(event),
        }
    }
}

/// Closes `conns` gracefully: lets each writer finish its queue, waits (within [`LINGER`])
/// for each peer to close, handing every frame that still arrives to `late` and `stop` to
/// every session whose handshake completes meanwhile, then closes.
pub(super) fn linger(
    conns: Vec<Conn>,
    from_conns: &Receiver<ConnEvent>,
    stop: Option<Arc<Vec<u8>>>,
    late: &mut dyn FnMut(RawFrame),
) {
    let deadline = Instant::now() + LINGER;
    let mut pending = Vec::new();
    for Conn { id, tx, stream, done } in conns {
        // Dropping the queue's sender ends the writer once the queue is sent.
        drop(tx);
        pending.push((id, stream, done));
    }
    while pending.iter().any(|(_, _, d)| !d.load(Ordering::SeqCst)) && Instant::now() < deadline {
        thread::sleep(Duration::from_millis(2));
    }
    let mut open: Vec<u64> = pending.iter().map(|(id, _, _)| *id).collect();
    while !open.is_empty() {
        match from_conns.recv_deadline(deadline) {
            Ok(ConnEvent::Closed { conn, .. }) => open.retain(|id| *id != conn),
            Ok(ConnEvent::Frame(frame)) => late(frame),
            // A handshake that completed meanwhile: that session is told to stop too.
            Ok(ConnEvent::Connected { conn, tx, stream, done, .. }) => {
                if let Some(bytes) = &stop {
                    let _ = tx.send(bytes.clone());
                }
                drop(tx);
                open.push(conn);
                pending.push((conn, stream, done));
            }
            Ok(_) => {}
            Err(_) => break,
        }
    }
    for (_, s, _) in pending {
        let _ = s.shutdown(Shutdown::Both);
    }
}
