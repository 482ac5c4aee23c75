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
//! target_accuracy = 0.90        # "time to target" is the first evaluation at or above it
//! step_ms = 10.0                # virtual time of one gradient on an unhindered worker
//! max_time_s = 20.0             # virtual time budget of each run
//! eval_interval_ms = 50.0       # virtual time between evaluations
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
//! `round_deadline_ms` (wbsp), `stall_report_ms`. Every knob but `interrupt` and
//! `group_lr_scaling` may be a sweep. Unknown keys and bad values are refused with the
//! file, the position and the reason.

mod sweep;

pub use sweep::Sweep;
pub use syncopate_transport::protocol_spec::{GroupLrScaling, InterruptMode, ProtocolName, ProtocolSpec};

use crate::sim::{ComputeModel, NetworkConfig, SimConfig, StopRule};
use crate::workload::ModelKind;
use serde::Deserialize;
use std::path::Path;
use syncopate::Duration;

/// The built-in scenario `syncopate compare` runs without a file.
pub const DEFAULT_SCENARIO: &str = include_str!("../../scenarios/default.toml");

/// The presets: the papers' settings scaled to the digits workload (PROTOCOLS.md §8).
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
    name: ProtocolName,
    lr: Option<Sweep<f64>>,
    staleness: Option<Sweep<u64>>,
    iteration_timeout_ms: Option<Sweep<f64>>,
    backup_workers: Option<Sweep<u32>>,
    #[serde(default)]
    interrupt: InterruptMode,
    k_min: Option<Sweep<u32>>,
    groups: Option<Sweep<u32>>,
    #[serde(default)]
    group_lr_scaling: GroupLrScaling,
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
    #[serde(default = "step")]
    step_ms: f64,
    #[serde(default = "budget")]
    max_time_s: f64,
    #[serde(default = "eval")]
    eval_interval_ms: f64,
    #[serde(default)]
    stop_at_target: bool,
    network: Option<NetworkFile>,
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

impl Scenario {
    /// Parses and validates scenario text; `source` names it in errors (a file name).
    pub fn parse(text: &str, source: &str) -> Result<Self, String> {
        let file: ScenarioFile = toml::from_str(text)
            .map_err(|e| format!("{source}:{}{}", position(text, e.span()), e.message().replace('\n', " ").trim()))?;
        Self::validate(file).map_err(|e| format!("{source}: {e}"))
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
        if file.batch_size == 0 {
            return Err("batch_size: must be at least 1".into());
        }
        if !(0.0..=1.0).contains(&file.target_accuracy) {
            return Err(format!("target_accuracy: {} is outside 0..1", file.target_accuracy));
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
        for (i, r) in runs.iter().enumerate() {
            r.spec
                .config(file.workers, learning_rate)
                .map_err(|e| format!("protocols ({}, run {i}): {e}", r.label()))?;
        }
        Ok(Self {
            name: file.name.unwrap_or_else(|| "scenario".into()),
            seed: file.seed,
            seeds: file.seeds,
            workers: file.workers,
            model,
            batch_size: file.batch_size as usize,
            learning_rate,
            target_accuracy: file.target_accuracy,
            base_step: Duration::from_secs_f64(positive("step_ms", file.step_ms)? / 1000.0),
            max_time: Duration::from_secs_f64(positive("max_time_s", file.max_time_s)?),
            eval_interval: Duration::from_secs_f64(positive("eval_interval_ms", file.eval_interval_ms)? / 1000.0),
            stop_at_target: file.stop_at_target,
            network,
            compute,
            runs,
        })
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
        c.stop = StopRule { max_time: Some(self.max_time), stop_at_target: self.stop_at_target, ..StopRule::default() };
        c.eval_interval = self.eval_interval;
        c.target_accuracy = self.target_accuracy;
        c.record_trace = false;
        Ok(c)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn built_in_scenarios_parse() {
        let d = Scenario::default_scenario();
        assert!(d.runs.len() >= 9);
        for (name, _) in PRESETS {
            let s = Scenario::preset(name).unwrap().unwrap();
            assert!(!s.runs.is_empty(), "{name}");
        }
        assert!(Scenario::preset("nope").is_none());
    }

    #[test]
    fn sweeps_expand() {
        let s = Scenario::parse(
            "workers = 4\n[[protocols]]\nname = \"ssp\"\nstaleness = [0, 3]\n[[protocols]]\nname = \"backup\"\nbackup_workers = \"0..=2\"\n",
            "t.toml",
        )
        .unwrap();
        let labels: Vec<String> = s.runs.iter().map(Run::label).collect();
        assert_eq!(labels, ["ssp s=0", "ssp s=3", "backup b=0", "backup b=1", "backup b=2"]);
    }

    #[test]
    fn bad_files_name_file_position_and_reason() {
        for (text, needle) in [
            ("workers = 4\nbogus = 1\n[[protocols]]\nname = \"bsp\"\n", "t.toml:2:1: unknown field `bogus`"),
            ("workers = 4\n[[protocols]]\nname = \"nope\"\n", "unknown variant `nope`"),
            ("workers = 0\n[[protocols]]\nname = \"bsp\"\n", "t.toml: workers: 0 is outside"),
            ("workers = 4\n", "missing field `protocols`"),
            ("workers = 4\nprotocols = []\n", "at least one"),
            ("workers = 4\nstep_ms = -1\n[[protocols]]\nname = \"bsp\"\n", "step_ms: -1 must be a positive number"),
            (
                "workers = 4\n[[stragglers]]\nworkers = \"9\"\nmodel = \"slow=2\"\n[[protocols]]\nname = \"bsp\"\n",
                "outside 0..4",
            ),
            ("workers = 4\n[[protocols]]\nname = \"backup\"\nbackup_workers = 4\n", "fewer than the 4 workers"),
            ("workers = 4\nmodel = \"cnn\"\n[[protocols]]\nname = \"bsp\"\n", "model:"),
            ("workers = 4\n[[protocols]]\nname = \"bsp\"\nstaleness = \"x\"\n", "t.toml:4:"),
        ] {
            let e = Scenario::parse(text, "t.toml").unwrap_err();
            assert!(e.contains(needle), "{text:?}: {e}");
            assert!(e.starts_with("t.toml"), "{e}");
            assert!(!e.contains('\n'), "{e}");
        }
    }
}
