//! # syncopate-adapters
//!
//! The std side of syncopate: everything that binds the sans-IO protocol state machines of
//! the `syncopate` core crate to a real or simulated world.
//!
//! - [`rng`]: a seeded PRNG and the distributions the simulator draws from.
//! - [`workload`]: data sets (built-in digits, CSV, LIBSVM, IDX), models (softmax regression,
//!   a one-hidden-layer MLP), minibatch gradients, evaluation and seeded batch sampling.
//! - [`sim`]: a deterministic discrete-event simulator (virtual time, straggler models, a
//!   network of links, crashes) driving any protocol on real gradients: the experiment
//!   engine and test harness.
//! - [`tcp`]: the parameter server and workers in separate processes over TCP: framing,
//!   authenticated handshake, limits and deadlines, worker loss and rejoin, checkpoints.

#![forbid(unsafe_code)]
// This crate is the std side by design; the workspace lint that steers the core to `core::`
// paths has nothing to protect here.
#![allow(clippy::std_instead_of_core, clippy::alloc_instead_of_core)]
#![deny(missing_docs)]

pub mod channel;
pub mod cli;
pub mod compare;
pub mod plot;
pub mod rng;
pub mod scenario;
pub mod sim;
pub mod tcp;
pub mod thread;
pub mod trace;
pub mod workload;
