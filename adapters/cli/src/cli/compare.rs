//! `syncopate compare`: every protocol of a scenario in the simulator, a table and a plot
//! (`syncopate advise` is in [`super::advise`]).

use super::failure::Failure;
use super::output::outln;
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
    /// Write an SVG plot (FILE.svg): accuracy over virtual time, the median over seeds with
    /// a band, time to target per run, and DBW's backup workers over time.
    #[arg(long, value_name = "FILE.svg")]
    pub plot: Option<PathBuf>,
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
    #[serde(skip_serializing_if = "Option::is_none")]
    dbw_against_static: Option<Vec<compare::DbwAtTarget>>,
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

fn with_trace(mut s: Scenario, trace: &std::path::Path, steps: &[crate::trace::Step]) -> Result<Scenario, Failure> {
    let models = crate::sim::compute_models(steps, s.workers, &trace.display().to_string()).map_err(Failure::Usage)?;
    let mean_ms = steps.iter().map(|x| x.seconds).sum::<f64>() / steps.len().max(1) as f64 * 1000.0;
    let slowest_ms = steps.iter().map(|x| x.seconds).fold(0.0f64, f64::max) * 1000.0;
    s.name = format!(
        "trace {} ({} workers, {} steps, mean step {mean_ms:.2} ms, slowest {slowest_ms:.2} ms)",
        trace.display(),
        s.workers,
        steps.len()
    );
    s.compute = models;
    // Runs with their own stragglers are references for the scenario's stragglers, not
    // for a replayed trace.
    s.runs.retain(|run| run.compute.is_none());
    s.check_event_budget().map_err(|e| Failure::Usage(format!("{}: {e}", trace.display())))?;
    Ok(s)
}

fn read_trace(trace: &std::path::Path) -> Result<Vec<crate::trace::Step>, Failure> {
    super::paths::input("--trace", trace).map_err(Failure::Usage)?;
    crate::trace::read(trace).map_err(Failure::Usage)
}

/// Checks an output path before the run: `.svg` only, and a file that can be created.
pub(super) fn open_plot(path: &std::path::Path) -> Result<std::fs::File, Failure> {
    if path.extension().and_then(|e| e.to_str()).is_none_or(|e| !e.eq_ignore_ascii_case("svg")) {
        return Err(Failure::Usage(format!(
            "invalid value '{}' for '--plot': the plot is SVG; name the file FILE.svg",
            path.display()
        )));
    }
    std::fs::File::create(path)
        .map_err(|e| Failure::Usage(format!("invalid value '{}' for '--plot': cannot create it: {e}", path.display())))
}

fn execute(s: &Scenario, jobs: Option<u32>, json: bool) -> Result<Comparison, Failure> {
    let jobs = jobs.map_or_else(|| std::thread::available_parallelism().map_or(2, |n| n.get()), |j| j as usize);
    let total = s.runs.len() as u64 * u64::from(s.seeds.max(1));
    let bar = super::progress::progress_bar(total, json);
    bar.set_message(s.name.clone());
    let lines = super::progress::ProgressLines::new("compare", "simulations", total, json);
    let result = compare::run(s, None, jobs, &|_| {
        bar.inc(1);
        lines.one_done();
    })
    .map_err(Failure::Run);
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
            dbw_against_static: c.dbw_against_static(),
        };
        match serde_json::to_string(&out) {
            Ok(s) => outln!("{s}"),
            Err(e) => eprintln!("error: cannot encode JSON: {e}"),
        }
    } else {
        outln!("{}\n{}", c.scenario, c.table().trim_end());
        let dbw = c.dbw_table();
        if !dbw.is_empty() {
            outln!("{}", dbw.trim_end());
        }
    }
}

/// Runs `syncopate compare`.
pub(super) fn run(args: &CompareArgs) -> Result<(), Failure> {
    let mut s = scenario(args.scenario.as_ref(), args.preset.as_deref())?;
    if let Some(trace) = &args.trace {
        s = with_trace(s, trace, &read_trace(trace)?)?;
    }
    let plot = args.plot.as_deref().map(open_plot).transpose()?;
    let c = execute(&s, args.jobs, args.json)?;
    if let (Some(path), Some(mut file)) = (&args.plot, plot) {
        use std::io::Write as _;
        let svg = crate::plot::comparison_svg(&c).map_err(|e| Failure::Run(format!("{}: {e}", path.display())))?;
        file.write_all(svg.as_bytes())
            .map_err(|e| Failure::Run(format!("{}: cannot write the plot: {e}", path.display())))?;
    }
    print(&c, args.json);
    if let Some(path) = &args.plot {
        if !args.json {
            outln!("plot written to {}", path.display());
        }
    }
    Ok(())
}
