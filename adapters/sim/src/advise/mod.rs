//! `syncopate advise`: which protocol, with which knobs, to run on a cluster whose step
//! times were recorded in a trace.
//!
//! - **From the trace**: the worker count, the step-time scale (the median step `m`) and the
//!   budget. Every knob that matters is swept with its protocol ([`candidates`]): backup
//!   workers `b`, SSP's and BAP's staleness `s`, BAP's iteration limit and WBSP's round
//!   deadline as multiples of `m`, the grouped protocol's `G`, and DBW.
//! - **The whole trace**: on the default workload, the noisy quadratic model (NQM, the
//!   reproduction's DBW workload), the target is calibrated so that an ideal BSP run on
//!   the trace (every step at its expected loss) reaches it after 90% of the trace's steps
//!   ([`Setting::for_trace`]): every candidate has to work through most of the trace, so a
//!   regime change late in it counts. The ladder's rungs are the losses after 25%, 50% and
//!   75% of the steps. Runs stop at the target or at the budget (3x the time BSP needs to
//!   replay the whole trace). With `digits` or `mnist5k` the target is an accuracy (the
//!   reproduction's ladder), and the report says how much of the trace the runs used.
//! - **Phases**: where the step-time distribution changes regime ([`phases::detect`]), each
//!   phase is swept on its own; when the best choice differs between phases, the advice says
//!   so and gives DBW's whole-trace time (it adapts `b` as it goes) next to the static pick.
//! - **Robustness**: every candidate runs with several run seeds (minibatches) and as many
//!   data seeds (the NQM noise pool, or the train/test split), separate from each other; the
//!   time to target is reported as the mean with its 95% interval, and the pick is made
//!   among the candidates that reached the target on every seed by [`pick`]: the fastest
//!   mean, or, among the candidates statistically tied with it (paired interval of the
//!   difference includes zero, or means within 1%) and within 5% of it, the simplest.

pub mod phases;
pub mod stats;
pub mod tracegen;

use crate::scenario::{EVENT_BUDGET, ProtocolKind, ProtocolSpec};
use crate::sim::{self, ComputeModel, NetworkConfig, SimConfig, SimReport, Target};
use crate::trace::Step;
use crate::workload::{ModelKind, Workload};
use serde::Serialize;
use stats::Interval;
use std::sync::Mutex;
use std::sync::atomic::{AtomicUsize, Ordering};

/// Stack size of a simulation thread.
const SIM_STACK: usize = 64 << 20;
/// The NQM's dimension (as in the reproduction's DBW experiment).
pub const NQM_DIM: usize = 100;
/// The NQM's noise pool.
const NQM_POOL: usize = 4096;
/// The share of the trace an ideal BSP run works through to reach the target.
pub const TARGET_SHARE: f64 = 0.9;
/// The budget as a multiple of the time BSP takes to replay the whole trace.
pub const BUDGET_FACTOR: f64 = 3.0;
/// Candidates tied with the fastest are considered for the pick when within this of its mean.
pub const TIE_WITHIN: f64 = 0.05;
/// Means this close are a tie whatever the interval says.
pub const TIE_ALWAYS: f64 = 0.01;

/// A trace as a table: `times[w][k]` is worker `w`'s step `k`, in seconds.
#[derive(Clone, Debug, PartialEq)]
pub struct TraceTable {
    /// Workers.
    pub workers: u32,
    /// Steps per worker.
    pub steps: usize,
    /// Step times per worker.
    pub times: Vec<Vec<f64>>,
}

impl TraceTable {
    /// The table of `steps`, which must be a full table (as [`crate::trace::read`] checks).
    pub fn from_steps(steps: &[Step]) -> Result<Self, String> {
        let workers = steps.iter().map(|s| s.worker).max().map_or(0, |w| w + 1);
        let per = steps.iter().map(|s| s.step).max().map_or(0, |s| s + 1) as usize;
        let mut times = vec![vec![f64::NAN; per]; workers as usize];
        for s in steps {
            if let Some(slot) = times.get_mut(s.worker as usize).and_then(|v| v.get_mut(s.step as usize)) {
                *slot = s.seconds;
            }
        }
        if workers == 0 || times.iter().flatten().any(|t| t.is_nan()) {
            return Err("the trace is not a full table of workers and steps".into());
        }
        Ok(Self { workers, steps: per, times })
    }

    /// The median step time over every worker and step.
    pub fn median_step(&self) -> f64 {
        stats::median(&self.times.iter().flatten().copied().collect::<Vec<_>>())
    }

