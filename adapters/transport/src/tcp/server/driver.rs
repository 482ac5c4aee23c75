//! The protocol thread: feeds the protocol what the connections read, losses and timeouts,
//! drains its outputs (each message encoded once and shared by every writer) and hands them
//! to the writers, and ends the run.
//!
//! What each frame is, the framing layer says ([`InboundFrame`]); where the model comes from,
//! [`Protocol`]; the counting, [`ledger`](super::ledger); checkpoints and the journal,
//! [`Persist`]; step times, [`PendingSteps`]; the lingering close, [`close`](super::close).

use super::close;
use super::initial_model::{BuildServer, Hold, Protocol, Received};
use super::ledger::{self, Entry, Ledger};
use super::outbox::SharedBufs;
use super::persist::Persist;
use super::steps::PendingSteps;
use super::stragglers::{self, Stragglers};
use super::{Conn, ConnEvent, Control, Note, RawFrame, RunPlan, ServerReport, Shared, StopReason};
use crate::tcp::checkpoint::Totals;
use crate::tcp::payload::{BadFrame, FrameKind, InboundFrame};
use crate::tcp::refusal::LossRefusals;
use crate::tcp::{at, since};
use core::sync::atomic::Ordering;
use core::time::Duration;
use crossbeam_channel::{Receiver, RecvTimeoutError, TrySendError};
use std::net::Shutdown;
use std::sync::Arc;
use std::time::Instant as StdInstant;
use syncopate::wire::{self, Limits};
use syncopate::{Recipient, Reject, Server, ServerEvent, ServerOutput, ToServer, ToWorker, Version, WorkerId};

pub(super) struct Core<S> {
    proto: Protocol<S>,
    /// The upstream session, if the server has one.
    up: Option<Conn>,
    /// Set when the upstream server said stop or its connection ended.
    upstream_end: Option<StopReason>,
    shared: Arc<Shared>,
    conns: Vec<Option<Conn>>,
    /// The clock origin: the core's instants count from here.
    origin: StdInstant,
    /// When every worker had connected at least once: the run's clock starts.
    started: Option<StdInstant>,
    /// Which workers have connected at least once.
    seen_worker: Vec<bool>,
    /// Per worker: when a model was sent that the worker has not answered with a gradient.
    dispatched: Vec<Option<StdInstant>>,
    report: ServerReport,
    ledger: Ledger,
    limits: Limits,
    last_version: Version,
    /// Encoded messages, reused once every writer has sent them.
    bufs: SharedBufs,
    /// Checkpoints and their journal, if configured.
    persist: Option<Persist>,
    steps: PendingSteps,
    /// The straggler report's makings, and when its table was last logged.
    stragglers: (Stragglers, StdInstant),
    /// Per worker, its contributions refused in a row for a loss that is not finite.
    losses: LossRefusals,
    /// Set when a contribution was refused for holding NaN, ±∞ or an overflowing norm.
    diverged: bool,
    /// A shard: since when no worker has been connected (after the run started).
    gone_since: Option<StdInstant>,
}

