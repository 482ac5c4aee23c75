//! The TCP parameter server.
//!
//! Threads: one accepts connections (with caps on the total and on connections still in the
//! handshake); one per connection runs the handshake under an absolute deadline and then
//! reads frames; one per connection writes frames from a bounded queue; and the thread that
//! called [`TcpServer::run`] drives the protocol. Readers hand frames to the protocol thread
//! over one bounded channel; buffers go back to their reader's pool, so steady state does not
//! allocate per gradient.
//!
//! Each outgoing message is encoded once; a broadcast shares the same bytes with every
//! writer (each writer adds its own sequence number and MAC). A writer queue that is full
//! means the worker does not read: its connection is dropped and the protocol is told the
//! worker was lost, so one stuck peer never stalls the server.
//!
//! A connection that ends, misbehaves (bad frame, bad MAC, undecodable message) or is
//! replaced by a newer session of the same worker is reported to the protocol with
//! `handle_worker_lost`. What happens next is the protocol's business: BSP waits (and
//! reports `Stalled` naming the worker), asynchronous and backup protocols go on.
//!
//! **Admission.** A connection is *unverified* until its first frame, the client hello, is
//! in and its early MAC checks out (with a secret; without one, until the hello is well
//! formed). Unverified connections live in a table of at most `max_unauthenticated`
//! entries with a short deadline for the hello (`hello_timeout`). A new connection is never
//! refused for want of room: it evicts the oldest unverified connection of the source
//! address holding the most entries. A slow-loris attacker without the secret therefore only
//! churns its own connections, while a worker, which sends its hello at once, leaves the
//! table within a round trip. Verified connections count toward `max_connections`; a hello
//! seen before (a replayed nonce) is refused. `adapters/transport/TCP.md` states the threat model.
//!
//! Checkpoints (if configured) are written after every `every`-th model update, before the
//! new model is sent to anyone, and at the end of a run.
//!
//! **Files, one concern each.** `accept.rs` (the listener and the accept thread),
//! `admission.rs` (the unverified table, nonces, claims on worker ids), `connection.rs` (a
//! session's handshake, reader and writer threads), `driver.rs` (the protocol thread's
//! loop), `initial_model.rs` (where the model comes from: known, or awaited from worker 0
//! with the other workers' messages held), `ledger.rs` (the conservation ledger and the
//! report's counters), `persist.rs` (checkpoints and their journal), `steps.rs` (step
//! times paired with contributions), `stragglers.rs` (the straggler report), `outbox.rs` (messages encoded once, shared by the
//! writers), `close.rs` (the lingering close), `report.rs` (what a run reports). What a
//! frame from a worker is, the framing layer [`payload`](super::payload) says.

mod accept;
mod admission;
mod close;
mod connection;
mod driver;
mod initial_model;
mod ledger;
mod outbox;
mod persist;
mod report;
mod steps;
mod stragglers;

use super::TcpError;
use super::auth::Secret;
use super::frame::{FrameReader, FrameTimeout, FrameWriter};
use super::handshake::Role;
use super::settings::RunSettings;
use accept::{accept_loop, is_loopback, listen};
use admission::{SeenNonces, Unverified};
use connection::start_uplink;
use core::net::SocketAddr;
use core::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};
use core::time::Duration;
use crossbeam_channel::{Sender, bounded};
use driver::Core;
use std::io::BufWriter;
use std::net::{TcpListener, TcpStream, ToSocketAddrs};
use std::path::PathBuf;
use std::sync::{Arc, Mutex};
use std::thread;
use syncopate::proto::{Heap, Optimizer, Rule};
use syncopate::{AnyServer, ProtocolConfig, Server, ServerEvent, ToServer, Version, WorkerId};

pub use report::{LossPoint, ServerReport, SessionLedger};
pub use stragglers::{WorkerRow, lines as straggler_lines};

/// An established session with an upstream server (see [`TcpServer::drive`]): the streams
/// after a successful client handshake.
#[derive(Debug)]
pub struct Uplink {
    /// The upstream server's address, for log lines.
    pub addr: String,
    /// The connection.
    pub stream: TcpStream,
    /// Reads the session's frames.
    pub reader: FrameReader,
    /// Writes the session's frames.
    pub writer: FrameWriter<BufWriter<TcpStream>>,
    /// The heartbeat interval agreed in its handshake ([`Session::beat`](crate::tcp::handshake::Session::beat)).
    pub beat: Duration,
}

