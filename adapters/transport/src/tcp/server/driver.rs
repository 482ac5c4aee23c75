//! The protocol thread: feeds the protocol what the connections read, losses and
//! timeouts, drains its outputs (each message encoded once and shared by every writer),
//! keeps the report and the conservation ledger, and writes checkpoints.

use super::{Conn, Control, Inbound, Note, RunPlan, ServerOptions, ServerReport, SessionLedger, Shared, StopReason};
use crate::tcp::checkpoint;
use crate::tcp::{at, since};
use core::sync::atomic::Ordering;
use core::time::Duration;
use crossbeam_channel::{Receiver, RecvTimeoutError, TrySendError};
use std::collections::HashMap;
use std::net::Shutdown;
use std::sync::Arc;
use std::thread;
use std::time::Instant as StdInstant;
use syncopate::wire::{self, Limits};
use syncopate::{Recipient, Server, ServerEvent, ServerOutput, ServerStats, ToServer, ToWorker, Version, WorkerId};

pub(super) struct Core<S> {
    server: S,
    /// The upstream session, if the server has one.
    up: Option<Conn>,
    /// Set when the upstream server said stop or its connection ended.
    upstream_end: Option<StopReason>,
    shared: Arc<Shared>,
    conns: Vec<Option<Conn>>,
    epoch: StdInstant,
    /// When every worker had connected at least once: the run's clock starts.
    started: Option<StdInstant>,
    /// Which workers have connected at least once.
    seen_worker: Vec<bool>,
    /// Per worker: when a model was sent that the worker has not answered with a gradient.
    dispatched: Vec<Option<StdInstant>>,
    report: ServerReport,
    limits: Limits,
    checkpoint_due: bool,
    last_version: Version,
    /// Encoded messages, reused once every writer has sent them.
    bufs: SharedBufs,
    /// Connection id → index in [`ServerReport::session_ledgers`].
    session_index: HashMap<u64, usize>,
    /// The journal next to the checkpoint, if checkpoints are written.
    journal: Option<checkpoint::Journal>,
    /// Applied contributions per worker of versions not yet made (for the journal).
    applied_by_version: std::collections::BTreeMap<u64, Vec<u64>>,
    /// Set while the server waits for worker 0's initial parameters (`server` is then a
    /// placeholder nothing has been fed to).
    awaiting: Option<AwaitingInitial<S>>,
    /// Per worker: the step times its current session sent for its next contribution.
    pending_steps: Vec<Vec<f32>>,
}

/// Builds the protocol's server on the initial parameters from worker 0.
pub(super) type BuildServer<S> = Box<dyn FnMut(Vec<f32>) -> Result<S, String>>;

/// The most messages held per worker while the initial model is unknown; an older one is
/// dropped for a newer (they are `Join`s, which a waiting worker repeats).
const HELD_PER_WORKER: usize = 4;

/// A frame held until the initial model is known.
struct HeldFrame {
    conn: u64,
    worker: WorkerId,
    buf: Vec<u8>,
    start: usize,
    end: usize,
    home: crossbeam_channel::Sender<Vec<u8>>,
}

/// A server waiting for worker 0's initial parameters: how to build the real one, and the
/// other workers' messages until then, in arrival order.
pub(super) struct AwaitingInitial<S> {
    build: BuildServer<S>,
    held: Vec<std::collections::VecDeque<HeldFrame>>,
}

/// Buffers of encoded outgoing messages. Each message is encoded once into one of them and
/// shared by every writer that sends it; a buffer no writer holds any more is reused for the
/// next message, so a model broadcast neither allocates nor zeroes a fresh buffer of the
/// model's size.
struct SharedBufs {
    bufs: Vec<Arc<Vec<u8>>>,
    keep: usize,
}

impl SharedBufs {
    fn new(keep: usize) -> Self {
        Self { bufs: Vec::with_capacity(keep), keep }
    }

