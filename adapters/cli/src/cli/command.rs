//! The command line itself: the subcommands, their parsing into one-line errors, and the
//! exit codes (2 for bad usage, 1 for a failed run).

use super::failure::Failure;
use super::{advise, compare, group, mpi, output, reproduce, serve, train, work};
use clap::{Parser, Subcommand};
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
