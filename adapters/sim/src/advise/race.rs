//! Running the candidates of one sweep as a race, and picking among them.
//!
//! The candidates first run for [`Setting::first_horizon_s`] virtual seconds on every seed
//! pair. A candidate that reached the target on every pair is done (its runs stopped at the
//! target, so a longer horizon would change nothing). One that did not is stopped early once
//! it is measurably dominated: when the mean of its times, misses counted at the horizon (a
//! lower bound of its mean), is more than [`STOP_BEYOND`] over the fastest finished mean, it
//! can be neither the fastest nor the pick (which stays within [`TIE_WITHIN`] of the
//! fastest). The others run again from the start with a longer horizon: twice as long while
//! no candidate has finished, then just long enough that missing again would dominate them,
//! up to the budget. Runs are deterministic, so a longer run repeats the shorter one and
//! carries on. The rounds do not depend on how many threads run them.

use super::stats::{self, Interval};
use super::{Candidate, Setting, TIE_ALWAYS, TIE_WITHIN, TraceTable, simplicity};
use crate::scenario::ProtocolKind;
use crate::scenario::{GroupLrScaling, ProtocolSpec};
use crate::sim::{self, SimConfig, SimReport};
use crate::workload::Workload;
use serde::Serialize;
use std::sync::Mutex;
use std::sync::atomic::{AtomicUsize, Ordering};

/// Stack size of a simulation thread.
const SIM_STACK: usize = 64 << 20;
/// A candidate is stopped once the lower bound of its mean time is this much over the
/// fastest finished candidate's mean (at least [`TIE_WITHIN`], so the pick is unchanged).
pub const STOP_BEYOND: f64 = 0.25;
/// Horizons grow by at least this factor from one round to the next.
const MIN_GROWTH: f64 = 1.05;

/// Why a candidate was stopped before the budget.
#[derive(Clone, Debug, Serialize)]
pub struct StoppedEarly {
    /// Its horizon, virtual seconds.
    pub at_s: f64,
    /// The finished candidate it was measured against.
    pub by: String,
    /// That candidate's mean time to target.
    pub by_mean_s: f64,
    /// The lower bound of this candidate's mean when it was stopped.
    pub lower_bound_s: f64,
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
    /// BSP's mean time divided by this one's (a lower bound when BSP was stopped early, see
    /// [`SweepResult::speedup_lower_bound`]).
    pub speedup_vs_bsp: Option<f64>,
    /// Mean model updates at the stop.
    pub updates: f64,
    /// Mean share of the trace's steps the workers had computed at the stop.
    pub trace_used: f64,
    /// Statistically tied with the fastest (see [`pick`]).
    pub tied: bool,
    /// Mean gradients the server applied per model update.
    pub gradients_per_update: f64,
    /// Gradients whose average makes one step of the reference learning rate (see
    /// [`effective_batch`]).
    pub effective_batch: f64,
    /// Stopped before the budget, measurably slower than a finished candidate.
    pub stopped_early: Option<StoppedEarly>,
    /// Added by extending a knob's sweep past its edge.
    pub extension: bool,
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
    /// BSP was stopped early: the speedups over it are lower bounds.
    pub speedup_lower_bound: bool,
    /// How knobs were swept past their edge (`None`: the sweep was not extended).
    pub extended: Option<Vec<String>>,
    /// The candidates, one per row.
    #[serde(skip)]
    pub candidates: Vec<Candidate>,
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

/// Runs every candidate on `trace` with each (run seed, data seed) pair, as a race.
pub fn sweep(
    trace: &TraceTable,
    candidates: &[Candidate],
    setting: &Setting,
    run_seeds: &[u64],
    split_seeds: &[u64],
    jobs: usize,
    done: &(dyn Fn() + Sync),
) -> Result<SweepResult, String> {
    let mut race = Race::new(trace, setting, run_seeds, split_seeds, jobs, done);
    race.add(candidates, false);
    race.run()?;
    Ok(race.result(None))
}

/// A candidate's runs at its last horizon.
struct Entry {
    candidate: Candidate,
    extension: bool,
    horizon_s: f64,
    reports: Vec<SimReport>,
    /// Final: finished, stopped early, or at the budget.
    done: bool,
    stopped: Option<StoppedEarly>,
}

impl Entry {
    fn reached_all(&self, setting: &Setting) -> bool {
        !self.reports.is_empty() && self.reports.iter().all(|r| r.time_to(setting.target).is_some())
    }

