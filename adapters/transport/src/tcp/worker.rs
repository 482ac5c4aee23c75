//! The TCP worker: connect, handshake, drive the protocol's worker state machine with
//! gradients from the caller, and reconnect with exponential backoff when the connection is
//! lost. Every session starts a fresh state machine with the epoch the server assigned, so
//! a reconnecting worker rejoins at the server's current model. A `Stop` from the server
//! ends the run; a refusal the worker cannot fix by retrying (wrong secret, wrong version,
//! protocol or model) ends it with an error.

use super::auth::WorkerKey;
use super::frame::{FrameError, FrameReader, FrameTimeout, FrameWriter};
use super::handshake::{self, HandshakeError, Terms};
use super::{TcpError, at, core_duration, since};
use core::net::SocketAddr;
use core::sync::atomic::{AtomicBool, Ordering};
use core::time::Duration;
use std::io::BufWriter;
use std::net::{TcpStream, ToSocketAddrs};
use std::sync::Arc;
use std::thread;
use std::time::Instant as StdInstant;
use syncopate::wire::{self, Limits};
use syncopate::{AnyWorker, ProtocolConfig, Worker, WorkerEvent, WorkerId, WorkerOutput, WorkerSetup};

/// Reconnection timing.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Backoff {
    /// The first wait.
    pub initial: Duration,
    /// The longest wait (the wait doubles up to this).
    pub max: Duration,
    /// Give up after this long without a session.
    pub give_up_after: Duration,
}

impl Default for Backoff {
    fn default() -> Self {
        Self { initial: Duration::from_millis(50), max: Duration::from_secs(2), give_up_after: Duration::from_secs(30) }
    }
}

/// Settings of a TCP worker.
#[derive(Clone, Debug)]
pub struct WorkerOptions {
    /// The server's address (`host:port`).
    pub addr: String,
    /// This worker's id.
    pub id: WorkerId,
    /// The protocol and its knobs (must match the server's).
    pub protocol: ProtocolConfig,
    /// The model dimension (must match the server's).
    pub dim: usize,
    /// This worker's key (from the shared secret), if the server authenticates.
    pub key: Option<WorkerKey>,
    /// The handshake's absolute deadline.
    pub handshake_timeout: Duration,
    /// The deadline of each frame, from its first byte.
    pub frame_timeout: FrameTimeout,
    /// How long one socket write may block.
    pub write_timeout: Duration,
    /// Reconnection timing.
    pub backoff: Backoff,
    /// Re-send `Join` after waiting this long for the server (a lost message costs one
    /// timeout, never a hang).
    pub rejoin_after: Option<Duration>,
    /// When set, the worker drops its connection and returns (tests of worker loss).
    pub kill: Option<Arc<AtomicBool>>,
}

impl WorkerOptions {
    /// Defaults: no key, 5 s handshakes, 10 s frames, default backoff, rejoin after 2 s.
    pub fn new(addr: impl Into<String>, id: WorkerId, protocol: ProtocolConfig, dim: usize) -> Self {
        Self {
            addr: addr.into(),
            id,
            protocol,
            dim,
            key: None,
            handshake_timeout: Duration::from_secs(5),
            frame_timeout: FrameTimeout::default(),
            write_timeout: Duration::from_secs(10),
            backoff: Backoff::default(),
            rejoin_after: Some(Duration::from_secs(2)),
            kill: None,
        }
    }
}

/// What a worker did.
#[derive(Clone, Copy, Debug, Default, PartialEq, serde::Serialize)]
pub struct WorkerReport {
    /// Gradients computed and handed to the protocol.
    pub steps: u64,
    /// Sessions established (more than one after reconnections).
    pub sessions: u32,
    /// The newest model version received.
    pub last_version: Option<u64>,
    /// Whether the server said stop (otherwise the worker was killed).
    pub stopped: bool,
    /// Seconds spent computing gradients.
    pub busy_s: f64,
    /// Seconds the worker ran.
    pub wall_s: f64,
}

enum SessionEnd {
    Stopped,
    Killed,
    Lost(String),
}

