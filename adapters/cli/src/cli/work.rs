//! `syncopate work`: one worker of a multi-process run over TCP.
//!
//! The worker learns everything about the run from the server in the handshake: protocol,
//! knobs, model, data, batch size and seed. What it still chooses itself:
//!
//! - its id (`--id`, or the launcher's rank from `RANK`, `OMPI_COMM_WORLD_RANK`,
//!   `SLURM_PROCID` or `PMI_RANK`, read by the transport's `launcher` as Python reads it);
//!   with the launcher's rank, the launcher's world size must be the run's worker count;
//! - the shared secret (`--secret-file` or `$SYNCOPATE_SECRET`);
//! - straggler emulation (`--step-ms`, `--straggler`, the same syntax and defaults as
//!   `train`): the worker's own machine is as slow as it is, and emulation adds time on top;
//!   the spec names worker ids and each worker applies only its own entry, so every worker
//!   can be given the same spec, exactly as `train` is;
//! - where it finds the run's data file (`--data`), which must be byte for byte the
//!   server's (checked by SHA-256);
//! - how long it keeps trying to reach a server that does not answer (`--give-up-after`).
//!
//! Its minibatch sampler is seeded from the run's seed and its id, as in `train`.

use super::failure::Failure;
use super::workload_args::{DataFormat, WorkloadArgs};
use crate::sim::{ComputeModel, ComputeSampler};
use crate::tcp::{
    DataSource, FrameTimeout, RunSettings, WorkerJob, WorkerOptions, WorkloadSettings, run_sharded_worker, run_worker,
};
use crate::workload::{BatchSampler, ModelKind, Workload};
use clap::Args;
use core::time::Duration;
use std::path::PathBuf;
use syncopate::WorkerId;
use syncopate_transport::launcher;

/// Flags of `syncopate work`.
#[derive(Clone, Debug, Args)]
pub struct WorkArgs {
    /// The server's address; the run's settings come from it. For a sharded run
    /// (`serve --shard I/S`), every shard's address, comma separated, in shard order.
    #[arg(long, value_name = "ADDR")]
    pub connect: String,
    /// This worker's id, in 0..workers; without it, the launcher's rank ($RANK,
    /// $OMPI_COMM_WORLD_RANK, $SLURM_PROCID or $PMI_RANK).
    #[arg(long)]
    pub id: Option<u32>,
    /// File holding the shared secret; otherwise $SYNCOPATE_SECRET if set.
    #[arg(long, value_name = "FILE")]
    pub secret_file: Option<PathBuf>,
    /// Where this worker finds the run's data file, if not at the server's path (it must
    /// be the same file: its SHA-256 is checked).
    #[arg(long, value_name = "FILE")]
    pub data: Option<PathBuf>,
    /// Emulated straggling, as `train --straggler` (e.g. `0:slow=4`): this worker applies
    /// the entry for its own id. The worker's own choice; the server does not send it.
    #[arg(long, value_name = "SPEC", default_value = "")]
    pub straggler: String,
    /// Base time of one emulated gradient step in milliseconds, as `train --step-ms`: the
    /// worker holds each gradient until this much (times its straggler factor) has passed
    /// on top of the real computation. 0 turns emulation off.
    #[arg(long, value_name = "MS", default_value_t = 2.0)]
    pub step_ms: f64,
    /// Give up after the server has been unreachable this many seconds in a row (a server
    /// that answers, even "busy", is retried for as long as it runs).
    #[arg(long, value_name = "SECS", default_value_t = 30, value_parser = clap::value_parser!(u64).range(1..=86_400))]
    pub give_up_after: u64,
    /// Print the worker's report as one JSON object on stdout.
    #[arg(long)]
    pub json: bool,
    /// A server silent this many seconds (no message, no heartbeat: hung, stopped or cut
    /// off) is lost and the worker reconnects. Heartbeats go out every tenth of it (between
    /// 10 ms and 1 s), also while a gradient is being computed.
    #[arg(long, value_name = "SECS", default_value_t = 10.0)]
    pub lost_after: f64,
    /// The tensor encoding to insist on (f32, bf16 or fp16): a server that speaks another
    /// refuses this worker at the handshake (exit 2). Default: the server's.
    #[arg(long, value_name = "ENC", value_parser = super::values::wire)]
    pub wire: Option<syncopate::wire::Encoding>,
}