    /// Each pair's time to target, a miss counted at the end of its run.
    fn censored(&self, setting: &Setting) -> Vec<f64> {
        self.reports.iter().map(|r| r.time_to(setting.target).unwrap_or(r.virtual_time_s)).collect()
    }
}

/// The candidates of one sweep and their runs so far.
pub(super) struct Race<'a> {
    trace: &'a TraceTable,
    setting: &'a Setting,
    run_seeds: Vec<u64>,
    split_seeds: Vec<u64>,
    workloads: Vec<Workload>,
    jobs: usize,
    done: &'a (dyn Fn() + Sync),
    entries: Vec<Entry>,
}

impl<'a> Race<'a> {
    pub(super) fn new(
        trace: &'a TraceTable,
        setting: &'a Setting,
        run_seeds: &[u64],
        split_seeds: &[u64],
        jobs: usize,
        done: &'a (dyn Fn() + Sync),
    ) -> Self {
        let pairs = run_seeds.len().min(split_seeds.len());
        Self {
            trace,
            setting,
            run_seeds: run_seeds[..pairs].to_vec(),
            split_seeds: split_seeds[..pairs].to_vec(),
            workloads: split_seeds[..pairs].iter().map(|&s| setting.workload(s)).collect(),
            jobs,
            done,
            entries: Vec::new(),
        }
    }

    /// The candidates so far.
    pub(super) fn candidates(&self) -> Vec<Candidate> {
        self.entries.iter().map(|e| e.candidate.clone()).collect()
    }

    /// Adds `candidates` (not yet run) to the race.
    pub(super) fn add(&mut self, candidates: &[Candidate], extension: bool) {
        for c in candidates {
            self.entries.push(Entry {
                candidate: c.clone(),
                extension,
                horizon_s: 0.0,
                reports: Vec::new(),
                done: false,
                stopped: None,
            });
        }
    }

    /// The finished candidate with the lowest mean time to target, and that mean.
    fn leader(&self) -> Option<(usize, f64)> {
        self.entries
            .iter()
            .enumerate()
            .filter(|(_, e)| e.done && e.reached_all(self.setting))
            .map(|(i, e)| (i, stats::interval(&e.censored(self.setting)).mean))
            .min_by(|a, b| a.1.total_cmp(&b.1))
    }

    /// The horizon of entry `i`'s next round.
    fn next_horizon(&self, i: usize) -> f64 {
        let setting = self.setting;
        let e = &self.entries[i];
        let grown = if e.reports.is_empty() { setting.first_horizon_s } else { e.horizon_s * 2.0 };
        let next = match self.leader() {
            Some((_, best)) if !e.reports.is_empty() => {
                // Just long enough that missing again puts the lower bound over the line.
                let bound = (1.0 + STOP_BEYOND) * best * e.reports.len() as f64;
                let reached: f64 = e.reports.iter().filter_map(|r| r.time_to(setting.target)).sum();
                let missed = e.reports.iter().filter(|r| r.time_to(setting.target).is_none()).count().max(1);
                ((bound - reached) / missed as f64 * 1.001).max(e.horizon_s * MIN_GROWTH)
            }
            Some((_, best)) => grown.max((1.0 + STOP_BEYOND) * best * 1.001),
            None => grown,
        };
        next.min(setting.budget_s)
    }

