//! Sharded servers in the simulator ([`SimConfig::shards`] > 1): the model split into `S`
//! contiguous slices ([`ShardLayout`]), each held by its own server node running the
//! unchanged protocol over its slice, and every worker a [`ShardedWorker`] that sends each
//! shard its slice and computes on the model assembled from the shards' replies.
//!
//! Network: every node has a network card with one link per direction (bandwidth
//! [`NetworkConfig::bandwidth`](super::NetworkConfig), FIFO). A message occupies the
//! sender's outgoing link, then, once it has left it, the receiver's incoming link (stored
//! and forwarded whole, queued at the receiver in the order messages reach it), and arrives
//! one latency after it left the second link; so a shard's card is a shared
//! bottleneck for every worker's slice of that shard, and a worker's card for its `S`
//! slices. Dedicated shards have cards of their own; with [`SimConfig::colocate_shards`]
//! shard `k` runs on worker `k`'s machine and shares its card, and the slice between worker
//! `k` and shard `k` does not cross the network. A worker hands its slices to its card
//! starting with shard `id mod S`, and a shard its copies of a broadcast starting with worker
//! `k·n/S`, so that in a synchronous round the cards take turns instead of queueing behind
//! the same one.
//!
//! Each shard decides alone (docs/PROTOCOLS.md, "Sharded servers"); each keeps its own
//! counters and its ledger ([`ShardReport`]): every contribution a worker sent the shard is
//! accepted, refused, or in flight, and every accepted one is applied, dropped or held.
//!
//! Not modelled here (refused with [`SimError::Unsupported`]): injected faults and crashes,
//! the two-level grouped network. The time to target is found at evaluation times.

use super::compute::ComputeSampler;
use super::network::{BufferPool, Link};
use super::report::closing;
use super::report::{CurvePoint, Fnv, Observation, ShardReport, SimReport, WorkerReport};
use super::{GradientSource, SimConfig, SimError};
use super::{Observer, run_loop};
use crate::workload::{BatchSampler, Scratch, Workload};
use std::cmp::Reverse;
use std::collections::BinaryHeap;
use syncopate::proto::Heap;
use syncopate::proto::sharded::{HeapShardedWorker, ShardLayout, ShardedOutput};
use syncopate::rng::Rng;
use syncopate::wire::{self, Limits};
use syncopate::{
    AnyServer, ComputeId, Duration, Instant, Recipient, Server, ServerOutput, ServerStats, ToServer, WorkerEvent,
    WorkerId, WorkerSetup, WorkerStats,
};

#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord)]
pub(super) enum Event {
    /// A message from `worker` to shard `shard` left the worker's card (its bytes in pool
    /// slot `slot`): it queues for the shard's incoming link.
    ShardInbound {
        slot: usize,
        worker: u32,
        shard: u32,
    },
    /// A message from shard `shard` to `worker` left the shard's card.
    WorkerInbound {
        slot: usize,
        worker: u32,
        shard: u32,
    },
    /// A message from `worker` reaches shard `shard`.
    ToShard {
        slot: usize,
        worker: u32,
        shard: u32,
    },
    /// A message from shard `shard` reaches `worker`.
    ToWorker {
        slot: usize,
        worker: u32,
        shard: u32,
    },
    ComputeDone {
        worker: u32,
        id: ComputeId,
    },
    WorkerTimer {
        worker: u32,
    },
    ShardTimer {
        shard: u32,
    },
    Evaluate,
}

/// A worker's machine: the sharded worker, its compute and data, its counters per shard.
struct Host {
    worker: HeapShardedWorker<f32>,
    sampler: ComputeSampler,
    batches: BatchSampler,
    batch: Vec<usize>,
    grad: Vec<f32>,
    scratch: Scratch,
    job: Option<(ComputeId, Instant)>,
    /// The minibatch loss of the job's gradient (finite), reported with it.
    loss: Option<f32>,
    timer: Option<Instant>,
    busy: Duration,
    report: WorkerReport,
    /// What this worker sent each shard.
    sent: Vec<WorkerStats>,
}

/// A shard: its server and what became of the contributions sent to it.
struct Shard {
    server: AnyServer<f32, Vec<f32>, Heap>,
    timer: Option<Instant>,
    in_flight: u64,
    delivered: u64,
    refused: u64,
    update_times: Vec<f64>,
}

