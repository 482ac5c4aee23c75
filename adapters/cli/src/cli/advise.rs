//! `syncopate advise` (which protocol and knobs for a recorded trace) and `syncopate
//! trace-gen` (seeded synthetic traces of seven kinds).

use super::failure::Failure;
use super::output::outln;
use crate::scenario::Scenario;
use crate::trace;
use clap::Args;
use serde::Serialize;
use std::path::PathBuf;
use syncopate_sim::advise::{self, Advice, Candidate, Options, TraceTable, WorkloadKind, tracegen};

/// Flags of `syncopate advise`.
#[derive(Clone, Debug, Args)]
pub struct AdviseArgs {
    /// The recorded per-worker step times (CSV worker,step,seconds, as `train --record-trace`
    /// writes): a full table, workers 0..n each with steps 0..S, every pair once. Gradient
    /// columns (loss,grad_norm,mean_norm,mean_of) give the noise scale.
    #[arg(long, value_name = "FILE")]
    pub trace: PathBuf,
    /// The protocols and knobs to try, as written in a scenario file (its stragglers and
    /// budget are not used); without one, the built-in sweep scaled to the trace.
    #[arg(value_name = "SCENARIO.toml")]
    pub scenario: Option<PathBuf>,
    /// What the candidates train: nqm (the noisy quadratic model, target calibrated so the
    /// runs work through 90% of the trace), digits or mnist5k (an accuracy target).
    #[arg(long, default_value = "nqm", value_parser = parse_workload)]
    pub workload: WorkloadKind,
    /// The target: a test loss for nqm (default: calibrated to the trace), a test accuracy
    /// for digits and mnist5k (default 0.90).
    #[arg(long)]
    pub target: Option<f64>,
    /// Virtual seconds per run at most (default: 3x the time BSP needs to replay the trace).
    #[arg(long, value_name = "SECONDS")]
    pub budget: Option<f64>,
    /// Your model's critical batch in examples: its gradient noise scale B = tr(Σ)/|G|²
    /// (McCandlish et al. 2018), measured near the target loss. Sets the NQM's noise so that
    /// its critical batch is B (default: estimated from the trace's gradient columns when it
    /// has them, otherwise the built-in NQM's noise; the report gives B either way).
    #[arg(long, value_name = "EXAMPLES")]
    pub noise_scale: Option<f64>,
    /// Examples per worker gradient on your cluster (converts --noise-scale to gradients).
    #[arg(long, default_value_t = 1, value_parser = clap::value_parser!(u32).range(1..=1_000_000))]
    pub worker_batch: u32,
    /// Critical batches (examples, comma-separated) at which to sweep the whole trace again,
    /// to show how the pick depends on it (nqm only; default: n/10, n and 10n gradients).
    #[arg(long, value_name = "B,B,...", value_delimiter = ',')]
    pub noise_sweep: Option<Vec<f64>>,
    /// Do not sweep again at other critical batches.
    #[arg(long, conflicts_with = "noise_sweep")]
    pub no_noise_sweep: bool,
    /// Do not extend a knob's sweep past its edge when its best value is at the edge.
    #[arg(long)]
    pub no_extend: bool,
    /// Seed pairs per candidate: run seeds SEED.. and data seeds SPLIT_SEED.. (2 to 30).
    #[arg(long, default_value_t = 5, value_parser = clap::value_parser!(u32).range(2..=30))]
    pub seeds: u32,
    /// The first run seed (minibatches).
    #[arg(long, default_value_t = 1)]
    pub seed: u64,
    /// The first data seed (the NQM noise pool, or the train/test split), separate from the
    /// run seed.
    #[arg(long, default_value_t = 1001)]
    pub split_seed: u64,
    /// One-way latency of every server-worker link, in milliseconds.
    #[arg(long, default_value_t = 0.5)]
    pub latency_ms: f64,
    /// Do not sweep the trace's phases on their own.
    #[arg(long)]
    pub no_phases: bool,
    /// Accept workers with unequal step counts by keeping every worker's first S steps, S the
    /// shortest worker's count (without it such a trace is refused).
    #[arg(long)]
    pub truncate: bool,
    /// Print everything as one JSON object on stdout.
    #[arg(long)]
    pub json: bool,
    /// Write an SVG plot (FILE.svg): time to target per candidate with its 95% interval.
    #[arg(long, value_name = "FILE.svg")]
    pub plot: Option<PathBuf>,
    /// Simulations to run at once (default: the machine's cores).
    #[arg(long, value_parser = clap::value_parser!(u32).range(1..=256))]
    pub jobs: Option<u32>,
}