impl<S: Server<f32>> Core<S> {
    /// The driver of `server` with the upstream session `up` (if any), waiting for worker 0's
    /// initial parameters first if `build` is given: every worker unconnected, the report
    /// empty, the checkpoint journal started if checkpoints are written.
    pub(super) fn new(
        server: S,
        build: Option<BuildServer<S>>,
        up: Option<Conn>,
        shared: Arc<Shared>,
        note: &mut dyn FnMut(Note<'_>),
    ) -> Self {
        let n = shared.announce.config.workers() as usize;
        let dim = shared.announce.dim;
        let version = server.version();
        let persist = shared.options.checkpoint.clone().map(|(path, every)| {
            // The journal of what is applied between checkpoints (read by `--resume`).
            let (persist, error) = Persist::new(path, every, n, version, shared.options.checkpoint_stamp.clone());
            if let Some(e) = error {
                note(Note::Log(&e));
            }
            persist
        });
        let proto = match build {
            Some(build) => Protocol::awaiting(server, build, n),
            None => Protocol::known(server),
        };
        Self {
            proto,
            up,
            upstream_end: None,
            shared,
            conns: (0..n).map(|_| None).collect(),
            origin: StdInstant::now(),
            started: None,
            seen_worker: vec![false; n],
            dispatched: vec![None; n],
            report: ServerReport::empty(n, version),
            ledger: Ledger::default(),
            limits: Limits::for_model(dim),
            last_version: version,
            // Enough for a broadcast and a message to each worker in flight; more are freed
            // once sent, so a burst of queued frames does not pin its memory for good.
            bufs: SharedBufs::new(2 * n + 2),
            persist,
            steps: PendingSteps::new(n),
            stragglers: (Stragglers::new(n), StdInstant::now()),
            losses: LossRefusals::new(n),
            diverged: false,
            gone_since: None,
        }
    }

    /// The report of the run that ended for `reason`, with `evicted` unverified connections.
    pub(super) fn into_report(mut self, reason: StopReason, evicted: u64) -> ServerReport {
        let server = self.proto.server();
        self.report.initial_model_known = self.proto.is_known();
        self.report.reason = reason;
        self.report.version = server.version();
        self.report.params = server.params().to_vec();
        self.report.stats = *server.stats();
        self.report.wall_s = self.started.unwrap_or(self.origin).elapsed().as_secs_f64();
        self.report.connect_wait_s = self.started.map(|t| t.duration_since(self.origin).as_secs_f64());
        self.report.evicted = evicted;
        self.report.stragglers = self.stragglers.0.rows(&self.report.session_ledgers);
        self.report
    }

    /// Drives the run until the plan, the control or the upstream server ends it.
    pub(super) fn run(
        &mut self,
        from_conns: &Receiver<ConnEvent>,
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
            if self.diverged || control.diverged.load(Ordering::SeqCst) {
                return StopReason::Diverged;
            }
            if control.stop.load(Ordering::SeqCst) {
                return StopReason::Stopped;
            }
            if self.proto.server().stats().accepted >= plan.max_gradients {
                return StopReason::Budget;
            }
            if plan.time_limit.is_some_and(|t| self.origin.elapsed() >= t) {
                return StopReason::TimeLimit;
            }
            if self.workers_gone() {
                return StopReason::WorkersGone;
            }
            if self.started.is_some() && self.stragglers.1.elapsed() >= stragglers::REPORT_EVERY {
                self.stragglers.1 = StdInstant::now();
                self.stragglers.0.due_lines(&self.report.session_ledgers).iter().for_each(|l| note(Note::Log(l)));
            }
            let mut wake = StdInstant::now() + tick;
            if let Some(t) = self.proto.poll_timeout() {
                wake = wake.min(at(self.origin, t));
            }
            match from_conns.recv_deadline(wake) {
                Ok(event) => self.event(event, note),
                Err(RecvTimeoutError::Timeout) => {}
                Err(RecvTimeoutError::Disconnected) => return StopReason::Stopped,
            }
            if self.proto.poll_timeout().is_some_and(|t| at(self.origin, t) <= StdInstant::now()) {
                let now = since(self.origin);
                if let Some(server) = self.proto.live() {
                    server.handle_timeout(now);
                }
            }
        }
    }

    /// A shard's end when its workers have left: a worker of a sharded run leaves every
    /// shard once one shard said stop, so a shard that no worker has been connected to for
    /// `lost_after`, after the run started, has no one left to train with (its budget may
    /// be unmet when it was resumed from a checkpoint behind the other shards).
    fn workers_gone(&mut self) -> bool {
        let shard = self.shared.options.settings.shard.is_some();
        if !shard || self.started.is_none() || self.conns.iter().any(Option::is_some) {
            self.gone_since = None;
            return false;
        }
        self.gone_since.get_or_insert_with(StdInstant::now).elapsed() >= self.shared.options.lost_after
    }

