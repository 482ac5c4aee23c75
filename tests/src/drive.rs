//! Small helpers to drive one server or worker by hand (no network): build an
//! [`AnyServer`] for a protocol, feed it messages, drain its outputs, and take a
//! [`Snapshot`] of its observable state to check that a refused input changed nothing. Used by
//! the canary, malicious-input, regression and fuzz-corpus tests and by the fuzz targets.

use std::vec::Vec;
use syncopate::id::first_seq;
use syncopate::{
    AnyServer, Instant, ProtocolConfig, Server, ServerEvent, ServerOutput, ServerStats, ToServer, Values, Version,
    WorkerId,
};

/// Model dimension of hand-driven servers.
pub const DIM: usize = 4;

/// The instant `ms` milliseconds after zero.
pub fn at_ms(ms: u64) -> Instant {
    Instant::from_nanos(ms.saturating_mul(1_000_000))
}

/// The `k`-th sequence number of session `epoch`.
pub fn seq(epoch: u32, k: u64) -> u64 {
    first_seq(epoch) + k
}

/// A server for `config` on the model `[0, 1, 2, 3]`.
pub fn server(config: &ProtocolConfig) -> AnyServer<f64, Vec<f64>> {
    let params: Vec<f64> = (0..DIM).map(|i| i as f64).collect();
    let scratch = vec![0.0; config.server_scratch_len(DIM).max(1)];
    AnyServer::new(config, params, scratch).expect("valid test configuration")
}

/// Drains every output; returns the events (messages are discarded).
pub fn drain(s: &mut AnyServer<f64, Vec<f64>>) -> Vec<ServerEvent> {
    let mut events = Vec::new();
    while let Some(out) = s.poll_output() {
        if let ServerOutput::Event(e) = out {
            events.push(e);
        }
    }
    events
}

/// Joins workers `0..n` in epoch 1 and drains.
pub fn join_all(s: &mut AnyServer<f64, Vec<f64>>, n: u32) {
    for w in 0..n {
        s.handle(at_ms(0), WorkerId(w), ToServer::Join { epoch: 1 }).expect("join");
    }
    let _ = drain(s);
}

/// A gradient message.
pub fn grad(base: u64, iteration: u64, seq: u64, values: &[f64]) -> ToServer<'_, f64> {
    ToServer::Grad { base: Version(base), iteration, seq, values: Values::Slice(values), loss: None }
}

/// What a refused input must leave unchanged: version, model bits and every counter except
/// `rejected`.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Snapshot {
    /// The model version.
    pub version: u64,
    /// The model, bit for bit.
    pub params: Vec<u64>,
    /// The counters, with `rejected` zeroed.
    pub stats: ServerStats,
}

impl Snapshot {
    /// The snapshot of `s`.
    pub fn of<S: Server<f64>>(s: &S) -> Self {
        let mut stats = *s.stats();
        stats.rejected = 0;
        Self { version: s.version().0, params: s.params().iter().map(|p| p.to_bits()).collect(), stats }
    }
}
