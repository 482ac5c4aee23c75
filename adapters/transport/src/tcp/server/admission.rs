//! Admission: the table of unverified connections (bounded, evicting the oldest of the
//! source holding the most), the set of hello nonces already seen (no replay), and the step
//! that turns a verified hello into a session slot and an epoch.

use super::Shared;
use crate::tcp::handshake::{ClientHello, RefuseCode};
use core::net::IpAddr;
use core::sync::atomic::Ordering;
use std::collections::{HashSet, VecDeque};
use std::net::TcpStream;

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
    let mut epochs = shared.epochs.lock().unwrap_or_else(std::sync::PoisonError::into_inner);
    Ok(epochs.get_mut(hello.worker.index()).map_or(0, |e| {
        let mine = *e;
        *e = e.saturating_add(1);
        mine
    }))
}
