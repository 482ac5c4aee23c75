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
//! **Files, one concern each, each importing only those before it.** `options.rs` (what
//! the caller gives and hears back, and the settings announced), `events.rs` (what the
//! connection threads hand the protocol thread), `admission.rs` (the state the connection
//! threads share: the unverified table, nonces, claims on worker ids), `connection.rs` (a
//! session's handshake, reader and writer threads), `accept.rs` (the listener and the
//! accept thread), `report.rs` (what a run reports), `stragglers.rs` (the straggler
//! report), `ledger.rs` (the conservation ledger and the report's counters),
//! `initial_model.rs` (where the model comes from: known, or awaited from worker 0 with the
//! other workers' messages held), `persist.rs` (checkpoints and their journal), `steps.rs`
//! (step times paired with contributions), `outbox.rs` (messages encoded once, shared by the
//! writers), `close.rs` (the lingering close), `driver.rs` (the protocol thread's loop), and
//! this file (binding and starting them). What a frame from a worker is, the framing layer
//! [`payload`](super::payload) says.

mod accept;
mod admission;
mod close;
mod connection;
mod driver;
mod events;
mod initial_model;
mod ledger;
mod options;
mod outbox;
mod persist;
mod report;
mod steps;
mod stragglers;

use super::TcpError;
#[cfg(doc)]
use super::settings::RunSettings;
use accept::{accept_loop, is_loopback, listen};
use admission::Shared;
use connection::start_uplink;
use core::net::SocketAddr;
use core::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};
use crossbeam_channel::bounded;
use driver::Core;
use events::{Conn, ConnEvent, RawFrame};
use options::{Announce, Control};
use std::net::{TcpListener, ToSocketAddrs};
use std::sync::{Arc, Mutex};
use std::thread;
use syncopate::proto::{Heap, Optimizer, Rule};
use syncopate::{AnyServer, ProtocolConfig, Server, Version};

pub use options::{Note, RunPlan, ServerHandle, ServerOptions, StopReason, Uplink};
pub use report::{LossPoint, ServerReport, SessionLedger, WorkerRow};
pub use stragglers::lines as straggler_lines;

/// A bound server, ready to [`run`](Self::run).
#[derive(Debug)]
pub struct TcpServer {
    listener: TcpListener,
    options: ServerOptions,
    announce: Announce,
    control: Arc<Control>,
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