    /// Runs rounds until every candidate is finished, stopped early or at the budget.
    pub(super) fn run(&mut self) -> Result<(), String> {
        loop {
            let todo: Vec<usize> = (0..self.entries.len()).filter(|&i| !self.entries[i].done).collect();
            if todo.is_empty() {
                return Ok(());
            }
            let horizons: Vec<f64> = todo.iter().map(|&i| self.next_horizon(i)).collect();
            let pairs = self.run_seeds.len();
            let mut work = Vec::with_capacity(todo.len() * pairs);
            for (&i, &h) in todo.iter().zip(&horizons) {
                let spec: &ProtocolSpec = &self.entries[i].candidate.spec;
                for (p, &seed) in self.run_seeds.iter().enumerate() {
                    let config = self
                        .setting
                        .sim_config(spec, self.trace, seed, h)
                        .map_err(|e| format!("{}: {e}", spec.label()))?;
                    work.push((config, p));
                }
            }
            let mut reports = run_all(self.jobs, &work, &self.workloads, self.done)?.into_iter();
            for (&i, &h) in todo.iter().zip(&horizons) {
                let e = &mut self.entries[i];
                e.horizon_s = h;
                e.reports = reports.by_ref().take(pairs).collect();
                // A run stopped by the event guard would stop there again.
                let guarded = e.reports.iter().any(|r| r.stop_reason == "max_events");
                e.done = e.reached_all(self.setting) || h >= self.setting.budget_s || guarded;
            }
            let Some((leader, best)) = self.leader() else { continue };
            let by = self.entries[leader].candidate.spec.label();
            for &i in &todo {
                let e = &mut self.entries[i];
                if e.done {
                    continue;
                }
                let lower = stats::interval(&e.censored(self.setting)).mean;
                if lower > (1.0 + STOP_BEYOND) * best {
                    e.done = true;
                    e.stopped =
                        Some(StoppedEarly { at_s: e.horizon_s, by: by.clone(), by_mean_s: best, lower_bound_s: lower });
                }
            }
        }
    }

    /// The sweep's rows and pick; `extended`: how knobs were swept past their edge.
    pub(super) fn result(&self, extended: Option<Vec<String>>) -> SweepResult {
        let setting = self.setting;
        let trace = self.trace;
        let total_steps = (trace.steps as f64 * f64::from(trace.workers)).max(1.0);
        let mut rows = Vec::with_capacity(self.entries.len());
        for e in &self.entries {
            let c = &e.candidate;
            let reports = &e.reports;
            let times: Vec<Option<f64>> = reports.iter().map(|r| r.time_to(setting.target)).collect();
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
                time: stats::interval(&e.censored(setting)),
                times_s: times,
                ladder_s,
                speedup_vs_bsp: None,
                updates: mean(&|r| r.updates as f64),
                trace_used: mean(&|r| {
                    r.per_worker.iter().map(|w| w.gradients_computed as f64).sum::<f64>() / total_steps
                }),
                tied: false,
                gradients_per_update: mean(&|r| r.applied as f64 / r.updates.max(1) as f64),
                effective_batch: effective_batch(
                    &c.spec,
                    trace.workers,
                    mean(&|r| r.applied as f64 / r.updates.max(1) as f64),
                ),
                stopped_early: e.stopped.clone(),
                extension: e.extension,
            });
        }
        let bsp = self.entries.iter().position(|e| e.candidate.spec.name == ProtocolKind::Bsp);
        // BSP stopped early: its mean is a lower bound, and so is every speedup over it.
        let bsp_row = bsp.and_then(|i| rows.get(i));
        let bsp_time = bsp_row.filter(|r| r.reached == r.repeats || r.stopped_early.is_some()).map(|r| r.time.mean);
        let speedup_lower_bound = bsp_row.is_some_and(|r| r.stopped_early.is_some());
        for r in &mut rows {
            if let Some(b) = bsp_time {
                if r.reached == r.repeats && r.time.mean > 0.0 {
                    r.speedup_vs_bsp = Some(b / r.time.mean);
                }
            }
        }
        let ranks: Vec<u32> = self.entries.iter().map(|e| simplicity(e.candidate.spec.name)).collect();
        let (fastest, pick, tied) = pick(&rows, &ranks);
        for i in tied {
            if let Some(r) = rows.get_mut(i) {
                r.tied = true;
            }
        }
        SweepResult {
            setting: setting.clone(),
            run_seeds: self.run_seeds.clone(),
            split_seeds: self.split_seeds.clone(),
            rows,
            fastest,
            pick,
            speedup_lower_bound,
            extended,
            candidates: self.candidates(),
        }
    }
}

