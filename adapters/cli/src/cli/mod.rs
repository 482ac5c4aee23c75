//! The `syncopate` command line: `train` (threads or the simulator) and the flag groups and
//! summary every subcommand shares.
//!
//! Layering: this file only declares and re-exports; `command` (the parser, the dispatch and
//! the exit codes) imports the subcommands' files, and they import the shared pieces
//! (`failure`, `workload_args`, `protocol`, `summary`, `progress`, `output`, `values`, ...),
//! never this file or `command`.
//!
//! Bad flags, values or files end the program with one line on stderr naming the problem
//! and exit code 2; a failure while running exits with 1.

mod advise;
mod check;
mod command;
mod compare;
mod deadlines;
mod failure;
mod group;
mod loss_curve;
mod model_source;
mod mpi;
mod npy;
mod optimizer;
pub(crate) mod output;
mod paths;
mod progress;
mod protocol;
mod reproduce;
mod serve;
mod shard;
mod summary;
mod train;
mod values;
mod work;
mod workload_args;

pub use crate::workload::limits::{MAX_BATCH_SIZE, MAX_HIDDEN, MAX_PARAMS, check_hidden, check_params};
pub use check::check_command_line;
pub use command::{Cli, Command, main, one_line_error};
pub use failure::Failure;
pub use protocol::ProtocolArgs;
pub use summary::Summary;
pub use syncopate_sim::straggler::parse_stragglers;
pub use workload_args::{DataFormat, WorkloadArgs, parse_model};

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
