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

use super::auth::Secret;
use super::checkpoint;
use super::frame::{FrameError, FrameReader, FrameTimeout, FrameWriter};
use super::handshake::{self, ClientHello, Deadlines, HandshakeError, RefuseCode, Role, ServerSide};
use super::settings::RunSettings;
use super::{TcpError, at, since};
use core::net::{IpAddr, SocketAddr};
use core::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};
use core::time::Duration;
use crossbeam_channel::{Receiver, RecvTimeoutError, Sender, TrySendError, bounded};
use std::collections::{HashMap, HashSet, VecDeque};
use std::io::BufWriter;
use std::net::{Shutdown, TcpListener, TcpStream, ToSocketAddrs};
use std::path::PathBuf;
use std::sync::{Arc, Mutex};
use std::thread;
use std::time::Instant as StdInstant;
use syncopate::proto::Heap;
use syncopate::wire::{self, Limits};
use syncopate::{
    AnyServer, ProtocolConfig, Recipient, Server, ServerEvent, ServerOutput, ServerStats, ToServer, ToWorker, Version,
    WorkerId,
};

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
}

impl ServerOptions {
    /// Defaults for a run of `settings`: no secret, hellos within 1 s, handshakes within 5 s,
    /// 10 s frames, 64 queued frames, checkpoints off.
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
    /// The model changed.
    Model {
        /// Its version.
        version: Version,
        /// The parameters.
        params: &'a [f32],
    },
}

/// The outcome of a run.
#[derive(Clone, Debug, PartialEq)]
pub struct ServerReport {
    /// Why it ended.
    pub reason: StopReason,
    /// The final model version.
    pub version: Version,
    /// The final model.
    pub params: Vec<f32>,
    /// The protocol's counters.
    pub stats: ServerStats,
    /// Seconds the run took, from the moment every worker had connected (or, if some never
    /// did, from the start).
    pub wall_s: f64,
    /// Seconds from the start until every worker had connected (`None` if some never did).
    pub connect_wait_s: Option<f64>,
    /// Per worker, in id order: seconds from a model's dispatch to the worker until its next
    /// gradient arrived, summed (compute time as the server sees it, network included).
    pub busy_s: Vec<f64>,
    /// Staleness of applied contributions: sum, count, max.
    pub staleness: (u64, u64, u64),
    /// `Stalled` events.
    pub stalls: u64,
    /// The last stall: the worker waited for and how many were missing.
    pub last_stall: Option<(WorkerId, u32)>,
    /// Messages refused (undecodable or refused by the protocol).
    pub refused: u64,
    /// Contributions per worker (applied or dropped), in id order.
    pub per_worker: Vec<u64>,
    /// Sessions established.
    pub sessions: u64,
    /// Workers declared lost.
    pub lost: u64,
    /// Handshakes refused or failed.
    pub handshake_failures: u64,
    /// Unverified connections evicted to make room for new ones.
    pub evicted: u64,
    /// Checkpoints written.
    pub checkpoints: u64,
    /// Conservation ledger: contributions (gradients, deltas, clock updates) read from the
    /// workers' current sessions and handed to the protocol (each is then accepted or
    /// refused).
    pub received: u64,
    /// Of [`Self::received`], those the protocol refused (duplicates, stale sessions…).
    pub refused_contributions: u64,
    /// Contributions read from a session that had already been replaced or cut (lost with
    /// the connection; the protocol never sees them).
    pub discarded: u64,
    /// Contributions that arrived after the run stopped (in flight at the stop).
    pub in_flight_at_stop: u64,
    /// The same four counts per session (connection), in the order sessions began.
    pub session_ledgers: Vec<SessionLedger>,
}

/// One session's part of the conservation ledger (see [`ServerReport::received`]).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, serde::Serialize)]
pub struct SessionLedger {
    /// The worker.
    pub worker: u32,
    /// Its session epoch.
    pub epoch: u32,
    /// Contributions read and handed to the protocol.
    pub received: u64,
    /// Of those, refused.
    pub refused: u64,
    /// Read after the session was replaced or cut.
    pub discarded: u64,
    /// Arrived after the run stopped.
    pub in_flight_at_stop: u64,
}

#[derive(Debug, Default)]
struct Control {
    stop: Arc<AtomicBool>,
    crash: AtomicBool,
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
        let dim = settings.dim()?;
        let role = if settings.remote_groups { Role::Group } else { Role::Worker };
        Ok(Self { digest: super::settings::digest(&bytes), bytes, label: settings.label(), config, dim, role })
    }
}

enum Inbound {
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
    Frame {
        conn: u64,
        worker: WorkerId,
        buf: Vec<u8>,
        start: usize,
        end: usize,
        home: Sender<Vec<u8>>,
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
    next_conn: AtomicU64,
    connections: AtomicUsize,
    failures: AtomicU64,
    closing: AtomicBool,
    session_max_len: usize,
}

/// Decrements a counter when dropped.
struct Slot<'a>(&'a AtomicUsize);

impl Drop for Slot<'_> {
    fn drop(&mut self) {
        self.0.fetch_sub(1, Ordering::SeqCst);
    }
}

/// One unverified connection.
#[derive(Debug)]
struct Pending {
    id: u64,
    source: IpAddr,
    stream: TcpStream,
}

/// The unverified connections, oldest first.
#[derive(Debug, Default)]
struct Unverified {
    next: u64,
    entries: VecDeque<Pending>,
}

