//! An in-process cluster without a wire codec: one [`AnyServer`](syncopate::AnyServer) and `n` [`AnyWorker`](syncopate::AnyWorker)s
//! exchanging [`ToServer`] / [`ToWorker`] values whose payloads are [`Values::Slice`]s of
//! preallocated buffers, with a constant gradient computed instantly and virtual time.
//!
//! [`LockStep::server_phase`] of a [`MemCluster`] is what the state-machine target is stated
//! for: `handle` of each queued message, then draining `poll_output`, copying each outgoing
//! message once (descriptor plus payload, as an in-process transport must before polling
//! the next output). Fanning a broadcast out to the workers happens in the untimed
//! [`LockStep::worker_phase`]. No buffer grows after construction.
//!
//! [`crate::drive::Cluster`] is the same loop ([`LockStep`]) with every message wire-encoded
//! and decoded.

use crate::drive::{DownLink, LockStep, MAILBOX, UpLink};
use syncopate::{Recipient, ToServer, ToWorker, Values, WorkerId};

/// `msg` with its payload (if it has one) replaced by `payload`.
fn to_server_with<'a>(msg: &ToServer<'_, f32>, payload: &'a [f32]) -> ToServer<'a, f32> {
    let values = Values::Slice(payload);
    match *msg {
        ToServer::Join { epoch } => ToServer::Join { epoch },
        ToServer::Grad { base, iteration, seq, loss, .. } => ToServer::Grad { base, iteration, seq, values, loss },
        ToServer::Delta { round, local_steps, seq, loss, .. } => {
            ToServer::Delta { round, local_steps, seq, values, loss }
        }
        ToServer::Pull { have, min_clock } => ToServer::Pull { have, min_clock },
        ToServer::Clock { clock, seq, loss, .. } => ToServer::Clock { clock, seq, values, loss },
        ToServer::Leave => ToServer::Leave,
    }
}

fn payload_of_to_server<'a>(msg: &ToServer<'a, f32>) -> Option<Values<'a, f32>> {
    match *msg {
        ToServer::Grad { values, .. } | ToServer::Delta { values, .. } | ToServer::Clock { values, .. } => Some(values),
        _ => None,
    }
}

/// `msg` with its payload replaced by `payload`.
fn to_worker_with<'a>(msg: &ToWorker<'_, f32>, payload: &'a [f32]) -> ToWorker<'a, f32> {
    match *msg {
        ToWorker::Model { version, clock, .. } => ToWorker::Model { version, clock, values: Values::Slice(payload) },
        ToWorker::NotNewer { version } => ToWorker::NotNewer { version },
        ToWorker::PushAck { round, pull_now } => ToWorker::PushAck { round, pull_now },
        ToWorker::Abort { iteration } => ToWorker::Abort { iteration },
        ToWorker::Stop => ToWorker::Stop,
    }
}

/// One queued message: a payload-free descriptor and a preallocated payload buffer.
#[derive(Debug)]
struct Slot<M> {
    from: WorkerId,
    to: Recipient,
    msg: M,
    payload: Vec<f32>,
    len: usize,
}

/// A fixed-capacity queue of [`Slot`]s (allocated once, reused).
#[derive(Debug)]
struct Queue<M> {
    slots: Vec<Slot<M>>,
    len: usize,
}

impl<M: Copy> Queue<M> {
    fn new(capacity: usize, dim: usize, empty: M) -> Self {
        let slots = (0..capacity)
            .map(|_| Slot { from: WorkerId(0), to: Recipient::AllWorkers, msg: empty, payload: vec![0.0; dim], len: 0 })
            .collect();
        Self { slots, len: 0 }
    }

    /// Stores a message and copies its payload; `false` when full (or the payload does not fit).
    fn push(&mut self, from: WorkerId, to: Recipient, msg: M, payload: Option<Values<'_, f32>>) -> bool {
        let Some(slot) = self.slots.get_mut(self.len) else { return false };
        let len = payload.map_or(0, |v| v.len());
        if let Some(v) = payload {
            let Some(dst) = slot.payload.get_mut(..len) else { return false };
            if v.copy_into(dst).is_err() {
                return false;
            }
        }
        (slot.from, slot.to, slot.msg, slot.len) = (from, to, msg, len);
        self.len += 1;
        true
    }
}

/// In-memory messages to the server: descriptors plus copied payloads.
#[derive(Debug)]
pub struct MemUp(Queue<ToServer<'static, f32>>);

impl UpLink for MemUp {
    fn new(n: usize, dim: usize) -> Self {
        Self(Queue::new(MAILBOX * n, dim, ToServer::Leave))
    }
    fn push(&mut self, from: WorkerId, msg: &ToServer<'_, f32>) -> bool {
        self.0.push(from, Recipient::AllWorkers, to_server_with(msg, &[]), payload_of_to_server(msg))
    }
    fn len(&self) -> usize {
        self.0.len
    }
    #[inline]
    fn get(&self, i: usize) -> (WorkerId, Option<ToServer<'_, f32>>) {
        match self.0.slots.get(i) {
            Some(slot) => (slot.from, Some(to_server_with(&slot.msg, slot.payload.get(..slot.len).unwrap_or(&[])))),
            None => (WorkerId(0), None),
        }
    }
    fn clear(&mut self) {
        self.0.len = 0;
    }
}

/// In-memory messages to the workers: one queue every worker scans, a broadcast stored once.
#[derive(Debug)]
pub struct MemDown(Queue<ToWorker<'static, f32>>);

impl DownLink for MemDown {
    fn new(n: usize, dim: usize) -> Self {
        Self(Queue::new(MAILBOX * n, dim, ToWorker::Stop))
    }
    #[inline]
    fn push(&mut self, to: Recipient, msg: &ToWorker<'_, f32>) -> u64 {
        let payload = match *msg {
            ToWorker::Model { values, .. } => Some(values),
            _ => None,
        };
        u64::from(!self.0.push(WorkerId(0), to, to_worker_with(msg, &[]), payload))
    }
    fn deliver(&self, w: usize, mut f: impl FnMut(ToWorker<'_, f32>)) {
        for slot in self.0.slots.iter().take(self.0.len) {
            let mine = match slot.to {
                Recipient::Worker(to) => to.index() == w,
                Recipient::AllWorkers => true,
            };
            if mine {
                f(to_worker_with(&slot.msg, slot.payload.get(..slot.len).unwrap_or(&[])));
            }
        }
    }
    fn clear(&mut self) {
        self.0.len = 0;
    }
}

/// The lock-step cluster without a codec (see the module docs).
pub type MemCluster = LockStep<MemUp, MemDown>;

#[cfg(test)]
mod tests {
    use super::*;
    use crate::drive::all_protocols;
    use syncopate::Server;

    /// Every protocol makes progress through the in-memory loop: models advance, nothing
    /// overflows, nothing is refused.
    #[test]
    fn every_protocol_progresses_without_refusals() {
        for config in all_protocols(4) {
            let mut c = MemCluster::new(&config, 16);
            c.run(2000);
            assert!(c.server().version().0 > 10, "{}: version {}", config.name(), c.server().version().0);
            assert_eq!(c.overflow, 0, "{}", config.name());
            assert_eq!(c.rejected, 0, "{}", config.name());
        }
    }
}