    /// Steps `from..until` of every worker.
    pub fn slice(&self, from: usize, until: usize) -> Self {
        let times: Vec<Vec<f64>> = self.times.iter().map(|v| v[from..until].to_vec()).collect();
        Self { workers: self.workers, steps: until - from, times }
    }

    /// How long BSP takes to replay the whole trace (compute only): `Σ_k max_w t[w][k]`.
    pub fn bsp_duration(&self) -> f64 {
        (0..self.steps).map(|k| self.times.iter().map(|v| v[k]).fold(0.0, f64::max)).sum()
    }

    /// The replay model of every worker.
    pub fn compute(&self) -> Vec<ComputeModel> {
        self.times.iter().map(|v| ComputeModel::Trace(v.clone())).collect()
    }

    /// Per step: the level `ln(median_w t)` and the spread `ln(max_w t / median_w t)`.
    pub fn level_and_spread(&self) -> (Vec<f64>, Vec<f64>) {
        (0..self.steps)
            .map(|k| {
                let col: Vec<f64> = self.times.iter().map(|v| v[k]).collect();
                let med = stats::median(&col);
                let max = col.iter().copied().fold(0.0, f64::max);
                (med.ln(), (max / med).ln())
            })
            .unzip()
    }
}

/// The workload the candidates train.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize)]
#[serde(rename_all = "lowercase")]
pub enum WorkloadKind {
    /// The noisy quadratic model, target calibrated to the trace (default).
    Nqm,
    /// Softmax regression on the built-in digits, an accuracy target.
    Digits,
    /// The reproduction's MLP (784-32-10) on mnist5k, an accuracy target.
    Mnist5k,
}

impl std::str::FromStr for WorkloadKind {
    type Err = String;
    fn from_str(s: &str) -> Result<Self, String> {
        match s {
            "nqm" => Ok(Self::Nqm),
            "digits" => Ok(Self::Digits),
            "mnist5k" => Ok(Self::Mnist5k),
            other => Err(format!("unknown workload '{other}': one of nqm, digits, mnist5k")),
        }
    }
}

/// What the user may set.
#[derive(Clone, Debug)]
pub struct Options {
    /// The workload.
    pub workload: WorkloadKind,
    /// The target: a loss (NQM) or an accuracy; `None`: calibrated (NQM) or 0.90.
    pub target: Option<f64>,
    /// The budget of each run in seconds; `None`: [`BUDGET_FACTOR`] × BSP's replay time.
    pub budget_s: Option<f64>,
    /// Run seeds `seed..seed + repeats`.
    pub seed: u64,
    /// Data seeds `split_seed..split_seed + repeats` (paired with the run seeds).
    pub split_seed: u64,
    /// Seeds (and data splits) per candidate.
    pub repeats: u32,
    /// Sweep each phase on its own where the trace changes regime.
    pub phases: bool,
    /// The network between the server and each worker.
    pub network: NetworkConfig,
}

impl Default for Options {
    fn default() -> Self {
        Self {
            workload: WorkloadKind::Nqm,
            target: None,
            budget_s: None,
            seed: 1,
            split_seed: 1001,
            repeats: 5,
            phases: true,
            network: NetworkConfig::default(),
        }
    }
}

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

/// The simplicity rank of a protocol, for picking among tied candidates: fewer moving
/// parts first (BSP, static backup, DBW, SSP, ASP, BAP, WBSP, grouped).
pub fn simplicity(name: ProtocolKind) -> u32 {
    match name {
        ProtocolKind::Bsp => 0,
        ProtocolKind::Backup => 1,
        ProtocolKind::Dbw => 2,
        ProtocolKind::Ssp => 3,
        ProtocolKind::Asp => 4,
        ProtocolKind::Bap => 5,
        ProtocolKind::Wbsp | ProtocolKind::WbspOverlap => 6,
        ProtocolKind::Grouped => 7,
    }
}

/// One candidate: a protocol with its knobs, and how a time knob relates to the trace.
#[derive(Clone, Debug, PartialEq)]
pub struct Candidate {
    /// The protocol and knobs.
    pub spec: ProtocolSpec,
    /// A time knob as a multiple of the median step (`None`: no time knob).
    pub median_multiple: Option<f64>,
}

/// Milliseconds rounded to three significant digits.
fn round_ms(ms: f64) -> f64 {
    if ms <= 0.0 {
        return ms;
    }
    let scale = 10f64.powi(2 - ms.log10().floor() as i32);
    (ms * scale).round() / scale
}

