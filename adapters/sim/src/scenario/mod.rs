//! Scenario files: one straggler scenario and the protocols to compare on it, in TOML.
//!
//! ```toml
//! name = "one straggler"        # shown in reports
//! seed = 1                      # everything random derives from it
//! seeds = 5                     # repeat every run with seeds seed..seed+5; report medians
//! workers = 8
//! model = "softmax"             # softmax | mlp | mlp:H
//! batch_size = 32
//! learning_rate = 0.5           # of one averaged synchronous step (see ProtocolSpec::config)
//! target_accuracy = 0.90        # "time to target": when the first model at or above it was published
//! accuracy_ladder = [0.85, 0.9] # optional: more targets; with DBW and static backup runs, a
//!                               # table of DBW against the best static b at each of them
//! step_ms = 10.0                # virtual time of one gradient on an unhindered worker (0.01..=60000)
//! max_time_s = 20.0             # virtual time budget of each run (at most 3600)
//! eval_interval_ms = 50.0       # virtual time between points of the accuracy curve
//! stop_at_target = false        # end each run when it reaches the target
//!
//! [network]                     # every server-worker link
//! latency_ms = 0.5
//! bandwidth_mb_s = 1000.0       # megabytes per second
//!
//! [[stragglers]]                # WHO and MODEL as in `train --straggler`
//! workers = "all"
//! model = "exp=1/1"
//! [[stragglers]]                # later entries override earlier ones
//! workers = "0"
//! model = "slow=4"
//!
//! [[protocols]]
//! name = "bsp"
//! [[protocols]]
//! name = "ssp"
//! staleness = [1, 3, 8]         # a sweep: one run per value
//! [[protocols]]
//! name = "backup"
//! backup_workers = "0..=3"      # ranges: "a..b" excludes b, "a..=b" includes it
//! ```
//!
//! Protocol knobs: `lr`, `staleness` (ssp, bap), `iteration_timeout_ms` (bap),
//! `backup_workers`, `interrupt = "abort" | "complete"` (backup, dbw), `k_min` (dbw),
//! `groups`, `group_lr_scaling = "linear" | "none" | "sqrt"` (grouped),
//! `round_deadline_ms` (wbsp), `stall_report_ms` (every protocol but asp and wbsp). A knob
//! its protocol does not use is refused. Every knob but `interrupt` and `group_lr_scaling`
//! may be a sweep. Unknown keys and bad values are refused with the file, the line and the
//! reason. A run that would need more than [`EVENT_BUDGET`] simulator events is refused.

pub mod reproduction;
mod sweep;

pub use sweep::Sweep;
pub use syncopate_transport::protocol_spec::{GroupLrScaling, InterruptMode, ProtocolKind, ProtocolSpec};

use crate::sim::{ComputeModel, NetworkConfig, SimConfig, StopRule};
use crate::workload::ModelKind;
use serde::Deserialize;
use std::path::Path;
use syncopate::Duration;

/// The built-in scenario `syncopate compare` runs without a file.
pub const DEFAULT_SCENARIO: &str = include_str!("../../scenarios/default.toml");

/// The presets: the papers' settings scaled to the digits workload (docs/PROTOCOLS.md,
/// "Straggler models").
pub const PRESETS: [(&str, &str); 4] = [
    ("dbw", include_str!("../../scenarios/dbw.toml")),
    ("wbsp", include_str!("../../scenarios/wbsp.toml")),
    ("bap", include_str!("../../scenarios/bap.toml")),
    ("grouped", include_str!("../../scenarios/grouped.toml")),
];

#[derive(Clone, Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct NetworkFile {
    #[serde(default = "default_latency")]
    latency_ms: f64,
    #[serde(default = "default_bandwidth")]
    bandwidth_mb_s: f64,
}

fn default_latency() -> f64 {
    0.5
}
fn default_bandwidth() -> f64 {
    1000.0
}

#[derive(Clone, Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct StragglerFile {
    workers: String,
    model: String,
}

