//! `syncopate train`: one training run with real threads, or in the simulator with `--sim`.

use super::{failure::Failure, protocol::ProtocolArgs, summary::Summary, workload_args::WorkloadArgs};
use crate::sim::{self, ComputeModel, ComputeSampler, SimConfig, StopRule};
use crate::thread::{self, StepDelay, ThreadConfig};
use crate::trace;
use clap::Args;
use std::sync::Arc;
use std::time::Duration as StdDuration;
use syncopate::Duration;

/// Flags of `syncopate train`.
#[derive(Clone, Debug, Args)]
pub struct TrainArgs {
    /// The protocol and its knobs.
    #[command(flatten)]
    pub protocol: ProtocolArgs,
    /// The model, data and seed.
    #[command(flatten)]
    pub workload: WorkloadArgs,
    /// Gradient steps per worker: the run stops once the server has received
    /// steps × workers gradients (the same compute budget for every protocol).
    #[arg(long, default_value_t = 300, value_parser = clap::value_parser!(u64).range(1..=100_000_000))]
    pub steps: u64,
    /// Which workers straggle and how, e.g. `0:slow=4` or `all:exp=1/1,odd:delay=20`
    /// (docs/guide/cli.md, "Straggler specs", has the full syntax).
    #[arg(long, value_name = "SPEC", default_value = "")]
    pub straggler: String,
    /// Base time of one gradient computation in milliseconds, 0.01 to 60000 (threads sleep
    /// it; the simulator advances its virtual clock by it).
    #[arg(long, value_name = "MS", default_value_t = 2.0, allow_negative_numbers = true)]
    pub step_ms: f64,
    /// Test accuracy (0 to 1) whose first crossing is reported as the time to target.
    #[arg(long, default_value_t = 0.90, allow_negative_numbers = true)]
    pub target: f64,
    /// Run in the deterministic simulator (virtual time) instead of real threads.
    #[arg(long)]
    pub sim: bool,
    /// In the simulator only: split the model over S server shards (contiguous slices, each shard the
    /// protocol's server over its slice, each with its own network card).
    #[arg(long, value_name = "S", default_value_t = 1)]
    pub shards: u32,
    /// With --shards: shard k runs on worker k's machine and shares its network card.
    #[arg(long)]
    pub colocate_shards: bool,
    /// SGD with momentum BETA on every update of the server's model (in [0, 1); 0: plain SGD),
    /// in threads and in the simulator.
    #[arg(long, value_name = "BETA", default_value_t = 0.0, value_parser = super::values::parse_momentum)]
    pub momentum: f64,
    /// Print the summary as one JSON object on stdout.
    #[arg(long)]
    pub json: bool,
    /// Stop a threaded run after this many seconds, whatever the progress.
    #[arg(long, value_name = "SECS", allow_negative_numbers = true)]
    pub time_limit: Option<f64>,
    /// Write every worker's step times to FILE (CSV worker,step,seconds) for
    /// `syncopate advise --trace FILE`, with each step's minibatch loss and gradient norms
    /// (loss,grad_norm,mean_norm,mean_of), from which advise estimates the noise scale.
    #[arg(long, value_name = "FILE")]
    pub record_trace: Option<std::path::PathBuf>,
}

impl TrainArgs {
    pub(super) fn check(&self) -> Result<(), String> {
        let (lo, hi) = crate::scenario::STEP_MS_RANGE;
        if !(self.step_ms.is_finite() && (lo..=hi).contains(&self.step_ms)) {
            return Err(format!("invalid value '{}' for '--step-ms': must be between {lo} and {hi}", self.step_ms));
        }
        if !(0.0..=1.0).contains(&self.target) {
            return Err(format!("invalid value '{}' for '--target': must be between 0 and 1", self.target));
        }
        if self.time_limit.is_some() {
            super::values::time_limit(self.time_limit)?;
            if self.sim {
                return Err("--time-limit applies to threaded runs; a --sim run stops after --steps".into());
            }
        }
        if self.shards == 0 || self.shards > crate::scenario::MAX_SHARDS {
            return Err(format!(
                "invalid value '{}' for '--shards': must be between 1 and {}",
                self.shards,
                crate::scenario::MAX_SHARDS
            ));
        }
        if (self.shards != 1 || self.colocate_shards) && !self.sim {
            return Err("--shards and --colocate-shards apply to --sim runs (threaded runs have one server)".into());
        }
        if self.sim {
            let gradients = self.steps as f64 * f64::from(self.protocol.workers);
            let events = gradients * 6.0;
            if events > crate::scenario::EVENT_BUDGET as f64 {
                return Err(format!(
                    "invalid value '{}' for '--steps': {} workers × {} steps would take about {events:.1e} simulator events; at most {:.0e}",
                    self.steps,
                    self.protocol.workers,
                    self.steps,
                    crate::scenario::EVENT_BUDGET
                ));
            }
        }
        Ok(())
    }

