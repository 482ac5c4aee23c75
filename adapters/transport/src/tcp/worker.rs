//! The TCP worker: connect, handshake (learning the run's settings from the server),
//! drive the protocol's worker state machine with gradients from the caller, and reconnect
//! with jittered exponential backoff when the connection is lost. Every session starts a
//! fresh state machine with the epoch the server assigned, so a reconnecting worker rejoins
//! at the server's current model. A `Stop` from the server ends the run; a refusal the
//! worker cannot fix by retrying (wrong secret, wrong version, other settings) ends it with
//! an error.
//!
//! **Retrying.** A worker keeps trying for as long as the server answers: a busy server, a
//! connection cut before the handshake ends (an eviction under attack, a deadline) or a lost
//! session never make it give up. Only an unreachable server (connection refused, no route,
//! connect timeout) for [`Backoff::give_up_after`] in a row does. Waits double from
//! [`Backoff::initial`] to [`Backoff::max`], each drawn uniformly from its upper half
//! (jitter, so restarted workers do not retry in lockstep), and every retry is logged with
//! its reason and wait (after ten in a row, every tenth).

use super::auth::WorkerKey;
use super::frame::{FrameError, FrameReader, FrameTimeout, FrameWriter};
use super::handshake::{self, ClientSide, HandshakeError, Role};
use super::settings::RunSettings;
use super::{TcpError, at, core_duration, since};
use core::net::SocketAddr;
use core::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use core::time::Duration;
use std::io::BufWriter;
use std::net::{TcpStream, ToSocketAddrs};
use std::sync::Arc;
use std::thread;
use std::time::Instant as StdInstant;
use syncopate::wire::{self, Limits};
use syncopate::{AnyWorker, ComputeId, Worker, WorkerEvent, WorkerId, WorkerOutput, WorkerSetup};

/// Reconnection timing.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Backoff {
    /// The first wait.
    pub initial: Duration,
    /// The longest wait (the wait doubles up to this).
    pub max: Duration,
    /// Give up after the server has been unreachable this long in a row (a server that
    /// answers, even with "busy", is retried for as long as it runs).
    pub give_up_after: Duration,
}

impl Default for Backoff {
    fn default() -> Self {
        Self { initial: Duration::from_millis(50), max: Duration::from_secs(1), give_up_after: Duration::from_secs(30) }
    }
}

impl Backoff {
    /// The wait before retry number `attempt` (0-based): `initial · 2^attempt`, at most
    /// `max`, drawn uniformly from its upper half with `unit` in `[0, 1)`.
    pub fn wait(&self, attempt: u32, unit: f64) -> Duration {
        let full = self.initial.saturating_mul(1u32.checked_shl(attempt.min(20)).unwrap_or(u32::MAX)).min(self.max);
        full.mul_f64(0.5 + 0.5 * unit.clamp(0.0, 1.0))
    }
}

/// Settings of a TCP worker. The run's settings come from the server.
#[derive(Clone, Debug)]
pub struct WorkerOptions {
    /// The server's address (`host:port`).
    pub addr: String,
    /// This worker's id.
    pub id: WorkerId,
    /// Settings the worker insists on; `None` takes the server's (and then insists on them
    /// when it reconnects).
    pub expect: Option<RunSettings>,
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
    /// A server silent this long (no frame, no heartbeat) is lost: the worker reconnects.
    /// Heartbeats go out at [`heartbeat_interval`](super::heartbeat_interval) of it, from the
    /// connection's writer thread, so a long computation does not delay them.
    pub lost_after: Duration,
    /// The number of parameters of the worker's own model, if it has one: the server
    /// refuses the worker at the handshake if its model has another size (both sizes
    /// named, in the server's log and in the worker's error). `None` takes the server's.
    pub dim: Option<usize>,
}

impl WorkerOptions {
    /// Defaults: no key, 5 s handshakes, 10 s frames, default backoff, rejoin after 2 s.
    pub fn new(addr: impl Into<String>, id: WorkerId) -> Self {
        Self {
            addr: addr.into(),
            id,
            expect: None,
            key: None,
            handshake_timeout: Duration::from_secs(5),
            frame_timeout: FrameTimeout::default(),
            write_timeout: Duration::from_secs(10),
            backoff: Backoff::default(),
            rejoin_after: Some(Duration::from_secs(2)),
            kill: None,
            lost_after: super::DEFAULT_LOST_AFTER,
            dim: None,
        }
    }
}

