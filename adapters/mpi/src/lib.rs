//! # syncopate-mpi
//!
//! An MPI transport for syncopate's protocols, for jobs launched by `mpirun` or `srun`:
//! rank 0 runs the parameter server, ranks `1..=n` run workers `0..n`. With `S` shards
//! (the core's `proto::sharded`), ranks `0..S` each run the protocol's server over one slice
//! of the model and ranks `S..S + n` run the workers, each a `ShardedWorker`.
//!
//! Every protocol message crosses as the core's wire format ([`syncopate::wire`]), sent with
//! MPI point-to-point calls: non-blocking sends (`MPI_Isend`; a broadcast is one encode and
//! one `MPI_Isend` per recipient from the same bytes) and non-blocking receives
//! (`MPI_Improbe`, then `MPI_Mrecv` of exactly that message into a pooled buffer that the
//! core decodes in place). A send never waits for its recipient: its request is kept with
//! its buffer and tested on every turn of the loop (`outbox`, the crate's one `unsafe`
//! module, explains why rsmpi's scoped requests cannot do this), so a busy, hung or stopped
//! worker rank never stalls the server for the others, and two ranks sending large messages
//! to each other never deadlock.
//!
//! A message with a tensor of 1 KiB or more crosses as two MPI messages, its head (wire
//! header and control section) and its payload, so that the tensor is read and written
//! where it lives (the `link` module): the server sends a model straight from its model
//! buffer, a gradient worker (BSP, ASP, backup, DBW) receives it straight into the buffer
//! it computes from and sends its gradient from the buffer it was computed in (the core's
//! `GradientWorker::handle_model_in` / `handle_gradient_in` trade buffers instead of
//! copying). Those buffers are copy-on-write (`Arc::make_mut`): a send holds the buffer
//! until it completed, and a write meanwhile (a model updated while its sends are in
//! flight) copies it first. The server decodes every message whole: a wrong
//! length, a non-finite value, a stale or replayed message gets the core's typed refusal.
//!
//! - [`settings`]: the hash every rank takes of its own settings (MPI-free).
//! - `run_server`, `run_shard` / `run_worker` (feature `mpi`): the server (or shard) and
//!   worker loops, the same driving contract as the threaded adapter. A worker computes on a
//!   thread of its own (`MPI_THREAD_FUNNELED`: that thread makes no MPI call) while its main
//!   thread drives MPI.
//! - [`ledger`]: a server rank's conservation ledger and a shard's final report.
//! - `agree_on_settings` (feature `mpi`): every rank checks its settings hash against rank
//!   0's.
//!
//! Liveness: MPI has no notion of a lost peer, and OpenMPI ends the whole job when a rank
//! dies. Workers therefore send a tiny heartbeat, from the main thread, whatever the
//! computation does; a worker rank silent for longer than [`RunPlan::lost_after`] (hung,
//! stopped, cut off) becomes a lost worker for the protocol and the run goes on without it.
//! Heard again, it is told to rejoin with a new epoch and counted back once it has. Shards
//! watch each other the same way; a lost shard stops the run. A rank that *dies* ends the
//! job in OpenMPI: `mpirun` then exits non-zero with a line naming the rank.
//!
//! Without the `mpi` feature the crate holds only the MPI-free parts, so a machine without
//! an MPI library still builds the workspace.
//!
//! Layering (no module imports one after it): this file's shared vocabulary ([`MpiError`],
//! [`RunPlan`], the shared buffer and tally, the clock and size checks) imports none of its
//! modules; `agree`, `compute`, [`ledger`], `machine`, `outbox` and [`settings`] import only
//! it; `link` imports `outbox`; the server (`server/`: `report` and `ranks`, then `side`,
//! then `end`, then its `mod.rs`) and the worker import `link` and the modules above.

#![allow(clippy::std_instead_of_core, clippy::alloc_instead_of_core)]
#![deny(missing_docs)]

pub mod ledger;
pub mod settings;

#[cfg(feature = "mpi")]
mod agree;
#[cfg(feature = "mpi")]
mod compute;
#[cfg(feature = "mpi")]
mod link;
#[cfg(feature = "mpi")]
mod machine;
#[cfg(feature = "mpi")]
mod outbox;
#[cfg(feature = "mpi")]
mod server;
#[cfg(feature = "mpi")]
mod worker;