    /// A buffer holding what `encode` wrote into `len` bytes, ready to share.
    fn fill<E>(&mut self, len: usize, encode: impl FnOnce(&mut [u8]) -> Result<usize, E>) -> Result<Arc<Vec<u8>>, E> {
        // Only this pool clones these `Arc`s, so a count of 1 cannot go back up.
        let free = self.bufs.iter().position(|b| Arc::strong_count(b) == 1 && Arc::weak_count(b) == 0);
        let mut shared = free.map(|i| self.bufs.swap_remove(i)).unwrap_or_default();
        let written = match Arc::get_mut(&mut shared) {
            Some(buf) => encode_into(buf, len, encode),
            None => {
                let mut buf = Vec::new();
                let written = encode_into(&mut buf, len, encode);
                shared = Arc::new(buf);
                written
            }
        };
        if self.bufs.len() < self.keep {
            self.bufs.push(Arc::clone(&shared));
        }
        written.map(|()| shared)
    }
}

/// Makes `buf` exactly `len` bytes and lets `encode` fill it, keeping what it wrote. Only
/// the bytes the buffer gains are zeroed: `encode` overwrites the rest. A length no
/// allocation can hold leaves the buffer short, and the encoder refuses it.
fn encode_into<E>(buf: &mut Vec<u8>, len: usize, encode: impl FnOnce(&mut [u8]) -> Result<usize, E>) -> Result<(), E> {
    if buf.capacity() < len {
        let _ = buf.try_reserve_exact(len.saturating_add(wire::MAX_CONTROL_LEN).saturating_sub(buf.len()));
    }
    if buf.capacity() >= len {
        buf.resize(len, 0);
    }
    encode(buf).map(|n| buf.truncate(n))
}

