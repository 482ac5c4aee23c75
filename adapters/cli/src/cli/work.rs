//! `syncopate work`: one worker of a multi-process run over TCP.

use super::{Failure, ProtocolArgs, WorkloadArgs};
use crate::tcp::{FrameTimeout, WorkerOptions, run_worker};
use crate::workload::BatchSampler;
use clap::Args;
use core::time::Duration;
use std::path::PathBuf;
use syncopate::WorkerId;

/// Flags of `syncopate work`.
#[derive(Clone, Debug, Args)]
pub struct WorkArgs {
    /// The protocol and its knobs (the same as the server's).
    #[command(flatten)]
    pub protocol: ProtocolArgs,
    /// The model, data and seed (the same model and data as the server's).
    #[command(flatten)]
    pub workload: WorkloadArgs,
    /// The server's address.
    #[arg(long, value_name = "ADDR")]
    pub connect: String,
    /// This worker's id, in 0..workers.
    #[arg(long)]
    pub id: u32,
    /// File holding the shared secret; otherwise $SYNCOPATE_SECRET if set.
    #[arg(long, value_name = "FILE")]
    pub secret_file: Option<PathBuf>,
    /// Give up after this many seconds without reaching the server.
    #[arg(long, value_name = "SECS", default_value_t = 30)]
    pub give_up_after: u64,
    /// Print the worker's report as one JSON object on stdout.
    #[arg(long)]
    pub json: bool,
}

/// Runs `syncopate work`.
pub(super) fn run(args: &WorkArgs) -> Result<(), Failure> {
    let protocol = args.protocol.config().map_err(Failure::Usage)?;
    if args.id >= protocol.workers() {
        return Err(Failure::Usage(format!(
            "--id {} is out of range: --workers {} allows 0..{}",
            args.id,
            protocol.workers(),
            protocol.workers()
        )));
    }
    let workload = args.workload.workload().map_err(Failure::Usage)?;
    let dim = workload.model.dim();
    let secret = super::serve::load_secret(args.secret_file.as_deref()).map_err(Failure::Usage)?;
    let id = WorkerId(args.id);
    let mut options = WorkerOptions::new(args.connect.clone(), id, protocol, dim);
    options.key = secret.map(|s| s.worker_key(id));
    options.backoff.give_up_after = Duration::from_secs(args.give_up_after);
    options.frame_timeout = FrameTimeout::default();
    let seed = args.workload.seed ^ (u64::from(id.0) + 1).wrapping_mul(0x9E37_79B9_7F4A_7C15);
    let mut sampler = BatchSampler::new(workload.train.len(), seed);
    let mut scratch = workload.model.scratch();
    let mut batch = Vec::new();
    let batch_size = args.workload.batch_size as usize;
    let report = run_worker(
        &options,
        &mut |params, grad| {
            sampler.next_batch(batch_size, &mut batch);
            workload.model.gradient(params, &workload.train, &batch, grad, &mut scratch);
        },
        &mut |line| eprintln!("work: {line}"),
    )
    .map_err(|e| Failure::Run(e.0))?;
    if args.json {
        match serde_json::to_string(&report) {
            Ok(s) => println!("{s}"),
            Err(e) => return Err(Failure::Run(format!("cannot encode the report as JSON: {e}"))),
        }
    } else {
        println!(
            "work: worker {} {} after {} gradients in {:.2} s ({} session{}, last model version {})",
            id.0,
            if report.stopped { "stopped by the server" } else { "ended" },
            report.steps,
            report.wall_s,
            report.sessions,
            if report.sessions == 1 { "" } else { "s" },
            report.last_version.map_or_else(|| "none".to_owned(), |v| v.to_string())
        );
    }
    Ok(())
}
