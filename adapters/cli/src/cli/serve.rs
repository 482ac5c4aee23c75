//! `syncopate serve`: the parameter server of a multi-process run over TCP. Its protocol,
//! knob, model and workload flags are the run's settings: it announces them to every worker
//! in the handshake, so `syncopate work` needs only `--connect` (and the secret).
//!
//! The run's clock (wall time, time to target, the accuracy curve) starts when every worker
//! has connected once; the wait before is reported apart. SIGINT or SIGTERM ends the run
//! cleanly: workers are told to stop, the checkpoint is written and the summary printed
//! (further signals within a grace period are noted and change nothing; a third one after it
//! exits at once).

use super::deadlines::Deadlines;
use super::loss_curve::LossCurve;
use super::model_source::{self, ModelSource};
use super::summary::{Resumed, TcpLedger};
use super::{failure::Failure, protocol::ProtocolArgs, summary::Summary, workload_args::WorkloadArgs};
use crate::tcp::{
    self, DataSource, Note, ProtocolSettings, RunPlan, RunSettings, ServerOptions, StopReason, TcpServer,
    WorkloadSettings, checkpoint,
};
use crate::thread::{EvalPoint, ThreadReport, WorkerTally};
use crate::trace::{self, served::ServedTrace};
use clap::Args;
use core::time::Duration;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::sync::atomic::AtomicBool;
use std::time::Instant;
use syncopate::Version;
use syncopate::proto::{Optimizer, Schedule};
use syncopate_transport::optimizer_spec;