/// The sweep for `workers` workers and a median step of `median_s`: BSP; ASP; SSP with
/// `s` in 1, 2, 4, 8; BAP with `s` in 1, 3 and an iteration limit of 1.5 or 3 median steps;
/// backup workers `b` in 1, 2, n/4, n/2 (below n); DBW; WBSP with a round deadline of 2 or 4
/// median steps; grouped with `G` in 2, 4, n/4 (at most n/2).
pub fn candidates(workers: u32, median_s: f64) -> Vec<Candidate> {
    let n = workers;
    let mut out = Vec::new();
    let plain = |name| Candidate { spec: ProtocolSpec::new(name), median_multiple: None };
    out.push(plain(ProtocolKind::Bsp));
    let mut bs: Vec<u32> = [1, 2, n / 4, n / 2].into_iter().filter(|&b| b >= 1 && b < n).collect();
    bs.sort_unstable();
    bs.dedup();
    for b in bs {
        let mut c = plain(ProtocolKind::Backup);
        c.spec.backup_workers = Some(b);
        out.push(c);
    }
    if n >= 2 {
        out.push(plain(ProtocolKind::Dbw));
    }
    for s in [1, 2, 4, 8] {
        let mut c = plain(ProtocolKind::Ssp);
        c.spec.staleness = Some(s);
        out.push(c);
    }
    out.push(plain(ProtocolKind::Asp));
    for s in [1, 3] {
        for f in [1.5, 3.0] {
            let mut c = plain(ProtocolKind::Bap);
            c.spec.staleness = Some(s);
            c.spec.iteration_timeout_ms = Some(round_ms(f * median_s * 1000.0));
            c.median_multiple = Some(f);
            out.push(c);
        }
    }
    for f in [2.0, 4.0] {
        let mut c = plain(ProtocolKind::Wbsp);
        c.spec.round_deadline_ms = Some(round_ms(f * median_s * 1000.0));
        c.median_multiple = Some(f);
        out.push(c);
    }
    let mut gs: Vec<u32> = [2, 4, n / 4].into_iter().filter(|&g| g >= 2 && g <= n / 2).collect();
    gs.sort_unstable();
    gs.dedup();
    for g in gs {
        let mut c = plain(ProtocolKind::Grouped);
        c.spec.groups = Some(g);
        out.push(c);
    }
    out.retain(|c| c.spec.config(n, 0.5).is_ok());
    out
}

/// One candidate's measurements.
#[derive(Clone, Debug, Serialize)]
pub struct Measured {
    /// The label (protocol and knobs).
    pub label: String,
    /// The protocol.
    pub protocol: String,
    /// A time knob as a multiple of the median step.
    pub median_multiple: Option<f64>,
    /// The one count knob of backup (`b`), SSP (`s`) or grouped (`G`), to tell when the pick
    /// sits at the edge of its sweep.
    pub count_knob: Option<u64>,
    /// Time to target per (run seed, data seed) pair (`None`: not within the budget).
    pub times_s: Vec<Option<f64>>,
    /// Pairs that reached the target.
    pub reached: u32,
    /// Pairs run.
    pub repeats: u32,
    /// Mean time to target with its 95% interval (misses counted at the budget, a lower
    /// bound then).
    pub time: Interval,
    /// Mean time to each rung of the ladder (`None`: some pair missed it).
    pub ladder_s: Vec<Option<f64>>,
    /// BSP's mean time divided by this one's.
    pub speedup_vs_bsp: Option<f64>,
    /// Mean model updates at the stop.
    pub updates: f64,
    /// Mean share of the trace's steps the workers had computed at the stop.
    pub trace_used: f64,
    /// Statistically tied with the fastest (see [`pick`]).
    pub tied: bool,
}

/// One sweep: every candidate on one trace (or phase) with the same seeds and splits.
#[derive(Clone, Debug, Serialize)]
pub struct SweepResult {
    /// How the candidates ran.
    pub setting: Setting,
    /// Run seeds.
    pub run_seeds: Vec<u64>,
    /// Data seeds, paired with the run seeds.
    pub split_seeds: Vec<u64>,
    /// Every candidate, in sweep order.
    pub rows: Vec<Measured>,
    /// The candidate with the lowest mean among those that always reached the target.
    pub fastest: Option<usize>,
    /// The recommendation ([`pick`]).
    pub pick: Option<usize>,
}