#[derive(Clone, Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct ProtocolFile {
    name: ProtocolKind,
    lr: Option<Sweep<f64>>,
    staleness: Option<Sweep<u64>>,
    iteration_timeout_ms: Option<Sweep<f64>>,
    backup_workers: Option<Sweep<u32>>,
    interrupt: Option<InterruptMode>,
    k_min: Option<Sweep<u32>>,
    groups: Option<Sweep<u32>>,
    group_lr_scaling: Option<GroupLrScaling>,
    round_deadline_ms: Option<Sweep<f64>>,
    stall_report_ms: Option<f64>,
    /// Replaces the scenario's stragglers for this entry (a `--straggler` spec; "" for none).
    stragglers: Option<String>,
}

#[derive(Clone, Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct ScenarioFile {
    name: Option<String>,
    #[serde(default = "one")]
    seed: u64,
    #[serde(default = "one_u32")]
    seeds: u32,
    workers: u32,
    #[serde(default = "softmax")]
    model: String,
    #[serde(default = "batch")]
    batch_size: u32,
    #[serde(default = "lr")]
    learning_rate: f64,
    #[serde(default = "target")]
    target_accuracy: f64,
    #[serde(default)]
    accuracy_ladder: Vec<f64>,
    #[serde(default = "step")]
    step_ms: f64,
    #[serde(default = "budget")]
    max_time_s: f64,
    #[serde(default = "eval")]
    eval_interval_ms: f64,
    #[serde(default)]
    stop_at_target: bool,
    network: Option<NetworkFile>,
    #[serde(default = "one_u32")]
    shards: u32,
    #[serde(default)]
    colocate_shards: bool,
    #[serde(default)]
    momentum: f64,
    #[serde(default)]
    stragglers: Vec<StragglerFile>,
    protocols: Vec<ProtocolFile>,
}

fn one() -> u64 {
    1
}
fn one_u32() -> u32 {
    1
}
fn softmax() -> String {
    "softmax".into()
}
fn batch() -> u32 {
    32
}
fn lr() -> f64 {
    0.5
}
fn target() -> f64 {
    0.9
}
fn step() -> f64 {
    10.0
}
fn budget() -> f64 {
    20.0
}
fn eval() -> f64 {
    50.0
}

/// A parsed, validated scenario.
#[derive(Clone, Debug, PartialEq)]
pub struct Scenario {
    /// Its name.
    pub name: String,
    /// The first run seed.
    pub seed: u64,
    /// Every run is repeated with seeds `seed..seed + seeds`; tables report medians.
    pub seeds: u32,
    /// Number of workers.
    pub workers: u32,
    /// The model.
    pub model: ModelKind,
    /// Minibatch size.
    pub batch_size: usize,
    /// Learning rate of one averaged synchronous step.
    pub learning_rate: f64,
    /// Target test accuracy.
    pub target_accuracy: f64,
    /// More accuracy targets (ascending; may be empty): `compare` reports DBW against the
    /// best static `b` at each.
    pub accuracy_ladder: Vec<f64>,
    /// Base step time.
    pub base_step: Duration,
    /// Virtual time budget per run.
    pub max_time: Duration,
    /// Time between evaluations.
    pub eval_interval: Duration,
    /// End each run at the target.
    pub stop_at_target: bool,
    /// The network.
    pub network: NetworkConfig,
    /// Server shards the model is split over (1: one server; see [`SimConfig::shards`]).
    pub shards: u32,
    /// Shard `k` runs on worker `k`'s machine ([`SimConfig::colocate_shards`]).
    pub colocate_shards: bool,
    /// SGD momentum on every update of the server's model ([`SimConfig::momentum`]).
    pub momentum: f64,
    /// One compute model per worker.
    pub compute: Vec<ComputeModel>,
    /// The protocol runs, sweeps expanded, in file order.
    pub runs: Vec<Run>,
}

/// One run of a scenario: a protocol with its knobs, and the stragglers it runs with.
#[derive(Clone, Debug, PartialEq)]
pub struct Run {
    /// The protocol and knobs.
    pub spec: ProtocolSpec,
    /// The entry's own stragglers, replacing the scenario's (`None`: the scenario's).
    pub compute: Option<Vec<ComputeModel>>,
    /// The entry's straggler spec as written, for the label.
    pub stragglers_note: Option<String>,
}

