//! A command line checked without running it: what the docs' commands are tested with.

use super::command::{Cli, Command, one_line_error};
use crate::scenario::Scenario;
use clap::Parser;
use std::path::Path;

/// Checks a `syncopate` command line (`args[0]` is the program name) as far as it can be
/// checked without running it or reading the files it names: the subcommand and its flags
/// exist, every value parses and is in range, and for `train`, `mpi`, `serve`, `work` and
/// `compare` the protocol's knobs, the straggler spec and the preset are valid. A scenario
/// file that exists is loaded and checked too. Returns the one-line error the command
/// would print.
pub fn check_command_line<I, T>(args: I) -> Result<(), String>
where
    I: IntoIterator<Item = T>,
    T: Into<std::ffi::OsString> + Clone,
{
    let cli = Cli::try_parse_from(args).map_err(|e| one_line_error(&e.render().to_string()))?;
    match &cli.command {
        Command::Train(train) => check_train(train),
        Command::Mpi(mpi) => mpi.check().and_then(|()| check_train(&mpi.train_without_shards())),
        Command::Serve(serve) => serve.protocol.config().map(drop),
        Command::Work(work) => {
            crate::straggler::parse_stragglers(&work.straggler, syncopate::MAX_WORKERS as u32).map(drop)
        }
        Command::Compare(compare) => check_scenario(compare.scenario.as_deref(), compare.preset.as_deref()),
        _ => Ok(()),
    }
}

fn check_train(train: &super::train::TrainArgs) -> Result<(), String> {
    train.check()?;
    let protocol = train.protocol.config()?;
    crate::straggler::parse_stragglers(&train.straggler, protocol.workers())?;
    Ok(())
}

fn check_scenario(file: Option<&Path>, preset: Option<&str>) -> Result<(), String> {
    match (file, preset) {
        (Some(path), _) if path.exists() => Scenario::load(path).map(drop),
        (None, Some(name)) => match Scenario::preset(name) {
            Some(scenario) => scenario.map(drop),
            None => Err(format!("invalid value '{name}' for '--preset': one of dbw, wbsp, bap, grouped")),
        },
        _ => Ok(()),
    }
}
