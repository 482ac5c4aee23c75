//! The benches' lock-step cluster: one [`AnyServer`] and `n` [`AnyWorker`]s with a constant
//! gradient computed instantly and virtual time, the messages waiting between phases in
//! preallocated mailboxes ([`UpLink`], [`DownLink`]): wire-encoded ([`Cluster`], this
//! module) or copied in memory ([`MemCluster`](crate::inmem::MemCluster)).
//!
//! The worker side ([`LockStep::worker_phase`]) and the server side
//! ([`LockStep::server_phase`]) are separate calls so a bench can time the server alone:
//! taking each inbound message from its mailbox, `handle`, draining `poll_output`, and
//! storing every reply for its recipients. No buffer grows after construction and nothing
//! is drawn at random: a timed phase must not allocate (`tests/tests/alloc_steady.rs`
//! checks it), which is why the benches do not run on the test kit's event-driven network
//! (`syncopate::testkit::Cluster`, owned messages), the one the unit tests and the fault
//! swarm share.

use std::hint::black_box;
use syncopate::proto::asp::AspConfig;
use syncopate::proto::backup::BackupConfig;
use syncopate::proto::bap::BapConfig;
use syncopate::proto::bsp::BspConfig;
use syncopate::proto::dbw::DbwConfig;
use syncopate::proto::grouped::GroupedConfig;
use syncopate::proto::ssp::SspConfig;
use syncopate::proto::wbsp::WbspConfig;
use syncopate::wire::{self, Limits};
use syncopate::{
    AnyServer, AnyWorker, Duration, Instant, ProtocolConfig, ProtocolKind, Recipient, Server, ServerOutput, ToServer,
    ToWorker, Worker, WorkerId, WorkerOutput, WorkerSetup,
};

/// Every protocol of [`ProtocolKind::ALL`] with `n` workers and a small learning rate, as
/// benches sweep them.
pub fn all_protocols(n: u32) -> Vec<ProtocolConfig> {
    let lr = 1e-3;
    let config = |kind| match kind {
        ProtocolKind::Bsp => ProtocolConfig::Bsp(BspConfig::new(n, lr)),
        ProtocolKind::Asp => ProtocolConfig::Asp(AspConfig::new(n, lr)),
        ProtocolKind::Ssp => ProtocolConfig::Ssp(SspConfig::new(n, lr, 2)),
        ProtocolKind::Bap => ProtocolConfig::Bap(BapConfig::new(n, lr, 2)),
        ProtocolKind::Backup => ProtocolConfig::Backup(BackupConfig::new(n, lr, 1)),
        ProtocolKind::Dbw => ProtocolConfig::Dbw(DbwConfig::new(n, lr)),
        ProtocolKind::Wbsp => ProtocolConfig::Wbsp(WbspConfig::new(n, lr)),
        ProtocolKind::WbspOverlap => ProtocolConfig::Wbsp(WbspConfig::new(n, lr).with_overlap()),
        ProtocolKind::Grouped => ProtocolConfig::Grouped(GroupedConfig::new(n, lr, 2)),
    };
    ProtocolKind::ALL.into_iter().map(config).collect()
}