    pub(super) fn base_step(&self) -> Duration {
        Duration::from_secs_f64(self.step_ms / 1000.0)
    }
}

/// Runs `syncopate train`.
pub(super) fn run(args: &TrainArgs) -> Result<(), Failure> {
    args.check().map_err(Failure::Usage)?;
    let protocol = args.protocol.config().map_err(Failure::Usage)?;
    let n = protocol.workers();
    let stragglers = crate::straggler::parse_stragglers(&args.straggler, n).map_err(Failure::Usage)?;
    let workload = args.workload.workload().map_err(Failure::Usage)?;
    let model_name = args.workload.model.to_string();
    let dim = workload.model.dim();
    let trace_file = args.record_trace.as_deref().map(trace::create).transpose().map_err(Failure::Usage)?;
    if args.sim {
        return run_sim(args, protocol, stragglers, &workload, &model_name, trace_file);
    }
    check_thread_memory(n, dim, super::values::mem_available()).map_err(Failure::Usage)?;
    let base = args.base_step();
    let bar = super::progress::progress_bar(args.steps.saturating_mul(u64::from(n)), args.json);
    let delays: Vec<StepDelay> = stragglers
        .into_iter()
        .enumerate()
        .map(|(i, model)| {
            let mut sampler = ComputeSampler::new(model, base, args.workload.seed, i as u32);
            let bar = bar.clone();
            Box::new(move |_step: u64| {
                // Called once per gradient a worker computes: the bar counts gradients.
                bar.inc(1);
                StdDuration::from_nanos(sampler.next_step().as_nanos())
            }) as StepDelay
        })
        .collect();
    let config = ThreadConfig {
        protocol,
        batch_size: args.workload.batch_size as usize,
        seed: args.workload.seed,
        max_gradients: args.steps.saturating_mul(u64::from(n)),
        time_limit: super::values::time_limit(args.time_limit).map_err(Failure::Usage)?,
        eval_interval: StdDuration::from_millis(20),
        rejoin_after: Some(StdDuration::from_secs(2)),
        target_accuracy: args.target,
        momentum: args.momentum,
    };
    let record = args.record_trace.is_some();
    let report = thread::run_recording(
        &config,
        Arc::new(workload),
        delays,
        &mut |p| {
            bar.set_message(format!("v{} acc {:.3}", p.version, p.accuracy));
        },
        record,
    )
    .map_err(|e| Failure::Run(e.to_string()))?;
    bar.finish_and_clear();
    if let (Some(path), Some(file)) = (&args.record_trace, trace_file) {
        let steps: Vec<trace::Step> = report
            .workers
            .iter()
            .enumerate()
            .flat_map(|(w, t)| {
                t.step_times.iter().enumerate().map(move |(i, s)| trace::Step {
                    worker: w as u32,
                    step: i as u64,
                    seconds: *s,
                })
            })
            .collect();
        // One gradient record per completed step, in the same order.
        let stats: Vec<trace::GradientStats> = report
            .workers
            .iter()
            .flat_map(|t| {
                let unknown = std::iter::repeat(trace::GradientStats::default());
                t.step_gradients.iter().copied().chain(unknown).take(t.step_times.len())
            })
            .collect();
        let stats = if stats.iter().all(trace::GradientStats::is_empty) { Vec::new() } else { stats };
        trace::write_with_stats_to(file, path, &steps, &stats).map_err(Failure::Run)?;
    }
    let mut summary =
        Summary::from_threads(&report, protocol.name(), n, &model_name, dim, args.workload.seed, args.target);
    summary.momentum = args.momentum;
    summary.print(args.json);
    Ok(())
}

