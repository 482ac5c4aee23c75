//! `syncopate compare` and `syncopate advise`: every protocol of a scenario in the
//! simulator, a table, a plot, and a recommendation.

use super::Failure;
use crate::compare::{self, Comparison};
use crate::scenario::Scenario;
use clap::Args;
use serde::Serialize;
use std::path::PathBuf;

/// Flags of `syncopate compare`.
#[derive(Clone, Debug, Args)]
pub struct CompareArgs {
    /// A scenario file (TOML); without one, the built-in default scenario.
    #[arg(value_name = "SCENARIO.toml")]
    pub scenario: Option<PathBuf>,
    /// A built-in preset instead of a file: dbw, wbsp, bap or grouped (the papers' settings).
    #[arg(long, conflicts_with = "scenario")]
    pub preset: Option<String>,
    /// Replay a recorded step-time trace (from `train --record-trace`) instead of the
    /// scenario's stragglers.
    #[arg(long, value_name = "FILE")]
    pub trace: Option<PathBuf>,
    /// Print the table as one JSON object on stdout.
    #[arg(long)]
    pub json: bool,
    /// Write an SVG plot of test accuracy against virtual time.
    #[arg(long, value_name = "FILE")]
    pub plot: Option<PathBuf>,
    /// Simulations to run at once (default: the machine's cores).
    #[arg(long, value_parser = clap::value_parser!(u32).range(1..=256))]
    pub jobs: Option<u32>,
}

/// Flags of `syncopate advise`.
#[derive(Clone, Debug, Args)]
pub struct AdviseArgs {
    /// The recorded per-worker step times (CSV worker,step,seconds, as `train --record-trace` writes).
    #[arg(long, value_name = "FILE")]
    pub trace: PathBuf,
    /// The protocols and knobs to try (a scenario file); without one, the built-in default
    /// scenario's list. Its worker count must match the trace.
    #[arg(value_name = "SCENARIO.toml")]
    pub scenario: Option<PathBuf>,
    /// Print the table and the recommendation as one JSON object on stdout.
    #[arg(long)]
    pub json: bool,
    /// Simulations to run at once (default: the machine's cores).
    #[arg(long, value_parser = clap::value_parser!(u32).range(1..=256))]
    pub jobs: Option<u32>,
}

#[derive(Serialize)]
struct Json<'a> {
    scenario: &'a str,
    target_accuracy: f64,
    runs: &'a [compare::Row],
    fastest: Option<&'a str>,
}

fn scenario(file: Option<&PathBuf>, preset: Option<&str>) -> Result<Scenario, Failure> {
    match (file, preset) {
        (Some(path), _) => Scenario::load(path).map_err(Failure::Usage),
        (None, Some(name)) => Scenario::preset(name)
            .ok_or_else(|| {
                Failure::Usage(format!("invalid value '{name}' for '--preset': one of dbw, wbsp, bap, grouped"))
            })?
            .map_err(Failure::Run),
        (None, None) => Ok(Scenario::default_scenario()),
    }
}

fn with_trace(mut s: Scenario, trace: &std::path::Path) -> Result<Scenario, Failure> {
    let steps = crate::trace::read(trace).map_err(Failure::Usage)?;
    let models =
        crate::trace::compute_models(&steps, s.workers, &trace.display().to_string()).map_err(Failure::Usage)?;
    s.name = format!("{} (replaying {})", s.name, trace.display());
    s.compute = models.clone();
    for run in &mut s.runs {
        if run.compute.is_some() {
            run.compute = Some(models.clone());
            run.stragglers_note = None;
        }
    }
    Ok(s)
}

fn execute(s: &Scenario, jobs: Option<u32>, json: bool) -> Result<Comparison, Failure> {
    let jobs = jobs.map_or_else(|| std::thread::available_parallelism().map_or(2, |n| n.get()), |j| j as usize);
    let bar = super::progress_bar(s.runs.len() as u64 * u64::from(s.seeds.max(1)), json);
    bar.set_message(s.name.clone());
    let result = compare::run(s, None, jobs, &|_| bar.inc(1)).map_err(Failure::Run);
    bar.finish_and_clear();
    result
}

fn print(c: &Comparison, json: bool) {
    if json {
        let out = Json {
            scenario: &c.scenario,
            target_accuracy: c.target_accuracy,
            runs: &c.rows,
            fastest: c.fastest().map(|r| r.label.as_str()),
        };
        match serde_json::to_string(&out) {
            Ok(s) => println!("{s}"),
            Err(e) => eprintln!("error: cannot encode JSON: {e}"),
        }
    } else {
        println!("{}", c.scenario);
        print!("{}", c.table());
    }
}

/// Runs `syncopate compare`.
pub(super) fn run(args: &CompareArgs) -> Result<(), Failure> {
    let mut s = scenario(args.scenario.as_ref(), args.preset.as_deref())?;
    if let Some(trace) = &args.trace {
        s = with_trace(s, trace)?;
    }
    let c = execute(&s, args.jobs, args.json)?;
    print(&c, args.json);
    if let Some(path) = &args.plot {
        let curves: Vec<_> =
            c.rows.iter().zip(&c.reports).map(|(r, rep)| (r.label.clone(), rep.curve.clone())).collect();
        crate::plot::accuracy_svg(path, &c.scenario, &curves, c.target_accuracy).map_err(Failure::Run)?;
        if !args.json {
            println!("plot written to {}", path.display());
        }
    }
    Ok(())
}

/// Runs `syncopate advise`.
pub(super) fn advise(args: &AdviseArgs) -> Result<(), Failure> {
    let s = with_trace(scenario(args.scenario.as_ref(), None)?, &args.trace)?;
    let c = execute(&s, args.jobs, args.json)?;
    print(&c, args.json);
    if !args.json {
        match c.fastest() {
            Some(best) => {
                let speedup = best.speedup_vs_bsp.map_or(String::new(), |x| format!(", {x:.2}x the speed of BSP"));
                println!(
                    "recommendation: {} reaches {:.2} in {:.3} s of replayed time{speedup}",
                    best.label,
                    c.target_accuracy,
                    best.time_to_target_s.unwrap_or(0.0)
                );
            }
            None => println!(
                "recommendation: none of the runs reached {:.2}; raise max_time_s or lower the target",
                c.target_accuracy
            ),
        }
    }
    Ok(())
}
