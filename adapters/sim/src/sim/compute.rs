//! Straggler models: how long one gradient computation of one worker takes in virtual time.
//!
//! Each worker has a [`ComputeModel`]; the simulator samples it once per step with a
//! [`ComputeSampler`] seeded from the run seed and the worker's index, so the same seed
//! always gives the same step times. The models (docs/PROTOCOLS.md, "Straggler
//! models") are multiples of the configured base step time, except [`ComputeModel::ExtraDelay`]
//! (an absolute extra, the WBSP paper's H1/H2/H3 setting) and [`ComputeModel::Trace`] (a
//! recorded trace in seconds).

use crate::trace::Step;
use syncopate::Duration;
use syncopate::rng::Rng;

/// The compute-time model of one worker.
#[derive(Clone, Debug, PartialEq)]
pub enum ComputeModel {
    /// Every step takes the base time.
    None,
    /// Every step takes `factor` times the base time (a slower machine).
    Slowdown(f64),
    /// Every step takes the base time plus a fixed extra (WBSP's injected sleep: H1 = 0.5 s,
    /// H2 = 1.0 s, H3 = 1.5 s on odd-index workers).
    ExtraDelay(Duration),
    /// `base · (shift + X)` with `X ~ Exp(rate)`: a floor plus random noise, in base-time
    /// units (mean `base · (shift + 1/rate)`).
    ShiftedExp {
        /// The deterministic part, in base-time units.
        shift: f64,
        /// The rate of the exponential part (per base-time unit).
        rate: f64,
    },
    /// `base · X` with `X ~ Pareto(scale, shape)`: a heavy tail (mean
    /// `base · scale · shape / (shape − 1)` for `shape > 1`).
    Pareto {
        /// The minimum multiple of the base time.
        scale: f64,
        /// The tail index; smaller is heavier.
        shape: f64,
    },
    /// Transient slowdowns: at each step outside a burst, a burst starts with `probability`;
    /// during a burst of `length` steps every step takes `factor` times the base time.
    Bursts {
        /// Probability that a burst starts at a given step.
        probability: f64,
        /// The slowdown during a burst.
        factor: f64,
        /// Steps per burst.
        length: u32,
    },
    /// Replay of recorded step times in seconds, cycled; an empty trace means the base time.
    Trace(Vec<f64>),
    /// A regime change: `base`, except that steps `from_step..until_step` of this worker take
    /// `factor` times as long (a cluster that turns slow for a while, then recovers). A
    /// `base` that is itself a phase adds another one (phases that overlap multiply).
    SlowPhase {
        /// The model outside (and, scaled, inside) the phase.
        base: Box<Self>,
        /// The slowdown during the phase.
        factor: f64,
        /// First step of the phase.
        from_step: u64,
        /// First step after the phase.
        until_step: u64,
    },
}

impl ComputeModel {
    /// `n` workers where worker `which` is `factor` times slower and the others are not.
    pub fn one_straggler(n: u32, which: u32, factor: f64) -> Vec<Self> {
        (0..n).map(|i| if i == which { Self::Slowdown(factor) } else { Self::None }).collect()
    }

    /// `n` workers where every odd-index worker sleeps `delay` extra per step (WBSP's
    /// H1/H2/H3 settings with 0.5/1.0/1.5 s).
    pub fn odd_workers_delayed(n: u32, delay: Duration) -> Vec<Self> {
        (0..n).map(|i| if i % 2 == 1 { Self::ExtraDelay(delay) } else { Self::None }).collect()
    }

    /// `n` workers with the same model.
    pub fn all(n: u32, model: &Self) -> Vec<Self> {
        (0..n).map(|_| model.clone()).collect()
    }

    /// The expected step time for a base time of `base` seconds, where it is finite and
    /// known (`None` for a Pareto tail with `shape <= 1`).
    pub fn mean_seconds(&self, base: f64) -> Option<f64> {
        match self {
            Self::None => Some(base),
            Self::Slowdown(f) => Some(base * f),
            Self::ExtraDelay(d) => Some(base + d.as_secs_f64()),
            Self::ShiftedExp { shift, rate } => Some(base * (shift + 1.0 / rate)),
            Self::Pareto { scale, shape } => (*shape > 1.0).then(|| base * scale * shape / (shape - 1.0)),
            Self::Bursts { probability, factor, length } => {
                // Renewal argument: a cycle is a geometric run of normal steps (mean
                // (1-p)/p) followed by a burst of `length` steps.
                let (p, l) = (*probability, f64::from(*length));
                if p <= 0.0 || l == 0.0 {
                    return Some(base);
                }
                let normal = (1.0 - p) / p;
                Some(base * (normal + l * factor) / (normal + l))
            }
            Self::Trace(t) if t.is_empty() => Some(base),
            Self::Trace(t) => Some(t.iter().sum::<f64>() / t.len() as f64),
            Self::SlowPhase { base: inner, .. } => inner.mean_seconds(base),
        }
    }
}

