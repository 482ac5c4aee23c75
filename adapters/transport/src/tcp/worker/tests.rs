//! The worker against a server played by hand: what it computes on after a computation it
//! cannot interrupt.

use super::*;
use crate::protocol_spec::ProtocolKind;
use crate::tcp::frame::FrameTimeout;
use crate::tcp::frame::{FrameReader, FrameWriter};
use crate::tcp::handshake::{self, Role};
use crate::tcp::handshake::{Deadlines, ServerSide};
use crate::tcp::settings::{ProtocolSettings, RunSettings};
use core::time::Duration;
use std::net::TcpListener;
use std::net::TcpStream;
use std::sync::mpsc;
use std::thread;
use syncopate::WorkerId;
use syncopate::wire::{self, Limits};
use syncopate::{ToServer, ToWorker, Version, msg::Values};

/// A job whose first computation blocks (as a Python computation does, deaf to the
/// server) until the test releases it, and which records the model it was given.
struct Uninterruptible {
    models: Vec<f32>,
    busy: mpsc::Sender<()>,
    release: mpsc::Receiver<()>,
}

impl WorkerJob for Uninterruptible {
    fn gradient(&mut self, params: &[f32], grad: &mut [f32]) -> Duration {
        self.models.push(params[0]);
        if self.models.len() == 1 {
            self.busy.send(()).unwrap();
            self.release.recv().unwrap();
        }
        grad.fill(0.5);
        Duration::ZERO
    }
}

/// The server's side of a session with a backup-workers run of `dim` parameters, by
/// hand: the test decides what the worker finds in its socket.
struct FakeServer {
    reader: FrameReader,
    writer: FrameWriter<TcpStream>,
    buf: Vec<u8>,
    limits: Limits,
    /// The worker's shared-memory exchange messages, in order.
    exchange: Vec<Vec<u8>>,
}

impl FakeServer {
    fn accept(listener: &TcpListener, settings: &RunSettings) -> Self {
        let (stream, _) = listener.accept().unwrap();
        let dim = settings.dim().unwrap();
        let mut reader =
            FrameReader::new(stream.try_clone().unwrap(), handshake::HANDSHAKE_MAX_LEN, FrameTimeout::default());
        let mut writer = FrameWriter::new(stream, handshake::HANDSHAKE_MAX_LEN);
        let bytes = settings.encode().unwrap();
        let label = settings.label();
        let side = ServerSide {
            settings: &bytes,
            digest: settings.digest().unwrap(),
            label: &label,
            peers: settings.peers().unwrap(),
            role: Role::Worker,
            secret: None,
            server_id: 1,
            version: 0,
            dim: dim as u64,
            lost_after: crate::tcp::DEFAULT_LOST_AFTER,
            wire: wire::Encoding::F32,
        };
        let now = StdInstant::now();
        let deadlines = Deadlines { hello: now + Duration::from_secs(5), done: now + Duration::from_secs(5) };
        handshake::server_handshake(
            &mut reader,
            &mut writer,
            &side,
            deadlines,
            crate::tcp::session_max_len(dim),
            |_| Ok(0),
        )
        .unwrap();
        Self { reader, writer, buf: Vec::new(), limits: Limits::for_model(dim), exchange: Vec::new() }
    }

    fn send(&mut self, msg: &ToWorker<'_, f32>) {
        let mut out = vec![0u8; wire::encoded_len_to_worker(msg)];
        let n = wire::encode_to_worker(msg, &mut out).unwrap();
        self.writer.write_frame(&out[..n]).unwrap();
    }

    fn model(&mut self, version: u64, dim: usize) {
        let values = vec![version as f32; dim];
        self.send(&ToWorker::Model { version: Version(version), clock: version, values: Values::Slice(&values) });
    }

