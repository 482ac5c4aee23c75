//! What the caller gives a server and hears back: its [`ServerOptions`], [`RunPlan`] and
//! [`Uplink`], the [`Note`]s it hears while the run goes on, the [`ServerHandle`] that ends
//! it and the [`StopReason`] it ends with; and the settings announced to every worker.

use crate::tcp::auth::Secret;
use crate::tcp::frame::{FrameReader, FrameTimeout, FrameWriter};
use crate::tcp::handshake::Role;
use crate::tcp::settings::RunSettings;
use core::sync::atomic::{AtomicBool, Ordering};
use core::time::Duration;
use std::io::BufWriter;
use std::net::TcpStream;
use std::path::PathBuf;
use std::sync::Arc;
use syncopate::{ProtocolConfig, ServerEvent, ToServer, Version, WorkerId};

/// An established session with an upstream server (see [`TcpServer::drive`](super::TcpServer::drive)): the streams
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

/// Settings of a [`TcpServer`](super::TcpServer).
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
    /// every update by [`run`](super::TcpServer::run)) from its checkpoint, [`Optimizer::state_len`](syncopate::proto::Optimizer::state_len)
    /// elements, so the run goes on exactly (momentum's previous model, AdamW's moments and
    /// update count); `None` starts the rule afresh. Checkpoints hold the rule's state with
    /// the model.
    pub optimizer_state: Option<Vec<f32>>,
    /// A session (a worker's, or the upstream one) silent this long (no frame, no
    /// heartbeat) is lost; heartbeats go out at [`heartbeat_interval`](crate::tcp::heartbeat_interval)
    /// of it.
    pub lost_after: Duration,
    /// The tensor encoding of every session's core messages (announced in the handshake; a
    /// worker asking for another is refused). The model, its sum and checkpoints stay `f32`.
    pub wire: syncopate::wire::Encoding,
    /// Offer a shared-memory region to each worker session that asks for one
    /// ([`shm`](crate::tcp::shm)): a session whose worker proves it mapped the region (it runs on
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
            lost_after: crate::tcp::DEFAULT_LOST_AFTER,
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
pub(super) struct Control {
    pub(super) stop: Arc<AtomicBool>,
    pub(super) crash: AtomicBool,
    pub(super) diverged: AtomicBool,
}

/// Stops a running server from another thread.
#[derive(Clone, Debug)]
pub struct ServerHandle(pub(super) Arc<Control>);

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

/// What the server announces and runs, derived once from its settings.
#[derive(Clone, Debug)]
pub(super) struct Announce {
    /// The canonical bytes of the settings.
    pub(super) bytes: Vec<u8>,
    /// Their SHA-256.
    pub(super) digest: [u8; 32],
    /// One line describing them.
    pub(super) label: String,
    /// The configuration this server runs.
    pub(super) config: ProtocolConfig,
    /// The model dimension.
    pub(super) dim: usize,
    /// The role of every peer.
    pub(super) role: Role,
}

impl Announce {
    pub(super) fn new(settings: &RunSettings) -> Result<Self, String> {
        let bytes = settings.encode()?;
        let config = settings.server_config()?;
        // A shard serves its slice of the model.
        let dim = settings.served_range()?.len();
        let role = if settings.remote_groups { Role::Group } else { Role::Worker };
        Ok(Self { digest: crate::tcp::settings::digest(&bytes), bytes, label: settings.label(), config, dim, role })
    }
}