/// Flags of `syncopate serve`.
#[derive(Clone, Debug, Args)]
pub struct ServeArgs {
    /// The protocol and its knobs (workers learn them in the handshake).
    #[command(flatten)]
    pub protocol: ProtocolArgs,
    /// The model, data and seed (workers learn them in the handshake; a data file must be
    /// at the same path on every worker, or given to `work --data`).
    #[command(flatten)]
    pub workload: WorkloadArgs,
    /// Grouped protocol only: run the central server of groups that run as their own
    /// processes (`syncopate group --connect THIS --group g`); it runs ASP over the groups.
    #[arg(long)]
    pub remote_groups: bool,
    /// Address to listen on. Without a shared secret only loopback addresses are allowed,
    /// unless --insecure is given.
    #[arg(long, value_name = "ADDR", default_value = "127.0.0.1:7070")]
    pub listen: String,
    /// Gradient steps per worker over the whole run: the run stops once the server has
    /// accepted steps × workers gradients. A run resumed with --resume goes on with what is
    /// left of it (the checkpoint holds what the run accepted).
    #[arg(long, default_value_t = 300, value_parser = clap::value_parser!(u64).range(1..=100_000_000))]
    pub steps: u64,
    /// Test accuracy whose first crossing is reported as the time to target.
    #[arg(long, default_value_t = 0.90)]
    pub target: f64,
    /// Print the summary as one JSON object on stdout.
    #[arg(long)]
    pub json: bool,
    /// Stop after this many seconds, whatever the progress.
    #[arg(long, value_name = "SECS")]
    pub time_limit: Option<f64>,
    /// File holding the shared secret (at least 16 bytes); otherwise $SYNCOPATE_SECRET if set.
    #[arg(long, value_name = "FILE")]
    pub secret_file: Option<PathBuf>,
    /// Allow listening beyond loopback without a shared secret.
    #[arg(long)]
    pub insecure: bool,
    /// Keep every session on TCP: offer no shared-memory region to workers on this host
    /// (by default their gradients and models travel through one).
    #[arg(long)]
    pub no_shared_memory: bool,
    /// Write the model and its version to this file (atomically) every --checkpoint-every
    /// updates and at the end.
    #[arg(long, value_name = "FILE")]
    pub checkpoint: Option<PathBuf>,
    /// Model updates between checkpoints (0: only at the end).
    #[arg(long, value_name = "K", default_value_t = 0, requires = "checkpoint")]
    pub checkpoint_every: u64,
    /// Start from the model and version in --checkpoint instead of a fresh model. Refused
    /// for a checkpoint of other settings or of another run (a run started afresh names
    /// itself at once in FILE.run, or FILE.shard for a shard); the run goes on with what is
    /// left of --steps.
    #[arg(long, requires = "checkpoint")]
    pub resume: bool,
    #[command(flatten)]
    pub optimizer: super::optimizer::OptimizerArgs,
    /// The connection deadlines.
    #[command(flatten)]
    pub deadlines: Deadlines,
    /// A worker silent this many seconds (no message, no heartbeat: hung, stopped or cut
    /// off) becomes a lost worker and the run goes on without it if the protocol can.
    /// Heartbeats go out every tenth of it (between 10 ms and 1 s).
    #[arg(long, value_name = "SECS", default_value_t = 10.0)]
    pub lost_after: f64,
    /// The tensor encoding on the wire, both ways: f32, bf16 or fp16 (half the bytes,
    /// rounded to nearest even). The server sums, applies and checkpoints in f32; a worker
    /// asking for another encoding is refused at the handshake.
    #[arg(long, value_name = "ENC", default_value = "f32", value_parser = super::values::wire)]
    pub wire: syncopate::wire::Encoding,
    /// Train the flat float32 vector in this NumPy file (dtype '<f4', one dimension) instead
    /// of a built-in model, with workers of your own (Python `run_worker`,
    /// `syncopate.torch.train_worker`). There is no built-in test set: progress is the
    /// workers' reported training loss (--target-loss).
    #[arg(long, value_name = "FILE.npy", conflicts_with_all = NOT_WITH_A_VECTOR)]
    pub init: Option<PathBuf>,
    /// Take the initial parameters from worker 0 (its first message after the handshake)
    /// instead of a built-in model; needs --dim. No built-in test set, as with --init.
    #[arg(long, requires = "dim", conflicts_with = "init", conflicts_with_all = NOT_WITH_A_VECTOR)]
    pub init_from_worker: bool,
    /// With --init-from-worker: the number of parameters (a worker whose model has another
    /// size is refused at the handshake, both sizes named).
    #[arg(long, value_name = "N", requires = "init_from_worker", value_parser = clap::value_parser!(u64).range(1..=crate::tcp::settings::MAX_DIM))]
    pub dim: Option<u64>,
    /// Write the final parameters to this NumPy .npy file (float32, one dimension),
    /// atomically.
    #[arg(long, value_name = "FILE.npy")]
    pub save: Option<PathBuf>,
    /// Report the time until the training loss reaches L: the mean, over 10 updates, of the
    /// minibatch losses the workers reported (the first update whose 10-update mean is at
    /// most L).
    #[arg(long, value_name = "L", value_parser = super::values::parse_target_loss)]
    pub target_loss: Option<f64>,
    /// Record a step-time trace for `advise --trace` and `compare --trace`: every worker
    /// measures its gradient steps and sends their times with its contributions; each row
    /// also has the step's reported loss and, for a gradient, its norm and the norm of the
    /// mean of the gradients computed on the same model. Not with --shard or --remote-groups.
    #[arg(long, value_name = "FILE", conflicts_with_all = ["shard", "remote_groups"])]
    pub record_trace: Option<PathBuf>,
    /// A sharded run: which shard this server is, and the run's id.
    #[command(flatten)]
    pub shard: super::shard::ShardArgs,
}

/// Flags of a built-in model, which a vector from --init or worker 0 does not have.
const NOT_WITH_A_VECTOR: [&str; 7] = ["model", "data", "data_format", "batch_size", "seed", "target", "remote_groups"];

/// The built-in model's name as `--model` takes it (`mlp:32`).
fn model_name(w: &WorkloadArgs) -> String {
    w.model.to_string()
}

/// The workload part of the run's settings (a data file is identified by its SHA-256).
pub(super) fn workload_settings(w: &WorkloadArgs) -> Result<WorkloadSettings, String> {
    let data = match &w.data {
        None => DataSource::Digits,
        Some(path) => {
            let bytes = std::fs::read(path).map_err(|e| format!("cannot read {}: {e}", path.display()))?;
            let text = path.to_str().ok_or_else(|| format!("data path {} is not UTF-8", path.display()))?;
            if text.len() > tcp::settings::MAX_PATH_LEN {
                return Err(format!(
                    "data path {} is longer than {} bytes",
                    path.display(),
                    tcp::settings::MAX_PATH_LEN
                ));
            }
            let format =
                clap::ValueEnum::to_possible_value(&w.data_format).map(|v| v.get_name().to_owned()).unwrap_or_default();
            DataSource::File { path: text.to_owned(), format, sha256: tcp::settings::digest(&bytes) }
        }
    };
    Ok(WorkloadSettings { model: w.model.to_string(), data, batch_size: w.batch_size, seed: w.seed })
}

