//! `syncopate group`: one group server of the grouped protocol as its own process. It
//! connects upstream to `serve --protocol grouped --remote-groups ...` as group `--group`,
//! learns the run's settings there, and serves its members, which connect with `work
//! --connect` exactly as they would to `serve`.

use super::deadlines::Deadlines;
use super::failure::Failure;
use crate::tcp::{GroupOptions, Note, RunPlan, ServerOptions, StopReason, TcpServer, run_group};
use clap::Args;
use core::time::Duration;
use std::path::PathBuf;
use syncopate::WorkerId;

/// Flags of `syncopate group`.
#[derive(Clone, Debug, Args)]
pub struct GroupArgs {
    /// Address to listen on for this group's members. Without a shared secret only loopback
    /// addresses are allowed, unless --insecure is given.
    #[arg(long, value_name = "ADDR", default_value = "127.0.0.1:7071")]
    pub listen: String,
    /// The central server's address (`serve --protocol grouped --remote-groups ...`); the
    /// run's settings come from it.
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
    /// The connection deadlines.
    #[command(flatten)]
    pub deadlines: Deadlines,
    /// A member (or the central server) silent this many seconds (no message, no
    /// heartbeat) is lost. Heartbeats go out every tenth of it (between 10 ms and 1 s).
    #[arg(long, value_name = "SECS", default_value_t = 10.0)]
    pub lost_after: f64,
}

/// Runs `syncopate group`.
pub(super) fn run(args: &GroupArgs) -> Result<(), Failure> {
    super::work::check_address(&args.connect).map_err(Failure::Usage)?;
    let time_limit = super::values::time_limit(args.time_limit).map_err(Failure::Usage)?;
    let lost_after = super::values::lost_after(args.lost_after).map_err(Failure::Usage)?;
    let secret = super::values::load_secret(args.secret_file.as_deref()).map_err(Failure::Usage)?;
    let frame_timeout = args.deadlines.frame();
    let mut up = GroupOptions::new(args.connect.clone(), args.group);
    up.key = secret.as_ref().map(|s| s.worker_key(WorkerId(args.group)));
    up.handshake_timeout = args.deadlines.handshake();
    up.frame_timeout = frame_timeout;
    up.backoff.give_up_after = Duration::from_secs(args.give_up_after);
    up.lost_after = lost_after;
    let mut bind_error = None;
    let mut bind = |settings: crate::tcp::RunSettings| {
        let label = settings.label();
        let members = settings.worker_config().ok().filter(|c| c.tiers().is_some()).map(|c| {
            (0..c.workers())
                .filter(|w| c.subserver_of(WorkerId(*w)) == Some(args.group))
                .map(|w| w.to_string())
                .collect::<Vec<_>>()
                .join(",")
        });
        let mut options = ServerOptions::new(settings);
        options.secret = secret.clone();
        options.insecure = args.insecure;
        options.handshake_timeout = args.deadlines.handshake();
        options.frame_timeout = frame_timeout;
        options.lost_after = lost_after;
        let server = TcpServer::bind(&args.listen, options).inspect_err(|e| bind_error = Some(e.0.clone()))?;
        let addr = server.local_addr()?;
        eprintln!(
            "group: group {} (workers {}) of {label}, listening on {addr}, central server {}",
            args.group,
            members.unwrap_or_default(),
            args.connect
        );
        Ok(server)
    };
    let plan = RunPlan { max_gradients: u64::MAX, time_limit };
    let result = run_group(&up, &mut bind, &plan, &mut |note| match note {
        // Stall reports come as log lines (the server names every worker it waits for).
        Note::Log(line) => eprintln!("group: {line}"),
        Note::Event(_) | Note::Model { .. } | Note::Started | Note::Contribution { .. } | Note::Checkpoint { .. } => {}
    });
    let report = match (result, bind_error) {
        (Ok(r), _) => r,
        (Err(e), Some(_)) => return Err(Failure::Usage(e.0)),
        (Err(e), None) if e.0.contains("out of range") => return Err(Failure::Usage(e.0)),
        (Err(e), None) => return Err(Failure::Run(e.0)),
    };
    println!(
        "group: group {} finished ({:?}) at version {} after {} member gradients in {:.2} s",
        args.group, report.reason, report.version.0, report.stats.accepted, report.wall_s
    );
    if report.reason == StopReason::UpstreamLost {
        return Err(Failure::Run("the connection to the central server was lost; restart this group".into()));
    }
    Ok(())
}
