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
    /// Accepted contributions the server still held when the run stopped, neither applied
    /// nor dropped (a partial iteration, a cached gradient): `accepted − applied − dropped`.
    /// The server's counters give it; every accepted contribution ends in exactly one of
    /// applied, dropped or held.
    pub held_at_stop: u64,
    /// Inputs the server refused (malformed, duplicate, unknown sender…).
    pub refused: u64,
}

impl Outcomes {
    /// From a server's counters (`refused` counts inputs refused anywhere, e.g. by the codec).
    pub fn new(stats: &ServerStats, refused: u64) -> Self {
        let by_reason = DropReason::ALL.iter().map(|r| (r.name(), stats.dropped_for(*r)));
        Self::from_counts(stats.accepted, stats.applied, by_reason, refused)
    }

    /// From counts: `dropped_by_reason` keeps only reasons that occurred.
    pub fn from_counts<'a>(
        accepted: u64,
        applied: u64,
        by_reason: impl IntoIterator<Item = (&'a str, u64)>,
        refused: u64,
    ) -> Self {
        let dropped_by_reason: std::collections::BTreeMap<String, u64> =
            by_reason.into_iter().filter(|(_, n)| *n > 0).map(|(k, n)| (k.to_string(), n)).collect();
        let dropped = dropped_by_reason.values().sum();
        Self {
            accepted,
            applied,
            dropped,
            dropped_by_reason,
            held_at_stop: accepted.saturating_sub(applied.saturating_add(dropped)),
            refused,
        }
    }

    /// Whether every accepted contribution is accounted for: applied + dropped + held at
    /// stop = accepted (false means the server applied or dropped more than it accepted).
    pub fn add_up(&self) -> bool {
        self.applied.checked_add(self.dropped).and_then(|x| x.checked_add(self.held_at_stop)) == Some(self.accepted)
    }

    /// `accepted 800 = applied 531 + dropped 263 (stale 263) + held at stop 6`.
    pub fn line(&self) -> String {
        let mut dropped = format!("dropped {}", self.dropped);
        if !self.dropped_by_reason.is_empty() {
            let reasons: Vec<String> = self.dropped_by_reason.iter().map(|(k, v)| format!("{k} {v}")).collect();
            dropped = format!("{dropped} ({})", reasons.join(", "));
        }
        let sign = if self.add_up() { "=" } else { "≠ (miscounted)" };
        format!(
            "accepted {} {sign} applied {} + {dropped} + held at stop {}; refused {}",
            self.accepted, self.applied, self.held_at_stop, self.refused
        )
    }
}

/// The conservation ledger of a TCP run, from the server's side: the contributions it read
/// and what became of them, and, after `--resume`, what the killed server lost.
#[derive(Clone, Debug, Default, PartialEq, Serialize)]
pub struct TcpLedger {
    /// Contributions read from the workers' current sessions (each then accepted or refused).
    pub received: u64,
    /// Of those, refused by the protocol.
    pub refused: u64,
    /// Contributions read from a session already replaced or cut (lost with the connection).
    pub discarded: u64,
    /// Contributions that arrived after the run stopped.
    pub in_flight_at_stop: u64,
    /// Of the contributions received, those read from their session's shared-memory slot
    /// (a worker on the server's host) instead of its socket.
    pub via_shared_memory: u64,
    /// The same counts per session (a worker's connection and epoch).
    pub sessions: Vec<crate::tcp::SessionLedger>,
    /// Workers the protocol was told are lost (connection closed or silent past
    /// `--lost-after`, or declared lost by the protocol itself), once per loss of a live worker.
    pub workers_lost: u64,
    /// After `--resume`: what the previous server lost since its last checkpoint.
    pub resumed: Option<Resumed>,
}