impl Run {
    /// The label in tables and plots: the protocol's label, plus the stragglers if the
    /// entry has its own.
    pub fn label(&self) -> String {
        match &self.stragglers_note {
            None => self.spec.label(),
            Some(s) if s.trim().is_empty() => format!("{} (no stragglers)", self.spec.label()),
            Some(s) => format!("{} (stragglers {s})", self.spec.label()),
        }
    }
}

fn positive(key: &str, v: f64) -> Result<f64, String> {
    if v.is_finite() && v > 0.0 { Ok(v) } else { Err(format!("{key}: {v} must be a positive number")) }
}

fn within(key: &str, v: f64, lo: f64, hi: f64) -> Result<f64, String> {
    if v.is_finite() && (lo..=hi).contains(&v) { Ok(v) } else { Err(format!("{key}: {v} is outside {lo}..={hi}")) }
}

/// The most simulator events one run may process: a run that would need more is refused
/// before it starts, and a run that reaches it anyway stops there (`stop_reason`
/// `max_events`) instead of running without bound.
pub const EVENT_BUDGET: u64 = 20_000_000;
/// Simulator events per gradient, an upper estimate (computation done, gradient delivered,
/// model or reply delivered, timers) used to check [`EVENT_BUDGET`] before a run.
const EVENTS_PER_GRADIENT: f64 = 6.0;
/// The longest virtual time budget of a run (`max_time_s`), one virtual hour.
pub const MAX_TIME_S: f64 = 3600.0;
/// The most evaluations of a run (`max_time_s / eval_interval_ms`).
pub const MAX_EVALUATIONS: f64 = 100_000.0;
/// The most server shards of a run (`shards`, `--shards`).
pub const MAX_SHARDS: u32 = 1024;
/// The step time range in milliseconds (`step_ms`, `--step-ms`): 10 µs to one minute.
pub const STEP_MS_RANGE: (f64, f64) = (0.01, 60_000.0);

fn expand<T: Clone>(values: &Option<Sweep<T>>) -> Vec<Option<T>> {
    match values {
        None => vec![None],
        Some(Sweep(v)) => v.iter().cloned().map(Some).collect(),
    }
}

impl ProtocolFile {
    fn specs(&self) -> Vec<ProtocolSpec> {
        let mut out = Vec::new();
        for lr in expand(&self.lr) {
            for staleness in expand(&self.staleness) {
                for iteration_timeout_ms in expand(&self.iteration_timeout_ms) {
                    for backup_workers in expand(&self.backup_workers) {
                        for k_min in expand(&self.k_min) {
                            for groups in expand(&self.groups) {
                                for round_deadline_ms in expand(&self.round_deadline_ms) {
                                    out.push(ProtocolSpec {
                                        name: self.name,
                                        lr,
                                        staleness,
                                        iteration_timeout_ms,
                                        backup_workers,
                                        interrupt: self.interrupt,
                                        k_min,
                                        groups,
                                        group_lr_scaling: self.group_lr_scaling,
                                        round_deadline_ms,
                                        stall_report_ms: self.stall_report_ms,
                                    });
                                }
                            }
                        }
                    }
                }
            }
        }
        out
    }
}

/// Where a TOML error points, as `line:column`.
fn position(text: &str, span: Option<std::ops::Range<usize>>) -> String {
    let Some(span) = span else { return String::new() };
    let before = text.get(..span.start).unwrap_or("");
    let line = before.matches('\n').count() + 1;
    let column = before.len() - before.rfind('\n').map_or(0, |i| i + 1) + 1;
    format!("{line}:{column}: ")
}