impl Unverified {
    /// Admits a connection from `source`; when `cap` are already waiting, evicts the oldest
    /// of the source that holds the most (returned, to be cut).
    fn admit(&mut self, source: IpAddr, stream: TcpStream, cap: usize) -> (u64, Option<Pending>) {
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
    fn leave(&mut self, id: u64) -> bool {
        match self.entries.iter().position(|e| e.id == id) {
            Some(i) => self.entries.remove(i).is_some(),
            None => false,
        }
    }
}

/// A bounded set of recently seen hello nonces.
#[derive(Debug, Default)]
struct SeenNonces {
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

/// The kernel's queue of connections not yet accepted: deep, so a burst of attacker
/// connections does not fill it and make the kernel drop a worker's connection attempt
/// (which the worker's TCP stack would only retry after a second or more).
const LISTEN_BACKLOG: i32 = 4096;

/// A listener on the first of `addrs` that binds, with a deep backlog.
fn listen(addrs: &[SocketAddr]) -> std::io::Result<TcpListener> {
    let mut last = std::io::Error::new(std::io::ErrorKind::AddrNotAvailable, "no address to listen on");
    for a in addrs {
        let socket = socket2::Socket::new(socket2::Domain::for_address(*a), socket2::Type::STREAM, None)?;
        #[cfg(unix)]
        socket.set_reuse_address(true)?;
        match socket.bind(&(*a).into()).and_then(|()| socket.listen(LISTEN_BACKLOG)) {
            Ok(()) => return Ok(socket.into()),
            Err(e) => last = e,
        }
    }
    Err(last)
}

fn is_loopback(addr: &SocketAddr) -> bool {
    addr.ip().is_loopback()
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
        self,
        params: Vec<f32>,
        version: Version,
        plan: &RunPlan,
        note: &mut dyn FnMut(Note<'_>),
    ) -> Result<ServerReport, TcpError> {
        let dim = self.announce.dim;
        if params.len() != dim {
            return Err(TcpError(format!("the model has {} parameters, the server expects {dim}", params.len())));
        }
        let config = self.announce.config;
        let scratch = vec![0.0f32; config.server_scratch_len(dim)];
        let spare = vec![0.0f32; config.spare_accumulator_len(dim)];
        let server = AnyServer::<f32, Vec<f32>, Heap>::resume(&config, params, scratch, version)
            .and_then(|s| s.with_spare_accumulator(spare))
            .map_err(|e| TcpError(format!("invalid protocol settings: {e}")))?;
        self.drive(server, None, plan, note)
    }

    /// Serves `server` (built for [`config`](Self::config) on a model of [`dim`](Self::dim)) until the
    /// plan says stop, exactly as [`run`](Self::run) does. A server with an upstream
    /// ([`Server::has_upstream`]) needs an `uplink` and a server without one must not get
    /// one (refused before anything starts): its [`ServerOutput::Upstream`] messages go to
    /// the upstream server and the replies back to [`Server::handle_upstream`]. The run then
    /// also ends when the upstream server says stop ([`StopReason::UpstreamStopped`]) or the
    /// upstream connection is lost ([`StopReason::UpstreamLost`]).
    pub fn drive<S: Server<f32>>(
        self,
        server: S,
        uplink: Option<Uplink>,
        plan: &RunPlan,
        note: &mut dyn FnMut(Note<'_>),
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
        listener.set_nonblocking(true).map_err(|e| TcpError(format!("listener: {e}")))?;
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
            next_conn: AtomicU64::new(0),
            connections: AtomicUsize::new(0),
            failures: AtomicU64::new(0),
            closing: AtomicBool::new(false),
        });
        let (in_tx, in_rx) = bounded::<Inbound>(4 * n + 64);
        let accept = {
            let shared = Arc::clone(&shared);
            let in_tx = in_tx.clone();
            thread::Builder::new()
                .name("syncopate-accept".into())
                .spawn(move || accept_loop(&listener, &shared, &in_tx))
                .map_err(|e| TcpError(format!("cannot start the accept thread: {e}")))?
        };
        let up = match uplink {
            Some(link) => Some(start_uplink(link, &in_tx, options_send_queue(&shared))?),
            None => None,
        };
        let mut core = Core {
            server,
            up,
            upstream_end: None,
            shared: Arc::clone(&shared),
            conns: (0..n).map(|_| None).collect(),
            epoch: StdInstant::now(),
            started: None,
            seen_worker: vec![false; n],
            dispatched: vec![None; n],
            report: ServerReport {
                reason: StopReason::Budget,
                version,
                params: Vec::new(),
                stats: ServerStats::default(),
                wall_s: 0.0,
                connect_wait_s: None,
                busy_s: vec![0.0; n],
                staleness: (0, 0, 0),
                stalls: 0,
                last_stall: None,
                refused: 0,
                per_worker: vec![0; n],
                sessions: 0,
                lost: 0,
                handshake_failures: 0,
                evicted: 0,
                checkpoints: 0,
                received: 0,
                refused_contributions: 0,
                discarded: 0,
                in_flight_at_stop: 0,
                session_ledgers: Vec::new(),
            },
            session_index: HashMap::new(),
            journal: None,
            applied_by_version: std::collections::BTreeMap::new(),
            limits: Limits::for_model(dim),
            checkpoint_due: false,
            last_version: version,
            // Enough for a broadcast and a message to each worker in flight; more are freed
            // once sent, so a burst of queued frames does not pin its memory for good.
            bufs: SharedBufs::new(2 * n + 2),
        };
        if let Some((path, _)) = &shared.options.checkpoint {
            // The journal of what is applied between checkpoints (read by `--resume`).
            match checkpoint::Journal::start(path, version, &checkpoint::Totals::default()) {
                Ok(j) => core.journal = Some(j),
                Err(e) => note(Note::Log(&e.to_string())),
            }
        }
        let reason = core.run(&in_rx, plan, &control, note);
        core.finish(reason, &in_rx, note);
        shared.closing.store(true, Ordering::SeqCst);
        drop(in_rx);
        let _ = accept.join();
        core.report.reason = reason;
        core.report.version = core.server.version();
        core.report.params = core.server.params().to_vec();
        core.report.stats = *core.server.stats();
        core.report.wall_s = core.started.unwrap_or(core.epoch).elapsed().as_secs_f64();
        core.report.connect_wait_s = core.started.map(|t| t.duration_since(core.epoch).as_secs_f64());
        core.report.evicted = shared.evictions.load(Ordering::SeqCst);
        Ok(core.report)
    }
}

/// How long the accept thread pauses when too many connection threads are alive; the
/// kernel's backlog holds new connections meanwhile.
const THREAD_PRESSURE_PAUSE: Duration = Duration::from_millis(2);

/// Stack size of a connection thread: it holds buffers on the heap only.
const CONNECTION_STACK: usize = 256 * 1024;

fn accept_loop(listener: &TcpListener, shared: &Arc<Shared>, in_tx: &Sender<Inbound>) {
    let opts = &shared.options;
    // Evicted connections' threads take a moment to notice; beyond this many live threads
    // the accept thread waits for them rather than pile up more.
    let max_threads = opts.max_unauthenticated.saturating_mul(2).saturating_add(opts.max_connections);
    while !shared.closing.load(Ordering::SeqCst) {
        if shared.threads.load(Ordering::SeqCst) >= max_threads {
            thread::sleep(THREAD_PRESSURE_PAUSE);
            continue;
        }
        match listener.accept() {
            Ok((stream, addr)) => {
                let Ok(handle) = stream.try_clone() else {
                    continue;
                };
                let (pending, evicted) = shared
                    .unverified
                    .lock()
                    .unwrap_or_else(std::sync::PoisonError::into_inner)
                    .admit(addr.ip(), handle, opts.max_unauthenticated);
                if let Some(victim) = evicted {
                    let _ = victim.stream.shutdown(Shutdown::Both);
                    let k = shared.evictions.fetch_add(1, Ordering::SeqCst);
                    if k < 5 || k % 1000 == 0 {
                        let _ = in_tx.send(Inbound::Log(format!(
                            "unauthenticated connections table full: evicted the oldest from {} ({} evictions so far)",
                            victim.source,
                            k + 1
                        )));
                    }
                }
                shared.threads.fetch_add(1, Ordering::SeqCst);
                let shared2 = Arc::clone(shared);
                let tx = in_tx.clone();
                let spawned = thread::Builder::new().name("syncopate-conn".into()).stack_size(CONNECTION_STACK).spawn(
                    move || {
                        let _alive = Slot(&shared2.threads);
                        connection(stream, addr, pending, &shared2, &tx);
                    },
                );
                if spawned.is_err() {
                    shared.threads.fetch_sub(1, Ordering::SeqCst);
                    shared.unverified.lock().unwrap_or_else(std::sync::PoisonError::into_inner).leave(pending);
                }
            }
            Err(e) if e.kind() == std::io::ErrorKind::WouldBlock => thread::sleep(Duration::from_millis(5)),
            Err(_) => thread::sleep(Duration::from_millis(20)),
        }
    }
}

fn log_failure(shared: &Shared, tx: &Sender<Inbound>, line: String) {
    let k = shared.failures.fetch_add(1, Ordering::SeqCst);
    let _ = tx.send(Inbound::HandshakeFailed);
    // Rate limit: the first 20 failures, then every 100th.
    if k < 20 || k % 100 == 0 {
        let _ = tx.send(Inbound::Log(line));
    }
}

/// Takes an unverified connection out of the table when its thread ends, whatever the
/// outcome.
struct LeaveTable<'a> {
    shared: &'a Shared,
    pending: u64,
}

