//! # syncopate-sim
//!
//! Experiments with syncopate's protocols on real gradients:
//!
//! - [`rng`]: a seeded PRNG and the distributions the simulator draws from.
//! - [`workload`]: data sets (built-in digits, CSV, LIBSVM, IDX), models (softmax regression,
//!   MLPs), minibatch gradients, evaluation and seeded batch sampling.
//! - [`sim`]: a deterministic discrete-event simulator (virtual time, straggler models, a
//!   network of links, crashes) driving any protocol: the experiment engine and test harness.
//! - [`straggler`]: the straggler specs (`WHO:MODEL`) shared by the command line and scenarios.
//! - [`thread`]: the server and `n` workers as threads in one process, with injected
//!   straggler delays (over the transport crate's channels).
//! - [`advise`]: which protocol and knobs to run on a recorded step-time trace.
//! - [`scenario`], [`compare`], [`trace`]: scenario files, comparisons of protocols on one
//!   scenario, and recorded step-time traces.
//!
//! Layering (no module imports one after it): [`workload`] and [`trace`], then [`sim`],
//! [`straggler`], [`scenario`] and [`thread`], then [`compare`] and [`advise`].

#![forbid(unsafe_code)]
// This crate is the std side by design; the workspace lint that steers the core to `core::`
// paths has nothing to protect here.
#![allow(clippy::std_instead_of_core, clippy::alloc_instead_of_core)]
#![deny(missing_docs)]

pub mod advise;
pub mod compare;
pub mod scenario;
pub mod sim;
pub mod straggler;
pub mod thread;
pub mod trace;
pub mod workload;

/// The core's seeded PRNG and distributions.
pub use syncopate::rng;
/// The transport crate's channels, which the threads adapter runs over.
pub use syncopate_transport::channel;
