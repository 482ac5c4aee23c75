//! The discrete-event engine: a binary heap of events ordered by (virtual time, insertion
//! sequence), one server, `n` workers with their hosts (compute and links), and the driving
//! contract applied after every input.
//!
//! With [`SimConfig::group_link`] and a protocol that can run as a two-level tree of servers
//! ([`ProtocolConfig::tiers`](syncopate::ProtocolConfig::tiers): the grouped protocol) the single server is replaced by that
//! deployment: one sub-server node per group ([`AnyServer::subserver`]) plus the central
//! node (the `server` field). Which process talks to which over which link is a deployment
//! choice, so it belongs to the harness that models the network; what crosses the links is
//! the core's: a node's [`ServerOutput::Upstream`] messages go up its link to the central
//! node, the central node's messages to its worker `g` go down to node `g`'s
//! [`Server::handle_upstream`]. The engine has no protocol-specific code.
//!
//! Here: the events, the nodes and the driving contract. Messages between the nodes are in
//! `links`, the fault injector (message faults, partitions, crashes, server restarts) in
//! `inject` (its state in `faults`), the time-to-target detection in `crossing`.

mod crossing;
mod drain;
mod faults;
mod inject;
mod links;
mod record;

use super::GradientSource;
use super::SimError;
use super::compute::ComputeSampler;
use super::config::{Direction, SimConfig};
use super::network::{BufferPool, Link};
use super::report::closing::{self, add_stats};
use super::report::{
    CurvePoint, FastDebug, Fault, Fnv, Node, Observation, SimReport, StalenessStats, TraceRecorder, WorkerReport,
};
use super::{Observer, run_loop};
use crate::workload::{BatchSampler, Scratch, Workload};
use core::cmp::Ordering;
use core::fmt::Write as _;
use crossing::Crossing;
pub use faults::FAULT_STREAM;
use faults::Faults;
use std::collections::BinaryHeap;
use syncopate::proto::Heap;
use syncopate::rng::Rng;
use syncopate::wire::{self, Limits};
use syncopate::{
    AnyServer, AnyWorker, ComputeId, Duration, Instant, Recipient, Reject, Server, ServerEvent, ServerOutput,
    ServerStats, ToServer, ToWorker, Version, Worker, WorkerEvent, WorkerId, WorkerOutput, WorkerSetup,
};

/// What happens at a scheduled instant.
#[derive(Clone, Copy, Debug)]
pub(super) enum Event {
    /// An encoded message (in pool slot `slot`) reaches `to`. `incarnation` is the worker
    /// end's incarnation when it was sent: a crash in between makes it vanish.
    Deliver { slot: usize, worker: u32, to_server: bool, incarnation: u32 },
    /// A worker's computation `id` finishes.
    ComputeDone { worker: u32, incarnation: u32, id: ComputeId },
    /// A node's timer (re-checked against `poll_timeout` when it fires).
    ServerTimer,
    /// A worker's timer.
    WorkerTimer { worker: u32, incarnation: u32 },
    /// Evaluate the server's model.
    Eval,
    /// Crash number `i` of the config.
    Crash(usize),
    /// A crashed worker restarts.
    Restart(u32),
    /// A random crash of a worker (if it is up).
    RandomCrash(u32),
    /// Server crash number `i` of the fault config.
    ServerCrash(usize),
    /// The crashed server restarts from its checkpoint.
    ServerRestart,
    /// Two-level network: an encoded message between sub-server node `group` and the central
    /// node.
    GroupDeliver { slot: usize, group: u32, to_central: bool },
    /// Two-level network: sub-server node `group`'s timer.
    GroupTimer(u32),
}

#[derive(Debug)]
struct Scheduled {
    at: Instant,
    seq: u64,
    event: Event,
}

impl PartialEq for Scheduled {
    fn eq(&self, other: &Self) -> bool {
        (self.at, self.seq) == (other.at, other.seq)
    }
}
impl Eq for Scheduled {}
impl PartialOrd for Scheduled {
    fn partial_cmp(&self, other: &Self) -> Option<Ordering> {
        Some(self.cmp(other))
    }
}
impl Ord for Scheduled {
    /// Reversed, so the max-heap pops the earliest (then first-inserted) event.
    fn cmp(&self, other: &Self) -> Ordering {
        (other.at, other.seq).cmp(&(self.at, self.seq))
    }
}

