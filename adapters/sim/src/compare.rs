//! Every protocol of a [`Scenario`] on the same seeded simulation, side by side: the engine
//! behind `syncopate compare` and `syncopate advise`.

use crate::scenario::{ProtocolKind, Scenario};
use crate::sim::{self, SimReport};
use crate::workload::Workload;
use serde::Serialize;
use std::sync::Mutex;
use std::sync::atomic::{AtomicUsize, Ordering};

/// Stack size of a simulation thread.
const SIM_STACK: usize = 64 << 20;

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
    /// A reference run with its own stragglers (e.g. `bsp (no stragglers)`): shown for
    /// comparison, never the fastest.
    pub reference: bool,
    /// Seeds whose run reached the target, of [`Row::seeds`].
    pub reached: u32,
    /// Seeds the run was repeated with; the figures are medians (shares and staleness: means).
    pub seeds: u32,
    /// Test accuracy at the end of the budget.
    pub final_accuracy: f64,
    /// Model updates.
    pub updates: u64,
    /// Contributions the servers accepted, summed over the seeds; every one of them is
    /// applied, dropped or held at stop: `accepted = applied + dropped + held_at_stop`.
    pub accepted: u64,
    /// Contributions applied, summed over the seeds.
    pub applied: u64,
    /// Contributions dropped by the protocol, summed over the seeds.
    pub dropped: u64,
    /// Contributions still held by the server when the run stopped (a partial iteration),
    /// summed over the seeds.
    pub held_at_stop: u64,
    /// Seeds whose run stopped at the simulator's event budget before its time budget.
    pub hit_event_budget: u32,
    /// Why the first diverged seed diverged ([`crate::sim::divergence`]), and how many
    /// seeds did; `None` when none did.
    pub diverged: Option<(u32, String)>,
    /// Mean staleness of applied contributions.
    pub mean_staleness: f64,
    /// Mean over workers of computing time / wall time.
    pub compute_share: f64,
    /// Virtual seconds simulated.
    pub virtual_time_s: f64,
}

/// DBW against the best static `b` at one accuracy target
/// ([`Comparison::dbw_against_static`]).
#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct DbwAtTarget {
    /// The target test accuracy.
    pub accuracy: f64,
    /// The fastest static run's label and median time (s), if any reached the target.
    pub best_static: Option<(String, f64)>,
    /// Each DBW run's label and median time (s), `None` if not every seed reached it.
    pub dbw: Vec<(String, Option<f64>)>,
}

/// The outcome of a comparison.
#[derive(Clone, Debug)]
pub struct Comparison {
    /// The scenario's name.
    pub scenario: String,
    /// Its target accuracy.
    pub target_accuracy: f64,
    /// Its further accuracy targets (ascending; may be empty).
    pub accuracy_ladder: Vec<f64>,
    /// The table, in scenario order.
    pub rows: Vec<Row>,
    /// The full report of every run's first seed, in the same order.
    pub reports: Vec<SimReport>,
    /// Every run's accuracy curve for each seed, in the same order.
    pub curves: Vec<Vec<Vec<sim::CurvePoint>>>,
    /// Every run's time to target for each seed (`None`: not reached).
    pub times_to_target: Vec<Vec<Option<f64>>>,
    /// For runs whose protocol chooses its backup workers (DBW), the backup workers
    /// `b_t = n − k_t` of every update of the first seed as (virtual seconds, b_t); empty
    /// for other protocols.
    pub backup_workers: Vec<Vec<(f64, u32)>>,
    /// The seeds the runs were repeated with.
    pub seeds: std::ops::Range<u64>,
    /// The virtual time budget of each run, in seconds.
    pub max_time_s: f64,
    /// The row the speedups are relative to: the first BSP run with the scenario's own
    /// stragglers, else the first run.
    pub baseline: usize,
}

impl Comparison {
    /// The run that reached the target first (ties: the earlier row); reference rows with
    /// their own stragglers are not candidates.
    pub fn fastest(&self) -> Option<&Row> {
        self.ranked().into_iter().next()
    }

    /// The candidate runs that reached the target, fastest first (ties keep table order).
    pub fn ranked(&self) -> Vec<&Row> {
        let mut rows: Vec<&Row> = self.rows.iter().filter(|r| !r.reference && r.time_to_target_s.is_some()).collect();
        rows.sort_by(|a, b| a.time_to_target_s.partial_cmp(&b.time_to_target_s).unwrap_or(std::cmp::Ordering::Equal));
        rows
    }

