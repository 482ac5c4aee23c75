//! How the candidates run on one trace (or phase): the workload, its calibrated target and
//! ladder, the budget and the simulator configuration of each run.

use super::noise::{nqm_critical_batch, nqm_expected_loss, nqm_noise_for};
use super::{Options, TraceTable, WorkloadKind};
use crate::scenario::{EVENT_BUDGET, ProtocolSpec};
use crate::sim::{NetworkConfig, SimConfig, Target};
use crate::workload::{ModelKind, Workload};
use serde::Serialize;

/// The NQM's dimension (as in the reproduction's DBW experiment).
pub const NQM_DIM: usize = 100;
/// The NQM's noise pool.
const NQM_POOL: usize = 4096;
/// The share of the trace an ideal BSP run works through to reach the target.
pub const TARGET_SHARE: f64 = 0.9;
/// The budget as a multiple of the time BSP takes to replay the whole trace.
pub const BUDGET_FACTOR: f64 = 3.0;
/// The first horizon of a race as a multiple of the time the cluster takes to compute the
/// gradients an ideal BSP run needs (see [`Setting::first_horizon_s`]).
pub const FIRST_HORIZON: f64 = 1.5;
/// Simulator events per gradient, for the event guard's estimate.
const EVENTS_PER_GRADIENT: f64 = 6.0;
/// The most evaluations of one run.
const MAX_EVALS: f64 = 200_000.0;

/// How the candidates are run on one trace (or phase).
#[derive(Clone, Debug, Serialize)]
pub struct Setting {
    /// The workload.
    pub workload: WorkloadKind,
    /// Its model.
    #[serde(serialize_with = "display")]
    pub model: ModelKind,
    /// Examples per gradient.
    pub batch_size: usize,
    /// The learning rate of one averaged synchronous step.
    pub learning_rate: f64,
    /// The target.
    pub target: Target,
    /// Where the target comes from.
    pub target_note: String,
    /// Rungs on the way to the target.
    pub ladder: Vec<Target>,
    /// Virtual seconds per run at most (the last horizon of a race).
    pub budget_s: f64,
    /// Where the budget comes from.
    pub budget_note: String,
    /// The first horizon of a race: the candidates first run this long; those neither
    /// finished nor measurably slower than the fastest run longer.
    pub first_horizon_s: f64,
    /// The NQM's noise covariance multiplier `c` (1: the built-in model).
    pub noise: f64,
    /// The NQM's critical batch at the target, in examples ([`super::noise`]).
    pub critical_batch: Option<f64>,
    /// Virtual seconds between evaluations.
    pub eval_interval_s: f64,
    /// Steps per worker of the trace (or phase) the runs replay.
    pub steps: usize,
    /// Its median step.
    pub median_step_s: f64,
    /// Seconds BSP needs to replay it.
    pub bsp_replay_s: f64,
    /// Latency of every link, seconds.
    pub latency_s: f64,
    /// Bandwidth of every link, bytes per second.
    pub bandwidth: f64,
}

fn display<S: serde::Serializer, T: std::fmt::Display>(v: &T, s: S) -> Result<S::Ok, S::Error> {
    s.serialize_str(&v.to_string())
}

