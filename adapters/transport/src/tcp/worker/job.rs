//! What the caller gives a worker and gets back: its [`WorkerOptions`], the [`WorkerJob`] that
//! computes its gradients, and its [`WorkerReport`].

use super::connect::Backoff;
use crate::tcp::auth::WorkerKey;
use crate::tcp::frame::FrameTimeout;
use crate::tcp::settings::RunSettings;
use core::sync::atomic::{AtomicBool, Ordering};
use core::time::Duration;
use std::sync::Arc;
use syncopate::WorkerId;

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
    /// Heartbeats go out at [`heartbeat_interval`](crate::tcp::heartbeat_interval) of it, from the
    /// connection's writer thread, so a long computation does not delay them.
    pub lost_after: Duration,
    /// The number of parameters of the worker's own model, if it has one: the server
    /// refuses the worker at the handshake if its model has another size (both sizes
    /// named, in the server's log and in the worker's error). `None` takes the server's.
    pub dim: Option<usize>,
    /// The tensor encoding this worker asks for on the wire; `None` takes the server's. A
    /// server that speaks another refuses the worker at the handshake, naming both.
    pub wire: Option<syncopate::wire::Encoding>,
    /// Ask the server for a shared-memory region ([`shm`](crate::tcp::shm)): where the server
    /// offers one and this worker can map it (the same host), gradients and models travel
    /// through it; otherwise the session stays on TCP.
    pub shared_memory: bool,
}

impl WorkerOptions {
    /// Defaults: no key, 5 s handshakes, 10 s frames, default backoff, rejoin after 2 s,
    /// shared memory asked for.
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
            lost_after: crate::tcp::DEFAULT_LOST_AFTER,
            dim: None,
            wire: None,
            shared_memory: true,
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

    /// Writes the gradient at `params` into `grad` (both of the model's length; every element
    /// of `grad` must be written: its prior contents are unspecified) and returns
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

    /// Whether the job takes every model the server sends ([`Self::round`]): a job that
    /// applies each round's mean with its own optimizer (the server's rule `mean`). The
    /// default takes none.
    fn wants_rounds(&self) -> bool {
        false
    }

    /// Called for every model the server sends, in the order sent (versions increasing),
    /// before any gradient on it and whether or not the worker computes on it (a worker that
    /// has several models queued computes on the newest only). Only when
    /// [`Self::wants_rounds`]. A job that must stop sets the kill switch.
    fn round(&mut self, version: syncopate::Version, params: &[f32]) {
        let _ = (version, params);
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

/// Whether the caller's kill switch is set.
pub(super) fn killed(options: &WorkerOptions) -> bool {
    options.kill.as_ref().is_some_and(|k| k.load(Ordering::SeqCst))
}
