//! # syncopate-adapters
//!
//! The `syncopate` command line, and one place to reach every std adapter of syncopate.
//! The adapters themselves live in crates with only the dependencies they need:
//!
//! - `syncopate-transport`: [`channel`] (in-process) and [`tcp`] (separate processes):
//!   no command-line, plotting or simulation dependencies.
//! - `syncopate-sim`: [`sim`] (the deterministic simulator), [`workload`], [`thread`], [`advise`],
//!   [`scenario`], [`compare`], [`trace`], [`rng`].
//! - this crate: [`cli`] (the `syncopate` binary's subcommands) and [`plot`] (SVG plots).
//!
//! Layering: [`plot`] imports nothing of this crate; [`cli`] imports [`plot`] and the
//! adapter crates.

#![forbid(unsafe_code)]
// This crate is the std side by design; the workspace lint that steers the core to `core::`
// paths has nothing to protect here.
#![allow(clippy::std_instead_of_core, clippy::alloc_instead_of_core)]
#![deny(missing_docs)]

pub mod cli;
pub mod plot;

pub use syncopate_sim::{advise, compare, rng, scenario, sim, straggler, thread, trace, workload};
pub use syncopate_transport::{channel, tcp};
