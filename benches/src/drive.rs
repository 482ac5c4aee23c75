//! An in-process cluster for measuring the state machines alone: one [`AnyServer`] and `n`
//! [`AnyWorker`]s exchanging wire-encoded messages through preallocated buffers, with a
//! constant gradient computed instantly and virtual time.
//!
//! The worker side ([`Cluster::worker_phase`]) and the server side ([`Cluster::server_phase`])
//! are separate calls so a bench can time the server alone: decoding each inbound message,
//! `handle`, draining `poll_output`, and encoding every reply into the recipient's buffer.
//! No buffer grows after construction.

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
    AnyServer, AnyWorker, Duration, Instant, ProtocolConfig, Recipient, Server, ServerOutput, Worker, WorkerId,
    WorkerOutput, WorkerSetup,
};

/// Every protocol with `n` workers and a small learning rate, as benches sweep them.
pub fn all_protocols(n: u32) -> Vec<ProtocolConfig> {
    let lr = 1e-3;
    vec![
        ProtocolConfig::Bsp(BspConfig::new(n, lr)),
        ProtocolConfig::Asp(AspConfig::new(n, lr)),
        ProtocolConfig::Backup(BackupConfig::new(n, lr, 1)),
        ProtocolConfig::Dbw(DbwConfig::new(n, lr)),
        ProtocolConfig::Wbsp(WbspConfig::new(n, lr)),
        ProtocolConfig::Wbsp(WbspConfig::new(n, lr).with_overlap()),
        ProtocolConfig::Grouped(GroupedConfig::new(n, lr, 2)),
        ProtocolConfig::Ssp(SspConfig::new(n, lr, 2)),
        ProtocolConfig::Bap(BapConfig::new(n, lr, 2)),
    ]
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

/// A server and `n` workers driven in lock step (see the module docs).
#[derive(Debug)]
pub struct Cluster {
    server: AnyServer<f32, Vec<f32>>,
    workers: Vec<AnyWorker<f32, Vec<f32>>>,
    grad: Vec<f32>,
    to_server: Mailbox,
    to_workers: Vec<Mailbox>,
    limits: Limits,
    now: Instant,
    /// Messages that overflowed a mailbox (should stay 0; a bench asserts it).
    pub overflow: u64,
    /// Inputs the server refused.
    pub rejected: u64,
}

/// A bench cluster's server.
pub(crate) type BenchServer = AnyServer<f32, Vec<f32>>;
/// A bench cluster's worker.
pub(crate) type BenchWorker = AnyWorker<f32, Vec<f32>>;

/// The server (model 0.5 everywhere) and the `n` workers (epoch 1) of a bench cluster
/// running `config` on a model of `dim` parameters; shared by [`Cluster`] and
/// [`MemCluster`](crate::inmem::MemCluster).
pub(crate) fn nodes(config: &ProtocolConfig, dim: usize) -> (BenchServer, Vec<BenchWorker>) {
    let server =
        AnyServer::new(config, vec![0.5f32; dim], vec![0.0; config.server_scratch_len(dim).max(1)]).expect("server");
    let workers = (0..config.workers())
        .map(|i| {
            let setup = WorkerSetup { id: WorkerId(i), epoch: 1, rejoin_after: None };
            AnyWorker::new(config, setup, vec![0.0f32; dim], vec![0.0; config.worker_scratch_len(dim).max(1)])
                .expect("worker")
        })
        .collect();
    (server, workers)
}

/// Messages each mailbox holds: far more than any protocol queues per step.
const MAILBOX: usize = 64;

impl Cluster {
    /// A cluster running `config` on a model of `dim` parameters.
    pub fn new(config: &ProtocolConfig, dim: usize) -> Self {
        let n = config.workers() as usize;
        let (server, workers) = nodes(config, dim);
        let limits = Limits::for_model(dim);
        let msg_len = limits.max_message_len::<f32>();
        Self {
            server,
            workers,
            grad: vec![1e-3; dim],
            to_server: Mailbox::new(MAILBOX * n, msg_len),
            to_workers: (0..n).map(|_| Mailbox::new(MAILBOX, msg_len)).collect(),
            limits,
            now: Instant::ZERO,
            overflow: 0,
            rejected: 0,
        }
    }

    /// The server (for its stats and version).
    pub fn server(&self) -> &AnyServer<f32, Vec<f32>> {
        &self.server
    }

    /// Advances virtual time by 1 µs, delivers every worker's inbox, lets each worker
    /// compute its gradient at once, and queues what the workers send. Returns the number
    /// of messages queued for the server.
    pub fn worker_phase(&mut self) -> usize {
        self.now = self.now + Duration::from_micros(1);
        let now = self.now;
        for (w, inbox) in self.workers.iter_mut().zip(self.to_workers.iter_mut()) {
            if w.poll_timeout().is_some_and(|t| t <= now) {
                w.handle_timeout(now);
            }
            for (_, buf, len) in inbox.slots.iter().take(inbox.len) {
                if let Ok(msg) = wire::decode_to_worker::<f32>(&buf[..*len], &self.limits) {
                    let _ = w.handle(now, msg);
                }
            }
            inbox.len = 0;
            // At most a few computations per step: a worker that keeps computing while it
            // waits (WBSP with overlap, BAP running ahead) would otherwise never yield.
            for _ in 0..4 {
                let mut job = None;
                let id = w.id();
                while let Some(out) = w.poll_output() {
                    match out {
                        WorkerOutput::Send(msg) => match self.to_server.next(id) {
                            Some(slot) => slot.2 = wire::encode_to_server(&msg, &mut slot.1).expect("encode"),
                            None => self.overflow += 1,
                        },
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
        self.to_server.len
    }

    /// The server's side: decodes and handles every queued message, drains the outputs and
    /// encodes each reply into its recipient's mailbox. Returns the messages handled.
    pub fn server_phase(&mut self) -> usize {
        let now = self.now;
        if self.server.poll_timeout().is_some_and(|t| t <= now) {
            self.server.handle_timeout(now);
        }
        let handled = self.to_server.len;
        for (from, buf, len) in self.to_server.slots.iter().take(handled) {
            let ok = match wire::decode_to_server::<f32>(&buf[..*len], &self.limits) {
                Ok(msg) => self.server.handle(now, *from, msg).is_ok(),
                Err(_) => false,
            };
            if !ok {
                self.rejected += 1;
            }
            while let Some(out) = self.server.poll_output() {
                if let ServerOutput::Send { to, msg } = out {
                    let range = match to {
                        Recipient::Worker(w) => w.index()..w.index() + 1,
                        Recipient::AllWorkers => 0..self.to_workers.len(),
                    };
                    for inbox in self.to_workers.get_mut(range).into_iter().flatten() {
                        match inbox.next(WorkerId(0)) {
                            Some(slot) => slot.2 = wire::encode_to_worker(&msg, &mut slot.1).expect("encode"),
                            None => self.overflow += 1,
                        }
                    }
                }
            }
        }
        self.to_server.len = 0;
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