fn run_sim(
    args: &TrainArgs,
    protocol: syncopate::ProtocolConfig,
    stragglers: Vec<ComputeModel>,
    workload: &crate::workload::Workload,
    model_name: &str,
    trace_file: Option<std::fs::File>,
) -> Result<(), Failure> {
    let n = u64::from(protocol.workers());
    let length = sim_length(&stragglers, args.step_ms / 1000.0, args.steps, &args.straggler).map_err(Failure::Usage)?;
    check_stall_reports(length, n * args.steps, args.protocol.stall_report, &args.straggler).map_err(Failure::Usage)?;
    let mut config = SimConfig::new(protocol, args.workload.model);
    config.momentum = args.momentum;
    config.seed = args.workload.seed;
    config.batch_size = args.workload.batch_size as usize;
    config.base_step = args.base_step();
    config.compute = stragglers;
    config.stop = StopRule { max_time: None, max_gradients: Some(args.steps.saturating_mul(n)), ..StopRule::default() };
    config.stop.max_events = crate::scenario::EVENT_BUDGET;
    // One evaluation per base step, spread out so that a run slowed by its stragglers still
    // makes at most MAX_CURVE_POINTS (each costs a pass over the test set); the time to
    // target does not depend on it (it is found among every published model).
    config.eval_interval = Duration::from_secs_f64((args.step_ms / 1000.0).max(length / MAX_CURVE_POINTS).max(1e-6));
    config.target_accuracy = args.target;
    config.record_trace = args.record_trace.is_some();
    config.shards = args.shards;
    config.colocate_shards = args.colocate_shards;
    let started = std::time::Instant::now();
    let report = sim::try_run(&config, workload).map_err(|e| Failure::Usage(e.to_string()))?;
    let wall_s = started.elapsed().as_secs_f64();
    if let (Some(path), Some(file)) = (&args.record_trace, trace_file) {
        let steps: Vec<trace::Step> = report
            .compute_trace
            .iter()
            .map(|s| trace::Step { worker: s.worker, step: s.step, seconds: s.seconds })
            .collect();
        let stats: Vec<trace::GradientStats> = report.compute_trace.iter().map(|s| s.gradient).collect();
        let stats = if stats.iter().all(trace::GradientStats::is_empty) { Vec::new() } else { stats };
        trace::write_with_stats_to(file, path, &steps, &stats).map_err(Failure::Run)?;
    }
    let mut summary = Summary::from_sim(&report, model_name, workload.model.dim());
    summary.momentum = args.momentum;
    let events_per_s = if wall_s > 0.0 { report.events as f64 / wall_s } else { 0.0 };
    summary.simulator = Some(super::summary::SimulatorCost { events: report.events, wall_s, events_per_s });
    summary.print(args.json);
    if !args.json {
        for s in &report.shards {
            println!(
                "shard {}: {} elements, {} updates, applied {}, dropped {}, ledger {}",
                s.shard,
                s.elements,
                s.updates,
                s.applied,
                s.dropped,
                if s.balanced() { "balanced" } else { "NOT balanced" }
            );
        }
    }
    Ok(())
}

/// The most evaluations (points of the accuracy curve) of a `--sim` run.
const MAX_CURVE_POINTS: f64 = 2_000.0;
/// The longest virtual time a `--sim` run may be expected to last, in seconds (about 30
/// years: far from the simulator clock's limit of 584 years).
const MAX_SIM_SECONDS: f64 = 1e9;