/// Flags of `syncopate trace-gen`.
#[derive(Clone, Debug, Args)]
pub struct TraceGenArgs {
    /// steady, markov, pareto, dead-node, uniform, two-types or regime-change.
    #[arg(value_name = "KIND", value_parser = parse_kind)]
    pub kind: tracegen::Kind,
    /// Workers.
    #[arg(long, default_value_t = 16, value_parser = clap::value_parser!(u32).range(1..=syncopate::MAX_WORKERS as i64))]
    pub workers: u32,
    /// Steps per worker.
    #[arg(long, default_value_t = 2000, value_parser = clap::value_parser!(u64).range(1..=1_000_000))]
    pub steps: u64,
    /// The median step in milliseconds.
    #[arg(long, default_value_t = 10.0)]
    pub step_ms: f64,
    /// The generator's seed.
    #[arg(long, default_value_t = 1)]
    pub seed: u64,
    /// The tail's shape α of `pareto` (smaller: heavier; at most 2 the variance is infinite).
    #[arg(long, default_value_t = tracegen::PARETO_SHAPE)]
    pub shape: f64,
    /// Where to write the trace (CSV worker,step,seconds); `-` for stdout.
    #[arg(long, short, value_name = "FILE")]
    pub out: PathBuf,
}

fn parse_workload(s: &str) -> Result<WorkloadKind, String> {
    s.parse()
}

fn parse_kind(s: &str) -> Result<tracegen::Kind, String> {
    tracegen::Kind::from_name(s)
}

/// Reads `path` as a full table (or, with `truncate`, cut to the shortest worker) and, when
/// the trace has gradient columns, what they tell about the noise scale (over the steps the
/// table keeps).
fn read_table_and_noise(
    path: &std::path::Path,
    truncate: bool,
) -> Result<(TraceTable, Option<advise::MeasuredNoise>), Failure> {
    super::paths::input("--trace", path).map_err(Failure::Usage)?;
    let rows = trace::read_lines_with_stats(path).map_err(Failure::Usage)?;
    let lines: Vec<(usize, trace::Step)> = rows.iter().map(|(line, s, _)| (*line, *s)).collect();
    let (_, steps) = trace::check_table(&lines, &path.display().to_string(), truncate).map_err(Failure::Usage)?;
    let gradients: Vec<(trace::Step, trace::GradientStats)> =
        rows.iter().filter(|(_, s, g)| !g.is_empty() && s.step < steps).map(|(_, s, g)| (*s, *g)).collect();
    let measured = (!gradients.is_empty()).then(|| match advise::noise_estimate::estimate(&gradients, steps) {
        Ok(e) => advise::MeasuredNoise::Estimated(e),
        Err(why) => advise::MeasuredNoise::NotEstimated(why),
    });
    let steps = trace::truncate_to_shortest(lines, steps);
    let table = TraceTable::from_steps(&steps).map_err(|e| Failure::Usage(format!("{}: {e}", path.display())))?;
    Ok((table, measured))
}

/// The fewest steps per worker whose replay `advise` ranks without a caveat.
const FEW_STEPS: u64 = 10;

/// What the ranking of a trace of `workers` workers and `steps` steps per worker cannot
/// tell: one worker waits for no one, so the protocols differ only in hiding the link's
/// latency and in staleness; a few steps are replayed over and over.
fn caveats(workers: u32, steps: u64) -> Vec<String> {
    let mut out = Vec::new();
    if workers < 2 {
        out.push(
            "the trace holds 1 worker: no worker waits for another, so the protocols differ only in hiding the \
             link's latency (--latency-ms) behind computation and in how stale their updates are; the ranking says \
             nothing about stragglers (record 2 or more workers for that)"
                .to_owned(),
        );
    }
    if steps < FEW_STEPS {
        out.push(format!(
            "the trace holds {steps} step(s) per worker: every replay repeats those {} step times; record {FEW_STEPS} \
             or more per worker",
            u64::from(workers) * steps
        ));
    }
    out
}