impl SweepResult {
    /// The row `i`'s label.
    pub fn label(&self, i: Option<usize>) -> &str {
        i.and_then(|i| self.rows.get(i)).map_or("-", |r| r.label.as_str())
    }
}

/// Runs `work` (configs with the index of their workload) on up to `jobs` threads.
fn run_all(
    jobs: usize,
    work: &[(SimConfig, usize)],
    workloads: &[Workload],
    done: &(dyn Fn() + Sync),
) -> Result<Vec<SimReport>, String> {
    let next = AtomicUsize::new(0);
    let results: Mutex<Vec<Option<Result<SimReport, String>>>> = Mutex::new(vec![None; work.len()]);
    std::thread::scope(|s| {
        for _ in 0..jobs.clamp(1, work.len().max(1)) {
            let builder = std::thread::Builder::new().name("advise".into()).stack_size(SIM_STACK);
            let spawned = builder.spawn_scoped(s, || {
                loop {
                    let i = next.fetch_add(1, Ordering::Relaxed);
                    let Some((config, w)) = work.get(i) else { break };
                    let report = match workloads.get(*w) {
                        Some(workload) => sim::try_run(config, workload).map_err(|e| e.to_string()),
                        None => Err("no workload".into()),
                    };
                    if let Ok(mut r) = results.lock() {
                        if let Some(slot) = r.get_mut(i) {
                            *slot = Some(report);
                        }
                    }
                    done();
                }
            });
            if spawned.is_err() {
                break;
            }
        }
    });
    let results = results.into_inner().map_err(|_| "a simulation thread panicked".to_string())?;
    results.into_iter().map(|r| r.unwrap_or_else(|| Err("a run did not finish".into()))).collect()
}

/// Runs every candidate on `trace` with each (run seed, data seed) pair.
pub fn sweep(
    trace: &TraceTable,
    candidates: &[Candidate],
    setting: &Setting,
    run_seeds: &[u64],
    split_seeds: &[u64],
    jobs: usize,
    done: &(dyn Fn() + Sync),
) -> Result<SweepResult, String> {
    let pairs = run_seeds.len().min(split_seeds.len());
    let workloads: Vec<Workload> = split_seeds.iter().take(pairs).map(|&s| setting.workload(s)).collect();
    let mut work = Vec::with_capacity(candidates.len() * pairs);
    for c in candidates {
        for (p, &seed) in run_seeds.iter().take(pairs).enumerate() {
            work.push((setting.sim_config(&c.spec, trace, seed).map_err(|e| format!("{}: {e}", c.spec.label()))?, p));
        }
    }
    let reports = run_all(jobs, &work, &workloads, done)?;
    let total_steps = (trace.steps as f64 * f64::from(trace.workers)).max(1.0);
    let mut rows = Vec::with_capacity(candidates.len());
    for (c, reports) in candidates.iter().zip(reports.chunks(pairs.max(1))) {
        let times: Vec<Option<f64>> = reports.iter().map(|r| r.time_to(setting.target)).collect();
        let censored: Vec<f64> = times.iter().map(|t| t.unwrap_or(setting.budget_s)).collect();
        let ladder_s = setting
            .ladder
            .iter()
            .map(|&rung| {
                let ts: Option<Vec<f64>> = reports.iter().map(|r| r.time_to(rung)).collect();
                ts.map(|v| v.iter().sum::<f64>() / v.len().max(1) as f64)
            })
            .collect();
        let mean = |f: &dyn Fn(&SimReport) -> f64| reports.iter().map(f).sum::<f64>() / reports.len().max(1) as f64;
        rows.push(Measured {
            label: c.spec.label(),
            protocol: c.spec.name.as_str().to_string(),
            median_multiple: c.median_multiple,
            count_knob: match c.spec.name {
                ProtocolKind::Backup => c.spec.backup_workers.map(u64::from),
                ProtocolKind::Ssp => c.spec.staleness,
                ProtocolKind::Grouped => c.spec.groups.map(u64::from),
                _ => None,
            },
            reached: times.iter().filter(|t| t.is_some()).count() as u32,
            repeats: times.len() as u32,
            time: stats::interval(&censored),
            times_s: times,
            ladder_s,
            speedup_vs_bsp: None,
            updates: mean(&|r| r.updates as f64),
            trace_used: mean(&|r| r.per_worker.iter().map(|w| w.gradients_computed as f64).sum::<f64>() / total_steps),
            tied: false,
        });
    }
    let bsp = candidates.iter().position(|c| c.spec.name == ProtocolKind::Bsp);
    let bsp_time = bsp.and_then(|i| rows.get(i)).filter(|r| r.reached == r.repeats).map(|r| r.time.mean);
    for r in &mut rows {
        if let Some(b) = bsp_time {
            if r.reached == r.repeats && r.time.mean > 0.0 {
                r.speedup_vs_bsp = Some(b / r.time.mean);
            }
        }
    }
    let ranks: Vec<u32> = candidates.iter().map(|c| simplicity(c.spec.name)).collect();
    let (fastest, pick, tied) = pick(&rows, &ranks);
    for i in tied {
        if let Some(r) = rows.get_mut(i) {
            r.tied = true;
        }
    }
    Ok(SweepResult {
        setting: setting.clone(),
        run_seeds: run_seeds.iter().take(pairs).copied().collect(),
        split_seeds: split_seeds.iter().take(pairs).copied().collect(),
        rows,
        fastest,
        pick,
    })
}