/// The run's settings from the command line.
fn run_settings(args: &ServeArgs, source: &ModelSource) -> Result<RunSettings, String> {
    let p = &args.protocol;
    let mut settings = RunSettings::new(ProtocolSettings::new(&p.spec(), p.workers, p.lr), source.dim());
    if source.workload().is_some() {
        settings.workload = Some(workload_settings(&args.workload)?);
    }
    settings.initial_from_worker = matches!(source, ModelSource::Worker { .. });
    settings.remote_groups = args.remote_groups;
    // The workers report their step times for the straggler report (and a trace); a shard
    // or a central server of remote groups has no workers' steps of its own to report.
    settings.report_step_times = args.record_trace.is_some() || (!args.remote_groups && args.shard.shard.is_none());
    settings.optimizer = args.optimizer.optimizer()?;
    if settings.optimizer.rule == syncopate::proto::Rule::Mean {
        let what = if source.workload().is_some() {
            Some(
                "a built-in model (its workers compute gradients, not optimizer steps): give --init or --init-from-worker with workers of your own",
            )
        } else if args.checkpoint.is_some() {
            Some("--checkpoint (the server holds a round's mean gradient, not a model)")
        } else if args.save.is_some() {
            Some("--save (the server holds a round's mean gradient, not a model)")
        } else {
            None
        };
        if let Some(what) = what {
            return Err(format!("--optimizer mean cannot be used with {what}"));
        }
    }
    // A knob error blames --remote-groups only when it was given.
    settings.server_config().map_err(|e| if args.remote_groups { format!("--remote-groups: {e}") } else { e })?;
    settings.check_optimizer().map_err(|e| format!("--optimizer {}: {e}", settings.optimizer.rule_name()))?;
    super::shard::apply(&args.shard, &mut settings)?;
    settings.encode()?;
    Ok(settings)
}

/// Refuses to resume checkpoint `c` (at `path`) under another update rule than `ours`, naming
/// both (`momentum`: the --momentum given).
fn check_rule(path: &Path, c: &checkpoint::Checkpoint, ours: &Optimizer, momentum: f64) -> Result<(), String> {
    let theirs = &c.optimizer;
    if (theirs.is_plain() && ours.is_plain()) || theirs == ours {
        return Ok(());
    }
    let heavy_ball = |o: &Optimizer| o.is_plain() || (o.rule_name() == "momentum" && o.schedule == Schedule::Constant);
    if heavy_ball(theirs) && heavy_ball(ours) {
        return Err(format!(
            "checkpoint {} was made with momentum {}, this server runs --momentum {momentum}: resume with the same \
             --momentum",
            path.display(),
            c.momentum()
        ));
    }
    Err(format!(
        "checkpoint {} was made with update rule {}, this server runs {}: resume with the same --optimizer flags",
        path.display(),
        optimizer_spec::describe(theirs),
        optimizer_spec::describe(ours)
    ))
}

/// `, optimizer RULE` for a run whose rule is not plain SGD; empty otherwise.
fn rule_note(o: &Optimizer) -> String {
    if o.is_plain() { String::new() } else { format!(", optimizer {}", optimizer_spec::describe(o)) }
}

/// How long after the first SIGINT/SIGTERM further ones are only noted: the stop in
/// progress (workers told to stop, the checkpoint written, the summary printed) goes on.
/// `timeout` and batch schedulers send SIGTERM to the process and then to its group at
/// once, so a second signal soon after the first is not a request to hurry.
const SIGNAL_GRACE: Duration = Duration::from_secs(5);