/// The line (1-based) where a validation error's key is written: `workers`, `network.latency_ms`,
/// `stragglers[1]` or `protocols[2].staleness` (`None` when the key is not in the text, i.e.
/// took its default).
fn line_of_key(text: &str, key: &str) -> Option<usize> {
    let lines: Vec<&str> = text.lines().map(str::trim).collect();
    let is_key = |line: &str, k: &str| line.strip_prefix(k).is_some_and(|rest| rest.trim_start().starts_with('='));
    let (head, field) = key.split_once('.').map_or((key, None), |(h, f)| (h, Some(f)));
    let (table, index) = match head.split_once('[') {
        Some((t, i)) => (t, i.trim_end_matches(']').parse::<usize>().ok()),
        None => (head, None),
    };
    let header = |line: &str| line.starts_with('[');
    let section_start = if let Some(i) = index {
        let array = format!("[[{table}]]");
        lines.iter().enumerate().filter(|(_, l)| **l == array).nth(i).map(|(n, _)| n)?
    } else if field.is_some() {
        let plain = format!("[{table}]");
        lines.iter().position(|l| *l == plain)?
    } else {
        // A top-level key (before the first table), or an array of tables by its name.
        let array = format!("[[{table}]]");
        return lines
            .iter()
            .take_while(|l| !header(l))
            .position(|l| is_key(l, table))
            .or_else(|| lines.iter().position(|l| *l == array))
            .map(|n| n + 1);
    };
    let Some(field) = field else { return Some(section_start + 1) };
    let end =
        lines.iter().skip(section_start + 1).position(|l| header(l)).map_or(lines.len(), |n| n + section_start + 1);
    let within = lines.get(section_start + 1..end)?;
    Some(within.iter().position(|l| is_key(l, field)).map_or(section_start, |n| n + section_start + 1) + 1)
}

impl Scenario {
    /// Parses and validates scenario text; `source` names it in errors (a file name).
    pub fn parse(text: &str, source: &str) -> Result<Self, String> {
        let file: ScenarioFile = toml::from_str(text).map_err(|e| {
            let mut message = e.message().replace('\n', " ").trim().to_owned();
            // The parser's "duplicate key" names no key: the span covers it.
            if message == "duplicate key" {
                if let Some(key) = e.span().and_then(|s| text.get(s)).map(str::trim).filter(|k| !k.is_empty()) {
                    message = format!("duplicate key '{key}' (each key once per table)");
                }
            }
            format!("{source}:{}{message}", position(text, e.span()))
        })?;
        Self::validate(file).map_err(|e| match line_of_key(text, e.split(':').next().unwrap_or("")) {
            Some(line) => format!("{source}:{line}: {e}"),
            None => format!("{source}: {e}"),
        })
    }

    /// Reads and parses a scenario file.
    pub fn load(path: &Path) -> Result<Self, String> {
        let text = std::fs::read_to_string(path).map_err(|e| format!("{}: cannot read: {e}", path.display()))?;
        Self::parse(&text, &path.display().to_string())
    }

    /// The built-in default scenario.
    pub fn default_scenario() -> Self {
        // The embedded file is checked by a test; a failure here is a build defect.
        Self::parse(DEFAULT_SCENARIO, "scenarios/default.toml").unwrap_or_else(|e| panic!("built-in scenario: {e}"))
    }

    /// A preset by name, if it exists.
    pub fn preset(name: &str) -> Option<Result<Self, String>> {
        PRESETS.iter().find(|(n, _)| *n == name).map(|(n, text)| Self::parse(text, &format!("scenarios/{n}.toml")))
    }