/// The pick among `rows` (with their protocols' [`simplicity`] `ranks`): of the candidates
/// that reached the target on every pair, the fastest mean `f`; the candidates tied with it
/// are those whose paired 95% interval of the difference to `f` includes zero or whose mean
/// is within [`TIE_ALWAYS`] of it; among the tied ones within [`TIE_WITHIN`] of `f`'s mean,
/// the simplest (then the faster) is picked. Returns (fastest, pick, tied, the fastest
/// included).
pub fn pick(rows: &[Measured], ranks: &[u32]) -> (Option<usize>, Option<usize>, Vec<usize>) {
    let complete: Vec<usize> = (0..rows.len()).filter(|&i| rows[i].reached == rows[i].repeats).collect();
    let Some(&best) = complete.iter().min_by(|&&a, &&b| rows[a].time.mean.total_cmp(&rows[b].time.mean)) else {
        return (None, None, Vec::new());
    };
    let values = |i: usize| -> Vec<f64> { rows[i].times_s.iter().map(|t| t.unwrap_or(f64::NAN)).collect() };
    let best_mean = rows[best].time.mean;
    let tied: Vec<usize> = complete
        .iter()
        .copied()
        .filter(|&i| {
            i == best || {
                let d = stats::paired(&values(i), &values(best));
                d.low <= 0.0 || rows[i].time.mean <= best_mean * (1.0 + TIE_ALWAYS)
            }
        })
        .collect();
    let pick = tied
        .iter()
        .copied()
        .filter(|&i| rows[i].time.mean <= best_mean * (1.0 + TIE_WITHIN))
        .min_by(|&a, &b| ranks.get(a).cmp(&ranks.get(b)).then(rows[a].time.mean.total_cmp(&rows[b].time.mean)));
    (Some(best), pick, tied)
}

/// One phase of the trace and its own sweep.
#[derive(Clone, Debug, Serialize)]
pub struct PhaseAdvice {
    /// First step.
    pub from_step: usize,
    /// First step after it.
    pub until_step: usize,
    /// Its median step.
    pub median_step_s: f64,
    /// Its mean spread `max_w t / median_w t` per step.
    pub spread: f64,
    /// The sweep on this phase alone (cycled), when the trace has several phases.
    pub sweep: Option<SweepResult>,
}

/// A short description of a trace.
#[derive(Clone, Debug, Serialize)]
pub struct TraceSummary {
    /// Workers.
    pub workers: u32,
    /// Steps per worker.
    pub steps: usize,
    /// The median step.
    pub median_step_s: f64,
    /// The 90th percentile step.
    pub p90_step_s: f64,
    /// The slowest step.
    pub max_step_s: f64,
    /// The slowest worker's mean step over the median worker's.
    pub slowest_worker_ratio: f64,
    /// Seconds BSP needs to replay the whole trace.
    pub bsp_replay_s: f64,
}

impl TraceSummary {
    /// The summary of `trace`.
    pub fn of(trace: &TraceTable) -> Self {
        let mut all: Vec<f64> = trace.times.iter().flatten().copied().collect();
        all.sort_by(f64::total_cmp);
        let p90 = all.get(((all.len() as f64 * 0.9) as usize).min(all.len().saturating_sub(1))).copied();
        let means: Vec<f64> = trace.times.iter().map(|v| v.iter().sum::<f64>() / v.len().max(1) as f64).collect();
        let slowest = means.iter().copied().fold(0.0, f64::max);
        Self {
            workers: trace.workers,
            steps: trace.steps,
            median_step_s: trace.median_step(),
            p90_step_s: p90.unwrap_or(f64::NAN),
            max_step_s: all.last().copied().unwrap_or(f64::NAN),
            slowest_worker_ratio: slowest / stats::median(&means),
            bsp_replay_s: trace.bsp_duration(),
        }
    }
}

