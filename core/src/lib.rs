//! # syncopate
//!
//! Straggler-tolerant synchronization protocols for parameter-server training, written as
//! pure state machines: message in, messages out, time passed in, gradients in
//! caller-owned buffers. `#![no_std]`, no allocation, no panics on any input.
//!
//! A parameter server holds the model; `n` workers compute gradients and push them; a
//! *synchronization protocol* decides when the server applies what it received, what it
//! sends back, and when each worker may go on. With synchronous SGD every step waits for the
//! slowest worker; the protocols here are the published answers to that:
//!
//! | module | protocol |
//! |---|---|
//! | [`proto::bsp`] | bulk synchronous parallel (the baseline) |
//! | [`proto::asp`] | fully asynchronous (the other baseline) |
//! | [`proto::backup`] | synchronous with `b` static backup workers: each update averages the first `n − b` gradients |
//! | [`proto::dbw`] | dynamic backup workers: `b_t` chosen every iteration to maximise expected progress per second |
//! | [`proto::wbsp`] | worker-busy synchronous parallel: fast workers keep taking local steps, the round closes on the slowest upload (basic and overlapped) |
//! | [`proto::ssp`] | stale synchronous parallel: per-worker clocks, updates applied on arrival, reads from a cache at most `s` clocks stale (read-my-writes) |
//! | [`proto::bap`] | bounded asynchronous parallel: per-iteration aggregation, workers run ahead up to `s_bap` versions, optional per-iteration time limit |
//! | [`proto::grouped`] | grouped hybrid: BSP inside `G` groups, each group server an ASP client of a central server (`G = 1` is BSP, `G = n` is ASP) |
//!
//! ## Architecture
//!
//! - [`time`]: [`Instant`] and [`Duration`], inputs only; the core never reads a clock.
//! - [`id`]: [`WorkerId`], [`Version`], [`ComputeId`].
//! - [`msg`]: the message vocabulary of every protocol, with borrowed tensor payloads.
//! - [`wire`]: the byte codec of those messages (header, postcard control fields,
//!   little-endian tensor), specified in `core/WIRE.md`.
//! - [`math`]: slice kernels generic on [`Scalar`] (`f32`, `f64`).
//! - [`proto`]: the protocols, their common verbs ([`Server`], [`Worker`]) and the
//!   configuration-driven [`AnyServer`] / [`AnyWorker`]. Every protocol has the same folder
//!   shape (`proto/<name>/`: `mod.rs` with its rules, paper, invariants and settings,
//!   `server.rs`, `worker.rs`, `tests.rs`). Every single-level server is one
//!   [`ProtocolServer`](proto::ProtocolServer): the state all servers share
//!   ([`ServerCore`](proto::ServerCore): model, version, roster, counters, output queue,
//!   stall watch) driven by the protocol's [`Rules`](proto::Rules), so the verbs, the
//!   screening of every input and the output queue are written once, in
//!   [`proto::common`]. The grouped protocol is two levels of servers and the exception:
//!   [`GroupedServer`](proto::grouped::GroupedServer) and
//!   [`GroupServer`](proto::grouped::GroupServer) implement [`Server`] themselves, with
//!   their own output queue of per-group items, over the shared roster, stall watch and
//!   screening, and drive a central [`AspServer`](proto::asp::AspServer) (a
//!   `ProtocolServer`) in place (docs/DESIGN.md, "The grouped composite").
//! - [`ProtocolKind`]: the one list of protocols, their names and knobs, from which every
//!   adapter's list derives (docs/ADDING_A_PROTOCOL.md).
//! - [`proto::sharded`]: the model split over `S` servers, each the protocol's server over
//!   a contiguous slice, and a worker that talks to all of them.
//! - [`error`]: [`Reject`] (an input was refused, nothing changed), [`Refusals`] (a
//!   driver's count of them) and [`ConfigError`].
//! - [`storage`]: where a server keeps its per-worker table ([`Inline`](storage::Inline)
//!   or `Heap`).
//!
//! Layering (no module imports one after it): [`id`], [`time`], [`rng`], `canary`, then
//! [`error`], [`storage`], [`math`], [`msg`], [`wire`]; [`proto`] imports every module but
//! [`wire`], and none imports it.
//!
//! ## Driving a protocol
//!
//! Feed an input, drain the outputs, wait for the next deadline. Here a BSP server and two
//! workers are wired together by hand; the `syncopate-adapters` crate does the same over
//! threads, TCP and a simulator.
//!
//! ```
//! use syncopate::proto::bsp::{BspConfig, BspServer};
//! use syncopate::{GradientWorker, GradientWorkerConfig, Instant, Recipient, Server,
//!                 ServerOutput, ToServer, ToWorker, Values, Worker, WorkerId, WorkerOutput};
//!
//! let now = Instant::ZERO;
//! let mut server: BspServer<f32, [f32; 3]> = BspServer::new(BspConfig::new(2, 0.5), [1.0f32; 3], [0.0f32; 3]).unwrap();
//! let mut workers = [0, 1].map(|i| GradientWorker::new(GradientWorkerConfig::new(WorkerId(i)), [0.0f32; 3]).unwrap());
//!
//! for _ in 0..2 {
//!     // Workers -> server: each sends its pending messages; the host computes gradients.
//!     for w in workers.iter_mut() {
//!         let (me, mut job) = (w.id(), None);
//!         while let Some(out) = w.poll_output() {
//!             match out {
//!                 WorkerOutput::Send(msg) => server.handle(now, me, msg).unwrap(),
//!                 WorkerOutput::Compute { id, params, .. } => {
//!                     job = Some((id, params.iter().map(|p| p * 2.0).collect::<Vec<f32>>()))
//!                 }
//!                 WorkerOutput::Event(_) => {}
//!             }
//!         }
//!         if let Some((id, grad)) = job {
//!             w.handle_gradient(now, id, &grad).unwrap();
//!             while let Some(WorkerOutput::Send(msg)) = w.poll_output() {
//!                 server.handle(now, me, msg).unwrap();
//!             }
//!         }
//!     }
//!     // Server -> workers.
//!     let mut inbox: Vec<(Option<u32>, u64, Vec<f32>)> = Vec::new();
//!     while let Some(out) = server.poll_output() {
//!         if let ServerOutput::Send { to, msg: ToWorker::Model { version, values, .. } } = out {
//!             let mut params = vec![0.0; 3];
//!             values.copy_into(&mut params).unwrap();
//!             let to = match to { Recipient::Worker(w) => Some(w.0), Recipient::AllWorkers => None };
//!             inbox.push((to, version.0, params));
//!         }
//!     }
//!     for (to, version, params) in inbox {
//!         for w in workers.iter_mut().filter(|w| to.is_none_or(|t| t == w.id().0)) {
//!             let msg = ToWorker::Model { version: syncopate::Version(version), clock: version, values: Values::Slice(&params) };
//!             w.handle(now, msg).unwrap();
//!         }
//!     }
//! }
//! // One BSP step with gradient 2w: w = 1 - 0.5 * 2 = 0.
//! assert_eq!(server.version().0, 1);
//! assert_eq!(server.params(), &[0.0; 3]);
//! ```

