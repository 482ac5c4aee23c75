//! The summary every training command ends with: as text for people, or one JSON object
//! on stdout with `--json`.

use crate::thread::{EvalPoint, ThreadReport};
use serde::Serialize;
use syncopate::{DropReason, ServerStats};

/// Gradient counts by outcome.
#[derive(Clone, Debug, Default, PartialEq, Serialize)]
pub struct Outcomes {
    /// Contributions the server accepted for processing.
    pub accepted: u64,
    /// Contributions applied to the model.
    pub applied: u64,
    /// Valid contributions the protocol dropped, in total.
    pub dropped: u64,
    /// Drops by reason (only reasons that occurred).
    pub dropped_by_reason: std::collections::BTreeMap<String, u64>,
    /// Inputs the server refused (malformed, duplicate, unknown sender…).
    pub refused: u64,
}

impl Outcomes {
    /// From a server's counters (`refused` counts inputs refused anywhere, e.g. by the codec).
    pub fn new(stats: &ServerStats, refused: u64) -> Self {
        Self {
            accepted: stats.accepted,
            applied: stats.applied,
            dropped: stats.dropped_total(),
            dropped_by_reason: DropReason::ALL
                .iter()
                .filter(|r| stats.dropped_for(**r) > 0)
                .map(|r| (r.name().to_string(), stats.dropped_for(*r)))
                .collect(),
            refused,
        }
    }
}

/// One worker's share of the work.
#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct WorkerSummary {
    /// Gradients (or local steps) computed.
    pub steps: u64,
    /// Computations abandoned before completion.
    pub abandoned: u64,
    /// Time computing / total time.
    pub compute_share: f64,
}

/// The end-of-run summary of `train`, `serve` and the simulator.
#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct Summary {
    /// `threads`, `sim`, `tcp` or `mpi`.
    pub mode: String,
    /// The protocol's name.
    pub protocol: String,
    /// Number of workers.
    pub workers: u32,
    /// Model kind.
    pub model: String,
    /// Parameters in the model.
    pub params: usize,
    /// The run's seed.
    pub seed: u64,
    /// Test accuracy of the final model.
    pub final_accuracy: f64,
    /// Mean test loss of the final model.
    pub final_loss: f64,
    /// Seconds the run took: wall clock for threads and TCP, virtual for the simulator.
    pub time_s: f64,
    /// The target accuracy.
    pub target_accuracy: f64,
    /// Seconds until the test accuracy first reached the target (same clock as `time_s`).
    pub time_to_target_s: Option<f64>,
    /// Model updates (the final version).
    pub updates: u64,
    /// What became of the gradients.
    pub gradients: Outcomes,
    /// Mean staleness of applied contributions.
    pub mean_staleness: f64,
    /// Largest staleness of an applied contribution.
    pub max_staleness: u64,
    /// Stall reports made by the server.
    pub stalls: u64,
    /// Per worker, in id order.
    pub per_worker: Vec<WorkerSummary>,
    /// Test accuracy over time.
    pub curve: Vec<EvalPoint>,
}

impl Summary {
    /// The summary of a threaded run.
    pub fn from_threads(
        report: &ThreadReport,
        protocol: &str,
        workers: u32,
        model: &str,
        params: usize,
        seed: u64,
        target: f64,
    ) -> Self {
        let last =
            report.curve.last().copied().unwrap_or(EvalPoint { time_s: 0.0, version: 0, accuracy: 0.0, loss: 0.0 });
        let (sum, count, max) = report.staleness;
        Self {
            mode: "threads".into(),
            protocol: protocol.into(),
            workers,
            model: model.into(),
            params,
            seed,
            final_accuracy: last.accuracy,
            final_loss: last.loss,
            time_s: report.wall_s,
            target_accuracy: target,
            time_to_target_s: report.time_to_target_s,
            updates: last.version,
            gradients: Outcomes::new(&report.stats, report.refused),
            mean_staleness: if count == 0 { 0.0 } else { sum as f64 / count as f64 },
            max_staleness: max,
            stalls: report.stalls,
            per_worker: report
                .workers
                .iter()
                .map(|w| WorkerSummary {
                    steps: w.computed,
                    abandoned: w.abandoned,
                    compute_share: if w.wall_s > 0.0 { (w.busy_s / w.wall_s).min(1.0) } else { 0.0 },
                })
                .collect(),
            curve: report.curve.clone(),
        }
    }

    /// The summary of a simulated run (times are virtual).
    pub fn from_sim(report: &crate::sim::SimReport, model: &str, params: usize) -> Self {
        let dropped_by_reason: std::collections::BTreeMap<String, u64> =
            report.dropped.iter().filter(|(_, v)| **v > 0).map(|(k, v)| ((*k).to_string(), *v)).collect();
        Self {
            mode: "sim".into(),
            protocol: report.protocol.clone(),
            workers: report.workers,
            model: model.into(),
            params,
            seed: report.seed,
            final_accuracy: report.final_accuracy,
            final_loss: report.final_loss,
            time_s: report.virtual_time_s,
            target_accuracy: report.target_accuracy,
            time_to_target_s: report.time_to_target,
            updates: report.updates,
            gradients: Outcomes {
                accepted: report.accepted,
                applied: report.applied,
                dropped: dropped_by_reason.values().sum(),
                dropped_by_reason,
                refused: report.rejected,
            },
            mean_staleness: report.staleness.mean,
            max_staleness: report.staleness.max,
            stalls: report.stalls,
            per_worker: report
                .per_worker
                .iter()
                .map(|w| WorkerSummary {
                    steps: w.gradients_computed,
                    abandoned: w.jobs_abandoned,
                    compute_share: w.compute_share,
                })
                .collect(),
            curve: report.curve.clone(),
        }
    }

    /// Prints the summary: JSON on one line, or a short text block.
    pub fn print(&self, json: bool) {
        if json {
            match serde_json::to_string(self) {
                Ok(s) => println!("{s}"),
                Err(e) => eprintln!("error: cannot encode the summary as JSON: {e}"),
            }
            return;
        }
        let clock = if self.mode == "sim" { "virtual" } else { "wall" };
        println!(
            "syncopate {}: {}, {} workers, {} ({} params), seed {}",
            self.mode, self.protocol, self.workers, self.model, self.params, self.seed
        );
        println!("  test accuracy  {:.4}   loss {:.4}", self.final_accuracy, self.final_loss);
        let target = match self.time_to_target_s {
            Some(t) => format!("{t:.3} s"),
            None => "not reached".into(),
        };
        println!(
            "  {:<14} {:.3} s   time to {:.2}: {target}",
            format!("{clock} time"),
            self.time_s,
            self.target_accuracy
        );
        let g = &self.gradients;
        println!(
            "  updates        {}   gradients: accepted {}, applied {}, dropped {}, refused {}",
            self.updates, g.accepted, g.applied, g.dropped, g.refused
        );
        if !g.dropped_by_reason.is_empty() {
            let reasons: Vec<String> = g.dropped_by_reason.iter().map(|(k, v)| format!("{k} {v}")).collect();
            println!("  dropped        {}", reasons.join(", "));
        }
        println!(
            "  staleness      mean {:.2}, max {}   stall reports {}",
            self.mean_staleness, self.max_staleness, self.stalls
        );
        let steps: Vec<String> = self.per_worker.iter().map(|w| w.steps.to_string()).collect();
        let share: Vec<String> = self.per_worker.iter().map(|w| format!("{:.0}%", w.compute_share * 100.0)).collect();
        println!("  steps/worker   {}", steps.join(" "));
        println!("  compute share  {}", share.join(" "));
    }
}
