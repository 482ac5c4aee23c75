//! Rank 0: the parameter server. The loop is the core's driving contract: read the clock,
//! feed one input, drain the outputs, wait until the next deadline or message.

use crate::link::set_payload_len;
use crate::link::{Incoming, Kind, Link, SPLIT_MIN};
use crate::{MpiError, RunPlan, Shared, Tally, since};
use mpi::topology::{Rank, SimpleCommunicator};
use std::sync::Arc;
use std::time::{Duration, Instant};
use syncopate::proto::Heap;
use syncopate::wire::{self, Limits};
use syncopate::{
    AnyServer, ProtocolConfig, Recipient, Server, ServerEvent, ServerOutput, ServerStats, ToWorker, Values, Version,
    WorkerId,
};

/// Why the server ended the run.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum StopReason {
    /// The gradient budget was reached.
    Budget,
    /// The time limit passed.
    TimeLimit,
    /// Every worker rank was lost.
    AllWorkersLost,
}

/// The outcome of a run at rank 0.
#[derive(Clone, Debug)]
pub struct ServerReport {
    /// Why the run ended.
    pub reason: StopReason,
    /// The final model version.
    pub version: Version,
    /// The final model.
    pub params: Vec<f32>,
    /// The server's counters.
    pub stats: ServerStats,
    /// Staleness of each applied contribution: sum, count and maximum.
    pub staleness: (u64, u64, u64),
    /// Stall reports the server made.
    pub stalls: u64,
    /// Inputs refused (undecodable, refused by the protocol, or from a lost rank).
    pub refused: u64,
    /// Wall-clock seconds from the start of the loop to the stop.
    pub wall_s: f64,
    /// Each worker's tally (`None`: its rank was lost, or its tally did not arrive).
    pub workers: Vec<Option<Tally>>,
    /// Workers declared lost, in the order they were.
    pub lost: Vec<WorkerId>,
}

/// What the loop knows about the worker ranks.
struct Ranks {
    last_heard: Vec<Instant>,
    lost: Vec<bool>,
    live: Vec<Rank>,
}

impl Ranks {
    fn new(n: u32) -> Self {
        let now = Instant::now();
        Self { last_heard: vec![now; n as usize], lost: vec![false; n as usize], live: (1..=n as Rank).collect() }
    }

    /// The worker of `rank`, if it is a worker rank.
    fn worker(&self, rank: Rank) -> Option<WorkerId> {
        let w = u32::try_from(rank.checked_sub(1)?).ok()?;
        ((w as usize) < self.lost.len()).then_some(WorkerId(w))
    }

    fn is_lost(&self, w: WorkerId) -> bool {
        self.lost.get(w.index()).copied().unwrap_or(true)
    }

    fn mark_lost(&mut self, w: WorkerId) {
        if let Some(l) = self.lost.get_mut(w.index()) {
            *l = true;
        }
        self.live.retain(|r| *r != w.index() as Rank + 1);
    }

    /// The live ranks a message to `to` goes to.
    fn recipients(&self, to: Recipient) -> &[Rank] {
        match to {
            Recipient::AllWorkers => &self.live,
            Recipient::Worker(w) => {
                let rank = w.index() as Rank + 1;
                self.live.binary_search(&rank).map_or(&[], |i| &self.live[i..=i])
            }
        }
    }
}

struct Side<'a> {
    link: Link,
    ranks: Ranks,
    report: ServerReport,
    log: &'a mut dyn FnMut(&str),
}

