//! The test network's settings: what a computation sees ([`Job`]) and returns
//! ([`GradientFn`]), how long messages and computations take ([`NetConfig`]) and which faults
//! are injected ([`Faults`]).

use crate::rng::Rng;
use crate::time::{Duration, Instant};
use std::boxed::Box;
use std::vec::Vec;

/// A computation the host runs: what a [`GradientFn`] sees.
#[derive(Clone, Debug)]
pub struct Job<'a> {
    /// The worker.
    pub worker: usize,
    /// Computations this worker finished before (its `k`-th job).
    pub k: u64,
    /// The model version the worker named.
    pub version: u64,
    /// The parameters it computes at.
    pub params: &'a [f64],
}

/// The gradient of a job: a pure function, so a run replays and a reference can recompute it.
pub type GradientFn = fn(&Job<'_>) -> Vec<f64>;

/// Builds worker `id`'s state machine for session `epoch` (a restart after a crash).
pub type WorkerFactory<W> = Box<dyn FnMut(u32, u32) -> W>;

/// Which faults the network injects and how often. All zero: a reliable network.
#[derive(Clone, Copy, Debug, Default, PartialEq)]
pub struct Faults {
    /// Probability a message is lost.
    pub loss: f64,
    /// Probability a message is delivered twice.
    pub duplicate: f64,
    /// Probability a message takes a delay spike of [`NetConfig::spike`] (reordering).
    pub spike: f64,
    /// Per-event probability of starting a one-way partition of one worker.
    pub partition: f64,
    /// Per-event probability of crashing a worker (it restarts after
    /// [`NetConfig::restart_after`], through the worker factory).
    pub crash: f64,
    /// Per-event probability of asking for a server restart
    /// ([`Cluster::take_restart_request`](super::Cluster::take_restart_request)).
    pub server_restart: f64,
}

impl Faults {
    /// Swarm testing: each fault kind is on or off per seed (drawn from `rng`), then its
    /// rate is drawn: loss ≤ 0.3, duplication ≤ 0.5, spikes ≤ 0.3, partitions ≤ 0.01,
    /// crashes ≤ 0.01 and server restarts ≤ 0.002 per event.
    pub fn swarm(rng: &mut Rng) -> Self {
        let mut f = Self::default();
        let mut draw = |p: f64, max: f64| if rng.next_f64() < p { rng.next_f64() * max } else { 0.0 };
        f.loss = draw(0.6, 0.3);
        f.duplicate = draw(0.6, 0.5);
        f.spike = draw(0.6, 0.3);
        f.partition = draw(0.4, 0.01);
        f.crash = draw(0.5, 0.01);
        f.server_restart = draw(0.3, 0.002);
        f
    }

    /// Every fault kind off.
    pub fn none() -> Self {
        Self::default()
    }
}

/// How long messages and computations take.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct NetConfig {
    /// Latency of a message, uniform in `[min, max]`.
    pub latency: (Duration, Duration),
    /// Links deliver in order: what one drain of a node sends to one peer travels as one
    /// batch, after everything sent on that link before.
    pub fifo: bool,
    /// A computation's time: uniform in `[min, max]`, or shifted-exponential (`min` plus an
    /// exponential of mean `max`) when [`Self::exponential`] is set; divided by the worker's
    /// speed.
    pub compute: (Duration, Duration),
    /// Draw compute times as `min + Exp(mean = max)`.
    pub exponential: bool,
    /// Probability a computation straggles, and the extra time then (uniform in the range).
    pub straggle: (f64, Duration, Duration),
    /// The extra delay of a spiked message, uniform in the range.
    pub spike: (Duration, Duration),
    /// A crashed worker restarts after a time uniform in the range.
    pub restart_after: (Duration, Duration),
    /// A partition lasts a time uniform in the range.
    pub partition_for: (Duration, Duration),
    /// Timers at or beyond this instant do not fire once nothing else is in flight.
    pub horizon: Instant,
}

impl Default for NetConfig {
    /// 1–4 ms latency, 1–8 ms computations, no stragglers, FIFO off, horizon one hour.
    fn default() -> Self {
        let ms = Duration::from_millis;
        Self {
            latency: (ms(1), ms(4)),
            fifo: false,
            compute: (ms(1), ms(8)),
            exponential: false,
            straggle: (0.0, Duration::ZERO, Duration::ZERO),
            spike: (ms(20), ms(300)),
            restart_after: (ms(10), ms(300)),
            partition_for: (ms(20), ms(420)),
            horizon: Instant::ZERO + Duration::from_secs(3600),
        }
    }
}