/// Runs a worker until the server says stop. `compute(params, grad)` writes the gradient at
/// `params` into `grad` (both of the model's length); `log` sees one line per connection
/// event.
pub fn run_worker(
    options: &WorkerOptions,
    compute: &mut dyn FnMut(&[f32], &mut [f32]),
    log: &mut dyn FnMut(&str),
) -> Result<WorkerReport, TcpError> {
    let started = StdInstant::now();
    let mut report = WorkerReport::default();
    let terms = Terms::new(&options.protocol, options.dim);
    let mut wait = options.backoff.initial;
    let mut last_up = StdInstant::now();
    loop {
        if killed(options) {
            break;
        }
        match session(options, &terms, &mut report, compute, log) {
            Ok(SessionEnd::Stopped) => {
                report.stopped = true;
                break;
            }
            Ok(SessionEnd::Killed) => break,
            Ok(SessionEnd::Lost(why)) => {
                last_up = StdInstant::now();
                wait = options.backoff.initial;
                log(&format!("worker {}: connection lost ({why}); reconnecting", options.id.0));
            }
            Err(e) if e.is_transient() => {
                if last_up.elapsed() >= options.backoff.give_up_after {
                    return Err(TcpError(format!(
                        "worker {}: cannot reach the server at {}: {e} (gave up after {:.0} s)",
                        options.id.0,
                        options.addr,
                        options.backoff.give_up_after.as_secs_f64()
                    )));
                }
            }
            Err(e) => return Err(TcpError(format!("worker {}: {e}", options.id.0))),
        }
        thread::sleep(wait);
        wait = (wait * 2).min(options.backoff.max);
    }
    report.wall_s = started.elapsed().as_secs_f64();
    Ok(report)
}

fn killed(options: &WorkerOptions) -> bool {
    options.kill.as_ref().is_some_and(|k| k.load(Ordering::SeqCst))
}

/// Why connecting failed.
enum ConnectError {
    Io(String),
    Handshake(HandshakeError),
}

impl ConnectError {
    fn is_transient(&self) -> bool {
        match self {
            Self::Io(_) => true,
            Self::Handshake(e) => e.is_transient(),
        }
    }
}

impl core::fmt::Display for ConnectError {
    fn fmt(&self, f: &mut core::fmt::Formatter<'_>) -> core::fmt::Result {
        match self {
            Self::Io(e) => f.write_str(e),
            Self::Handshake(e) => write!(f, "{e}"),
        }
    }
}

fn connect(addr: &str, timeout: Duration) -> Result<TcpStream, ConnectError> {
    let addrs: Vec<SocketAddr> = addr
        .to_socket_addrs()
        .map_err(|e| ConnectError::Handshake(refusal(format!("invalid server address '{addr}': {e}"))))?
        .collect();
    let mut last = format!("'{addr}' resolves to nothing");
    for a in addrs {
        match TcpStream::connect_timeout(&a, timeout) {
            Ok(s) => return Ok(s),
            Err(e) => last = format!("connect to {a}: {e}"),
        }
    }
    Err(ConnectError::Io(last))
}

fn refusal(message: String) -> HandshakeError {
    HandshakeError::Refusing { code: handshake::RefuseCode::Malformed, message, worker: None }
}

fn session(
    options: &WorkerOptions,
    terms: &Terms,
    report: &mut WorkerReport,
    compute: &mut dyn FnMut(&[f32], &mut [f32]),
    log: &mut dyn FnMut(&str),
) -> Result<SessionEnd, ConnectError> {
    let stream = connect(&options.addr, options.handshake_timeout)?;
    let io = |e: std::io::Error| ConnectError::Io(e.to_string());
    let max_len = super::session_max_len(options.dim);
    // TCP_NODELAY, and socket buffers that hold a whole large frame.
    super::frame::tune_stream(&stream, max_len).map_err(io)?;
    stream.set_write_timeout(Some(options.write_timeout)).map_err(io)?;
    let mut reader = FrameReader::new(stream.try_clone().map_err(io)?, 0, options.frame_timeout);
    let mut writer = FrameWriter::new(BufWriter::with_capacity(1 << 16, stream.try_clone().map_err(io)?), 0);
    let deadline = StdInstant::now() + options.handshake_timeout;
    let s = handshake::client_handshake(
        &mut reader,
        &mut writer,
        terms,
        options.id,
        options.key.as_ref(),
        deadline,
        max_len,
    )
    .map_err(ConnectError::Handshake)?;
    report.sessions += 1;
    log(&format!(
        "worker {}: connected to {} (epoch {}, server at version {})",
        options.id.0, options.addr, s.epoch, s.version
    ));
    let setup = WorkerSetup { id: options.id, epoch: s.epoch, rejoin_after: options.rejoin_after.map(core_duration) };
    let dim = options.dim;
    let mut worker = AnyWorker::new(
        &options.protocol,
        setup,
        vec![0.0f32; dim],
        vec![0.0f32; options.protocol.worker_scratch_len(dim)],
    )
    .map_err(|e| ConnectError::Handshake(refusal(format!("invalid protocol settings: {e}"))))?;
    let end = drive(&mut worker, &mut reader, &mut writer, options, report, compute);
    let _ = stream.shutdown(std::net::Shutdown::Both);
    Ok(end)
}

/// Frames waiting for the writer thread: a small bound, so a slow link pushes back on the
/// worker instead of queueing without limit.
const UPLOADS_IN_FLIGHT: usize = 2;

