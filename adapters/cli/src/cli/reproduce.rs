//! `syncopate reproduce [dbw|wbsp|bap|grouped|all] [--quick] [--json] [--plot DIR]`: each
//! paper's experiment in the simulator, over several seeds, as the tables of REPRODUCTION.md
//! (mean ± standard error, each table naming the command that made it).
//!
//! The settings of every experiment are written out in the functions below and in
//! REPRODUCTION.md; `--quick` shortens the budgets and drops some configurations (for CI);
//! both use seeds 1–5.

use super::failure::Failure;
use crate::scenario::reproduction::{
    DBW_BATCH, DBW_HELD_OUT_SEEDS, DBW_LR, DBW_N, GROUPED_STRAGGLERS, MLP_BATCH, MLP_LR, NQM_DIM, NQM_POOL,
    WBSP_MULTIPLES, acc_ladder, bap_bsp, bap_protocols, bap_scenarios, dbw_adaptive, dbw_ladder, dbw_run,
    dbw_scenarios, dbw_static, grouped_bsp, grouped_compute, grouped_protocol, mlp_run, wbsp_compute, wbsp_protocols,
};
use crate::sim::{self, ComputeModel, SimConfig, SimReport, Target};
use crate::workload::Workload;
use clap::{Args, ValueEnum};
use serde::Serialize;
use std::fmt::Write as _;
use std::path::{Path, PathBuf};
use std::sync::Mutex;
use std::sync::atomic::{AtomicUsize, Ordering};
use syncopate::proto::grouped::LrScaling;
use syncopate::{Duration, ProtocolConfig, ServerEvent};

/// Which experiment.
#[derive(Clone, Copy, Debug, PartialEq, Eq, ValueEnum)]
pub enum Which {
    /// Dynamic backup workers on the noisy quadratic model.
    Dbw,
    /// Worker-busy synchronous parallel, H1/H2/H3.
    Wbsp,
    /// Bounded asynchronous parallel, transient and persistent delays.
    Bap,
    /// Grouped hybrid, +300% and +900% stragglers.
    Grouped,
    /// All four.
    All,
}

/// Flags of `syncopate reproduce`.
#[derive(Clone, Debug, Args)]
pub struct ReproduceArgs {
    /// The experiment.
    #[arg(value_enum, default_value = "all")]
    pub which: Which,
    /// Short budgets and fewer configurations (5 seeds), for CI.
    #[arg(long)]
    pub quick: bool,
    /// Print the tables as one JSON object on stdout instead of Markdown.
    #[arg(long)]
    pub json: bool,
    /// Write plots (SVG) and the b_t trajectories (CSV) into this directory.
    #[arg(long, value_name = "DIR")]
    pub plot: Option<PathBuf>,
    /// Seeds to run, `FIRST-LAST` (default 1-5, the seeds of REPRODUCTION.md); other ranges
    /// check that a result does not depend on the seeds it was tuned on.
    #[arg(long, value_name = "FIRST-LAST", value_parser = parse_seeds, default_value = "1-5")]
    pub seeds: SeedRange,
    /// Simulations to run at once (default: the machine's cores).
    #[arg(long, value_parser = clap::value_parser!(u32).range(1..=256))]
    pub jobs: Option<u32>,
}

/// One table of results.
#[derive(Clone, Debug, Serialize)]
pub(super) struct Table {
    /// Title.
    pub title: String,
    /// The command that makes it.
    pub command: String,
    /// Settings, in words.
    pub settings: String,
    /// Column names.
    pub header: Vec<String>,
    /// Cells.
    pub rows: Vec<Vec<String>>,
    /// Remarks computed from the numbers (e.g. the DBW ratio per rung).
    pub notes: Vec<String>,
}

impl Table {
    fn markdown(&self) -> String {
        let mut s = format!("### {}\n\n`{}`\n\n{}\n\n", self.title, self.command, self.settings);
        let _ = writeln!(s, "| {} |", self.header.join(" | "));
        let _ = writeln!(s, "|{}", "---|".repeat(self.header.len()));
        for r in &self.rows {
            let _ = writeln!(s, "| {} |", r.join(" | "));
        }
        for n in &self.notes {
            let _ = writeln!(s, "\n{n}");
        }
        s
    }
}

/// Mean and standard error of the seeds that reached a target, and how many did.
#[derive(Clone, Copy, Debug, Serialize)]
struct Stat {
    mean: f64,
    se: f64,
    reached: usize,
    seeds: usize,
}

