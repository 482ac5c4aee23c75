//! How the candidates run on one trace (or phase): the workload, its calibrated target and
//! ladder, the budget and the simulator configuration of each run.

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
    /// Virtual seconds per run at most.
    pub budget_s: f64,
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

/// The expected NQM loss after `t` steps of SGD with learning rate `lr` averaging `k`
/// gradients of batch `batch` per step, from `x = 1`: per coordinate, the decayed start
/// `ρ^{2t}` plus the accumulated noise `lr² h / (k b) · (1 − ρ^{2t}) / (1 − ρ²)`, `ρ = 1 − lr h`.
pub fn nqm_expected_loss(dim: usize, lr: f64, k: usize, batch: usize, t: f64) -> f64 {
    let kb = (k * batch).max(1) as f64;
    (0..dim)
        .map(|i| {
            let h = 1.0 / (i as f64 + 1.0);
            let rho = 1.0 - lr * h;
            let decay = rho.abs().powf(2.0 * t);
            let noise = lr * lr * h / kb * (1.0 - decay) / (1.0 - rho * rho).max(1e-12);
            0.5 * h * (decay + noise)
        })
        .sum()
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
        let budget = match options.budget_s {
            Some(b) if b.is_finite() && b > 0.0 => b,
            Some(b) => return Err(format!("budget {b} must be a positive number of seconds")),
            None => BUDGET_FACTOR * (bsp + steps as f64 * round_trip),
        };
        let n = trace.workers as usize;
        let (model, batch_size, learning_rate, target, note, ladder, eval) = match options.workload {
            WorkloadKind::Nqm => {
                let lr = (NQM_DIM as f64 / steps as f64).min(0.5);
                let at = |share: f64| nqm_expected_loss(NQM_DIM, lr, n, 1, share * steps as f64);
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
                let eval = (median / 4.0).max(budget / 200_000.0);
                (ModelKind::Nqm { dim: NQM_DIM }, 1, lr, Target::Loss(target), note, ladder, eval)
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
                let eval = (2.0 * median).max(budget / 4000.0);
                (model, batch, lr, Target::Accuracy(acc), format!("accuracy {acc}"), ladder, eval)
            }
        };
        // Every worker at its mean step for the whole budget, ~6 events per gradient.
        let gradients: f64 = trace
            .times
            .iter()
            .map(|v| budget / (v.iter().sum::<f64>() / v.len().max(1) as f64).max(crate::trace::MIN_STEP_SECONDS))
            .sum();
        let events = gradients * 6.0 + budget / eval;
        if events > EVENT_BUDGET as f64 {
            return Err(format!(
                "a budget of {budget} s would take about {events:.1e} simulator events per run; at most {EVENT_BUDGET:.0e} (lower --budget)"
            ));
        }
        Ok(Self {
            workload: options.workload,
            model,
            batch_size,
            learning_rate,
            target,
            target_note: note,
            ladder,
            budget_s: budget,
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
            WorkloadKind::Nqm => Workload::nqm(NQM_DIM, NQM_POOL, seed),
            WorkloadKind::Digits => Workload::digits(self.model, seed),
            WorkloadKind::Mnist5k => Workload::mnist5k(self.model, seed),
        }
    }

    /// The simulator configuration of `spec` on `trace` with run seed `seed`.
    pub fn sim_config(&self, spec: &ProtocolSpec, trace: &TraceTable, seed: u64) -> Result<SimConfig, String> {
        let protocol = spec.config(trace.workers, self.learning_rate)?;
        let mut c = SimConfig::new(protocol, self.model);
        c.seed = seed;
        c.batch_size = self.batch_size;
        c.base_step = syncopate::Duration::from_secs_f64(self.median_step_s);
        c.compute = trace.compute();
        c.network =
            NetworkConfig { latency: syncopate::Duration::from_secs_f64(self.latency_s), bandwidth: self.bandwidth };
        c.eval_interval = syncopate::Duration::from_secs_f64(self.eval_interval_s);
        c.stop.max_time = Some(syncopate::Duration::from_secs_f64(self.budget_s));
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
        let start = nqm_expected_loss(dim, lr, 16, 1, 0.0);
        assert!((start - (1..=dim).map(|i| 0.5 / i as f64).sum::<f64>()).abs() < 1e-9);
        let target = nqm_expected_loss(dim, lr, 16, 1, 1800.0);
        let later = nqm_expected_loss(dim, lr, 16, 1, 2000.0);
        let floor = crate::workload::nqm::noise_floor(dim, lr, 16, 1);
        assert!(target > 1.1 * later && target > 3.0 * floor, "{target} {later} {floor}");
    }
}
