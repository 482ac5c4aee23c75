//! The same-host shared-memory payload path of the TCP transport: runs whose workers send
//! their gradients and receive their models through shared memory end with bitwise the
//! models the same runs end with over TCP alone; a region offered to a worker that vanishes
//! before answering, or still named when the server ends, leaves no file behind; a wrong
//! proof leaves the session on TCP, a second request or a slot frame on a session without
//! shared memory ends it; and a gradient holding NaN read from a slot is refused
//! as one read from the socket.

use core::net::SocketAddr;
use core::time::Duration;
use std::net::TcpStream;
use std::sync::{Arc, Mutex};
use std::thread;
use std::time::Instant;
use syncopate::wire::{self, Limits};
use syncopate::{ToServer, ToWorker, Values, Version, WorkerId};
use syncopate_transport::protocol_spec::ProtocolKind;
use syncopate_transport::tcp::frame::{FrameReader, FrameTimeout, FrameWriter};
use syncopate_transport::tcp::handshake::{self, ClientSide, Role};
use syncopate_transport::tcp::shm::messages::{Exchange, SlotFrame};
use syncopate_transport::tcp::shm::{Dir, Region};
use syncopate_transport::tcp::{
    DEFAULT_LOST_AFTER, Note, ProtocolSettings, RunPlan, RunSettings, ServerHandle, ServerOptions, ServerReport,
    StopReason, TcpServer, WorkerOptions, run_worker, session_max_len,
};

const DIM: usize = 3000;

/// The gradient of `0.5·|x − t|²`: a function of the model alone, so every worker computes
/// the same gradient on the same model and the runs below are deterministic.
fn gradient(params: &[f32], grad: &mut [f32]) {
    for (i, (g, x)) in grad.iter_mut().zip(params).enumerate() {
        *g = *x - ((i % 17) as f32 * 0.25 - 1.0);
    }
}

fn settings(kind: ProtocolKind, workers: u32) -> RunSettings {
    let mut p = ProtocolSettings::named(kind, workers, 0.1);
    if kind == ProtocolKind::Backup {
        p.backup_workers = Some(1);
    }
    RunSettings::new(p, DIM)
}

/// Every model a run made, by version.
type Models = Vec<(Version, Vec<f32>)>;

/// A server run in a thread, its log kept.
struct Running {
    addr: SocketAddr,
    handle: ServerHandle,
    log: Arc<Mutex<Vec<String>>>,
    /// Every model the server made, by version.
    models: Arc<Mutex<Models>>,
    thread: thread::JoinHandle<ServerReport>,
}

fn start(options: ServerOptions, gradients: u64) -> Running {
    let server = TcpServer::bind("127.0.0.1:0", options).unwrap();
    let (addr, handle) = (server.local_addr().unwrap(), server.handle());
    let log = Arc::new(Mutex::new(Vec::new()));
    let models = Arc::new(Mutex::new(Vec::new()));
    let (lines, made) = (Arc::clone(&log), Arc::clone(&models));
    let thread = thread::spawn(move || {
        let plan = RunPlan { max_gradients: gradients, time_limit: Some(Duration::from_secs(60)) };
        let mut note = |n: Note<'_>| match n {
            Note::Log(l) => lines.lock().unwrap().push(l.to_owned()),
            Note::Model { version, params } => made.lock().unwrap().push((version, params.to_vec())),
            _ => {}
        };
        server.run(vec![0.5; DIM], Version::ZERO, &plan, &mut note).unwrap()
    });
    Running { addr, handle, log, models, thread }
}

impl Running {
    fn logged(&self, needle: &str) -> bool {
        self.log.lock().unwrap().iter().any(|l| l.contains(needle))
    }

    fn wait_log(&self, needle: &str) {
        let until = Instant::now() + Duration::from_secs(10);
        while !self.logged(needle) {
            assert!(Instant::now() < until, "no log line with {needle:?}: {:?}", self.log.lock().unwrap());
            thread::sleep(Duration::from_millis(5));
        }
    }
}

/// A run of `kind` with `workers` workers for `gradients` gradients, the shared-memory path
/// offered or not: its report and every model it made.
fn run(
    kind: ProtocolKind,
    workers: u32,
    gradients: u64,
    shared_memory: bool,
) -> (ServerReport, Vec<(Version, Vec<f32>)>) {
    let mut options = ServerOptions::new(settings(kind, workers));
    options.shared_memory = shared_memory;
    let server = start(options, gradients);
    let workers: Vec<_> = (0..workers)
        .map(|id| {
            let addr = server.addr.to_string();
            thread::spawn(move || {
                let mut job = |p: &[f32], g: &mut [f32]| gradient(p, g);
                run_worker(&WorkerOptions::new(addr, WorkerId(id)), &mut job, &mut |_| {})
            })
        })
        .collect();
    let report = server.thread.join().unwrap();
    for w in workers {
        w.join().unwrap().unwrap();
    }
    assert_eq!(server.log.lock().unwrap().iter().any(|l| l.contains("through shared memory")), shared_memory);
    let models = core::mem::take(&mut *server.models.lock().unwrap());
    (report, models)
}