/// What a worker computes.
pub trait WorkerJob {
    /// Called once with the run's settings from the server, before the first gradient; an
    /// error ends the worker (retrying cannot help). The default accepts any settings.
    fn prepare(&mut self, settings: &RunSettings) -> Result<(), String> {
        let _ = settings;
        Ok(())
    }

    /// Writes the gradient at `params` into `grad` (both of the model's length) and returns
    /// how much longer this step should take: an emulated straggler's extra time, during
    /// which the worker still reads the server (an abort can cancel the step). Usually zero.
    fn gradient(&mut self, params: &[f32], grad: &mut [f32]) -> Duration;

    /// The minibatch loss of the gradient the last [`Self::gradient`] call wrote, if the
    /// job reports one: it travels to the server with that gradient, and the server keeps
    /// the mean of each update's reported losses (its loss curve). A NaN or infinite loss
    /// is refused with the gradient, as a non-finite gradient is. The default reports none.
    fn loss(&mut self) -> Option<f32> {
        None
    }

    /// Worker 0 of a server that takes its initial model from it
    /// ([`RunSettings::initial_from_worker`]): writes the initial parameters into `params`
    /// (the model's length). Called at the start of every session; the server uses the first
    /// it gets. An error, or parameters that are not all finite, end the worker. The default
    /// has none to give.
    fn initial_params(&mut self, params: &mut [f32]) -> Result<(), String> {
        let _ = params;
        Err("the server takes its initial model from worker 0, but this worker has no initial parameters to send"
            .into())
    }
}

impl<F: FnMut(&[f32], &mut [f32])> WorkerJob for F {
    fn gradient(&mut self, params: &[f32], grad: &mut [f32]) -> Duration {
        self(params, grad);
        Duration::ZERO
    }
}

/// What a worker did.
#[derive(Clone, Copy, Debug, Default, PartialEq, serde::Serialize)]
pub struct WorkerReport {
    /// Gradients computed and handed to the protocol.
    pub steps: u64,
    /// Steps abandoned (aborted by the protocol) before they were handed over.
    pub abandoned: u64,
    /// Computations never started: the server had already sent what made the protocol
    /// abandon them (a newer model) when they were due, so the worker went to the newest.
    pub superseded: u64,
    /// Sessions established (more than one after reconnections).
    pub sessions: u32,
    /// The newest model version received.
    pub last_version: Option<u64>,
    /// Whether the server said stop (otherwise the worker was killed).
    pub stopped: bool,
    /// Seconds spent computing gradients (including emulated straggler time).
    pub busy_s: f64,
    /// Seconds the worker ran.
    pub wall_s: f64,
    /// Conservation ledger: distinct contributions (gradients, deltas, clock updates)
    /// written whole to the connection, over every session.
    pub sent: u64,
    /// Contributions written again with a sequence number already sent (retransmissions).
    pub resent: u64,
    /// The worker's counters of what it handed to its connections (distinct contributions
    /// are told from retransmissions by their sequence numbers).
    #[serde(skip)]
    pub stats: syncopate::WorkerStats,
    /// Inputs the worker's state machine refused (server messages, finished gradients),
    /// over every session; the first of each kind is logged.
    pub refused: u64,
    /// The same refusals by kind.
    #[serde(skip)]
    pub refusals: syncopate::Refusals,
}

enum SessionEnd {
    Stopped,
    Killed,
    Lost(String),
}

