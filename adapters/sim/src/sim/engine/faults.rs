//! The fault injector's state: its random streams, derived from the run's seed
//! ([`FAULT_STREAM`]) so a run with faults is as deterministic as one without, the random cut
//! processes and the counts. What it does to the run is in `inject`.

use crate::sim::config::SimConfig;
use crate::sim::report::{Fault, FaultStats};
use syncopate::rng::Rng;
use syncopate::{Duration, Instant};

/// The stream id of the fault injector's random numbers: `Rng::derive(seed, FAULT_STREAM)`
/// draws the message faults; random partitions and crashes use sub-streams
/// `FAULT_STREAM + 1 + link` and `FAULT_STREAM + 0x1_0000 + worker`.
pub const FAULT_STREAM: u64 = 0xFA17_5EED_0000_0000;

/// A random one-way partition process of one link: alternating up and cut periods; the
/// current or next cut is `start..end`.
#[derive(Clone, Debug)]
pub(super) struct CutProcess {
    pub(super) rng: Rng,
    start: Instant,
    end: Instant,
}

impl CutProcess {
    fn new(seed: u64, link: u64, rate: f64, mean: Duration) -> Self {
        let mut rng = Rng::derive(seed, FAULT_STREAM.wrapping_add(1 + link));
        let start = Instant::ZERO + exp_secs(&mut rng, rate);
        let end = start + exp_mean(&mut rng, mean);
        Self { rng, start, end }
    }

    /// Whether the link is cut at `t` (`t` never decreases between calls).
    pub(super) fn cut_at(&mut self, t: Instant, rate: f64, mean: Duration) -> bool {
        while self.end <= t {
            self.start = self.end + exp_secs(&mut self.rng, rate);
            self.end = self.start + exp_mean(&mut self.rng, mean);
        }
        self.start <= t
    }
}

/// An exponential time with `rate` per second.
pub(super) fn exp_secs(rng: &mut Rng, rate: f64) -> Duration {
    Duration::from_secs_f64(rng.exponential(rate))
}

/// An exponential time with mean `mean`.
pub(super) fn exp_mean(rng: &mut Rng, mean: Duration) -> Duration {
    Duration::from_secs_f64(rng.exponential(1.0) * mean.as_secs_f64())
}

/// The fault injector's state.
pub(super) struct Faults {
    /// Message faults configured (otherwise the send path skips all of this).
    pub(super) messages: bool,
    /// The end of the fault phase.
    pub(super) quiet: Option<Instant>,
    pub(super) rng: Rng,
    /// Random cut processes, two per worker (up, down), when random cuts are configured.
    pub(super) cuts: Vec<CutProcess>,
    /// Random crash streams, one per worker, when random crashes are configured.
    pub(super) crash_rngs: Vec<Rng>,
    pub(super) stats: FaultStats,
}

/// What the network does with one message.
#[derive(Clone, Copy, Debug)]
pub(super) struct Fate {
    pub(super) first: Option<Instant>,
    pub(super) replay: Option<Instant>,
    pub(super) faults: [Option<Fault>; 2],
}

impl Faults {
    /// The injector of `config`'s faults for `n` workers, its streams derived from the seed.
    pub(super) fn new(config: &SimConfig, n: u32) -> Self {
        let f = &config.faults;
        let cuts = if f.cut_rate > 0.0 && f.cut_mean > Duration::ZERO {
            (0..2 * u64::from(n)).map(|link| CutProcess::new(config.seed, link, f.cut_rate, f.cut_mean)).collect()
        } else {
            Vec::new()
        };
        let crash_rngs = if f.crash_rate > 0.0 {
            (0..n).map(|i| Rng::derive(config.seed, FAULT_STREAM.wrapping_add(0x1_0000 + u64::from(i)))).collect()
        } else {
            Vec::new()
        };
        Self {
            messages: f.message_faults(),
            quiet: f.quiet_after.map(|q| Instant::ZERO + q),
            rng: Rng::derive(config.seed, FAULT_STREAM),
            cuts,
            crash_rngs,
            stats: FaultStats::default(),
        }
    }
}