/// The virtual seconds a `--sim` run of `steps` gradients per worker is expected to last
/// when every step waits for the slowest worker (its mean step time × `steps`), refused when
/// no finite mean exists or the length exceeds [`MAX_SIM_SECONDS`].
fn sim_length(stragglers: &[ComputeModel], base_s: f64, steps: u64, spec: &str) -> Result<f64, String> {
    let mut slowest = base_s;
    for (worker, model) in stragglers.iter().enumerate() {
        match model.mean_seconds(base_s) {
            Some(mean) if mean.is_finite() => slowest = slowest.max(mean),
            _ => {
                return Err(format!(
                    "invalid value '{spec}' for '--straggler': worker {worker}'s step time has no finite mean (a Pareto shape at or below 1), so a --sim run of --steps {steps} has no bound on its length; use a shape above 1"
                ));
            }
        }
    }
    let length = slowest * steps as f64;
    if length > MAX_SIM_SECONDS {
        return Err(format!(
            "invalid value '{spec}' for '--straggler': the slowest worker's mean step of {slowest:.3e} s makes --steps {steps} last about {length:.1e} virtual seconds; at most {MAX_SIM_SECONDS:.0e}"
        ));
    }
    Ok(length)
}

/// The stall-report interval when `--stall-report` is not given, in milliseconds.
const DEFAULT_STALL_REPORT_MS: f64 = 2000.0;
/// Simulator events per gradient, an upper estimate (as the scenario budget counts them).
const EVENTS_PER_GRADIENT: f64 = 6.0;

/// Refuses a `--sim` run whose gradients, evaluations and stall reports (one per stall
/// interval of the run's expected `length` while a straggler is waited for) would exceed
/// the simulator's event budget.
fn check_stall_reports(length: f64, gradients: u64, stall_ms: Option<f64>, spec: &str) -> Result<(), String> {
    let stall_s = stall_ms.filter(|ms| *ms > 0.0).unwrap_or(DEFAULT_STALL_REPORT_MS) / 1000.0;
    let stalls = length / stall_s;
    let events = gradients as f64 * EVENTS_PER_GRADIENT + MAX_CURVE_POINTS + stalls;
    let budget = crate::scenario::EVENT_BUDGET as f64;
    if events > budget {
        return Err(format!(
            "invalid value '{spec}' for '--straggler': the run would last about {length:.1e} virtual seconds, about {stalls:.1e} stall reports (one per {stall_s} s of waiting) and {events:.1e} simulator events in all; at most {budget:.0e} (fewer --steps, a milder straggler or a longer --stall-report)"
        ));
    }
    Ok(())
}

/// Memory a threaded run needs per pair of workers: its queues grow with the square of the
/// worker count, a few kilobytes a pair.
const THREAD_PAIR_BYTES: f64 = 2304.0;
/// Stack and buffers of one worker thread besides its model copies.
const THREAD_BYTES: f64 = 256.0 * 1024.0;
/// Model copies one worker thread holds (its model, a gradient, buffers in flight).
const MODEL_COPIES_PER_THREAD: f64 = 4.0;

/// Refuses a threaded run whose estimated memory (quadratic in the workers, plus model
/// copies per thread) exceeds half of `available` bytes (unknown: not checked).
fn check_thread_memory(workers: u32, dim: usize, available: Option<u64>) -> Result<(), String> {
    let n = f64::from(workers);
    let estimate = n * n * THREAD_PAIR_BYTES + n * (THREAD_BYTES + MODEL_COPIES_PER_THREAD * dim as f64 * 4.0);
    match available {
        Some(bytes) if estimate > bytes as f64 * super::values::MEMORY_SHARE => Err(format!(
            "invalid value '{workers}' for '--workers': {workers} worker threads would need about {:.1} GB of memory and this machine has {:.1} GB available (at most half of it is planned); use fewer workers, or --sim for the simulator",
            estimate / 1e9,
            bytes as f64 / 1e9
        )),
        _ => Ok(()),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn thread_counts_the_memory_cannot_hold_are_refused() {
        let gb = 1u64 << 30;
        assert!(check_thread_memory(8, 650, Some(gb)).is_ok());
        assert!(check_thread_memory(65_535, 650, None).is_ok(), "unknown memory is not checked");
        let e = check_thread_memory(2000, 650, Some(6 * gb)).unwrap_err();
        assert!(e.contains("'2000' for '--workers'") && e.contains("GB") && e.contains("--sim"), "{e}");
        assert!(check_thread_memory(65_535, 650, Some(64 * gb)).is_err());
    }
}