/// A computation in progress.
#[derive(Clone, Copy, Debug)]
struct Job {
    id: ComputeId,
    start: Instant,
    /// The minibatch loss of the gradient being computed (none for a constant gradient),
    /// reported with it.
    loss: Option<f32>,
}

/// A worker and everything around it: its machine (compute, data), its links and counters.
struct Host {
    worker: Option<AnyWorker<f32, Vec<f32>>>,
    epoch: u32,
    incarnation: u32,
    uplink: Link,
    downlink: Link,
    sampler: ComputeSampler,
    batches: BatchSampler,
    batch: Vec<usize>,
    grad: Vec<f32>,
    scratch: Scratch,
    job: Option<Job>,
    timer: Option<Instant>,
    busy: Duration,
    report: WorkerReport,
}

/// A sub-server node of a two-level run (a server with an upstream: the central node).
struct SubNode {
    /// Boxed, as the central server is.
    server: Box<AnyServer<f32, Vec<f32>, Heap>>,
    /// Group → central.
    uplink: Link,
    /// Central → group.
    downlink: Link,
    timer: Option<Instant>,
}

/// Everything except the server and the hosts, so those can be borrowed separately.
struct Core<'a, 'o> {
    config: &'a SimConfig,
    workload: &'a Workload,
    observer: Observer<'o>,
    limits: Limits,
    now: Instant,
    queue: BinaryHeap<Scheduled>,
    seq: u64,
    /// Events in the queue other than evaluations: when zero, nothing can happen any more.
    pending_work: u64,
    pool: BufferPool,
    hash: Fnv,
    server_timer: Option<Instant>,
    curve: Vec<CurvePoint>,
    time_to_target: Option<(f64, u64)>,
    staleness: StalenessStats,
    trace: TraceRecorder,
    events: u64,
    delivered: u64,
    lost: u64,
    bytes: u64,
    codec_errors: u64,
    worker_rejects: u64,
    /// Inputs refused anywhere because a tensor held NaN or ±∞, or its norm overflowed (no
    /// adapter sets a refusing norm bound, so in the simulator that is an overflow).
    not_finite: u64,
    /// An evaluation found the model's test loss not finite, or an input was refused for
    /// holding NaN or ±∞: the run has diverged.
    diverged: bool,
    stalls: u64,
    target_reached: bool,
    /// An evaluation reached [`super::StopRule::stop_at_loss`].
    loss_reached: bool,
    eval_scratch: Scratch,
    crossing: Crossing,
    faults: Faults,
    /// The sub-server node of each worker in a two-level run (empty otherwise).
    group_of: Vec<u32>,
    fast_debug: FastDebug,
}

/// One simulation.
pub(crate) struct Engine<'a, 'o> {
    core: Core<'a, 'o>,
    /// The server (the central node of a two-level grouped run), boxed: an `AnyServer` is
    /// ~140 KB (fixed `MAX_WORKERS` tables), too much to move around a test thread's stack.
    server: Box<AnyServer<f32, Vec<f32>, Heap>>,
    hosts: Vec<Host>,
    /// The sub-server nodes of a two-level run (empty otherwise).
    groups: Vec<SubNode>,
    /// The server is down (crashed, not yet restarted); `checkpoint` is what it resumes from.
    server_down: bool,
    checkpoint: Option<(Vec<f32>, Version)>,
    /// Counters of servers that crashed (added to the live server's).
    dead_stats: ServerStats,
}

/// `server` with SGD momentum `beta` on every update (a fresh momentum buffer of `dim`
/// elements), or as it is when `beta` is 0.
pub(super) fn momentum<M: syncopate::proto::Storage>(
    server: AnyServer<f32, Vec<f32>, M>,
    beta: f64,
    dim: usize,
) -> Result<AnyServer<f32, Vec<f32>, M>, syncopate::ConfigError> {
    if beta > 0.0 { server.with_momentum(beta, vec![0.0; dim]) } else { Ok(server) }
}