#![no_std]
#![forbid(unsafe_code)]
#![deny(missing_docs)]

#[cfg(any(feature = "std", test))]
extern crate std;

#[cfg(any(feature = "alloc", test))]
extern crate alloc;

#[cfg(feature = "_canary")]
pub mod canary;
pub mod error;
pub mod id;
pub mod math;
pub mod msg;
pub mod proto;
pub mod rng;
pub mod storage;
pub mod time;
pub mod wire;

pub use error::{ConfigError, Refusals, Reject};
pub use id::{ComputeId, MAX_WORKERS, Version, WorkerId};
pub use math::Scalar;
pub use msg::{ToServer, ToWorker, Values};
/// The test kit: owned messages and the one sans-IO test network (feature `testkit`).
#[cfg(any(test, feature = "testkit"))]
pub use proto::common::testkit;
pub use proto::{
    AnyServer, AnyWorker, DropReason, GradientWorker, GradientWorkerConfig, ProtocolConfig, ProtocolKind, Recipient,
    Server, ServerEvent, ServerOutput, ServerStats, Worker, WorkerEvent, WorkerOutput, WorkerSetup, WorkerStats,
};
pub use time::{Duration, Instant};

/// The README's Rust examples, compiled and run as doctests.
#[doc = include_str!("../../README.md")]
#[cfg(doctest)]
pub struct ReadmeDoctests;