    /// The median over seeds of run `i`'s time to `accuracy`, read from its accuracy
    /// curves (`None` unless every seed reached it).
    fn median_time_to(&self, i: usize, accuracy: f64) -> Option<f64> {
        let curves = self.curves.get(i)?;
        let times: Vec<Option<f64>> =
            curves.iter().map(|c| c.iter().find(|p| p.accuracy >= accuracy).map(|p| p.time_s)).collect();
        if times.iter().any(Option::is_none) {
            return None;
        }
        median(times)
    }

    /// DBW against the best static number of backup workers at each target of the ladder
    /// and the scenario's target: per target, the fastest static run (`bsp` and `backup`
    /// runs with the scenario's stragglers, every seed reaching it) and each DBW run's
    /// ratio to it, from the medians over seeds of the accuracy curves. `None` without a
    /// DBW run or a static run.
    pub fn dbw_against_static(&self) -> Option<Vec<DbwAtTarget>> {
        let is = |r: &Row, name: &str| r.protocol == name && !r.reference;
        let statics: Vec<usize> =
            (0..self.rows.len()).filter(|&i| is(&self.rows[i], "backup") || is(&self.rows[i], "bsp")).collect();
        let dbws: Vec<usize> = (0..self.rows.len()).filter(|&i| is(&self.rows[i], "dbw")).collect();
        if statics.is_empty() || dbws.is_empty() {
            return None;
        }
        let mut targets = self.accuracy_ladder.clone();
        if !targets.contains(&self.target_accuracy) {
            targets.push(self.target_accuracy);
        }
        targets.sort_by(f64::total_cmp);
        Some(
            targets
                .into_iter()
                .map(|target| {
                    let best = statics
                        .iter()
                        .filter_map(|&i| self.median_time_to(i, target).map(|t| (i, t)))
                        .min_by(|a, b| a.1.total_cmp(&b.1));
                    let dbw =
                        dbws.iter().map(|&i| (self.rows[i].label.clone(), self.median_time_to(i, target))).collect();
                    DbwAtTarget {
                        accuracy: target,
                        best_static: best.map(|(i, t)| (self.rows[i].label.clone(), t)),
                        dbw,
                    }
                })
                .collect(),
        )
    }

    /// [`Self::dbw_against_static`] as text (empty when it is `None`).
    pub fn dbw_table(&self) -> String {
        let Some(rows) = self.dbw_against_static() else { return String::new() };
        let mut out = format!(
            "\nDBW against the best static b chosen in hindsight (median over {} seeds):\n{:<8} {:<28} {:>9}",
            self.seeds.end.saturating_sub(self.seeds.start),
            "target",
            "best static b",
            "time (s)"
        );
        for (label, _) in rows.first().map(|r| r.dbw.as_slice()).unwrap_or(&[]) {
            out.push_str(&format!(" {:>12} {:>12}", format!("{label} (s)"), "/ best"));
        }
        out.push('\n');
        for r in &rows {
            let (label, time) = match &r.best_static {
                Some((l, t)) => (l.clone(), format!("{t:.3}")),
                None => ("none reached".into(), "-".into()),
            };
            out.push_str(&format!("{:<8.3} {:<28} {:>9}", r.accuracy, label, time));
            for (_, t) in &r.dbw {
                let ratio = match (t, &r.best_static) {
                    (Some(t), Some((_, b))) if *b > 0.0 => format!("{:.2}x", t / b),
                    _ => "-".into(),
                };
                out.push_str(&format!(" {:>12} {:>12}", t.map_or("-".into(), |t| format!("{t:.3}")), ratio));
            }
            out.push('\n');
        }
        out
    }