/// Everything `advise` found.
#[derive(Clone, Debug, Serialize)]
pub struct Advice {
    /// The trace.
    pub trace: TraceSummary,
    /// The sweep over the whole trace: its pick is the recommendation.
    pub whole: SweepResult,
    /// The phases (one when the trace keeps one regime).
    pub phases: Vec<PhaseAdvice>,
    /// When the best choice differs between phases: what to do about it.
    pub switch: Option<String>,
}

/// The run and data seeds of `options`.
pub fn seeds(options: &Options) -> (Vec<u64>, Vec<u64>) {
    let r = u64::from(options.repeats.max(1));
    (
        (0..r).map(|i| options.seed.wrapping_add(i)).collect(),
        (0..r).map(|i| options.split_seed.wrapping_add(i)).collect(),
    )
}

/// Sweeps `candidates` over the whole `trace` and, when it changes regime, over each phase.
pub fn advise(
    trace: &TraceTable,
    candidates: &[Candidate],
    options: &Options,
    jobs: usize,
    done: &(dyn Fn() + Sync),
) -> Result<Advice, String> {
    let (run_seeds, split_seeds) = seeds(options);
    let setting = Setting::for_trace(trace, options)?;
    let whole = sweep(trace, candidates, &setting, &run_seeds, &split_seeds, jobs, done)?;
    let (level, spread) = trace.level_and_spread();
    let ranges = if options.phases { phases::detect(&level, &spread) } else { vec![(0, trace.steps)] };
    let mut phases = Vec::with_capacity(ranges.len());
    for &(from, until) in &ranges {
        let part = trace.slice(from, until);
        let sweep = if ranges.len() > 1 {
            let phase_options = Options { target: None, budget_s: None, ..options.clone() };
            let phase_options = if options.workload == WorkloadKind::Nqm {
                phase_options
            } else {
                Options { target: options.target, ..phase_options }
            };
            let s = Setting::for_trace(&part, &phase_options)?;
            Some(sweep(&part, candidates, &s, &run_seeds, &split_seeds, jobs, done)?)
        } else {
            None
        };
        let spread_mean = spread[from..until].iter().map(|x| x.exp()).sum::<f64>() / (until - from).max(1) as f64;
        phases.push(PhaseAdvice {
            from_step: from,
            until_step: until,
            median_step_s: part.median_step(),
            spread: spread_mean,
            sweep,
        });
    }
    let picks: Vec<&str> = phases.iter().filter_map(|p| p.sweep.as_ref()).map(|s| s.label(s.pick)).collect();
    let switch = (picks.len() > 1 && picks.windows(2).any(|w| w[0] != w[1])).then(|| {
        let steps: Vec<String> = phases
            .iter()
            .zip(&picks)
            .map(|(p, label)| format!("steps {}..{}: {label}", p.from_step, p.until_step))
            .collect();
        let dbw = whole.rows.iter().find(|r| r.protocol == "dbw");
        let dbw_note = dbw.map_or(String::new(), |r| {
            format!(
                "; DBW, which adapts b as the trace changes, takes {:.3} ± {:.3} s on the whole trace against the static pick's {:.3} s",
                r.time.mean,
                r.time.half_width(),
                whole.pick.and_then(|i| whole.rows.get(i)).map_or(f64::NAN, |p| p.time.mean)
            )
        });
        format!(
            "the best static choice changes with the regime ({}): switch at the phase boundary, or run DBW{dbw_note}",
            steps.join("; ")
        )
    });
    Ok(Advice { trace: TraceSummary::of(trace), whole, phases, switch })
}

/// A number of seconds with three significant figures' worth of decimals.
fn secs(x: f64) -> String {
    if !x.is_finite() {
        return "-".into();
    }
    let decimals = if x >= 100.0 {
        1
    } else if x >= 1.0 {
        3
    } else if x >= 0.01 {
        4
    } else {
        6
    };
    format!("{x:.decimals$}")
}