impl Stat {
    fn of(xs: &[Option<f64>]) -> Self {
        let got: Vec<f64> = xs.iter().flatten().copied().collect();
        let n = got.len();
        let mean = if n > 0 { got.iter().sum::<f64>() / n as f64 } else { f64::NAN };
        let se = if n > 1 {
            (got.iter().map(|x| (x - mean).powi(2)).sum::<f64>() / (n - 1) as f64 / n as f64).sqrt()
        } else {
            0.0
        };
        Self { mean, se, reached: n, seeds: xs.len() }
    }

    /// Complete: every seed reached it.
    fn complete(&self) -> bool {
        self.reached == self.seeds && self.seeds > 0
    }

    fn cell(&self) -> String {
        match (self.reached, self.seeds) {
            (0, _) => "—".into(),
            (r, s) if r == s => format!("{:.3} ± {:.3}", self.mean, self.se),
            (r, s) => format!("{:.3} ± {:.3} ({r}/{s})", self.mean, self.se),
        }
    }
}

/// A range of seeds, `first..=last` (`--seeds`). Seeds 1–5 for both the quick and the full
/// run by default (the full run differs in budgets and in the configurations swept).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct SeedRange {
    first: u64,
    last: u64,
}

impl SeedRange {
    fn list(self) -> Vec<u64> {
        (self.first..=self.last).collect()
    }

    /// `1–5` as the tables write it.
    fn label(self) -> String {
        format!("{}–{}", self.first, self.last)
    }
}

/// Parses `FIRST-LAST` (1 ≤ FIRST ≤ LAST, at most 100 seeds).
fn parse_seeds(text: &str) -> Result<SeedRange, String> {
    let bad = || format!("`{text}`: expected FIRST-LAST, e.g. 6-10 (at most 100 seeds)");
    let (a, b) = text.split_once('-').ok_or_else(bad)?;
    let (first, last): (u64, u64) = (a.trim().parse().map_err(|_| bad())?, b.trim().parse().map_err(|_| bad())?);
    if first == 0 || first > last || last - first >= 100 {
        return Err(bad());
    }
    Ok(SeedRange { first, last })
}

/// Runs every `(config, workload)` job on `jobs` threads, results in order.
fn run_all(jobs: usize, work: Vec<(SimConfig, Workload)>) -> Vec<SimReport> {
    let next = AtomicUsize::new(0);
    let out: Mutex<Vec<Option<SimReport>>> = Mutex::new(vec![None; work.len()]);
    std::thread::scope(|s| {
        for _ in 0..jobs.clamp(1, work.len().max(1)) {
            let builder = std::thread::Builder::new().name("reproduce".into()).stack_size(64 << 20);
            let _ = builder.spawn_scoped(s, || {
                loop {
                    let i = next.fetch_add(1, Ordering::Relaxed);
                    let Some((config, workload)) = work.get(i) else { break };
                    let report = sim::run(config, workload);
                    if let Ok(mut o) = out.lock() {
                        o[i] = Some(report);
                    }
                }
            });
        }
    });
    out.into_inner().unwrap_or_default().into_iter().flatten().collect()
}

/// Builds one run: the protocol, the seed and the compute models in, the simulator's
/// config and the workload out.
type Setup<'a> = &'a dyn Fn(ProtocolConfig, u64, &[ComputeModel]) -> (SimConfig, Workload);

/// A labelled configuration, run over every seed.
struct Arm {
    label: String,
    protocol: Box<dyn Fn(u64) -> ProtocolConfig>,
    compute: Vec<ComputeModel>,
}

/// Runs the arms over the seeds; returns per arm, per seed, the reports.
fn run_arms(jobs: usize, arms: &[Arm], seeds: &[u64], setup: Setup<'_>) -> Vec<Vec<SimReport>> {
    let mut work = Vec::new();
    for arm in arms {
        for &seed in seeds {
            work.push(setup((arm.protocol)(seed), seed, &arm.compute));
        }
    }
    let mut reports = run_all(jobs, work).into_iter();
    arms.iter().map(|_| seeds.iter().filter_map(|_| reports.next()).collect()).collect()
}

fn ladder_stats(reports: &[SimReport], ladder: &[Target]) -> Vec<Stat> {
    ladder.iter().map(|t| Stat::of(&reports.iter().map(|r| r.time_to(*t)).collect::<Vec<_>>())).collect()
}