    /// The next message from the worker that is not a heartbeat (nor a shared-memory
    /// request): its kind and, for a
    /// gradient, the model version it was computed on.
    fn next(&mut self) -> (&'static str, Option<u64>) {
        loop {
            let deadline = StdInstant::now() + Duration::from_secs(10);
            let p = self.reader.read_frame(&mut self.buf, Some(deadline)).unwrap();
            // The shared-memory exchange is kept aside (a worker's request may go unanswered).
            if crate::tcp::shm::messages::Exchange::is(p.of(&self.buf)) {
                self.exchange.push(p.of(&self.buf).to_vec());
                continue;
            }
            if p.start == p.end {
                continue;
            }
            let msg = wire::decode_to_server::<f32>(p.of(&self.buf), &self.limits).unwrap();
            let base = match msg {
                ToServer::Grad { base, .. } => Some(base.0),
                _ => None,
            };
            return (msg.kind_name(), base);
        }
    }
}

/// A backup-workers worker of a model of `dim` whose computation blocks until released,
/// joined to a fake server that has sent it version 0 and seen it start computing: the
/// server, the release, and the worker's thread (its report and the models it computed on).
#[allow(clippy::type_complexity)]
fn busy_worker(dim: usize) -> (FakeServer, mpsc::Sender<()>, thread::JoinHandle<(WorkerReport, Vec<f32>)>) {
    let settings = RunSettings::new(ProtocolSettings::named(ProtocolKind::Backup, 3, 0.1), dim);
    let listener = TcpListener::bind("127.0.0.1:0").unwrap();
    let addr = listener.local_addr().unwrap().to_string();
    let (busy, busy_rx) = mpsc::channel();
    let (release_tx, release) = mpsc::channel();
    let worker = thread::spawn(move || {
        let mut job = Uninterruptible { models: Vec::new(), busy, release };
        let report = run_worker(&WorkerOptions::new(addr, WorkerId(0)), &mut job, &mut |_| {}).unwrap();
        (report, job.models)
    });
    let mut server = FakeServer::accept(&listener, &settings);
    assert_eq!(server.next().0, "Join");
    server.model(0, dim);
    busy_rx.recv_timeout(Duration::from_secs(10)).unwrap();
    (server, release_tx, worker)
}

#[test]
fn a_worker_back_from_a_long_computation_skips_to_the_newest_model_sent_meanwhile() {
    let dim = 8;
    let (mut server, release_tx, worker) = busy_worker(dim);
    // The rounds go on without the busy worker: every new model reaches its socket.
    for version in 1..=5 {
        server.model(version, dim);
    }
    thread::sleep(Duration::from_millis(50));
    release_tx.send(()).unwrap();
    // The gradient on version 0 is abandoned for the newer models (option A); the next
    // one sent is computed on the newest.
    assert_eq!(server.next(), ("Grad", Some(5)), "the next gradient is computed on the newest model");
    server.send(&ToWorker::Stop);
    let (report, models) = worker.join().unwrap();
    assert_eq!(models, [0.0, 5.0], "computed on version 0, then straight on version 5");
    assert_eq!((report.steps, report.superseded, report.stopped), (1, 4, true));
}

#[test]
fn a_worker_back_from_a_long_computation_still_obeys_a_stop_sent_meanwhile() {
    let dim = 4;
    let (mut server, release_tx, worker) = busy_worker(dim);
    server.model(1, dim);
    server.model(2, dim);
    server.send(&ToWorker::Stop);
    thread::sleep(Duration::from_millis(50));
    release_tx.send(()).unwrap();
    let (report, models) = worker.join().unwrap();
    assert_eq!(models, [0.0], "no computation after the stop");
    assert!(report.stopped);
}

/// [`Uninterruptible`] that also takes every round ([`WorkerJob::round`]).
struct EveryRound {
    busy: Uninterruptible,
    rounds: Vec<(u64, f32)>,
}

impl WorkerJob for EveryRound {
    fn gradient(&mut self, params: &[f32], grad: &mut [f32]) -> Duration {
        self.busy.gradient(params, grad)
    }

    fn wants_rounds(&self) -> bool {
        true
    }

