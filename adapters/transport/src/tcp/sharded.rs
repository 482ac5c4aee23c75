//! The worker of a sharded run: one TCP session per shard (`serve --shard I/S`), driving a
//! [`ShardedWorker`] that splits each gradient into the shards' slices and assembles the
//! model from their replies.
//!
//! **Connecting.** The shards are reached in the order their addresses are given, each with
//! the unsharded worker's retrying ([`Backoff`](super::Backoff)). Shard 0's settings name
//! the run; every other shard must announce the same settings but for its index (same
//! protocol, knobs, model, workload, shard count and run id): the worker checks each
//! shard's settings inside the handshake, before it answers, so a shard listed at the wrong
//! position, a list of the wrong length or a shard of another run is refused with a line
//! naming the shard, on both sides. Once connected, a shard's settings are pinned by their
//! digest: a restarted shard must announce them again.
//!
//! **Sessions.** Each shard's session has a reader thread (frames into one channel, the
//! shard's silence judged against `lost_after`; at most a few frames per shard not yet taken
//! by the main thread, so a long step makes the readers stop and TCP push back on the shards)
//! and a writer thread (uploads from a small bounded queue, heartbeats when idle). One thread, the caller's, owns the
//! [`ShardedWorker`] and computes the gradients. A lost session (closed, silent, a bad
//! frame) is reconnected while the others stay up; the shard's inner worker is replaced by
//! a fresh one with the new epoch ([`ShardedWorker::restart_shard`]), which joins and gets
//! the shard's current model. A shard unreachable for `give_up_after` in a row ends the
//! worker with an error naming it. A session that ends after its shard said stop is not
//! reconnected.
//!
//! **Stopping.** The worker ends once every shard said stop, or, once one has, when the
//! others have not within `lost_after` (a shard whose budget was met counts its own
//! slices; the others normally follow at once).

use super::auth::WorkerKey;
use super::frame::{FrameError, FrameReader};
use super::handshake::{self, ClientSide, HandshakeError, RefuseCode, Role};
use super::payload::FromServerKind;
use super::settings::RunSettings;
use super::worker::step::{Held, compute, refused};
use super::worker::{ConnectError, Opened, Retry, open};
use super::writer::{Ledger, UPLOADS_IN_FLIGHT, Upload, write_uploads};
use super::{TcpError, WorkerJob, WorkerOptions, WorkerReport, at, core_duration, since};
use core::sync::atomic::Ordering;
use core::time::Duration;
use crossbeam_channel::{Receiver, RecvTimeoutError, Sender, bounded, unbounded};
use std::net::{Shutdown, TcpStream};
use std::sync::Arc;
use std::thread;
use std::time::Instant as StdInstant;
use syncopate::proto::sharded::{HeapShardedWorker, ShardLayout, ShardSlot, ShardedOutput, ShardedWorker};
use syncopate::wire::{Encoding, Limits};
use syncopate::{AnyWorker, ProtocolConfig, Worker, WorkerEvent, WorkerSetup, WorkerStats};

/// One shard's part of a [`ShardedReport`].
#[derive(Clone, Debug, Default, PartialEq, serde::Serialize)]
pub struct ShardTally {
    /// The shard's address.
    pub addr: String,
    /// Sessions established with it.
    pub sessions: u32,
    /// Distinct contributions (slices) written whole to its connections.
    pub sent: u64,
    /// Contributions written again with a sequence number already sent.
    pub resent: u64,
    /// The newest version of its slice received.
    pub last_version: Option<u64>,
    /// Whether it said stop.
    pub stopped: bool,
}

/// What a sharded worker did: the totals (as an unsharded worker reports them, `sent`
/// and `resent` summed over the shards) and each shard's part.
#[derive(Clone, Debug, Default, PartialEq, serde::Serialize)]
pub struct ShardedReport {
    /// The totals.
    #[serde(flatten)]
    pub total: WorkerReport,
    /// Per shard, in shard order.
    pub shards: Vec<ShardTally>,
}

/// The shards' addresses in `list` (comma separated, in shard order).
pub fn shard_addresses(list: &str) -> Vec<String> {
    list.split(',').map(|a| a.trim().to_owned()).collect()
}