/// Settings of a [`TcpServer`].
#[derive(Clone, Debug)]
pub struct ServerOptions {
    /// The run's settings, announced to every worker in the handshake; the server runs
    /// [`RunSettings::server_config`].
    pub settings: RunSettings,
    /// The shared secret; `None` runs unauthenticated (loopback only unless `insecure`).
    pub secret: Option<Secret>,
    /// Allow listening beyond loopback without a secret.
    pub insecure: bool,
    /// The absolute deadline of a handshake, from the connection's accept.
    pub handshake_timeout: Duration,
    /// The deadline of the first frame (the client hello), from the connection's accept: a
    /// worker sends it at once.
    pub hello_timeout: Duration,
    /// The deadline of each frame, from its first byte.
    pub frame_timeout: FrameTimeout,
    /// The most verified connections at once (past their hello, or in session).
    pub max_connections: usize,
    /// The most unverified connections (hello not yet in and verified); a new connection
    /// evicts one when the table is full.
    pub max_unauthenticated: usize,
    /// Frames queued per connection before the worker counts as not reading.
    pub send_queue: usize,
    /// How long one socket write may block.
    pub write_timeout: Duration,
    /// Write a checkpoint here every `every` model updates (and at the end).
    pub checkpoint: Option<(PathBuf, u64)>,
    /// What every checkpoint says besides the model: the run's identity and the gradients
    /// its earlier sessions accepted (added to this server's count).
    pub checkpoint_stamp: crate::tcp::checkpoint::Stamp,
    /// A resumed run: the state of the update rule ([`RunSettings::optimizer`], applied to
    /// every update by [`run`](TcpServer::run)) from its checkpoint, [`Optimizer::state_len`]
    /// elements, so the run goes on exactly (momentum's previous model, AdamW's moments and
    /// update count); `None` starts the rule afresh. Checkpoints hold the rule's state with
    /// the model.
    pub optimizer_state: Option<Vec<f32>>,
    /// A session (a worker's, or the upstream one) silent this long (no frame, no
    /// heartbeat) is lost; heartbeats go out at [`heartbeat_interval`](super::heartbeat_interval)
    /// of it.
    pub lost_after: Duration,
    /// The tensor encoding of every session's core messages (announced in the handshake; a
    /// worker asking for another is refused). The model, its sum and checkpoints stay `f32`.
    pub wire: syncopate::wire::Encoding,
    /// Offer a shared-memory region to each worker session that asks for one
    /// ([`shm`](super::shm)): a session whose worker proves it mapped the region (it runs on
    /// this host) sends its gradients and receives its models through it; every other
    /// session, and everything else, stays on TCP.
    pub shared_memory: bool,
}

impl ServerOptions {
    /// Defaults for a run of `settings`: no secret, hellos within 1 s, handshakes within 5 s,
    /// 10 s frames, 64 queued frames, checkpoints off, shared memory offered.
    pub fn new(settings: RunSettings) -> Self {
        let n = settings.peers().unwrap_or(settings.protocol.workers) as usize;
        Self {
            settings,
            secret: None,
            insecure: false,
            handshake_timeout: Duration::from_secs(5),
            hello_timeout: Duration::from_secs(1),
            frame_timeout: FrameTimeout::default(),
            max_connections: 2 * n + 16,
            max_unauthenticated: (4 * n + 64).min(1024),
            send_queue: 64,
            write_timeout: Duration::from_secs(10),
            checkpoint: None,
            checkpoint_stamp: crate::tcp::checkpoint::Stamp::default(),
            optimizer_state: None,
            lost_after: super::DEFAULT_LOST_AFTER,
            wire: syncopate::wire::Encoding::F32,
            shared_memory: true,
        }
    }
}

/// When a run ends.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct RunPlan {
    /// Stop (telling workers to stop) once the server has accepted this many gradients.
    pub max_gradients: u64,
    /// Stop after this much wall time, whatever the progress.
    pub time_limit: Option<Duration>,
}

