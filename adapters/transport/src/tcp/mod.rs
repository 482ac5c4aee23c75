//! TCP: the parameter server and its workers in separate processes (or machines).
//!
//! - [`frame`]: length-prefixed frames with sequence numbers, MACs, size limits and
//!   absolute per-frame deadlines (a peer that trickles bytes is cut off).
//! - [`handshake`]: transport and wire versions, worker id and role are checked, the server
//!   sends the run's settings, and with a shared secret both sides authenticate each other
//!   (an early MAC in the first frame, then HMAC-SHA256 over the transcript, per-worker keys
//!   from HKDF); a mismatch is refused with one clear line on both sides.
//! - [`settings`]: the run's settings (protocol, knobs, model shape, workload) the server
//!   announces in its handshake, in a canonical encoding; workers need nothing else.
//! - [`auth`]: the secret, key derivation and MACs.
//! - [`server`]: the server: an accept thread that admits connections (unverified ones in a
//!   bounded table, evicted oldest-first, so strangers cannot keep a worker out), a reader
//!   and a writer thread per connection
//!   (bounded queues: a worker that stops reading is dropped, never waited for), and one
//!   thread that drives the protocol's [`AnyServer`](syncopate::AnyServer). A lost
//!   connection is a lost worker for the protocol; a worker that reconnects rejoins with a
//!   new epoch and gets the current model.
//! - [`worker`]: the worker: connect and back off (the one retry loop of every client), the
//!   session (handshake, per-session state), and the loop that drives the protocol's
//!   [`AnyWorker`](syncopate::AnyWorker) with the job's gradients.
//! - `writer`: the one writer thread of every session (queued frames, heartbeats when idle,
//!   the worker's upload ledger).
//! - [`sharded`]: the worker of a sharded run: one session per shard (`serve --shard I/S`),
//!   each shard's identity checked in its handshake, driving a
//!   [`ShardedWorker`](syncopate::proto::sharded::ShardedWorker).
//! - [`checkpoint`]: the model and its version in a file, written atomically.
//! - [`initial`]: the initial parameters from worker 0, for a server that takes its model
//!   from its first worker.
//! - [`step_times`]: the workers' step times, for a server that records a step-time trace.
//! - [`codec`]: the one layout the transport's own messages share (a tag, then `f32`s).
//! - [`payload`]: what a session frame carries (a heartbeat, one of the transport's own
//!   messages, or a core message), decided in one place.
//! - [`group`]: a group server of the grouped protocol as its own process: the server above
//!   toward its member workers, and a worker-style session upstream to a central ASP server
//!   (the generic [`TcpServer::drive`] with an [`Uplink`]).
//!
//! The byte layout of frames and the handshake is in `adapters/transport/TCP.md`; the messages inside
//! the frames are the core's wire format (`core/WIRE.md`).
//!
//! The adapter knows nothing about any protocol's state: it feeds messages, losses and
//! timeouts to the core and delivers what the core sends.

pub mod auth;
pub mod checkpoint;
pub mod codec;
pub mod frame;
pub mod group;
pub mod handshake;
pub mod initial;
pub mod payload;
pub mod refusal;
pub mod server;
pub mod settings;
pub mod sharded;
pub mod shm;
pub mod step_times;
pub mod worker;
pub(crate) mod writer;

pub use auth::{Secret, WorkerKey};
pub use frame::FrameTimeout;
pub use group::{GroupOptions, run_group};
pub use server::{
    LossPoint, Note, RunPlan, ServerHandle, ServerOptions, ServerReport, SessionLedger, StopReason, TcpServer, Uplink,
    WorkerRow, straggler_lines,
};
pub use settings::{DataSource, ProtocolSettings, RunSettings, ShardSettings, WorkloadSettings};
pub use sharded::{ShardTally, ShardedReport, run_sharded_worker};
pub use worker::{Backoff, WorkerJob, WorkerOptions, WorkerReport, run_worker};

use core::fmt;
use std::time::Instant as StdInstant;
use syncopate::Instant;

/// A failure of the TCP adapter: one line naming what was wrong.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TcpError(pub String);

impl fmt::Display for TcpError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.0)
    }
}

impl core::error::Error for TcpError {}

/// How long a peer may stay silent (no frame, no heartbeat) before its session counts as
/// lost, unless the caller says otherwise (`--lost-after`).
pub const DEFAULT_LOST_AFTER: core::time::Duration = core::time::Duration::from_secs(10);

/// How often a session sends a heartbeat (a frame with an empty payload) when it has
/// nothing else to send, for peers that declare it lost after `lost_after`: a tenth of it,
/// between 10 ms and 1 s. Heartbeats go out from each connection's writer thread, so a long
/// computation never delays them; a process that is stopped or gone sends none. Both sides
/// of a session announce their `lost_after` in the handshake and beat for the smaller one
/// ([`handshake::Session::beat`]).
pub fn heartbeat_interval(lost_after: core::time::Duration) -> core::time::Duration {
    (lost_after / 10).clamp(MIN_HEARTBEAT, core::time::Duration::from_secs(1))
}

/// The shortest heartbeat interval.
const MIN_HEARTBEAT: core::time::Duration = core::time::Duration::from_millis(10);

/// The shortest `lost_after` accepted, on either side of a session: twice the shortest
/// heartbeat interval, so that a peer's silence always spans at least two missed beats.
pub const MIN_LOST_AFTER: core::time::Duration = core::time::Duration::from_millis(20);

/// Refuses a silence limit below [`MIN_LOST_AFTER`], naming both (the caller prefixes what
/// set it: a flag, a keyword, a peer).
pub fn check_lost_after(lost_after: core::time::Duration) -> Result<(), String> {
    if lost_after < MIN_LOST_AFTER {
        return Err(format!(
            "a silence limit of {} s is below twice the shortest heartbeat interval ({} s): give at least {} s",
            lost_after.as_secs_f64(),
            MIN_HEARTBEAT.as_secs_f64(),
            MIN_LOST_AFTER.as_secs_f64()
        ));
    }
    Ok(())
}

/// The largest frame `len` of a session for a model of `dim` `f32` parameters: the
/// sequence number, the largest message the core's codec accepts, and the tag.
pub fn session_max_len(dim: usize) -> usize {
    let msg = syncopate::wire::Limits::for_model(dim).max_message_len::<f32>();
    frame::SEQ_BYTES.saturating_add(msg).saturating_add(auth::TAG_LEN)
}

/// The core's clock: nanoseconds since `origin`.
fn since(origin: StdInstant) -> Instant {
    Instant::from_nanos(u64::try_from(origin.elapsed().as_nanos()).unwrap_or(u64::MAX))
}

/// The std instant of a core instant on the clock that starts at `origin`.
fn at(origin: StdInstant, t: Instant) -> StdInstant {
    origin + core::time::Duration::from_nanos(t.as_nanos())
}

fn core_duration(d: core::time::Duration) -> syncopate::Duration {
    syncopate::Duration::from_nanos(u64::try_from(d.as_nanos()).unwrap_or(u64::MAX))
}
