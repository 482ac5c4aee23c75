//! The listener and the accept thread: each new connection enters the unverified table and
//! gets a thread of its own (see [`connection`](super::connection)).

use super::admission::{Shared, Slot};
use super::connection::connection;
use super::events::ConnEvent;
use core::net::SocketAddr;
use core::sync::atomic::Ordering;
use core::time::Duration;
use crossbeam_channel::Sender;
use std::net::{Shutdown, TcpListener};
use std::sync::Arc;
use std::thread;

/// The kernel's queue of connections not yet accepted: deep, so a burst of attacker
/// connections does not fill it and make the kernel drop a worker's connection attempt
/// (which the worker's TCP stack would only retry after a second or more).
const LISTEN_BACKLOG: i32 = 4096;

/// A listener on the first of `addrs` that binds, with a deep backlog.
pub(super) fn listen(addrs: &[SocketAddr]) -> std::io::Result<TcpListener> {
    let mut last = std::io::Error::new(std::io::ErrorKind::AddrNotAvailable, "no address to listen on");
    for a in addrs {
        let socket = socket2::Socket::new(socket2::Domain::for_address(*a), socket2::Type::STREAM, None)?;
        #[cfg(unix)]
        socket.set_reuse_address(true)?;
        match socket.bind(&(*a).into()).and_then(|()| socket.listen(LISTEN_BACKLOG)) {
            Ok(()) => return Ok(socket.into()),
            Err(e) => last = e,
        }
    }
    Err(last)
}

/// How long one `accept` call waits for a connection before the accept thread looks at the
/// server's closing flag again (Linux; elsewhere the listener is polled).
#[cfg(target_os = "linux")]
const ACCEPT_WAIT: Duration = Duration::from_millis(200);

/// How long the accept thread sleeps between two polls of a listener with nothing to accept
/// (where `accept` does not honour a receive timeout).
#[cfg(not(target_os = "linux"))]
const ACCEPT_POLL: Duration = Duration::from_millis(5);

/// Prepares `listener` for [`accept_loop`]. On Linux `accept` blocks until a connection comes
/// or [`ACCEPT_WAIT`] passes (its receive timeout), so an idle server's accept thread sleeps
/// in the kernel instead of polling, and [`wake`] ends the wait at once when the server
/// closes; elsewhere the listener is non-blocking and polled.
pub(super) fn wait_for_connections(listener: &TcpListener) -> std::io::Result<()> {
    #[cfg(target_os = "linux")]
    {
        listener.set_nonblocking(false)?;
        socket2::SockRef::from(listener).set_read_timeout(Some(ACCEPT_WAIT))
    }
    #[cfg(not(target_os = "linux"))]
    listener.set_nonblocking(true)
}

/// Ends a wait of the accept thread in `accept` (a clone of its listener): on Linux, shutting
/// down a listening socket's receiving side wakes the waiting `accept` with an error. Best
/// effort: without it the thread sees the closing flag after one wait at most.
pub(super) fn wake(listener: &TcpListener) {
    let _ = socket2::SockRef::from(listener).shutdown(Shutdown::Read);
}

pub(super) fn is_loopback(addr: &SocketAddr) -> bool {
    addr.ip().is_loopback()
}

/// How long the accept thread pauses when too many connection threads are alive; the
/// kernel's backlog holds new connections meanwhile.
const THREAD_PRESSURE_PAUSE: Duration = Duration::from_millis(2);

/// Stack size of a connection thread: it holds buffers on the heap only.
const CONNECTION_STACK: usize = 256 * 1024;