/// Why a run ended.
#[derive(Clone, Copy, Debug, PartialEq, Eq, serde::Serialize)]
pub enum StopReason {
    /// The gradient budget was reached; workers were told to stop.
    Budget,
    /// The time limit passed; workers were told to stop.
    TimeLimit,
    /// [`ServerHandle::stop`] was called; workers were told to stop.
    Stopped,
    /// [`ServerHandle::crash`] was called: the server vanished without a word (tests of
    /// restarts).
    Crashed,
    /// The upstream server said stop; the workers were told to stop.
    UpstreamStopped,
    /// The upstream connection was lost: the connections were cut without a word, so the
    /// workers reconnect to a restarted process.
    UpstreamLost,
    /// The model diverged: a worker's contribution was refused for holding NaN, ±∞ or an
    /// overflowing norm, or [`DIVERGED_AFTER`](crate::tcp::refusal::DIVERGED_AFTER) of one
    /// worker's in a row for a loss that is not finite, or the caller found its loss not finite
    /// ([`ServerHandle::diverged`]). The workers were told to stop; no final checkpoint is
    /// written (it would hold the diverged model).
    Diverged,
    /// A shard whose every worker had left for the server's `lost_after`, after the run
    /// started: a shard's workers leave when another shard ended the run.
    WorkersGone,
}

/// What the server reports while it runs.
#[derive(Debug)]
pub enum Note<'a> {
    /// A line for the operator's log (connections, refusals, losses).
    Log(&'a str),
    /// An event of the protocol.
    Event(&'a ServerEvent),
    /// Every worker has connected at least once: the run's clock starts (wall time and
    /// time to target exclude the wait before).
    Started,
    /// A checkpoint of the model at `version` is about to be written: a recorder writes out
    /// what it holds now, so that a server killed after the checkpoint leaves a trace that
    /// covers it.
    Checkpoint {
        /// The version it holds.
        version: Version,
    },
    /// The model changed.
    Model {
        /// Its version.
        version: Version,
        /// The parameters.
        params: &'a [f32],
    },
    /// A worker's contribution (gradient, delta or clock update), before the protocol
    /// handles it, with the seconds of the gradient steps it holds when the run asks the
    /// workers for them ([`RunSettings::report_step_times`]; empty otherwise).
    Contribution {
        /// The worker.
        worker: WorkerId,
        /// The contribution.
        msg: &'a ToServer<'a, f32>,
        /// Its steps' times, oldest first.
        step_seconds: &'a [f32],
    },
}

#[derive(Debug, Default)]
struct Control {
    stop: Arc<AtomicBool>,
    crash: AtomicBool,
    diverged: AtomicBool,
}

/// Stops a running server from another thread.
#[derive(Clone, Debug)]
pub struct ServerHandle(Arc<Control>);

impl ServerHandle {
    /// Ends the run: workers are told to stop, a final checkpoint is written.
    pub fn stop(&self) {
        self.0.stop.store(true, Ordering::SeqCst);
    }

    /// The flag [`stop`](Self::stop) sets, for a signal handler to set instead.
    pub fn stop_flag(&self) -> Arc<AtomicBool> {
        Arc::clone(&self.0.stop)
    }

    /// Ends the run as [`StopReason::Diverged`]: the caller's evaluation found the model's
    /// loss not finite. Workers are told to stop; no final checkpoint is written.
    pub fn diverged(&self) {
        self.0.diverged.store(true, Ordering::SeqCst);
    }

    /// Ends the run abruptly, as if the process died: connections are cut, nothing is sent,
    /// no final checkpoint.
    pub fn crash(&self) {
        self.0.crash.store(true, Ordering::SeqCst);
    }
}

/// A bound server, ready to [`run`](Self::run).
#[derive(Debug)]
pub struct TcpServer {
    listener: TcpListener,
    options: ServerOptions,
    announce: Announce,
    control: Arc<Control>,
}

/// What the server announces and runs, derived once from its settings.
#[derive(Clone, Debug)]
struct Announce {
    /// The canonical bytes of the settings.
    bytes: Vec<u8>,
    /// Their SHA-256.
    digest: [u8; 32],
    /// One line describing them.
    label: String,
    /// The configuration this server runs.
    config: ProtocolConfig,
    /// The model dimension.
    dim: usize,
    /// The role of every peer.
    role: Role,
}

impl Announce {
    fn new(settings: &RunSettings) -> Result<Self, String> {
        let bytes = settings.encode()?;
        let config = settings.server_config()?;
        // A shard serves its slice of the model.
        let dim = settings.served_range()?.len();
        let role = if settings.remote_groups { Role::Group } else { Role::Worker };
        Ok(Self { digest: super::settings::digest(&bytes), bytes, label: settings.label(), config, dim, role })
    }
}

/// What the connection threads (accept, readers, writers, the upstream session's) tell the
/// protocol thread, over one bounded channel.
enum ConnEvent {
    Log(String),
    HandshakeFailed,
    Connected {
        conn: u64,
        worker: WorkerId,
        epoch: u32,
        addr: SocketAddr,
        tx: Sender<Arc<Vec<u8>>>,
        stream: TcpStream,
        done: Arc<AtomicBool>,
    },
    Frame(RawFrame),
    /// A frame for session `conn`'s writer from its reader (the shared-memory exchange).
    Reply {
        conn: u64,
        worker: WorkerId,
        bytes: Vec<u8>,
    },
    Closed {
        conn: u64,
        worker: WorkerId,
        reason: String,
    },
    Upstream {
        buf: Vec<u8>,
        start: usize,
        end: usize,
    },
    UpstreamClosed {
        reason: String,
    },
}

/// A frame read from a worker's session `conn`: its payload is `buf[start..end]`, and the
/// buffer goes back to its reader's pool through `home`.
struct RawFrame {
    conn: u64,
    worker: WorkerId,
    buf: Vec<u8>,
    start: usize,
    end: usize,
    home: Sender<Vec<u8>>,
    /// For a slot frame of a session whose shared memory is on: the message in the slot.
    slot: Option<connection::SlotRef>,
}

impl RawFrame {
    /// The frame's payload.
    fn payload(&self) -> &[u8] {
        self.buf.get(self.start..self.end).unwrap_or_default()
    }

    /// The message the frame carries: the slot's for a slot frame that matches its slot
    /// (the slot goes back to the worker when the frame is dropped), else the payload.
    fn message(&self) -> &[u8] {
        self.slot.as_ref().and_then(connection::SlotRef::bytes).unwrap_or_else(|| self.payload())
    }

    /// Gives the buffer back to its reader.
    fn recycle(self) {
        let _ = self.home.try_send(self.buf);
    }
}

struct Conn {
    id: u64,
    tx: Sender<Arc<Vec<u8>>>,
    stream: TcpStream,
    /// Set by the writer thread when it has exited.
    done: Arc<AtomicBool>,
}

struct Shared {
    options: ServerOptions,
    announce: Announce,
    unverified: Mutex<Unverified>,
    /// Nonces of verified hellos (bounded), so a recorded hello cannot be replayed.
    seen: Mutex<SeenNonces>,
    evictions: AtomicU64,
    /// Connection threads alive (bounds the threads and sockets an attack can pin).
    threads: AtomicUsize,
    server_id: u64,
    version: AtomicU64,
    epochs: Mutex<Vec<u32>>,
    /// Live sessions and recent replacements of live sessions, per worker id.
    claims: Mutex<admission::Claims>,
    next_conn: AtomicU64,
    connections: AtomicUsize,
    failures: AtomicU64,
    closing: AtomicBool,
    session_max_len: usize,
    /// The sessions' shared-memory regions, unlinked when the run ends.
    shm: super::shm::Registry,
}

/// Decrements a counter when dropped.
struct Slot<'a>(&'a AtomicUsize);