/// Samples one worker's step times: a [`ComputeModel`], its own random stream and the state
/// of a burst.
#[derive(Clone, Debug)]
pub struct ComputeSampler {
    model: ComputeModel,
    base: f64,
    base_duration: Duration,
    rng: Rng,
    step: u64,
    burst_left: u32,
}

impl ComputeSampler {
    /// A sampler for `model` with base step time `base`, seeded from the run seed and the
    /// worker index (independent streams per worker).
    pub fn new(model: ComputeModel, base: Duration, seed: u64, worker: u32) -> Self {
        Self {
            model,
            base: base.as_secs_f64(),
            base_duration: base,
            rng: Rng::derive(seed, 0x5354_5241_4747_0000 | u64::from(worker)),
            step: 0,
            burst_left: 0,
        }
    }

    /// Steps sampled so far.
    pub fn steps(&self) -> u64 {
        self.step
    }

    /// The duration of the next step, in seconds (never negative, never NaN; may be
    /// infinite for a degenerate model, which [`Self::next_step`] saturates).
    pub fn next_seconds(&mut self) -> f64 {
        let (scale, model) = match &self.model {
            ComputeModel::SlowPhase { .. } => {
                // Nested phases: each one the step lies in multiplies the time.
                let (mut scale, mut model) = (1.0, &self.model);
                while let ComputeModel::SlowPhase { base, factor, from_step, until_step } = model {
                    if (*from_step..*until_step).contains(&self.step) {
                        scale *= *factor;
                    }
                    model = &**base;
                }
                (scale, model)
            }
            other => (1.0, other),
        };
        let s = scale * sample(model, self.base, &mut self.rng, &mut self.burst_left, self.step);
        self.step += 1;
        if s.is_nan() || s < 0.0 { 0.0 } else { s }
    }
}

/// One draw of `model` at step `step` (a [`ComputeModel::SlowPhase`] counts as its base
/// model: the caller applies the phases' factors).
fn sample(model: &ComputeModel, base: f64, rng: &mut Rng, burst_left: &mut u32, step: u64) -> f64 {
    {
        match model {
            ComputeModel::None => base,
            ComputeModel::Slowdown(f) => base * f,
            ComputeModel::ExtraDelay(d) => base + d.as_secs_f64(),
            ComputeModel::ShiftedExp { shift, rate } => base * (shift + rng.exponential(*rate)),
            ComputeModel::Pareto { scale, shape } => base * rng.pareto(*scale, *shape),
            ComputeModel::Bursts { probability, factor, length } => {
                if *burst_left == 0 && rng.next_f64() < *probability {
                    *burst_left = *length;
                }
                if *burst_left > 0 {
                    *burst_left -= 1;
                    base * factor
                } else {
                    base
                }
            }
            ComputeModel::Trace(t) => match t.len() {
                0 => base,
                len => t.get((step % len as u64) as usize).copied().unwrap_or(base),
            },
            ComputeModel::SlowPhase { base: inner, .. } => sample(inner, base, rng, burst_left, step),
        }
    }
}

impl ComputeSampler {
    /// The duration of the next step (exact in nanoseconds for the deterministic models
    /// built on the base time).
    pub fn next_step(&mut self) -> Duration {
        let s = self.next_seconds();
        match self.model {
            ComputeModel::None => self.base_duration,
            ComputeModel::ExtraDelay(d) => self.base_duration + d,
            _ => seconds_to_duration(s),
        }
    }
}

/// Seconds to the nearest nanosecond (so a recorded trace of `Duration::as_secs_f64` values
/// replays to the same nanoseconds); saturating, NaN or negative gives zero.
fn seconds_to_duration(s: f64) -> Duration {
    let nanos = (s * 1e9).round();
    if nanos.is_nan() || nanos <= 0.0 {
        Duration::ZERO
    } else if nanos >= u64::MAX as f64 {
        Duration::MAX
    } else {
        Duration::from_nanos(nanos as u64)
    }
}

