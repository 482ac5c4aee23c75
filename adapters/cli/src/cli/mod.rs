//! The `syncopate` command line: `train` (threads or the simulator) and the flag groups and
//! summary every subcommand shares.
//!
//! Bad flags, values or files end the program with one line on stderr naming the problem
//! and exit code 2; a failure while running exits with 1.

mod advise;
mod check;
mod compare;
mod group;
mod loss_curve;
mod model_source;
mod mpi;
mod npy;
mod optimizer;
pub(crate) mod output;
mod paths;
mod protocol;
mod reproduce;
mod serve;
mod shard;
mod summary;
mod train;
mod values;
mod work;

pub use check::check_command_line;
pub use protocol::ProtocolArgs;
pub use summary::Summary;
pub use syncopate_sim::straggler::parse_stragglers;

use clap::{Args, Parser, Subcommand};
use std::io::IsTerminal;
use std::path::PathBuf;
use std::process::ExitCode;

/// Straggler-tolerant synchronization protocols for parameter-server training.
#[derive(Debug, Parser)]
#[command(
    name = "syncopate",
    version,
    about = "Straggler-tolerant synchronization protocols for parameter-server training: train, compare, advise, \
             trace-gen, serve, work, group, reproduce and mpi",
    long_about = None
)]
pub struct Cli {
    /// What to do.
    #[command(subcommand)]
    pub command: Command,
}

/// The subcommands.
#[derive(Debug, Subcommand)]
pub enum Command {
    /// Train on the built-in digits data (or a CSV/LIBSVM file) with real threads, or in the
    /// deterministic simulator with --sim.
    Train(train::TrainArgs),
    /// Run every protocol of a straggler scenario in the simulator and print a table (the
    /// built-in default scenario without a file).
    Compare(compare::CompareArgs),
    /// Replay a recorded step-time trace under every protocol and knob setting (scaled to
    /// the trace), over several seeds and data splits, and recommend one with its interval.
    Advise(advise::AdviseArgs),
    /// Write a seeded synthetic step-time trace of one of seven kinds (steady, markov,
    /// pareto, dead-node, uniform, two-types, regime-change).
    TraceGen(advise::TraceGenArgs),
    /// Run the parameter server of a multi-process run over TCP (workers join with `work`).
    Serve(Box<serve::ServeArgs>),
    /// Run one worker of a multi-process run over TCP, connecting to `serve` (the run's
    /// settings come from the server).
    Work(work::WorkArgs),
    /// Run one group server of the grouped protocol over TCP: it connects upstream to a
    /// central `serve --protocol grouped --remote-groups`, and its members connect with `work`.
    Group(group::GroupArgs),
    /// Run the four papers' experiments over several seeds and print REPRODUCTION.md's tables.
    Reproduce(reproduce::ReproduceArgs),
    /// Train as an MPI job: `mpirun -n N+1 syncopate mpi --workers N ...` (or `srun`); rank 0
    /// runs the server and prints the summary, the other ranks the workers. Needs a build
    /// with the `mpi` feature.
    Mpi(mpi::MpiArgs),
}

/// The model, the data and the randomness of a run.
#[derive(Clone, Debug, Args)]
pub struct WorkloadArgs {
    /// Model: softmax, mlp (32 hidden units), mlp:H (H from 1 to 4096), mlp2:H1:H2 (two
    /// hidden layers) or nqm:D (the noisy quadratic model over D coordinates, trained on its
    /// own noise; it has a loss but no accuracy).
    #[arg(long, default_value = "softmax", value_parser = parse_model)]
    pub model: crate::workload::ModelKind,
    /// Train on this file instead of the built-in digits data.
    #[arg(long, value_name = "FILE")]
    pub data: Option<PathBuf>,
    /// Format of --data: csv (label in the last column) or libsvm.
    #[arg(long, value_name = "FORMAT", default_value = "csv", requires = "data")]
    pub data_format: DataFormat,
    /// Minibatch size of one gradient (1 to 4096).
    #[arg(long, default_value_t = 32, value_parser = clap::value_parser!(u32).range(1..=i64::from(MAX_BATCH_SIZE)))]
    pub batch_size: u32,
    /// Seed of everything random (initial model, data split, minibatches, stragglers).
    #[arg(long, default_value_t = 1)]
    pub seed: u64,
}

