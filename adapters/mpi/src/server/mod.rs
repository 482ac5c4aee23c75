//! Server ranks: rank 0 the parameter server, or, with `S` shards, ranks `0..S`, each the
//! protocol's unchanged server over its slice of the model (docs/PROTOCOLS.md, "Sharded
//! servers": every shard decides alone). The loop is the core's driving contract: read the
//! clock, feed one input, drain the outputs, wait until the next deadline or message.
//!
//! Liveness of workers: a worker rank silent for longer than the loss timeout is a lost
//! worker; a lost rank heard again is told to rejoin with a new epoch ([`Kind::Rejoin`]),
//! and counted back once its `Join` of that epoch arrives.
//!
//! Shards: rank 0 and every other shard send each other heartbeats (a star around rank 0);
//! a shard silent for the loss timeout stops the run, naming it (rank 0 tells the other
//! shards). A shard also stops once every live worker has sent its final tally (the
//! workers stopped: nothing more will come). At the end every shard sends rank 0 its
//! report ([`ShardSummary`]): rank 0 assembles the model and sums the counters.

use crate::ledger::{ShardLedger, ShardSummary};
use crate::link::set_payload_len;
use crate::link::{Incoming, Kind, Link, SPLIT_MIN};
use crate::{MpiError, RunPlan, Shared, Tally, since};
use mpi::topology::{Rank, SimpleCommunicator};
use std::sync::Arc;
use std::time::{Duration, Instant};
use syncopate::proto::Heap;
use syncopate::proto::sharded::ShardLayout;
use syncopate::wire::{self, Limits, MessageKind};
use syncopate::{
    AnyServer, ProtocolConfig, Recipient, Server, ServerEvent, ServerOutput, ServerStats, ToServer, ToWorker, Values,
    Version, WorkerId,
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
    /// Every live worker stopped (it sent its final tally): another shard ended the run.
    WorkersDone,
    /// The shard of this index (its rank) fell silent: the run stops.
    ShardLost(u32),
}

/// The outcome of a run at a server rank.
#[derive(Clone, Debug)]
pub struct ServerReport {
    /// Why the run ended.
    pub reason: StopReason,
    /// The final model version (with shards, the lowest of the shards').
    pub version: Version,
    /// The final model (at rank 0 of a sharded run, assembled from every shard's slice; at
    /// another shard, its slice).
    pub params: Vec<f32>,
    /// The server's counters (at rank 0 of a sharded run, summed over the shards).
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
    /// Workers that rejoined after being declared lost, in the order they did.
    pub rejoined: Vec<WorkerId>,
    /// The ledger of every shard whose report arrived (one entry without shards), in
    /// shard order.
    pub shards: Vec<ShardLedger>,
    /// Per model update whose contributions reported losses: the version, the seconds since
    /// the loop started and the mean reported loss (this shard's updates; every shard's
    /// workers report the whole model's loss).
    pub loss_curve: Vec<(u64, f64, f32)>,
}

impl ServerReport {
    /// The report of a run of `workers` workers before it starts: nothing counted yet.
    pub(crate) fn empty(workers: usize) -> Self {
        Self {
            reason: StopReason::Budget,
            version: Version::ZERO,
            params: Vec::new(),
            stats: ServerStats::default(),
            staleness: (0, 0, 0),
            stalls: 0,
            refused: 0,
            wall_s: 0.0,
            workers: vec![None; workers],
            lost: Vec::new(),
            rejoined: Vec::new(),
            shards: Vec::new(),
            loss_curve: Vec::new(),
        }
    }
}

mod end;
mod ranks;
#[cfg(test)]
mod tests;

use end::{collect_tallies, finish};
use ranks::{Peers, Ranks};

struct Side<'a> {
    link: Link,
    shard: u32,
    layout: ShardLayout,
    ranks: Ranks,
    peers: Peers,
    report: ServerReport,
    ledger: ShardLedger,
    /// A stop rank 0 asked for (another shard was lost).
    stop: Option<StopReason>,
    /// At rank 0 of a sharded run: the other shards' reports.
    summaries: Vec<Option<ShardSummary>>,
    /// When the loop started (the loss curve's clock).
    started: Instant,
    log: &'a mut dyn FnMut(&str),
}