/// Every model both runs made is bitwise the same. BSP (two workers summing the same
/// gradient) and ASP (one worker) also end at the same version; a backup round takes
/// whichever worker's gradient comes first, so how many a budget of accepted gradients
/// buys depends on timing, but each version's model does not.
#[test]
fn runs_over_shared_memory_make_bitwise_the_models_of_runs_over_tcp() {
    for (kind, workers, gradients) in
        [(ProtocolKind::Bsp, 2, 40), (ProtocolKind::Asp, 1, 30), (ProtocolKind::Backup, 2, 30)]
    {
        let (tcp, tcp_models) = run(kind, workers, gradients, false);
        let (shm, shm_models) = run(kind, workers, gradients, true);
        assert_eq!(tcp.via_shared_memory, 0, "{kind:?}");
        assert!(shm.via_shared_memory > 0, "{kind:?}: no gradient came through shared memory");
        if kind != ProtocolKind::Backup {
            assert_eq!(shm.version, tcp.version, "{kind:?}");
        }
        let common = shm_models.len().min(tcp_models.len());
        assert!(common >= 10, "{kind:?}: {common} models");
        for ((v, a), (w, b)) in shm_models.iter().zip(&tcp_models) {
            assert_eq!(v, w, "{kind:?}");
            let same = a.len() == DIM && a.iter().zip(b).all(|(x, y)| x.to_bits() == y.to_bits());
            assert!(same, "{kind:?}: the models at {v:?} differ");
        }
    }
}

/// A raw worker session: the handshake done, frames in and out.
struct Raw {
    r: FrameReader,
    w: FrameWriter<TcpStream>,
    buf: Vec<u8>,
}

impl Raw {
    fn connect(addr: SocketAddr, id: u32) -> Self {
        let s = TcpStream::connect(addr).unwrap();
        let mut w = FrameWriter::new(s.try_clone().unwrap(), 0);
        let mut r = FrameReader::new(s, 0, FrameTimeout::default());
        let me = ClientSide {
            worker: WorkerId(id),
            role: Role::Worker,
            key: None,
            want: None,
            dim: None,
            lost_after: DEFAULT_LOST_AFTER,
            wire: None,
        };
        handshake::client_handshake(&mut r, &mut w, &me, Instant::now() + Duration::from_secs(3)).unwrap();
        r.set_max_len(session_max_len(DIM));
        w.set_max_len(session_max_len(DIM));
        Self { r, w, buf: Vec::new() }
    }

    /// The next frame's payload that is not a heartbeat.
    fn next(&mut self) -> Vec<u8> {
        loop {
            let p = self.r.read_frame(&mut self.buf, Some(Instant::now() + Duration::from_secs(5))).unwrap();
            if p.start != p.end {
                return p.of(&self.buf).to_vec();
            }
        }
    }

    fn send(&mut self, payload: &[u8]) {
        self.w.write_frame(payload).unwrap();
    }

    fn send_msg(&mut self, msg: &ToServer<'_, f32>) {
        self.send(&encode(msg));
    }

    /// Asks for a region; the offered file's path.
    fn offer(&mut self) -> String {
        self.send(&Exchange::Request.encode());
        match Exchange::decode(&self.next()) {
            Ok(Exchange::Offer { path, .. }) => path.to_owned(),
            other => panic!("expected an offer, got {other:?}"),
        }
    }
}

fn encode(msg: &ToServer<'_, f32>) -> Vec<u8> {
    let mut buf = vec![0u8; wire::encoded_len_to_server(msg)];
    let n = wire::encode_to_server(msg, &mut buf).unwrap();
    buf.truncate(n);
    buf
}

fn wait_gone(path: &str) {
    let until = Instant::now() + Duration::from_secs(5);
    while std::path::Path::new(path).exists() {
        assert!(Instant::now() < until, "{path} is still there");
        thread::sleep(Duration::from_millis(5));
    }
}