impl SweepResult {
    /// The table: one row per candidate, fastest first.
    pub fn table(&self) -> String {
        let mut order: Vec<usize> = (0..self.rows.len()).collect();
        order.sort_by(|&a, &b| {
            let (ra, rb) = (&self.rows[a], &self.rows[b]);
            (ra.reached < ra.repeats).cmp(&(rb.reached < rb.repeats)).then(ra.time.mean.total_cmp(&rb.time.mean))
        });
        let mut out = format!(
            "{:<30} {:>12} {:>10} {:>8} {:>8} {:>9} {:>10}  {}\n",
            "candidate", "time (s)", "± 95%", "reached", "vs BSP", "updates", "trace used", "note"
        );
        for i in order {
            let r = &self.rows[i];
            let mut note = Vec::new();
            if Some(i) == self.pick {
                note.push("PICK".to_string());
            }
            if Some(i) == self.fastest && self.fastest != self.pick {
                note.push("fastest mean".to_string());
            }
            if r.tied && Some(i) != self.fastest {
                note.push("tied with the fastest".to_string());
            }
            if let Some(f) = r.median_multiple {
                note.push(format!("time knob = {f}x median step"));
            }
            let time = if r.reached == r.repeats { secs(r.time.mean) } else { format!(">{}", secs(r.time.mean)) };
            out.push_str(&format!(
                "{:<30} {:>12} {:>10} {:>8} {:>8} {:>9.0} {:>9.0}%  {}\n",
                r.label,
                time,
                secs(r.time.half_width()),
                format!("{}/{}", r.reached, r.repeats),
                r.speedup_vs_bsp.map_or("-".into(), |s| format!("{s:.2}x")),
                r.updates,
                r.trace_used * 100.0,
                note.join(", ")
            ));
        }
        out
    }
}

