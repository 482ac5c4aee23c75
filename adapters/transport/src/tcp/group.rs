//! A group server of the grouped protocol as its own process (`syncopate group`).
//!
//! Toward its member workers it is a [`TcpServer`] like `serve` (same handshake, framing,
//! authentication and caps; the members present the grouped protocol's settings). Upstream
//! it is worker `g` of a central ASP server with `G` workers: it connects with the same
//! client handshake a worker uses, presenting the central settings
//! ([`GroupedConfig::central_config`]), and the run loop of [`TcpServer::drive`] carries the
//! group's aggregates up and the central models back down.
//!
//! The central server is `syncopate serve --protocol asp --workers G`, and its learning rate
//! per gradient must be the grouped configuration's `η`: `serve` divides `--lr` by the
//! workers for ASP, so start it with `--lr` = the grouped `--lr` × `G` (otherwise its
//! handshake refuses the group with "protocol settings differ").
//!
//! A lost upstream connection ends the run ([`StopReason::UpstreamLost`](super::StopReason))
//! without telling the members to stop: restart the process, the central server sees a new
//! session of the group (a rejoin) and the members reconnect to the new process.

use super::TcpError;
use super::auth::WorkerKey;
use super::frame::{FrameReader, FrameTimeout, FrameWriter};
use super::handshake::{self, Terms};
use super::server::{Note, RunPlan, ServerReport, TcpServer, Uplink};
use super::worker::Backoff;
use core::net::SocketAddr;
use core::time::Duration;
use std::io::BufWriter;
use std::net::{TcpStream, ToSocketAddrs};
use std::thread;
use std::time::Instant as StdInstant;
use syncopate::proto::grouped::{GroupServer, GroupedConfig};
use syncopate::{ProtocolConfig, WorkerId};

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
        }
    }
}

/// Runs group `options.group` of `config`: connects to the central server (retrying with
/// backoff), then serves the group's members on `server` (bound with
/// `ProtocolConfig::Grouped(config)`) until the central server says stop, the upstream
/// connection is lost, or the plan says stop.
pub fn run_group(
    server: TcpServer,
    config: GroupedConfig,
    options: &GroupOptions,
    plan: &RunPlan,
    note: &mut dyn FnMut(Note<'_>),
) -> Result<ServerReport, TcpError> {
    let dim = server.options().dim;
    if server.options().protocol != ProtocolConfig::Grouped(config) {
        return Err(TcpError("the group server must be bound with the grouped protocol's settings".into()));
    }
    if options.group >= config.groups {
        return Err(TcpError(format!("group {} is out of range: {} groups", options.group, config.groups)));
    }
    let terms = Terms::new(&ProtocolConfig::Asp(config.central_config()), dim);
    let (uplink, epoch) = connect_upstream(options, &terms, dim, note)?;
    let model = vec![0.0f32; dim];
    let scratch = vec![0.0f32; config.group_scratch_len(dim)];
    let group = GroupServer::new(config, options.group, epoch, model, scratch)
        .map_err(|e| TcpError(format!("invalid protocol settings: {e}")))?;
    server.drive(group, Some(uplink), plan, note)
}

/// Connects and shakes hands with the central server as worker `g`, retrying transient
/// failures with backoff; returns the session and the epoch the central server assigned.
fn connect_upstream(
    options: &GroupOptions,
    terms: &Terms,
    dim: usize,
    note: &mut dyn FnMut(Note<'_>),
) -> Result<(Uplink, u32), TcpError> {
    let started = StdInstant::now();
    let mut wait = options.backoff.initial;
    loop {
        match try_connect(options, terms, dim) {
            Ok(done) => {
                note(Note::Log(&format!(
                    "group {}: connected to the central server at {} (epoch {})",
                    options.group, options.central, done.1
                )));
                return Ok(done);
            }
            Err((why, transient)) => {
                if !transient {
                    return Err(TcpError(format!("group {}: {why}", options.group)));
                }
                if started.elapsed() >= options.backoff.give_up_after {
                    return Err(TcpError(format!(
                        "group {}: cannot reach the central server at {}: {why} (gave up after {:.0} s)",
                        options.group,
                        options.central,
                        options.backoff.give_up_after.as_secs_f64()
                    )));
                }
            }
        }
        thread::sleep(wait);
        wait = (wait * 2).min(options.backoff.max);
    }
}

/// One attempt; the error says whether retrying may help.
fn try_connect(options: &GroupOptions, terms: &Terms, dim: usize) -> Result<(Uplink, u32), (String, bool)> {
    let addr = &options.central;
    let addrs: Vec<SocketAddr> =
        addr.to_socket_addrs().map_err(|e| (format!("invalid central server address '{addr}': {e}"), false))?.collect();
    let mut stream = Err(format!("'{addr}' resolves to nothing"));
    for a in addrs {
        stream = TcpStream::connect_timeout(&a, options.handshake_timeout).map_err(|e| format!("connect to {a}: {e}"));
        if stream.is_ok() {
            break;
        }
    }
    let stream = stream.map_err(|e| (e, true))?;
    let io = |e: std::io::Error| (e.to_string(), true);
    super::frame::tune_stream(&stream, super::session_max_len(dim)).map_err(io)?;
    stream.set_write_timeout(Some(options.write_timeout)).map_err(io)?;
    let mut reader = FrameReader::new(stream.try_clone().map_err(io)?, 0, options.frame_timeout);
    let mut writer = FrameWriter::new(BufWriter::with_capacity(1 << 16, stream.try_clone().map_err(io)?), 0);
    let deadline = StdInstant::now() + options.handshake_timeout;
    let session = handshake::client_handshake(
        &mut reader,
        &mut writer,
        terms,
        WorkerId(options.group),
        options.key.as_ref(),
        deadline,
        super::session_max_len(dim),
    )
    .map_err(|e| {
        let transient = e.is_transient();
        (format!("central server: {e}"), transient)
    })?;
    Ok((Uplink { addr: addr.clone(), stream, reader, writer }, session.epoch))
}