/// A network card: one FIFO link per direction.
struct Card {
    out: Link,
    inn: Link,
}

struct Sim<'a, 'o> {
    config: &'a SimConfig,
    workload: &'a Workload,
    observer: Observer<'o>,
    layout: ShardLayout,
    limits: Limits,
    now: Instant,
    queue: BinaryHeap<Reverse<(Instant, u64, Event)>>,
    seq: u64,
    pool: BufferPool,
    hosts: Vec<Host>,
    shards: Vec<Shard>,
    /// Worker cards, then (dedicated shards) shard cards.
    cards: Vec<Card>,
    outgoing: Vec<(u32, usize, usize, bool)>,
    eval_model: Vec<f32>,
    eval_scratch: Scratch,
    curve: Vec<CurvePoint>,
    time_to_target: Option<(f64, u64)>,
    events: u64,
    delivered: u64,
    bytes: u64,
    codec_errors: u64,
    worker_rejects: u64,
    /// Contributions refused for holding NaN or ±∞ or overflowing their norm.
    not_finite: u64,
    hash: Fnv,
}

/// Runs a sharded simulation (see the [module docs](self)); with one shard, one server
/// whose network card is a shared bottleneck (the main engine gives its server none).
pub(crate) fn run(config: &SimConfig, workload: &Workload, observer: Observer<'_>) -> Result<SimReport, SimError> {
    let mut sim = Sim::new(config, workload, observer)?;
    let reason = sim.run();
    Ok(sim.report(reason))
}

impl<'a, 'o> Sim<'a, 'o> {
    fn new(config: &'a SimConfig, workload: &'a Workload, observer: Observer<'o>) -> Result<Self, SimError> {
        config.check_runnable()?;
        let f = &config.faults;
        if f.message_faults() || f.crash_rate > 0.0 || !f.server_crashes.is_empty() || !config.crashes.is_empty() {
            return Err(SimError::Unsupported("faults and crashes with sharded servers"));
        }
        if config.group_link.is_some() {
            return Err(SimError::Unsupported("a two-level grouped network with sharded servers"));
        }
        let protocol = &config.protocol;
        let n = config.workers();
        let model = &workload.model;
        let dim = model.dim();
        let layout = ShardLayout::new(dim, config.shards).map_err(SimError::Config)?;
        if config.colocate_shards && config.shards > n {
            return Err(SimError::Unsupported("more co-located shards than workers"));
        }
        let params = model.init_params(config.seed);
        let mut shards = Vec::new();
        for k in 0..layout.shards() {
            let range = layout.range(k).unwrap_or(0..0);
            let len = range.len();
            let slice = params.get(range).unwrap_or_default().to_vec();
            let scratch = vec![0.0; protocol.server_scratch_len(len)];
            let spare = vec![0.0; protocol.spare_accumulator_len(len)];
            let server = AnyServer::new(protocol, slice, scratch)
                .and_then(|s| s.with_spare_accumulator(spare))
                .and_then(|s| super::engine::momentum(s, config.momentum, len));
            shards.push(Shard {
                server: server.map_err(SimError::Config)?,
                timer: None,
                in_flight: 0,
                delivered: 0,
                refused: 0,
                update_times: Vec::new(),
            });
        }
        let mut hosts = Vec::new();
        for i in 0..n {
            let setup = WorkerSetup { id: WorkerId(i), epoch: 0, rejoin_after: config.rejoin_after };
            let worker = HeapShardedWorker::allocated(protocol, setup, layout).map_err(SimError::Config)?;
            let batch_seed = Rng::derive(config.seed, 0xBA7C_0000_0000 | u64::from(i)).next_u64();
            let grad = match config.gradient {
                GradientSource::Workload => vec![0.0; dim],
                GradientSource::Constant(v) => vec![v; dim],
            };
            hosts.push(Host {
                worker,
                sampler: ComputeSampler::new(config.compute_model(i), config.base_step, config.seed, i),
                batches: BatchSampler::new(workload.train.len(), batch_seed),
                batch: Vec::with_capacity(config.batch_size),
                grad,
                scratch: model.scratch(),
                job: None,
                loss: None,
                timer: None,
                busy: Duration::ZERO,
                report: WorkerReport { worker: i, ..WorkerReport::default() },
                sent: vec![WorkerStats::default(); layout.shards() as usize],
            });
        }
        let bw = config.network.bandwidth;
        let card = || Card { out: Link::new(Duration::ZERO, bw), inn: Link::new(Duration::ZERO, bw) };
        let dedicated = if config.colocate_shards { 0 } else { layout.shards() };
        let cards = (0..n + dedicated).map(|_| card()).collect();
        let limits = Limits::for_model(dim);
        Ok(Self {
            config,
            workload,
            observer,
            layout,
            limits,
            now: Instant::ZERO,
            queue: BinaryHeap::new(),
            seq: 0,
            pool: BufferPool::new(0),
            hosts,
            shards,
            cards,
            outgoing: Vec::new(),
            eval_model: vec![0.0; dim],
            eval_scratch: model.scratch(),
            curve: Vec::new(),
            time_to_target: None,
            events: 0,
            delivered: 0,
            bytes: 0,
            codec_errors: 0,
            worker_rejects: 0,
            not_finite: 0,
            hash: Fnv::new(),
        })
    }