impl Advice {
    /// The report for people: the trace, how the runs were set up, the table, the pick with
    /// its ties, and the phases.
    pub fn report(&self, name: &str) -> String {
        let t = &self.trace;
        let s = &self.whole.setting;
        let mut out = format!(
            "trace {name}: {} workers x {} steps, median step {} s, p90 {} s, slowest step {} s, slowest worker {:.2}x the median worker; BSP replays it in {} s\n",
            t.workers,
            t.steps,
            secs(t.median_step_s),
            secs(t.p90_step_s),
            secs(t.max_step_s),
            t.slowest_worker_ratio,
            secs(t.bsp_replay_s)
        );
        out.push_str(&format!(
            "runs: {} ({}, batch {}, lr {:.4}), target {}; budget {} s; network {} ms latency; run seeds {:?}, data seeds {:?}\n",
            match s.workload {
                WorkloadKind::Nqm => "nqm",
                WorkloadKind::Digits => "digits",
                WorkloadKind::Mnist5k => "mnist5k",
            },
            s.model,
            s.batch_size,
            s.learning_rate,
            s.target_note,
            secs(s.budget_s),
            s.latency_s * 1000.0,
            self.whole.run_seeds,
            self.whole.split_seeds
        ));
        out.push_str(&self.whole.table());
        out.push_str("time: mean time to target over the seed pairs with its 95% interval (t); misses count as the budget (\">\")\n");
        match self.whole.pick.and_then(|i| self.whole.rows.get(i)) {
            Some(p) => {
                out.push_str(&format!(
                    "recommendation: {} ({} ± {} s{})\n",
                    p.label,
                    secs(p.time.mean),
                    secs(p.time.half_width()),
                    p.speedup_vs_bsp.map_or(String::new(), |x| format!(", {x:.2}x BSP"))
                ));
                let tied: Vec<&str> = self
                    .whole
                    .rows
                    .iter()
                    .enumerate()
                    .filter(|(i, r)| r.tied && Some(*i) != self.whole.pick)
                    .map(|(_, r)| r.label.as_str())
                    .collect();
                let largest = self.whole.rows.iter().filter(|r| r.protocol == p.protocol).filter_map(|r| r.count_knob).max();
                if let (Some(k), Some(largest)) = (p.count_knob, largest) {
                    if k == largest && self.whole.rows.iter().filter(|r| r.protocol == p.protocol).count() > 1 {
                        out.push_str(&format!(
                            "  note: its knob is the largest of its sweep ({}); a scenario file with larger values may find a faster setting\n",
                            p.label
                        ));
                    }
                }
                if tied.is_empty() {
                    out.push_str("  the next candidates are measurably slower (paired 95% intervals exclude a tie)\n");
                } else {
                    out.push_str(&format!(
                        "  cannot be told apart from it on these seeds: {} (the pick is the simplest of the tied within {:.0}% of the fastest)\n",
                        tied.join(", "),
                        TIE_WITHIN * 100.0
                    ));
                }
            }
            None => out.push_str("recommendation: none: no candidate reached the target on every seed; raise --budget or lower --target\n"),
        }
        if self.phases.len() > 1 {
            out.push_str(&format!("phases: the step times change regime {} time(s)\n", self.phases.len() - 1));
            for p in &self.phases {
                let pick = p.sweep.as_ref().map_or("-".to_string(), |s| {
                    s.pick.and_then(|i| s.rows.get(i)).map_or("none".into(), |r| {
                        format!(
                            "{} ({} ± {} s on the phase alone)",
                            r.label,
                            secs(r.time.mean),
                            secs(r.time.half_width())
                        )
                    })
                });
                out.push_str(&format!(
                    "  steps {}..{}: median step {} s, spread {:.2}x: {pick}\n",
                    p.from_step,
                    p.until_step,
                    secs(p.median_step_s),
                    p.spread
                ));
            }
            match &self.switch {
                Some(s) => out.push_str(&format!("  {s}\n")),
                None => out.push_str("  every phase has the same pick: no switch needed\n"),
            }
        } else {
            out.push_str("phases: one regime (no change point in the step-time distribution)\n");
        }
        out
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

    #[test]
    fn knobs_scale_with_the_trace_and_fit_the_worker_count() {
        for n in [1, 2, 5, 16, 64] {
            let c = candidates(n, 0.05);
            assert!(c.iter().all(|c| c.spec.config(n, 0.5).is_ok()));
            assert!(c.iter().any(|c| c.spec.name == ProtocolKind::Bsp));
        }
        let c = candidates(16, 0.05);
        let bap: Vec<f64> = c.iter().filter_map(|c| c.spec.iteration_timeout_ms).collect();
        assert!(bap.contains(&75.0) && bap.contains(&150.0), "{bap:?}");
        let b: Vec<u32> = c.iter().filter_map(|c| c.spec.backup_workers).collect();
        assert_eq!(b, [1, 2, 4, 8]);
        let g: Vec<u32> = c.iter().filter_map(|c| c.spec.groups).collect();
        assert_eq!(g, [2, 4]);
        assert_eq!(round_ms(0.0123456), 0.0123);
    }

    fn row(times: &[f64]) -> Measured {
        Measured {
            label: String::new(),
            protocol: String::new(),
            median_multiple: None,
            count_knob: None,
            times_s: times.iter().map(|&t| Some(t)).collect(),
            reached: times.len() as u32,
            repeats: times.len() as u32,
            time: stats::interval(times),
            ladder_s: Vec::new(),
            speedup_vs_bsp: None,
            updates: 0.0,
            trace_used: 0.0,
            tied: false,
        }
    }

    #[test]
    fn the_pick_is_the_simplest_of_the_tied_and_never_a_measurably_slower_one() {
        // Row 1 is fastest; row 0 (simpler) is tied and within 5%: picked.
        let rows = [row(&[1.02, 1.05, 0.99]), row(&[1.0, 1.01, 1.0]), row(&[1.5, 1.5, 1.5])];
        let (fastest, picked, tied) = pick(&rows, &[0, 1, 2]);
        assert_eq!((fastest, picked), (Some(1), Some(0)));
        assert_eq!(tied, [0, 1]);
        // Consistently 4% slower on every pair: not tied, the fastest is picked.
        let rows = [row(&[1.04, 1.144, 1.248]), row(&[1.0, 1.1, 1.2])];
        assert_eq!(pick(&rows, &[0, 1]), (Some(1), Some(1), vec![1]));
        // A candidate that missed on one pair is never picked.
        let mut missed = row(&[0.5, 0.5, 0.5]);
        missed.reached = 2;
        let rows = [missed, row(&[1.0, 1.0, 1.0])];
        assert_eq!(pick(&rows, &[0, 1]).1, Some(1));
    }

    #[test]
    fn a_table_needs_every_worker_and_step() {
        let steps = tracegen::generate(tracegen::Kind::Uniform, 3, 10, 0.01, 1);
        let t = TraceTable::from_steps(&steps).unwrap();
        assert_eq!((t.workers, t.steps), (3, 10));
        assert!(TraceTable::from_steps(&steps[1..]).is_err());
        assert_eq!(t.slice(2, 5).steps, 3);
    }
}