fn ladder_header(first: &str, ladder: &[Target], extra: &[&str]) -> Vec<String> {
    let mut h = vec![first.to_string()];
    h.extend(ladder.iter().map(|t| format!("time to {t} (s)")));
    h.extend(extra.iter().map(|s| s.to_string()));
    h
}

// ---------------------------------------------------------------------------------------
// DBW
// ---------------------------------------------------------------------------------------

fn dbw_setup(budget: Duration) -> impl Fn(ProtocolConfig, u64, &[ComputeModel]) -> (SimConfig, Workload) {
    move |p, seed, compute| dbw_run(p, seed, compute, budget)
}

/// The best schedule that switches `b` once, from the static runs' mean ladder times: run
/// `b1` until rung `j`, then `b2` from its own time at rung `j` (assumes `b2`'s progress
/// from a loss level does not depend on how it got there). Returns, per rung, the time.
fn switch_once(static_means: &[Vec<f64>], rungs: usize) -> Vec<f64> {
    (0..rungs)
        .map(|r| {
            let mut best = f64::INFINITY;
            for a in static_means {
                best = best.min(a[r]);
                for j in 0..r {
                    for b in static_means {
                        let t = a[j] + (b[r] - b[j]);
                        if t.is_finite() {
                            best = best.min(t);
                        }
                    }
                }
            }
            best
        })
        .collect()
}

/// The best complete static arm per rung: `(index, mean)`.
fn best_static(statics: &[Vec<Stat>], rung: usize) -> Option<(usize, f64)> {
    statics
        .iter()
        .enumerate()
        .filter(|(_, st)| st[rung].complete())
        .map(|(i, st)| (i, st[rung].mean))
        .min_by(|a, b| a.1.total_cmp(&b.1))
}

/// DBW's mean over `reference`, or why there is no ratio.
fn ratio_cell(dbw: &Stat, reference: Option<f64>) -> String {
    match reference {
        Some(r) if dbw.complete() => format!("{:.2}×", dbw.mean / r),
        Some(_) => format!("missed ({}/{})", dbw.reached, dbw.seeds),
        None => "—".into(),
    }
}