/// A data file's format.
#[derive(Clone, Copy, Debug, PartialEq, Eq, clap::ValueEnum)]
pub enum DataFormat {
    /// Comma-separated numbers, the class label in the last column.
    Csv,
    /// `label index:value ...` lines, 1-based sparse indices.
    Libsvm,
}

impl WorkloadArgs {
    /// Loads the data and builds the workload (80/20 split with the seed).
    pub fn workload(&self) -> Result<crate::workload::Workload, String> {
        use crate::workload::{CsvOptions, Dataset, Workload};
        let data = match &self.data {
            None => return Ok(Workload::builtin(self.model, self.seed)),
            Some(_) if matches!(self.model, crate::workload::ModelKind::Nqm { .. }) => {
                return Err(format!(
                    "--model {} trains on its own noise data: --data does not apply to the noisy quadratic model",
                    self.model
                ));
            }
            Some(path) => {
                paths::input("--data", path)?;
                match self.data_format {
                    DataFormat::Csv => Dataset::from_csv_path(path, &CsvOptions::default()),
                    DataFormat::Libsvm => Dataset::from_libsvm_path(path),
                }
            }
        }
        .map_err(|e| e.to_string())?;
        let file = self.data.as_deref().unwrap_or_else(|| std::path::Path::new("?")).display();
        if data.len() < 2 || data.n_classes < 2 {
            return Err(format!("{file}: need at least 2 rows and 2 classes"));
        }
        check_params(self.model, data.n_features, data.n_classes).map_err(|e| format!("{file}: {e}"))?;
        let workload = Workload::new(data, self.model, TEST_FRACTION, self.seed);
        if workload.test.is_empty() || workload.train.is_empty() {
            return Err(format!(
                "{file}: {} rows leave no test rows (a fifth is held out to measure accuracy); need at least 5 rows",
                workload.test.len() + workload.train.len()
            ));
        }
        Ok(workload)
    }
}

/// The share of a data file's rows held out as the test set.
const TEST_FRACTION: f64 = 0.2;
pub use crate::workload::limits::{MAX_BATCH_SIZE, MAX_HIDDEN, MAX_PARAMS, check_hidden, check_params};

/// Parses the bytes of a `.npy` file holding one flat float32 vector, as `serve --init`
/// reads it: the vector, or the reason the bytes are not one. Never panics.
pub fn parse_npy_vector(bytes: &[u8]) -> Result<Vec<f32>, String> {
    npy::decode_vector(bytes)
}

/// The bytes of the `.npy` file `serve --save` writes for `values`.
pub fn encode_npy_vector(values: &[f32]) -> Vec<u8> {
    npy::encode_vector(values)
}

/// Writes the record of the run `run` next to the checkpoint `checkpoint` (`FILE.shard` for a
/// shard of `settings`, `FILE.run` for a whole model), as `serve` does when a run starts.
pub fn write_shard_record(
    checkpoint: &std::path::Path,
    settings: &crate::tcp::RunSettings,
    run: &str,
) -> Result<(), String> {
    shard::write_record(checkpoint, settings, run)
}

/// Parses and checks the shard record next to `checkpoint`, as `serve --shard I/S --resume`
/// does: `Ok` only if it names this shard of this run; otherwise one line saying what
/// differs.
pub fn check_shard_record(checkpoint: &std::path::Path, settings: &crate::tcp::RunSettings) -> Result<(), String> {
    shard::check_record(checkpoint, settings).map(|_| ())
}

/// Parses `--model`, refusing hidden layers beyond [`MAX_HIDDEN`].
pub fn parse_model(text: &str) -> Result<crate::workload::ModelKind, String> {
    let kind: crate::workload::ModelKind = text.parse().map_err(|e| format!("{e}"))?;
    check_hidden(kind)?;
    Ok(kind)
}

/// A command-line error as one line: clap's message with what it lists on the lines below
/// (the missing flags, the allowed values, a tip) joined on, and the usage block dropped.
pub fn one_line_error(rendered: &str) -> String {
    let mut parts: Vec<&str> = Vec::new();
    for line in rendered.lines().map(str::trim) {
        if line.starts_with("Usage:") || line.starts_with("For more information") {
            break;
        }
        if !line.is_empty() {
            parts.push(line);
        }
    }
    let mut text = String::new();
    for part in parts {
        if !text.is_empty() {
            text.push_str(if text.ends_with(':') || part.starts_with('[') { " " } else { "; " });
        }
        text.push_str(part);
    }
    if text.is_empty() { "error: invalid arguments (see --help)".into() } else { text }
}