impl<'a, 'o> Engine<'a, 'o> {
    pub(crate) fn new(config: &'a SimConfig, workload: &'a Workload, observer: Observer<'o>) -> Result<Self, SimError> {
        config.check_runnable()?;
        let protocol = &config.protocol;
        let model = &workload.model;
        let dim = model.dim();
        let params = model.init_params(config.seed);
        let n = config.workers();
        let mut groups = Vec::new();
        let mut group_of = Vec::new();
        let server = match (protocol.tiers(), &config.group_link) {
            (Some(tiers), Some(link)) => {
                if !config.faults.server_crashes.is_empty() {
                    return Err(SimError::Unsupported("server crashes with a two-level grouped network"));
                }
                let central = tiers.central;
                let scratch = vec![0.0; central.server_scratch_len(dim)];
                let server = AnyServer::new(&central, params, scratch)
                    .and_then(|s| momentum(s, config.momentum, dim))
                    .map_err(SimError::Config)?;
                let server = Box::new(server);
                for g in 0..tiers.subservers {
                    let scratch = vec![0.0; protocol.subserver_scratch_len(dim)];
                    let node =
                        AnyServer::subserver(protocol, g, 0, vec![0.0; dim], scratch).map_err(SimError::Config)?;
                    groups.push(SubNode {
                        server: Box::new(node),
                        uplink: Link::new(link.latency, link.bandwidth),
                        downlink: Link::new(link.latency, link.bandwidth),
                        timer: None,
                    });
                }
                group_of = (0..n).map(|i| protocol.subserver_of(WorkerId(i)).unwrap_or(0)).collect();
                server
            }
            _ => {
                let scratch = vec![0.0; protocol.server_scratch_len(dim)];
                let spare = vec![0.0; protocol.spare_accumulator_len(dim)];
                let server = AnyServer::new(protocol, params, scratch)
                    .and_then(|s| s.with_spare_accumulator(spare))
                    .and_then(|s| momentum(s, config.momentum, dim));
                Box::new(server.map_err(SimError::Config)?)
            }
        };
        let mut hosts = Vec::with_capacity(n as usize);
        for i in 0..n {
            let worker = new_worker(config, dim, i, 0)?;
            let batch_seed = Rng::derive(config.seed, 0xBA7C_0000_0000 | u64::from(i)).next_u64();
            let grad = match config.gradient {
                GradientSource::Workload => vec![0.0; dim],
                GradientSource::Constant(v) => vec![v; dim],
            };
            hosts.push(Host {
                worker: Some(worker),
                epoch: 0,
                incarnation: 0,
                uplink: Link::new(config.network.latency, config.network.bandwidth),
                downlink: Link::new(config.network.latency, config.network.bandwidth),
                sampler: ComputeSampler::new(config.compute_model(i), config.base_step, config.seed, i),
                batches: BatchSampler::new(workload.train.len(), batch_seed),
                batch: Vec::with_capacity(config.batch_size),
                grad,
                scratch: model.scratch(),
                job: None,
                timer: None,
                busy: Duration::ZERO,
                report: WorkerReport { worker: i, ..WorkerReport::default() },
            });
        }
        let core = Core {
            config,
            workload,
            observer,
            limits: Limits::for_model(dim),
            now: Instant::ZERO,
            queue: BinaryHeap::with_capacity(4 * n as usize + 16),
            seq: 0,
            pending_work: 0,
            pool: BufferPool::new(Limits::for_model(dim).max_message_len::<f32>()),
            hash: Fnv::new(),
            server_timer: None,
            curve: Vec::new(),
            time_to_target: None,
            staleness: StalenessStats::new(),
            trace: TraceRecorder::default(),
            events: 0,
            delivered: 0,
            lost: 0,
            bytes: 0,
            codec_errors: 0,
            worker_rejects: 0,
            not_finite: 0,
            diverged: false,
            stalls: 0,
            target_reached: false,
            loss_reached: false,
            eval_scratch: model.scratch(),
            crossing: Crossing::default(),
            faults: Faults::new(config, n),
            group_of,
            fast_debug: FastDebug::default(),
        };
        Ok(Self {
            core,
            server,
            hosts,
            groups,
            server_down: false,
            checkpoint: None,
            dead_stats: ServerStats::default(),
        })
    }

    /// The protocol's counters: the server's (plus those of crashed servers), or in a
    /// two-level run the sum over the sub-server nodes (worker gradients) with the central
    /// node's `updates` (central updates, as the one-process server counts them; the nodes
    /// count an update only when its reply reaches them).
    fn stats(&self) -> ServerStats {
        let mut total = self.dead_stats;
        if self.groups.is_empty() {
            add_stats(&mut total, self.server.stats());
        } else {
            for g in &self.groups {
                add_stats(&mut total, g.server.stats());
            }
            total.updates = self.server.stats().updates;
        }
        total
    }