    /// The table as text.
    pub fn table(&self) -> String {
        let mut out = format!(
            "{:<36} {:>9} {:>8} {:>8} {:>8} {:>9} {:>9} {:>8} {:>5} {:>7} {:>7}\n",
            format!("protocol (target {:.2})", self.target_accuracy),
            "time (s)",
            "speedup",
            "final",
            "updates",
            "accepted",
            "applied",
            "dropped",
            "held",
            "stale",
            "busy"
        );
        for (i, r) in self.rows.iter().enumerate() {
            let mut time = r.time_to_target_s.map_or("-".into(), |t| format!("{t:.3}"));
            if r.seeds > 1 && r.reached < r.seeds {
                time = format!("{time} ({}/{})", r.reached, r.seeds);
            }
            let speedup = if i == self.baseline {
                "1.00x".into()
            } else {
                r.speedup_vs_bsp.map_or("-".into(), |s| format!("{s:.2}x"))
            };
            out.push_str(&format!(
                "{:<36} {:>9} {:>8} {:>8.4} {:>8} {:>9} {:>9} {:>8} {:>5} {:>7.2} {:>6.0}%\n",
                r.label,
                time,
                speedup,
                r.final_accuracy,
                r.updates,
                r.accepted,
                r.applied,
                r.dropped,
                r.held_at_stop,
                r.mean_staleness,
                r.compute_share * 100.0
            ));
        }
        let seeds = self.rows.first().map_or(1, |r| r.seeds);
        if let Some(base) = self.rows.get(self.baseline) {
            out.push_str(&format!("speedup: {}'s time to target over each run's\n", base.label.trim_end()));
        }
        out.push_str(&format!(
            "time, speedup, final, updates: medians over {seeds} seed(s); stale, busy: means; gradients: totals over the seeds, accepted = applied + dropped + held at stop\n"
        ));
        for r in &self.rows {
            if let Some((count, why)) = &r.diverged {
                out.push_str(&format!(
                    "note: {} diverged in {count} of {} seeds ({why}): lower its learning rate\n",
                    r.label.trim_end(),
                    r.seeds
                ));
            }
        }
        for r in self.rows.iter().filter(|r| r.hit_event_budget > 0) {
            out.push_str(&format!(
                "note: {} stopped at the event budget ({} of {} seeds) before its time budget\n",
                r.label, r.hit_event_budget, r.seeds
            ));
        }
        out
    }
}

/// The median of `values` (`None` when empty); `None` entries (target not reached) sort
/// last, so the median is `None` when at least half the seeds missed.
fn median(mut values: Vec<Option<f64>>) -> Option<f64> {
    values.sort_by(|a, b| match (a, b) {
        (Some(x), Some(y)) => x.partial_cmp(y).unwrap_or(std::cmp::Ordering::Equal),
        (Some(_), None) => std::cmp::Ordering::Less,
        (None, Some(_)) => std::cmp::Ordering::Greater,
        (None, None) => std::cmp::Ordering::Equal,
    });
    let n = values.len();
    if n == 0 {
        return None;
    }
    if n % 2 == 1 {
        values.get(n / 2).copied().flatten()
    } else {
        match (values.get(n / 2 - 1).copied().flatten(), values.get(n / 2).copied().flatten()) {
            (Some(a), Some(b)) => Some((a + b) / 2.0),
            _ => None,
        }
    }
}

fn row(label: String, reference: bool, reports: &[SimReport]) -> Row {
    let med = |f: &dyn Fn(&SimReport) -> f64| median(reports.iter().map(|r| Some(f(r))).collect()).unwrap_or(0.0);
    let mean = |f: &dyn Fn(&SimReport) -> f64| reports.iter().map(f).sum::<f64>() / reports.len().max(1) as f64;
    Row {
        label,
        protocol: reports.first().map(|r| r.protocol.clone()).unwrap_or_default(),
        time_to_target_s: median(reports.iter().map(|r| r.time_to_target).collect()),
        speedup_vs_bsp: None,
        reference,
        reached: reports.iter().filter(|r| r.time_to_target.is_some()).count() as u32,
        seeds: reports.len() as u32,
        final_accuracy: med(&|r| r.final_accuracy),
        updates: med(&|r| r.updates as f64) as u64,
        accepted: reports.iter().map(|r| r.accepted).sum(),
        applied: reports.iter().map(|r| r.applied).sum(),
        dropped: reports.iter().map(|r| r.dropped.values().sum::<u64>()).sum(),
        held_at_stop: reports
            .iter()
            .map(|r| r.accepted.saturating_sub(r.applied + r.dropped.values().sum::<u64>()))
            .sum(),
        hit_event_budget: reports.iter().filter(|r| r.stop_reason == "max_events").count() as u32,
        diverged: {
            let why: Vec<String> = reports.iter().filter_map(|r| sim::divergence(&r.curve, r.not_finite)).collect();
            why.first().map(|w| (why.len() as u32, w.clone()))
        },
        mean_staleness: mean(&|r| r.staleness.mean),
        compute_share: mean(&|r| r.mean_compute_share),
        virtual_time_s: med(&|r| r.virtual_time_s),
    }
}