/// Runs a worker of a sharded run: `options.addr` lists the shards' addresses, comma
/// separated, in shard order (see the [module docs](self)). `job` computes gradients of
/// the whole model; `log` sees one line per connection event.
pub fn run_sharded_worker(
    options: &WorkerOptions,
    job: &mut dyn WorkerJob,
    log: &mut dyn FnMut(&str),
) -> Result<ShardedReport, TcpError> {
    let started = StdInstant::now();
    let me = options.id.0;
    let addrs = shard_addresses(&options.addr);
    let count = u32::try_from(addrs.len()).map_err(|_| TcpError(format!("worker {me}: too many shards")))?;
    super::check_lost_after(options.lost_after).map_err(|e| TcpError(format!("worker {me}: lost_after: {e}")))?;
    let mut run = Run {
        options,
        addrs: &addrs,
        count,
        first: None,
        pinned: vec![None; addrs.len()],
        links: Vec::new(),
        inbound: unbounded(),
        spare: bounded(2 * addrs.len() + 1),
        report: ShardedReport {
            shards: addrs.iter().map(|a| ShardTally { addr: a.clone(), ..ShardTally::default() }).collect(),
            ..ShardedReport::default()
        },
        stats: vec![WorkerStats::default(); addrs.len()],
        generation: 0,
        wire: options.wire,
    };
    let result = run.start(job, log).and_then(|(worker, config)| run.drive(worker, &config, job, log));
    for k in 0..run.links.len() {
        run.close(k, true);
    }
    let mut report = run.report;
    report.total.wall_s = started.elapsed().as_secs_f64();
    result.map(|()| report)
}

/// A live session with one shard.
struct Link {
    generation: u64,
    stream: TcpStream,
    uploads: Option<Sender<(Vec<u8>, Upload)>>,
    /// What its writer wrote; the writer holds the other reference while it runs.
    ledger: Arc<Ledger>,
    /// Buffers the main thread gives back to this session's reader.
    home: Sender<Vec<u8>>,
    /// Whether the session ended (its reader reported it).
    lost: bool,
}

/// The frames of one shard its reader may hand the main thread before the main thread gives a
/// buffer back. While the main thread is busy (a long step), a reader with none left stops
/// reading, and TCP's flow control pushes back on the shard: what a worker holds of a shard
/// is bounded, as an unsharded worker's socket bounds it.
const FRAMES_IN_FLIGHT: usize = 4;

/// A shard session's reader: frames into `to_main`, each in a buffer from `pool` (it waits
/// for one when all are out), until the session ends (reported as lost, with why: closed,
/// broken, or silent for `lost_after`) or the main thread lets go of the session.
fn read_shard(
    reader: &mut FrameReader,
    pool: &Receiver<Vec<u8>>,
    to_main: &Sender<FromShard>,
    (shard, generation): (usize, u64),
    lost_after: Duration,
) {
    // When the shard was last heard from. The reader waits in short slices: one that ends
    // long past its deadline means this process did not run (stopped, suspended), and that
    // silence is not the shard's.
    let mut heard = StdInstant::now();
    while let Ok(mut buf) = pool.recv() {
        let (start, end) = loop {
            let wake = (StdInstant::now() + Duration::from_millis(100)).min(heard + lost_after);
            match reader.read_frame(&mut buf, Some(wake)) {
                // A heartbeat: the shard is there; the buffer is kept for the next frame.
                Ok(p) if p.start == p.end => heard = StdInstant::now(),
                Ok(p) => break (p.start, p.end),
                Err(FrameError::Idle) if StdInstant::now().saturating_duration_since(wake) >= lost_after => {
                    heard = StdInstant::now();
                }
                Err(FrameError::Idle) if heard.elapsed() < lost_after => {}
                Err(e) => {
                    let why = match e {
                        FrameError::Idle => {
                            format!(
                                "the shard was silent for {:.1} s (no frame, no heartbeat)",
                                lost_after.as_secs_f64()
                            )
                        }
                        e => e.to_string(),
                    };
                    let _ = to_main.send(FromShard::Lost { shard, generation, why });
                    return;
                }
            }
        };
        heard = StdInstant::now();
        if to_main.send(FromShard::Frame { shard, generation, buf, start, end }).is_err() {
            return;
        }
    }
}

/// What a shard's handshake established.
struct Agreed {
    /// The session's epoch.
    epoch: u32,
    /// The shard's model version at the handshake.
    version: u64,
    /// The heartbeat interval both sides agreed on.
    beat: Duration,
    /// The shard's tensor encoding.
    wire: Encoding,
}