#[cfg(feature = "mpi")]
pub use agree::agree_on_settings;
#[cfg(feature = "mpi")]
pub use compute::{ComputeFn, Computed};
#[cfg(feature = "mpi")]
pub use mpi;
#[cfg(feature = "mpi")]
pub use server::{ServerReport, StopReason, run_server, run_shard};
#[cfg(feature = "mpi")]
pub use worker::{WorkerOptions, run_worker};

use core::fmt;
use core::time::Duration;

/// A failure of the MPI adapter: one line naming what was wrong.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct MpiError(pub String);

impl fmt::Display for MpiError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.0)
    }
}

impl core::error::Error for MpiError {}

/// When the server ends a run, and how it steps.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct RunPlan {
    /// Stop once the server has accepted this many gradients.
    pub max_gradients: u64,
    /// Stop after this much wall time, whatever the progress.
    pub time_limit: Option<Duration>,
    /// A worker rank silent (no message, no heartbeat) for this long is a lost worker.
    pub lost_after: Duration,
    /// SGD with momentum `β` (in `[0, 1)`) on every update of each shard's model; 0 is
    /// plain SGD.
    pub momentum: f64,
}

/// The heartbeat interval of workers for a server that declares a rank lost after
/// `lost_after`: a tenth of it, between 10 ms and 1 s.
pub fn heartbeat_interval(lost_after: Duration) -> Duration {
    (lost_after / 10).clamp(Duration::from_millis(10), Duration::from_secs(1))
}

/// The largest message MPI can carry in one call: a count of bytes is a C `int`.
pub const MAX_MESSAGE_BYTES: usize = i32::MAX as usize;

/// Refuses a model whose largest message (a model or a gradient of `dim` parameters, with
/// its header) would not fit one MPI message of at most [`MAX_MESSAGE_BYTES`] (2 GiB less one
/// byte): such a message could never be sent, and the run would wait for it forever.
pub fn check_message_size(dim: usize) -> Result<(), MpiError> {
    let largest = syncopate::wire::Limits::for_model(dim).max_message_len::<f32>();
    if largest > MAX_MESSAGE_BYTES {
        return Err(MpiError(format!(
            "a model of {dim} parameters makes messages of {largest} bytes, above MPI's limit of {MAX_MESSAGE_BYTES} \
             bytes (2 GiB) per message: use a smaller model"
        )));
    }
    Ok(())
}

/// What one worker rank did, sent to rank 0 when it stops.
#[derive(Clone, Copy, Debug, Default, PartialEq)]
pub struct Tally {
    /// Gradients computed (including abandoned ones).
    pub computed: u64,
    /// Jobs abandoned before completion.
    pub abandoned: u64,
    /// Seconds spent computing (real compute plus injected delay).
    pub busy_s: f64,
    /// Seconds the worker loop ran.
    pub wall_s: f64,
    /// Inputs the worker's state machine refused (server messages, finished gradients).
    pub refused: u64,
    /// Contributions (gradients, deltas, clock updates) the worker sent: to the server the
    /// tally goes to (its ledger counts them), or, in `run_worker`'s result, to all.
    pub sent: u64,
}

impl Tally {
    /// Encoded length.
    pub const LEN: usize = 48;

    /// Little-endian encoding.
    pub fn to_bytes(&self) -> [u8; Self::LEN] {
        let mut out = [0u8; Self::LEN];
        let fields = [
            self.computed.to_le_bytes(),
            self.abandoned.to_le_bytes(),
            self.busy_s.to_le_bytes(),
            self.wall_s.to_le_bytes(),
            self.refused.to_le_bytes(),
            self.sent.to_le_bytes(),
        ];
        for (chunk, field) in out.chunks_exact_mut(8).zip(fields) {
            chunk.copy_from_slice(&field);
        }
        out
    }

    /// Decodes [`Tally::to_bytes`]; `None` for any other length.
    pub fn from_bytes(bytes: &[u8]) -> Option<Self> {
        let word = |i: usize| -> Option<[u8; 8]> { bytes.get(i * 8..i * 8 + 8)?.try_into().ok() };
        if bytes.len() != Self::LEN {
            return None;
        }
        Some(Self {
            computed: u64::from_le_bytes(word(0)?),
            abandoned: u64::from_le_bytes(word(1)?),
            busy_s: f64::from_le_bytes(word(2)?),
            wall_s: f64::from_le_bytes(word(3)?),
            refused: u64::from_le_bytes(word(4)?),
            sent: u64::from_le_bytes(word(5)?),
        })
    }
}