    fn schedule(&mut self, at: Instant, event: Event) {
        self.seq += 1;
        self.queue.push(Reverse((at, self.seq, event)));
    }

    /// The card shard `shard` uses.
    fn shard_card(&self, shard: u32) -> usize {
        if self.config.colocate_shards { shard as usize } else { self.hosts.len() + shard as usize }
    }

    /// Puts `bytes` on card `from`'s outgoing link at `now`: when they have left it. A
    /// message that stays on its machine (`from == to`) leaves at once.
    fn send_out(&mut self, from: usize, to: usize, bytes: usize) -> Instant {
        if from == to {
            return self.now;
        }
        self.bytes += bytes as u64;
        match self.cards.get_mut(from) {
            Some(c) => c.out.send(self.now, bytes),
            None => self.now,
        }
    }

    /// Puts `bytes` that left card `from` on card `to`'s incoming link at `now` (in the order
    /// they reach it): when they arrive, one latency after they left the link.
    fn take_in(&mut self, from: usize, to: usize, bytes: usize) -> Instant {
        if from == to {
            return self.now;
        }
        let arrived = match self.cards.get_mut(to) {
            Some(c) => c.inn.send(self.now, bytes),
            None => self.now,
        };
        arrived + self.config.network.latency
    }

    fn run(&mut self) -> &'static str {
        for i in 0..self.hosts.len() {
            self.drain_worker(i);
        }
        if self.config.eval_interval > Duration::ZERO {
            self.evaluate();
            self.schedule(Instant::ZERO + self.config.eval_interval, Event::Evaluate);
        }
        let max_time = self.config.stop.max_time;
        run_loop::drive(self, max_time)
    }

    fn updates(&self) -> u64 {
        self.shards.iter().map(|s| s.server.version().0).min().unwrap_or(0)
    }

    fn stop_reason(&self) -> Option<&'static str> {
        let stop = &self.config.stop;
        if stop.max_updates.is_some_and(|u| self.updates() >= u) {
            return Some("max_updates");
        }
        let accepted = self.shards.first().map_or(0, |s| s.server.stats().accepted);
        if stop.max_gradients.is_some_and(|g| accepted >= g) {
            return Some("max_gradients");
        }
        let last = self.curve.last();
        if stop.stop_at_target && self.time_to_target.is_some() {
            return Some("target");
        }
        if stop.stop_at_loss.is_some_and(|x| last.is_some_and(|p| p.loss <= x)) {
            return Some("target_loss");
        }
        None
    }

    fn step(&mut self, event: Event) {
        match event {
            Event::ShardInbound { slot, worker, shard } => {
                let len = self.pool.bytes(slot).len();
                let at = self.take_in(worker as usize, self.shard_card(shard), len);
                self.schedule(at, Event::ToShard { slot, worker, shard });
            }
            Event::WorkerInbound { slot, worker, shard } => {
                let len = self.pool.bytes(slot).len();
                let at = self.take_in(self.shard_card(shard), worker as usize, len);
                self.schedule(at, Event::ToWorker { slot, worker, shard });
            }
            Event::ToShard { slot, worker, shard } => self.deliver_to_shard(slot, worker, shard),
            Event::ToWorker { slot, worker, shard } => self.deliver_to_worker(slot, worker, shard),
            Event::ComputeDone { worker, id } => self.compute_done(worker, id),
            Event::WorkerTimer { worker } => {
                let now = self.now;
                if let Some(h) = self.hosts.get_mut(worker as usize) {
                    if h.timer == Some(now) {
                        h.timer = None;
                        h.worker.handle_timeout(now);
                    }
                }
                self.drain_worker(worker as usize);
            }
            Event::ShardTimer { shard } => {
                let now = self.now;
                if let Some(s) = self.shards.get_mut(shard as usize) {
                    if s.timer == Some(now) {
                        s.timer = None;
                        s.server.handle_timeout(now);
                    }
                }
                self.drain_shard(shard);
            }
            Event::Evaluate => {
                self.evaluate();
                self.schedule(self.now + self.config.eval_interval, Event::Evaluate);
            }
        }
    }

    /// A delivered message is done with: its slot goes back to the pool, and it counts as
    /// delivered if it decoded (`outcome`: what handling it gave), else as a codec error.
    fn settle<R>(&mut self, slot: usize, outcome: Option<R>) -> Option<R> {
        self.pool.release(slot);
        match outcome {
            Some(_) => self.delivered += 1,
            None => self.codec_errors += 1,
        }
        outcome
    }

    fn deliver_to_shard(&mut self, slot: usize, worker: u32, shard: u32) {
        let now = self.now;
        let Some(s) = self.shards.get_mut(shard as usize) else { return };
        let outcome = wire::decode_to_server::<f32>(self.pool.bytes(slot), &self.limits).ok().map(|msg| {
            let contribution = matches!(msg, ToServer::Grad { .. } | ToServer::Delta { .. } | ToServer::Clock { .. });
            (contribution, s.server.handle(now, WorkerId(worker), msg))
        });
        let Some((contribution, result)) = self.settle(slot, outcome) else { return };
        if contribution {
            if let Some(s) = self.shards.get_mut(shard as usize) {
                s.in_flight = s.in_flight.saturating_sub(1);
                s.delivered += 1;
                s.refused += u64::from(result.is_err());
            }
            if matches!(result, Err(syncopate::Reject::NotFinite | syncopate::Reject::NormTooLarge)) {
                self.not_finite += 1;
            }
        }
        self.hash.u64(u64::from(result.is_ok()));
        self.drain_shard(shard);
    }

    fn deliver_to_worker(&mut self, slot: usize, worker: u32, shard: u32) {
        let now = self.now;
        let Some(h) = self.hosts.get_mut(worker as usize) else { return };
        let outcome = wire::decode_to_worker::<f32>(self.pool.bytes(slot), &self.limits).ok();
        let outcome = outcome.map(|msg| h.worker.handle(now, shard, msg));
        let Some(result) = self.settle(slot, outcome) else { return };
        if result.is_err() {
            self.worker_rejects += 1;
        }
        self.drain_worker(worker as usize);
    }

    fn compute_done(&mut self, worker: u32, id: ComputeId) {
        let now = self.now;
        let Some(h) = self.hosts.get_mut(worker as usize) else { return };
        let Some((_, start)) = h.job.filter(|j| j.0 == id) else { return };
        h.job = None;
        h.busy = h.busy + (now - start);
        match h.worker.handle_gradient_with_loss(now, id, &h.grad, h.loss) {
            Ok(()) => h.report.gradients_computed += 1,
            Err(e) => {
                h.report.jobs_abandoned += 1;
                self.worker_rejects += 1;
                if matches!(e, syncopate::Reject::NotFinite | syncopate::Reject::NormTooLarge) {
                    self.not_finite += 1;
                }
            }
        }
        self.drain_worker(worker as usize);
    }

    fn drain_worker(&mut self, i: usize) {
        let now = self.now;
        let Some(h) = self.hosts.get_mut(i) else { return };
        let Host { worker, sampler, batches, batch, grad, scratch, job, loss, report, busy, sent, .. } = h;
        let mut compute = None;
        while let Some(out) = worker.poll_output() {
            match out {
                ShardedOutput::Send { shard, msg } => {
                    let contribution =
                        matches!(msg, ToServer::Grad { .. } | ToServer::Delta { .. } | ToServer::Clock { .. });
                    if contribution {
                        report.gradients_sent += 1;
                    }
                    if let Some(s) = sent.get_mut(shard as usize) {
                        s.record(&msg);
                    }
                    let len = wire::encoded_len_to_server(&msg);
                    let slot = self.pool.take(len);
                    match wire::encode_to_server(&msg, self.pool.bytes_mut(slot)) {
                        Ok(len) => {
                            self.pool.set_len(slot, len);
                            self.outgoing.push((shard, slot, len, contribution));
                        }
                        Err(_) => {
                            self.pool.release(slot);
                            self.codec_errors += 1;
                        }
                    }
                }
                ShardedOutput::Compute { id, params, .. } => {
                    if let Some((_, start)) = job.take() {
                        *busy = *busy + (now - start);
                        report.jobs_abandoned += 1;
                    }
                    *loss = None;
                    if self.config.gradient == GradientSource::Workload {
                        batches.next_batch(self.config.batch_size, batch);
                        let l = self.workload.model.gradient(params, &self.workload.train, batch, grad, scratch);
                        *loss = Some(l).filter(|l| l.is_finite());
                    }
                    let dt = sampler.next_step();
                    *job = Some((id, now));
                    compute = Some((id, now + dt));
                }
                ShardedOutput::Event(WorkerEvent::Abandoned { id }) => {
                    if let Some((_, start)) = job.take_if(|j| j.0 == id) {
                        *busy = *busy + (now - start);
                        report.jobs_abandoned += 1;
                    }
                }
                ShardedOutput::Event(_) => {}
            }
        }
        let timeout = worker.poll_timeout();
        if let Some((id, at)) = compute {
            self.schedule(at, Event::ComputeDone { worker: i as u32, id });
        }
        // Slices leave in turn, starting with shard `id mod S`.
        let shards = self.layout.shards();
        let mut outgoing = core::mem::take(&mut self.outgoing);
        outgoing.sort_by_key(|&(shard, ..)| (shard + shards - (i as u32 % shards)) % shards);
        for (shard, slot, len, contribution) in outgoing.drain(..) {
            let at = self.send_out(i, self.shard_card(shard), len);
            if let Some(s) = self.shards.get_mut(shard as usize) {
                s.in_flight += u64::from(contribution);
            }
            self.schedule(at, Event::ShardInbound { slot, worker: i as u32, shard });
        }
        self.outgoing = outgoing;
        self.rearm_worker(i, timeout);
    }

    fn rearm_worker(&mut self, i: usize, timeout: Option<Instant>) {
        let now = self.now;
        let Some(h) = self.hosts.get_mut(i) else { return };
        let at = timeout.map(|t| t.max(now));
        if at != h.timer {
            h.timer = at;
            if let Some(at) = at {
                self.schedule(at, Event::WorkerTimer { worker: i as u32 });
            }
        }
    }

    fn drain_shard(&mut self, k: u32) {
        let now = self.now;
        let n = self.hosts.len() as u32;
        let first = (u64::from(k) * u64::from(n) / u64::from(self.layout.shards())) as u32;
        let Some(s) = self.shards.get_mut(k as usize) else { return };
        let mut sends = Vec::new();
        while let Some(out) = s.server.poll_output() {
            match out {
                ServerOutput::Send { to, msg } => {
                    let len = wire::encoded_len_to_worker(&msg);
                    let slot = self.pool.take(len);
                    match wire::encode_to_worker(&msg, self.pool.bytes_mut(slot)) {
                        Ok(len) => {
                            self.pool.set_len(slot, len);
                            sends.push((to, slot, len));
                        }
                        Err(_) => {
                            self.pool.release(slot);
                            self.codec_errors += 1;
                        }
                    }
                }
                ServerOutput::Event(e) => {
                    if let syncopate::ServerEvent::ModelUpdated { .. } = e {
                        s.update_times.push(now.as_secs_f64());
                    }
                    (self.observer)(&Observation::Server { at: now, event: e });
                }
                ServerOutput::Upstream(_) => self.codec_errors += 1,
            }
        }
        let timeout = s.server.poll_timeout();
        let from = self.shard_card(k);
        for (to, slot, len) in sends {
            let recipients: Vec<u32> = match to {
                Recipient::Worker(w) => vec![w.0],
                // Copies leave in turn, starting with worker `k·n/S`.
                Recipient::AllWorkers => (0..n).map(|j| (first + j) % n.max(1)).collect(),
            };
            if recipients.len() > 1 {
                self.pool.share(slot, recipients.len() as u32 - 1);
            } else if recipients.is_empty() {
                self.pool.release(slot);
            }
            for w in recipients {
                let at = self.send_out(from, w as usize, len);
                self.schedule(at, Event::WorkerInbound { slot, worker: w, shard: k });
            }
        }
        let Some(s) = self.shards.get_mut(k as usize) else { return };
        let at = timeout.map(|t| t.max(now));
        if at != s.timer {
            s.timer = at;
            if let Some(at) = at {
                self.schedule(at, Event::ShardTimer { shard: k });
            }
        }
    }

    /// Evaluates the model assembled from the shards' slices.
    fn evaluate(&mut self) {
        for (k, s) in self.shards.iter().enumerate() {
            if let Some(dst) = self.layout.range(k as u32).and_then(|r| self.eval_model.get_mut(r)) {
                dst.copy_from_slice(s.server.params());
            }
        }
        let e = self.workload.model.evaluate_with(&self.eval_model, &self.workload.test, &mut self.eval_scratch);
        let point =
            CurvePoint { time_s: self.now.as_secs_f64(), version: self.updates(), accuracy: e.accuracy, loss: e.loss };
        self.hash.u64(point.accuracy.to_bits());
        if self.time_to_target.is_none() && point.accuracy >= self.config.target_accuracy {
            self.time_to_target = Some((point.time_s, point.version));
        }
        self.curve.push(point);
        (self.observer)(&Observation::Evaluated { point });
    }

    fn report(mut self, stop_reason: &'static str) -> SimReport {
        if self.curve.last().is_none_or(|p| p.time_s < self.now.as_secs_f64()) {
            self.evaluate();
        }
        let mut stats = ServerStats::default();
        let mut shards = Vec::new();
        for (k, s) in self.shards.iter().enumerate() {
            let st = *s.server.stats();
            closing::add_stats(&mut stats, &st);
            let sent: u64 = self.hosts.iter().filter_map(|h| h.sent.get(k)).map(|w| w.contributions + w.resent).sum();
            shards.push(ShardReport {
                shard: k as u32,
                elements: self.layout.len(k as u32),
                updates: st.updates,
                contributions_sent: sent,
                delivered: s.delivered,
                refused: s.refused,
                in_flight: s.in_flight,
                accepted: st.accepted,
                applied: st.applied,
                dropped: st.dropped_total(),
                update_times_s: s.update_times.clone(),
            });
        }
        let now = self.now;
        let updates = self.shards.iter().map(|s| s.server.stats().updates).min().unwrap_or(0);
        let hosts = self
            .hosts
            .iter()
            .map(|h| (h.report.clone(), (h.busy + h.job.map_or(Duration::ZERO, |j| now - j.1)).as_secs_f64()));
        SimReport {
            updates,
            worker_rejects: self.worker_rejects,
            events: self.events,
            messages_delivered: self.delivered,
            bytes_moved: self.bytes,
            buffers_allocated: self.pool.allocations(),
            codec_errors: self.codec_errors,
            not_finite: self.not_finite,
            shards,
            ..closing::report(closing::Ending {
                config: self.config,
                stop_reason,
                now,
                curve: self.curve,
                time_to_target: self.time_to_target,
                stats,
                hosts,
                hash: self.hash,
                final_params: self.eval_model.clone(),
            })
        }
    }
}

impl run_loop::Driven for Sim<'_, '_> {
    type Event = Event;

    fn stop_before(&mut self) -> Option<&'static str> {
        self.stop_reason().or((self.events >= self.config.stop.max_events).then_some("max_events"))
    }

    fn next_event(&mut self) -> Option<(Instant, Event)> {
        self.queue.pop().map(|Reverse((at, _, event))| (at, event))
    }

    fn set_now(&mut self, at: Instant) {
        self.now = at;
    }

    fn handle(&mut self, event: Event) {
        self.events += 1;
        self.step(event);
    }

    fn stop_after(&mut self) -> Option<&'static str> {
        None
    }
}