/// Whether the encoded message `bytes` is a contribution (what the ledger counts).
fn is_contribution(bytes: &[u8]) -> bool {
    wire::peek_header(bytes)
        .is_ok_and(|h| matches!(h.kind, MessageKind::Grad | MessageKind::Delta | MessageKind::Clock))
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
                ServerOutput::Event(ServerEvent::ModelUpdated { version, mean_loss: Some(loss), .. }) => {
                    let t = self.started.elapsed().as_secs_f64();
                    self.report.loss_curve.push((version.0, t, loss));
                }
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
        if m.from < self.ranks.first {
            self.feed_from_shard(m);
            return;
        }
        let Some(w) = self.ranks.worker(m.from) else {
            self.report.refused += 1;
            return;
        };
        if let Some(t) = self.ranks.last_heard.get_mut(w.index()) {
            *t = Instant::now();
        }
        match m.kind {
            Kind::Wire => self.feed_wire(server, w, m.message(), limits, epoch),
            Kind::Heartbeat => {
                if self.ranks.is_lost(w) {
                    self.tell_rejoin(w);
                }
            }
            Kind::Tally => {
                if let Some(slot) = self.report.workers.get_mut(w.index()) {
                    *slot = Tally::from_bytes(m.message());
                }
            }
            // `Link` joins a head and its payload into one `Wire` message: never seen here;
            // the others come from servers only.
            Kind::Head | Kind::Payload | Kind::Rejoin | Kind::ShardStop | Kind::ShardReport => {
                self.report.refused += 1;
            }
        }
    }

    /// A protocol message from worker `w`. A lost rank's messages are refused, but for a
    /// `Join` of a new epoch, which counts it back.
    fn feed_wire(
        &mut self,
        server: &mut AnyServer<f32, Shared, Heap>,
        w: WorkerId,
        bytes: &[u8],
        limits: &Limits,
        epoch: Instant,
    ) {
        let contribution = is_contribution(bytes);
        if contribution {
            self.ledger.delivered += 1;
        }
        let lost = self.ranks.is_lost(w);
        let decoded = wire::decode_to_server::<f32>(bytes, limits);
        let join = match &decoded {
            Ok(ToServer::Join { epoch }) => Some(*epoch),
            _ => None,
        };
        let fed = match decoded {
            Ok(msg) if !lost || join.is_some_and(|e| e > self.ranks.epoch(w)) => {
                server.handle(since(epoch), w, msg).is_ok()
            }
            _ => false,
        };
        match (fed, join) {
            (true, Some(e)) => {
                if let Some(slot) = self.ranks.epoch.get_mut(w.index()) {
                    *slot = (*slot).max(e);
                }
                if lost {
                    self.ranks.revive(w);
                    self.report.rejoined.push(w);
                    let line = format!(
                        "{}rank {} (worker {}) rejoined with epoch {e}: counted back",
                        self.prefix(),
                        self.ranks.rank(w),
                        w.0
                    );
                    (self.log)(&line);
                }
            }
            (true, None) => {}
            (false, _) => {
                self.report.refused += 1;
                if contribution {
                    self.ledger.refused += 1;
                }
                if lost {
                    self.tell_rejoin(w);
                }
            }
        }
    }

    /// Tells lost worker `w` (once per loss) to rejoin with the epoch after its last.
    fn tell_rejoin(&mut self, w: WorkerId) {
        let Some(told) = self.ranks.told.get_mut(w.index()).filter(|t| !**t) else { return };
        *told = true;
        let next = self.ranks.epoch(w).saturating_add(1);
        let rank = self.ranks.rank(w);
        self.link.send(&[rank], Kind::Rejoin, next.to_le_bytes().to_vec());
    }

    /// A message from another shard rank.
    fn feed_from_shard(&mut self, m: &Incoming) {
        self.peers.heard(m.from);
        match m.kind {
            Kind::Heartbeat => {}
            Kind::ShardStop => {
                let lost = m.message().try_into().ok().map(u32::from_le_bytes);
                if let Some(k) = lost.filter(|_| m.from == 0 && self.stop.is_none()) {
                    (self.log)(&format!("shard {}: shard {k} was lost: the run stops", self.shard));
                    self.stop = Some(StopReason::ShardLost(k));
                }
            }
            Kind::ShardReport if self.shard == 0 => {
                let k = u32::try_from(m.from).unwrap_or(u32::MAX);
                let summary = ShardSummary::from_bytes(m.message(), self.layout.len(k));
                match (summary, self.summaries.get_mut(k as usize)) {
                    (Some(s), Some(slot)) => *slot = Some(s),
                    _ => self.report.refused += 1,
                }
            }
            _ => self.report.refused += 1,
        }
    }

    /// Declares every worker rank silent for longer than `lost_after` lost.
    fn check_silence(&mut self, server: &mut AnyServer<f32, Shared, Heap>, lost_after: Duration, epoch: Instant) {
        let now = Instant::now();
        for i in 0..self.ranks.lost.len() {
            let w = WorkerId(i as u32);
            let silent = self.ranks.last_heard.get(i).map_or(Duration::ZERO, |t| now.duration_since(*t));
            if !self.ranks.is_lost(w) && silent > lost_after {
                let rank = self.ranks.rank(w);
                let line = format!(
                    "{}rank {rank} (worker {i}) silent for {:.1} s: lost worker, the run goes on without it",
                    self.prefix(),
                    silent.as_secs_f64()
                );
                (self.log)(&line);
                self.ranks.mark_lost(w);
                self.link.abandon(rank);
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

    /// Sends the other shards their heartbeats when due; returns the shard silent for
    /// longer than `lost_after`, if any (logged; rank 0 tells the other shards).
    fn check_peers(&mut self, lost_after: Duration) -> Option<u32> {
        let now = Instant::now();
        if now >= self.peers.next_heartbeat && !self.peers.ranks.is_empty() {
            self.link.send(&self.peers.ranks, Kind::Heartbeat, Vec::new());
            self.peers.next_heartbeat = now + self.peers.interval;
        }
        let (rank, silent) = self
            .peers
            .ranks
            .iter()
            .zip(&self.peers.last_heard)
            .map(|(r, t)| (*r, now.duration_since(*t)))
            .find(|(_, silent)| *silent > lost_after)?;
        let k = u32::try_from(rank).unwrap_or(u32::MAX);
        (self.log)(&format!(
            "shard {}: shard {k} (rank {rank}) silent for {:.1} s: lost shard, the run stops",
            self.shard,
            silent.as_secs_f64()
        ));
        if self.shard == 0 {
            let others: Vec<Rank> = self.peers.ranks.iter().copied().filter(|r| *r != rank).collect();
            self.link.send(&others, Kind::ShardStop, k.to_le_bytes().to_vec());
        }
        self.link.abandon(rank);
        Some(k)
    }

    /// Whether every live worker sent its final tally (with shards: the workers stopped).
    fn workers_done(&self) -> bool {
        !self.ranks.live.is_empty()
            && self.ranks.live.iter().all(|r| {
                self.ranks.worker(*r).and_then(|w| self.report.workers.get(w.index())).is_some_and(Option::is_some)
            })
    }

    /// `shard k: ` in a sharded run, else nothing.
    fn prefix(&self) -> String {
        if self.layout.shards() > 1 { format!("shard {}: ", self.shard) } else { String::new() }
    }
}

/// Runs the server of `protocol` at rank 0 of `world` (ranks `1..=n` must run
/// [`crate::run_worker`]) from `params` until `plan` ends the run. `on_model` sees the model
/// after every drained input that changed its version; `log` gets one line per event worth
/// telling (a lost rank, a rejoin).
pub fn run_server(
    world: SimpleCommunicator,
    protocol: &ProtocolConfig,
    params: Vec<f32>,
    plan: &RunPlan,
    on_model: &mut dyn FnMut(Version, &[f32]),
    log: &mut dyn FnMut(&str),
) -> Result<ServerReport, MpiError> {
    run_shard(world, protocol, 1, params, plan, on_model, log)
}

/// Runs shard `rank` of `shards` of `protocol` at this rank of `world` (ranks `0..shards`
/// run this, ranks `shards..shards + n` run [`crate::run_worker`] with the same `shards`):
/// `params` is the whole initial model; this rank holds its slice
/// ([`crate::shard_layout`]) and `on_model` sees that slice. Each shard ends on its own
/// budget or time limit, when every worker stopped, or when a shard is lost; then rank 0
/// gathers every shard's report and returns the assembled model and the summed counters.
/// With `shards` 1, [`run_server`].
pub fn run_shard(
    world: SimpleCommunicator,
    protocol: &ProtocolConfig,
    shards: u32,
    params: Vec<f32>,
    plan: &RunPlan,
    on_model: &mut dyn FnMut(Version, &[f32]),
    log: &mut dyn FnMut(&str),
) -> Result<ServerReport, MpiError> {
    let n = protocol.workers();
    let layout = crate::shard_layout(params.len(), shards)?;
    crate::check_message_size(layout.len(0))?;
    let link = Link::new(world);
    crate::check_world(&link, n, shards)?;
    let shard = u32::try_from(link.rank()).unwrap_or(u32::MAX);
    let range = layout.range(shard).ok_or_else(|| {
        MpiError(format!("rank {shard} is a worker (ranks {shards}..): run_shard needs a shard rank"))
    })?;
    let slice = params.get(range.clone()).unwrap_or_default().to_vec();
    let dim = slice.len();
    let scratch = Shared::zeroed(protocol.server_scratch_len(dim));
    let spare = Shared::zeroed(protocol.spare_accumulator_len(dim));
    let mut server = AnyServer::new(protocol, Shared(Arc::new(slice)), scratch)
        .and_then(|s| s.with_spare_accumulator(spare))
        .and_then(|s| if plan.momentum == 0.0 { Ok(s) } else { s.with_momentum(plan.momentum, Shared::zeroed(dim)) })
        .map_err(|e| MpiError(format!("cannot start the server: {e}")))?;
    if server.has_upstream() {
        return Err(MpiError("the server needs an upstream link, which the MPI adapter does not have".into()));
    }
    let limits = Limits::for_model(dim);
    let report = ServerReport::empty(n as usize);
    let first = Rank::try_from(shards).unwrap_or(Rank::MAX);
    let mut side = Side {
        link,
        shard,
        layout,
        ranks: Ranks::new(n, first),
        peers: Peers::new(shard, shards, plan.lost_after),
        report,
        ledger: ShardLedger { shard, elements: dim as u64, ..ShardLedger::default() },
        stop: None,
        summaries: vec![None; shards as usize],
        started: Instant::now(),
        log,
    };
    let epoch = side.started;
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
        if let Some(reason) = side.stop {
            break reason;
        }
        side.check_silence(&mut server, plan.lost_after, epoch);
        if side.ranks.live.is_empty() {
            break StopReason::AllWorkersLost;
        }
        if shards > 1 && side.workers_done() {
            break StopReason::WorkersDone;
        }
        if let Some(k) = side.check_peers(plan.lost_after) {
            break StopReason::ShardLost(k);
        }
        let now = Instant::now();
        let mut wait = server.poll_timeout().map_or(tick, |at| crate::until(epoch, at).min(tick));
        if !side.peers.ranks.is_empty() {
            wait = wait.min(side.peers.next_heartbeat.saturating_duration_since(now));
        }
        match side.link.recv_until(now + wait, None, None) {
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
    let lost: Vec<Rank> = (0..n).map(WorkerId).filter(|w| side.ranks.is_lost(*w)).map(|w| side.ranks.rank(w)).collect();
    if !lost.is_empty() {
        let mut stop = side.link.buffer();
        stop.resize(wire::encoded_len_to_worker(&ToWorker::<f32>::Stop), 0);
        if let Ok(len) = wire::encode_to_worker(&ToWorker::<f32>::Stop, &mut stop) {
            stop.truncate(len);
            side.link.send(&lost, Kind::Wire, stop);
        }
    }
    // With shards, a worker waits up to the loss timeout for a shard's `Stop` after
    // another's, so its tally may come that much later.
    let patience =
        plan.lost_after.max(Duration::from_secs(5)) + if shards > 1 { plan.lost_after } else { Duration::ZERO };
    collect_tallies(&mut side, &mut server, &limits, epoch, patience);
    // Sends to live ranks complete (they are reading); those to lost ranks may never.
    for rank in &lost {
        side.link.abandon(*rank);
    }
    let mut report = finish(&mut side, &server, reason, wall_s, patience);
    side.link.flush(Instant::now() + patience);
    if shard == 0 && shards > 1 {
        end::assemble(&mut side, &mut report, &params);
    }
    Ok(report)
}