fn dbw(quick: bool, jobs: usize, seed_range: SeedRange, plot: Option<&Path>) -> Result<Vec<Table>, String> {
    let seeds = seed_range.list();
    // The held-out seeds: DBW's defaults were tuned on seeds 1–5 only. Skipped in the quick
    // run (CI) and when the seeds asked for are themselves held-out ones.
    let held_out: Vec<u64> = if quick || seeds.iter().any(|s| DBW_HELD_OUT_SEEDS.contains(s)) {
        Vec::new()
    } else {
        DBW_HELD_OUT_SEEDS.collect()
    };
    let held_label = format!("{}–{}", DBW_HELD_OUT_SEEDS.start(), DBW_HELD_OUT_SEEDS.end());
    let ladder = dbw_ladder();
    let bs: Vec<u32> = if quick { vec![0, 2, 4, 6, 8, 10, 12, 14, 15] } else { (0..DBW_N).collect() };
    let mut tables = Vec::new();
    for (name, compute, budget) in dbw_scenarios(quick) {
        let mut arms: Vec<Arm> = bs
            .iter()
            .map(|&b| Arm {
                label: if b == 0 { "b = 0 (BSP)".into() } else { format!("b = {b}") },
                protocol: Box::new(move |_| dbw_static(b)),
                compute: compute.clone(),
            })
            .collect();
        arms.push(Arm { label: "**DBW**".into(), protocol: Box::new(|_| dbw_adaptive()), compute: compute.clone() });
        let reports = run_arms(jobs, &arms, &seeds, &dbw_setup(budget));
        let stats: Vec<Vec<Stat>> = reports.iter().map(|r| ladder_stats(r, &ladder)).collect();
        let mut rows: Vec<Vec<String>> = arms
            .iter()
            .zip(&stats)
            .map(|(a, st)| std::iter::once(a.label.clone()).chain(st.iter().map(Stat::cell)).collect())
            .collect();
        // Best static per rung (complete arms only), DBW's ratio, and the switch-once bound.
        let statics = &stats[..bs.len()];
        let dbw_stats = &stats[bs.len()];
        let means: Vec<Vec<f64>> = statics
            .iter()
            .map(|st| st.iter().map(|s| if s.complete() { s.mean } else { f64::INFINITY }).collect())
            .collect();
        let mut best_row = vec!["best static b (in hindsight)".to_string()];
        let mut ratio_row = vec!["DBW / best static".to_string()];
        let mut switch_row = vec!["best switch-once schedule".to_string()];
        let mut headroom_row = vec!["best static / best switch-once".to_string()];
        let sw = switch_once(&means, ladder.len());
        for r in 0..ladder.len() {
            let best = best_static(statics, r);
            match best {
                Some((i, mean)) => best_row.push(format!("b = {}: {mean:.3}", bs[i])),
                None => best_row.push("none reached".into()),
            }
            ratio_row.push(ratio_cell(&dbw_stats[r], best.map(|b| b.1)));
            switch_row.push(if sw[r].is_finite() { format!("{:.3}", sw[r]) } else { "—".into() });
            headroom_row.push(match best {
                Some((_, mean)) if sw[r].is_finite() && sw[r] > 0.0 => format!("{:.2}×", mean / sw[r]),
                _ => "—".into(),
            });
        }
        rows.push(best_row);
        rows.push(ratio_row);
        rows.push(switch_row);
        rows.push(headroom_row);
        if !held_out.is_empty() {
            let held = run_arms(jobs, &arms, &held_out, &dbw_setup(budget));
            let held_stats: Vec<Vec<Stat>> = held.iter().map(|r| ladder_stats(r, &ladder)).collect();
            let (held_statics, held_dbw) = (&held_stats[..bs.len()], &held_stats[bs.len()]);
            let mut held_best = vec![format!("held out (seeds {held_label}): best static b in hindsight")];
            let mut held_ratio = vec![format!("held out: DBW / best static in hindsight")];
            let mut fair_ratio = vec![format!("held out: DBW / the b best on seeds {}", seed_range.label())];
            for r in 0..ladder.len() {
                let best = best_static(held_statics, r);
                held_best.push(match (best, held_dbw[r].complete()) {
                    (Some((i, mean)), true) => format!("b = {}: {mean:.3} (DBW {:.3})", bs[i], held_dbw[r].mean),
                    (Some((i, mean)), false) => format!("b = {}: {mean:.3}", bs[i]),
                    (None, _) => "none reached".into(),
                });
                held_ratio.push(ratio_cell(&held_dbw[r], best.map(|b| b.1)));
                let tuned = best_static(statics, r).map(|(i, _)| i);
                let fair = tuned.and_then(|i| held_statics[i][r].complete().then_some(held_statics[i][r].mean));
                fair_ratio.push(ratio_cell(&held_dbw[r], fair));
            }
            rows.push(held_best);
            rows.push(held_ratio);
            rows.push(fair_ratio);
        }
        // b_t of DBW, seed 1.
        let trajectory = dbw_trajectory(&compute, budget, seed_range.first);
        let mean_b = trajectory.iter().map(|(_, b)| f64::from(*b)).sum::<f64>() / trajectory.len().max(1) as f64;
        let mut notes = vec![format!(
            "DBW's b_t (seed {}): mean {mean_b:.1} over {} iterations; {}",
            seed_range.first,
            trajectory.len(),
            summarize_bt(&trajectory)
        )];
        if let Some(dir) = plot {
            let slug: String = name
                .split_whitespace()
                .next()
                .unwrap_or("x")
                .chars()
                .filter(|c| c.is_alphanumeric() || *c == '-')
                .collect();
            let csv = dir.join(format!("dbw_bt_{slug}.csv"));
            let mut text = String::from("time_s,b\n");
            for (t, b) in &trajectory {
                let _ = writeln!(text, "{t:.4},{b}");
            }
            std::fs::write(&csv, text).map_err(|e| format!("{}: cannot write: {e}", csv.display()))?;
            let svg = dir.join(format!("dbw_bt_{slug}.svg"));
            let points: Vec<(f64, f64)> = trajectory.iter().map(|(t, b)| (*t, f64::from(*b))).collect();
            crate::plot::trajectory_svg(
                &svg,
                &format!("DBW backup workers b_t, {name} (seed {})", seed_range.first),
                "b_t",
                &points,
            )?;
            notes.push(format!("b_t plotted in `{}`.", svg.display()));
        }
        tables.push(Table {
            title: format!("DBW — {name}"),
            command: format!("syncopate reproduce dbw{}", if quick { " --quick" } else { "" }),
            settings: format!(
                "16 workers, noisy quadratic model (d = {NQM_DIM}, h_i = 1/i, batch {DBW_BATCH}, noise pool {NQM_POOL}), \
                 constant lr {DBW_LR}, static b via backup workers (option A), DBW defaults with the workers' loss reports used, {} s virtual budget, \
                 evaluation every 10 ms, seeds {}{}. Times: mean ± s.e. over the seeds that reached the rung \
                 (r/s when not all did; — none).",
                budget.as_secs_f64(),
                seed_range.label(),
                if held_out.is_empty() {
                    String::new()
                } else {
                    format!("; held out (DBW's defaults were tuned on seeds 1–5 only): seeds {held_label}")
                }
            ),
            header: ladder_header("config", &ladder, &[]),
            rows,
            notes,
        });
    }
    Ok(tables)
}