/// Runs a worker until the server says stop. `job` computes the gradients; `log` sees one
/// line per connection event.
pub fn run_worker(
    options: &WorkerOptions,
    job: &mut dyn WorkerJob,
    log: &mut dyn FnMut(&str),
) -> Result<WorkerReport, TcpError> {
    let started = StdInstant::now();
    let mut report = WorkerReport::default();
    let me = options.id.0;
    let mut pinned = match &options.expect {
        Some(s) => Some(s.digest().map_err(|e| TcpError(format!("worker {me}: {e}")))?),
        None => None,
    };
    let mut prepared = false;
    let mut attempt = 0u32;
    let mut unreachable_since: Option<StdInstant> = None;
    let mut jitter = syncopate::rng::Rng::derive(u64::from(me), started.elapsed().as_nanos() as u64 ^ jitter_seed());
    loop {
        if killed(options) {
            break;
        }
        let written_before = report.sent + report.resent;
        let why = match session(options, &mut pinned, &mut prepared, &mut report, job, log) {
            Ok(SessionEnd::Stopped) => {
                report.stopped = true;
                break;
            }
            Ok(SessionEnd::Killed) => break,
            Ok(SessionEnd::Lost(why)) => {
                attempt = 0;
                unreachable_since = None;
                let seen = report.last_version.map_or_else(|| "none".to_owned(), |v| v.to_string());
                let written = report.sent + report.resent - written_before;
                format!(
                    "connection lost after {written} contributions written ({why}; newest model computed on: version {seen})"
                )
            }
            Err(ConnectError::Unreachable(e)) => {
                let since = *unreachable_since.get_or_insert_with(StdInstant::now);
                if since.elapsed() >= options.backoff.give_up_after {
                    return Err(TcpError(format!(
                        "worker {me}: cannot reach the server at {}: {e} (gave up after {:.0} s unreachable)",
                        options.addr,
                        options.backoff.give_up_after.as_secs_f64()
                    )));
                }
                format!("server unreachable ({e})")
            }
            Err(ConnectError::Handshake(e)) if e.is_transient() => {
                unreachable_since = None;
                format!("{e}")
            }
            Err(ConnectError::Handshake(e)) => return Err(TcpError(format!("worker {me}: {e}"))),
            Err(ConnectError::Job(e)) => return Err(TcpError(format!("worker {me}: {e}"))),
        };
        let wait = options.backoff.wait(attempt, jitter.next_f64());
        if attempt < 10 || attempt % 10 == 0 {
            log(&format!("worker {me}: {why}; retrying in {:.2} s (attempt {})", wait.as_secs_f64(), attempt + 1));
        }
        attempt = attempt.saturating_add(1);
        thread::sleep(wait);
    }
    report.wall_s = started.elapsed().as_secs_f64();
    Ok(report)
}

/// Bits that differ between processes, so restarted workers do not share a jitter stream.
pub(super) fn jitter_seed() -> u64 {
    super::auth::nonce().map_or(u64::from(std::process::id()), |n| {
        u64::from_le_bytes(n.get(..8).and_then(|b| b.try_into().ok()).unwrap_or_default())
    })
}

fn killed(options: &WorkerOptions) -> bool {
    options.kill.as_ref().is_some_and(|k| k.load(Ordering::SeqCst))
}

/// Why a session could not start.
pub(super) enum ConnectError {
    /// No connection: nobody listens, or the network does not get there.
    Unreachable(String),
    /// Connected, but the handshake failed or was refused.
    Handshake(HandshakeError),
    /// The job refused the run's settings.
    Job(String),
}

pub(super) fn connect(addr: &str, timeout: Duration) -> Result<TcpStream, ConnectError> {
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
    Err(ConnectError::Unreachable(last))
}

fn refusal(message: String) -> HandshakeError {
    HandshakeError::Refusing { code: handshake::RefuseCode::Malformed, message, worker: None }
}