    /// Runs to the end and reports.
    pub(crate) fn run(mut self) -> SimReport {
        let config = self.core.config;
        let start = Instant::ZERO;
        for (i, c) in config.crashes.iter().enumerate() {
            self.core.schedule(start + c.at, Event::Crash(i));
        }
        for (i, c) in config.faults.server_crashes.iter().enumerate() {
            self.core.schedule(start + c.at, Event::ServerCrash(i));
        }
        for w in 0..self.core.faults.crash_rngs.len() {
            self.schedule_random_crash(w as u32);
        }
        self.core.schedule(start, Event::Eval);
        self.drain_server(start);
        for g in 0..self.groups.len() {
            self.drain_group(g, start);
        }
        for i in 0..self.hosts.len() {
            self.drain_worker(i, start);
        }
        let reason = run_loop::drive(&mut self, config.stop.max_time);
        self.keep_model();
        if self.core.time_to_target.is_none() {
            let core = &mut self.core;
            core.time_to_target =
                core.crossing.first_reaching(core.workload, core.config.target_accuracy, &mut core.eval_scratch);
            core.crossing.clear();
        }
        let last = self.core.curve.last().copied();
        let now_s = self.core.now.as_secs_f64();
        if last.is_none_or(|p| p.time_s != now_s || p.version != self.server.version().0) {
            self.core.evaluate(&self.server);
        }
        self.report(reason)
    }

    /// Keeps the server's current model for the time-to-target search (see [`Crossing`]).
    fn keep_model(&mut self) {
        // Evaluation off (a zero interval, `SimConfig::eval_interval`): no search either, or a
        // throughput run would evaluate every model it publishes.
        if self.core.time_to_target.is_some() || self.core.config.eval_interval == Duration::ZERO {
            return;
        }
        let (version, now) = (self.server.version().0, self.core.now.as_secs_f64());
        let target = self.core.config.target_accuracy;
        let core = &mut self.core;
        if let Some(found) =
            core.crossing.record(version, now, self.server.params(), core.workload, target, &mut core.eval_scratch)
        {
            core.time_to_target = Some(found);
            core.target_reached = true;
        }
    }

    fn step(&mut self, event: Event) {
        let now = self.core.now;
        match event {
            Event::Deliver { slot, worker, to_server, incarnation } => {
                self.deliver(slot, worker, to_server, incarnation);
            }
            Event::ComputeDone { worker, incarnation, id } => self.compute_done(worker, incarnation, id),
            Event::ServerTimer => {
                if self.core.server_timer == Some(now) {
                    self.core.server_timer = None;
                }
                if self.server_down {
                    return;
                }
                if self.server.poll_timeout().is_some_and(|t| t <= now) {
                    self.server.handle_timeout(now);
                }
                self.drain_server(now + Duration::from_nanos(1));
            }
            Event::WorkerTimer { worker, incarnation } => {
                let Some(host) = self.hosts.get_mut(worker as usize) else { return };
                if host.incarnation != incarnation {
                    return;
                }
                if host.timer == Some(now) {
                    host.timer = None;
                }
                if let Some(w) = host.worker.as_mut() {
                    if w.poll_timeout().is_some_and(|t| t <= now) {
                        w.handle_timeout(now);
                    }
                }
                self.drain_worker(worker as usize, now + Duration::from_nanos(1));
            }
            Event::GroupTimer(g) => {
                let Some(node) = self.groups.get_mut(g as usize) else { return };
                if node.timer == Some(now) {
                    node.timer = None;
                }
                if node.server.poll_timeout().is_some_and(|t| t <= now) {
                    node.server.handle_timeout(now);
                }
                self.drain_group(g as usize, now + Duration::from_nanos(1));
            }
            Event::Eval => {
                self.core.evaluate(&self.server);
                let interval = self.core.config.eval_interval;
                if interval > Duration::ZERO {
                    self.core.schedule(now + interval, Event::Eval);
                }
            }
            Event::Crash(i) => {
                let Some(c) = self.core.config.crashes.get(i).copied() else { return };
                self.crash(c.worker, c.restart_after, c.notify_server);
            }
            Event::Restart(worker) => self.restart(worker),
            Event::RandomCrash(worker) => self.random_crash(worker),
            Event::ServerCrash(i) => self.server_crash(i),
            Event::ServerRestart => self.server_restart(),
            Event::GroupDeliver { slot, group, to_central } => self.group_deliver(slot, group, to_central),
        }
    }