impl Side<'_> {
    fn drain(&mut self, server: &mut AnyServer<f32, Shared, Heap>) {
        // The model's buffer: a `Model` of it is sent straight from it (polling outputs
        // writes nothing, so it is the same buffer throughout).
        let params = server.params_buffer().map(|b| Arc::clone(&b.0));
        while let Some(output) = server.poll_output() {
            match output {
                ServerOutput::Send { to, msg } => self.send(to, &msg, params.as_ref()),
                ServerOutput::Event(ServerEvent::Applied { staleness, .. }) => {
                    let s = &mut self.report.staleness;
                    s.0 += staleness;
                    s.1 += 1;
                    s.2 = s.2.max(staleness);
                }
                ServerOutput::Event(ServerEvent::Stalled { .. }) => self.report.stalls += 1,
                ServerOutput::Event(_) => {}
                // No upstream link here: a server with an upstream is refused before the run,
                // and one without never sends upstream; logged, should it ever happen.
                ServerOutput::Upstream(msg) => {
                    (self.log)(&format!("the server sent a {} message upstream, but has no upstream", msg.kind_name()));
                }
            }
        }
    }

    /// Sends `msg` to every live recipient: a `Model` of the server's own buffer `params`
    /// (large enough) as its head and then its payload straight from that buffer, which
    /// stays shared (copy-on-write) until the sends completed; any other message encoded
    /// once, those bytes sent to every recipient (a large tensor as head and payload too).
    fn send(&mut self, to: Recipient, msg: &ToWorker<'_, f32>, params: Option<&Arc<Vec<f32>>>) {
        let ranks = self.ranks.recipients(to);
        if ranks.is_empty() {
            return;
        }
        if let (ToWorker::Model { version, clock, values: Values::Slice(s) }, Some(params)) = (msg, params) {
            let lend = cfg!(target_endian = "little")
                && size_of_val(*s) >= SPLIT_MIN
                && s.as_ptr() == params.as_ptr()
                && s.len() == params.len();
            if lend {
                let head: ToWorker<'_, f32> =
                    ToWorker::Model { version: *version, clock: *clock, values: Values::Slice(&[]) };
                let mut out = self.link.buffer();
                out.resize(wire::encoded_len_to_worker(&head), 0);
                if let Ok(len) = wire::encode_to_worker(&head, &mut out) {
                    out.truncate(len);
                    if set_payload_len(&mut out, size_of_val(*s)) && self.link.send_lent(ranks, out, Arc::clone(params))
                    {
                        return;
                    }
                }
            }
        }
        let mut out = self.link.buffer();
        out.resize(wire::encoded_len_to_worker(msg), 0);
        match wire::encode_to_worker(msg, &mut out) {
            Ok(len) => {
                out.truncate(len);
                // A large tensor goes as a head and a payload read from this one buffer, so a
                // worker can receive the payload straight into its model buffer.
                match wire::peek_header(&out) {
                    Ok(h) if h.payload_len >= SPLIT_MIN => self.link.send_split(ranks, out, len - h.payload_len),
                    _ => self.link.send(ranks, Kind::Wire, out),
                }
            }
            Err(e) => (self.log)(&format!("cannot encode a {} message: {e}", msg.kind_name())),
        }
    }

    fn feed(&mut self, server: &mut AnyServer<f32, Shared, Heap>, m: &Incoming, limits: &Limits, epoch: Instant) {
        let Some(w) = self.ranks.worker(m.from) else {
            self.report.refused += 1;
            return;
        };
        if let Some(t) = self.ranks.last_heard.get_mut(w.index()) {
            *t = Instant::now();
        }
        match m.kind {
            Kind::Wire if self.ranks.is_lost(w) => self.report.refused += 1,
            Kind::Wire => {
                let ok = match wire::decode_to_server::<f32>(m.message(), limits) {
                    Ok(msg) => server.handle(since(epoch), w, msg).is_ok(),
                    Err(_) => false,
                };
                if !ok {
                    self.report.refused += 1;
                }
            }
            Kind::Heartbeat => {}
            // `Link` joins a head and its payload into one `Wire` message: never seen here.
            Kind::Head | Kind::Payload => self.report.refused += 1,
            Kind::Tally => {
                if let Some(slot) = self.report.workers.get_mut(w.index()) {
                    *slot = Tally::from_bytes(m.message());
                }
            }
        }
    }

    /// Declares every worker rank silent for longer than `lost_after` lost.
    fn check_silence(&mut self, server: &mut AnyServer<f32, Shared, Heap>, lost_after: Duration, epoch: Instant) {
        let now = Instant::now();
        for i in 0..self.ranks.lost.len() {
            let w = WorkerId(i as u32);
            let silent = self.ranks.last_heard.get(i).map_or(Duration::ZERO, |t| now.duration_since(*t));
            if !self.ranks.is_lost(w) && silent > lost_after {
                (self.log)(&format!(
                    "rank {} (worker {i}) silent for {:.1} s: lost worker, the run goes on without it",
                    i + 1,
                    silent.as_secs_f64()
                ));
                self.ranks.mark_lost(w);
                self.link.abandon(i as Rank + 1);
                self.report.lost.push(w);
                // Never refused for want of room (the core applies a loss reported during a
                // batch once it has drained); a refusal is counted and logged.
                if let Err(e) = server.handle_worker_lost(since(epoch), w) {
                    self.report.refused += 1;
                    (self.log)(&format!("the protocol refused the loss of worker {i}: {e}"));
                }
            }
        }
    }
}

