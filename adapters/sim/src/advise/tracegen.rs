//! Seeded synthetic step-time traces of seven kinds (`syncopate trace-gen KIND`), for
//! testing and evaluating `advise` the way an operator's recorded traces would.
//!
//! Every kind is built around a median step `m`; "noise" is a factor `1 + 0.05·N(0, 1)`
//! (clamped to at least 0.5):
//!
//! - `steady`: each worker has its own fixed speed, spread over `0.8..1.25 × m`, with noise.
//! - `markov`: each worker is a two-state Markov chain, normal (`m`, noise) or straggling
//!   (`4 m`); it turns slow with probability 0.03 per step and recovers with 0.25 (about 11%
//!   of steps are slow, in bursts of about 4).
//! - `pareto`: independent heavy-tailed steps, `m · 0.75 · Pareto(1, α)`, shape `α` 2.2 by
//!   default ([`PARETO_SHAPE`]; [`generate_shaped`] takes another: at 1.5 the mean is finite
//!   and the variance infinite).
//! - `dead-node`: one worker (chosen by the seed) is 10 times slower; the others `m`, noise.
//! - `uniform`: independent steps uniform on `0.5..1.5 × m`.
//! - `two-types`: a third of the workers (chosen by the seed, at least one) are a slower
//!   instance type, `2 m`; the others `m`; noise on both.
//! - `regime-change`: the first half `steady`; from the middle step on, a quarter of the
//!   workers (at least one, chosen by the seed) turn 3 times slower and every step has a
//!   10% chance of a 3x hiccup.

use crate::rng::Rng;
use crate::trace::Step;

/// The kinds of trace.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Kind {
    /// Fixed per-worker speeds with a little noise.
    Steady,
    /// Two-state Markov stragglers.
    Markov,
    /// A heavy (Pareto) tail.
    Pareto,
    /// One node ten times slower.
    DeadNode,
    /// Uniform step times.
    Uniform,
    /// Two instance types.
    TwoTypes,
    /// A regime change halfway.
    RegimeChange,
}

/// All kinds, in the order above.
pub const KINDS: [Kind; 7] =
    [Kind::Steady, Kind::Markov, Kind::Pareto, Kind::DeadNode, Kind::Uniform, Kind::TwoTypes, Kind::RegimeChange];

/// The Pareto tail's shape `α` of [`generate`].
pub const PARETO_SHAPE: f64 = 2.2;

/// PRNG sub-stream of the generator.
const GEN_STREAM: u64 = 0x7472_6163; // "trac"

impl Kind {
    /// The kind's name on the command line.
    pub fn name(self) -> &'static str {
        match self {
            Self::Steady => "steady",
            Self::Markov => "markov",
            Self::Pareto => "pareto",
            Self::DeadNode => "dead-node",
            Self::Uniform => "uniform",
            Self::TwoTypes => "two-types",
            Self::RegimeChange => "regime-change",
        }
    }

    /// The kind named `name`.
    pub fn from_name(name: &str) -> Result<Self, String> {
        KINDS.into_iter().find(|k| k.name() == name).ok_or_else(|| {
            let names: Vec<&str> = KINDS.iter().map(|k| k.name()).collect();
            format!("unknown trace kind '{name}': one of {}", names.join(", "))
        })
    }
}

fn noise(rng: &mut Rng) -> f64 {
    (1.0 + 0.05 * rng.normal()).max(0.5)
}

/// `count` distinct workers of `workers`, chosen by `rng`.
fn chosen(rng: &mut Rng, workers: u32, count: u32) -> Vec<bool> {
    let mut ids: Vec<u32> = (0..workers).collect();
    rng.shuffle(&mut ids);
    let mut out = vec![false; workers as usize];
    for &w in ids.iter().take(count as usize) {
        out[w as usize] = true;
    }
    out
}

/// A trace of `kind`: `workers` workers with `steps` steps each around a median step of
/// `median_s` seconds, from `seed` (the same arguments give the same trace).
pub fn generate(kind: Kind, workers: u32, steps: u64, median_s: f64, seed: u64) -> Vec<Step> {
    generate_shaped(kind, workers, steps, median_s, seed, PARETO_SHAPE)
}

