//! # syncopate-transport
//!
//! Real transports for the sans-IO protocol state machines of the `syncopate` core crate,
//! with no command-line, plotting or simulation dependencies:
//!
//! - [`channel`]: the server and workers in one process, messages over crossbeam channels
//!   (encoded once per broadcast, shared by every recipient).
//! - [`file`](mod@file): files written whole (replaced atomically and durably, never a device or a
//!   FIFO) and files read whole (regular files only, bounded).
//! - [`launcher`]: the rank, world size and server address a launcher (torchrun, mpirun,
//!   srun) puts in a process's environment.
//! - [`protocol_spec`]: a protocol and its knobs as plain settings (what command lines,
//!   scenario files and the TCP handshake carry) and the core configuration built from them.
//! - [`tcp`]: the parameter server and workers in separate processes or machines: framing,
//!   authenticated handshake, limits and deadlines, worker loss and rejoin, checkpoints.
//!
//! Each is a thin loop: read the clock, feed an input, drain the outputs, sleep until the
//! next deadline. Anything about protocol state lives in the core.
//!
//! Layering (no module imports one after it): [`channel`], [`file`](mod@file),
//! [`launcher`], [`optimizer_spec`] and [`protocol_spec`] import nothing of this crate;
//! [`tcp`] imports [`file`](mod@file), [`optimizer_spec`] and [`protocol_spec`], and inside
//! it the framing (frames, handshake, settings, the transport's own messages, what each
//! frame is) comes before the writer thread, then the server and the worker.

// Unsafe code is denied everywhere but in the shared-memory payload path (`tcp::shm`), which
// maps a file another process writes.
#![deny(unsafe_code)]
// This crate is the std side by design; the workspace lint that steers the core to `core::`
// paths has nothing to protect here.
#![allow(clippy::std_instead_of_core, clippy::alloc_instead_of_core)]
#![deny(missing_docs)]

pub mod channel;
pub mod file;
pub mod launcher;
pub mod optimizer_spec;
pub mod protocol_spec;
pub mod tcp;