/// Runs the server of `protocol` at rank 0 of `world` (ranks `1..=n` must run
/// [`crate::run_worker`]) from `params` until `plan` ends the run. `on_model` sees the model
/// after every drained input that changed its version; `log` gets one line per event worth
/// telling (a lost rank).
pub fn run_server(
    world: SimpleCommunicator,
    protocol: &ProtocolConfig,
    params: Vec<f32>,
    plan: &RunPlan,
    on_model: &mut dyn FnMut(Version, &[f32]),
    log: &mut dyn FnMut(&str),
) -> Result<ServerReport, MpiError> {
    let n = protocol.workers();
    crate::check_message_size(params.len())?;
    let link = Link::new(world);
    crate::check_world(&link, n)?;
    let dim = params.len();
    let scratch = Shared::zeroed(protocol.server_scratch_len(dim));
    let spare = Shared::zeroed(protocol.spare_accumulator_len(dim));
    let mut server = AnyServer::new(protocol, Shared(Arc::new(params)), scratch)
        .and_then(|s| s.with_spare_accumulator(spare))
        .map_err(|e| MpiError(format!("cannot start the server: {e}")))?;
    if server.has_upstream() {
        return Err(MpiError("the server needs an upstream link, which the MPI adapter does not have".into()));
    }
    let limits = Limits::for_model(dim);
    let report = ServerReport {
        reason: StopReason::Budget,
        version: Version::ZERO,
        params: Vec::new(),
        stats: ServerStats::default(),
        staleness: (0, 0, 0),
        stalls: 0,
        refused: 0,
        wall_s: 0.0,
        workers: vec![None; n as usize],
        lost: Vec::new(),
    };
    let mut side = Side { link, ranks: Ranks::new(n), report, log };
    let epoch = Instant::now();
    let tick = Duration::from_millis(50);
    let mut seen: Option<Version> = None;
    let reason = loop {
        side.drain(&mut server);
        if seen != Some(server.version()) {
            seen = Some(server.version());
            on_model(server.version(), server.params());
        }
        if server.stats().accepted >= plan.max_gradients {
            break StopReason::Budget;
        }
        if plan.time_limit.is_some_and(|t| epoch.elapsed() >= t) {
            break StopReason::TimeLimit;
        }
        side.check_silence(&mut server, plan.lost_after, epoch);
        if side.ranks.live.is_empty() {
            break StopReason::AllWorkersLost;
        }
        let now = Instant::now();
        let wait = server.poll_timeout().map_or(tick, |at| crate::until(epoch, at).min(tick));
        match side.link.recv_until(now + wait, None) {
            Some(m) => {
                side.feed(&mut server, &m, &limits, epoch);
                side.link.recycle(m);
            }
            None => server.handle_timeout(since(epoch)),
        }
    };
    server.stop();
    side.drain(&mut server);
    let wall_s = epoch.elapsed().as_secs_f64();
    // A lost rank that comes back must stop too.
    let lost: Vec<Rank> = side.report.lost.iter().map(|w| w.index() as Rank + 1).collect();
    if !lost.is_empty() {
        let mut stop = side.link.buffer();
        stop.resize(wire::encoded_len_to_worker(&ToWorker::<f32>::Stop), 0);
        if let Ok(len) = wire::encode_to_worker(&ToWorker::<f32>::Stop, &mut stop) {
            stop.truncate(len);
            side.link.send(&lost, Kind::Wire, stop);
        }
    }
    let patience = plan.lost_after.max(Duration::from_secs(5));
    collect_tallies(&mut side, &mut server, &limits, epoch, patience);
    // Sends to live ranks complete (they are reading); those to lost ranks may never.
    for rank in &lost {
        side.link.abandon(*rank);
    }
    side.link.flush(Instant::now() + patience);
    let mut report = side.report;
    report.reason = reason;
    report.wall_s = wall_s;
    report.version = server.version();
    report.stats = *server.stats();
    report.params = server.params().to_vec();
    Ok(report)
}

/// Waits up to `patience` for the tally of every live worker.
fn collect_tallies(
    side: &mut Side<'_>,
    server: &mut AnyServer<f32, Shared, Heap>,
    limits: &Limits,
    epoch: Instant,
    patience: Duration,
) {
    let deadline = Instant::now() + patience;
    let missing = |side: &Side<'_>| {
        side.ranks.live.iter().any(|r| side.report.workers.get(*r as usize - 1).is_some_and(Option::is_none))
    };
    while missing(side) {
        let Some(m) = side.link.recv_until(deadline, None) else { break };
        if m.kind == Kind::Tally {
            side.feed(server, &m, limits, epoch);
        }
        side.link.recycle(m);
    }
}
