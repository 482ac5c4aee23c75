//! A sub-server of a two-level protocol as its own process (`syncopate group`: a group
//! server of the grouped protocol, the one protocol with sub-servers today).
//!
//! Upstream it is worker `g` of a central server started with `serve --protocol grouped
//! --remote-groups ...`: it connects with the worker's client handshake in the group role
//! and learns the run's settings from the central server, which runs the central
//! configuration of the protocol's tiers ([`ProtocolConfig::tiers`]; grouped: ASP over the
//! `G` groups). Toward its member workers it is then a [`TcpServer`] like `serve` (same
//! handshake, framing, authentication and admission), announcing the same settings; it
//! drives the core's sub-server ([`AnyServer::subserver`]), and the run loop of
//! [`TcpServer::drive`] carries its [`ServerOutput::Upstream`] messages up and the central
//! server's replies down to [`Server::handle_upstream`]: no protocol-specific code. Nothing
//! but the central server's address and the group's index needs repeating.
//!
//! [`ServerOutput::Upstream`]: syncopate::ServerOutput::Upstream
//! [`Server::handle_upstream`]: syncopate::Server::handle_upstream
//!
//! A lost upstream connection ends the run ([`StopReason::UpstreamLost`](super::StopReason))
//! without telling the members to stop: restart the process, the central server sees a new
//! session of the group (a rejoin) and the members reconnect to the new process.

use super::TcpError;
use super::auth::WorkerKey;
use super::frame::FrameTimeout;
use super::handshake::{self, ClientSide, Role};
use super::server::{Note, RunPlan, ServerReport, TcpServer, Uplink};
use super::settings::RunSettings;
use super::worker::{Backoff, ConnectError, Opened, Retry, open};
use core::time::Duration;
use std::time::Instant as StdInstant;
use syncopate::proto::Heap;
use syncopate::{AnyServer, WorkerId};
#[cfg(doc)]
use syncopate::{ProtocolConfig, Server};

/// How a group server reaches its central server.
#[derive(Clone, Debug)]
pub struct GroupOptions {
    /// The central server's address (`host:port`).
    pub central: String,
    /// This group's index `g` (its worker id at the central server), in `0..G`.
    pub group: u32,
    /// The key of worker `g` under the central server's secret, if it authenticates.
    pub key: Option<WorkerKey>,
    /// The upstream handshake's absolute deadline.
    pub handshake_timeout: Duration,
    /// The deadline of each upstream frame, from its first byte.
    pub frame_timeout: FrameTimeout,
    /// How long one upstream socket write may block.
    pub write_timeout: Duration,
    /// Retry timing while the central server cannot be reached.
    pub backoff: Backoff,
    /// How long the central server may stay silent before the upstream session is lost (the
    /// group's server options must say the same).
    pub lost_after: Duration,
}

impl GroupOptions {
    /// Defaults: no key, 5 s handshake, 10 s frames, default backoff.
    pub fn new(central: impl Into<String>, group: u32) -> Self {
        Self {
            central: central.into(),
            group,
            key: None,
            handshake_timeout: Duration::from_secs(5),
            frame_timeout: FrameTimeout::default(),
            write_timeout: Duration::from_secs(10),
            backoff: Backoff::default(),
            lost_after: super::DEFAULT_LOST_AFTER,
        }
    }
}

/// Runs group `options.group`: connects to the central server (retrying with backoff),
/// learns the run's settings from it, binds the members' server with `bind` (given the
/// settings the members are to receive), then serves the group's members until the central
/// server says stop, the upstream connection is lost, or the plan says stop.
pub fn run_group(
    options: &GroupOptions,
    bind: &mut dyn FnMut(RunSettings) -> Result<TcpServer, TcpError>,
    plan: &RunPlan,
    note: &mut dyn FnMut(Note<'_>),
) -> Result<ServerReport, TcpError> {
    super::check_lost_after(options.lost_after)
        .map_err(|e| TcpError(format!("group {}: lost_after: {e}", options.group)))?;
    let (uplink, epoch, settings) = connect_upstream(options, note)?;
    let config = settings.worker_config().map_err(|e| TcpError(format!("group: {e}")))?;
    let Some(tiers) = config.tiers() else {
        return Err(TcpError(format!(
            "group {}: the central server runs {}, which has no sub-servers",
            options.group,
            settings.label()
        )));
    };
    if options.group >= tiers.subservers {
        return Err(TcpError(format!("group {} is out of range: {} groups", options.group, tiers.subservers)));
    }
    let members = RunSettings { remote_groups: false, ..settings };
    let server = bind(members)?;
    let dim = server.dim();
    let model = vec![0.0f32; dim];
    let scratch = vec![0.0f32; config.subserver_scratch_len(dim)];
    let group: AnyServer<f32, Vec<f32>, Heap> = AnyServer::subserver(&config, options.group, epoch, model, scratch)
        .map_err(|e| TcpError(format!("invalid protocol settings: {e}")))?;
    server.drive(group, Some(uplink), plan, note)
}

/// Connects and shakes hands with the central server as group `g`, retrying transient
/// failures with backoff; returns the session, the epoch the central server assigned and
/// the run's settings.
fn connect_upstream(
    options: &GroupOptions,
    note: &mut dyn FnMut(Note<'_>),
) -> Result<(Uplink, u32, RunSettings), TcpError> {
    let g = options.group;
    let mut retry = Retry::new(options.backoff, u64::from(g));
    let mut log = |line: &str| note(Note::Log(line));
    let done = retry
        .until_connected(
            &format!("group {g}"),
            &mut log,
            |_| try_connect(options),
            |e| match e {
                ConnectError::Unreachable(e) => format!("central server unreachable ({e})"),
                ConnectError::Handshake(e) => format!("central server: {e}"),
                ConnectError::Job(e) => e.clone(),
                ConnectError::Killed => "killed".to_owned(),
            },
        )
        .map_err(|e| match e {
            ConnectError::Unreachable(e) => TcpError(format!(
                "group {g}: cannot reach the central server at {}: {e} (gave up after {:.0} s)",
                options.central,
                retry.give_up_after_s()
            )),
            ConnectError::Handshake(e) => TcpError(format!("group {g}: central server: {e}")),
            ConnectError::Job(e) => TcpError(format!("group {g}: {e}")),
            ConnectError::Killed => TcpError(format!("group {g}: killed")),
        })?;
    log(&format!(
        "group {g}: connected to the central server at {} (epoch {}; {})",
        options.central,
        done.1,
        done.2.label()
    ));
    Ok(done)
}

/// One attempt.
fn try_connect(options: &GroupOptions) -> Result<(Uplink, u32, RunSettings), ConnectError> {
    let addr = &options.central;
    let Opened { stream, mut reader, mut writer } =
        open(addr, options.handshake_timeout, options.write_timeout, options.frame_timeout)?;
    let deadline = StdInstant::now() + options.handshake_timeout;
    let me = ClientSide {
        worker: WorkerId(options.group),
        role: Role::Group,
        key: options.key.as_ref(),
        want: None,
        dim: None,
        lost_after: options.lost_after,
        wire: Some(syncopate::wire::Encoding::F32),
    };
    let (session, settings) =
        handshake::client_handshake(&mut reader, &mut writer, &me, deadline).map_err(ConnectError::Handshake)?;
    let dim = settings.dim().map_err(ConnectError::Job)?;
    super::frame::tune_stream(&stream, super::session_max_len(dim)).map_err(ConnectError::io)?;
    let beat = session.beat(options.lost_after);
    Ok((Uplink { addr: addr.clone(), stream, reader, writer, beat }, session.epoch, settings))
}