/// The worker id from `--id` or, without it, from the first launcher variable `get` finds.
/// Refuses a `--connect` value that is not `HOST:PORT` with a port from 1 to 65535.
pub(super) fn check_address(addr: &str) -> Result<(), String> {
    let bad = |why: &str| {
        Err(format!("invalid value '{addr}' for '--connect': {why} (expected HOST:PORT, e.g. 127.0.0.1:7070)"))
    };
    let Some((host, port)) = addr.rsplit_once(':') else {
        return bad("no port");
    };
    if host.is_empty() {
        return bad("no host");
    }
    match port.parse::<u16>() {
        Ok(p) if p > 0 => Ok(()),
        _ => bad(&format!("'{port}' is not a port number")),
    }
}

pub(super) fn worker_id(flag: Option<u32>, get: impl Fn(&str) -> Option<String>) -> Result<u32, String> {
    if let Some(id) = flag {
        return Ok(id);
    }
    let first_set = launcher::RANK_VARIABLES.iter().find_map(|v| get(v).map(|value| (*v, value)));
    if let Some((var, value)) = first_set.filter(|(_, value)| value.trim().parse::<u32>().is_err()) {
        return Err(format!(
            "invalid value '{value}' in ${var} for the worker id: must be a whole number (or give --id)"
        ));
    }
    match launcher::rank(&get) {
        Ok(Some(rank)) => Ok(rank.value),
        Ok(None) => Err(format!(
            "--id is required outside a launcher: give --id N, or set one of ${}",
            launcher::RANK_VARIABLES.join(", $")
        )),
        Err(e) => Err(format!("{e} (the worker id; or give --id)")),
    }
}

/// Computes gradients of the run's workload, built from the server's settings.
struct Job {
    id: u32,
    data_override: Option<PathBuf>,
    straggler: String,
    step: syncopate::Duration,
    state: Option<Ready>,
    /// The launcher's world size, when the id came from the launcher: the run's worker
    /// count must equal it.
    world: Option<launcher::FromEnv<u32>>,
}

struct Ready {
    workload: Workload,
    sampler: BatchSampler,
    delay: ComputeSampler,
    scratch: crate::workload::Scratch,
    batch: Vec<usize>,
    batch_size: usize,
    /// The minibatch loss of the last gradient, reported with it when finite.
    loss: Option<f32>,
}

impl Job {
    fn build(&self, settings: &RunSettings) -> Result<Ready, String> {
        let w = settings.workload.as_ref().ok_or(
            "the server announced no built-in workload (it trains a vector of its own: `serve --init` or \
             `--init-from-worker`, or it is not `syncopate serve`); its workers are your own (Python `run_worker`)",
        )?;
        let workload = workload(w, self.data_override.as_ref())?;
        let dim = workload.model.dim();
        if dim as u64 != settings.dim {
            return Err(format!("the workload has {dim} parameters but the server's model has {}", settings.dim));
        }
        let n = settings.protocol.workers;
        let models = crate::straggler::parse_stragglers(&self.straggler, n)?;
        let model = models.get(self.id as usize).cloned().unwrap_or(ComputeModel::None);
        let seed = w.seed ^ (u64::from(self.id) + 1).wrapping_mul(0x9E37_79B9_7F4A_7C15);
        Ok(Ready {
            sampler: BatchSampler::new(workload.train.len(), seed),
            delay: ComputeSampler::new(model, self.step, w.seed, self.id),
            scratch: workload.model.scratch(),
            batch: Vec::new(),
            batch_size: w.batch_size as usize,
            loss: None,
            workload,
        })
    }
}

impl WorkerJob for Job {
    fn prepare(&mut self, settings: &RunSettings) -> Result<(), String> {
        launcher::check_world_size(self.world.as_ref(), settings.protocol.workers)?;
        if settings.optimizer.rule == syncopate::proto::Rule::Mean {
            return Err("the server runs update rule mean: each model it sends is a round's mean gradient, for \
                        workers that apply it with their own optimizer (Python run_worker with on_round); \
                        `syncopate work` computes gradients of a built-in model and cannot"
                .into());
        }
        self.state = Some(self.build(settings)?);
        Ok(())
    }

    fn gradient(&mut self, params: &[f32], grad: &mut [f32]) -> Duration {
        let Some(r) = &mut self.state else {
            return Duration::ZERO;
        };
        r.sampler.next_batch(r.batch_size, &mut r.batch);
        let loss = r.workload.model.gradient(params, &r.workload.train, &r.batch, grad, &mut r.scratch);
        r.loss = Some(loss).filter(|l| l.is_finite());
        Duration::from_nanos(r.delay.next_step().as_nanos())
    }

    fn loss(&mut self) -> Option<f32> {
        self.state.as_ref().and_then(|r| r.loss)
    }
}

/// The largest data file a worker reads (and hashes) at the path the server names.
pub(super) const MAX_DATA_FILE_BYTES: u64 = 1 << 30;