/// SIGINT and SIGTERM set `flag` (the server then stops cleanly). Signals within
/// [`SIGNAL_GRACE`] of the first are noted and change nothing; a third signal after it ends
/// the process at once with exit code 130 (so does SIGKILL at any time).
fn stop_on_signals(flag: &Arc<AtomicBool>) -> Result<(), String> {
    use signal_hook::consts::{SIGINT, SIGTERM};
    let mut signals = signal_hook::iterator::Signals::new([SIGINT, SIGTERM])
        .map_err(|e| format!("cannot install the signal handler: {e}"))?;
    let flag = Arc::clone(flag);
    std::thread::Builder::new()
        .name("serve-signals".into())
        .spawn(move || {
            let mut first: Option<Instant> = None;
            let mut count = 0u32;
            for signal in signals.forever() {
                count += 1;
                let name = if signal == SIGINT { "SIGINT" } else { "SIGTERM" };
                match first {
                    None => {
                        first = Some(Instant::now());
                        flag.store(true, std::sync::atomic::Ordering::SeqCst);
                        eprintln!("serve: {name}: stopping (workers told to stop, checkpoint and summary follow)");
                    }
                    Some(t) if count >= 3 && t.elapsed() >= SIGNAL_GRACE => {
                        eprintln!("serve: {name} again: exiting now, without the final checkpoint");
                        std::process::exit(130);
                    }
                    Some(t) => {
                        let wait = SIGNAL_GRACE.saturating_sub(t.elapsed()).as_secs_f64();
                        eprintln!(
                            "serve: {name} again: still stopping cleanly; a signal after {wait:.1} s more, the third or later, exits without the final checkpoint"
                        );
                    }
                }
            }
        })
        .map_err(|e| format!("cannot start the signal thread: {e}"))?;
    Ok(())
}

/// Checks every file the run will write before it starts (`--save`, `--checkpoint` with its
/// journal and its run or shard record, `--record-trace`): each writable, none the same as another.
fn check_outputs(args: &ServeArgs) -> Result<(), String> {
    use super::paths::Output;
    let mut outputs = Vec::new();
    if let Some(path) = &args.checkpoint {
        let sharded = args.shard.shard.is_some();
        let record = if sharded { "its shard record" } else { "its run record" };
        let companions = vec![
            ("its journal", checkpoint::Journal::path_for(path)),
            (record, super::shard::record_file(path, sharded)),
        ];
        outputs.push(Output { companions, ..Output::new("--checkpoint", path) });
    }
    outputs.extend(args.save.as_deref().map(|p| Output::new("--save", p)));
    // The trace file is created right after this check, before the run.
    outputs.extend(args.record_trace.as_deref().map(|p| Output::created_first("--record-trace", p)));
    super::paths::check(&outputs)
}

