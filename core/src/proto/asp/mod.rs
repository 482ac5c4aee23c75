//! ASP, asynchronous parallel: the other baseline, and the limit of the bounded schemes.
//!
//! Rules (docs/PROTOCOLS.md, "ASP"): on `Grad{base, g}` from worker `i` the server immediately sets
//! `w ← w − η g`, `v ← v + 1`, and replies `Model{v, w}` to worker `i` only. Nothing valid
//! is dropped; staleness `v − 1 − base` is unbounded (it is reported in every `Applied`
//! event).
//!
//! Invariants (tested): every admitted gradient is applied exactly once (per-worker
//! sequence numbers refuse duplicates and replays); the version grows by one per gradient.
//!
//! Messages: receives `Join`, `Grad`, `Leave`; sends `Model` (to the joiner, then to each
//! sender after its update) and `Stop`. Workers are [`GradientWorker`](super::GradientWorker)s.
//! A lost worker costs nothing: the others never wait for it.

mod server;
#[cfg(test)]
mod tests;
mod worker;

pub use server::{AspRules, AspServer};
pub use worker::AspWorker;

use super::GradientPolicy;

/// Settings of an [`AspServer`].
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct AspConfig {
    /// The number of workers `n` (ids `0..n`).
    pub workers: u32,
    /// The learning rate `η` applied to each gradient.
    pub learning_rate: f64,
    /// Screening of incoming gradients.
    pub gradient_policy: GradientPolicy,
}

impl AspConfig {
    /// `n` workers, learning rate `η`, no norm bound.
    pub fn new(workers: u32, learning_rate: f64) -> Self {
        Self { workers, learning_rate, gradient_policy: GradientPolicy::default() }
    }
}