/// Reads the data file at `path` for the server's settings: a regular file of at most
/// [`MAX_DATA_FILE_BYTES`] (a device such as `/dev/zero`, a pipe or a larger file is refused
/// before it is read), whatever named it; its SHA-256 is then checked against the server's.
fn read_data_file(path: &std::path::Path) -> Result<Vec<u8>, String> {
    use std::io::Read as _;
    let cannot = |e: &dyn std::fmt::Display| {
        format!("cannot read the run's data file {}: {e} (give its location with --data)", path.display())
    };
    let file = std::fs::File::open(path).map_err(|e| cannot(&e))?;
    let meta = file.metadata().map_err(|e| cannot(&e))?;
    if !meta.is_file() {
        return Err(cannot(&"not a regular file"));
    }
    if meta.len() > MAX_DATA_FILE_BYTES {
        return Err(cannot(&format_args!("{} bytes, above the {MAX_DATA_FILE_BYTES} a worker reads", meta.len())));
    }
    let mut bytes = Vec::new();
    file.take(MAX_DATA_FILE_BYTES + 1).read_to_end(&mut bytes).map_err(|e| cannot(&e))?;
    if bytes.len() as u64 > MAX_DATA_FILE_BYTES {
        return Err(cannot(&format_args!("it grew above the {MAX_DATA_FILE_BYTES} bytes a worker reads")));
    }
    Ok(bytes)
}

/// The workload of the server's settings; a data file must have the server's SHA-256.
/// Every size the server names is bounded before anything is allocated: the minibatch as
/// `--batch-size` is, the model by the workload's own limits, a data file by
/// [`read_data_file`].
fn workload(w: &WorkloadSettings, data_override: Option<&PathBuf>) -> Result<Workload, String> {
    if !(1..=crate::workload::limits::MAX_BATCH_SIZE).contains(&w.batch_size) {
        return Err(format!(
            "the server's batch size {} is outside 1..={} (a worker sizes its buffers from it)",
            w.batch_size,
            crate::workload::limits::MAX_BATCH_SIZE
        ));
    }
    let model: ModelKind = w.model.parse().map_err(|e| format!("the server's model: {e}"))?;
    crate::workload::limits::check_hidden(model).map_err(|e| format!("the server's model: {e}"))?;
    let (data, data_format) = match &w.data {
        DataSource::Digits => (None, DataFormat::Csv),
        DataSource::File { path, format, sha256 } => {
            let path = data_override.cloned().unwrap_or_else(|| PathBuf::from(path));
            let bytes = read_data_file(&path)?;
            if crate::tcp::settings::digest(&bytes) != *sha256 {
                return Err(format!("data file {} differs from the server's (SHA-256 mismatch)", path.display()));
            }
            let format = <DataFormat as clap::ValueEnum>::from_str(format, false)
                .map_err(|_| format!("the server's data format '{format}' is unknown"))?;
            (Some(path), format)
        }
    };
    WorkloadArgs { model, data, data_format, batch_size: w.batch_size, seed: w.seed }.workload()
}