/// Runs every run of `scenario` with each of its seeds on `workload` (built from the
/// scenario's model and first seed when `None`), on up to `jobs` threads; `done` is called
/// after each simulation.
pub fn run(
    scenario: &Scenario,
    workload: Option<&Workload>,
    jobs: usize,
    done: &(dyn Fn(usize) + Sync),
) -> Result<Comparison, String> {
    let own;
    let workload = match workload {
        Some(w) => w,
        None => {
            own = Workload::builtin(scenario.model, scenario.seed);
            &own
        }
    };
    let seeds = scenario.seeds.max(1);
    let mut configs = Vec::with_capacity(scenario.runs.len() * seeds as usize);
    for run in &scenario.runs {
        for repeat in 0..seeds {
            configs.push(scenario.sim_config(run, repeat)?);
        }
    }
    let next = AtomicUsize::new(0);
    let results: Mutex<Vec<Option<RunResult>>> = Mutex::new(vec![None; configs.len()]);
    std::thread::scope(|s| {
        for _ in 0..jobs.clamp(1, configs.len().max(1)) {
            // Protocol state machines are fixed-size values (the grouped server is ~130 KB) and
            // the simulator holds a few of them on its stack: give the threads room.
            let builder = std::thread::Builder::new().name("compare".into()).stack_size(SIM_STACK);
            let spawned = builder.spawn_scoped(s, || {
                loop {
                    let i = next.fetch_add(1, Ordering::Relaxed);
                    let Some(config) = configs.get(i) else { break };
                    let mut backups = BackupWorkers::new(config);
                    let report = sim::try_run_observed(config, workload, &mut |o| backups.observe(o))
                        .map_err(|e| e.to_string())
                        .map(|r| (r, backups.into_series()));
                    if let Ok(mut r) = results.lock() {
                        if let Some(slot) = r.get_mut(i) {
                            *slot = Some(report);
                        }
                    }
                    done(i);
                }
            });
            if spawned.is_err() {
                break;
            }
        }
    });
    let results = results.into_inner().map_err(|_| "a simulation thread panicked".to_string())?;
    let mut all = results.into_iter();
    let mut rows = Vec::with_capacity(scenario.runs.len());
    let mut reports = Vec::with_capacity(scenario.runs.len());
    let mut curves = Vec::with_capacity(scenario.runs.len());
    let mut times_to_target = Vec::with_capacity(scenario.runs.len());
    let mut backup_workers = Vec::with_capacity(scenario.runs.len());
    for run in &scenario.runs {
        let mut per_seed = Vec::with_capacity(seeds as usize);
        let mut first_backups = None;
        for _ in 0..seeds {
            let r = all.next().flatten().ok_or_else(|| format!("{}: the run did not finish", run.label()))?;
            let (report, backups) = r.map_err(|e| format!("{}: {e}", run.label()))?;
            first_backups.get_or_insert(backups);
            per_seed.push(report);
        }
        rows.push(row(run.label(), run.stragglers_note.is_some(), &per_seed));
        curves.push(per_seed.iter().map(|r| r.curve.clone()).collect());
        times_to_target.push(per_seed.iter().map(|r| r.time_to_target).collect());
        backup_workers.push(first_backups.unwrap_or_default());
        reports.extend(per_seed.into_iter().next());
    }
    let baseline =
        scenario.runs.iter().position(|r| r.spec.name == ProtocolKind::Bsp && r.compute.is_none()).unwrap_or(0);
    let base_time = rows.get(baseline).and_then(|r| r.time_to_target_s);
    for r in &mut rows {
        r.speedup_vs_bsp = match (base_time, r.time_to_target_s) {
            (Some(b), Some(t)) if t > 0.0 => Some(b / t),
            _ => None,
        };
    }
    Ok(Comparison {
        scenario: scenario.name.clone(),
        target_accuracy: scenario.target_accuracy,
        accuracy_ladder: scenario.accuracy_ladder.clone(),
        rows,
        reports,
        curves,
        times_to_target,
        backup_workers,
        seeds: scenario.seed..scenario.seed.wrapping_add(u64::from(seeds)),
        max_time_s: scenario.max_time.as_secs_f64(),
        baseline,
    })
}

/// A run's report and its DBW backup-worker series.
type RunResult = Result<(SimReport, Vec<(f64, u32)>), String>;

/// Watches a run's server for the backup workers of a protocol that chooses them: each
/// model version's applied gradients are `k_t`, so `b_t = n − k_t`. Kept for every run and
/// returned only for one whose server reported a choice ([`ServerEvent::BackupChosen`]), so
/// no protocol is named here.
///
/// [`ServerEvent::BackupChosen`]: syncopate::ServerEvent::BackupChosen
struct BackupWorkers {
    chosen: bool,
    workers: u32,
    version: u64,
    count: u32,
    at: f64,
    series: Vec<(f64, u32)>,
}