impl Drop for Slot<'_> {
    fn drop(&mut self) {
        self.0.fetch_sub(1, Ordering::SeqCst);
    }
}

impl TcpServer {
    /// Binds `addr`. Without a secret, an address that is not loopback is refused unless
    /// `options.insecure` is set.
    pub fn bind(addr: &str, options: ServerOptions) -> Result<Self, TcpError> {
        let addrs: Vec<SocketAddr> =
            addr.to_socket_addrs().map_err(|e| TcpError(format!("invalid listen address '{addr}': {e}")))?.collect();
        if addrs.is_empty() {
            return Err(TcpError(format!("listen address '{addr}' resolves to nothing")));
        }
        if options.secret.is_none() && !options.insecure && !addrs.iter().all(is_loopback) {
            return Err(TcpError(format!(
                "refusing to listen on {addr} without a shared secret: give --secret-file or ${}, listen on \
                 127.0.0.1, or pass --insecure",
                super::auth::SECRET_ENV
            )));
        }
        crate::tcp::check_lost_after(options.lost_after).map_err(|e| TcpError(format!("lost_after: {e}")))?;
        options.settings.check_optimizer().map_err(|e| TcpError(format!("invalid run settings: {e}")))?;
        if options.settings.optimizer.rule == Rule::Mean && options.checkpoint.is_some() {
            return Err(TcpError(
                "no checkpoints under update rule mean: the server holds a round's mean gradient, not a model (the \
                 workers hold the models and their optimizers' state)"
                    .into(),
            ));
        }
        let announce = Announce::new(&options.settings).map_err(|e| TcpError(format!("invalid run settings: {e}")))?;
        let listener = listen(&addrs).map_err(|e| TcpError(format!("cannot listen on {addr}: {e}")))?;
        Ok(Self { listener, options, announce, control: Arc::default() })
    }