    fn log(note: &mut dyn FnMut(Note<'_>), line: &str) {
        note(Note::Log(line));
    }

    fn event(&mut self, event: ConnEvent, note: &mut dyn FnMut(Note<'_>)) {
        match event {
            ConnEvent::Log(line) => Self::log(note, &line),
            ConnEvent::HandshakeFailed => self.report.handshake_failures += 1,
            ConnEvent::Connected { conn, worker, epoch, addr, tx, stream, done } => {
                self.ledger.open(&mut self.report, conn, worker.0, epoch);
                Self::log(note, &format!("worker {} connected from {addr} (epoch {epoch})", worker.0));
                if let Some(seen) = self.seen_worker.get_mut(worker.index()) {
                    *seen = true;
                }
                self.steps.clear(worker);
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
                    close_conn(&old);
                    self.lose(worker, note);
                }
            }
            ConnEvent::Frame(frame) => self.frame(frame, note),
            ConnEvent::Reply { conn, worker, bytes } => {
                if let Some(Some(c)) = self.conns.get(worker.index()).filter(|_| self.current(worker, conn)) {
                    let _ = c.tx.try_send(Arc::new(bytes));
                }
            }
            ConnEvent::Closed { conn, worker, reason } => {
                if self.current(worker, conn) {
                    Self::log(note, &format!("worker {} lost: {reason}", worker.0));
                    self.drop_worker(worker, note);
                }
            }
            ConnEvent::Upstream { buf, start, end } => {
                let bytes = buf.get(start..end).unwrap_or_default();
                let now = since(self.origin);
                match wire::decode_to_worker::<f32>(bytes, &self.limits) {
                    Ok(msg) => {
                        let stop = matches!(msg, ToWorker::Stop);
                        if let Err(e) = self.proto.server_mut().handle_upstream(now, msg) {
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
            ConnEvent::UpstreamClosed { reason } => self.lose_upstream(&reason, note),
        }
    }

    /// A frame of `frame.worker`'s session `frame.conn`: what it is, the framing layer says;
    /// a core message of the current session waits while the model is awaited.
    fn frame(&mut self, frame: RawFrame, note: &mut dyn FnMut(Note<'_>)) {
        let current = self.current(frame.worker, frame.conn);
        let frame = if current && FrameKind::of(frame.message()) == FrameKind::Core {
            match self.proto.hold(frame) {
                Hold::Pass(frame) => frame,
                Hold::Held(dropped) => {
                    if let Some(old) = dropped {
                        if self.is_contribution(old.message()) {
                            self.ledger.count(&mut self.report, old.conn, Entry::Discarded);
                        }
                        old.recycle();
                    }
                    return;
                }
            }
        } else {
            frame
        };
        let (conn, worker) = (frame.conn, frame.worker);
        let decoded = InboundFrame::decode(frame.message(), &self.limits, self.shared.announce.dim);
        let via_slot = current && frame.slot.is_some() && decoded.as_ref().is_ok_and(InboundFrame::is_contribution);
        self.report.via_shared_memory += u64::from(via_slot);
        match decoded {
            Ok(f) if !current => {
                if f.is_contribution() {
                    self.ledger.count(&mut self.report, conn, Entry::Discarded);
                }
            }
            Err(_) if !current => {}
            Ok(InboundFrame::Heartbeat) => {}
            Ok(InboundFrame::InitialModel(params)) => self.initial(worker, Ok(params), note),
            Err(BadFrame { kind: FrameKind::InitialModel, reason }) => self.initial(worker, Err(reason), note),
            Ok(InboundFrame::StepTimes(seconds)) => self.step_times(worker, Ok(&seconds), note),
            Err(BadFrame { kind: FrameKind::StepTimes, reason }) => self.step_times(worker, Err(reason), note),
            Ok(InboundFrame::NotFinite(what)) => self.not_finite(worker, "report of its gradient", what.reject(), note),
            Ok(InboundFrame::Core(msg)) => self.core_message(conn, worker, msg, note),
            Err(BadFrame { reason, .. }) => {
                self.report.refused += 1;
                Self::log(note, &format!("worker {} sent a bad message ({reason}); disconnecting", worker.0));
                self.drop_worker(worker, note);
            }
        }
        frame.recycle();
    }

    /// A core message of `worker`'s current session `conn`, for the protocol.
    fn core_message(&mut self, conn: u64, worker: WorkerId, msg: ToServer<'_, f32>, note: &mut dyn FnMut(Note<'_>)) {
        let now = since(self.origin);
        let contribution = matches!(msg, ToServer::Grad { .. } | ToServer::Delta { .. } | ToServer::Clock { .. });
        if contribution {
            self.ledger.count(&mut self.report, conn, Entry::Received);
            note(Note::Contribution { worker, msg: &msg, step_seconds: self.steps.of(worker) });
            self.stragglers.0.steps(worker, self.steps.of(worker));
            self.steps.clear(worker);
        }
        if matches!(msg, ToServer::Grad { .. } | ToServer::Delta { .. }) {
            let sent = self.dispatched.get_mut(worker.index()).and_then(Option::take);
            if let (Some(t), Some(busy)) = (sent, self.report.busy_s.get_mut(worker.index())) {
                *busy += t.elapsed().as_secs_f64();
            }
        }
        let kind = msg.kind_name();
        let handled = self.proto.live().map(|server| server.handle(now, worker, msg));
        if contribution && matches!(handled, Some(Ok(()))) {
            self.losses.accepted(worker);
        }
        if let Some(Err(e)) = handled {
            self.report.refused += 1;
            if contribution {
                self.ledger.count(&mut self.report, conn, Entry::Refused);
                self.not_finite(worker, kind, e, note);
            }
        }
    }

    /// A contribution of `worker` (a `kind` message) refused for `reason`: one holding NaN,
    /// ±∞ or an overflowing norm means the model diverged, and the run ends; one with a loss
    /// that is not finite is counted (stall reports name it), logged within bounds, and the
    /// worker told ([`refusal`](crate::tcp::refusal)); a run of them from one worker ends
    /// the run as diverged.
    fn not_finite(&mut self, worker: WorkerId, kind: &str, reason: Reject, note: &mut dyn FnMut(Note<'_>)) {
        match reason {
            Reject::NotFinite | Reject::NormTooLarge => {
                self.report.refused_not_finite += 1;
                let what = if reason == Reject::NotFinite { "holding NaN or ±∞" } else { "whose norm overflows" };
                Self::log(
                    note,
                    &format!("worker {} sent a {kind} {what}: refused; the model has diverged, stopping", worker.0),
                );
                self.diverged = true;
            }
            Reject::LossNotFinite => {
                let total = self.report.refused_loss_not_finite.get_mut(worker.index()).map_or(1, |c| {
                    *c += 1;
                    *c
                });
                let r = self.losses.refused(worker, total);
                if r.logged() {
                    let w = worker.0;
                    Self::log(
                        note,
                        &format!("worker {w} sent a {kind} whose loss is not finite: refused {}", r.counts()),
                    );
                }
                // The worker is told (a group server of remote groups speaks only the core's messages).
                let to = self.conns.get(worker.index()).and_then(Option::as_ref);
                if let Some(conn) = to.filter(|_| !self.shared.options.settings.remote_groups) {
                    let _ = conn.tx.try_send(Arc::new(r.encode()));
                }
                if r.ends_the_run() {
                    let line = format!(
                        "worker {} sent {} contributions in a row whose loss is not finite: the model has diverged, stopping",
                        worker.0, r.in_a_row
                    );
                    Self::log(note, &line);
                    self.diverged = true;
                }
            }
            _ => {}
        }
    }

    /// Starts the run's clock once every worker has connected and the model is known.
    fn maybe_start(&mut self, note: &mut dyn FnMut(Note<'_>)) {
        if self.started.is_none() && self.proto.is_known() && self.seen_worker.iter().all(|s| *s) {
            self.started = Some(StdInstant::now());
            note(Note::Started);
        }
    }

    /// Worker `worker`'s initial parameters from its current session (or why they did not
    /// decode): the server's model if it awaits one and `worker` is worker 0; ignored from
    /// worker 0 once the model is known (it sends them every session); refused otherwise.
    fn initial(&mut self, worker: WorkerId, params: Result<Vec<f32>, String>, note: &mut dyn FnMut(Note<'_>)) {
        if worker != WorkerId(0) || !self.shared.options.settings.initial_from_worker {
            self.report.refused += 1;
            let why =
                if worker == WorkerId(0) { "this server did not ask for them" } else { "only worker 0 sends them" };
            Self::log(note, &format!("worker {} sent initial parameters, but {why}; disconnecting", worker.0));
            self.drop_worker(worker, note);
            return;
        }
        let held = match self.proto.receive(params) {
            Received::Ignored => return,
            Received::Refused(e) => {
                self.report.refused += 1;
                Self::log(note, &format!("worker 0's initial parameters refused: {e}; disconnecting"));
                self.drop_worker(worker, note);
                return;
            }
            Received::Built(held) => held,
        };
        Self::log(note, &format!("the initial model ({} parameters) came from worker 0", self.shared.announce.dim));
        // Workers that left while the model was unknown are lost for the real server.
        for w in 0..self.conns.len() {
            let w = WorkerId(w as u32);
            if self.seen_worker.get(w.index()).copied().unwrap_or(false) && !self.is_connected(w) {
                self.lose(w, note);
            }
        }
        self.maybe_start(note);
        for frame in held {
            self.frame(frame, note);
        }
    }

    /// Worker `worker`'s step times from its current session (or why they did not decode),
    /// kept for its next contribution; refused (the connection cut) when the run did not
    /// ask for them or they do not decode.
    fn step_times(&mut self, worker: WorkerId, seconds: Result<&[f32], String>, note: &mut dyn FnMut(Note<'_>)) {
        let refusal = match seconds {
            _ if !self.shared.options.settings.report_step_times => {
                "step times, but this server did not ask for them".to_string()
            }
            Ok(seconds) => {
                self.steps.add(worker, seconds);
                return;
            }
            Err(e) => format!("bad step times ({e})"),
        };
        self.report.refused += 1;
        Self::log(note, &format!("worker {} sent {refusal}; disconnecting", worker.0));
        self.drop_worker(worker, note);
    }

    fn lose_upstream(&mut self, reason: &str, note: &mut dyn FnMut(Note<'_>)) {
        if let Some(up) = self.up.take() {
            Self::log(note, &format!("upstream connection lost: {reason}"));
            close_conn(&up);
        }
        self.upstream_end.get_or_insert(StopReason::UpstreamLost);
    }

    /// Whether `bytes` decode to a contribution (for the ledger).
    fn is_contribution(&self, bytes: &[u8]) -> bool {
        InboundFrame::decode(bytes, &self.limits, self.shared.announce.dim).is_ok_and(|f| f.is_contribution())
    }

    fn current(&self, worker: WorkerId, conn: u64) -> bool {
        matches!(self.conns.get(worker.index()), Some(Some(c)) if c.id == conn)
    }

    /// Cuts `worker`'s connection and tells the protocol.
    fn drop_worker(&mut self, worker: WorkerId, note: &mut dyn FnMut(Note<'_>)) {
        if let Some(conn) = self.conns.get_mut(worker.index()).and_then(Option::take) {
            close_conn(&conn);
        }
        self.lose(worker, note);
    }

    /// Tells the protocol `worker` is lost (a placeholder server never saw the worker: the
    /// real one is told once it exists). The core refuses no loss for want of room (it
    /// applies those reported during a batch once the batch has drained), so the losses of
    /// one pass are reported back to back; a refusal (an id outside the run) is counted
    /// and logged.
    fn lose(&mut self, worker: WorkerId, note: &mut dyn FnMut(Note<'_>)) {
        let now = since(self.origin);
        let Some(server) = self.proto.live() else {
            return;
        };
        if let Err(e) = server.handle_worker_lost(now, worker) {
            self.report.refused += 1;
            Self::log(note, &format!("worker {}: the protocol refused its loss ({e})", worker.0));
        }
        if let Some(d) = self.dispatched.get_mut(worker.index()) {
            *d = None;
        }
        self.steps.clear(worker);
    }

    /// Drains the protocol's outputs: events are noted, messages encoded once, a checkpoint
    /// written if due, then messages handed to the writers.
    fn drain(&mut self, note: &mut dyn FnMut(Note<'_>)) {
        loop {
            let mut outbox: Vec<(Recipient, Arc<Vec<u8>>, bool)> = Vec::new();
            let mut upbox: Vec<Arc<Vec<u8>>> = Vec::new();
            while let Some(out) = self.proto.server_mut().poll_output() {
                match out {
                    ServerOutput::Send { to, msg } => {
                        let model = matches!(msg, ToWorker::Model { .. });
                        match self.bufs.encode(&msg, self.shared.options.wire) {
                            Ok(bytes) => outbox.push((to, bytes, model)),
                            Err(e) => {
                                // A model beyond the wire's range has diverged for this run.
                                let diverged = matches!(e, wire::EncodeError::NotFinite { .. });
                                let end = if diverged { "; the model has diverged, stopping" } else { "" };
                                note(Note::Log(&format!("cannot encode a {} message: {e}{end}", msg.kind_name())));
                                self.diverged |= diverged;
                            }
                        }
                    }
                    ServerOutput::Event(ev) => {
                        let t_s = self.started.map(|t| t.elapsed().as_secs_f64());
                        ledger::tally(&mut self.report, &ev, t_s);
                        self.stragglers.0.event(&ev);
                        if let Some(p) = self.persist.as_mut() {
                            p.event(&ev);
                        }
                        note(Note::Event(&ev));
                        if let ServerEvent::Stalled { waiting_for, missing, .. } = ev {
                            let server = self.proto.server();
                            let n = self.conns.len() as u32;
                            let awaited: Vec<u32> = (0..n).filter(|w| server.awaits(WorkerId(*w))).collect();
                            note(Note::Log(&ledger::awaited_line(&awaited, waiting_for, missing)));
                            let connected: Vec<bool> = self.conns.iter().map(Option::is_some).collect();
                            for line in ledger::stall_lines(&self.report, &connected) {
                                note(Note::Log(&line));
                            }
                        }
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
            let version = self.proto.server().version();
            if version != self.last_version {
                self.last_version = version;
                self.shared.version.store(version.0, Ordering::SeqCst);
                note(Note::Model { version, params: self.proto.server().params() });
            }
            let totals = self.totals();
            if let Some(p) = self.persist.as_mut() {
                for e in p.flush(&totals) {
                    note(Note::Log(&e));
                }
                if p.take_due() {
                    self.save_checkpoint(note);
                }
            }
            for bytes in upbox {
                let sent = self.up.as_ref().map(|up| up.tx.try_send(bytes));
                match sent {
                    Some(Ok(())) => {}
                    Some(Err(_)) => self.lose_upstream("upstream send queue full", note),
                    None => self.lose_upstream("no upstream connection", note),
                }
            }
            let dropped = self.send(outbox);
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

    /// Hands each message to its recipients' writers; returns the workers whose writer could
    /// not take it, and why.
    fn send(&mut self, outbox: Vec<(Recipient, Arc<Vec<u8>>, bool)>) -> Vec<(WorkerId, &'static str)> {
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
        dropped
    }

    fn is_connected(&self, w: WorkerId) -> bool {
        matches!(self.conns.get(w.index()), Some(Some(_)))
    }

    fn save_checkpoint(&mut self, note: &mut dyn FnMut(Note<'_>)) {
        if !self.proto.is_known() {
            // No model yet: a checkpoint of the placeholder would be taken for one.
            return;
        }
        if self.persist.is_some() {
            // Before the file: a checkpoint on disk is always covered by what the caller wrote.
            note(Note::Checkpoint { version: self.proto.server().version() });
        }
        let totals = self.totals();
        let Some(persist) = self.persist.as_mut() else {
            return;
        };
        let server = self.proto.server();
        let name = self.shared.announce.config.name();
        let rule = server.optimizer_state().map(|state| (self.shared.options.settings.optimizer, state));
        match persist.save(name, server.version(), server.params(), rule, server.stats().accepted, &totals) {
            Ok(journal_error) => {
                self.report.checkpoints += 1;
                if let Some(e) = journal_error {
                    note(Note::Log(&e));
                }
            }
            Err(e) => note(Note::Log(&e)),
        }
    }

    /// The protocol's totals, for the journal.
    fn totals(&self) -> Totals {
        let st = self.proto.server().stats();
        Totals {
            received: self.report.received,
            accepted: st.accepted,
            applied: st.applied,
            dropped: st.dropped_total(),
        }
    }

    /// Ends the run: tells workers to stop (unless crashing), writes the final checkpoint,
    /// and closes every connection (lingering, unless crashing).
    pub(super) fn finish(
        &mut self,
        reason: StopReason,
        from_conns: &Receiver<ConnEvent>,
        note: &mut dyn FnMut(Note<'_>),
    ) {
        let abrupt = matches!(reason, StopReason::Crashed | StopReason::UpstreamLost);
        if !abrupt {
            if reason != StopReason::UpstreamStopped {
                self.proto.server_mut().stop();
            }
            self.drain(note);
            // A diverged model would replace the last checkpoint's good one.
            if self.persist.is_some() && reason != StopReason::Diverged {
                self.save_checkpoint(note);
            }
        }
        let mut conns: Vec<Conn> = self.conns.iter_mut().filter_map(Option::take).collect();
        conns.extend(self.up.take());
        if abrupt {
            close::cut(conns);
            return;
        }
        let stop = self.bufs.encode(&ToWorker::<f32>::Stop, self.shared.options.wire).ok();
        close::stop_late(&mut conns, from_conns, stop.clone(), &mut |event| match event {
            ConnEvent::Frame(frame) if self.is_contribution(frame.message()) => {
                self.ledger.count(&mut self.report, frame.conn, Entry::InFlightAtStop);
            }
            ConnEvent::Log(line) => Self::log(note, &line),
            _ => {}
        });
        close::linger(conns, from_conns, stop, &mut |frame| {
            if self.is_contribution(frame.message()) {
                self.ledger.count(&mut self.report, frame.conn, Entry::InFlightAtStop);
            }
        });
    }
}

fn close_conn(conn: &Conn) {
    let _ = conn.stream.shutdown(Shutdown::Both);
}