impl BackupWorkers {
    fn new(config: &sim::SimConfig) -> Self {
        Self { chosen: false, workers: config.workers(), version: 0, count: 0, at: 0.0, series: Vec::new() }
    }

    fn observe(&mut self, o: &sim::Observation<'_>) {
        let sim::Observation::Server { at, event } = o else { return };
        let version = match event {
            syncopate::ServerEvent::Applied { version, .. } => version,
            syncopate::ServerEvent::BackupChosen { .. } => {
                self.chosen = true;
                return;
            }
            _ => return,
        };
        if version.0 != self.version && self.count > 0 {
            self.series.push((self.at, self.workers.saturating_sub(self.count)));
            self.count = 0;
        }
        self.version = version.0;
        self.at = at.as_secs_f64();
        self.count += 1;
    }

    /// The series, if the server chose its backup workers (empty otherwise).
    fn into_series(self) -> Vec<(f64, u32)> {
        if self.chosen { self.series } else { Vec::new() }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn median_counts_misses_as_slowest() {
        assert_eq!(median(vec![Some(3.0), Some(1.0), Some(2.0)]), Some(2.0));
        assert_eq!(median(vec![Some(3.0), None, Some(1.0), Some(2.0)]), Some(2.5));
        assert_eq!(median(vec![Some(1.0), None, None]), None);
        assert_eq!(median(vec![]), None);
    }

    fn row(label: &str, protocol: &str, reference: bool) -> Row {
        Row {
            label: label.into(),
            protocol: protocol.into(),
            time_to_target_s: None,
            speedup_vs_bsp: None,
            reference,
            reached: 0,
            seeds: 2,
            final_accuracy: 0.0,
            updates: 0,
            accepted: 0,
            applied: 0,
            dropped: 0,
            held_at_stop: 0,
            hit_event_budget: 0,
            diverged: None,
            mean_staleness: 0.0,
            compute_share: 0.0,
            virtual_time_s: 0.0,
        }
    }

    /// A curve reaching accuracy `0.1·i` at time `i·step` seconds.
    fn curve(step: f64) -> Vec<sim::CurvePoint> {
        (0..=10)
            .map(|i| sim::CurvePoint {
                time_s: f64::from(i) * step,
                version: 0,
                accuracy: f64::from(i) / 10.0,
                loss: 0.0,
            })
            .collect()
    }

    #[test]
    fn dbw_is_compared_with_the_fastest_static_run_at_every_target() {
        // Two static runs: b = 0 fast to 0.5 then flat, b = 2 steady; a reference run
        // faster than all (ignored); DBW in between.
        let mut flat = curve(1.0);
        for p in flat.iter_mut().skip(6) {
            p.accuracy = 0.5;
        }
        let c = Comparison {
            scenario: "s".into(),
            target_accuracy: 0.8,
            accuracy_ladder: vec![0.3, 0.6],
            rows: vec![
                row("b = 0", "backup", false),
                row("b = 2", "backup", false),
                row("bsp (no stragglers)", "bsp", true),
                row("dbw", "dbw", false),
            ],
            reports: Vec::new(),
            curves: vec![
                vec![flat.clone(), flat],
                vec![curve(2.0), curve(2.0)],
                vec![curve(0.1), curve(0.1)],
                vec![curve(1.5), curve(1.7)],
            ],
            times_to_target: Vec::new(),
            backup_workers: Vec::new(),
            seeds: 1..3,
            max_time_s: 10.0,
            baseline: 0,
        };
        let got = c.dbw_against_static().unwrap();
        let targets: Vec<f64> = got.iter().map(|t| t.accuracy).collect();
        assert_eq!(targets, [0.3, 0.6, 0.8]);
        // 0.3: b = 0 at 3 s; DBW's median of 4.5 and 5.1.
        assert_eq!(got[0].best_static, Some(("b = 0".into(), 3.0)));
        assert!((got[0].dbw[0].1.unwrap() - 4.8).abs() < 1e-9);
        // 0.6 and 0.8: b = 0 never gets there; b = 2 at 12 s and 16 s.
        assert_eq!(got[1].best_static, Some(("b = 2".into(), 12.0)));
        assert_eq!(got[2].best_static, Some(("b = 2".into(), 16.0)));
        let table = c.dbw_table();
        assert!(table.contains("0.800    b = 2"), "{table}");
        assert!(table.contains("0.80x"), "{table}");
        // No DBW run: no table.
        let mut without = c.clone();
        without.rows.truncate(3);
        assert!(without.dbw_against_static().is_none() && without.dbw_table().is_empty());
    }
}