fn session(
    options: &WorkerOptions,
    pinned: &mut Option<[u8; 32]>,
    prepared: &mut bool,
    report: &mut WorkerReport,
    job: &mut dyn WorkerJob,
    log: &mut dyn FnMut(&str),
) -> Result<SessionEnd, ConnectError> {
    let stream = connect(&options.addr, options.handshake_timeout)?;
    // Connected: from here on, failures are the server's answer (the server runs).
    let io = |e: std::io::Error| ConnectError::Handshake(HandshakeError::Frame(FrameError::Io(e)));
    stream.set_nodelay(true).map_err(io)?;
    stream.set_write_timeout(Some(options.write_timeout)).map_err(io)?;
    let mut reader = FrameReader::new(stream.try_clone().map_err(io)?, 0, options.frame_timeout);
    let mut writer = FrameWriter::new(BufWriter::with_capacity(1 << 16, stream.try_clone().map_err(io)?), 0);
    let deadline = StdInstant::now() + options.handshake_timeout;
    let me = ClientSide {
        worker: options.id,
        role: Role::Worker,
        key: options.key.as_ref(),
        want: *pinned,
        dim: options.dim.map(|d| d as u64),
    };
    let (s, settings) =
        handshake::client_handshake(&mut reader, &mut writer, &me, deadline).map_err(ConnectError::Handshake)?;
    let refused = |e: String| ConnectError::Job(format!("the server's settings ({}): {e}", settings.label()));
    let config = settings.worker_config().map_err(refused)?;
    let dim = settings.dim().map_err(refused)?;
    if !*prepared {
        job.prepare(&settings).map_err(ConnectError::Job)?;
        *prepared = true;
        *pinned = Some(settings.digest().map_err(refused)?);
    }
    // Socket buffers that hold a whole large frame, now that the model's size is known.
    super::frame::tune_stream(&stream, super::session_max_len(dim)).map_err(io)?;
    if settings.initial_from_worker && options.id == WorkerId(0) {
        // The initial model, before anything else (see `initial`).
        let mut initial = vec![0.0f32; dim];
        job.initial_params(&mut initial).map_err(ConnectError::Job)?;
        let message = super::initial::encode(&initial, dim)
            .map_err(|e| ConnectError::Job(format!("the initial parameters: {e}")))?;
        writer.write_frame(&message).map_err(io)?;
    }
    report.sessions += 1;
    log(&format!(
        "worker {}: connected to {} (epoch {}, server at version {}; {})",
        options.id.0,
        options.addr,
        s.epoch,
        s.version,
        settings.label()
    ));
    let setup = WorkerSetup { id: options.id, epoch: s.epoch, rejoin_after: options.rejoin_after.map(core_duration) };
    let mut worker = AnyWorker::new(&config, setup, vec![0.0f32; dim], vec![0.0f32; config.worker_scratch_len(dim)])
        .map_err(|e| refused(e.to_string()))?;
    let shape = SessionShape { dim, report_step_times: settings.report_step_times };
    let end = drive(&mut worker, &mut reader, &mut writer, shape, options, report, job, log);
    let _ = stream.shutdown(std::net::Shutdown::Both);
    Ok(end)
}

/// Frames waiting for the writer thread: a small bound, so a slow link pushes back on the
/// worker instead of queueing without limit.
const UPLOADS_IN_FLIGHT: usize = 2;

/// What a session's settings fix for its loop.
#[derive(Clone, Copy, Debug)]
struct SessionShape {
    /// The model's number of parameters.
    dim: usize,
    /// Whether each new contribution is preceded by its steps' times
    /// ([`step_times`](super::step_times)).
    report_step_times: bool,
}

#[allow(clippy::too_many_arguments)]
fn drive(
    worker: &mut AnyWorker<f32, Vec<f32>>,
    reader: &mut FrameReader,
    writer: &mut FrameWriter<BufWriter<TcpStream>>,
    shape: SessionShape,
    options: &WorkerOptions,
    report: &mut WorkerReport,
    job: &mut dyn WorkerJob,
    log: &mut dyn FnMut(&str),
) -> SessionEnd {
    // Uploads go through a writer thread, so sending a large gradient or delta overlaps the
    // next computation (the optimized WBSP worker relies on it); encoded buffers come back
    // through `spare` and are reused, so steady state allocates nothing.
    // Each frame goes with its ledger class: a new contribution, a retransmitted one, or
    // another message; the writer counts the contributions it wrote whole.
    let (to_writer, frames) = crossbeam_channel::bounded::<(Vec<u8>, Upload)>(UPLOADS_IN_FLIGHT);
    let (give_back, spare) = crossbeam_channel::bounded::<Vec<u8>>(UPLOADS_IN_FLIGHT + 1);
    let (sent, resent) = (AtomicU64::new(0), AtomicU64::new(0));
    let end = thread::scope(|scope| {
        let (sent, resent) = (&sent, &resent);
        let beat = super::heartbeat_interval(options.lost_after);
        let writing = scope.spawn(move || -> Result<(), String> {
            loop {
                let (frame, class) = match frames.recv_timeout(beat) {
                    Ok(upload) => upload,
                    // Nothing to send for a while: a heartbeat (an empty frame).
                    Err(crossbeam_channel::RecvTimeoutError::Timeout) => {
                        writer.write_frame(&[]).map_err(|e| e.to_string())?;
                        continue;
                    }
                    Err(crossbeam_channel::RecvTimeoutError::Disconnected) => return Ok(()),
                };
                writer.write_frame(&frame).map_err(|e| e.to_string())?;
                match class {
                    Upload::New => sent.fetch_add(1, Ordering::SeqCst),
                    Upload::Again => resent.fetch_add(1, Ordering::SeqCst),
                    Upload::Other => 0,
                };
                let _ = give_back.try_send(frame);
            }
        });
        let end = drive_loop(worker, reader, &to_writer, &spare, shape, options, report, job, log);
        drop(to_writer);
        match (writing.join(), end) {
            (Ok(Err(e)), SessionEnd::Lost(_)) => SessionEnd::Lost(e),
            (_, end) => end,
        }
    });
    report.sent += sent.load(Ordering::SeqCst);
    report.resent += resent.load(Ordering::SeqCst);
    end
}