    fn compute_done(&mut self, worker: u32, incarnation: u32, id: ComputeId) {
        let now = self.core.now;
        let Some(host) = self.hosts.get_mut(worker as usize) else { return };
        if host.incarnation != incarnation {
            return;
        }
        // A job that was replaced or abandoned has already been accounted for.
        let Some(job) = host.job.filter(|j| j.id == id) else { return };
        host.job = None;
        host.busy = host.busy + (now - job.start);
        let Some(w) = host.worker.as_mut() else { return };
        let result = w.handle_gradient_with_loss(now, id, &host.grad, job.loss);
        if result.is_ok() {
            host.report.gradients_computed += 1;
        } else {
            host.report.jobs_abandoned += 1;
            self.core.worker_rejects += 1;
            if matches!(result, Err(Reject::NotFinite | Reject::NormTooLarge)) {
                self.core.not_finite += 1;
                self.core.diverged = true;
            }
        }
        self.core.tag(5, Node::Worker(worker));
        self.core.hash.result(&result);
        self.core.observe(&Observation::GradientComputed { at: now, worker: WorkerId(worker), result });
        self.drain_worker(worker as usize, now);
    }

    fn report(self, stop_reason: &'static str) -> SimReport {
        let stats = self.stats();
        let Self { core, server, hosts, .. } = self;
        let now = core.now;
        let mut staleness = core.staleness;
        staleness.finish();
        SimReport {
            stalls: core.stalls,
            worker_rejects: core.worker_rejects,
            not_finite: core.not_finite,
            staleness,
            events: core.events,
            messages_delivered: core.delivered,
            messages_lost: core.lost,
            faults: core.faults.stats,
            bytes_moved: core.bytes,
            buffers_allocated: core.pool.allocations(),
            codec_errors: core.codec_errors,
            compute_trace: core.trace.finish(),
            ..closing::report(closing::Ending {
                config: core.config,
                stop_reason,
                now,
                curve: core.curve,
                time_to_target: core.time_to_target,
                stats,
                hosts: hosts.into_iter().map(|h| {
                    let running = h.job.map_or(Duration::ZERO, |j| now - j.start);
                    (h.report, (h.busy + running).as_secs_f64())
                }),
                hash: core.hash,
                final_params: server.params().to_vec(),
            })
        }
    }
}

impl run_loop::Driven for Engine<'_, '_> {
    type Event = Event;

    fn stop_before(&mut self) -> Option<&'static str> {
        (self.core.pending_work == 0).then_some("idle")
    }

    fn next_event(&mut self) -> Option<(Instant, Event)> {
        self.core.queue.pop().map(|next| (next.at, next.event))
    }

    fn passing(&mut self, at: Instant) {
        if at > self.core.now {
            // Time moves on: the model standing now was published (models that only
            // existed within one instant were never observable).
            self.keep_model();
        }
    }

    fn set_now(&mut self, at: Instant) {
        self.core.now = at;
    }

    fn handle(&mut self, event: Event) {
        if !matches!(event, Event::Eval) {
            self.core.pending_work -= 1;
        }
        self.step(event);
        self.core.events += 1;
        let at = self.core.now;
        (self.core.observer)(&Observation::Step { at, server: &self.server });
    }

    fn stop_after(&mut self) -> Option<&'static str> {
        let stop = &self.core.config.stop;
        if stop.stop_at_target && self.core.target_reached {
            return Some("target");
        }
        if self.core.loss_reached {
            return Some("target_loss");
        }
        // A model with a NaN or infinite loss cannot recover, and a gradient or delta
        // holding NaN or ±∞ (or overflowing its norm) comes only from a diverged model
        // (its refusal leaves a synchronous round waiting for ever): the run ends
        // instead of waiting out its budget.
        if self.core.diverged {
            return Some("diverged");
        }
        if stop.max_updates.is_some_and(|m| self.server.version().0 >= m) {
            return Some("max_updates");
        }
        if stop.max_gradients.is_some_and(|m| self.stats().accepted >= m) {
            return Some("max_gradients");
        }
        (self.core.events >= stop.max_events).then_some("max_events")
    }
}

fn new_worker(config: &SimConfig, dim: usize, i: u32, epoch: u32) -> Result<AnyWorker<f32, Vec<f32>>, SimError> {
    let setup = WorkerSetup { id: WorkerId(i), epoch, rejoin_after: config.rejoin_after };
    let scratch = vec![0.0; config.protocol.worker_scratch_len(dim)];
    AnyWorker::new(&config.protocol, setup, vec![0.0; dim], scratch).map_err(SimError::Config)
}

#[cfg(test)]
mod tests;
