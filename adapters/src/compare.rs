//! Every protocol of a [`Scenario`] on the same seeded simulation, side by side: the engine
//! behind `syncopate compare` and `syncopate advise`.

use crate::scenario::{ProtocolName, Scenario};
use crate::sim::{self, SimReport};
use crate::workload::Workload;
use serde::Serialize;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Mutex;

/// One line of the comparison table.
#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct Row {
    /// The run's label (protocol and knobs).
    pub label: String,
    /// The protocol's name.
    pub protocol: String,
    /// Virtual seconds to the target accuracy (`None`: not reached within the budget).
    pub time_to_target_s: Option<f64>,
    /// The baseline's time to target divided by this run's.
    pub speedup_vs_bsp: Option<f64>,
    /// Test accuracy at the end of the budget.
    pub final_accuracy: f64,
    /// Model updates.
    pub updates: u64,
    /// Contributions applied.
    pub applied: u64,
    /// Contributions dropped by the protocol.
    pub dropped: u64,
    /// Mean staleness of applied contributions.
    pub mean_staleness: f64,
    /// Mean over workers of computing time / wall time.
    pub compute_share: f64,
    /// Virtual seconds simulated.
    pub virtual_time_s: f64,
}

/// The outcome of a comparison.
#[derive(Clone, Debug)]
pub struct Comparison {
    /// The scenario's name.
    pub scenario: String,
    /// Its target accuracy.
    pub target_accuracy: f64,
    /// The table, in scenario order.
    pub rows: Vec<Row>,
    /// The full report of every run, in the same order.
    pub reports: Vec<SimReport>,
    /// The row the speedups are relative to: the first BSP run with the scenario's own
    /// stragglers, else the first run.
    pub baseline: usize,
}

impl Comparison {
    /// The run that reached the target first (ties: the earlier row).
    pub fn fastest(&self) -> Option<&Row> {
        self.rows
            .iter()
            .filter(|r| r.time_to_target_s.is_some())
            .min_by(|a, b| a.time_to_target_s.partial_cmp(&b.time_to_target_s).unwrap_or(std::cmp::Ordering::Equal))
    }

    /// The table as text.
    pub fn table(&self) -> String {
        let mut out = format!(
            "{:<36} {:>9} {:>8} {:>8} {:>8} {:>9} {:>8} {:>7} {:>7}\n",
            format!("protocol (target {:.2})", self.target_accuracy),
            "time (s)",
            "speedup",
            "final",
            "updates",
            "applied",
            "dropped",
            "stale",
            "busy"
        );
        for (i, r) in self.rows.iter().enumerate() {
            let time = r.time_to_target_s.map_or("-".into(), |t| format!("{t:.3}"));
            let speedup = if i == self.baseline { "1.00x".into() } else { r.speedup_vs_bsp.map_or("-".into(), |s| format!("{s:.2}x")) };
            out.push_str(&format!(
                "{:<36} {:>9} {:>8} {:>8.4} {:>8} {:>9} {:>8} {:>7.2} {:>6.0}%\n",
                r.label, time, speedup, r.final_accuracy, r.updates, r.applied, r.dropped, r.mean_staleness, r.compute_share * 100.0
            ));
        }
        out
    }
}

/// Runs every run of `scenario` on `workload` (built from the scenario's model and seed when
/// `None`), on up to `jobs` threads; `done` is called after each run with its index.
pub fn run(scenario: &Scenario, workload: Option<&Workload>, jobs: usize, done: &(dyn Fn(usize) + Sync)) -> Result<Comparison, String> {
    let own;
    let workload = match workload {
        Some(w) => w,
        None => {
            own = Workload::digits(scenario.model, scenario.seed);
            &own
        }
    };
    let configs = scenario.runs.iter().map(|r| scenario.sim_config(r)).collect::<Result<Vec<_>, _>>()?;
    let next = AtomicUsize::new(0);
    let results: Mutex<Vec<Option<Result<SimReport, String>>>> = Mutex::new(vec![None; configs.len()]);
    std::thread::scope(|s| {
        for _ in 0..jobs.clamp(1, configs.len().max(1)) {
            s.spawn(|| {
                loop {
                    let i = next.fetch_add(1, Ordering::Relaxed);
                    let Some(config) = configs.get(i) else { break };
                    let report = sim::try_run(config, workload).map_err(|e| e.to_string());
                    if let Ok(mut r) = results.lock() {
                        if let Some(slot) = r.get_mut(i) {
                            *slot = Some(report);
                        }
                    }
                    done(i);
                }
            });
        }
    });
    let results = results.into_inner().map_err(|_| "a simulation thread panicked".to_string())?;
    let mut reports = Vec::with_capacity(results.len());
    for (run, r) in scenario.runs.iter().zip(results) {
        reports.push(r.ok_or_else(|| format!("{}: the run did not finish", run.label()))?.map_err(|e| format!("{}: {e}", run.label()))?);
    }
    let baseline = scenario
        .runs
        .iter()
        .position(|r| r.spec.name == ProtocolName::Bsp && r.compute.is_none())
        .unwrap_or(0);
    let base_time = reports.get(baseline).and_then(|r| r.time_to_target);
    let rows = scenario
        .runs
        .iter()
        .zip(&reports)
        .map(|(run, rep)| Row {
            label: run.label(),
            protocol: rep.protocol.clone(),
            time_to_target_s: rep.time_to_target,
            speedup_vs_bsp: match (base_time, rep.time_to_target) {
                (Some(b), Some(t)) if t > 0.0 => Some(b / t),
                _ => None,
            },
            final_accuracy: rep.final_accuracy,
            updates: rep.updates,
            applied: rep.applied,
            dropped: rep.dropped.values().sum(),
            mean_staleness: rep.staleness.mean,
            compute_share: rep.mean_compute_share,
            virtual_time_s: rep.virtual_time_s,
        })
        .collect();
    Ok(Comparison { scenario: scenario.name.clone(), target_accuracy: scenario.target_accuracy, rows, reports, baseline })
}