/// One replay model per worker (`Trace` of its step times in step order).
pub fn compute_models(steps: &[Step], workers: u32, source: &str) -> Result<Vec<ComputeModel>, String> {
    let mut per: Vec<Vec<(u64, f64)>> = vec![Vec::new(); workers as usize];
    for s in steps {
        let slot = per
            .get_mut(s.worker as usize)
            .ok_or_else(|| format!("{source}: worker {} is outside the scenario's {workers} workers", s.worker))?;
        slot.push((s.step, s.seconds));
    }
    per.into_iter()
        .enumerate()
        .map(|(i, mut v)| {
            if v.is_empty() {
                return Err(format!("{source}: no steps for worker {i} (the scenario has {workers} workers)"));
            }
            v.sort_by_key(|(step, _)| *step);
            Ok(ComputeModel::Trace(v.into_iter().map(|(_, t)| t).collect()))
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    const BASE: Duration = Duration::from_millis(10);

    #[test]
    fn a_recorded_trace_replays_per_worker() {
        let back = [
            Step { worker: 1, step: 1, seconds: 0.5 },
            Step { worker: 0, step: 0, seconds: 0.25 },
            Step { worker: 1, step: 0, seconds: 0.125 },
            Step { worker: 0, step: 1, seconds: 0.75 },
        ];
        let models = compute_models(&back, 2, "t").unwrap();
        assert_eq!(models[1], ComputeModel::Trace(vec![0.125, 0.5]));
        assert!(compute_models(&back, 3, "t").unwrap_err().contains("no steps for worker 2"));
        assert!(compute_models(&back, 1, "t").unwrap_err().contains("outside"));
    }

    fn mean_of(model: &ComputeModel, steps: usize) -> f64 {
        let mut s = ComputeSampler::new(model.clone(), BASE, 42, 3);
        (0..steps).map(|_| s.next_seconds()).sum::<f64>() / steps as f64
    }

    #[test]
    fn deterministic_models_are_exact() {
        assert!((mean_of(&ComputeModel::None, 10) - 0.01).abs() < 1e-12);
        assert!((mean_of(&ComputeModel::Slowdown(4.0), 10) - 0.04).abs() < 1e-12);
        assert!((mean_of(&ComputeModel::ExtraDelay(Duration::from_millis(500)), 10) - 0.51).abs() < 1e-12);
        let mut s = ComputeSampler::new(ComputeModel::Trace(vec![0.1, 0.2, 0.3]), BASE, 1, 0);
        let got: Vec<f64> = (0..7).map(|_| s.next_seconds()).collect();
        assert_eq!(got, [0.1, 0.2, 0.3, 0.1, 0.2, 0.3, 0.1]);
        assert_eq!(s.steps(), 7);
        assert!((mean_of(&ComputeModel::Trace(vec![]), 3) - 0.01).abs() < 1e-12);
    }

    #[test]
    fn random_models_have_their_means() {
        let models = [
            ComputeModel::ShiftedExp { shift: 1.0, rate: 2.0 },
            ComputeModel::Pareto { scale: 1.0, shape: 3.0 },
            ComputeModel::Bursts { probability: 0.05, factor: 5.0, length: 10 },
        ];
        for m in &models {
            let want = m.mean_seconds(0.01).unwrap();
            let got = mean_of(m, 200_000);
            assert!((got - want).abs() / want < 0.03, "{m:?}: mean {got}, expected {want}");
        }
        // Every random model really varies, and never goes below its floor.
        let mut s = ComputeSampler::new(models[0].clone(), BASE, 9, 0);
        let xs: Vec<f64> = (0..100).map(|_| s.next_seconds()).collect();
        assert!(xs.iter().all(|&x| x >= 0.01));
        assert!(xs.iter().any(|&x| x != xs[0]));
    }

    #[test]
    fn bursts_last_their_length() {
        let mut s = ComputeSampler::new(ComputeModel::Bursts { probability: 1.0, factor: 3.0, length: 4 }, BASE, 0, 0);
        assert!((0..20).all(|_| (s.next_seconds() - 0.03).abs() < 1e-12));
        let mut s = ComputeSampler::new(ComputeModel::Bursts { probability: 0.1, factor: 3.0, length: 4 }, BASE, 0, 0);
        let slow: Vec<bool> = (0..10_000).map(|_| s.next_seconds() > 0.02).collect();
        // Runs of slow steps come in multiples of the burst length.
        let mut run = 0;
        for &x in slow.iter().chain([false].iter()) {
            if x {
                run += 1;
            } else {
                assert_eq!(run % 4, 0);
                run = 0;
            }
        }
        assert!(slow.iter().filter(|&&x| x).count() > 1000);
    }

    #[test]
    fn slow_phase_scales_only_its_steps() {
        let m =
            ComputeModel::SlowPhase { base: Box::new(ComputeModel::None), factor: 5.0, from_step: 2, until_step: 4 };
        let mut s = ComputeSampler::new(m.clone(), BASE, 1, 0);
        let got: Vec<f64> = (0..6).map(|_| s.next_seconds()).collect();
        assert_eq!(got, [0.01, 0.01, 0.05, 0.05, 0.01, 0.01]);
        assert_eq!(m.mean_seconds(0.01), Some(0.01));
    }

    #[test]
    fn nested_slow_phases_each_scale_their_steps() {
        let inner =
            ComputeModel::SlowPhase { base: Box::new(ComputeModel::None), factor: 5.0, from_step: 1, until_step: 2 };
        let m = ComputeModel::SlowPhase { base: Box::new(inner), factor: 3.0, from_step: 3, until_step: 5 };
        let mut s = ComputeSampler::new(m, BASE, 1, 0);
        let got: Vec<f64> = (0..6).map(|_| s.next_seconds()).collect();
        assert_eq!(got, [0.01, 0.05, 0.01, 0.03, 0.03, 0.01]);
    }

    #[test]
    fn trace_seconds_round_trip_to_the_nanosecond() {
        for n in [1u64, 999, 10_000_000, 10_000_001, 1_234_567_891, 40_000_000_017] {
            let d = Duration::from_nanos(n);
            assert_eq!(seconds_to_duration(d.as_secs_f64()), d);
        }
        assert_eq!(seconds_to_duration(-1.0), Duration::ZERO);
        assert_eq!(seconds_to_duration(f64::NAN), Duration::ZERO);
    }

    #[test]
    fn seeded_per_worker() {
        let m = ComputeModel::Pareto { scale: 1.0, shape: 2.0 };
        let draw = |seed, worker| {
            let mut s = ComputeSampler::new(m.clone(), BASE, seed, worker);
            (0..50).map(|_| s.next_seconds()).collect::<Vec<_>>()
        };
        assert_eq!(draw(7, 1), draw(7, 1));
        assert_ne!(draw(7, 1), draw(7, 2));
        assert_ne!(draw(7, 1), draw(8, 1));
    }

    #[test]
    fn helpers_build_the_paper_settings() {
        let v = ComputeModel::one_straggler(4, 2, 4.0);
        assert_eq!(v, [ComputeModel::None, ComputeModel::None, ComputeModel::Slowdown(4.0), ComputeModel::None]);
        let d = Duration::from_millis(500);
        let v = ComputeModel::odd_workers_delayed(4, d);
        assert_eq!(
            v,
            [ComputeModel::None, ComputeModel::ExtraDelay(d), ComputeModel::None, ComputeModel::ExtraDelay(d)]
        );
        assert_eq!(ComputeModel::all(3, &ComputeModel::Slowdown(2.0)).len(), 3);
        assert_eq!(ComputeModel::Pareto { scale: 1.0, shape: 1.0 }.mean_seconds(1.0), None);
    }

    #[test]
    fn bad_parameters_never_give_negative_or_nan_times() {
        for m in [ComputeModel::Slowdown(-1.0), ComputeModel::Slowdown(f64::NAN), ComputeModel::Trace(vec![-3.0])] {
            let mut s = ComputeSampler::new(m, BASE, 0, 0);
            let x = s.next_seconds();
            assert!(x >= 0.0 && x.is_finite());
        }
        let mut s = ComputeSampler::new(ComputeModel::Slowdown(f64::INFINITY), BASE, 0, 0);
        assert_eq!(s.next_step(), Duration::MAX);
        let mut s = ComputeSampler::new(ComputeModel::None, BASE, 0, 0);
        assert_eq!(s.next_step(), BASE);
    }
}