impl Setting {
    /// The setting for `trace` under `options` (see the module docs).
    pub fn for_trace(trace: &TraceTable, options: &Options) -> Result<Self, String> {
        let steps = trace.steps.max(1);
        let median = trace.median_step();
        let bsp = trace.bsp_duration();
        let net = &options.network;
        let latency = net.latency.as_secs_f64();
        let round_trip = 2.0 * latency;
        let n = trace.workers as usize;
        // Gradients per virtual second with every worker at its mean step.
        let rate: f64 = trace
            .times
            .iter()
            .map(|v| 1.0 / (v.iter().sum::<f64>() / v.len().max(1) as f64).max(crate::trace::MIN_STEP_SECONDS))
            .sum();
        let eval_at = |budget: f64| match options.workload {
            WorkloadKind::Nqm => (median / 4.0).max(budget / MAX_EVALS),
            WorkloadKind::Digits | WorkloadKind::Mnist5k => (2.0 * median).max(budget / 4000.0),
        };
        let events = |budget: f64| budget * rate * EVENTS_PER_GRADIENT + budget / eval_at(budget);
        let replay = BUDGET_FACTOR * (bsp + steps as f64 * round_trip);
        let (budget, budget_note) = match options.budget_s {
            Some(b) if b.is_finite() && b > 0.0 => {
                if events(b) > EVENT_BUDGET as f64 {
                    return Err(format!(
                        "a budget of {b} s would take about {:.1e} simulator events per run; at most {EVENT_BUDGET:.0e} (lower --budget, or leave it out)",
                        events(b)
                    ));
                }
                (b, "given".to_string())
            }
            Some(b) => return Err(format!("budget {b} must be a positive number of seconds")),
            None if events(replay) <= EVENT_BUDGET as f64 => {
                (replay, format!("{BUDGET_FACTOR}x the time BSP needs to replay the trace"))
            }
            None => {
                // Evaluations are at most MAX_EVALS per run: this budget fits the guard.
                let most = (EVENT_BUDGET as f64 - MAX_EVALS) / (rate * EVENTS_PER_GRADIENT);
                (
                    most,
                    format!(
                        "the most the event guard allows ({EVENT_BUDGET:.0e} events per run; {BUDGET_FACTOR}x BSP's replay would be {replay:.1} s)"
                    ),
                )
            }
        };
        // The cluster computes the gradients an ideal BSP run needs in `ideal` seconds.
        let share = if options.workload == WorkloadKind::Nqm { TARGET_SHARE } else { 1.0 };
        let ideal = share * steps as f64 * (n as f64 / rate.max(f64::MIN_POSITIVE) + round_trip);
        let first_horizon = (FIRST_HORIZON * ideal).min(budget);
        let eval = eval_at(budget);
        let (model, batch_size, learning_rate, target, note, ladder, noise, critical_batch) = match options.workload {
            WorkloadKind::Nqm => {
                let lr = (NQM_DIM as f64 / steps as f64).min(0.5);
                let reference = TARGET_SHARE * steps as f64;
                let per_gradient = options.worker_batch.max(1) as f64;
                let noise = match options.noise_scale {
                    Some(b) if b.is_finite() && b > 0.0 => nqm_noise_for(NQM_DIM, lr, reference, b / per_gradient),
                    Some(b) => return Err(format!("noise scale {b} must be a positive number of examples")),
                    None => 1.0,
                };
                let critical = nqm_critical_batch(NQM_DIM, lr, reference, noise) * per_gradient;
                let at = |share: f64| nqm_expected_loss(NQM_DIM, lr, n, 1, share * steps as f64, noise);
                let (target, note) = match options.target {
                    Some(x) if x.is_finite() && x > 0.0 => (x, format!("loss {x} (given)")),
                    Some(x) => return Err(format!("target {x} must be a positive loss for nqm")),
                    None => (
                        at(TARGET_SHARE),
                        format!(
                            "loss {:.4}: the expected loss of an ideal BSP run (closed form) after {:.0}% of the trace's {steps} steps",
                            at(TARGET_SHARE),
                            TARGET_SHARE * 100.0
                        ),
                    ),
                };
                let ladder: Vec<Target> =
                    [0.25, 0.5, 0.75].iter().map(|&s| at(s)).filter(|&l| l > target).map(Target::Loss).collect();
                (ModelKind::Nqm { dim: NQM_DIM }, 1, lr, Target::Loss(target), note, ladder, noise, Some(critical))
            }
            WorkloadKind::Digits | WorkloadKind::Mnist5k => {
                let acc = options.target.unwrap_or(0.90);
                if !(0.0..=1.0).contains(&acc) {
                    return Err(format!("target {acc} must be an accuracy between 0 and 1"));
                }
                let ladder = [0.80, 0.85, 0.88].into_iter().filter(|&a| a < acc).map(Target::Accuracy).collect();
                let (model, batch, lr) = if options.workload == WorkloadKind::Digits {
                    (ModelKind::Softmax, 32, 0.5)
                } else {
                    (ModelKind::Mlp { hidden: 32 }, 32, 0.2)
                };
                (model, batch, lr, Target::Accuracy(acc), format!("accuracy {acc}"), ladder, 1.0, None)
            }
        };
        Ok(Self {
            workload: options.workload,
            model,
            batch_size,
            learning_rate,
            target,
            target_note: note,
            ladder,
            budget_s: budget,
            budget_note,
            first_horizon_s: first_horizon,
            noise,
            critical_batch,
            eval_interval_s: eval,
            steps,
            median_step_s: median,
            bsp_replay_s: bsp,
            latency_s: latency,
            bandwidth: net.bandwidth,
        })
    }