    /// The address the server listens on (with the real port when bound to port 0).
    pub fn local_addr(&self) -> Result<SocketAddr, TcpError> {
        self.listener.local_addr().map_err(|e| TcpError(format!("listener address: {e}")))
    }

    /// The settings the server was bound with.
    pub fn options(&self) -> &ServerOptions {
        &self.options
    }

    /// The configuration the server runs ([`RunSettings::server_config`]).
    pub fn config(&self) -> &ProtocolConfig {
        &self.announce.config
    }

    /// The model dimension.
    pub fn dim(&self) -> usize {
        self.announce.dim
    }

    /// A handle to stop the run from another thread.
    pub fn handle(&self) -> ServerHandle {
        ServerHandle(Arc::clone(&self.control))
    }

    /// Serves the protocol on the model `params` at `version` (0, or a checkpoint's) until
    /// the plan says stop. `note` sees logs, events and model changes.
    pub fn run(
        mut self,
        params: Vec<f32>,
        version: Version,
        plan: &RunPlan,
        note: &mut dyn FnMut(Note<'_>),
    ) -> Result<ServerReport, TcpError> {
        let dim = self.announce.dim;
        if params.len() != dim {
            return Err(TcpError(format!("the model has {} parameters, the server expects {dim}", params.len())));
        }
        let state = self.options.optimizer_state.take();
        let optimizer = self.options.settings.optimizer;
        let server = any_server(&self.announce.config, optimizer, params, version, state)?;
        self.drive(server, None, plan, note)
    }

    /// Serves the protocol on the initial parameters worker 0 sends as its first message
    /// (see [`initial`](super::initial); the settings must say
    /// [`RunSettings::initial_from_worker`]), until the plan says stop. Until they arrive,
    /// nothing reaches the protocol: the other workers' messages are held, and the run's
    /// clock has not started. A run that ends before they arrive reports
    /// [`ServerReport::initial_model_known`] false.
    pub fn run_with_initial_from_worker(
        self,
        plan: &RunPlan,
        note: &mut dyn FnMut(Note<'_>),
    ) -> Result<ServerReport, TcpError> {
        if !self.options.settings.initial_from_worker {
            return Err(TcpError("the run's settings do not ask worker 0 for the initial parameters".into()));
        }
        let (config, optimizer, dim) = (self.announce.config, self.options.settings.optimizer, self.announce.dim);
        let placeholder = any_server(&config, optimizer, vec![0.0; dim], Version::ZERO, None)?;
        let build: initial_model::BuildServer<AnyServer<f32, Vec<f32>, Heap>> =
            Box::new(move |params| any_server(&config, optimizer, params, Version::ZERO, None).map_err(|e| e.0));
        self.drive_inner(placeholder, None, plan, note, Some(build))
    }

    /// Serves `server` (built for [`config`](Self::config) on a model of [`dim`](Self::dim)) until the
    /// plan says stop, exactly as [`run`](Self::run) does. A server with an upstream
    /// ([`Server::has_upstream`]) needs an `uplink` and a server without one must not get
    /// one (refused before anything starts): its
    /// [`ServerOutput::Upstream`](syncopate::ServerOutput::Upstream) messages go to the
    /// upstream server and the replies back to [`Server::handle_upstream`]. The run then
    /// also ends when the upstream server says stop ([`StopReason::UpstreamStopped`]) or the
    /// upstream connection is lost ([`StopReason::UpstreamLost`]).
    pub fn drive<S: Server<f32>>(
        self,
        server: S,
        uplink: Option<Uplink>,
        plan: &RunPlan,
        note: &mut dyn FnMut(Note<'_>),
    ) -> Result<ServerReport, TcpError> {
        self.drive_inner(server, uplink, plan, note, None)
    }

    /// [`drive`](Self::drive), with the server first waiting for worker 0's initial
    /// parameters when `build` is given.
    fn drive_inner<S: Server<f32>>(
        self,
        server: S,
        uplink: Option<Uplink>,
        plan: &RunPlan,
        note: &mut dyn FnMut(Note<'_>),
        build: Option<initial_model::BuildServer<S>>,
    ) -> Result<ServerReport, TcpError> {
        let Self { listener, options, announce, control } = self;
        let dim = announce.dim;
        if server.params().len() != dim {
            return Err(TcpError(format!(
                "the model has {} parameters, the server expects {dim}",
                server.params().len()
            )));
        }
        match (server.has_upstream(), uplink.is_some()) {
            (true, false) => {
                return Err(TcpError("the server sends messages upstream but has no upstream connection".into()));
            }
            (false, true) => {
                return Err(TcpError("an upstream connection for a server that has no upstream".into()));
            }
            _ => {}
        }
        let version = server.version();
        accept::wait_for_connections(&listener).map_err(|e| TcpError(format!("listener: {e}")))?;
        let waker = listener.try_clone().map_err(|e| TcpError(format!("listener: {e}")))?;
        let n = announce.config.workers() as usize;
        let server_id = u64::from_le_bytes(
            super::auth::nonce().map_err(|e| TcpError(e.to_string()))?[..8].try_into().unwrap_or_default(),
        );
        let shared = Arc::new(Shared {
            announce,
            unverified: Mutex::default(),
            seen: Mutex::default(),
            evictions: AtomicU64::new(0),
            threads: AtomicUsize::new(0),
            session_max_len: super::session_max_len(dim),
            options,
            server_id,
            version: AtomicU64::new(version.0),
            epochs: Mutex::new(vec![0; n]),
            claims: Mutex::new(admission::Claims::new(n)),
            next_conn: AtomicU64::new(0),
            connections: AtomicUsize::new(0),
            failures: AtomicU64::new(0),
            closing: AtomicBool::new(false),
            shm: super::shm::Registry::default(),
        });
        let (in_tx, in_rx) = bounded::<ConnEvent>(4 * n + 64);
        let accept = {
            let shared = Arc::clone(&shared);
            let in_tx = in_tx.clone();
            thread::Builder::new()
                .name("syncopate-accept".into())
                .spawn(move || accept_loop(&listener, &shared, &in_tx))
                .map_err(|e| TcpError(format!("cannot start the accept thread: {e}")))?
        };
        let up = match uplink {
            Some(link) => Some(start_uplink(link, &in_tx, options_send_queue(&shared), shared.options.lost_after)?),
            None => None,
        };
        let mut core = Core::new(server, build, up, Arc::clone(&shared), note);
        let reason = core.run(&in_rx, plan, &control, note);
        core.finish(reason, &in_rx, note);
        shared.shm.unlink_all();
        shared.closing.store(true, Ordering::SeqCst);
        accept::wake(&waker);
        drop(in_rx);
        let _ = accept.join();
        Ok(core.into_report(reason, shared.evictions.load(Ordering::SeqCst)))
    }
}

/// The protocol's server for `config` on `params` at `version`, every update through
/// `optimizer` (going on from its checkpointed state `resumed`, if given).
fn any_server(
    config: &ProtocolConfig,
    optimizer: Optimizer,
    params: Vec<f32>,
    version: Version,
    resumed: Option<Vec<f32>>,
) -> Result<AnyServer<f32, Vec<f32>, Heap>, TcpError> {
    let dim = params.len();
    let scratch = vec![0.0f32; config.server_scratch_len(dim)];
    let spare = vec![0.0f32; config.spare_accumulator_len(dim)];
    let server = AnyServer::<f32, Vec<f32>, Heap>::resume(config, params, scratch, version)
        .and_then(|s| s.with_spare_accumulator(spare))
        .map_err(|e| TcpError(format!("invalid protocol settings: {e}")))?;
    let rule = || crate::optimizer_spec::describe(&optimizer);
    let needed = optimizer.state_len(dim);
    let ruled = match resumed {
        _ if optimizer.is_plain() => return Ok(server),
        Some(state) if state.len() != needed => {
            return Err(TcpError(format!(
                "the checkpoint's state of update rule {} has {} elements, the rule keeps {needed} for {dim} \
                 parameters",
                rule(),
                state.len()
            )));
        }
        Some(state) => server.with_optimizer_state(optimizer, state),
        None => server.with_optimizer(optimizer, vec![0.0f32; needed]),
    };
    ruled.map_err(|e| TcpError(format!("update rule {}: {e}", rule())))
}

fn options_send_queue(shared: &Shared) -> usize {
    shared.options.send_queue.max(1)
}