/// What a resumed server reports of its predecessor (from the checkpoint's journal).
#[derive(Clone, Debug, Default, PartialEq, Serialize)]
pub struct Resumed {
    /// The checkpoint's version (the resumed model's).
    pub checkpoint_version: u64,
    /// The versions made after the checkpoint, now lost (`[first, last]`), if any.
    pub lost_versions: Option<[u64; 2]>,
    /// Contributions those versions combined.
    pub lost_contributions: u64,
    /// Those by worker id.
    pub lost_by_worker: Vec<u64>,
    /// The previous server's totals at the checkpoint: received, accepted, applied, dropped.
    pub at_checkpoint: [u64; 4],
    /// Its totals at its last journaled update (same order).
    pub at_last_update: [u64; 4],
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
    /// `threads`, `sim`, `tcp`, `tcp-shard` (one shard of a sharded run) or `mpi`.
    pub mode: String,
    /// The protocol's name.
    pub protocol: String,
    /// Number of workers.
    pub workers: u32,
    /// Model kind.
    pub model: String,
    /// Parameters in the model.
    pub params: usize,
    /// The run's seed (none for a vector of the user's own, which nothing random made).
    pub seed: Option<u64>,
    /// The SGD momentum coefficient of the server's updates (0: plain SGD).
    pub momentum: f64,
    /// Test accuracy of the final model (0 for the noisy quadratic model, which has none;
    /// none without a test set: a vector of the user's own, a shard's slice).
    pub final_accuracy: Option<f64>,
    /// Mean test loss of the final model (none without a test set).
    pub final_loss: Option<f64>,
    /// Seconds the run took: wall clock for threads and TCP, virtual for the simulator.
    pub time_s: f64,
    /// The target accuracy (none without a test set).
    pub target_accuracy: Option<f64>,
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
    /// Why the run diverged (its test loss not finite or grown tenfold, gradients refused
    /// for holding NaN or ±∞); absent when it did not.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub diverged: Option<String>,
    /// TCP runs: the server's side of the conservation ledger.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub ledger: Option<TcpLedger>,
    /// TCP runs: the straggler report, per worker (its median step time and ratio to the
    /// median worker, none without reported step times; its contributions applied,
    /// dropped and held).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub stragglers: Option<Vec<crate::tcp::WorkerRow>>,
    /// The simulator's cost (simulated runs only): events processed, and per second of
    /// wall-clock time.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub simulator: Option<SimulatorCost>,
    /// TCP runs whose workers report their minibatch loss: the training-loss curve and the
    /// time to `--target-loss`.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub loss_curve: Option<super::loss_curve::LossCurve>,
    /// Whether the model has a built-in test set (a vector from `serve --init` or worker 0
    /// has none: its accuracy fields mean nothing and are not printed).
    #[serde(skip)]
    pub test_set: bool,
}

