//! One server rank's side of the run: its link, shard, peers, ledger and report, and the
//! steps of the loop (drain the core's outputs, handle a message, keep the peers alive).

use crate::ledger::{ShardLedger, ShardSummary};
use crate::link::set_payload_len;
use crate::link::{Incoming, Kind, Link, SPLIT_MIN};
use crate::{Shared, Tally, since};
use mpi::topology::Rank;
use std::sync::Arc;
use std::time::{Duration, Instant};
use syncopate::proto::Heap;
use syncopate::proto::sharded::ShardLayout;
use syncopate::wire::{self, Limits, MessageKind};
use syncopate::{AnyServer, Recipient, Server, ServerEvent, ServerOutput, ToServer, ToWorker, Values, WorkerId};

use super::ranks::{Peers, Ranks};
use super::report::{ServerReport, StopReason};

pub(super) struct Side<'a> {
    pub(super) link: Link,
    pub(super) shard: u32,
    pub(super) layout: ShardLayout,
    pub(super) ranks: Ranks,
    pub(super) peers: Peers,
    pub(super) report: ServerReport,
    pub(super) ledger: ShardLedger,
    /// A stop rank 0 asked for (another shard was lost).
    pub(super) stop: Option<StopReason>,
    /// At rank 0 of a sharded run: the other shards' reports.
    pub(super) summaries: Vec<Option<ShardSummary>>,
    /// When the loop started (the loss curve's clock).
    pub(super) started: Instant,
    pub(super) log: &'a mut dyn FnMut(&str),
}

/// Whether the encoded message `bytes` is a contribution (what the ledger counts).
pub(super) fn is_contribution(bytes: &[u8]) -> bool {
    wire::peek_header(bytes)
        .is_ok_and(|h| matches!(h.kind, MessageKind::Grad | MessageKind::Delta | MessageKind::Clock))
}

impl Side<'_> {
    pub(super) fn drain(&mut self, server: &mut AnyServer<f32, Shared, Heap>) {
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
    pub(super) fn send(&mut self, to: Recipient, msg: &ToWorker<'_, f32>, params: Option<&Arc<Vec<f32>>>) {
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

    pub(super) fn feed(
        &mut self,
        server: &mut AnyServer<f32, Shared, Heap>,
        m: &Incoming,
        limits: &Limits,
        origin: Instant,
    ) {
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
            Kind::Wire => self.feed_wire(server, w, m.message(), limits, origin),
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
    pub(super) fn feed_wire(
        &mut self,
        server: &mut AnyServer<f32, Shared, Heap>,
        w: WorkerId,
        bytes: &[u8],
        limits: &Limits,
        origin: Instant,
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
                server.handle(since(origin), w, msg).is_ok()
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
    pub(super) fn tell_rejoin(&mut self, w: WorkerId) {
        let Some(told) = self.ranks.told.get_mut(w.index()).filter(|t| !**t) else { return };
        *told = true;
        let next = self.ranks.epoch(w).saturating_add(1);
        let rank = self.ranks.rank(w);
        self.link.send(&[rank], Kind::Rejoin, next.to_le_bytes().to_vec());
    }

    /// A message from another shard rank.
    pub(super) fn feed_from_shard(&mut self, m: &Incoming) {
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
    pub(super) fn check_silence(
        &mut self,
        server: &mut AnyServer<f32, Shared, Heap>,
        lost_after: Duration,
        origin: Instant,
    ) {
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
                if let Err(e) = server.handle_worker_lost(since(origin), w) {
                    self.report.refused += 1;
                    (self.log)(&format!("the protocol refused the loss of worker {i}: {e}"));
                }
            }
        }
    }

    /// Sends the other shards their heartbeats when due; returns the shard silent for
    /// longer than `lost_after`, if any (logged; rank 0 tells the other shards).
    pub(super) fn check_peers(&mut self, lost_after: Duration) -> Option<u32> {
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
    pub(super) fn workers_done(&self) -> bool {
        !self.ranks.live.is_empty()
            && self.ranks.live.iter().all(|r| {
                self.ranks.worker(*r).and_then(|w| self.report.workers.get(w.index())).is_some_and(Option::is_some)
            })
    }

    /// `shard k: ` in a sharded run, else nothing.
    pub(super) fn prefix(&self) -> String {
        if self.layout.shards() > 1 { format!("shard {}: ", self.shard) } else { String::new() }
    }
}