    fn validate(file: ScenarioFile) -> Result<Self, String> {
        if file.workers == 0 || file.workers as usize > syncopate::MAX_WORKERS {
            return Err(format!("workers: {} is outside 1..={}", file.workers, syncopate::MAX_WORKERS));
        }
        let model: ModelKind = file.model.parse().map_err(|e| format!("model: {e}"))?;
        if file.seeds == 0 || file.seeds > 100 {
            return Err(format!("seeds: {} is outside 1..=100", file.seeds));
        }
        crate::workload::limits::check_hidden(model).map_err(|e| format!("model: {e}"))?;
        if file.batch_size == 0 || file.batch_size > crate::workload::limits::MAX_BATCH_SIZE {
            return Err(format!(
                "batch_size: {} is outside 1..={}",
                file.batch_size,
                crate::workload::limits::MAX_BATCH_SIZE
            ));
        }
        let (lo, hi) = STEP_MS_RANGE;
        let step_ms = within("step_ms", file.step_ms, lo, hi)?;
        let max_time_s = within("max_time_s", file.max_time_s, 1e-3, MAX_TIME_S)?;
        let eval_ms = positive("eval_interval_ms", file.eval_interval_ms)?;
        let evaluations = max_time_s * 1000.0 / eval_ms;
        if evaluations > MAX_EVALUATIONS {
            return Err(format!(
                "eval_interval_ms: {eval_ms} gives {evaluations:.0} evaluations in max_time_s = {max_time_s}; at most {MAX_EVALUATIONS} (eval_interval_ms >= {})",
                max_time_s * 1000.0 / MAX_EVALUATIONS
            ));
        }
        if !(0.0..=1.0).contains(&file.target_accuracy) {
            return Err(format!("target_accuracy: {} is outside 0..1", file.target_accuracy));
        }
        if file.accuracy_ladder.len() > 16 {
            return Err(format!("accuracy_ladder: {} targets; at most 16", file.accuracy_ladder.len()));
        }
        if let Some(bad) = file.accuracy_ladder.iter().find(|a| !(0.0..=1.0).contains(*a)) {
            return Err(format!("accuracy_ladder: {bad} is outside 0..1"));
        }
        if file.accuracy_ladder.windows(2).any(|w| w[0] >= w[1]) {
            return Err("accuracy_ladder: the targets must be in ascending order".into());
        }
        let network = match &file.network {
            None => NetworkConfig::default(),
            Some(n) => NetworkConfig {
                latency: Duration::from_secs_f64(
                    if n.latency_ms.is_finite() && n.latency_ms >= 0.0 {
                        n.latency_ms
                    } else {
                        return Err(format!("network.latency_ms: {} must be a non-negative number", n.latency_ms));
                    } / 1000.0,
                ),
                bandwidth: positive("network.bandwidth_mb_s", n.bandwidth_mb_s)? * 1e6,
            },
        };
        if file.shards == 0 || file.shards > MAX_SHARDS {
            return Err(format!("shards: {} is outside 1..={MAX_SHARDS}", file.shards));
        }
        if !(file.momentum.is_finite() && (0.0..1.0).contains(&file.momentum)) {
            return Err(format!("momentum: {} is outside [0, 1)", file.momentum));
        }
        if file.colocate_shards && file.shards > file.workers {
            return Err(format!(
                "colocate_shards: {} shards cannot run on {} workers' machines",
                file.shards, file.workers
            ));
        }
        let mut spec = String::new();
        for (i, s) in file.stragglers.iter().enumerate() {
            if s.workers.contains([',', ':']) || s.model.contains([',', ':']) {
                return Err(format!("stragglers[{i}]: use one WHO and one MODEL per entry"));
            }
            spec.push_str(&format!("{}:{},", s.workers, s.model));
        }
        let compute = crate::straggler::parse_stragglers(&spec, file.workers)
            .map_err(|e| format!("stragglers: {}", e.split_once(": ").map_or(e.as_str(), |(_, r)| r)))?;
        if file.protocols.is_empty() {
            return Err("protocols: list at least one [[protocols]] entry".into());
        }
        let mut runs = Vec::new();
        for (i, p) in file.protocols.iter().enumerate() {
            let compute = match &p.stragglers {
                None => None,
                Some(spec) => Some(crate::straggler::parse_stragglers(spec, file.workers).map_err(|e| {
                    format!("protocols[{i}].stragglers: {}", e.split_once(": ").map_or(e.as_str(), |(_, r)| r))
                })?),
            };
            runs.extend(p.specs().into_iter().map(|spec| Run {
                spec,
                compute: compute.clone(),
                stragglers_note: p.stragglers.clone(),
            }));
        }
        if runs.len() > 512 {
            return Err(format!("protocols: the sweeps expand to {} runs; at most 512", runs.len()));
        }
        let learning_rate = positive("learning_rate", file.learning_rate)?;
        for (i, p) in file.protocols.iter().enumerate() {
            for spec in p.specs() {
                if let Some(knob) = spec.knob_that_does_not_apply() {
                    return Err(format!(
                        "protocols[{i}].{}: does not apply to {}; it is a knob of {}",
                        knob.key,
                        p.name.as_str(),
                        knob.applies_to
                    ));
                }
                spec.config(file.workers, learning_rate)
                    .map_err(|e| format!("protocols[{i}] ({}): {e}", spec.label()))?;
            }
        }
        let scenario = Self {
            name: file.name.unwrap_or_else(|| "scenario".into()),
            seed: file.seed,
            seeds: file.seeds,
            workers: file.workers,
            model,
            batch_size: file.batch_size as usize,
            learning_rate,
            target_accuracy: file.target_accuracy,
            accuracy_ladder: file.accuracy_ladder,
            base_step: Duration::from_secs_f64(step_ms / 1000.0),
            max_time: Duration::from_secs_f64(max_time_s),
            eval_interval: Duration::from_secs_f64(eval_ms / 1000.0),
            stop_at_target: file.stop_at_target,
            network,
            shards: file.shards,
            colocate_shards: file.colocate_shards,
            momentum: file.momentum,
            compute,
            runs,
        };
        scenario.check_event_budget()?;
        Ok(scenario)
    }