/// Runs `syncopate serve`.
pub(super) fn run(args: &ServeArgs) -> Result<(), Failure> {
    if !(0.0..=1.0).contains(&args.target) {
        return Err(Failure::Usage(format!("invalid value '{}' for '--target': must be between 0 and 1", args.target)));
    }
    let time_limit = super::values::time_limit(args.time_limit).map_err(Failure::Usage)?;
    let source = ModelSource::from_flags(args.init.as_deref(), args.init_from_worker, args.dim, &args.workload)
        .map_err(Failure::Usage)?;
    let dim = source.dim();
    let settings = run_settings(args, &source).map_err(Failure::Usage)?;
    let protocol = settings.server_config().map_err(Failure::Usage)?;
    let n = protocol.workers();
    // A shard serves its slice of the model; it sees no whole model to evaluate.
    let served = settings.served_range().map_err(Failure::Usage)?;
    let whole = settings.shard.is_none();
    if !whole && (args.init_from_worker || args.save.is_some()) {
        return Err(Failure::Usage(
            "a shard holds a slice of the model: --init-from-worker and --save need the whole model (give every \
             shard the same --init FILE.npy)"
                .into(),
        ));
    }
    check_outputs(args).map_err(Failure::Usage)?;
    let secret = super::values::load_secret(args.secret_file.as_deref()).map_err(Failure::Usage)?;
    let mut recorded = match args.record_trace.as_deref() {
        Some(path) => {
            // Rows are written as they go: a server killed while recording keeps them.
            let mut t = ServedTrace::new(n, dim);
            t.write_as_you_go(trace::create(path).map_err(Failure::Usage)?, path).map_err(Failure::Usage)?;
            Some(t)
        }
        None => None,
    };
    let mut resumed = None;
    let mut resumed_state = None;
    let budget = args.steps.saturating_mul(u64::from(n));
    let mut stamp = checkpoint::Stamp::default();
    let (params, version) = if args.resume {
        let path = args.checkpoint.as_deref().unwrap_or_else(|| Path::new(""));
        let record_run = super::shard::check_record(path, &settings).map_err(Failure::Usage)?;
        let c = checkpoint::load(path, protocol.name(), served.len()).map_err(|e| Failure::Usage(e.to_string()))?;
        check_rule(path, &c, &settings.optimizer, args.optimizer.momentum).map_err(Failure::Usage)?;
        let run = super::shard::check_identity(path, &c, &settings, record_run.as_deref()).map_err(Failure::Usage)?;
        if record_run.is_none() {
            // A checkpoint of no known run: this resumption names the run from now on.
            super::shard::write_record(path, &settings, &run).map_err(Failure::Usage)?;
        }
        resumed_state = c.optimizer_state.clone();
        eprintln!("serve: resuming run {run} from {} at version {}", path.display(), c.version.0);
        if c.identity.is_some() {
            stamp.accepted_before = c.accepted;
            eprintln!(
                "serve: --steps {} is the whole run's budget ({budget} gradients): {} accepted before this \
                 checkpoint, {} left",
                args.steps,
                c.accepted,
                budget.saturating_sub(c.accepted)
            );
        } else {
            eprintln!(
                "serve: the checkpoint does not say how much of the budget was spent: --steps {} counts from this \
                 resumption",
                args.steps
            );
        }
        // What the previous server applied after this checkpoint is lost: its journal says
        // exactly which versions.
        let lost = checkpoint::lost_since(path, c.version, c.identity.as_ref().map(|i| i.run.as_str()))
            .map_err(|e| Failure::Usage(e.to_string()))?;
        eprintln!("serve: resumed: {}", lost.line());
        let t = |t: &checkpoint::Totals| [t.received, t.accepted, t.applied, t.dropped];
        resumed = Some(Resumed {
            checkpoint_version: c.version.0,
            lost_versions: lost.versions.map(|(a, b)| [a.0, b.0]),
            lost_contributions: lost.contributions,
            lost_by_worker: lost.by_worker.clone(),
            at_checkpoint: t(&lost.at_checkpoint),
            at_last_update: t(&lost.at_last),
        });
        stamp.identity = Some(super::shard::identity(&settings, &run).map_err(Failure::Usage)?);
        (Some(c.params), c.version)
    } else {
        if let Some(path) = &args.checkpoint {
            // The record names this run at once, so that a checkpoint an earlier run left
            // at this path is never resumed as this run's.
            let run = checkpoint::RunIdentity::new_run_id();
            super::shard::write_record(path, &settings, &run).map_err(Failure::Usage)?;
            stamp.identity = Some(super::shard::identity(&settings, &run).map_err(Failure::Usage)?);
        }
        (
            source.initial_params(args.workload.seed).map(|p| p.get(served.clone()).unwrap_or_default().to_vec()),
            Version::ZERO,
        )
    };
    let settings_rule = settings.optimizer;
    let mut options = ServerOptions::new(settings);
    options.secret = secret;
    options.insecure = args.insecure;
    options.shared_memory = !args.no_shared_memory;
    options.handshake_timeout = args.deadlines.handshake();
    options.frame_timeout = args.deadlines.frame();
    options.checkpoint = args.checkpoint.clone().map(|p| (p, args.checkpoint_every));
    options.checkpoint_stamp = stamp.clone();
    options.optimizer_state = resumed_state;
    options.lost_after = super::values::lost_after(args.lost_after).map_err(Failure::Usage)?;
    options.wire = args.wire;
    let authenticated = options.secret.is_some();
    let server = TcpServer::bind(&args.listen, options).map_err(|e| Failure::Usage(e.0))?;
    let addr = server.local_addr().map_err(|e| Failure::Run(e.0))?;
    stop_on_signals(&server.handle().stop_flag()).map_err(Failure::Run)?;
    let handle = server.handle();
    let peers = if args.remote_groups { "group servers" } else { "workers" };
    let model = source.name(model_name(&args.workload), args.resume.then_some(args.checkpoint.as_deref()).flatten());
    let workload = source.workload();
    // The noisy quadratic model has a test loss but no accuracy.
    let has_accuracy = !matches!(args.workload.model, crate::workload::ModelKind::Nqm { .. });
    eprintln!(
        "serve: {} with {}, {model} ({dim} params){}{}, listening on {addr}{}",
        protocol.name(),
        super::summary::count(n, peers),
        rule_note(&settings_rule),
        super::shard::describe(&server.options().settings),
        if authenticated { ", authenticated" } else { " (no shared secret)" }
    );
    // `--steps` is the whole run's budget: a resumed run goes on with what is left of it.
    let plan = RunPlan { max_gradients: budget.saturating_sub(stamp.accepted_before), time_limit };
    let bound = Instant::now();
    let start = std::cell::Cell::new(None::<Instant>);
    let clock = || start.get().map_or(0.0, |t| t.elapsed().as_secs_f64());
    let mut curve: Vec<EvalPoint> = Vec::new();
    let mut time_to_target = None;
    let mut last_eval: Option<Instant> = None;
    let mut last_print: Option<Instant> = None;
    let mut evaluate =
        |workload: &crate::workload::Workload, version: Version, params: &[f32], curve: &mut Vec<EvalPoint>| {
            let e = workload.model.evaluate(params, &workload.test);
            let point = EvalPoint { time_s: clock(), version: version.0, accuracy: e.accuracy, loss: e.loss };
            if time_to_target.is_none() && e.accuracy >= args.target {
                time_to_target = Some(point.time_s);
            }
            curve.push(point);
            point
        };
    let mut on_note = |note: Note<'_>| match note {
        Note::Log(line) => eprintln!("serve: {line}"),
        Note::Event(_) => {}
        Note::Started => {
            start.set(Some(Instant::now()));
            let wait = bound.elapsed().as_secs_f64();
            eprintln!("serve: all {n} {peers} connected after {wait:.2} s; the run's clock starts now");
        }
        Note::Model { version, params } if whole => {
            if let Some(t) = recorded.as_mut() {
                t.tick();
            }
            let Some(workload) = workload else {
                return;
            };
            if last_eval.is_none_or(|t| t.elapsed() >= Duration::from_millis(50)) {
                last_eval = Some(Instant::now());
                let p = evaluate(workload, version, params, &mut curve);
                if !p.loss.is_finite() {
                    // A model whose loss is not finite cannot recover: the run ends, as in `train`.
                    eprintln!("serve: version {} test loss {}: the model has diverged, stopping", p.version, p.loss);
                    handle.diverged();
                }
                if last_print.is_none_or(|t: Instant| t.elapsed() >= Duration::from_secs(1)) {
                    last_print = Some(Instant::now());
                    if has_accuracy {
                        eprintln!("serve: version {} test accuracy {:.4} loss {:.4}", p.version, p.accuracy, p.loss);
                    } else {
                        eprintln!("serve: version {} test loss {:.4}", p.version, p.loss);
                    }
                }
            }
        }
        Note::Model { version, .. } => {
            if last_print.is_none_or(|t: Instant| t.elapsed() >= Duration::from_secs(1)) {
                last_print = Some(Instant::now());
                eprintln!("serve: version {} (this shard's slice)", version.0);
            }
        }
        Note::Contribution { worker, msg, step_seconds } => {
            if let Some(t) = recorded.as_mut() {
                t.record(worker, msg, step_seconds);
            }
        }
        // The trace covers every checkpoint: a server killed after one leaves its rows.
        Note::Checkpoint { .. } => {
            if let Some(t) = recorded.as_mut() {
                t.flush_all();
            }
        }
    };
    let report = match params {
        Some(params) => server.run(params, version, &plan, &mut on_note),
        None => server.run_with_initial_from_worker(&plan, &mut on_note),
    }
    .map_err(|e| Failure::Run(e.0))?;
    if let Some(workload) = workload.filter(|_| whole) {
        if curve.last().is_none_or(|p| p.version != report.version.0) {
            evaluate(workload, report.version, &report.params, &mut curve);
        }
    }
    if !report.initial_model_known {
        eprintln!("serve: worker 0 never sent the initial parameters: the run trained nothing");
    }
    if report.reason == StopReason::Stopped {
        eprintln!("serve: interrupted: the workers were told to stop");
    }
    if report.reason == StopReason::WorkersGone {
        eprintln!(
            "serve: every worker left (another shard ended the run) and none came back within --lost-after: \
             this shard ends"
        );
    }
    eprintln!("serve: finished ({:?}) at version {}", report.reason, report.version.0);
    // The run's clock starts when every worker has connected: a server stopped before
    // that ran nothing, and its summary says so with a zero time.
    let started = start.get().is_some();
    if !started {
        eprintln!("serve: stopped before all {n} {peers} connected: the run never started");
    }
    let wall_s = if started { report.wall_s } else { 0.0 };
    let threads = ThreadReport {
        curve,
        time_to_target_s: time_to_target,
        wall_s,
        stats: report.stats,
        workers: report
            .per_worker
            .iter()
            .zip(&report.busy_s)
            .map(|(c, busy)| WorkerTally { computed: *c, busy_s: *busy, wall_s, ..WorkerTally::default() })
            .collect(),
        staleness: report.staleness,
        stalls: report.stalls,
        refused: report.refused,
        lost: report.lost,
        params: Vec::new(),
        ledger: crate::thread::ThreadLedger {
            refused_not_finite: report.refused_not_finite,
            ..crate::thread::ThreadLedger::default()
        },
    };
    let mut summary = Summary::from_threads(&threads, protocol.name(), n, &model, dim, args.workload.seed, args.target);
    summary.mode = if whole { "tcp" } else { "tcp-shard" }.into();
    if workload.is_none() || !whole {
        summary.without_test_set(workload.is_none());
    }
    summary.momentum = args.optimizer.momentum;
    // Without a test set there is no evaluation to take the version from.
    summary.updates = report.version.0;
    if workload.is_none() || args.target_loss.is_some() || !report.loss_curve.is_empty() {
        summary.loss_curve = Some(LossCurve::new(report.loss_curve.clone(), args.target_loss));
    }
    summary.stragglers = Some(report.stragglers.clone());
    summary.ledger = Some(TcpLedger {
        received: report.received,
        refused: report.refused_contributions,
        discarded: report.discarded,
        in_flight_at_stop: report.in_flight_at_stop,
        via_shared_memory: report.via_shared_memory,
        sessions: report.session_ledgers.clone(),
        workers_lost: report.lost,
        resumed,
    });
    let saved = args.save.as_deref().map(|path| {
        // Without a model there is nothing to save (an error); a run that never started
        // has only its initial model, and an existing file keeps the model of the run that
        // wrote it.
        if started || !report.initial_model_known {
            model_source::save(path, &report.params, report.initial_model_known)
        } else {
            eprintln!("serve: --save {}: nothing written: the run never started", path.display());
            Ok(())
        }
    });
    let traced = match (args.record_trace.as_deref(), recorded) {
        (Some(path), Some(t)) => Some(close_trace(path, t)),
        _ => None,
    };
    summary.print(args.json);
    match (saved, traced) {
        (Some(Err(e)), _) | (_, Some(Err(e))) => Err(Failure::Run(e)),
        _ => Ok(()),
    }
}

/// Writes the rest of the recorded trace to `path`, saying on stderr how many steps it
/// holds and how many contributions came without step times.
fn close_trace(path: &Path, t: ServedTrace) -> Result<(), String> {
    let (rows, without) = (t.len(), t.without_times);
    if rows == 0 {
        eprintln!("serve: no worker sent step times: {} holds no steps", path.display());
    }
    t.close()?;
    let missing =
        if without > 0 { format!(" ({without} contributions came without step times)") } else { String::new() };
    eprintln!("serve: wrote {rows} steps to the trace {}{missing}", path.display());
    Ok(())
}