/// What a session's reader hands the main thread.
enum FromShard {
    Frame { shard: usize, generation: u64, buf: Vec<u8>, start: usize, end: usize },
    Lost { shard: usize, generation: u64, why: String },
}

struct Run<'a> {
    options: &'a WorkerOptions,
    addrs: &'a [String],
    count: u32,
    /// Shard 0's settings: the run.
    first: Option<RunSettings>,
    /// Each shard's settings digest, once connected.
    pinned: Vec<Option<[u8; 32]>>,
    links: Vec<Link>,
    inbound: (Sender<FromShard>, Receiver<FromShard>),
    /// Encoding buffers the writers give back.
    spare: (Sender<Vec<u8>>, Receiver<Vec<u8>>),
    report: ShardedReport,
    /// Per shard: what was handed to its connections (sequence numbers are per shard).
    stats: Vec<WorkerStats>,
    generation: u64,
    /// The tensor encoding of every shard: the worker's choice, else the first shard's
    /// (each later shard is asked for it and refuses another at its handshake).
    wire: Option<Encoding>,
}

impl Run<'_> {
    fn me(&self) -> u32 {
        self.options.id.0
    }

    fn addr(&self, shard: usize) -> &str {
        self.addrs.get(shard).map_or("", String::as_str)
    }

    /// Connects to every shard in order, checks they form one run and builds the worker.
    fn start(
        &mut self,
        job: &mut dyn WorkerJob,
        log: &mut dyn FnMut(&str),
    ) -> Result<(HeapShardedWorker<f32>, ProtocolConfig), TcpError> {
        let mut slots = Vec::with_capacity(self.addrs.len());
        let mut layout = None;
        let mut config = None;
        for k in 0..self.addrs.len() {
            let (epoch, settings) = self.connect_shard(k, log)?;
            if k == 0 {
                let refused = |e: String| TcpError(format!("worker {}: shard 0 ({}): {e}", self.me(), self.addr(0)));
                let c = settings.shard_worker_config().map_err(refused)?;
                let l = settings.shard_layout().map_err(refused)?.ok_or_else(|| refused("not a shard".into()))?;
                job.prepare(&settings).map_err(|e| TcpError(format!("worker {}: {e}", self.me())))?;
                layout = Some(l);
                config = Some(c);
                self.first = Some(settings);
            }
            let (Some(l), Some(c)) = (layout, config.as_ref()) else {
                return Err(TcpError(format!("worker {}: no shard 0", self.me())));
            };
            slots.push(ShardSlot::new(self.inner_worker(c, l, k, epoch)?));
        }
        let (Some(layout), Some(config)) = (layout, config) else {
            return Err(TcpError(format!("worker {}: --connect lists no shard", self.me())));
        };
        let worker = ShardedWorker::new(layout, slots, vec![0.0f32; layout.dim()])
            .map_err(|e| TcpError(format!("worker {}: {e}", self.me())))?;
        Ok((worker, config))
    }

    fn inner_worker(
        &self,
        config: &ProtocolConfig,
        layout: ShardLayout,
        shard: usize,
        epoch: u32,
    ) -> Result<AnyWorker<f32, Vec<f32>>, TcpError> {
        let len = layout.len(shard as u32);
        let setup =
            WorkerSetup { id: self.options.id, epoch, rejoin_after: self.options.rejoin_after.map(core_duration) };
        AnyWorker::new(config, setup, vec![0.0f32; len], vec![0.0f32; config.worker_scratch_len(len)])
            .map_err(|e| TcpError(format!("worker {}: shard {shard}: {e}", self.me())))
    }

    /// Connects to shard `shard` (retrying as an unsharded worker does) and starts its
    /// session's threads; returns the session's epoch and the shard's settings.
    fn connect_shard(&mut self, shard: usize, log: &mut dyn FnMut(&str)) -> Result<(u32, RunSettings), TcpError> {
        let me = self.me();
        let addr = self.addr(shard).to_owned();
        let mut retry = Retry::new(self.options.backoff, u64::from(me));
        let established = retry.until_connected(
            &format!("worker {me}"),
            log,
            |_| self.handshake(shard, &addr),
            |e| match e {
                ConnectError::Unreachable(e) => format!("shard {shard} at {addr} unreachable ({e})"),
                ConnectError::Handshake(e) => format!("shard {shard} at {addr}: {e}"),
                ConnectError::Job(e) => e.clone(),
                ConnectError::Killed => "killed".to_owned(),
            },
        );
        let (Opened { stream, reader, writer }, Agreed { epoch, version, beat, wire }, settings) = match established {
            Ok(session) => session,
            Err(ConnectError::Unreachable(e)) => {
                return Err(TcpError(format!(
                    "worker {me}: shard {shard} at {addr} is lost: cannot reach it: {e} (gave up after {:.0} s \
                     unreachable)",
                    retry.give_up_after_s()
                )));
            }
            // This worker's own refusal of the shard's settings names the shard already.
            Err(ConnectError::Handshake(e @ HandshakeError::Refusing { code: RefuseCode::Knobs, .. })) => {
                return Err(TcpError(format!("worker {me}: {e}")));
            }
            Err(ConnectError::Handshake(e)) => {
                return Err(TcpError(format!("worker {me}: shard {shard} at {addr}: {e}")));
            }
            Err(ConnectError::Job(e)) => return Err(TcpError(format!("worker {me}: shard {shard} at {addr}: {e}"))),
            Err(ConnectError::Killed) => return Err(TcpError(format!("worker {me}: killed"))),
        };
        if let Some(t) = self.report.shards.get_mut(shard) {
            t.sessions += 1;
        }
        self.report.total.sessions += 1;
        self.wire = Some(wire);
        self.pinned[shard] = Some(settings.digest().map_err(|e| TcpError(format!("worker {me}: {e}")))?);
        log(&format!(
            "worker {me}: connected to shard {shard} at {addr} (epoch {epoch}, shard at version {version}; {})",
            settings.label()
        ));
        self.start_link(shard, Opened { stream, reader, writer }, beat)?;
        Ok((epoch, settings))
    }

    /// One attempt to connect to shard `shard` and shake hands, checking its settings.
    fn handshake(&self, shard: usize, addr: &str) -> Result<(Opened, Agreed, RunSettings), ConnectError> {
        let options = self.options;
        let Opened { stream, mut reader, mut writer } =
            open(addr, options.handshake_timeout, options.write_timeout, options.frame_timeout)?;
        let deadline = StdInstant::now() + options.handshake_timeout;
        let key: Option<&WorkerKey> = options.key.as_ref();
        let me = ClientSide {
            worker: options.id,
            role: Role::Worker,
            key,
            want: self.pinned[shard],
            dim: None,
            lost_after: options.lost_after,
            wire: self.wire,
        };
        let (index, count, first) = (shard as u32, self.count, self.first.as_ref());
        let check = |s: &RunSettings| s.check_shard(index, count, addr, first);
        let (session, settings) = handshake::client_handshake_checked(&mut reader, &mut writer, &me, deadline, &check)
            .map_err(ConnectError::Handshake)?;
        let max = settings.dim().map(super::session_max_len).map_err(ConnectError::Job)?;
        super::frame::tune_stream(&stream, max).map_err(ConnectError::io)?;
        let beat = session.beat(options.lost_after);
        Ok((
            Opened { stream, reader, writer },
            Agreed { epoch: session.epoch, version: session.version, beat, wire: session.wire },
            settings,
        ))
    }

    /// Starts the reader and writer threads of a new session with `shard`.
    fn start_link(&mut self, shard: usize, link: Opened, beat: Duration) -> Result<(), TcpError> {
        let Opened { stream, mut reader, mut writer } = link;
        self.generation += 1;
        let generation = self.generation;
        let lost_after = self.options.lost_after;
        let (uploads, frames) = bounded::<(Vec<u8>, Upload)>(UPLOADS_IN_FLIGHT);
        let (home, pool) = bounded::<Vec<u8>>(FRAMES_IN_FLIGHT);
        for _ in 0..FRAMES_IN_FLIGHT {
            let _ = home.try_send(Vec::new());
        }
        let ledger = Arc::new(Ledger::default());
        let give_back = self.spare.0.clone();
        let w_ledger = Arc::clone(&ledger);
        let w_stream = stream.try_clone().map_err(|e| TcpError(e.to_string()))?;
        let spawn = |name: String, f: Box<dyn FnOnce() + Send>| {
            thread::Builder::new().name(name).spawn(f).map(|_| ()).map_err(|e| TcpError(format!("thread: {e}")))
        };
        spawn(
            format!("shard-{shard}-write"),
            Box::new(move || {
                // A write that failed ends the session: the reader then sees it closed.
                let _ = write_uploads(&mut writer, &frames, beat, &w_ledger, &give_back);
                drop(w_ledger);
                let _ = w_stream.shutdown(Shutdown::Both);
            }),
        )?;
        let to_main = self.inbound.0.clone();
        spawn(
            format!("shard-{shard}-read"),
            Box::new(move || read_shard(&mut reader, &pool, &to_main, (shard, generation), lost_after)),
        )?;
        let link = Link { generation, stream, uploads: Some(uploads), ledger, home, lost: false };
        match self.links.get_mut(shard) {
            Some(old) => *old = link,
            None => self.links.push(link),
        }
        Ok(())
    }

    /// Ends shard `shard`'s session: its threads exit, its counts join the report. A
    /// session that ended cleanly first lets its writer send what it holds; a lost one is cut
    /// at once (a writer blocked on a dead peer would only delay the reconnection).
    fn close(&mut self, shard: usize, clean: bool) {
        let Some(link) = self.links.get_mut(shard) else { return };
        if let Some(uploads) = link.uploads.take() {
            drop(uploads);
            if !clean {
                let _ = link.stream.shutdown(Shutdown::Both);
            }
            // The writer drains what it holds (a bounded queue) before the socket closes.
            let end = StdInstant::now() + Duration::from_secs(2);
            while Arc::strong_count(&link.ledger) > 1 && StdInstant::now() < end {
                thread::sleep(Duration::from_millis(1));
            }
            let _ = link.stream.shutdown(Shutdown::Both);
            let (sent, resent) = link.ledger.counts();
            self.report.total.sent += sent;
            self.report.total.resent += resent;
            if let Some(t) = self.report.shards.get_mut(shard) {
                t.sent += sent;
                t.resent += resent;
            }
        }
    }

    fn drive(
        &mut self,
        mut worker: HeapShardedWorker<f32>,
        config: &ProtocolConfig,
        job: &mut dyn WorkerJob,
        log: &mut dyn FnMut(&str),
    ) -> Result<(), TcpError> {
        let me = self.me();
        // The origin of the core's clock for this run.
        let origin = StdInstant::now();
        let layout = worker.layout();
        let limits: Vec<Limits> = (0..self.count).map(|k| Limits::for_model(layout.len(k))).collect();
        let mut grad = vec![0.0f32; layout.dim()];
        let mut held: Option<Held> = None;
        let mut first_stop: Option<StdInstant> = None;
        // The version of the model the held step computes on (recomputed on a refusal).
        let mut computing_on = syncopate::Version(0);
        let inbound = self.inbound.1.clone();
        let mut wide = Vec::new();
        loop {
            // A message that could not be encoded ends its shard's session (it would be
            // lost unseen otherwise); the shard is reconnected once the outputs are drained.
            let mut broken: Option<(usize, String)> = None;
            while let Some(o) = worker.poll_output() {
                match o {
                    ShardedOutput::Send { shard, msg } => {
                        let k = shard as usize;
                        let Some(link) = self.links.get(k).filter(|l| !l.lost) else { continue };
                        let Some(uploads) = &link.uploads else { continue };
                        let Some(stats) = self.stats.get_mut(k) else { continue };
                        match Upload::encode(&msg, self.wire.unwrap_or_default(), stats, &self.spare.1) {
                            // A session whose writer is gone is lost; its reader reports it.
                            Ok(upload) => {
                                let _ = uploads.send(upload);
                            }
                            Err(e) => broken = Some((k, e)),
                        }
                    }
                    ShardedOutput::Compute { id, version, params } => {
                        computing_on = version;
                        compute(job, &mut self.report.total, &mut held, &mut grad, id, version, params);
                    }
                    ShardedOutput::Event(WorkerEvent::Abandoned { id }) => {
                        if let Some(h) = held.take_if(|h| h.id == id) {
                            h.abandon(&mut self.report.total);
                        }
                    }
                    ShardedOutput::Event(_) => {}
                }
            }
            if let Some((shard, why)) = broken {
                self.reconnect(&mut worker, config, shard, &why, log)?;
                continue;
            }
            // What the shards sent is read before a finished step is handed over: a worker whose
            // steps take no time (its next step always ready under wbsp-overlap) still reads.
            if let Some(h) = held.take_if(|h| h.is_due() && inbound.is_empty()) {
                let (id, loss) = (h.id, h.loss);
                h.finish(&mut self.report.total);
                let enc = self.wire.unwrap_or_default();
                let handed = if super::worker::fits_wire(enc, &grad) {
                    worker.handle_gradient_with_loss(since(origin), id, &grad, loss)
                } else {
                    Err(syncopate::Reject::NotFinite)
                };
                match handed {
                    Ok(()) => self.report.total.steps += 1,
                    Err(e) => {
                        refused(me, log, &mut self.report.total, "a finished gradient", &e);
                        // Values that are not finite: every shard hears of it (its round would
                        // wait for this gradient for ever) and the step is computed again on
                        // the next minibatch (each shard ends a run of such steps as diverged).
                        // A job that failed poisons its gradient and sets the kill switch:
                        // nothing more is sent.
                        let killed = self.options.kill.as_ref().is_some_and(|k| k.load(Ordering::SeqCst));
                        if let Some(n) = crate::tcp::refusal::NotFinite::of(&e).filter(|_| !killed) {
                            for uploads in self.links.iter().filter(|l| !l.lost).filter_map(|l| l.uploads.as_ref()) {
                                // A session whose writer is gone is lost; its reader reports it.
                                let _ = uploads.send((n.encode(), Upload::Other));
                            }
                            let params = worker.params_buffer().as_ref();
                            compute(job, &mut self.report.total, &mut held, &mut grad, id, computing_on, params);
                        }
                    }
                }
                continue;
            }
            let stopped: Vec<bool> = (0..self.count).map(|k| worker.shard(k).is_some_and(|w| w.is_stopped())).collect();
            for (t, s) in self.report.shards.iter_mut().zip(&stopped) {
                t.stopped = *s;
            }
            if stopped.iter().all(|s| *s) {
                self.report.total.stopped = true;
                return Ok(());
            }
            if stopped.iter().any(|s| *s) {
                let t = *first_stop.get_or_insert_with(StdInstant::now);
                if t.elapsed() >= self.options.lost_after {
                    let waiting: Vec<String> =
                        stopped.iter().enumerate().filter(|(_, s)| !**s).map(|(k, _)| k.to_string()).collect();
                    log(&format!(
                        "worker {me}: shard(s) {} did not say stop within {:.1} s of the first that did; ending",
                        waiting.join(", "),
                        self.options.lost_after.as_secs_f64()
                    ));
                    self.report.total.stopped = true;
                    return Ok(());
                }
            }
            if self.options.kill.as_ref().is_some_and(|k| k.load(Ordering::SeqCst)) {
                return Ok(());
            }
            let mut wake = StdInstant::now() + Duration::from_millis(100);
            if let Some(t) = worker.poll_timeout() {
                wake = wake.min(at(origin, t));
            }
            if let Some(h) = &held {
                wake = wake.min(h.ready);
            }
            let wait = wake.saturating_duration_since(StdInstant::now()).max(Duration::from_millis(1));
            match inbound.recv_timeout(wait) {
                Ok(FromShard::Frame { shard, generation, buf, start, end }) => {
                    let Some(link) = self.links.get(shard).filter(|l| l.generation == generation) else {
                        continue;
                    };
                    let home = link.home.clone();
                    let payload = buf.get(start..end).unwrap_or_default();
                    let limits = limits.get(shard).copied().unwrap_or_else(|| Limits::for_model(1));
                    // A shard refused a contribution for its loss (see `refusal`): logged.
                    if FromServerKind::of(payload) == FromServerKind::Refused {
                        if let Some(line) = super::refusal::worker_line(me, payload) {
                            log(&format!("{line} (shard {shard})"));
                        }
                        let _ = home.try_send(buf);
                        continue;
                    }
                    match super::payload::decode_to_worker(payload, self.wire.unwrap_or_default(), &limits, &mut wide) {
                        Ok(msg) => {
                            if let syncopate::ToWorker::Model { version, .. } = &msg {
                                if let Some(t) = self.report.shards.get_mut(shard) {
                                    t.last_version = Some(t.last_version.unwrap_or(0).max(version.0));
                                }
                            }
                            let kind = msg.kind_name();
                            if let Err(e) = worker.handle(since(origin), shard as u32, msg) {
                                refused(
                                    me,
                                    log,
                                    &mut self.report.total,
                                    &format!("shard {shard}'s {kind} message"),
                                    &e,
                                );
                            }
                        }
                        Err(e) => {
                            let why = format!("the shard sent a bad message: {e}");
                            self.reconnect(&mut worker, config, shard, &why, log)?;
                        }
                    }
                    let _ = home.try_send(buf);
                }
                Ok(FromShard::Lost { shard, generation, why }) => {
                    if self.links.get(shard).is_some_and(|l| l.generation == generation) {
                        let done = worker.shard(shard as u32).is_some_and(|w| w.is_stopped());
                        if done {
                            if let Some(l) = self.links.get_mut(shard) {
                                l.lost = true;
                            }
                        } else {
                            self.reconnect(&mut worker, config, shard, &why, log)?;
                        }
                    }
                }
                Err(RecvTimeoutError::Timeout) => {}
                Err(RecvTimeoutError::Disconnected) => return Err(TcpError(format!("worker {me}: no session left"))),
            }
            if worker.poll_timeout().is_some_and(|t| at(origin, t) <= StdInstant::now()) {
                worker.handle_timeout(since(origin));
            }
        }
    }

    /// Shard `shard`'s session was lost: a new one replaces it, with a fresh inner worker.
    fn reconnect(
        &mut self,
        worker: &mut HeapShardedWorker<f32>,
        config: &ProtocolConfig,
        shard: usize,
        why: &str,
        log: &mut dyn FnMut(&str),
    ) -> Result<(), TcpError> {
        let me = self.me();
        let seen = self.report.shards.get(shard).and_then(|t| t.last_version);
        log(&format!(
            "worker {me}: shard {shard} at {} lost ({why}; newest slice received: version {}); reconnecting",
            self.addr(shard),
            seen.map_or_else(|| "none".to_owned(), |v| v.to_string())
        ));
        self.close(shard, false);
        let (epoch, _) = self.connect_shard(shard, log)?;
        let inner = self.inner_worker(config, worker.layout(), shard, epoch)?;
        worker.restart_shard(shard as u32, inner).map_err(|e| TcpError(format!("worker {me}: shard {shard}: {e}")))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::tcp::frame::{FrameTimeout, FrameWriter};
    use std::net::TcpListener;

    #[test]
    fn a_shard_reader_whose_frames_are_not_taken_stops_reading_and_the_shard_is_pushed_back() {
        const FRAME: usize = 1 << 16;
        const FRAMES: usize = 1024; // 64 MiB: far more than the sockets' buffers hold
        let listener = TcpListener::bind("127.0.0.1:0").unwrap();
        let client = TcpStream::connect(listener.local_addr().unwrap()).unwrap();
        let (server, _) = listener.accept().unwrap();
        server.set_write_timeout(Some(Duration::from_millis(500))).unwrap();
        let (home, pool) = bounded::<Vec<u8>>(FRAMES_IN_FLIGHT);
        for _ in 0..FRAMES_IN_FLIGHT {
            home.try_send(Vec::new()).unwrap();
        }
        let (to_main, from_readers) = unbounded();
        let reading = thread::spawn(move || {
            let mut reader = FrameReader::new(client, 2 * FRAME, FrameTimeout::default());
            read_shard(&mut reader, &pool, &to_main, (0, 1), Duration::from_secs(30));
        });
        // The shard sends model after model while the main thread is busy and takes none.
        let mut writer = FrameWriter::new(server.try_clone().unwrap(), 2 * FRAME);
        let payload = vec![7u8; FRAME];
        let written = (0..FRAMES).take_while(|_| writer.write_frame(&payload).is_ok()).count();
        assert!(written < FRAMES, "the worker read all {FRAMES} frames of 64 KiB without taking one");
        assert_eq!(from_readers.len(), FRAMES_IN_FLIGHT, "the reader holds at most its buffers' worth");
        // Once the main thread lets go of the session the reader ends.
        drop(home);
        let _ = server.shutdown(Shutdown::Both);
        reading.join().unwrap();
    }
}