/// What a simulated run cost to compute.
#[derive(Clone, Copy, Debug, PartialEq, Serialize)]
pub struct SimulatorCost {
    /// Events the simulator processed.
    pub events: u64,
    /// Wall-clock seconds the simulation took.
    pub wall_s: f64,
    /// `events / wall_s`.
    pub events_per_s: f64,
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
            simulator: None,
            mode: "threads".into(),
            protocol: protocol.into(),
            workers,
            model: model.into(),
            params,
            seed: Some(seed),
            momentum: 0.0,
            final_accuracy: Some(last.accuracy),
            final_loss: Some(last.loss),
            time_s: report.wall_s,
            target_accuracy: Some(target),
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
            diverged: crate::sim::divergence(&report.curve, report.ledger.refused_not_finite),
            curve: report.curve.clone(),
            ledger: None,
            stragglers: None,
            loss_curve: None,
            test_set: true,
        }
    }

    /// The summary of a simulated run (times are virtual).
    pub fn from_sim(report: &crate::sim::SimReport, model: &str, params: usize) -> Self {
        Self {
            simulator: None,
            mode: "sim".into(),
            protocol: report.protocol.clone(),
            workers: report.workers,
            model: model.into(),
            params,
            seed: Some(report.seed),
            momentum: 0.0,
            final_accuracy: Some(report.final_accuracy),
            final_loss: Some(report.final_loss),
            time_s: report.virtual_time_s,
            target_accuracy: Some(report.target_accuracy),
            time_to_target_s: report.time_to_target,
            updates: report.updates,
            gradients: Outcomes::from_counts(
                report.accepted,
                report.applied,
                report.dropped.iter().map(|(k, v)| (*k, *v)),
                report.rejected,
            ),
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
            diverged: crate::sim::divergence(&report.curve, report.not_finite),
            curve: report.curve.clone(),
            ledger: None,
            stragglers: None,
            loss_curve: None,
            test_set: true,
        }
    }

    /// Prints the summary: JSON on one line, or a short text block.
    pub fn print(&self, json: bool) {
        if json {
            match self.json() {
                Ok(s) => super::output::outln!("{s}"),
                Err(e) => eprintln!("error: cannot encode the summary as JSON: {e}"),
            }
            return;
        }
        super::output::emit(&self.text());
    }

    /// The summary as one JSON object.
    pub fn json(&self) -> Result<String, serde_json::Error> {
        serde_json::to_string(self)
    }

    /// A summary without a test set (a vector of the user's own, from `serve --init` or
    /// worker 0, or a shard's slice): no final accuracy or test loss and no accuracy target;
    /// a vector (`vector`) has no seed either.
    pub fn without_test_set(&mut self, vector: bool) {
        self.test_set = false;
        (self.final_accuracy, self.final_loss, self.target_accuracy) = (None, None, None);
        if vector {
            self.seed = None;
        }
    }

    /// Whether the model is a classifier (the noisy quadratic model has a loss only: its
    /// accuracy and time to an accuracy target mean nothing and are not printed).
    fn has_accuracy(&self) -> bool {
        self.test_set && !self.model.starts_with("nqm") && self.mode != "tcp-shard"
    }

    /// The summary as a short text block.
    pub fn text(&self) -> String {
        use std::fmt::Write as _;
        let mut out = String::new();
        let clock = if self.mode == "sim" { "virtual" } else { "wall" };
        let seed = self.seed.map(|s| format!(", seed {s}")).unwrap_or_default();
        let _ = writeln!(
            out,
            "syncopate {}: {}, {}, {} ({} params){seed}{}",
            self.mode,
            self.protocol,
            count(self.workers, "workers"),
            self.model,
            self.params,
            momentum_note(self.momentum)
        );
        if let Some(why) = &self.diverged {
            let _ = writeln!(out, "  DIVERGED       {why}: lower --lr");
        }
        if self.mode == "tcp-shard" {
            let _ = writeln!(out, "  model          a slice (this shard's): the workers assemble the whole model");
        } else if !self.test_set {
            let _ = writeln!(out, "  no test set    (a vector of your own: progress is the training loss below)");
        } else if self.has_accuracy() {
            let (accuracy, loss) = (self.final_accuracy.unwrap_or(0.0), self.final_loss.unwrap_or(0.0));
            let _ = writeln!(out, "  test accuracy  {accuracy:.4}   loss {loss:.4}");
        } else {
            let _ = writeln!(
                out,
                "  loss           {:.4}   (the noisy quadratic model has no accuracy)",
                self.final_loss.unwrap_or(0.0)
            );
        }
        if let Some(c) = self.simulator {
            let _ = writeln!(
                out,
                "  simulator      {} events in {:.2} s wall ({:.2} M events/s)",
                c.events,
                c.wall_s,
                c.events_per_s / 1e6
            );
        }
        let target = match self.time_to_target_s {
            Some(t) => format!("{t:.3} s"),
            None => "not reached".into(),
        };
        if self.has_accuracy() {
            let _ = writeln!(
                out,
                "  {:<14} {:.3} s   time to {:.2}: {target}",
                format!("{clock} time"),
                self.time_s,
                self.target_accuracy.unwrap_or(0.0)
            );
        } else {
            let _ = writeln!(out, "  {:<14} {:.3} s", format!("{clock} time"), self.time_s);
        }
        let _ = writeln!(out, "  updates        {}", self.updates);
        let _ = writeln!(out, "  gradients      {}", self.gradients.line());
        let _ = writeln!(
            out,
            "  staleness      mean {:.2}, max {}   stall reports {}",
            self.mean_staleness, self.max_staleness, self.stalls
        );
        let steps: Vec<String> = self.per_worker.iter().map(|w| w.steps.to_string()).collect();
        let share: Vec<String> = self.per_worker.iter().map(|w| format!("{:.0}%", w.compute_share * 100.0)).collect();
        let _ = writeln!(out, "  steps/worker   {}", steps.join(" "));
        if self.per_worker.iter().any(|w| w.abandoned > 0) {
            // A worker whose every computation was cut short (a backup worker's late
            // gradients) has no steps yet a full compute share: these counts explain it.
            let abandoned: Vec<String> = self.per_worker.iter().map(|w| w.abandoned.to_string()).collect();
            let _ = writeln!(
                out,
                "  abandoned      {}   (computations cut short, not counted in steps)",
                abandoned.join(" ")
            );
        }
        let _ = writeln!(out, "  compute share  {}", share.join(" "));
        for line in self.stragglers.iter().flat_map(|rows| crate::tcp::straggler_lines(rows)) {
            let _ = writeln!(out, "  {line}");
        }
        for line in self.loss_curve.iter().flat_map(super::loss_curve::LossCurve::lines) {
            let _ = writeln!(out, "  {line}");
        }
        out
    }
}

/// `1 worker`, `4 workers`: `n` and the plural `things`, made singular for one.
pub(super) fn count(n: u32, things: &str) -> String {
    if n == 1 { format!("1 {}", things.strip_suffix('s').unwrap_or(things)) } else { format!("{n} {things}") }
}

/// `, momentum 0.9` for a run with SGD momentum; empty for plain SGD.
pub(super) fn momentum_note(beta: f64) -> String {
    if beta > 0.0 { format!(", momentum {beta}") } else { String::new() }
}