#[test]
fn a_region_never_answered_for_is_unlinked_when_its_worker_dies_or_the_server_ends() {
    let server = start(ServerOptions::new(settings(ProtocolKind::Bsp, 2)), u64::MAX);
    // Worker 0 dies between the offer and its answer.
    let mut dying = Raw::connect(server.addr, 0);
    let path = dying.offer();
    assert!(std::path::Path::new(&path).exists(), "the offered file exists until answered");
    drop(dying);
    wait_gone(&path);
    // Worker 1 is still connected, its offer unanswered, when the server ends.
    let mut waiting = Raw::connect(server.addr, 1);
    let path = waiting.offer();
    assert!(std::path::Path::new(&path).exists());
    server.handle.stop();
    server.thread.join().unwrap();
    assert!(!std::path::Path::new(&path).exists(), "the server's end unlinks what is still named");
}

#[test]
fn a_wrong_proof_leaves_the_session_on_tcp_and_misplaced_messages_end_it() {
    let server = start(ServerOptions::new(settings(ProtocolKind::Bsp, 1)), 1);
    let mut raw = Raw::connect(server.addr, 0);
    let path = raw.offer();
    raw.send(&Exchange::Answer([1; 32]).encode());
    server.wait_log("gave a wrong proof for the shared-memory region: the session stays on TCP");
    wait_gone(&path);
    raw.send_msg(&ToServer::Join { epoch: 0 });
    let model = raw.next();
    assert!(!SlotFrame::is(&model), "the model comes by TCP");
    let limits = Limits::for_model(DIM);
    let Ok(ToWorker::Model { version, .. }) = wire::decode_to_worker::<f32>(&model, &limits) else {
        panic!("expected the model");
    };
    let grad = vec![0.25f32; DIM];
    raw.send_msg(&ToServer::Grad { base: version, iteration: 0, seq: 0, values: Values::Slice(&grad), loss: None });
    let report = server.thread.join().unwrap();
    assert_eq!((report.version, report.via_shared_memory), (Version(1), 0));
    // A second request ends the session.
    let server = start(ServerOptions::new(settings(ProtocolKind::Bsp, 1)), 1);
    let mut raw = Raw::connect(server.addr, 0);
    raw.offer();
    raw.send(&Exchange::Answer([0; 32]).encode());
    raw.send(&Exchange::Request.encode());
    server.wait_log("asked for a second shared-memory region");
    server.handle.stop();
    server.thread.join().unwrap();
    // A slot frame on that session is a bad message.
    let server = start(ServerOptions::new(settings(ProtocolKind::Bsp, 1)), 1);
    let mut raw = Raw::connect(server.addr, 0);
    raw.send(&SlotFrame { seq: 1, len: 20 }.encode());
    server.wait_log("a shared-memory slot frame that matches no message in its slot");
    server.handle.stop();
    server.thread.join().unwrap();
}

#[test]
fn a_gradient_holding_nan_read_from_a_slot_ends_the_run_as_diverged() {
    let server = start(ServerOptions::new(settings(ProtocolKind::Bsp, 2)), u64::MAX);
    let mut raw = Raw::connect(server.addr, 0);
    let path = raw.offer();
    let region = Region::open(std::path::Path::new(&path), DIM).unwrap();
    raw.send(&Exchange::Answer(region.proof()).encode());
    assert_eq!(Exchange::decode(&raw.next()), Ok(Exchange::On));
    raw.send_msg(&ToServer::Join { epoch: 0 });
    let frame = SlotFrame::decode(&raw.next()).expect("the model comes through the slot");
    let limits = Limits::for_model(DIM);
    let bytes = region.read(Dir::ToWorker, frame.seq, frame.len as usize).unwrap();
    let Ok(ToWorker::Model { version, .. }) = wire::decode_to_worker::<f32>(bytes, &limits) else {
        panic!("expected the model in the slot");
    };
    region.consume(Dir::ToWorker, frame.seq);
    let mut grad = vec![0.5f32; DIM];
    grad[DIM - 3] = f32::NAN;
    let msg = ToServer::Grad { base: version, iteration: 0, seq: 0, values: Values::Slice(&grad), loss: None };
    let (seq, len) = region.try_write(Dir::ToServer, |slot| wire::encode_to_server(&msg, slot)).unwrap();
    raw.send(&SlotFrame { seq, len: len as u32 }.encode());
    server.wait_log("worker 0 sent a Grad holding NaN or ±∞: refused; the model has diverged");
    let report = server.thread.join().unwrap();
    assert_eq!(report.reason, StopReason::Diverged);
    assert_eq!((report.refused_not_finite, report.via_shared_memory), (1, 1));
    assert_eq!(report.version, version, "the refused gradient changed nothing");
}
