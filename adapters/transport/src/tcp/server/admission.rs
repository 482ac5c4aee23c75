//! Admission: the table of unverified connections (bounded, evicting the oldest of the
//! source holding the most), the set of hello nonces already seen (no replay), the claims
//! on each worker id (two processes with one id are refused once their sessions keep
//! replacing each other), and the step that turns a verified hello into a session slot and
//! an epoch.

use super::options::{Announce, ServerOptions};
use crate::tcp::handshake::{ClientHello, RefuseCode};
use core::net::IpAddr;
use core::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};
use std::collections::{HashSet, VecDeque};
use std::net::TcpStream;
use std::sync::Mutex;
use std::time::{Duration, Instant};
use syncopate::WorkerId;

/// Replacements of a live session of one worker id within [`FLAP_WINDOW`] that mark two
/// processes claiming the id: the hello that would make this many is refused
/// ([`RefuseCode::Claimed`]). A genuine restart replaces a live session at most once (the
/// old connection of a crashed process is closed, or found dead, and stays so).
pub(super) const FLAP_LIMIT: usize = 3;
/// The window [`FLAP_LIMIT`] counts in.
pub(super) const FLAP_WINDOW: Duration = Duration::from_secs(10);

/// Per worker id: its sessions alive (admitted, connection not yet ended) and when a new
/// session was admitted while one was alive.
#[derive(Debug, Default)]
pub(super) struct Claims {
    live: Vec<u32>,
    replaced: Vec<VecDeque<Instant>>,
}

impl Claims {
    pub(super) fn new(workers: usize) -> Self {
        Self { live: vec![0; workers], replaced: vec![VecDeque::new(); workers] }
    }

    /// Admits a session of `worker` at `now`, unless it would be the [`FLAP_LIMIT`]th
    /// replacement of a live session within [`FLAP_WINDOW`].
    fn claim(&mut self, worker: WorkerId, now: Instant) -> Result<(), (RefuseCode, String)> {
        let i = worker.index();
        let (Some(live), Some(replaced)) = (self.live.get_mut(i), self.replaced.get_mut(i)) else {
            return Ok(());
        };
        while replaced.front().is_some_and(|t| now.duration_since(*t) > FLAP_WINDOW) {
            replaced.pop_front();
        }
        if *live > 0 {
            if replaced.len() + 1 >= FLAP_LIMIT {
                return Err((
                    RefuseCode::Claimed,
                    format!(
                        "worker {} is connected already, and its sessions replaced each other {} times in {} s: two processes claim this worker id (give each `work` its own --id)",
                        worker.0,
                        replaced.len(),
                        FLAP_WINDOW.as_secs()
                    ),
                ));
            }
            replaced.push_back(now);
        }
        *live += 1;
        Ok(())
    }

    /// A session of `worker` ended.
    pub(super) fn release(&mut self, worker: WorkerId) {
        if let Some(live) = self.live.get_mut(worker.index()) {
            *live = live.saturating_sub(1);
        }
    }
}

/// Releases a session's claim on its worker id when its connection ends.
pub(super) struct ClaimGuard<'a> {
    pub(super) shared: &'a Shared,
    pub(super) worker: WorkerId,
}

impl Drop for ClaimGuard<'_> {
    fn drop(&mut self) {
        self.shared.claims.lock().unwrap_or_else(std::sync::PoisonError::into_inner).release(self.worker);
    }
}

/// One unverified connection.
#[derive(Debug)]
pub(super) struct Pending {
    id: u64,
    pub(super) source: IpAddr,
    pub(super) stream: TcpStream,
}

/// The unverified connections, oldest first.
#[derive(Debug, Default)]
pub(super) struct Unverified {
    next: u64,
    entries: VecDeque<Pending>,
}

impl Unverified {
    /// Admits a connection from `source`; when `cap` are already waiting, evicts the oldest
    /// of the source that holds the most (returned, to be cut).
    pub(super) fn admit(&mut self, source: IpAddr, stream: TcpStream, cap: usize) -> (u64, Option<Pending>) {
        let mut evicted = None;
        if self.entries.len() >= cap.max(1) {
            let mut counts: Vec<(IpAddr, usize)> = Vec::new();
            for e in &self.entries {
                match counts.iter_mut().find(|(ip, _)| *ip == e.source) {
                    Some((_, c)) => *c += 1,
                    None => counts.push((e.source, 1)),
                }
            }
            // The largest count; the first such source in age order on a tie.
            let heaviest = counts.iter().fold(None::<(IpAddr, usize)>, |best, &(ip, c)| match best {
                Some((_, b)) if b >= c => best,
                _ => Some((ip, c)),
            });
            if let Some((ip, _)) = heaviest {
                if let Some(i) = self.entries.iter().position(|e| e.source == ip) {
                    evicted = self.entries.remove(i);
                }
            }
        }
        let id = self.next;
        self.next += 1;
        self.entries.push_back(Pending { id, source, stream });
        (id, evicted)
    }

