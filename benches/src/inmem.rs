//! An in-process cluster without a wire codec: one [`AnyServer`] and `n` [`AnyWorker`]s
//! exchanging [`ToServer`] / [`ToWorker`] values whose payloads are [`Values::Slice`]s of
//! preallocated buffers, with a constant gradient computed instantly and virtual time.
//!
//! [`MemCluster::server_phase`] is what the state-machine target is stated for: `handle` of
//! each queued message, then draining `poll_output`, copying each outgoing message once
//! (descriptor plus payload, as an in-process transport must before polling the next
//! output). Fanning a broadcast out to the workers happens in the untimed
//! [`MemCluster::worker_phase`]. No buffer grows after construction.
//!
//! [`crate::drive::Cluster`] is the same loop with every message wire-encoded and decoded.

use std::hint::black_box;
use syncopate::{
    AnyServer, AnyWorker, Duration, Instant, ProtocolConfig, Recipient, Server, ServerOutput, ToServer, ToWorker,
    Values, Worker, WorkerId, WorkerOutput,
};

/// Messages each queue holds per worker: far more than any protocol queues per step.
const MAILBOX: usize = 64;

/// `msg` with its payload (if it has one) replaced by `payload`.
fn to_server_with<'a>(msg: &ToServer<'_, f32>, payload: &'a [f32]) -> ToServer<'a, f32> {
    let values = Values::Slice(payload);
    match *msg {
        ToServer::Join { epoch } => ToServer::Join { epoch },
        ToServer::Grad { base, iteration, seq, .. } => ToServer::Grad { base, iteration, seq, values },
        ToServer::Delta { round, local_steps, seq, .. } => ToServer::Delta { round, local_steps, seq, values },
        ToServer::Pull { have, min_clock } => ToServer::Pull { have, min_clock },
        ToServer::Clock { clock, seq, .. } => ToServer::Clock { clock, seq, values },
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

/// A server and `n` workers driven in lock step without a codec (see the module docs).
#[derive(Debug)]
pub struct MemCluster {
    server: AnyServer<f32, Vec<f32>>,
    workers: Vec<AnyWorker<f32, Vec<f32>>>,
    grad: Vec<f32>,
    to_server: Queue<ToServer<'static, f32>>,
    from_server: Queue<ToWorker<'static, f32>>,
    now: Instant,
    /// Messages that overflowed a queue (should stay 0; a bench asserts it).
    pub overflow: u64,
    /// Inputs the server refused.
    pub rejected: u64,
}

impl MemCluster {
    /// A cluster running `config` on a model of `dim` parameters.
    pub fn new(config: &ProtocolConfig, dim: usize) -> Self {
        let n = config.workers() as usize;
        let (server, workers) = crate::drive::nodes(config, dim);
        Self {
            server,
            workers,
            grad: vec![1e-3; dim],
            to_server: Queue::new(MAILBOX * n, dim, ToServer::Leave),
            from_server: Queue::new(MAILBOX * n, dim, ToWorker::Stop),
            now: Instant::ZERO,
            overflow: 0,
            rejected: 0,
        }
    }

    /// The server (for its stats and version).
    pub fn server(&self) -> &AnyServer<f32, Vec<f32>> {
        &self.server
    }

    /// Advances virtual time by 1 µs, delivers every message the server sent (a broadcast to
    /// each worker), lets each worker compute its gradient at once, and queues what the
    /// workers send. Returns the number of messages queued for the server.
    pub fn worker_phase(&mut self) -> usize {
        self.now = self.now + Duration::from_micros(1);
        let now = self.now;
        for (i, w) in self.workers.iter_mut().enumerate() {
            if w.poll_timeout().is_some_and(|t| t <= now) {
                w.handle_timeout(now);
            }
            for slot in self.from_server.slots.iter().take(self.from_server.len) {
                let mine = match slot.to {
                    Recipient::Worker(to) => to.index() == i,
                    Recipient::AllWorkers => true,
                };
                if mine {
                    let payload = slot.payload.get(..slot.len).unwrap_or(&[]);
                    let _ = w.handle(now, to_worker_with(&slot.msg, payload));
                }
            }
            // At most a few computations per step (see `drive::Cluster::worker_phase`).
            for _ in 0..4 {
                let mut job = None;
                let id = w.id();
                while let Some(out) = w.poll_output() {
                    match out {
                        WorkerOutput::Send(msg) => {
                            let (desc, payload) = (to_server_with(&msg, &[]), payload_of_to_server(&msg));
                            if !self.to_server.push(id, Recipient::AllWorkers, desc, payload) {
                                self.overflow += 1;
                            }
                        }
                        WorkerOutput::Compute { id, .. } => job = Some(id),
                        WorkerOutput::Event(_) => {}
                    }
                }
                match job {
                    Some(id) => {
                        let _ = w.handle_gradient(now, id, &self.grad);
                    }
                    None => break,
                }
            }
        }
        self.from_server.len = 0;
        self.to_server.len
    }

    /// The server's side: `handle` of every queued message, draining `poll_output` after
    /// each and copying every outgoing message once. Returns the messages handled.
    pub fn server_phase(&mut self) -> usize {
        let now = self.now;
        if self.server.poll_timeout().is_some_and(|t| t <= now) {
            self.server.handle_timeout(now);
        }
        let handled = self.to_server.len;
        for slot in self.to_server.slots.iter().take(handled) {
            let payload = slot.payload.get(..slot.len).unwrap_or(&[]);
            if self.server.handle(now, slot.from, to_server_with(&slot.msg, payload)).is_err() {
                self.rejected += 1;
            }
            while let Some(out) = self.server.poll_output() {
                match out {
                    ServerOutput::Send { to, msg } => {
                        let payload = match msg {
                            ToWorker::Model { values, .. } => Some(values),
                            _ => None,
                        };
                        if !self.from_server.push(WorkerId(0), to, to_worker_with(&msg, &[]), payload) {
                            self.overflow += 1;
                        }
                    }
                    ServerOutput::Event(e) => {
                        black_box(e);
                    }
                }
            }
        }
        self.to_server.len = 0;
        handled
    }

    /// Runs worker and server phases until the server has handled `messages` messages;
    /// returns how many it handled. Panics if nothing moves for 1000 steps.
    pub fn run(&mut self, messages: usize) -> usize {
        let (mut handled, mut idle) = (0, 0);
        while handled < messages {
            self.worker_phase();
            let h = self.server_phase();
            handled += h;
            idle = if h == 0 { idle + 1 } else { 0 };
            assert!(idle < 1000, "no progress");
        }
        handled
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::drive::all_protocols;

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
