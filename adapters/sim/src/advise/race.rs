//! Running the candidates of one sweep and picking among them.

use super::stats::{self, Interval};
use super::{Candidate, Setting, TIE_ALWAYS, TIE_WITHIN, TraceTable, simplicity};
use crate::scenario::ProtocolName;
use crate::sim::{self, SimConfig, SimReport};
use crate::workload::Workload;
use serde::Serialize;
use std::sync::Mutex;
use std::sync::atomic::{AtomicUsize, Ordering};

/// Stack size of a simulation thread.
const SIM_STACK: usize = 64 << 20;

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
                ProtocolName::Backup => c.spec.backup_workers.map(u64::from),
                ProtocolName::Ssp => c.spec.staleness,
                ProtocolName::Grouped => c.spec.groups.map(u64::from),
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
    let bsp = candidates.iter().position(|c| c.spec.name == ProtocolName::Bsp);
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

#[cfg(test)]
mod tests {
    use super::*;

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
}