#[derive(Serialize)]
struct Json<'a> {
    recommendation: Option<&'a str>,
    /// What the ranking cannot tell about this trace.
    caveats: &'a [String],
    #[serde(flatten)]
    advice: &'a Advice,
}

/// Runs `syncopate advise`.
pub(super) fn advise(args: &AdviseArgs) -> Result<(), Failure> {
    if !(args.latency_ms.is_finite() && args.latency_ms >= 0.0) {
        return Err(Failure::Usage(format!("invalid value '{}' for '--latency-ms': not a latency", args.latency_ms)));
    }
    let (table, measured_noise) = read_table_and_noise(&args.trace, args.truncate)?;
    for (flag, v) in args
        .noise_scale
        .iter()
        .map(|&b| ("--noise-scale", b))
        .chain(args.noise_sweep.iter().flatten().map(|&b| ("--noise-sweep", b)))
    {
        if !(v.is_finite() && v > 0.0) {
            return Err(Failure::Usage(format!("invalid value '{v}' for '{flag}': not a positive number of examples")));
        }
    }
    let candidates: Vec<Candidate> = match &args.scenario {
        Some(path) => {
            let s = Scenario::load(path).map_err(Failure::Usage)?;
            let mut c = Vec::new();
            for run in s.runs.iter().filter(|r| r.compute.is_none()) {
                run.spec.config(table.workers, 0.5).map_err(|e| {
                    Failure::Usage(format!(
                        "{}: {}: {e} (the trace has {} workers)",
                        path.display(),
                        run.label(),
                        table.workers
                    ))
                })?;
                c.push(Candidate { spec: run.spec.clone(), median_multiple: None });
            }
            c
        }
        None => {
            let c = advise::candidates(table.workers, table.median_step());
            // Name the protocols a small trace leaves out (they need more workers).
            let names = |c: &[Candidate]| {
                let mut v: Vec<&'static str> = c.iter().map(|c| c.spec.name.as_str()).collect();
                v.dedup();
                v
            };
            let all = advise::candidates(syncopate::MAX_WORKERS as u32, table.median_step());
            let here = names(&c);
            let left_out: Vec<&str> = names(&all).into_iter().filter(|n| !here.contains(n)).collect();
            if !left_out.is_empty() && !args.json {
                eprintln!(
                    "advise: a {}-worker trace leaves out {}: they need more workers",
                    table.workers,
                    left_out.join(", ")
                );
            }
            c
        }
    };
    let plot = args.plot.as_deref().map(super::compare::open_plot).transpose()?;
    let options = Options {
        workload: args.workload,
        target: args.target,
        budget_s: args.budget,
        seed: args.seed,
        split_seed: args.split_seed,
        repeats: args.seeds,
        phases: !args.no_phases,
        network: syncopate_sim::sim::NetworkConfig {
            latency: syncopate::Duration::from_secs_f64(args.latency_ms / 1000.0),
            ..Default::default()
        },
        noise_scale: args.noise_scale,
        worker_batch: args.worker_batch,
        extend: args.scenario.is_none() && !args.no_extend,
        sensitivity: match (&args.noise_sweep, args.no_noise_sweep || args.workload != WorkloadKind::Nqm) {
            (_, true) => Vec::new(),
            (Some(list), false) => list.clone(),
            (None, false) => {
                let gradients = f64::from(table.workers) * f64::from(args.worker_batch);
                vec![gradients / 10.0, gradients, gradients * 10.0]
            }
        },
        measured_noise,
    };
    let jobs = args.jobs.map_or_else(|| std::thread::available_parallelism().map_or(2, |n| n.get()), |j| j as usize);
    // The phases found in the trace add sweeps as they are found: the total is not known.
    let bar = super::progress::progress_counter("simulations", args.json);
    bar.set_message(args.trace.display().to_string());
    let advice = advise::advise(&table, &candidates, &options, jobs, &|| bar.inc(1));
    bar.finish_and_clear();
    let advice = advice.map_err(|e| Failure::Usage(format!("{}: {e}", args.trace.display())))?;
    let caveats = caveats(table.workers, table.steps as u64);
    if let (Some(path), Some(mut file)) = (&args.plot, plot) {
        use std::io::Write as _;
        let svg = crate::plot::advice_svg(&advice).map_err(|e| Failure::Run(format!("{}: {e}", path.display())))?;
        file.write_all(svg.as_bytes())
            .map_err(|e| Failure::Run(format!("{}: cannot write the plot: {e}", path.display())))?;
    }
    if args.json {
        let pick = advice.whole.pick.and_then(|i| advice.whole.rows.get(i)).map(|r| r.label.as_str());
        let out = Json { recommendation: pick, caveats: &caveats, advice: &advice };
        match serde_json::to_string(&out) {
            Ok(s) => outln!("{s}"),
            Err(e) => return Err(Failure::Run(format!("cannot encode JSON: {e}"))),
        }
    } else {
        outln!("{}", advice.report(&args.trace.display().to_string()).trim_end());
        for c in &caveats {
            outln!("caveat: {c}");
        }
        if let Some(path) = &args.plot {
            outln!("plot written to {}", path.display());
        }
    }
    Ok(())
}