    /// Refuses a scenario whose runs would need more than [`EVENT_BUDGET`] events: workers
    /// at their mean step time for `max_time_s` (call again after replacing the stragglers,
    /// e.g. with a replayed trace).
    pub fn check_event_budget(&self) -> Result<(), String> {
        let base = self.base_step.as_secs_f64();
        let max_time = self.max_time.as_secs_f64();
        let evaluations = max_time / self.eval_interval.as_secs_f64().max(1e-9);
        for run in &self.runs {
            let compute = run.compute.as_ref().unwrap_or(&self.compute);
            let mut gradients = 0.0;
            for w in 0..self.workers as usize {
                let model = compute.get(w).cloned().unwrap_or(ComputeModel::None);
                let mean = model.mean_seconds(base).unwrap_or(base).max(crate::trace::MIN_STEP_SECONDS);
                gradients += max_time / mean;
            }
            let events = gradients * EVENTS_PER_GRADIENT + evaluations;
            if events > EVENT_BUDGET as f64 {
                return Err(format!(
                    "max_time_s: {max_time} s of {} would take about {events:.1e} simulator events; at most {EVENT_BUDGET:.0e} per run (lower max_time_s to {:.3} or use slower steps)",
                    run.label(),
                    max_time * EVENT_BUDGET as f64 / events
                ));
            }
        }
        Ok(())
    }

    /// The built-in default scenario's protocols for `workers` workers with no stragglers
    /// (for `advise`, which replays a trace's own): runs that need more workers are left out.
    pub fn default_for_workers(workers: u32) -> Result<Self, String> {
        let mut s = Self::default_scenario();
        if workers == 0 || workers as usize > syncopate::MAX_WORKERS {
            return Err(format!("{workers} workers is outside 1..={}", syncopate::MAX_WORKERS));
        }
        s.workers = workers;
        s.compute = vec![ComputeModel::None; workers as usize];
        let lr = s.learning_rate;
        s.runs.retain(|r| r.spec.config(workers, lr).is_ok());
        Ok(s)
    }

    /// The simulator configuration of one run with the `repeat`-th seed (validated in
    /// [`Self::parse`]).
    pub fn sim_config(&self, run: &Run, repeat: u32) -> Result<SimConfig, String> {
        let protocol = run.spec.config(self.workers, self.learning_rate)?;
        let mut c = SimConfig::new(protocol, self.model);
        c.seed = self.seed.wrapping_add(u64::from(repeat));
        c.batch_size = self.batch_size;
        c.base_step = self.base_step;
        c.compute = run.compute.clone().unwrap_or_else(|| self.compute.clone());
        c.network = self.network.clone();
        c.shards = self.shards;
        c.colocate_shards = self.colocate_shards;
        c.momentum = self.momentum;
        c.stop = StopRule { max_time: Some(self.max_time), stop_at_target: self.stop_at_target, ..StopRule::default() };
        c.eval_interval = self.eval_interval;
        c.target_accuracy = self.target_accuracy;
        c.record_trace = false;
        c.stop.max_events = EVENT_BUDGET;
        Ok(c)
    }
}

#[cfg(test)]
mod tests;