    /// Takes connection `id` out of the table; `false` if it is not there (evicted).
    pub(super) fn leave(&mut self, id: u64) -> bool {
        match self.entries.iter().position(|e| e.id == id) {
            Some(i) => self.entries.remove(i).is_some(),
            None => false,
        }
    }
}

/// A bounded set of recently seen hello nonces.
#[derive(Debug, Default)]
pub(super) struct SeenNonces {
    set: HashSet<[u8; 32]>,
    order: VecDeque<[u8; 32]>,
}

impl SeenNonces {
    const CAP: usize = 1 << 16;

    /// Records `nonce`; `false` if it was seen before.
    fn fresh(&mut self, nonce: [u8; 32]) -> bool {
        if !self.set.insert(nonce) {
            return false;
        }
        self.order.push_back(nonce);
        if self.order.len() > Self::CAP {
            if let Some(old) = self.order.pop_front() {
                self.set.remove(&old);
            }
        }
        true
    }
}

/// Takes an unverified connection out of the table when its thread ends, whatever the
/// outcome.
pub(super) struct LeaveTable<'a> {
    pub(super) shared: &'a Shared,
    pub(super) pending: u64,
}

impl Drop for LeaveTable<'_> {
    fn drop(&mut self) {
        self.shared.unverified.lock().unwrap_or_else(std::sync::PoisonError::into_inner).leave(self.pending);
    }
}

/// The admission of a connection whose hello checked out: it leaves the unverified table
/// (unless it was evicted meanwhile), takes a verified slot, its nonce must be new, and it
/// gets its epoch.
pub(super) fn admit(shared: &Shared, pending: u64, hello: &ClientHello) -> Result<u32, (RefuseCode, String)> {
    if !shared.unverified.lock().unwrap_or_else(std::sync::PoisonError::into_inner).leave(pending) {
        return Err((RefuseCode::Busy, "server busy: the connection was evicted before its hello was read".into()));
    }
    if shared.options.secret.is_some()
        && !shared.seen.lock().unwrap_or_else(std::sync::PoisonError::into_inner).fresh(hello.nonce)
    {
        return Err((RefuseCode::AuthFailed, format!("worker {}: replayed hello (nonce seen before)", hello.worker.0)));
    }
    let total = shared.connections.fetch_add(1, Ordering::SeqCst);
    if total >= shared.options.max_connections {
        shared.connections.fetch_sub(1, Ordering::SeqCst);
        return Err((RefuseCode::Busy, "server busy: too many connections".into()));
    }
    let claimed =
        shared.claims.lock().unwrap_or_else(std::sync::PoisonError::into_inner).claim(hello.worker, Instant::now());
    if let Err(e) = claimed {
        shared.connections.fetch_sub(1, Ordering::SeqCst);
        return Err(e);
    }
    let mut epochs = shared.epochs.lock().unwrap_or_else(std::sync::PoisonError::into_inner);
    Ok(epochs.get_mut(hello.worker.index()).map_or(0, |e| {
        let mine = *e;
        *e = e.saturating_add(1);
        mine
    }))
}

/// What the connection threads share: the server's options and announcement, the admission
/// tables and the counters of connections and threads.
pub(super) struct Shared {
    pub(super) options: ServerOptions,
    pub(super) announce: Announce,
    pub(super) unverified: Mutex<Unverified>,
    /// Nonces of verified hellos (bounded), so a recorded hello cannot be replayed.
    pub(super) seen: Mutex<SeenNonces>,
    pub(super) evictions: AtomicU64,
    /// Connection threads alive (bounds the threads and sockets an attack can pin).
    pub(super) threads: AtomicUsize,
    pub(super) server_id: u64,
    pub(super) version: AtomicU64,
    pub(super) epochs: Mutex<Vec<u32>>,
    /// Live sessions and recent replacements of live sessions, per worker id.
    pub(super) claims: Mutex<Claims>,
    pub(super) next_conn: AtomicU64,
    pub(super) connections: AtomicUsize,
    pub(super) failures: AtomicU64,
    pub(super) closing: AtomicBool,
    pub(super) session_max_len: usize,
    /// The sessions' shared-memory regions, unlinked when the run ends.
    pub(super) shm: crate::tcp::shm::Registry,
}

/// Decrements a counter when dropped.
pub(super) struct Slot<'a>(pub(super) &'a AtomicUsize);

impl Drop for Slot<'_> {
    fn drop(&mut self) {
        self.0.fetch_sub(1, Ordering::SeqCst);
    }
}