/// What an uploaded frame is, for the ledger.
#[derive(Clone, Copy, Debug)]
enum Upload {
    /// A contribution with a new sequence number.
    New,
    /// A contribution sent before (same sequence number).
    Again,
    /// Any other message.
    Other,
}

/// A computation the protocol asked for while more of the server's frames were already
/// readable: it starts only once those are handed to the protocol (which may abandon it for
/// a newer model), with the model it was asked on.
struct Deferred {
    id: ComputeId,
    version: syncopate::Version,
}

/// A computed gradient waiting for its emulated step time to pass.
struct Held {
    id: ComputeId,
    started: StdInstant,
    ready: StdInstant,
    /// The job's minibatch loss for this gradient, if it reports one.
    loss: Option<f32>,
}

#[allow(clippy::too_many_arguments)]
fn drive_loop(
    worker: &mut AnyWorker<f32, Vec<f32>>,
    reader: &mut FrameReader,
    uploads: &crossbeam_channel::Sender<(Vec<u8>, Upload)>,
    spare: &crossbeam_channel::Receiver<Vec<u8>>,
    shape: SessionShape,
    options: &WorkerOptions,
    report: &mut WorkerReport,
    job: &mut dyn WorkerJob,
    log: &mut dyn FnMut(&str),
) -> SessionEnd {
    let epoch = StdInstant::now();
    let me = options.id.0;
    // Every refusal is counted; the first of each kind is logged.
    let mut refused = |report: &mut WorkerReport, what: &str, e: &syncopate::Reject| {
        if report.refusals.record(e) {
            log(&format!(
                "worker {me}: the protocol refused {what}: {e} (the first {}; more are counted)",
                e.kind_name()
            ));
        }
        report.refused = report.refusals.total();
    };
    let limits = Limits::for_model(shape.dim);
    let (mut inbuf, mut grad) = (Vec::new(), vec![0.0f32; shape.dim]);
    // The times of the steps handed over since the last contribution (sent only when the
    // run asks for them).
    let mut steps = super::step_times::PendingSteps::new(shape.dim);
    // Set when an upload could not be handed to the writer (the connection broke while
    // sending). The session then ends as lost, but only after reading what the server
    // already sent: a `Stop` that crossed with the upload ends it as stopped instead.
    let mut upload_failed: Option<String> = None;
    let mut held: Option<Held> = None;
    // A computation waiting for the frames already readable (see `Deferred`), and a copy of
    // the model it was asked on (the worker's buffer is overwritten by the next model).
    let mut deferred: Option<Deferred> = None;
    let mut deferred_params: Vec<f32> = Vec::new();
    // When the server was last heard from (a frame or a heartbeat).
    let mut heard = StdInstant::now();
    loop {
        while let Some(o) = worker.poll_output() {
            match o {
                WorkerOutput::Send(msg) if upload_failed.is_none() => {
                    let mut out = spare.try_recv().unwrap_or_default();
                    out.resize(wire::encoded_len_to_server(&msg), 0);
                    match wire::encode_to_server(&msg, &mut out) {
                        Ok(n) => {
                            out.truncate(n);
                            let before = report.stats;
                            report.stats.record(&msg);
                            let class = if report.stats.contributions > before.contributions {
                                Upload::New
                            } else if report.stats.resent > before.resent {
                                Upload::Again
                            } else {
                                Upload::Other
                            };
                            let new = matches!(class, Upload::New) && shape.report_step_times;
                            if let Some(times) = new.then(|| steps.take_message()).flatten() {
                                if uploads.send((times, Upload::Other)).is_err() {
                                    upload_failed = Some("the connection broke while sending".to_string());
                                }
                            }
                            if uploads.send((out, class)).is_err() {
                                upload_failed = Some("the connection broke while sending".to_string());
                            }
                        }
                        Err(e) => return SessionEnd::Lost(format!("cannot encode {}: {e}", msg.kind_name())),
                    }
                }
                WorkerOutput::Send(_) => {}
                WorkerOutput::Compute { id, version, params } => {
                    // What the server sent while the job was busy (a computation the worker
                    // cannot interrupt) goes to the protocol first: when it holds a newer
                    // model the protocol abandons this computation, and the worker computes
                    // on the newest model instead of on every queued one in turn.
                    if deferred.take().is_some() {
                        report.superseded += 1;
                    }
                    if server_has_sent(reader.stream()) {
                        deferred_params.clear();
                        deferred_params.extend_from_slice(params);
                        deferred = Some(Deferred { id, version });
                        continue;
                    }
                    compute(job, report, &mut held, &mut grad, id, version, params);
                }
                WorkerOutput::Event(WorkerEvent::Abandoned { id }) => {
                    if deferred.take_if(|d| d.id == id).is_some() {
                        report.superseded += 1;
                    }
                    if let Some(h) = held.take_if(|h| h.id == id) {
                        report.busy_s += h.started.elapsed().as_secs_f64();
                        report.abandoned += 1;
                    }
                }
                WorkerOutput::Event(_) => {}
            }
        }
        // A finished step is handed over at once unless something else needs the loop first:
        // frames the server sent (read before the next step, so a worker whose steps take no
        // time still sees a `Stop` or a newer model, and, at the latest with the server's next
        // heartbeat, its kill switch), a due timeout, a broken upload or a silent server. The
        // next step is only computed after that. A step finished when the kill switch was set
        // is handed over before the worker stops.
        let due = held.as_ref().is_some_and(|h| StdInstant::now() >= h.ready);
        let look_first = || {
            upload_failed.is_some()
                || heard.elapsed() >= options.lost_after
                || worker.poll_timeout().is_some_and(|t| at(epoch, t) <= StdInstant::now())
                || server_has_sent(reader.stream())
        };
        if let Some(h) = held.take_if(|_| due && !look_first()) {
            let took = h.started.elapsed().as_secs_f64();
            report.busy_s += took;
            match worker.handle_gradient_with_loss(since(epoch), h.id, &grad, h.loss) {
                Ok(()) => {
                    report.steps += 1;
                    if shape.report_step_times {
                        steps.push(took);
                    }
                }
                Err(e) => refused(report, "a finished gradient", &e),
            }
            continue;
        }
        if worker.is_stopped() {
            return SessionEnd::Stopped;
        }
        if killed(options) {
            return SessionEnd::Killed;
        }
        if deferred.is_some() && !server_has_sent(reader.stream()) {
            if let Some(Deferred { id, version }) = deferred.take() {
                compute(job, report, &mut held, &mut grad, id, version, &deferred_params);
            }
            continue;
        }
        let mut wake = StdInstant::now() + Duration::from_millis(100);
        if let Some(t) = worker.poll_timeout() {
            wake = wake.min(at(epoch, t));
        }
        if let Some(h) = &held {
            wake = wake.min(h.ready);
        }
        if upload_failed.is_some() {
            wake = StdInstant::now() + Duration::from_millis(50);
        }
        // Never a deadline already past: after a long computation the frames the server
        // sent meanwhile are read before its silence is judged.
        wake = wake.min(heard + options.lost_after).max(StdInstant::now() + Duration::from_millis(1));
        match reader.read_frame(&mut inbuf, Some(wake)) {
            // A heartbeat: the server is there.
            Ok(p) if p.start == p.end => heard = StdInstant::now(),
            Ok(p) => match wire::decode_to_worker::<f32>(p.of(&inbuf), &limits) {
                Ok(msg) => {
                    heard = StdInstant::now();
                    let kind = msg.kind_name();
                    if let Err(e) = worker.handle(since(epoch), msg) {
                        refused(report, &format!("the server's {kind} message"), &e);
                    }
                }
                Err(e) => return SessionEnd::Lost(format!("server sent a bad message: {e}")),
            },
            Err(FrameError::Idle) => {
                if let Some(e) = upload_failed.take() {
                    return SessionEnd::Lost(e);
                }
                if heard.elapsed() >= options.lost_after {
                    return SessionEnd::Lost(format!(
                        "the server was silent for {:.1} s (no frame, no heartbeat)",
                        options.lost_after.as_secs_f64()
                    ));
                }
            }
            Err(e) => return SessionEnd::Lost(upload_failed.take().unwrap_or_else(|| e.to_string())),
        }
        if worker.poll_timeout().is_some_and(|t| at(epoch, t) <= StdInstant::now()) {
            worker.handle_timeout(since(epoch));
        }
    }
}