/// The most edits between an unknown flag and the one clap suggests for the tip to stay: a
/// typo, not another flag that shares a few letters (`--bogus` is not `--groups`).
const MAX_TIP_EDITS: usize = 2;

/// `line` without clap's `tip: a similar argument exists: '--x'` when `--x` is more than
/// [`MAX_TIP_EDITS`] edits from the unknown argument the line names.
fn without_far_tip(line: &str) -> String {
    const TIP: &str = "; tip: a similar argument exists: '";
    let quoted = |s: &str| s.split('\'').nth(1).map(str::to_owned);
    let (Some(at), Some(unknown)) = (line.find(TIP), quoted(line)) else { return line.to_owned() };
    let suggested = line.get(at + TIP.len()..).and_then(|t| t.split('\'').next()).unwrap_or_default();
    if edits(&unknown, suggested) <= MAX_TIP_EDITS {
        return line.to_owned();
    }
    let rest = line.get(at + TIP.len() + suggested.len() + 1..).unwrap_or_default();
    format!("{}{rest}", line.get(..at).unwrap_or_default())
}

/// The Levenshtein distance between `a` and `b` (in characters).
fn edits(a: &str, b: &str) -> usize {
    let b: Vec<char> = b.chars().collect();
    let mut row: Vec<usize> = (0..=b.len()).collect();
    for (i, ca) in a.chars().enumerate() {
        let mut diagonal = row.first().copied().unwrap_or(0);
        if let Some(first) = row.first_mut() {
            *first = i + 1;
        }
        for (j, cb) in b.iter().enumerate() {
            let above = row.get(j + 1).copied().unwrap_or(0);
            let left = row.get(j).copied().unwrap_or(0);
            let value = (diagonal + usize::from(ca != *cb)).min(above + 1).min(left + 1);
            diagonal = above;
            if let Some(cell) = row.get_mut(j + 1) {
                *cell = value;
            }
        }
    }
    row.last().copied().unwrap_or(0)
}

/// clap takes `--seed -1` (or `--shard -1/2`) for two flags; name the flag and the rule
/// instead: `invalid value '-1' for '--seed': must not be negative`.
fn negative_value_error(args: &[String]) -> Option<String> {
    args.windows(2).find_map(|pair| {
        let [flag, value] = pair else { return None };
        let is_flag = flag.starts_with("--") && !flag.contains('=');
        // A minus sign before a digit: no flag is spelled so.
        let negative = value.strip_prefix('-').is_some_and(|v| v.starts_with(|c: char| c.is_ascii_digit() || c == '.'));
        (is_flag && negative).then(|| format!("error: invalid value '{value}' for '{flag}': must not be negative"))
    })
}

/// Parses the command line and runs it; returns the process exit code.
pub fn main() -> ExitCode {
    output::quiet_on_closed_stdout();
    let cli = match Cli::try_parse() {
        Ok(cli) => cli,
        Err(e) => {
            use clap::error::ErrorKind;
            if matches!(e.kind(), ErrorKind::DisplayHelp | ErrorKind::DisplayVersion) {
                output::emit(&e.render().to_string());
                return ExitCode::SUCCESS;
            }
            // No subcommand is a usage error: the help goes to stderr, exit code 2.
            if e.kind() == ErrorKind::DisplayHelpOnMissingArgumentOrSubcommand {
                eprint!("{}", e.render());
                return ExitCode::from(2);
            }
            let args: Vec<String> = std::env::args().collect();
            let negative = (e.kind() == ErrorKind::UnknownArgument).then(|| negative_value_error(&args)).flatten();
            let line = negative.unwrap_or_else(|| without_far_tip(&one_line_error(&e.render().to_string())));
            eprintln!("{line}");
            return ExitCode::from(2);
        }
    };
    let result = match cli.command {
        Command::Train(args) => train::run(&args),
        Command::Compare(args) => compare::run(&args),
        Command::Advise(args) => advise::advise(&args),
        Command::TraceGen(args) => advise::trace_gen(&args),
        Command::Serve(args) => serve::run(&args),
        Command::Work(args) => work::run(&args),
        Command::Group(args) => group::run(&args),
        Command::Reproduce(args) => reproduce::run(&args),
        Command::Mpi(args) => mpi::run(&args),
    };
    match result {
        Ok(()) => ExitCode::SUCCESS,
        Err(Failure::Usage(msg)) => {
            error_line(&msg);
            ExitCode::from(2)
        }
        Err(Failure::Run(msg)) => {
            error_line(&msg);
            ExitCode::from(1)
        }
    }
}