fn dbw_trajectory(compute: &[ComputeModel], budget: Duration, seed: u64) -> Vec<(f64, u32)> {
    let (config, workload) = dbw_run(dbw_adaptive(), seed, compute, budget);
    let mut out = Vec::new();
    sim::run_observed(&config, &workload, &mut |o| {
        if let sim::Observation::Server { at, event: ServerEvent::BackupChosen { k, .. } } = o {
            out.push((at.as_nanos() as f64 / 1e9, DBW_N - *k));
        }
    });
    out
}

fn summarize_bt(t: &[(f64, u32)]) -> String {
    let tenth = (t.len() / 10).max(1);
    let parts: Vec<String> = t
        .chunks(tenth)
        .take(10)
        .map(|c| {
            let m = c.iter().map(|(_, b)| f64::from(*b)).sum::<f64>() / c.len() as f64;
            format!("{m:.1}")
        })
        .collect();
    format!("by tenths of the run: {}", parts.join(", "))
}

// ---------------------------------------------------------------------------------------
// WBSP, BAP, grouped: the non-convex model on mnist5k
// ---------------------------------------------------------------------------------------

fn mlp_setup(
    budget: Duration,
    eval: Duration,
    stop_at: Option<f64>,
) -> impl Fn(ProtocolConfig, u64, &[ComputeModel]) -> (SimConfig, Workload) {
    move |p, seed, compute| mlp_run(p, seed, compute, budget, eval, stop_at)
}

fn arm(label: &str, compute: &[ComputeModel], p: impl Fn(u64) -> ProtocolConfig + 'static) -> Arm {
    Arm { label: label.into(), protocol: Box::new(p), compute: compute.to_vec() }
}

fn wbsp(quick: bool, jobs: usize, seed_range: SeedRange) -> Vec<Table> {
    let seeds = seed_range.list();
    let ladder = acc_ladder();
    let top = ladder.last().and_then(|t| if let Target::Accuracy(a) = t { Some(*a) } else { None });
    let mut tables = Vec::new();
    let settings: &[(&str, u64)] = if quick { &WBSP_MULTIPLES[..1] } else { &WBSP_MULTIPLES };
    for &(h, m) in settings {
        let compute = wbsp_compute(m);
        let arms: Vec<Arm> = wbsp_protocols().into_iter().map(|(label, p)| arm(label, &compute, move |_| p)).collect();
        let budget = Duration::from_secs(if quick { 60 } else { 240 });
        let reports = run_arms(jobs, &arms, &seeds, &mlp_setup(budget, Duration::from_millis(500), top));
        let rows = arms
            .iter()
            .zip(&reports)
            .map(|(a, r)| {
                let mut row = vec![a.label.clone()];
                row.extend(ladder_stats(r, &ladder).iter().map(Stat::cell));
                let share = Stat::of(&r.iter().map(|x| Some(x.mean_compute_share * 100.0)).collect::<Vec<_>>());
                row.push(format!("{:.0} ± {:.0}%", share.mean, share.se));
                row
            })
            .collect();
        tables.push(Table {
            title: format!("WBSP — {h}: odd workers +{m}× the base step"),
            command: format!("syncopate reproduce wbsp{}", if quick { " --quick" } else { "" }),
            settings: format!(
                "8 workers, 10 ms base step, odd-index workers sleep {m} × 10 ms extra per local step; MLP (784-32-10) \
                 on mnist5k (4,000/1,000 split), lr {MLP_LR} (ASP lr/8 per gradient), batch {MLP_BATCH}, budget {} s, \
                 evaluation every 0.5 s, stop at {:.2}; seeds {}.",
                budget.as_secs_f64(),
                top.unwrap_or(0.0),
                seed_range.label()
            ),
            header: ladder_header("protocol", &ladder, &["compute share"]),
            rows,
            notes: Vec::new(),
        });
    }
    tables
}