pub(super) fn accept_loop(listener: &TcpListener, shared: &Arc<Shared>, in_tx: &Sender<ConnEvent>) {
    let opts = &shared.options;
    // Evicted connections' threads take a moment to notice; beyond this many live threads
    // the accept thread waits for them rather than pile up more.
    let max_threads = opts.max_unauthenticated.saturating_mul(2).saturating_add(opts.max_connections);
    while !shared.closing.load(Ordering::SeqCst) {
        if shared.threads.load(Ordering::SeqCst) >= max_threads {
            thread::sleep(THREAD_PRESSURE_PAUSE);
            continue;
        }
        match listener.accept() {
            Ok((stream, addr)) => {
                // A connection inherits the listener's receive timeout; its reader sets its own.
                let _ = stream.set_read_timeout(None);
                let Ok(handle) = stream.try_clone() else {
                    continue;
                };
                let (pending, evicted) = shared
                    .unverified
                    .lock()
                    .unwrap_or_else(std::sync::PoisonError::into_inner)
                    .admit(addr.ip(), handle, opts.max_unauthenticated);
                if let Some(victim) = evicted {
                    let _ = victim.stream.shutdown(Shutdown::Both);
                    let k = shared.evictions.fetch_add(1, Ordering::SeqCst);
                    if k < 5 || k % 1000 == 0 {
                        let _ = in_tx.send(ConnEvent::Log(format!(
                            "unauthenticated connections table full: evicted the oldest from {} ({} evictions so far)",
                            victim.source,
                            k + 1
                        )));
                    }
                }
                shared.threads.fetch_add(1, Ordering::SeqCst);
                let shared2 = Arc::clone(shared);
                let tx = in_tx.clone();
                let spawned = thread::Builder::new().name("syncopate-conn".into()).stack_size(CONNECTION_STACK).spawn(
                    move || {
                        let _alive = Slot(&shared2.threads);
                        connection(stream, addr, pending, &shared2, &tx);
                    },
                );
                if spawned.is_err() {
                    shared.threads.fetch_sub(1, Ordering::SeqCst);
                    shared.unverified.lock().unwrap_or_else(std::sync::PoisonError::into_inner).leave(pending);
                }
            }
            // Linux: the wait for a connection timed out (or was woken to close).
            #[cfg(target_os = "linux")]
            Err(e) if matches!(e.kind(), std::io::ErrorKind::WouldBlock | std::io::ErrorKind::TimedOut) => {}
            #[cfg(not(target_os = "linux"))]
            Err(e) if e.kind() == std::io::ErrorKind::WouldBlock => thread::sleep(ACCEPT_POLL),
            Err(_) if shared.closing.load(Ordering::SeqCst) => {}
            Err(_) => thread::sleep(Duration::from_millis(20)),
        }
    }
}

#[cfg(all(test, target_os = "linux"))]
mod tests {
    use super::*;
    use std::time::Instant;

    /// An idle accept thread sleeps in `accept` (no polling): a wait with nothing to accept
    /// lasts its full timeout, a connection ends it at once, and [`wake`] ends it when the
    /// server closes.
    #[test]
    fn accept_waits_in_the_kernel_until_a_connection_or_the_wake() {
        let listener = listen(&["127.0.0.1:0".parse().unwrap()]).unwrap();
        wait_for_connections(&listener).unwrap();
        let start = Instant::now();
        let idle = listener.accept();
        assert!(idle.is_err(), "nothing to accept");
        assert!(start.elapsed() >= ACCEPT_WAIT / 2, "an idle accept waits, after {:?}", start.elapsed());

        let addr = listener.local_addr().unwrap();
        let client = std::net::TcpStream::connect(addr).unwrap();
        let (stream, _) = listener.accept().unwrap();
        drop((client, stream));

        let waker = listener.try_clone().unwrap();
        let waiting = thread::spawn(move || {
            let start = Instant::now();
            let result = listener.accept().map(|_| ());
            (result, start.elapsed())
        });
        thread::sleep(ACCEPT_WAIT / 8);
        wake(&waker);
        let (result, waited) = waiting.join().unwrap();
        assert!(result.is_err());
        assert!(waited < ACCEPT_WAIT * 3 / 4, "the wake ended the wait after {waited:?}");
    }
}