fn drive(
    worker: &mut AnyWorker<f32, Vec<f32>>,
    reader: &mut FrameReader,
    writer: &mut FrameWriter<BufWriter<TcpStream>>,
    options: &WorkerOptions,
    report: &mut WorkerReport,
    compute: &mut dyn FnMut(&[f32], &mut [f32]),
) -> SessionEnd {
    // Uploads go through a writer thread, so sending a large gradient or delta overlaps the
    // next computation (the optimized WBSP worker relies on it); encoded buffers come back
    // through `spare` and are reused, so steady state allocates nothing.
    let (to_writer, frames) = crossbeam_channel::bounded::<Vec<u8>>(UPLOADS_IN_FLIGHT);
    let (give_back, spare) = crossbeam_channel::bounded::<Vec<u8>>(UPLOADS_IN_FLIGHT + 1);
    thread::scope(|scope| {
        let writing = scope.spawn(move || -> Result<(), String> {
            for frame in frames {
                writer.write_frame(&frame).map_err(|e| e.to_string())?;
                let _ = give_back.try_send(frame);
            }
            Ok(())
        });
        let end = drive_loop(worker, reader, &to_writer, &spare, options, report, compute);
        drop(to_writer);
        match (writing.join(), end) {
            (Ok(Err(e)), SessionEnd::Lost(_)) => SessionEnd::Lost(e),
            (_, end) => end,
        }
    })
}

fn drive_loop(
    worker: &mut AnyWorker<f32, Vec<f32>>,
    reader: &mut FrameReader,
    uploads: &crossbeam_channel::Sender<Vec<u8>>,
    spare: &crossbeam_channel::Receiver<Vec<u8>>,
    options: &WorkerOptions,
    report: &mut WorkerReport,
    compute: &mut dyn FnMut(&[f32], &mut [f32]),
) -> SessionEnd {
    let epoch = StdInstant::now();
    let limits = Limits::for_model(options.dim);
    let (mut inbuf, mut grad) = (Vec::new(), vec![0.0f32; options.dim]);
    // Set when an upload could not be handed to the writer (the connection broke while
    // sending). The session then ends as lost, but only after reading what the server
    // already sent: a `Stop` that crossed with the upload ends it as stopped instead.
    let mut upload_failed: Option<String> = None;
    loop {
        let mut job = None;
        while let Some(o) = worker.poll_output() {
            match o {
                WorkerOutput::Send(msg) if upload_failed.is_none() => {
                    let mut out = spare.try_recv().unwrap_or_default();
                    out.resize(wire::encoded_len_to_server(&msg), 0);
                    match wire::encode_to_server(&msg, &mut out) {
                        Ok(n) => {
                            out.truncate(n);
                            if uploads.send(out).is_err() {
                                upload_failed = Some("the connection broke while sending".to_string());
                            }
                        }
                        Err(e) => return SessionEnd::Lost(format!("cannot encode {}: {e}", msg.kind_name())),
                    }
                }
                WorkerOutput::Send(_) => {}
                WorkerOutput::Compute { id, version, params } => {
                    let t = StdInstant::now();
                    compute(params, &mut grad);
                    report.busy_s += t.elapsed().as_secs_f64();
                    report.last_version = Some(report.last_version.unwrap_or(0).max(version.0));
                    job = Some(id);
                }
                WorkerOutput::Event(WorkerEvent::Stopped) => {}
                WorkerOutput::Event(_) => {}
            }
        }
        if let Some(id) = job {
            if worker.handle_gradient(since(epoch), id, &grad).is_ok() {
                report.steps += 1;
            }
            continue;
        }
        if worker.is_stopped() {
            return SessionEnd::Stopped;
        }
        if killed(options) {
            return SessionEnd::Killed;
        }
        let mut wake = StdInstant::now() + Duration::from_millis(100);
        if let Some(t) = worker.poll_timeout() {
            wake = wake.min(at(epoch, t));
        }
        if upload_failed.is_some() {
            wake = StdInstant::now() + Duration::from_millis(50);
        }
        match reader.read_frame(&mut inbuf, Some(wake)) {
            Ok(p) => match wire::decode_to_worker::<f32>(p.of(&inbuf), &limits) {
                Ok(msg) => {
                    let _ = worker.handle(since(epoch), msg);
                }
                Err(e) => return SessionEnd::Lost(format!("server sent a bad message: {e}")),
            },
            Err(FrameError::Idle) => {
                if let Some(e) = upload_failed.take() {
                    return SessionEnd::Lost(e);
                }
            }
            Err(e) => return SessionEnd::Lost(upload_failed.take().unwrap_or_else(|| e.to_string())),
        }
        if worker.poll_timeout().is_some_and(|t| at(epoch, t) <= StdInstant::now()) {
            worker.handle_timeout(since(epoch));
        }
    }
}