/// Where the workers' messages wait for the server phase.
pub trait UpLink {
    /// Room for `MAILBOX` messages per worker of a model of `dim` parameters.
    fn new(n: usize, dim: usize) -> Self;
    /// Stores `msg` from `from`; `false` when full.
    fn push(&mut self, from: WorkerId, msg: &ToServer<'_, f32>) -> bool;
    /// Messages stored.
    fn len(&self) -> usize;
    /// Whether none is stored.
    fn is_empty(&self) -> bool {
        self.len() == 0
    }
    /// Message `i`'s sender and the message (`None` if it does not decode).
    fn get(&self, i: usize) -> (WorkerId, Option<ToServer<'_, f32>>);
    /// Forgets every message.
    fn clear(&mut self);
}

/// Where the server's messages wait for the worker phase.
pub trait DownLink {
    /// Room for `MAILBOX` messages per worker of a model of `dim` parameters.
    fn new(n: usize, dim: usize) -> Self;
    /// Stores `msg` for `to`; returns the copies that did not fit.
    fn push(&mut self, to: Recipient, msg: &ToWorker<'_, f32>) -> u64;
    /// Hands worker `w` each of its messages.
    fn deliver(&self, w: usize, f: impl FnMut(ToWorker<'_, f32>));
    /// Forgets every message.
    fn clear(&mut self);
}

/// Fixed-capacity queue of encoded messages (buffers allocated once, reused).
#[derive(Debug)]
struct Mailbox {
    slots: Vec<(WorkerId, Vec<u8>, usize)>,
    len: usize,
}

impl Mailbox {
    fn new(capacity: usize, msg_len: usize) -> Self {
        Self { slots: (0..capacity).map(|_| (WorkerId(0), vec![0u8; msg_len], 0)).collect(), len: 0 }
    }

    /// The next free slot's buffer, or `None` when full.
    fn next(&mut self, from: WorkerId) -> Option<&mut (WorkerId, Vec<u8>, usize)> {
        let slot = self.slots.get_mut(self.len)?;
        self.len += 1;
        slot.0 = from;
        Some(slot)
    }
}

/// Wire-encoded messages to the server.
#[derive(Debug)]
pub struct WireUp {
    mailbox: Mailbox,
    limits: Limits,
}

impl UpLink for WireUp {
    fn new(n: usize, dim: usize) -> Self {
        let limits = Limits::for_model(dim);
        Self { mailbox: Mailbox::new(MAILBOX * n, limits.max_message_len::<f32>()), limits }
    }
    fn push(&mut self, from: WorkerId, msg: &ToServer<'_, f32>) -> bool {
        match self.mailbox.next(from) {
            Some(slot) => {
                slot.2 = wire::encode_to_server(msg, &mut slot.1).expect("encode");
                true
            }
            None => false,
        }
    }
    fn len(&self) -> usize {
        self.mailbox.len
    }
    fn get(&self, i: usize) -> (WorkerId, Option<ToServer<'_, f32>>) {
        match self.mailbox.slots.get(i) {
            Some((from, buf, len)) => {
                (*from, buf.get(..*len).and_then(|b| wire::decode_to_server::<f32>(b, &self.limits).ok()))
            }
            None => (WorkerId(0), None),
        }
    }
    fn clear(&mut self) {
        self.mailbox.len = 0;
    }
}

/// Wire-encoded messages to the workers: one inbox per worker, a broadcast encoded for each.
#[derive(Debug)]
pub struct WireDown {
    inboxes: Vec<Mailbox>,
    limits: Limits,
}

impl DownLink for WireDown {
    fn new(n: usize, dim: usize) -> Self {
        let limits = Limits::for_model(dim);
        let msg_len = limits.max_message_len::<f32>();
        Self { inboxes: (0..n).map(|_| Mailbox::new(MAILBOX, msg_len)).collect(), limits }
    }
    fn push(&mut self, to: Recipient, msg: &ToWorker<'_, f32>) -> u64 {
        let range = match to {
            Recipient::Worker(w) => w.index()..w.index() + 1,
            Recipient::AllWorkers => 0..self.inboxes.len(),
        };
        let mut overflow = 0;
        for inbox in self.inboxes.get_mut(range).into_iter().flatten() {
            match inbox.next(WorkerId(0)) {
                Some(slot) => slot.2 = wire::encode_to_worker(msg, &mut slot.1).expect("encode"),
                None => overflow += 1,
            }
        }
        overflow
    }
    fn deliver(&self, w: usize, mut f: impl FnMut(ToWorker<'_, f32>)) {
        let Some(inbox) = self.inboxes.get(w) else { return };
        for (_, buf, len) in inbox.slots.iter().take(inbox.len) {
            if let Ok(msg) = wire::decode_to_worker::<f32>(&buf[..*len], &self.limits) {
                f(msg);
            }
        }
    }
    fn clear(&mut self) {
        for inbox in &mut self.inboxes {
            inbox.len = 0;
        }
    }
}

/// A server and `n` workers driven in lock step (see the module docs).
#[derive(Debug)]
pub struct LockStep<U, D> {
    server: AnyServer<f32, Vec<f32>>,
    workers: Vec<AnyWorker<f32, Vec<f32>>>,
    grad: Vec<f32>,
    up: U,
    down: D,
    now: Instant,
    /// Messages that overflowed a mailbox, or that the server sent upstream (this network has
    /// no upstream link); should stay 0; a bench asserts it.
    pub overflow: u64,
    /// Inputs the server refused.
    pub rejected: u64,
}

/// The lock-step cluster with every message wire-encoded and decoded.
pub type Cluster = LockStep<WireUp, WireDown>;

/// Messages each mailbox holds per worker: far more than any protocol queues per step.
pub(crate) const MAILBOX: usize = 64;

impl<U: UpLink, D: DownLink> LockStep<U, D> {
    /// A cluster running `config` on a model of `dim` parameters: the server's model is 0.5
    /// everywhere, the workers are in epoch 1 and never rejoin.
    pub fn new(config: &ProtocolConfig, dim: usize) -> Self {
        let n = config.workers() as usize;
        let server = AnyServer::new(config, vec![0.5f32; dim], vec![0.0; config.server_scratch_len(dim).max(1)])
            .expect("server");
        let workers = (0..config.workers())
            .map(|i| {
                let setup = WorkerSetup { id: WorkerId(i), epoch: 1, rejoin_after: None };
                AnyWorker::new(config, setup, vec![0.0f32; dim], vec![0.0; config.worker_scratch_len(dim).max(1)])
                    .expect("worker")
            })
            .collect();
        Self {
            server,
            workers,
            grad: vec![1e-3; dim],
            up: U::new(n, dim),
            down: D::new(n, dim),
            now: Instant::ZERO,
            overflow: 0,
            rejected: 0,
        }
    }

    /// The server (for its stats and version).
    pub fn server(&self) -> &AnyServer<f32, Vec<f32>> {
        &self.server
    }

    /// Advances virtual time by 1 µs, delivers every worker's messages, lets each worker
    /// compute its gradient at once, and queues what the workers send. Returns the number
    /// of messages queued for the server.
    pub fn worker_phase(&mut self) -> usize {
        self.now = self.now + Duration::from_micros(1);
        let now = self.now;
        let (up, down) = (&mut self.up, &self.down);
        for (i, w) in self.workers.iter_mut().enumerate() {
            if w.poll_timeout().is_some_and(|t| t <= now) {
                w.handle_timeout(now);
            }
            down.deliver(i, |msg| {
                let _ = w.handle(now, msg);
            });
            // At most a few computations per step: a worker that keeps computing while it
            // waits (WBSP with overlap, BAP running ahead) would otherwise never yield.
            for _ in 0..4 {
                let mut job = None;
                let id = w.id();
                while let Some(out) = w.poll_output() {
                    match out {
                        WorkerOutput::Send(msg) => {
                            if !up.push(id, &msg) {
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
        self.down.clear();
        self.up.len()
    }

    /// The server's side: takes and handles every queued message, drains the outputs after
    /// each and stores every reply for its recipients. Returns the messages handled.
    pub fn server_phase(&mut self) -> usize {
        let now = self.now;
        if self.server.poll_timeout().is_some_and(|t| t <= now) {
            self.server.handle_timeout(now);
        }
        let handled = self.up.len();
        for i in 0..handled {
            let ok = match self.up.get(i) {
                (from, Some(msg)) => self.server.handle(now, from, msg).is_ok(),
                (_, None) => false,
            };
            if !ok {
                self.rejected += 1;
            }
            // Outputs are read where `poll_output` wrote them (by reference): moving one out
            // first copies it in 16-byte loads that wait on the callee's narrower stores.
            while let Some(ref out) = self.server.poll_output() {
                match out {
                    ServerOutput::Send { to, msg } => {
                        // The recipient field by field: `poll_output` stores its tag and id
                        // separately, and one 8-byte load of both is not forwarded from
                        // those stores (a stall `perf annotate` showed on every send).
                        #[allow(clippy::needless_match)] // the point: not one 8-byte copy
                        let to = match *to {
                            Recipient::Worker(w) => Recipient::Worker(w),
                            Recipient::AllWorkers => Recipient::AllWorkers,
                        };
                        self.overflow += self.down.push(to, msg)
                    }
                    ServerOutput::Event(e) => {
                        black_box(e);
                    }
                    ServerOutput::Upstream(_) => self.overflow += 1,
                }
            }
        }
        self.up.clear();
        handled
    }

    /// Runs worker and server phases until the server has handled `messages` messages;
    /// returns how many it handled (at least `messages`). Panics if nothing moves for 1000
    /// steps (a protocol that stalls under instant workers is a bug to report).
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