fn bap(quick: bool, jobs: usize, seed_range: SeedRange) -> Vec<Table> {
    let seeds = seed_range.list();
    let ladder = acc_ladder();
    let top = ladder.last().and_then(|t| if let Target::Accuracy(a) = t { Some(*a) } else { None });
    let ss: &[u64] = if quick { &[1, 4] } else { &[1, 2, 4] };
    let mut tables = Vec::new();
    for (name, compute) in bap_scenarios() {
        let mut arms = vec![arm("BSP", &compute, move |_| bap_bsp())];
        for &s in ss {
            arms.extend(bap_protocols(s).into_iter().map(|(label, p)| arm(&label, &compute, move |_| p)));
        }
        let budget = Duration::from_secs(if quick { 10 } else { 60 });
        let reports = run_arms(jobs, &arms, &seeds, &mlp_setup(budget, Duration::from_millis(250), top));
        let bsp_top =
            Stat::of(&reports[0].iter().map(|r| top.and_then(|t| r.time_to(Target::Accuracy(t)))).collect::<Vec<_>>());
        let rows = arms
            .iter()
            .zip(&reports)
            .map(|(a, r)| {
                let mut row = vec![a.label.clone()];
                let st = ladder_stats(r, &ladder);
                row.extend(st.iter().map(Stat::cell));
                let last = st.last().copied();
                row.push(match last {
                    Some(l) if l.complete() && bsp_top.complete() => format!("{:.2}×", bsp_top.mean / l.mean),
                    _ => "—".into(),
                });
                let ratio = Stat::of(
                    &r.iter()
                        .map(|x| {
                            (x.mean_compute_share < 1.0).then(|| x.mean_compute_share / (1.0 - x.mean_compute_share))
                        })
                        .collect::<Vec<_>>(),
                );
                row.push(format!("{:.1}", ratio.mean));
                row
            })
            .collect();
        tables.push(Table {
            title: format!("BAP and SSP — {name}"),
            command: format!("syncopate reproduce bap{}", if quick { " --quick" } else { "" }),
            settings: format!(
                "8 workers, 10 ms base step; MLP (784-32-10) on mnist5k, lr {MLP_LR}, batch {MLP_BATCH}, budget {} s, \
                 evaluation every 0.25 s, stop at {:.2}; iteration limit t_max = 20 ms (2× the base step); seeds {}. \
                 Speedup = BSP's mean time to the last rung over the protocol's; compute/wait = compute share / \
                 (1 − compute share), averaged over workers and seeds.",
                budget.as_secs_f64(),
                top.unwrap_or(0.0),
                seed_range.label()
            ),
            header: ladder_header("protocol", &ladder, &["speedup over BSP", "compute/wait"]),
            rows,
            notes: Vec::new(),
        });
    }
    tables
}