/// Runs `syncopate trace-gen`.
pub(super) fn trace_gen(args: &TraceGenArgs) -> Result<(), Failure> {
    let (lo, hi) = crate::scenario::STEP_MS_RANGE;
    if !(args.step_ms.is_finite() && (lo..=hi).contains(&args.step_ms)) {
        return Err(Failure::Usage(format!("invalid value '{}' for '--step-ms': outside {lo}..={hi}", args.step_ms)));
    }
    if !(args.shape.is_finite() && args.shape >= 1.01 && args.shape <= 100.0) {
        return Err(Failure::Usage(format!(
            "invalid value '{}' for '--shape': outside 1.01..=100 (at 1 or below the mean step is infinite)",
            args.shape
        )));
    }
    let rows = u64::from(args.workers) * args.steps;
    if rows > MAX_TRACE_STEPS {
        return Err(Failure::Usage(format!(
            "--workers {} x --steps {} is {rows} steps; a trace holds at most {MAX_TRACE_STEPS} (about {} MB of CSV)",
            args.workers,
            args.steps,
            MAX_TRACE_STEPS * 25 / 1_000_000
        )));
    }
    let to_stdout = args.out.as_os_str() == "-";
    let file = (!to_stdout).then(|| trace::create(&args.out)).transpose().map_err(Failure::Usage)?;
    let steps =
        tracegen::generate_shaped(args.kind, args.workers, args.steps, args.step_ms / 1000.0, args.seed, args.shape);
    let written = match file {
        Some(file) => trace::write_csv(file, &steps),
        None => trace::write_csv(std::io::stdout().lock(), &steps),
    };
    match written {
        Ok(()) => {}
        // A reader that went away (`-o - | head -1`, `-o /dev/stdout | head`) ends it quietly.
        Err(e) if e.kind() == std::io::ErrorKind::BrokenPipe => return Ok(()),
        Err(e) => return Err(Failure::Run(format!("{}: cannot write the trace: {e}", args.out.display()))),
    }
    let line = format!(
        "{}: {} trace, {} workers x {} steps, median step {} ms, seed {}",
        if to_stdout { "stdout".into() } else { args.out.display().to_string() },
        args.kind.name(),
        args.workers,
        args.steps,
        args.step_ms,
        args.seed
    );
    // With the trace on stdout, the line goes to stderr.
    if to_stdout {
        eprintln!("{line}");
    } else {
        outln!("{line}");
    }
    Ok(())
}

/// The most steps (workers x steps per worker) one generated trace may hold: every step is
/// generated in memory before it is written, and `advise` reads a trace whole.
const MAX_TRACE_STEPS: u64 = 10_000_000;