/// Runs the job on `params` for computation `id` on model `version`; its gradient is held
/// in `grad` until the job's emulated step time has passed. A gradient still held is
/// abandoned (a newer computation replaces it).
fn compute(
    job: &mut dyn WorkerJob,
    report: &mut WorkerReport,
    held: &mut Option<Held>,
    grad: &mut [f32],
    id: ComputeId,
    version: syncopate::Version,
    params: &[f32],
) {
    let now = StdInstant::now();
    if let Some(old) = held.take() {
        report.busy_s += now.duration_since(old.started).as_secs_f64();
        report.abandoned += 1;
    }
    let extra = job.gradient(params, grad);
    let loss = job.loss();
    report.last_version = Some(report.last_version.unwrap_or(0).max(version.0));
    *held = Some(Held { id, started: now, ready: StdInstant::now() + extra, loss });
}

/// Whether the server sent bytes not read yet (or closed the connection, or the socket has
/// an error for the reader to report), without blocking and without switching the socket to
/// non-blocking mode, which its clone in the writer thread shares.
#[cfg(unix)]
fn server_has_sent(stream: &TcpStream) -> bool {
    let mut byte = [core::mem::MaybeUninit::<u8>::uninit()];
    match socket2::SockRef::from(stream).recv_with_flags(&mut byte, libc::MSG_PEEK | libc::MSG_DONTWAIT) {
        Ok(_) => true,
        Err(e) => !matches!(e.kind(), std::io::ErrorKind::WouldBlock | std::io::ErrorKind::Interrupted),
    }
}

