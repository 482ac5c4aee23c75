//! The `syncopate` command line: `train` (threads or the simulator) and the flag groups and
//! summary every subcommand shares.
//!
//! Bad flags, values or files end the program with one line on stderr naming the problem
//! and exit code 2; a failure while running exits with 1.

mod compare;
mod group;
mod mpi;
mod protocol;
mod serve;
mod straggler;
mod summary;
mod train;
mod work;

pub use protocol::ProtocolArgs;
pub use straggler::parse_stragglers;
pub use summary::Summary;

use clap::{Args, Parser, Subcommand};
use std::io::IsTerminal;
use std::path::PathBuf;
use std::process::ExitCode;

/// Straggler-tolerant synchronization protocols for parameter-server training.
#[derive(Debug, Parser)]
#[command(name = "syncopate", version, about, long_about = None)]
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
    /// Replay a recorded step-time trace under every protocol and recommend the fastest.
    Advise(compare::AdviseArgs),
    /// Run the parameter server of a multi-process run over TCP (workers join with `work`).
    Serve(serve::ServeArgs),
    /// Run one worker of a multi-process run over TCP, connecting to `serve`.
    Work(work::WorkArgs),
    /// Run one group server of the grouped protocol over TCP: its members connect with
    /// `work`, and it connects upstream to a central `serve --protocol asp --workers G`.
    Group(group::GroupArgs),
    /// Train as an MPI job: `mpirun -n N+1 syncopate mpi --workers N ...` (or `srun`); rank 0
    /// runs the server and prints the summary, the other ranks the workers. Needs a build
    /// with the `mpi` feature.
    Mpi(mpi::MpiArgs),
}

/// The model, the data and the randomness of a run.
#[derive(Clone, Debug, Args)]
pub struct WorkloadArgs {
    /// Model: softmax, mlp (32 hidden units) or mlp:H.
    #[arg(long, default_value = "softmax")]
    pub model: crate::workload::ModelKind,
    /// Train on this file instead of the built-in digits data.
    #[arg(long, value_name = "FILE")]
    pub data: Option<PathBuf>,
    /// Format of --data: csv (label in the last column) or libsvm.
    #[arg(long, value_name = "FORMAT", default_value = "csv")]
    pub data_format: DataFormat,
    /// Minibatch size of one gradient.
    #[arg(long, default_value_t = 32, value_parser = clap::value_parser!(u32).range(1..=1_000_000))]
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
            None => return Ok(Workload::digits(self.model, self.seed)),
            Some(path) => match self.data_format {
                DataFormat::Csv => Dataset::from_csv_path(path, &CsvOptions::default()),
                DataFormat::Libsvm => Dataset::from_libsvm_path(path),
            },
        }
        .map_err(|e| e.to_string())?;
        if data.len() < 2 || data.n_classes < 2 {
            return Err(format!(
                "{}: need at least 2 rows and 2 classes",
                self.data.as_deref().unwrap_or_else(|| std::path::Path::new("?")).display()
            ));
        }
        Ok(Workload::new(data, self.model, 0.2, self.seed))
    }
}

/// Parses the command line and runs it; returns the process exit code.
pub fn main() -> ExitCode {
    let cli = match Cli::try_parse() {
        Ok(cli) => cli,
        Err(e) => {
            use clap::error::ErrorKind;
            if matches!(
                e.kind(),
                ErrorKind::DisplayHelp
                    | ErrorKind::DisplayVersion
                    | ErrorKind::DisplayHelpOnMissingArgumentOrSubcommand
            ) {
                let _ = e.print();
                return ExitCode::SUCCESS;
            }
            let text = e.render().to_string();
            let first = text.lines().find(|l| !l.trim().is_empty()).unwrap_or("invalid arguments");
            eprintln!("{}", first.trim_end());
            return ExitCode::from(2);
        }
    };
    let result = match cli.command {
        Command::Train(args) => train::run(&args),
        Command::Compare(args) => compare::run(&args),
        Command::Advise(args) => compare::advise(&args),
        Command::Serve(args) => serve::run(&args),
        Command::Work(args) => work::run(&args),
        Command::Group(args) => group::run(&args),
        Command::Mpi(args) => mpi::run(&args),
    };
    match result {
        Ok(()) => ExitCode::SUCCESS,
        Err(Failure::Usage(msg)) => {
            eprintln!("error: {msg}");
            ExitCode::from(2)
        }
        Err(Failure::Run(msg)) => {
            eprintln!("error: {msg}");
            ExitCode::from(1)
        }
    }
}

/// How a subcommand failed.
#[derive(Debug)]
pub enum Failure {
    /// Bad flags, values or input files (exit code 2).
    Usage(String),
    /// The run itself failed (exit code 1).
    Run(String),
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