    /// The workload of data seed `seed`.
    pub fn workload(&self, seed: u64) -> Workload {
        match self.workload {
            WorkloadKind::Nqm => {
                let mut w = Workload::nqm(NQM_DIM, NQM_POOL, seed);
                if self.noise != 1.0 {
                    // Covariance c·diag(h): every noise vector scaled by √c.
                    let scale = self.noise.sqrt() as f32;
                    w.train.features.iter_mut().for_each(|z| *z *= scale);
                }
                w
            }
            WorkloadKind::Digits => Workload::digits(self.model, seed),
            WorkloadKind::Mnist5k => Workload::mnist5k(self.model, seed),
        }
    }

    /// The simulator configuration of `spec` on `trace` with run seed `seed`, stopping at the
    /// target or at `horizon_s` virtual seconds.
    pub fn sim_config(
        &self,
        spec: &ProtocolSpec,
        trace: &TraceTable,
        seed: u64,
        horizon_s: f64,
    ) -> Result<SimConfig, String> {
        let protocol = spec.config(trace.workers, self.learning_rate)?;
        let mut c = SimConfig::new(protocol, self.model);
        c.seed = seed;
        c.batch_size = self.batch_size;
        c.base_step = syncopate::Duration::from_secs_f64(self.median_step_s);
        c.compute = trace.compute();
        c.network =
            NetworkConfig { latency: syncopate::Duration::from_secs_f64(self.latency_s), bandwidth: self.bandwidth };
        c.eval_interval = syncopate::Duration::from_secs_f64(self.eval_interval_s);
        c.stop.max_time = Some(syncopate::Duration::from_secs_f64(horizon_s.min(self.budget_s)));
        c.stop.max_events = EVENT_BUDGET;
        match self.target {
            Target::Loss(x) => {
                c.stop.stop_at_loss = Some(x);
                c.target_accuracy = 2.0;
            }
            Target::Accuracy(a) => {
                c.target_accuracy = a;
                c.stop.stop_at_target = true;
            }
        }
        c.record_trace = false;
        Ok(c)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_calibrated_target_sits_on_the_descent_above_the_noise_floor() {
        let (dim, lr) = (NQM_DIM, 0.05);
        let start = nqm_expected_loss(dim, lr, 16, 1, 0.0, 1.0);
        assert!((start - (1..=dim).map(|i| 0.5 / i as f64).sum::<f64>()).abs() < 1e-9);
        let target = nqm_expected_loss(dim, lr, 16, 1, 1800.0, 1.0);
        let later = nqm_expected_loss(dim, lr, 16, 1, 2000.0, 1.0);
        let floor = crate::workload::nqm::noise_floor(dim, lr, 16, 1);
        assert!(target > 1.1 * later && target > 3.0 * floor, "{target} {later} {floor}");
    }

    #[test]
    fn a_budget_over_the_event_guard_is_capped_unless_given() {
        use crate::advise::tracegen;
        // One step a million times the median makes BSP's replay far too long to simulate.
        let mut steps = tracegen::generate(tracegen::Kind::Uniform, 16, 100, 0.01, 1);
        steps[5].seconds = 10_000.0;
        let trace = TraceTable::from_steps(&steps).unwrap();
        let s = Setting::for_trace(&trace, &Options::default()).unwrap();
        assert!(s.budget_note.contains("the most the event guard allows"), "{}", s.budget_note);
        assert!(s.budget_s < BUDGET_FACTOR * trace.bsp_duration());
        assert!(s.first_horizon_s < s.budget_s / 10.0, "{} {}", s.first_horizon_s, s.budget_s);
        let given = Options { budget_s: Some(BUDGET_FACTOR * trace.bsp_duration()), ..Options::default() };
        assert!(Setting::for_trace(&trace, &given).unwrap_err().contains("lower --budget"));
        // A short tail keeps the usual budget.
        let plain = TraceTable::from_steps(&tracegen::generate(tracegen::Kind::Uniform, 16, 100, 0.01, 1)).unwrap();
        let s = Setting::for_trace(&plain, &Options::default()).unwrap();
        assert!(s.budget_note.starts_with("3x"), "{}", s.budget_note);
    }
}