/// Prints `error: MSG` on stderr in one write, so that the lines of processes sharing a
/// stderr (the ranks of an MPI job) never interleave within a line.
fn error_line(msg: &str) {
    use std::io::Write as _;
    let line = format!("error: {msg}\n");
    let _ = std::io::stderr().lock().write_all(line.as_bytes());
}

/// How a subcommand failed.
#[derive(Debug)]
pub enum Failure {
    /// Bad flags, values or input files (exit code 2).
    Usage(String),
    /// The run itself failed (exit code 1).
    Run(String),
}

/// Progress without a terminal: one line on stderr per finished unit of work
/// (`compare: 3/17 simulations done, 4.2 s`), so a long run in a pipe or a log is not
/// silent. Silent on a terminal (the progress bar shows it) and with JSON output.
pub(crate) struct ProgressLines {
    what: &'static str,
    unit: &'static str,
    total: u64,
    done: std::sync::atomic::AtomicU64,
    started: std::time::Instant,
    on: bool,
}

impl ProgressLines {
    pub(crate) fn new(what: &'static str, unit: &'static str, total: u64, json: bool) -> Self {
        let on = !json && !std::io::stderr().is_terminal();
        let done = std::sync::atomic::AtomicU64::new(0);
        Self { what, unit, total, done, started: std::time::Instant::now(), on }
    }

    /// Counts one finished unit and prints its line.
    pub(crate) fn one_done(&self) {
        let done = self.done.fetch_add(1, std::sync::atomic::Ordering::SeqCst) + 1;
        if self.on {
            let (what, unit, total) = (self.what, self.unit, self.total);
            eprintln!("{what}: {done}/{total} {unit} done, {:.1} s", self.started.elapsed().as_secs_f64());
        }
    }
}

/// A counter of finished work on stderr when it is a terminal and the output is not JSON,
/// for work whose total is not known in advance (a bar would have to grow, and go
/// backwards).
pub(crate) fn progress_counter(unit: &str, json: bool) -> indicatif::ProgressBar {
    if json || !std::io::stderr().is_terminal() {
        return indicatif::ProgressBar::hidden();
    }
    let bar = indicatif::ProgressBar::new_spinner();
    if let Ok(style) = indicatif::ProgressStyle::with_template(&format!(
        "{{spinner}} [{{elapsed_precise}}] {{pos}} {unit} done {{msg}}"
    )) {
        bar.set_style(style);
    }
    bar
}

/// A progress bar on stderr when it is a terminal and the output is not JSON.
pub(crate) fn progress_bar(len: u64, json: bool) -> indicatif::ProgressBar {
    if json || !std::io::stderr().is_terminal() {
        return indicatif::ProgressBar::hidden();
    }
    let bar = indicatif::ProgressBar::new(len);
    if let Ok(style) =
        indicatif::ProgressStyle::with_template("{spinner} [{elapsed_precise}] {bar:40} {pos}/{len} {msg}")
    {
        bar.set_style(style);
    }
    bar
}

#[cfg(test)]
mod tip_tests {
    use super::{edits, negative_value_error, without_far_tip};

    #[test]
    fn a_tip_naming_a_flag_far_from_the_typo_is_dropped() {
        assert_eq!(edits("--bogus", "--groups"), 4);
        assert_eq!(edits("--worker", "--workers"), 1);
        let far = "error: unexpected argument '--bogus' found; tip: a similar argument exists: '--groups'";
        assert_eq!(without_far_tip(far), "error: unexpected argument '--bogus' found");
        let near = "error: unexpected argument '--worker' found; tip: a similar argument exists: '--workers'";
        assert_eq!(without_far_tip(near), near);
    }

    #[test]
    fn a_negative_shard_names_its_flag() {
        let args: Vec<String> = ["syncopate", "serve", "--shard", "-1/2"].map(String::from).to_vec();
        assert_eq!(
            negative_value_error(&args).as_deref(),
            Some("error: invalid value '-1/2' for '--shard': must not be negative")
        );
        let flags: Vec<String> = ["syncopate", "serve", "--json", "--insecure"].map(String::from).to_vec();
        assert_eq!(negative_value_error(&flags), None);
    }
}