    fn round(&mut self, version: Version, params: &[f32]) {
        self.rounds.push((version.0, params[0]));
    }
}

#[test]
fn a_job_that_takes_every_round_sees_each_model_in_order_though_it_computes_on_the_newest() {
    let dim = 3;
    let settings = RunSettings::new(ProtocolSettings::named(ProtocolKind::Backup, 3, 0.1), dim);
    let listener = TcpListener::bind("127.0.0.1:0").unwrap();
    let addr = listener.local_addr().unwrap().to_string();
    let (busy, busy_rx) = mpsc::channel();
    let (release_tx, release) = mpsc::channel();
    let worker = thread::spawn(move || {
        let mut job = EveryRound { busy: Uninterruptible { models: Vec::new(), busy, release }, rounds: Vec::new() };
        let report = run_worker(&WorkerOptions::new(addr, WorkerId(0)), &mut job, &mut |_| {}).unwrap();
        (report, job.busy.models, job.rounds)
    });
    let mut server = FakeServer::accept(&listener, &settings);
    assert_eq!(server.next().0, "Join");
    server.model(0, dim);
    busy_rx.recv_timeout(Duration::from_secs(10)).unwrap();
    for version in 1..=4 {
        server.model(version, dim);
    }
    thread::sleep(Duration::from_millis(50));
    release_tx.send(()).unwrap();
    assert_eq!(server.next(), ("Grad", Some(4)));
    server.send(&ToWorker::Stop);
    let (report, models, rounds) = worker.join().unwrap();
    assert_eq!(models, [0.0, 4.0], "the computations skip to the newest model");
    let every: Vec<(u64, f32)> = (0..=4).map(|v| (v, v as f32)).collect();
    assert_eq!(rounds, every, "every model reached the job, in order, before the next computation");
    assert!(report.stopped);
}

/// A region offered by a server that the worker finds truncated is declined (zeros for a
/// proof, a line in its log), and the session goes on over TCP: the gradient comes as a
/// full frame.
#[test]
fn a_worker_offered_a_truncated_region_declines_it_and_stays_on_tcp() {
    use crate::tcp::shm::messages::Exchange;
    let dim = 8;
    let settings = RunSettings::new(ProtocolSettings::named(ProtocolKind::Bsp, 1, 0.1), dim);
    let listener = TcpListener::bind("127.0.0.1:0").unwrap();
    let addr = listener.local_addr().unwrap().to_string();
    let worker = thread::spawn(move || {
        let mut job = |_: &[f32], g: &mut [f32]| g.fill(0.5);
        let mut lines = Vec::new();
        let report = run_worker(&WorkerOptions::new(addr, WorkerId(0)), &mut job, &mut |l| lines.push(l.to_owned()));
        (report.unwrap(), lines)
    });
    let mut server = FakeServer::accept(&listener, &settings);
    assert_eq!(server.next().0, "Join");
    let len = crate::tcp::shm::region_len(dim);
    let path = crate::tcp::shm::default_dir().join(format!(
        "{}test-truncated-{}",
        crate::tcp::shm::FILE_PREFIX,
        std::process::id()
    ));
    std::fs::write(&path, vec![0u8; len - 4096]).unwrap();
    let offer = Exchange::Offer { size: len as u64, path: path.to_str().unwrap() }.encode();
    server.writer.write_frame(&offer).unwrap();
    server.model(0, dim);
    assert_eq!(server.next(), ("Grad", Some(0)), "the gradient comes as a full frame");
    server.send(&ToWorker::Stop);
    let (report, lines) = worker.join().unwrap();
    std::fs::remove_file(&path).unwrap();
    assert!(report.stopped);
    assert_eq!(server.exchange, [Exchange::Request.encode(), Exchange::Answer([0; 32]).encode()]);
    let declined =
        lines.iter().any(|l| l.contains("cannot use the server's shared memory") && l.contains("stays on TCP"));
    assert!(declined, "{lines:?}");
}