/// Runs `syncopate work`.
pub(super) fn run(args: &WorkArgs) -> Result<(), Failure> {
    if !(args.step_ms.is_finite() && (0.0..=3_600_000.0).contains(&args.step_ms)) {
        return Err(Failure::Usage(format!(
            "invalid value '{}' for '--step-ms': must be between 0 and 3600000",
            args.step_ms
        )));
    }
    // Checked for syntax now; worker ids in it are checked against the server's count.
    crate::straggler::parse_stragglers(&args.straggler, syncopate::MAX_WORKERS as u32).map_err(Failure::Usage)?;
    let shards = crate::tcp::sharded::shard_addresses(&args.connect);
    for addr in &shards {
        check_address(addr).map_err(Failure::Usage)?;
    }
    let id = worker_id(args.id, launcher::env).map_err(Failure::Usage)?;
    let world = match args.id {
        Some(_) => None,
        None => launcher::world_size(&launcher::env).map_err(Failure::Usage)?,
    };
    let secret = super::values::load_secret(args.secret_file.as_deref()).map_err(Failure::Usage)?;
    let id = WorkerId(id);
    let mut options = WorkerOptions::new(args.connect.clone(), id);
    options.key = secret.map(|s| s.worker_key(id));
    options.backoff.give_up_after = Duration::from_secs(args.give_up_after);
    options.frame_timeout = FrameTimeout::default();
    options.lost_after = super::values::lost_after(args.lost_after).map_err(Failure::Usage)?;
    options.wire = args.wire;
    let mut job = Job {
        id: id.0,
        data_override: args.data.clone(),
        straggler: args.straggler.clone(),
        step: syncopate::Duration::from_secs_f64(args.step_ms / 1000.0),
        state: None,
        world,
    };
    // A worker id out of range or claimed by another process, an address that does not
    // resolve, or settings this worker cannot use are the operator's to fix.
    let failure = |e: crate::tcp::TcpError| {
        let usage = [
            "out of range",
            "--straggler",
            "data file",
            "claim this worker id",
            "invalid server address",
            // A --connect list that does not name the run's shards in order.
            "list the shards",
            "--connect lists",
            "belongs to run",
            "connect to every shard",
            "is not a shard",
            "runs other settings than shard 0",
            // Another tensor encoding than the server's (or another shard's).
            "server speaks",
        ];
        // A handshake refused either way (settings this worker cannot run, another
        // version, a worker id or model size the server refuses) is the operator's to fix;
        // a wrong or missing shared secret fails the run.
        let secret = e.0.contains("shared secret") || e.0.contains("authentication");
        let refused = e.0.contains("refusing the server's run") || e.0.contains("refused by peer");
        if (refused && !secret) || usage.iter().any(|u| e.0.contains(u)) {
            Failure::Usage(e.0)
        } else {
            Failure::Run(e.0)
        }
    };
    let mut log = |line: &str| eprintln!("work: {line}");
    let (report, json) = if shards.len() > 1 {
        let sharded = run_sharded_worker(&options, &mut job, &mut log).map_err(failure)?;
        let json = serde_json::to_string(&sharded);
        (sharded.total, json)
    } else {
        let report = run_worker(&options, &mut job, &mut log).map_err(failure)?;
        (report, serde_json::to_string(&report))
    };
    if args.json {
        match json {
            Ok(s) => println!("{s}"),
            Err(e) => return Err(Failure::Run(format!("cannot encode the report as JSON: {e}"))),
        }
    } else {
        let share = if report.wall_s > 0.0 { 100.0 * report.busy_s / report.wall_s } else { 0.0 };
        println!(
            "work: worker {} {} after {} gradients in {:.2} s (computing {share:.0}% of the time; {} session{}, last \
             model version {}; {} input{} refused)",
            id.0,
            if report.stopped { "stopped by the server" } else { "ended" },
            report.steps,
            report.wall_s,
            report.sessions,
            if report.sessions == 1 { "" } else { "s" },
            report.last_version.map_or_else(|| "none".to_owned(), |v| v.to_string()),
            report.refused,
            if report.refused == 1 { "" } else { "s" }
        );
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn settings(batch_size: u32, data: DataSource) -> WorkloadSettings {
        WorkloadSettings { model: "softmax".into(), data, batch_size, seed: 1 }
    }

    #[test]
    fn sizes_and_files_named_by_the_server_are_bounded_before_anything_is_read() {
        let file = |path: &str| DataSource::File { path: path.into(), format: "csv".into(), sha256: [0; 32] };
        let e = workload(&settings(u32::MAX, DataSource::Digits), None).err().unwrap();
        assert!(e.contains("batch size 4294967295"), "{e}");
        let e = workload(&settings(0, DataSource::Digits), None).err().unwrap();
        assert!(e.contains("batch size 0"), "{e}");
        let e = workload(&settings(32, file("/dev/zero")), None).err().unwrap();
        assert!(e.contains("/dev/zero") && e.contains("not a regular file"), "{e}");
        let e = workload(&settings(32, file("/")), None).err().unwrap();
        assert!(e.contains("not a regular file"), "{e}");
        let e =
            workload(&WorkloadSettings { model: "nqm:4000000000".into(), ..settings(32, DataSource::Digits) }, None)
                .err()
                .unwrap();
        assert!(e.contains("the server's model"), "{e}");
    }

    #[test]
    fn the_id_comes_from_the_flag_then_the_launcher() {
        let env = |pairs: &'static [(&'static str, &'static str)]| {
            move |k: &str| pairs.iter().find(|(n, _)| *n == k).map(|(_, v)| (*v).to_owned())
        };
        assert_eq!(worker_id(Some(3), env(&[("RANK", "1")])), Ok(3));
        assert_eq!(worker_id(None, env(&[("SLURM_PROCID", "2"), ("PMI_RANK", "5")])), Ok(2));
        assert_eq!(worker_id(None, env(&[("OMPI_COMM_WORLD_RANK", " 7 ")])), Ok(7));
        assert_eq!(worker_id(None, env(&[("PMI_RANK", "4")])), Ok(4));
        let e = worker_id(None, env(&[("RANK", "x")])).unwrap_err();
        assert!(e.contains("$RANK") && e.contains("'x'"), "{e}");
        let e = worker_id(None, env(&[])).unwrap_err();
        assert!(e.contains("--id is required") && e.contains("$SLURM_PROCID"), "{e}");
    }
}