/// A model-sized buffer that a state machine and the MPI sends share: a send holds a clone
/// of the `Arc` until it completed, and every write goes through `Arc::make_mut`, which
/// copies a buffer a send still reads, so a send never sees its bytes change.
#[cfg(feature = "mpi")]
#[derive(Clone, Debug)]
struct Shared(std::sync::Arc<Vec<f32>>);

#[cfg(feature = "mpi")]
impl Shared {
    fn zeroed(len: usize) -> Self {
        Self(std::sync::Arc::new(vec![0.0; len]))
    }
}

#[cfg(feature = "mpi")]
impl AsRef<[f32]> for Shared {
    fn as_ref(&self) -> &[f32] {
        &self.0
    }
}

#[cfg(feature = "mpi")]
impl AsMut<[f32]> for Shared {
    fn as_mut(&mut self) -> &mut [f32] {
        std::sync::Arc::make_mut(&mut self.0).as_mut_slice()
    }
}

/// Checks that `link`'s world has a rank for each of `shards` servers and each of `n`
/// workers.
#[cfg(feature = "mpi")]
fn check_world(link: &link::Link, n: u32, shards: u32) -> Result<(), MpiError> {
    let size = u32::try_from(link.size()).unwrap_or(0);
    let want = n.saturating_add(shards);
    if size != want {
        let servers =
            if shards == 1 { "rank 0 the server".to_owned() } else { format!("ranks 0..{shards} the shards") };
        return Err(MpiError(format!(
            "{size} MPI ranks for --workers {n}: launch {want} ranks ({servers}, ranks {shards}..{want} the workers), \
             e.g. mpirun -n {want}"
        )));
    }
    Ok(())
}

/// How a model of `dim` parameters splits over `shards` server ranks; refused unless every
/// shard gets at least one parameter.
pub fn shard_layout(dim: usize, shards: u32) -> Result<syncopate::proto::sharded::ShardLayout, MpiError> {
    syncopate::proto::sharded::ShardLayout::new(dim, shards).map_err(|_| {
        MpiError(format!(
            "--shards {shards} cannot split a model of {dim} parameters: every shard needs at least one \
             (1 <= shards <= {dim})"
        ))
    })
}

/// The core's clock: nanoseconds since `origin`.
#[cfg(feature = "mpi")]
fn since(origin: std::time::Instant) -> syncopate::Instant {
    syncopate::Instant::from_nanos(u64::try_from(origin.elapsed().as_nanos()).unwrap_or(u64::MAX))
}

/// How long until the core instant `at`.
#[cfg(feature = "mpi")]
fn until(origin: std::time::Instant, at: syncopate::Instant) -> Duration {
    Duration::from_nanos(at.as_nanos().saturating_sub(since(origin).as_nanos()))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn tally_round_trips_and_refuses_other_lengths() {
        let t = Tally { computed: 7, abandoned: 2, busy_s: 1.5, wall_s: 3.25, refused: 4, sent: 9 };
        assert_eq!(Tally::from_bytes(&t.to_bytes()), Some(t));
        assert_eq!(Tally::from_bytes(&[0; 47]), None);
        assert_eq!(Tally::from_bytes(&[0; 49]), None);
    }

    #[test]
    fn a_model_whose_messages_reach_2_gib_is_refused_naming_the_limit() {
        assert!(check_message_size(1 << 20).is_ok());
        let e = check_message_size(600_000_000).unwrap_err();
        assert!(e.0.contains("2147483647 bytes (2 GiB)"), "{e}");
        assert!(check_message_size(usize::MAX / 8).is_err());
    }

    #[test]
    fn a_model_that_does_not_split_into_the_shards_is_refused_naming_both() {
        assert_eq!(shard_layout(650, 3).map(|l| (l.len(0), l.len(2))), Ok((217, 216)));
        let e = shard_layout(2, 3).unwrap_err();
        assert!(e.0.contains("--shards 3 cannot split a model of 2 parameters"), "{e}");
        assert!(shard_layout(650, 0).is_err());
    }

    #[test]
    fn heartbeat_is_a_tenth_of_the_loss_timeout_within_bounds() {
        assert_eq!(heartbeat_interval(Duration::from_secs(2)), Duration::from_millis(200));
        assert_eq!(heartbeat_interval(Duration::from_millis(5)), Duration::from_millis(10));
        assert_eq!(heartbeat_interval(Duration::from_secs(600)), Duration::from_secs(1));
    }
}
