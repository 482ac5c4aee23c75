//! BSP, bulk synchronous parallel: the baseline every other protocol is measured against.
//!
//! Rules (docs/PROTOCOLS.md, "BSP"): the server holds model `w_v`; every worker computes one gradient
//! at `w_v` and sends it; when all `n` gradients of version `v` are in, the server applies
//! `w_{v+1} = w_v − η · (1/n) Σ g_i`, increments the version and broadcasts the new model.
//! Workers block between sending a gradient and receiving the next model (they are
//! [`GradientWorker`](super::GradientWorker)s).
//!
//! Invariants (tested): each update averages exactly one gradient from each of the `n`
//! workers, all computed at the same version, counted by distinct worker, never by message
//! count; nothing valid is dropped except a gradient for an already-closed version
//! ([`DropReason::Stale`], possible only through reordering or a retransmission).
//!
//! Liveness: BSP waits for every worker, including a dead one; that is the protocol. With
//! [`BspConfig::stall_report`] set, the server emits [`ServerEvent::Stalled`] naming the
//! worker it waits for, once per interval, so the stall is never silent.
//!
//! Messages: receives `Join`, `Grad`, `Leave`; sends `Model` (to a joiner, then broadcast
//! after each update) and `Stop`.
//!
//! Aggregation sums gradients in arrival order. Floating-point addition is not associative,
//! so two arrival orders can differ in the last bits; with exactly representable test data
//! (integers, a power-of-two learning rate and worker count) every order gives the same bits.
//!
//! [`DropReason::Stale`]: crate::proto::DropReason::Stale
//! [`ServerEvent::Stalled`]: crate::proto::ServerEvent::Stalled

#[cfg(doc)]
use crate::proto::ServerEvent;
mod server;
#[cfg(test)]
mod tests;
mod worker;

pub use server::{BspRules, BspServer};
pub use worker::BspWorker;

use super::GradientPolicy;
use crate::time::Duration;

/// Settings of a [`BspServer`].
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct BspConfig {
    /// The number of workers `n` (ids `0..n`).
    pub workers: u32,
    /// The learning rate `η`.
    pub learning_rate: f64,
    /// Screening of incoming gradients.
    pub gradient_policy: GradientPolicy,
    /// Report a [`ServerEvent::Stalled`] after this long without progress (and again every
    /// interval); `None` never reports.
    pub stall_report: Option<Duration>,
}

impl BspConfig {
    /// `n` workers, learning rate `η`, no norm bound, no stall reports.
    pub fn new(workers: u32, learning_rate: f64) -> Self {
        Self { workers, learning_rate, gradient_policy: GradientPolicy::default(), stall_report: None }
    }
}
