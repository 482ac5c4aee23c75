//! `syncopate group`: one group server of the grouped protocol as its own process. Its
//! members connect with `work --protocol grouped ...` exactly as they would to `serve`; it
//! connects upstream to `serve --protocol asp --workers G --lr <grouped lr × G>` as worker
//! `--group`.

use super::{Failure, ProtocolArgs, WorkloadArgs};
use crate::tcp::{FrameTimeout, GroupOptions, Note, RunPlan, ServerOptions, StopReason, TcpServer, run_group};
use clap::Args;
use core::time::Duration;
use std::path::PathBuf;
use syncopate::{ProtocolConfig, ServerEvent, WorkerId};

/// Flags of `syncopate group`.
#[derive(Clone, Debug, Args)]
pub struct GroupArgs {
    /// The protocol and its knobs: --protocol grouped, --groups G, --workers N, --lr ... (the
    /// members pass the same).
    #[command(flatten)]
    pub protocol: ProtocolArgs,
    /// The model, data and seed (only the model's size is used here).
    #[command(flatten)]
    pub workload: WorkloadArgs,
    /// Address to listen on for this group's members. Without a shared secret only loopback
    /// addresses are allowed, unless --insecure is given.
    #[arg(long, value_name = "ADDR", default_value = "127.0.0.1:7071")]
    pub listen: String,
    /// The central server's address (`serve --protocol asp --workers G`).
    #[arg(long, value_name = "ADDR")]
    pub connect: String,
    /// This group's index g, in 0..groups (its worker id at the central server).
    #[arg(long)]
    pub group: u32,
    /// File holding the shared secret (members and the central server use the same one);
    /// otherwise $SYNCOPATE_SECRET if set.
    #[arg(long, value_name = "FILE")]
    pub secret_file: Option<PathBuf>,
    /// Allow listening beyond loopback without a shared secret.
    #[arg(long)]
    pub insecure: bool,
    /// Give up after this many seconds without reaching the central server.
    #[arg(long, value_name = "SECS", default_value_t = 30)]
    pub give_up_after: u64,
    /// Stop after this many seconds, whatever the progress.
    #[arg(long, value_name = "SECS")]
    pub time_limit: Option<f64>,
    /// Absolute deadline of a connection's handshake, in milliseconds.
    #[arg(long, value_name = "MS", default_value_t = 5000, value_parser = clap::value_parser!(u64).range(1..))]
    pub handshake_timeout: u64,
    /// Deadline of one frame from its first byte, in milliseconds (plus 1 s per MiB).
    #[arg(long, value_name = "MS", default_value_t = 10000, value_parser = clap::value_parser!(u64).range(1..))]
    pub frame_timeout: u64,
}

/// Runs `syncopate group`.
pub(super) fn run(args: &GroupArgs) -> Result<(), Failure> {
    let time_limit = match args.time_limit {
        Some(t) if !(t.is_finite() && t > 0.0) => {
            return Err(Failure::Usage(format!("invalid value '{t}' for '--time-limit': must be a positive number")));
        }
        t => t.map(Duration::from_secs_f64),
    };
    let protocol = args.protocol.config().map_err(Failure::Usage)?;
    let ProtocolConfig::Grouped(config) = protocol else {
        return Err(Failure::Usage(format!("--protocol {}: `group` runs the grouped protocol", protocol.name())));
    };
    if args.group >= config.groups {
        return Err(Failure::Usage(format!(
            "--group {} is out of range: --groups {} allows 0..{}",
            args.group, config.groups, config.groups
        )));
    }
    let workload = args.workload.workload().map_err(Failure::Usage)?;
    let dim = workload.model.dim();
    let secret = super::serve::load_secret(args.secret_file.as_deref()).map_err(Failure::Usage)?;
    let frame_timeout = FrameTimeout { base: Duration::from_millis(args.frame_timeout), ..FrameTimeout::default() };
    let mut up = GroupOptions::new(args.connect.clone(), args.group);
    up.key = secret.as_ref().map(|s| s.worker_key(WorkerId(args.group)));
    up.handshake_timeout = Duration::from_millis(args.handshake_timeout);
    up.frame_timeout = frame_timeout;
    up.backoff.give_up_after = Duration::from_secs(args.give_up_after);
    let mut options = ServerOptions::new(protocol, dim);
    options.secret = secret;
    options.insecure = args.insecure;
    options.handshake_timeout = Duration::from_millis(args.handshake_timeout);
    options.frame_timeout = frame_timeout;
    let server = TcpServer::bind(&args.listen, options).map_err(|e| Failure::Usage(e.0))?;
    let addr = server.local_addr().map_err(|e| Failure::Run(e.0))?;
    let members = (0..config.workers).filter(|w| config.group_of(WorkerId(*w)) == Some(args.group));
    let members: Vec<String> = members.map(|w| w.to_string()).collect();
    eprintln!(
        "group: group {} of {} (workers {}), listening on {addr}, central server {}",
        args.group,
        config.groups,
        members.join(","),
        args.connect
    );
    let plan = RunPlan { max_gradients: u64::MAX, time_limit };
    let report = run_group(server, config, &up, &plan, &mut |note| match note {
        Note::Log(line) => eprintln!("group: {line}"),
        Note::Event(ServerEvent::Stalled { waiting_for, missing, .. }) => {
            eprintln!("group: stalled: waiting for worker {} ({missing} missing)", waiting_for.0);
        }
        Note::Event(_) | Note::Model { .. } => {}
    })
    .map_err(|e| Failure::Run(e.0))?;
    println!(
        "group: group {} finished ({:?}) at version {} after {} member gradients in {:.2} s",
        args.group, report.reason, report.version.0, report.stats.accepted, report.wall_s
    );
    if report.reason == StopReason::UpstreamLost {
        return Err(Failure::Run("the connection to the central server was lost; restart this group".into()));
    }
    Ok(())
}