/// How many gradients `spec` averages per step of the reference learning rate `η` with
/// `workers` workers, given the gradients it applied per update: the learning rates are
/// normalised so that ASP, SSP and grouped (linear scaling) move the model `η / n` per
/// gradient, as BSP does (`n`); grouped with `sqrt` scaling `√(n_g n)`; every other
/// protocol takes a step of `η` per update, averaging the gradients it applied.
pub fn effective_batch(spec: &ProtocolSpec, workers: u32, per_update: f64) -> f64 {
    let n = f64::from(workers);
    match spec.name {
        ProtocolKind::Asp | ProtocolKind::Ssp => n,
        ProtocolKind::Grouped => match spec.group_lr_scaling.unwrap_or_default() {
            GroupLrScaling::Linear => n,
            GroupLrScaling::None => per_update,
            GroupLrScaling::Sqrt => (per_update * n).sqrt(),
        },
        _ => per_update,
    }
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

/// A row measured at `times` (every seed reached the target), nothing else set: for tests.
#[cfg(test)]
pub(crate) fn test_row(times: &[f64]) -> Measured {
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
        gradients_per_update: 0.0,
        effective_batch: 0.0,
        stopped_early: None,
        extension: false,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_pick_is_the_simplest_of_the_tied_and_never_a_measurably_slower_one() {
        // Row 1 is fastest; row 0 (simpler) is tied and within 5%: picked.
        let rows = [test_row(&[1.02, 1.05, 0.99]), test_row(&[1.0, 1.01, 1.0]), test_row(&[1.5, 1.5, 1.5])];
        let (fastest, picked, tied) = pick(&rows, &[0, 1, 2]);
        assert_eq!((fastest, picked), (Some(1), Some(0)));
        assert_eq!(tied, [0, 1]);
        // Consistently 4% slower on every pair: not tied, the fastest is picked.
        let rows = [test_row(&[1.04, 1.144, 1.248]), test_row(&[1.0, 1.1, 1.2])];
        assert_eq!(pick(&rows, &[0, 1]), (Some(1), Some(1), vec![1]));
        // A candidate that missed on one pair is never picked.
        let mut missed = test_row(&[0.5, 0.5, 0.5]);
        missed.reached = 2;
        let rows = [missed, test_row(&[1.0, 1.0, 1.0])];
        assert_eq!(pick(&rows, &[0, 1]).1, Some(1));
    }

    #[test]
    fn a_measurably_dominated_candidate_is_stopped_early_whatever_the_threads() {
        use crate::advise::{Options, tracegen};
        let steps = tracegen::generate(tracegen::Kind::DeadNode, 4, 80, 0.01, 1);
        let trace = TraceTable::from_steps(&steps).unwrap();
        let setting = Setting::for_trace(&trace, &Options::default()).unwrap();
        let plain = |name| Candidate { spec: ProtocolSpec::new(name), median_multiple: None };
        let mut backup = plain(ProtocolKind::Backup);
        backup.spec.backup_workers = Some(1);
        let cs = [plain(ProtocolKind::Bsp), backup];
        let run = |jobs| sweep(&trace, &cs, &setting, &[1, 2], &[11, 12], jobs, &|| {}).unwrap();
        let r = run(1);
        // BSP waits for the node ten times slower: stopped once its lower bound is over 1.25x.
        let bsp = &r.rows[0];
        let s = bsp.stopped_early.as_ref().expect("BSP stopped early");
        assert_eq!((bsp.reached, s.by.as_str()), (0, "backup b=1"));
        assert!(s.at_s < setting.budget_s && s.lower_bound_s > (1.0 + STOP_BEYOND) * s.by_mean_s, "{s:?}");
        assert_eq!(r.pick, Some(1));
        assert!(r.table().contains("stopped at"), "{}", r.table());
        // BSP's time is a lower bound, and so is the speedup over it.
        assert!(r.speedup_lower_bound && r.rows[1].speedup_vs_bsp.is_some_and(|x| x > 1.0 + STOP_BEYOND));
        let again = run(3);
        assert_eq!(format!("{:?}", again.rows), format!("{:?}", r.rows));
    }
}