/// [`generate`] with the Pareto tail's shape `pareto_shape` (used by `pareto` only; a shape
/// that is not a positive number gives [`PARETO_SHAPE`]).
pub fn generate_shaped(kind: Kind, workers: u32, steps: u64, median_s: f64, seed: u64, pareto_shape: f64) -> Vec<Step> {
    let shape = if pareto_shape.is_finite() && pareto_shape > 0.0 { pareto_shape } else { PARETO_SHAPE };
    let mut rng = Rng::derive(seed, GEN_STREAM);
    let n = workers as usize;
    let m = median_s;
    let speeds: Vec<f64> = (0..n).map(|_| 0.8 * (1.25f64 / 0.8).powf(rng.next_f64())).collect();
    let dead = rng.below(u64::from(workers.max(1))) as usize;
    let slow_type = chosen(&mut rng, workers, (workers / 3).max(1));
    let degraded = chosen(&mut rng, workers, (workers / 4).max(1));
    let mut slow_state = vec![false; n];
    let mut out = Vec::with_capacity(n * steps as usize);
    for step in 0..steps {
        for w in 0..n {
            let t = match kind {
                Kind::Steady => m * speeds[w] * noise(&mut rng),
                Kind::Markov => {
                    let flip = rng.next_f64();
                    slow_state[w] = if slow_state[w] { flip >= 0.25 } else { flip < 0.03 };
                    m * noise(&mut rng) * if slow_state[w] { 4.0 } else { 1.0 }
                }
                Kind::Pareto => m * 0.75 * rng.pareto(1.0, shape),
                Kind::DeadNode => m * noise(&mut rng) * if w == dead { 10.0 } else { 1.0 },
                Kind::Uniform => m * (0.5 + rng.next_f64()),
                Kind::TwoTypes => m * noise(&mut rng) * if slow_type[w] { 2.0 } else { 1.0 },
                Kind::RegimeChange => {
                    let base = m * speeds[w] * noise(&mut rng);
                    if step < steps / 2 {
                        base
                    } else {
                        let hiccup = if rng.next_f64() < 0.1 { 3.0 } else { 1.0 };
                        base * hiccup * if degraded[w] { 3.0 } else { 1.0 }
                    }
                }
            };
            out.push(Step { worker: w as u32, step, seconds: t.max(crate::trace::MIN_STEP_SECONDS) });
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn kinds_are_seeded_full_tables_with_their_shape() {
        for kind in KINDS {
            assert_eq!(Kind::from_name(kind.name()), Ok(kind));
            let a = generate(kind, 6, 40, 0.01, 3);
            assert_eq!(a, generate(kind, 6, 40, 0.01, 3), "{kind:?}");
            assert_ne!(a, generate(kind, 6, 40, 0.01, 4), "{kind:?}");
            assert_eq!(a.len(), 240);
            assert!(a.iter().all(|s| s.seconds >= crate::trace::MIN_STEP_SECONDS));
        }
        assert!(Kind::from_name("nope").unwrap_err().contains("dead-node"));
        // One worker ten times slower.
        let d = generate(Kind::DeadNode, 4, 50, 0.01, 1);
        let mean = |w: u32| d.iter().filter(|s| s.worker == w).map(|s| s.seconds).sum::<f64>() / 50.0;
        let slow = (0..4).filter(|&w| mean(w) > 0.08).count();
        assert_eq!(slow, 1);
        // A heavier tail: the default shape is the plain generator; 1.5 has a longer tail.
        assert_eq!(generate_shaped(Kind::Pareto, 4, 50, 0.01, 2, PARETO_SHAPE), generate(Kind::Pareto, 4, 50, 0.01, 2));
        let top = |shape: f64| {
            generate_shaped(Kind::Pareto, 16, 500, 0.01, 2, shape).iter().map(|s| s.seconds).fold(0.0, f64::max)
        };
        assert!(top(1.5) > 2.0 * top(PARETO_SHAPE), "{} {}", top(1.5), top(PARETO_SHAPE));
        // The second half of a regime change is slower than the first.
        let r = generate(Kind::RegimeChange, 8, 100, 0.01, 1);
        let half = |second: bool| r.iter().filter(|s| (s.step >= 50) == second).map(|s| s.seconds).sum::<f64>();
        assert!(half(true) > 1.3 * half(false));
    }
}