impl<S: Server<f32>> Core<S> {
    /// The driver of `server` with the upstream session `up` (if any): every worker
    /// unconnected, the report empty, the checkpoint journal started if checkpoints are
    /// written.
    pub(super) fn new(server: S, up: Option<Conn>, shared: Arc<Shared>, note: &mut dyn FnMut(Note<'_>)) -> Self {
        let n = shared.announce.config.workers() as usize;
        let dim = shared.announce.dim;
        let version = server.version();
        let mut core = Self {
            server,
            up,
            upstream_end: None,
            shared,
            conns: (0..n).map(|_| None).collect(),
            epoch: StdInstant::now(),
            started: None,
            seen_worker: vec![false; n],
            dispatched: vec![None; n],
            report: ServerReport {
                reason: StopReason::Budget,
                version,
                params: Vec::new(),
                stats: ServerStats::default(),
                wall_s: 0.0,
                connect_wait_s: None,
                busy_s: vec![0.0; n],
                staleness: (0, 0, 0),
                stalls: 0,
                last_stall: None,
                refused: 0,
                per_worker: vec![0; n],
                sessions: 0,
                lost: 0,
                handshake_failures: 0,
                evicted: 0,
                checkpoints: 0,
                received: 0,
                refused_contributions: 0,
                discarded: 0,
                in_flight_at_stop: 0,
                session_ledgers: Vec::new(),
                loss_curve: Vec::new(),
                initial_model_known: true,
            },
            session_index: HashMap::new(),
            journal: None,
            applied_by_version: std::collections::BTreeMap::new(),
            awaiting: None,
            pending_steps: vec![Vec::new(); n],
            limits: Limits::for_model(dim),
            checkpoint_due: false,
            last_version: version,
            // Enough for a broadcast and a message to each worker in flight; more are freed
            // once sent, so a burst of queued frames does not pin its memory for good.
            bufs: SharedBufs::new(2 * n + 2),
        };
        if let Some((path, _)) = &core.shared.options.checkpoint {
            // The journal of what is applied between checkpoints (read by `--resume`).
            match checkpoint::Journal::start(path, version, &checkpoint::Totals::default()) {
                Ok(j) => core.journal = Some(j),
                Err(e) => note(Note::Log(&e.to_string())),
            }
        }
        core
    }

    /// Makes the server wait for worker 0's initial parameters: nothing reaches the
    /// protocol until they arrive and `build` has made the real server of them.
    pub(super) fn await_initial(&mut self, build: BuildServer<S>) {
        let n = self.conns.len();
        self.awaiting = Some(AwaitingInitial { build, held: (0..n).map(|_| Default::default()).collect() });
    }

    /// The report of the run that ended for `reason`, with `evicted` unverified connections.
    pub(super) fn into_report(mut self, reason: StopReason, evicted: u64) -> ServerReport {
        self.report.initial_model_known = self.awaiting.is_none();
        self.report.reason = reason;
        self.report.version = self.server.version();
        self.report.params = self.server.params().to_vec();
        self.report.stats = *self.server.stats();
        self.report.wall_s = self.started.unwrap_or(self.epoch).elapsed().as_secs_f64();
        self.report.connect_wait_s = self.started.map(|t| t.duration_since(self.epoch).as_secs_f64());
        self.report.evicted = evicted;
        self.report
    }

    pub(super) fn run(
        &mut self,
        in_rx: &Receiver<Inbound>,
        plan: &RunPlan,
        control: &Control,
        note: &mut dyn FnMut(Note<'_>),
    ) -> StopReason {
        let tick = Duration::from_millis(50);
        loop {
            self.drain(note);
            if control.crash.load(Ordering::SeqCst) {
                return StopReason::Crashed;
            }
            if let Some(reason) = self.upstream_end {
                return reason;
            }
            if control.stop.load(Ordering::SeqCst) {
                return StopReason::Stopped;
            }
            if self.server.stats().accepted >= plan.max_gradients {
                return StopReason::Budget;
            }
            if plan.time_limit.is_some_and(|t| self.epoch.elapsed() >= t) {
                return StopReason::TimeLimit;
            }
            let mut wake = StdInstant::now() + tick;
            if let Some(t) = self.server.poll_timeout().filter(|_| self.awaiting.is_none()) {
                wake = wake.min(at(self.epoch, t));
            }
            match in_rx.recv_deadline(wake) {
                Ok(msg) => self.inbound(msg, note),
                Err(RecvTimeoutError::Timeout) => {}
                Err(RecvTimeoutError::Disconnected) => return StopReason::Stopped,
            }
            if self.awaiting.is_none()
                && self.server.poll_timeout().is_some_and(|t| at(self.epoch, t) <= StdInstant::now())
            {
                self.server.handle_timeout(since(self.epoch));
            }
        }
    }

    fn log(note: &mut dyn FnMut(Note<'_>), line: &str) {
        note(Note::Log(line));
    }

    fn inbound(&mut self, msg: Inbound, note: &mut dyn FnMut(Note<'_>)) {
        match msg {
            Inbound::Log(line) => Self::log(note, &line),
            Inbound::HandshakeFailed => self.report.handshake_failures += 1,
            Inbound::Connected { conn, worker, epoch, addr, tx, stream, done } => {
                self.report.sessions += 1;
                self.session_index.insert(conn, self.report.session_ledgers.len());
                self.report.session_ledgers.push(SessionLedger { worker: worker.0, epoch, ..SessionLedger::default() });
                Self::log(note, &format!("worker {} connected from {addr} (epoch {epoch})", worker.0));
                if let Some(seen) = self.seen_worker.get_mut(worker.index()) {
                    *seen = true;
                }
                if let Some(steps) = self.pending_steps.get_mut(worker.index()) {
                    steps.clear();
                }
                self.maybe_start(note);
                let new = Conn { id: conn, tx, stream, done };
                let old = self.conns.get_mut(worker.index()).and_then(|slot| slot.replace(new));
                if let Some(old) = old {
                    Self::log(
                        note,
                        &format!(
                            "worker {}: the new session from {addr} replaces a live one (a restart, or two processes with this id: a third such replacement within {} s is refused)",
                            worker.0,
                            super::admission::FLAP_WINDOW.as_secs()
                        ),
                    );
                    self.close(old);
                    self.lose(worker, note);
                }
            }
            Inbound::Frame { conn, worker, buf, start, end, home } => {
                if crate::tcp::initial::is_initial(buf.get(start..end).unwrap_or_default()) {
                    self.initial(conn, worker, buf.get(start..end).unwrap_or_default(), note);
                    let _ = home.try_send(buf);
                    return;
                }
                if crate::tcp::step_times::is_step_times(buf.get(start..end).unwrap_or_default()) {
                    self.step_times(conn, worker, buf.get(start..end).unwrap_or_default(), note);
                    let _ = home.try_send(buf);
                    return;
                }
                if self.awaiting.is_some() && self.current(worker, conn) {
                    self.hold(HeldFrame { conn, worker, buf, start, end, home });
                    return;
                }
                if !self.current(worker, conn) && self.is_contribution(buf.get(start..end).unwrap_or_default()) {
                    self.report.discarded += 1;
                    self.session(conn, |s| s.discarded += 1);
                }
                if self.current(worker, conn) {
                    let bytes = buf.get(start..end).unwrap_or_default();
                    let now = since(self.epoch);
                    match wire::decode_to_server::<f32>(bytes, &self.limits) {
                        Ok(msg) => {
                            let contribution =
                                matches!(msg, ToServer::Grad { .. } | ToServer::Delta { .. } | ToServer::Clock { .. });
                            if contribution {
                                self.report.received += 1;
                                self.session(conn, |s| s.received += 1);
                                let steps = self.pending_steps.get(worker.index()).map_or(&[][..], Vec::as_slice);
                                note(Note::Contribution { worker, msg: &msg, step_seconds: steps });
                                if let Some(steps) = self.pending_steps.get_mut(worker.index()) {
                                    steps.clear();
                                }
                            }
                            if matches!(msg, ToServer::Grad { .. } | ToServer::Delta { .. }) {
                                let sent = self.dispatched.get_mut(worker.index()).and_then(Option::take);
                                if let (Some(t), Some(busy)) = (sent, self.report.busy_s.get_mut(worker.index())) {
                                    *busy += t.elapsed().as_secs_f64();
                                }
                            }
                            if self.server.handle(now, worker, msg).is_err() {
                                self.report.refused += 1;
                                if contribution {
                                    self.report.refused_contributions += 1;
                                    self.session(conn, |s| s.refused += 1);
                                }
                            }
                        }
                        Err(e) => {
                            self.report.refused += 1;
                            Self::log(note, &format!("worker {} sent a bad message ({e}); disconnecting", worker.0));
                            self.drop_worker(worker, note);
                        }
                    }
                }
                let _ = home.try_send(buf);
            }
            Inbound::Closed { conn, worker, reason } => {
                if self.current(worker, conn) {
                    Self::log(note, &format!("worker {} lost: {reason}", worker.0));
                    self.drop_worker(worker, note);
                }
            }
            Inbound::Upstream { buf, start, end } => {
                let bytes = buf.get(start..end).unwrap_or_default();
                let now = since(self.epoch);
                match wire::decode_to_worker::<f32>(bytes, &self.limits) {
                    Ok(msg) => {
                        let stop = matches!(msg, ToWorker::Stop);
                        if let Err(e) = self.server.handle_upstream(now, msg) {
                            self.report.refused += 1;
                            Self::log(note, &format!("the upstream server's message was refused: {e}"));
                        } else if stop {
                            Self::log(note, "the upstream server said stop");
                            self.upstream_end = Some(StopReason::UpstreamStopped);
                        }
                    }
                    Err(e) => self.lose_upstream(&format!("the upstream server sent a bad message ({e})"), note),
                }
            }
            Inbound::UpstreamClosed { reason } => self.lose_upstream(&reason, note),
        }
    }

    /// Starts the run's clock once every worker has connected and the model is known.
    fn maybe_start(&mut self, note: &mut dyn FnMut(Note<'_>)) {
        if self.started.is_none() && self.awaiting.is_none() && self.seen_worker.iter().all(|s| *s) {
            self.started = Some(StdInstant::now());
            note(Note::Started);
        }
    }

    /// Holds a frame of `worker` until the initial model is known, dropping the oldest held
    /// one beyond [`HELD_PER_WORKER`] (a dropped contribution is counted as discarded).
    fn hold(&mut self, frame: HeldFrame) {
        let Some(queue) = self.awaiting.as_mut().and_then(|a| a.held.get_mut(frame.worker.index())) else {
            return;
        };
        queue.push_back(frame);
        if queue.len() <= HELD_PER_WORKER {
            return;
        }
        if let Some(old) = queue.pop_front() {
            if self.is_contribution(old.buf.get(old.start..old.end).unwrap_or_default()) {
                self.report.discarded += 1;
                self.session(old.conn, |s| s.discarded += 1);
            }
            let _ = old.home.try_send(old.buf);
        }
    }

    /// Worker `worker`'s initial-parameters message on session `conn`: the server's model if
    /// it waits for one and `worker` is worker 0; ignored from worker 0 once the model is
    /// known (it sends one every session); refused otherwise.
    fn initial(&mut self, conn: u64, worker: WorkerId, bytes: &[u8], note: &mut dyn FnMut(Note<'_>)) {
        if !self.current(worker, conn) {
            return;
        }
        if worker != WorkerId(0) || !self.shared.options.settings.initial_from_worker {
            self.report.refused += 1;
            let why =
                if worker == WorkerId(0) { "this server did not ask for them" } else { "only worker 0 sends them" };
            Self::log(note, &format!("worker {} sent initial parameters, but {why}; disconnecting", worker.0));
            self.drop_worker(worker, note);
            return;
        }
        let Some(awaiting) = self.awaiting.as_mut() else {
            return;
        };
        let built = crate::tcp::initial::decode(bytes, self.shared.announce.dim).and_then(|p| (awaiting.build)(p));
        let server = match built {
            Ok(server) => server,
            Err(e) => {
                self.report.refused += 1;
                Self::log(note, &format!("worker 0's initial parameters refused: {e}; disconnecting"));
                self.drop_worker(worker, note);
                return;
            }
        };
        self.server = server;
        let held = self.awaiting.take().map(|a| a.held).unwrap_or_default();
        Self::log(note, &format!("the initial model ({} parameters) came from worker 0", self.shared.announce.dim));
        // Workers that left while the model was unknown are lost for the real server.
        for w in 0..self.conns.len() {
            let w = WorkerId(w as u32);
            if self.seen_worker.get(w.index()).copied().unwrap_or(false) && !self.is_connected(w) {
                self.lose(w, note);
            }
        }
        self.maybe_start(note);
        let mut frames: Vec<HeldFrame> = held.into_iter().flatten().collect();
        frames.sort_by_key(|f| f.conn);
        for HeldFrame { conn, worker, buf, start, end, home } in frames {
            self.inbound(Inbound::Frame { conn, worker, buf, start, end, home }, note);
        }
    }

    /// Worker `worker`'s step times on session `conn`, kept for its next contribution;
    /// refused (the connection cut) when the run did not ask for them or they do not
    /// decode.
    fn step_times(&mut self, conn: u64, worker: WorkerId, bytes: &[u8], note: &mut dyn FnMut(Note<'_>)) {
        if !self.current(worker, conn) {
            return;
        }
        let refusal = if self.shared.options.settings.report_step_times {
            match crate::tcp::step_times::decode(bytes) {
                Ok(seconds) => {
                    if let Some(pending) = self.pending_steps.get_mut(worker.index()) {
                        pending.extend_from_slice(&seconds);
                        let excess = pending.len().saturating_sub(crate::tcp::step_times::MAX_STEPS);
                        pending.drain(..excess);
                    }
                    return;
                }
                Err(e) => format!("bad step times ({e})"),
            }
        } else {
            "step times, but this server did not ask for them".to_string()
        };
        self.report.refused += 1;
        Self::log(note, &format!("worker {} sent {refusal}; disconnecting", worker.0));
        self.drop_worker(worker, note);
    }

    fn lose_upstream(&mut self, reason: &str, note: &mut dyn FnMut(Note<'_>)) {
        if let Some(up) = self.up.take() {
            Self::log(note, &format!("upstream connection lost: {reason}"));
            self.close(up);
        }
        self.upstream_end.get_or_insert(StopReason::UpstreamLost);
    }

    /// Counts into the ledger of session `conn`.
    fn session(&mut self, conn: u64, f: impl FnOnce(&mut SessionLedger)) {
        if let Some(s) = self.session_index.get(&conn).and_then(|i| self.report.session_ledgers.get_mut(*i)) {
            f(s);
        }
    }

    /// Whether `bytes` decode to a contribution (for the ledger).
    fn is_contribution(&self, bytes: &[u8]) -> bool {
        matches!(
            wire::decode_to_server::<f32>(bytes, &self.limits),
            Ok(ToServer::Grad { .. } | ToServer::Delta { .. } | ToServer::Clock { .. })
        )
    }

    fn current(&self, worker: WorkerId, conn: u64) -> bool {
        matches!(self.conns.get(worker.index()), Some(Some(c)) if c.id == conn)
    }

    fn close(&mut self, conn: Conn) {
        let _ = conn.stream.shutdown(Shutdown::Both);
    }

    /// Cuts `worker`'s connection and tells the protocol.
    fn drop_worker(&mut self, worker: WorkerId, note: &mut dyn FnMut(Note<'_>)) {
        if let Some(conn) = self.conns.get_mut(worker.index()).and_then(Option::take) {
            self.close(conn);
        }
        self.lose(worker, note);
    }

    /// Tells the protocol `worker` is lost. The core refuses no loss for want of room (it
    /// applies those reported during a batch once the batch has drained), so the losses of
    /// one pass are reported back to back; a refusal (an id outside the run) is counted
    /// and logged.
    fn lose(&mut self, worker: WorkerId, note: &mut dyn FnMut(Note<'_>)) {
        if self.awaiting.is_some() {
            // The placeholder server never saw the worker; the real one is told once it
            // exists.
            return;
        }
        if let Err(e) = self.server.handle_worker_lost(since(self.epoch), worker) {
            self.report.refused += 1;
            Self::log(note, &format!("worker {}: the protocol refused its loss ({e})", worker.0));
        }
        if let Some(d) = self.dispatched.get_mut(worker.index()) {
            *d = None;
        }
        if let Some(steps) = self.pending_steps.get_mut(worker.index()) {
            steps.clear();
        }
    }

    /// Drains the protocol's outputs: events are noted, messages encoded once, a checkpoint
    /// written if due, then messages handed to the writers.
    fn drain(&mut self, note: &mut dyn FnMut(Note<'_>)) {
        loop {
            let mut outbox: Vec<(Recipient, Arc<Vec<u8>>, bool)> = Vec::new();
            let mut upbox: Vec<Arc<Vec<u8>>> = Vec::new();
            let mut updates: Vec<(Version, Vec<u64>)> = Vec::new();
            while let Some(out) = self.server.poll_output() {
                match out {
                    ServerOutput::Send { to, msg } => {
                        let len = wire::encoded_len_to_worker(&msg);
                        let model = matches!(msg, ToWorker::Model { .. });
                        match self.bufs.fill(len, |buf| wire::encode_to_worker(&msg, buf)) {
                            Ok(bytes) => outbox.push((to, bytes, model)),
                            Err(e) => note(Note::Log(&format!("cannot encode a {} message: {e}", msg.kind_name()))),
                        }
                    }
                    ServerOutput::Event(ev) => {
                        // The curve is on the run's clock: an update made before it started
                        // (an asynchronous protocol training while the last workers connect)
                        // has no time on it and is left out.
                        if let (ServerEvent::ModelUpdated { version, mean_loss: Some(loss), .. }, Some(start)) =
                            (ev, self.started)
                        {
                            let t_s = start.elapsed().as_secs_f64();
                            self.report.loss_curve.push(super::LossPoint { version: version.0, t_s, loss });
                        }
                        Self::count(&mut self.report, &mut self.checkpoint_due, &self.shared.options, &ev);
                        if self.journal.is_some() {
                            Self::journal_event(&mut self.applied_by_version, &mut updates, self.conns.len(), &ev);
                        }
                        note(Note::Event(&ev));
                    }
                    ServerOutput::Upstream(msg) => {
                        let len = wire::encoded_len_to_server(&msg);
                        match self.bufs.fill(len, |buf| wire::encode_to_server(&msg, buf)) {
                            Ok(bytes) => upbox.push(bytes),
                            Err(e) => note(Note::Log(&format!("cannot encode a {} message: {e}", msg.kind_name()))),
                        }
                    }
                }
            }
            let version = self.server.version();
            if version != self.last_version {
                self.last_version = version;
                self.shared.version.store(version.0, Ordering::SeqCst);
                note(Note::Model { version, params: self.server.params() });
            }
            if !updates.is_empty() {
                let totals = self.totals();
                if let Some(j) = self.journal.as_mut() {
                    for (version, by_worker) in &updates {
                        if let Err(e) = j.update(*version, by_worker, &totals) {
                            note(Note::Log(&e.to_string()));
                        }
                    }
                }
            }
            if self.checkpoint_due {
                self.checkpoint_due = false;
                self.save_checkpoint(note);
            }
            for bytes in upbox {
                let sent = self.up.as_ref().map(|up| up.tx.try_send(bytes));
                match sent {
                    Some(Ok(())) => {}
                    Some(Err(_)) => self.lose_upstream("upstream send queue full", note),
                    None => self.lose_upstream("no upstream connection", note),
                }
            }
            let mut dropped = Vec::new();
            let now = StdInstant::now();
            for (to, bytes, model) in outbox {
                let targets: Vec<WorkerId> = match to {
                    Recipient::Worker(w) => vec![w],
                    Recipient::AllWorkers => {
                        (0..self.conns.len() as u32).map(WorkerId).filter(|w| self.is_connected(*w)).collect()
                    }
                };
                for w in targets {
                    let Some(Some(conn)) = self.conns.get(w.index()) else {
                        continue;
                    };
                    match conn.tx.try_send(Arc::clone(&bytes)) {
                        Ok(()) => {
                            if model {
                                if let Some(d) = self.dispatched.get_mut(w.index()) {
                                    d.get_or_insert(now);
                                }
                            }
                        }
                        Err(TrySendError::Full(_)) => dropped.push((w, "send queue full (the worker does not read)")),
                        Err(TrySendError::Disconnected(_)) => dropped.push((w, "writer gone")),
                    }
                }
            }
            if dropped.is_empty() {
                return;
            }
            for (w, why) in dropped {
                if self.is_connected(w) {
                    note(Note::Log(&format!("worker {} dropped: {why}", w.0)));
                    self.drop_worker(w, note);
                }
            }
        }
    }

    fn is_connected(&self, w: WorkerId) -> bool {
        matches!(self.conns.get(w.index()), Some(Some(_)))
    }

    fn count(report: &mut ServerReport, checkpoint_due: &mut bool, options: &ServerOptions, ev: &ServerEvent) {
        match *ev {
            ServerEvent::Applied { worker, staleness, .. } => {
                let s = &mut report.staleness;
                s.0 += staleness;
                s.1 += 1;
                s.2 = s.2.max(staleness);
                if let Some(c) = report.per_worker.get_mut(worker.index()) {
                    *c += 1;
                }
            }
            ServerEvent::Dropped { worker, .. } => {
                if let Some(c) = report.per_worker.get_mut(worker.index()) {
                    *c += 1;
                }
            }
            ServerEvent::Stalled { waiting_for, missing, .. } => {
                report.stalls += 1;
                report.last_stall = Some((waiting_for, missing));
            }
            ServerEvent::WorkerLost { .. } => report.lost += 1,
            ServerEvent::ModelUpdated { version, .. } => {
                if let Some((_, every)) = &options.checkpoint {
                    if *every > 0 && version.0 % every == 0 {
                        *checkpoint_due = true;
                    }
                }
            }
            _ => {}
        }
    }

    fn save_checkpoint(&mut self, note: &mut dyn FnMut(Note<'_>)) {
        if self.awaiting.is_some() {
            // No model yet: a checkpoint of the placeholder would be taken for one.
            return;
        }
        if let Some((path, _)) = &self.shared.options.checkpoint {
            let name = self.shared.announce.config.name();
            let momentum = self.server.momentum_buffer().map(|prev| (self.shared.options.momentum, prev));
            match checkpoint::save_with_momentum(path, name, self.server.version(), self.server.params(), momentum) {
                Ok(()) => {
                    self.report.checkpoints += 1;
                    let totals = self.totals();
                    if let Some(Err(e)) = self.journal.as_mut().map(|j| j.restart(self.server.version(), &totals)) {
                        note(Note::Log(&e.to_string()));
                    }
                }
                Err(e) => note(Note::Log(&e.to_string())),
            }
        }
    }

    /// The protocol's totals, for the journal.
    fn totals(&self) -> checkpoint::Totals {
        let st = self.server.stats();
        checkpoint::Totals {
            received: self.report.received,
            accepted: st.accepted,
            applied: st.applied,
            dropped: st.dropped_total(),
        }
    }

    /// Applied contributions are counted per worker until their version is made; then the
    /// version goes to the journal.
    fn journal_event(
        pending: &mut std::collections::BTreeMap<u64, Vec<u64>>,
        updates: &mut Vec<(Version, Vec<u64>)>,
        n: usize,
        ev: &ServerEvent,
    ) {
        match *ev {
            ServerEvent::Applied { worker, version, .. } => {
                let row = pending.entry(version.0).or_insert_with(|| vec![0; n]);
                if let Some(c) = row.get_mut(worker.index()) {
                    *c += 1;
                }
            }
            ServerEvent::ModelUpdated { version, .. } => {
                let row = pending.remove(&version.0).unwrap_or_else(|| vec![0; n]);
                pending.retain(|v, _| *v > version.0);
                updates.push((version, row));
            }
            _ => {}
        }
    }

    /// Ends the run: tells workers to stop (unless crashing), writes the final checkpoint,
    /// lets writers flush for a moment, and cuts every connection.
    pub(super) fn finish(&mut self, reason: StopReason, in_rx: &Receiver<Inbound>, note: &mut dyn FnMut(Note<'_>)) {
        let abrupt = matches!(reason, StopReason::Crashed | StopReason::UpstreamLost);
        if !abrupt {
            if reason != StopReason::UpstreamStopped {
                self.server.stop();
            }
            self.drain(note);
            if self.shared.options.checkpoint.is_some() {
                self.save_checkpoint(note);
            }
        }
        let mut conns: Vec<Conn> = self.conns.iter_mut().filter_map(Option::take).collect();
        conns.extend(self.up.take());
        if abrupt {
            for c in conns {
                let _ = c.stream.shutdown(Shutdown::Both);
            }
            return;
        }
        // Writers end after their queue is sent (the Stop message last); give them a moment.
        let deadline = StdInstant::now() + Duration::from_secs(2);
        let mut pending = Vec::new();
        for Conn { id, tx, stream, done } in conns {
            drop(tx);
            pending.push((id, stream, done));
        }
        while pending.iter().any(|(_, _, d)| !d.load(Ordering::SeqCst)) && StdInstant::now() < deadline {
            thread::sleep(Duration::from_millis(2));
        }
        // Lingering close: wait (briefly) for each peer to close its end after reading our
        // Stop. Closing first while a late frame of the peer sits unread would reset the
        // connection, and a reset can discard the Stop before the peer has read it.
        let mut open: Vec<u64> = pending.iter().map(|(id, _, _)| *id).collect();
        while !open.is_empty() {
            match in_rx.recv_deadline(deadline) {
                Ok(Inbound::Closed { conn, .. }) => open.retain(|id| *id != conn),
                Ok(Inbound::Frame { buf, start, end, conn, .. }) => {
                    if self.is_contribution(buf.get(start..end).unwrap_or_default()) {
                        self.report.in_flight_at_stop += 1;
                        self.session(conn, |s| s.in_flight_at_stop += 1);
                    }
                }
                Ok(_) => {}
                Err(_) => break,
            }
        }
        for (_, s, _) in pending {
            let _ = s.shutdown(Shutdown::Both);
        }
    }
}