fn grouped(quick: bool, jobs: usize, seed_range: SeedRange) -> Vec<Table> {
    let seeds = seed_range.list();
    let ladder = acc_ladder();
    let gs: &[u32] = if quick { &[1, 4, 16] } else { &[1, 2, 4, 8, 16] };
    let budget = Duration::from_secs(if quick { 5 } else { 12 });
    let mut tables = Vec::new();
    for (name, factor) in GROUPED_STRAGGLERS {
        let compute = grouped_compute(factor);
        let mut arms =
            vec![arm("BSP, no delay", &[], move |_| grouped_bsp()), arm("BSP", &compute, move |_| grouped_bsp())];
        for (scaling, tag) in [(LrScaling::None, "None"), (LrScaling::Linear, "Linear")] {
            for &g in gs {
                arms.push(arm(&format!("G = {g}, lr scaling {tag}"), &compute, move |_| grouped_protocol(g, scaling)));
            }
        }
        let reports = run_arms(jobs, &arms, &seeds, &mlp_setup(budget, Duration::from_millis(250), None));
        let rows = arms
            .iter()
            .zip(&reports)
            .map(|(a, r)| {
                let mut row = vec![a.label.clone()];
                row.extend(ladder_stats(r, &ladder).iter().map(Stat::cell));
                let acc = Stat::of(&r.iter().map(|x| Some(x.final_accuracy)).collect::<Vec<_>>());
                row.push(format!("{:.4} ± {:.4}", acc.mean, acc.se));
                row
            })
            .collect();
        tables.push(Table {
            title: format!("Grouped — {name}"),
            command: format!("syncopate reproduce grouped{}", if quick { " --quick" } else { "" }),
            settings: format!(
                "16 workers (worker 0 slowed), 10 ms base step, contiguous groups; MLP (784-32-10) on mnist5k, \
                 lr {MLP_LR}, batch {MLP_BATCH}; lr scaling None = every group steps with lr, Linear = lr·n_g/n; \
                 budget {} s, evaluation every 0.25 s; seeds {}.",
                budget.as_secs_f64(),
                seed_range.label()
            ),
            header: ladder_header("run", &ladder, &["accuracy at the budget"]),
            rows,
            notes: Vec::new(),
        });
    }
    tables
}

#[derive(Serialize)]
struct Json<'a> {
    quick: bool,
    tables: &'a [Table],
}

/// Runs `syncopate reproduce`.
pub(super) fn run(args: &ReproduceArgs) -> Result<(), Failure> {
    let jobs = args
        .jobs
        .map(|j| j as usize)
        .unwrap_or_else(|| std::thread::available_parallelism().map(|n| n.get()).unwrap_or(1));
    if let Some(dir) = &args.plot {
        std::fs::create_dir_all(dir)
            .map_err(|e| Failure::Usage(format!("--plot {}: cannot create the directory: {e}", dir.display())))?;
    }
    let which = args.which;
    let all = which == Which::All;
    let mut tables = Vec::new();
    if all || which == Which::Dbw {
        tables.extend(dbw(args.quick, jobs, args.seeds, args.plot.as_deref()).map_err(Failure::Run)?);
    }
    if all || which == Which::Wbsp {
        tables.extend(wbsp(args.quick, jobs, args.seeds));
    }
    if all || which == Which::Bap {
        tables.extend(bap(args.quick, jobs, args.seeds));
    }
    if all || which == Which::Grouped {
        tables.extend(grouped(args.quick, jobs, args.seeds));
    }
    if args.json {
        let text = serde_json::to_string_pretty(&Json { quick: args.quick, tables: &tables })
            .map_err(|e| Failure::Run(format!("cannot write JSON: {e}")))?;
        println!("{text}");
    } else {
        for t in &tables {
            println!("{}", t.markdown());
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn stats_and_cells() {
        let s = Stat::of(&[Some(1.0), Some(3.0)]);
        assert_eq!((s.mean, s.reached, s.seeds), (2.0, 2, 2));
        assert!((s.se - 1.0).abs() < 1e-12);
        assert_eq!(s.cell(), "2.000 ± 1.000");
        assert_eq!(Stat::of(&[Some(1.0), None]).cell(), "1.000 ± 0.000 (1/2)");
        assert_eq!(Stat::of(&[None]).cell(), "—");
    }

    #[test]
    fn seed_ranges_parse_and_bad_ones_are_refused() {
        let r = parse_seeds("6-10").unwrap();
        assert_eq!((r.list(), r.label()), (vec![6, 7, 8, 9, 10], "6–10".to_string()));
        assert_eq!(parse_seeds("3-3").unwrap().list(), vec![3]);
        for bad in ["", "5", "0-4", "5-4", "1-101", "a-b", "1-2-3"] {
            assert!(parse_seeds(bad).is_err(), "{bad}");
        }
    }

    #[test]
    fn switch_once_is_never_worse_than_the_best_static_and_uses_a_switch() {
        // Arm 0 fast early, slow late; arm 1 the opposite.
        let a = vec![1.0, 10.0];
        let b = vec![5.0, 7.0];
        let sw = switch_once(&[a, b], 2);
        assert_eq!(sw[0], 1.0);
        // 1.0 (a to rung 0) + (7 − 5) (b from rung 0 to rung 1) = 3.
        assert_eq!(sw[1], 3.0);
        assert_eq!(switch_once(&[vec![f64::INFINITY]], 1)[0], f64::INFINITY);
    }
}