/// Without a non-blocking peek, the loop reads (a short wait) between every two steps.
#[cfg(not(unix))]
fn server_has_sent(_: &TcpStream) -> bool {
    true
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::protocol_spec::ProtocolKind;
    use crate::tcp::handshake::{Deadlines, ServerSide};
    use crate::tcp::settings::ProtocolSettings;
    use std::net::TcpListener;
    use std::sync::mpsc;
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
            Self { reader, writer, buf: Vec::new(), limits: Limits::for_model(dim) }
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

        /// The next message from the worker that is not a heartbeat: its kind and, for a
        /// gradient, the model version it was computed on.
        fn next(&mut self) -> (&'static str, Option<u64>) {
            loop {
                let deadline = StdInstant::now() + Duration::from_secs(10);
                let p = self.reader.read_frame(&mut self.buf, Some(deadline)).unwrap();
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

    #[test]
    fn backoff_doubles_to_its_cap_with_jitter_in_the_upper_half() {
        let b = Backoff { initial: Duration::from_millis(50), max: Duration::from_secs(1), ..Backoff::default() };
        assert_eq!(b.wait(0, 0.999_999).as_millis(), 49);
        assert_eq!(b.wait(0, 0.0), Duration::from_millis(25));
        assert_eq!(b.wait(3, 0.0), Duration::from_millis(200));
        assert_eq!(b.wait(10, 0.0), Duration::from_millis(500));
        assert_eq!(b.wait(u32::MAX, 1.0), Duration::from_secs(1));
    }
}