impl Drop for LeaveTable<'_> {
    fn drop(&mut self) {
        self.shared.unverified.lock().unwrap_or_else(std::sync::PoisonError::into_inner).leave(self.pending);
    }
}

/// The admission of a connection whose hello checked out: it leaves the unverified table
/// (unless it was evicted meanwhile), takes a verified slot, its nonce must be new, and it
/// gets its epoch.
fn admit(shared: &Shared, pending: u64, hello: &ClientHello) -> Result<u32, (RefuseCode, String)> {
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

fn connection(stream: TcpStream, addr: SocketAddr, pending: u64, shared: &Arc<Shared>, tx: &Sender<Inbound>) {
    let table = LeaveTable { shared, pending };
    let opts = &shared.options;
    let _ = stream.set_nodelay(true);
    let _ = stream.set_write_timeout(Some(opts.write_timeout.min(opts.handshake_timeout)));
    let (Ok(read_half), Ok(write_half)) = (stream.try_clone(), stream.try_clone()) else {
        return;
    };
    let mut reader = FrameReader::new(read_half, handshake::HANDSHAKE_MAX_LEN, opts.frame_timeout);
    let mut writer = FrameWriter::new(BufWriter::with_capacity(1 << 16, write_half), handshake::HANDSHAKE_MAX_LEN);
    let a = &shared.announce;
    let side = ServerSide {
        settings: &a.bytes,
        digest: a.digest,
        label: &a.label,
        peers: a.config.workers(),
        role: a.role,
        secret: opts.secret.as_ref(),
        server_id: shared.server_id,
        version: shared.version.load(Ordering::SeqCst),
    };
    let now = StdInstant::now();
    let deadlines =
        Deadlines { hello: now + opts.hello_timeout.min(opts.handshake_timeout), done: now + opts.handshake_timeout };
    let admitted = core::cell::Cell::new(false);
    let result = handshake::server_handshake(&mut reader, &mut writer, &side, deadlines, shared.session_max_len, |h| {
        let epoch = admit(shared, pending, h)?;
        admitted.set(true);
        Ok(epoch)
    });
    drop(table);
    let _verified = admitted.get().then(|| Slot(&shared.connections));
    let session = match result {
        Ok(s) => s,
        Err(e) => {
            let who = match &e {
                HandshakeError::Refusing { worker: Some(w), .. } => format!(" (worker {})", w.0),
                _ => String::new(),
            };
            log_failure(shared, tx, format!("handshake with {addr}{who} failed: {e}"));
            let _ = stream.shutdown(Shutdown::Both);
            return;
        }
    };
    let _ = stream.set_write_timeout(Some(opts.write_timeout));
    // Only now, for an authenticated session: large socket buffers for large frames.
    if let Err(e) = super::frame::tune_stream(&stream, shared.session_max_len) {
        let _ = tx.send(Inbound::Log(format!("worker {}: cannot size the socket buffers: {e}", session.worker.0)));
    }
    let conn = shared.next_conn.fetch_add(1, Ordering::SeqCst);
    let worker = session.worker;
    let (out_tx, out_rx) = bounded::<Arc<Vec<u8>>>(opts.send_queue.max(1));
    let Ok(stream2) = stream.try_clone() else {
        return;
    };
    let writer_tx = tx.clone();
    let done = Arc::new(AtomicBool::new(false));
    let done2 = Arc::clone(&done);
    let spawned = thread::Builder::new().name(format!("syncopate-write-{}", worker.0)).spawn(move || {
        for bytes in out_rx {
            if let Err(e) = writer.write_frame(&bytes) {
                let _ = writer_tx.send(Inbound::Closed { conn, worker, reason: format!("write failed: {e}") });
                let _ = stream2.shutdown(Shutdown::Both);
                done2.store(true, Ordering::SeqCst);
                return;
            }
        }
        let _ = stream2.shutdown(Shutdown::Write);
        done2.store(true, Ordering::SeqCst);
    });
    let Ok(writer_thread) = spawned else {
        return;
    };
    let Ok(stream3) = stream.try_clone() else {
        return;
    };
    let connected = Inbound::Connected { conn, worker, epoch: session.epoch, addr, tx: out_tx, stream: stream3, done };
    if tx.send(connected).is_err() {
        return;
    }
    // Read frames until the connection ends; buffers come back through `home`.
    let (home, pool) = bounded::<Vec<u8>>(8);
    let reason = loop {
        let mut buf = pool.try_recv().unwrap_or_default();
        match reader.read_frame(&mut buf, None) {
            Ok(p) => {
                let frame = Inbound::Frame { conn, worker, buf, start: p.start, end: p.end, home: home.clone() };
                if tx.send(frame).is_err() {
                    break None;
                }
            }
            Err(FrameError::Closed) => break Some("connection closed".to_owned()),
            Err(e) => break Some(e.to_string()),
        }
    };
    if let Some(reason) = reason {
        let _ = tx.send(Inbound::Closed { conn, worker, reason });
    }
    // The writer ends once the protocol thread lets go of the connection; let it send what
    // it has (a final Stop) before the socket closes.
    let _ = writer_thread.join();
    let _ = stream.shutdown(Shutdown::Both);
}

struct Core<S> {
    server: S,
    /// The upstream session, if the server has one.
    up: Option<Conn>,
    /// Set when the upstream server said stop or its connection ended.
    upstream_end: Option<StopReason>,
    shared: Arc<Shared>,
    conns: Vec<Option<Conn>>,
    epoch: StdInstant,
    /// When every worker had connected at least once: the run's clock starts.
    started: Option<StdInstant>,
    /// Which workers have connected at least once.
    seen_worker: Vec<bool>,
    /// Per worker: when a model was sent that the worker has not answered with a gradient.
    dispatched: Vec<Option<StdInstant>>,
    report: ServerReport,
    limits: Limits,
    checkpoint_due: bool,
    last_version: Version,
    /// Encoded messages, reused once every writer has sent them.
    bufs: SharedBufs,
    /// Connection id → index in [`ServerReport::session_ledgers`].
    session_index: HashMap<u64, usize>,
    /// The journal next to the checkpoint, if checkpoints are written.
    journal: Option<checkpoint::Journal>,
    /// Applied contributions per worker of versions not yet made (for the journal).
    applied_by_version: std::collections::BTreeMap<u64, Vec<u64>>,
}

/// Buffers of encoded outgoing messages. Each message is encoded once into one of them and
/// shared by every writer that sends it; a buffer no writer holds any more is reused for the
/// next message, so a model broadcast neither allocates nor zeroes a fresh buffer of the
/// model's size.
struct SharedBufs {
    bufs: Vec<Arc<Vec<u8>>>,
    keep: usize,
}

impl SharedBufs {
    fn new(keep: usize) -> Self {
        Self { bufs: Vec::with_capacity(keep), keep }
    }

    /// A buffer holding what `encode` wrote into `len` bytes, ready to share.
    fn fill<E>(&mut self, len: usize, encode: impl FnOnce(&mut [u8]) -> Result<usize, E>) -> Result<Arc<Vec<u8>>, E> {
        // Only this pool clones these `Arc`s, so a count of 1 cannot go back up.
        let free = self.bufs.iter().position(|b| Arc::strong_count(b) == 1 && Arc::weak_count(b) == 0);
        let mut shared = free.map(|i| self.bufs.swap_remove(i)).unwrap_or_default();
        let written = match Arc::get_mut(&mut shared) {
            Some(buf) => encode_into(buf, len, encode),
            None => {
                let mut buf = Vec::new();
                let written = encode_into(&mut buf, len, encode);
                shared = Arc::new(buf);
                written
            }
        };
        if self.bufs.len() < self.keep {
            self.bufs.push(Arc::clone(&shared));
        }
        written.map(|()| shared)
    }
}

/// Makes `buf` exactly `len` bytes and lets `encode` fill it, keeping what it wrote. Only
/// the bytes the buffer gains are zeroed: `encode` overwrites the rest. A length no
/// allocation can hold leaves the buffer short, and the encoder refuses it.
fn encode_into<E>(buf: &mut Vec<u8>, len: usize, encode: impl FnOnce(&mut [u8]) -> Result<usize, E>) -> Result<(), E> {
    if buf.capacity() < len {
        let _ = buf.try_reserve_exact(len.saturating_add(wire::MAX_CONTROL_LEN).saturating_sub(buf.len()));
    }
    if buf.capacity() >= len {
        buf.resize(len, 0);
    }
    encode(buf).map(|n| buf.truncate(n))
}

impl<S: Server<f32>> Core<S> {
    fn run(
        &mut self,
        in_rx: &Receiver<Inbound>,
        plan: &RunPlan,
        control: &Control,
        note: &mut dyn FnMut(Note<'_>),
    ) -> StopReason {
        let tick = Duration::from_millis(50);
        loop {
            self.drain(note);
            if control.crash.load(Ordering::SeqCst) {
                return StopReason::Crashed;
            }
            if let Some(reason) = self.upstream_end {
                return reason;
            }
            if control.stop.load(Ordering::SeqCst) {
                return StopReason::Stopped;
            }
            if self.server.stats().accepted >= plan.max_gradients {
                return StopReason::Budget;
            }
            if plan.time_limit.is_some_and(|t| self.epoch.elapsed() >= t) {
                return StopReason::TimeLimit;
            }
            let mut wake = StdInstant::now() + tick;
            if let Some(t) = self.server.poll_timeout() {
                wake = wake.min(at(self.epoch, t));
            }
            match in_rx.recv_deadline(wake) {
                Ok(msg) => self.inbound(msg, note),
                Err(RecvTimeoutError::Timeout) => {}
                Err(RecvTimeoutError::Disconnected) => return StopReason::Stopped,
            }
            if self.server.poll_timeout().is_some_and(|t| at(self.epoch, t) <= StdInstant::now()) {
                self.server.handle_timeout(since(self.epoch));
            }
        }
    }

    fn log(note: &mut dyn FnMut(Note<'_>), line: &str) {
        note(Note::Log(line));
    }

    fn inbound(&mut self, msg: Inbound, note: &mut dyn FnMut(Note<'_>)) {
        match msg {
            Inbound::Log(line) => Self::log(note, &line),
            Inbound::HandshakeFailed => self.report.handshake_failures += 1,
            Inbound::Connected { conn, worker, epoch, addr, tx, stream, done } => {
                self.report.sessions += 1;
                self.session_index.insert(conn, self.report.session_ledgers.len());
                self.report.session_ledgers.push(SessionLedger { worker: worker.0, epoch, ..SessionLedger::default() });
                Self::log(note, &format!("worker {} connected from {addr} (epoch {epoch})", worker.0));
                if let Some(seen) = self.seen_worker.get_mut(worker.index()) {
                    *seen = true;
                }
                if self.started.is_none() && self.seen_worker.iter().all(|s| *s) {
                    self.started = Some(StdInstant::now());
                    note(Note::Started);
                }
                let new = Conn { id: conn, tx, stream, done };
                let old = self.conns.get_mut(worker.index()).and_then(|slot| slot.replace(new));
                if let Some(old) = old {
                    Self::log(note, &format!("worker {}: the new session replaces the old one", worker.0));
                    self.close(old);
                    self.lose(worker, note);
                }
            }
            Inbound::Frame { conn, worker, buf, start, end, home } => {
                if !self.current(worker, conn) && self.is_contribution(buf.get(start..end).unwrap_or_default()) {
                    self.report.discarded += 1;
                    self.session(conn, |s| s.discarded += 1);
                }
                if self.current(worker, conn) {
                    let bytes = buf.get(start..end).unwrap_or_default();
                    let now = since(self.epoch);
                    match wire::decode_to_server::<f32>(bytes, &self.limits) {
                        Ok(msg) => {
                            let contribution =
                                matches!(msg, ToServer::Grad { .. } | ToServer::Delta { .. } | ToServer::Clock { .. });
                            if contribution {
                                self.report.received += 1;
                                self.session(conn, |s| s.received += 1);
                            }
                            if matches!(msg, ToServer::Grad { .. } | ToServer::Delta { .. }) {
                                let sent = self.dispatched.get_mut(worker.index()).and_then(Option::take);
                                if let (Some(t), Some(busy)) = (sent, self.report.busy_s.get_mut(worker.index())) {
                                    *busy += t.elapsed().as_secs_f64();
                                }
                            }
                            if self.server.handle(now, worker, msg).is_err() {
                                self.report.refused += 1;
                                if contribution {
                                    self.report.refused_contributions += 1;
                                    self.session(conn, |s| s.refused += 1);
                                }
                            }
                        }
                        Err(e) => {
                            self.report.refused += 1;
                            Self::log(note, &format!("worker {} sent a bad message ({e}); disconnecting", worker.0));
                            self.drop_worker(worker, note);
                        }
                    }
                }
                let _ = home.try_send(buf);
            }
            Inbound::Closed { conn, worker, reason } => {
                if self.current(worker, conn) {
                    Self::log(note, &format!("worker {} lost: {reason}", worker.0));
                    self.drop_worker(worker, note);
                }
            }
            Inbound::Upstream { buf, start, end } => {
                let bytes = buf.get(start..end).unwrap_or_default();
                let now = since(self.epoch);
                match wire::decode_to_worker::<f32>(bytes, &self.limits) {
                    Ok(msg) => {
                        let stop = matches!(msg, ToWorker::Stop);
                        if let Err(e) = self.server.handle_upstream(now, msg) {
                            self.report.refused += 1;
                            Self::log(note, &format!("the upstream server's message was refused: {e}"));
                        } else if stop {
                            Self::log(note, "the upstream server said stop");
                            self.upstream_end = Some(StopReason::UpstreamStopped);
                        }
                    }
                    Err(e) => self.lose_upstream(&format!("the upstream server sent a bad message ({e})"), note),
                }
            }
            Inbound::UpstreamClosed { reason } => self.lose_upstream(&reason, note),
        }
    }

    fn lose_upstream(&mut self, reason: &str, note: &mut dyn FnMut(Note<'_>)) {
        if let Some(up) = self.up.take() {
            Self::log(note, &format!("upstream connection lost: {reason}"));
            self.close(up);
        }
        self.upstream_end.get_or_insert(StopReason::UpstreamLost);
    }

    /// Counts into the ledger of session `conn`.
    fn session(&mut self, conn: u64, f: impl FnOnce(&mut SessionLedger)) {
        if let Some(s) = self.session_index.get(&conn).and_then(|i| self.report.session_ledgers.get_mut(*i)) {
            f(s);
        }
    }

    /// Whether `bytes` decode to a contribution (for the ledger).
    fn is_contribution(&self, bytes: &[u8]) -> bool {
        matches!(
            wire::decode_to_server::<f32>(bytes, &self.limits),
            Ok(ToServer::Grad { .. } | ToServer::Delta { .. } | ToServer::Clock { .. })
        )
    }

    fn current(&self, worker: WorkerId, conn: u64) -> bool {
        matches!(self.conns.get(worker.index()), Some(Some(c)) if c.id == conn)
    }

    fn close(&mut self, conn: Conn) {
        let _ = conn.stream.shutdown(Shutdown::Both);
    }

    /// Cuts `worker`'s connection and tells the protocol.
    fn drop_worker(&mut self, worker: WorkerId, note: &mut dyn FnMut(Note<'_>)) {
        if let Some(conn) = self.conns.get_mut(worker.index()).and_then(Option::take) {
            self.close(conn);
        }
        self.lose(worker, note);
    }

    fn lose(&mut self, worker: WorkerId, note: &mut dyn FnMut(Note<'_>)) {
        let _ = self.server.handle_worker_lost(since(self.epoch), worker);
        if let Some(d) = self.dispatched.get_mut(worker.index()) {
            *d = None;
        }
        let _ = note;
    }

    /// Drains the protocol's outputs: events are noted, messages encoded once, a checkpoint
    /// written if due, then messages handed to the writers.
    fn drain(&mut self, note: &mut dyn FnMut(Note<'_>)) {
        loop {
            let mut outbox: Vec<(Recipient, Arc<Vec<u8>>, bool)> = Vec::new();
            let mut upbox: Vec<Arc<Vec<u8>>> = Vec::new();
            let mut updates: Vec<(Version, Vec<u64>)> = Vec::new();
            while let Some(out) = self.server.poll_output() {
                match out {
                    ServerOutput::Send { to, msg } => {
                        let len = wire::encoded_len_to_worker(&msg);
                        let model = matches!(msg, ToWorker::Model { .. });
                        match self.bufs.fill(len, |buf| wire::encode_to_worker(&msg, buf)) {
                            Ok(bytes) => outbox.push((to, bytes, model)),
                            Err(e) => note(Note::Log(&format!("cannot encode a {} message: {e}", msg.kind_name()))),
                        }
                    }
                    ServerOutput::Event(ev) => {
                        Self::count(&mut self.report, &mut self.checkpoint_due, &self.shared.options, &ev);
                        if self.journal.is_some() {
                            Self::journal_event(&mut self.applied_by_version, &mut updates, self.conns.len(), &ev);
                        }
                        note(Note::Event(&ev));
                    }
                    ServerOutput::Upstream(msg) => {
                        let len = wire::encoded_len_to_server(&msg);
                        match self.bufs.fill(len, |buf| wire::encode_to_server(&msg, buf)) {
                            Ok(bytes) => upbox.push(bytes),
                            Err(e) => note(Note::Log(&format!("cannot encode a {} message: {e}", msg.kind_name()))),
                        }
                    }
                }
            }
            let version = self.server.version();
            if version != self.last_version {
                self.last_version = version;
                self.shared.version.store(version.0, Ordering::SeqCst);
                note(Note::Model { version, params: self.server.params() });
            }
            if !updates.is_empty() {
                let totals = self.totals();
                if let Some(j) = self.journal.as_mut() {
                    for (version, by_worker) in &updates {
                        if let Err(e) = j.update(*version, by_worker, &totals) {
                            note(Note::Log(&e.to_string()));
                        }
                    }
                }
            }
            if self.checkpoint_due {
                self.checkpoint_due = false;
                self.save_checkpoint(note);
            }
            for bytes in upbox {
                let sent = self.up.as_ref().map(|up| up.tx.try_send(bytes));
                match sent {
                    Some(Ok(())) => {}
                    Some(Err(_)) => self.lose_upstream("upstream send queue full", note),
                    None => self.lose_upstream("no upstream connection", note),
                }
            }
            let mut dropped = Vec::new();
            let now = StdInstant::now();
            for (to, bytes, model) in outbox {
                let targets: Vec<WorkerId> = match to {
                    Recipient::Worker(w) => vec![w],
                    Recipient::AllWorkers => {
                        (0..self.conns.len() as u32).map(WorkerId).filter(|w| self.is_connected(*w)).collect()
                    }
                };
                for w in targets {
                    let Some(Some(conn)) = self.conns.get(w.index()) else {
                        continue;
                    };
                    match conn.tx.try_send(Arc::clone(&bytes)) {
                        Ok(()) => {
                            if model {
                                if let Some(d) = self.dispatched.get_mut(w.index()) {
                                    d.get_or_insert(now);
                                }
                            }
                        }
                        Err(TrySendError::Full(_)) => dropped.push((w, "send queue full (the worker does not read)")),
                        Err(TrySendError::Disconnected(_)) => dropped.push((w, "writer gone")),
                    }
                }
            }
            if dropped.is_empty() {
                return;
            }
            for (w, why) in dropped {
                if self.is_connected(w) {
                    note(Note::Log(&format!("worker {} dropped: {why}", w.0)));
                    self.drop_worker(w, note);
                }
            }
        }
    }

    fn is_connected(&self, w: WorkerId) -> bool {
        matches!(self.conns.get(w.index()), Some(Some(_)))
    }

    fn count(report: &mut ServerReport, checkpoint_due: &mut bool, options: &ServerOptions, ev: &ServerEvent) {
        match *ev {
            ServerEvent::Applied { worker, staleness, .. } => {
                let s = &mut report.staleness;
                s.0 += staleness;
                s.1 += 1;
                s.2 = s.2.max(staleness);
                if let Some(c) = report.per_worker.get_mut(worker.index()) {
                    *c += 1;
                }
            }
            ServerEvent::Dropped { worker, .. } => {
                if let Some(c) = report.per_worker.get_mut(worker.index()) {
                    *c += 1;
                }
            }
            ServerEvent::Stalled { waiting_for, missing, .. } => {
                report.stalls += 1;
                report.last_stall = Some((waiting_for, missing));
            }
            ServerEvent::WorkerLost { .. } => report.lost += 1,
            ServerEvent::ModelUpdated { version, .. } => {
                if let Some((_, every)) = &options.checkpoint {
                    if *every > 0 && version.0 % every == 0 {
                        *checkpoint_due = true;
                    }
                }
            }
            _ => {}
        }
    }

    fn save_checkpoint(&mut self, note: &mut dyn FnMut(Note<'_>)) {
        if let Some((path, _)) = &self.shared.options.checkpoint {
            let name = self.shared.announce.config.name();
            match checkpoint::save(path, name, self.server.version(), self.server.params()) {
                Ok(()) => {
                    self.report.checkpoints += 1;
                    let totals = self.totals();
                    if let Some(Err(e)) = self.journal.as_mut().map(|j| j.restart(self.server.version(), &totals)) {
                        note(Note::Log(&e.to_string()));
                    }
                }
                Err(e) => note(Note::Log(&e.to_string())),
            }
        }
    }

    /// The protocol's totals, for the journal.
    fn totals(&self) -> checkpoint::Totals {
        let st = self.server.stats();
        checkpoint::Totals {
            received: self.report.received,
            accepted: st.accepted,
            applied: st.applied,
            dropped: st.dropped_total(),
        }
    }

    /// Applied contributions are counted per worker until their version is made; then the
    /// version goes to the journal.
    fn journal_event(
        pending: &mut std::collections::BTreeMap<u64, Vec<u64>>,
        updates: &mut Vec<(Version, Vec<u64>)>,
        n: usize,
        ev: &ServerEvent,
    ) {
        match *ev {
            ServerEvent::Applied { worker, version, .. } => {
                let row = pending.entry(version.0).or_insert_with(|| vec![0; n]);
                if let Some(c) = row.get_mut(worker.index()) {
                    *c += 1;
                }
            }
            ServerEvent::ModelUpdated { version, .. } => {
                let row = pending.remove(&version.0).unwrap_or_else(|| vec![0; n]);
                pending.retain(|v, _| *v > version.0);
                updates.push((version, row));
            }
            _ => {}
        }
    }

    /// Ends the run: tells workers to stop (unless crashing), writes the final checkpoint,
    /// lets writers flush for a moment, and cuts every connection.
    fn finish(&mut self, reason: StopReason, in_rx: &Receiver<Inbound>, note: &mut dyn FnMut(Note<'_>)) {
        let abrupt = matches!(reason, StopReason::Crashed | StopReason::UpstreamLost);
        if !abrupt {
            if reason != StopReason::UpstreamStopped {
                self.server.stop();
            }
            self.drain(note);
            if self.shared.options.checkpoint.is_some() {
                self.save_checkpoint(note);
            }
        }
        let mut conns: Vec<Conn> = self.conns.iter_mut().filter_map(Option::take).collect();
        conns.extend(self.up.take());
        if abrupt {
            for c in conns {
                let _ = c.stream.shutdown(Shutdown::Both);
            }
            return;
        }
        // Writers end after their queue is sent (the Stop message last); give them a moment.
        let deadline = StdInstant::now() + Duration::from_secs(2);
        let mut pending = Vec::new();
        for Conn { id, tx, stream, done } in conns {
            drop(tx);
            pending.push((id, stream, done));
        }
        while pending.iter().any(|(_, _, d)| !d.load(Ordering::SeqCst)) && StdInstant::now() < deadline {
            thread::sleep(Duration::from_millis(2));
        }
        // Lingering close: wait (briefly) for each peer to close its end after reading our
        // Stop. Closing first while a late frame of the peer sits unread would reset the
        // connection, and a reset can discard the Stop before the peer has read it.
        let mut open: Vec<u64> = pending.iter().map(|(id, _, _)| *id).collect();
        while !open.is_empty() {
            match in_rx.recv_deadline(deadline) {
                Ok(Inbound::Closed { conn, .. }) => open.retain(|id| *id != conn),
                Ok(Inbound::Frame { buf, start, end, conn, .. }) => {
                    if self.is_contribution(buf.get(start..end).unwrap_or_default()) {
                        self.report.in_flight_at_stop += 1;
                        self.session(conn, |s| s.in_flight_at_stop += 1);
                    }
                }
                Ok(_) => {}
                Err(_) => break,
            }
        }
        for (_, s, _) in pending {
            let _ = s.shutdown(Shutdown::Both);
        }
    }
}

fn options_send_queue(shared: &Shared) -> usize {
    shared.options.send_queue.max(1)
}

/// Starts the reader and writer threads of the upstream session: frames from upstream go to
/// the protocol thread as [`Inbound::Upstream`], a closed or broken connection as
/// [`Inbound::UpstreamClosed`].
fn start_uplink(link: Uplink, tx: &Sender<Inbound>, queue: usize) -> Result<Conn, TcpError> {
    let Uplink { addr, stream, mut reader, mut writer } = link;
    let clone = |s: &TcpStream| s.try_clone().map_err(|e| TcpError(format!("upstream connection: {e}")));
    let (stream2, stream3) = (clone(&stream)?, clone(&stream)?);
    let (out_tx, out_rx) = bounded::<Arc<Vec<u8>>>(queue);
    let done = Arc::new(AtomicBool::new(false));
    let (done2, writer_tx) = (Arc::clone(&done), tx.clone());
    thread::Builder::new()
        .name("syncopate-up-write".into())
        .spawn(move || {
            for bytes in out_rx {
                if let Err(e) = writer.write_frame(&bytes) {
                    let _ = writer_tx.send(Inbound::UpstreamClosed { reason: format!("write failed: {e}") });
                    let _ = stream2.shutdown(Shutdown::Both);
                    done2.store(true, Ordering::SeqCst);
                    return;
                }
            }
            let _ = stream2.shutdown(Shutdown::Write);
            done2.store(true, Ordering::SeqCst);
        })
        .map_err(|e| TcpError(format!("cannot start the upstream writer: {e}")))?;
    let reader_tx = tx.clone();
    thread::Builder::new()
        .name("syncopate-up-read".into())
        .spawn(move || {
            let reason = loop {
                let mut buf = Vec::new();
                match reader.read_frame(&mut buf, None) {
                    Ok(p) => {
                        if reader_tx.send(Inbound::Upstream { buf, start: p.start, end: p.end }).is_err() {
                            return;
                        }
                    }
                    Err(FrameError::Closed) => break format!("{addr} closed the connection"),
                    Err(e) => break format!("{addr}: {e}"),
                }
            };
            let _ = reader_tx.send(Inbound::UpstreamClosed { reason });
        })
        .map_err(|e| TcpError(format!("cannot start the upstream reader: {e}")))?;
    Ok(Conn { id: u64::MAX, tx: out_tx, stream: stream3, done })
}
