//! The one sans-IO test network: a [`Cluster`] of one server and `n` workers joined by a
//! seeded network in virtual time (str0m's netem, raft-rs's `Network`, quinn's `Pair`).
//!
//! Every message is copied into an owned value ([`ToServerOwned`], [`ToWorkerOwned`]) when
//! it is polled and scheduled for delivery after a drawn latency; computations finish after
//! a drawn compute time with a gradient chosen by a pure function of the job
//! ([`GradientFn`]); timers are events at the instant `poll_timeout` names. Faults
//! ([`Faults`]): loss, duplication, delay spikes (reordering), one-way partitions, worker
//! crashes and restarts, server restarts (the caller supplies the new server). Links can be
//! FIFO (what one drain of a node sends travels as one batch) for protocols that assume an
//! ordered transport.
//!
//! Everything that happens is appended to [`Cluster::log`] ([`Entry`]), including the fate
//! of every copy of a message to the server (on the wire, lost and why, missed by a restarted
//! server), which the checks read: the reference model and the invariants of [`super::check`], or a test's own.
//! [`Cluster::step`] handles one event, [`Cluster::run`] steps until the network is quiet.

use super::log::{CopyLoss, Entry, NetCounts};
use super::net::{Faults, GradientFn, Job, NetConfig, WorkerFactory};
use super::{ToServerOwned, ToWorkerOwned};
use crate::error::Reject;
use crate::id::{ComputeId, Version, WorkerId};
use crate::proto::{Recipient, Server, ServerEvent, ServerOutput, Worker, WorkerEvent, WorkerOutput};
use crate::rng::Rng;
use crate::time::{Duration, Instant};
use std::collections::BTreeMap;
use std::vec;
use std::vec::Vec;

#[derive(Clone, Debug)]
enum Ev {
    Up { from: usize, epoch: u32, server_inc: u32, msg: ToServerOwned },
    Down { to: usize, inc: u32, msg: ToWorkerOwned, applied: Vec<u64> },
    Computed { w: usize, inc: u32, id: ComputeId, version: u64, params: Vec<f64> },
    WorkerTimer { w: usize, inc: u32, at: Instant },
    ServerTimer { server_inc: u32, at: Instant },
    Restart { w: usize },
}

impl Ev {
    fn is_timer(&self) -> bool {
        matches!(self, Self::WorkerTimer { .. } | Self::ServerTimer { .. })
    }
}

/// One worker's place in the cluster.
pub struct Node<W> {
    /// The state machine; `None` while crashed.
    pub worker: Option<W>,
    /// Incarnation: messages and jobs of an older one are discarded.
    inc: u32,
    /// Session epoch of the running worker.
    pub epoch: u32,
    timer: Option<Instant>,
    /// Messages up (to the server) are lost until this instant.
    pub cut_up_until: Instant,
    /// Messages down are lost until this instant.
    pub cut_down_until: Instant,
    /// Last delivery instant on the links up and down (FIFO).
    last_up: Instant,
    last_down: Instant,
}

/// One server and `n` workers on a seeded network in virtual time (see the module docs).
pub struct Cluster<S, W> {
    /// The server.
    pub server: S,
    /// The workers.
    pub nodes: Vec<Node<W>>,
    /// Timing.
    pub config: NetConfig,
    /// Faults; switch off by setting [`Faults::default`].
    pub faults: Faults,
    /// Relative speed of each worker (compute times are divided by it; at most 0: its
    /// computations never end, while messages still reach it).
    pub speed: Vec<f64>,
    /// Per worker, a fixed compute time instead of a drawn one (a missing entry or `None`:
    /// drawn from [`NetConfig::compute`]). Still divided by the worker's speed.
    pub compute_time: Vec<Option<Duration>>,
    /// A worker finishes at most this many computations (then its jobs never end).
    pub max_steps: u64,
    /// A dead worker never finishes a computation and messages to it are lost.
    pub dead: Vec<bool>,
    /// Per worker, computations finished (gradients the worker accepted).
    pub done: Vec<u64>,
    /// Everything that happened.
    pub log: Vec<Entry>,
    /// What the network injected.
    pub counts: NetCounts,
    /// The virtual time.
    pub now: Instant,
    rng: Rng,
    order: u64,
    random_ties: bool,
    snapshots: bool,
    /// Keyed by instant, tie-breaker (0 unless [`Self::with_random_ties`]) and order.
    events: BTreeMap<(Instant, u64, u64), Ev>,
    in_flight: usize,
    server_inc: u32,
    server_timer: Option<Instant>,
    gradient: GradientFn,
    factory: Option<WorkerFactory<W>>,
    applied: Vec<u64>,
    snap: Vec<Option<Vec<u64>>>,
    probe: fn(&S) -> u64,
    iteration: fn(&W) -> u64,
    last_tick: u64,
    restart_requested: bool,
}

impl<S: Server<f64>, W: Worker<f64>> Cluster<S, W> {
    /// A cluster of `server` and `workers` (worker `i` has id `i`), the network seeded with
    /// `seed`, computing gradients with `gradient`. The workers' first outputs (their `Join`s)
    /// are on the network.
    pub fn new(server: S, workers: Vec<W>, seed: u64, config: NetConfig, gradient: GradientFn) -> Self {
        let mut cluster = Self::new_quiet(server, workers, seed, config, gradient);
        cluster.start();
        cluster
    }

    fn start(&mut self) {
        for w in 0..self.nodes.len() {
            self.drain_worker(w);
        }
        self.drain_server();
    }

    fn new_quiet(server: S, workers: Vec<W>, seed: u64, config: NetConfig, gradient: GradientFn) -> Self {
        let n = workers.len();
        Self {
            nodes: workers
                .into_iter()
                .map(|w| Node {
                    worker: Some(w),
                    inc: 0,
                    epoch: 0,
                    timer: None,
                    cut_up_until: Instant::ZERO,
                    cut_down_until: Instant::ZERO,
                    last_up: Instant::ZERO,
                    last_down: Instant::ZERO,
                })
                .collect(),
            last_tick: server.version().0,
            server,
            config,
            faults: Faults::default(),
            speed: vec![1.0; n],
            compute_time: Vec::new(),
            max_steps: u64::MAX,
            dead: vec![false; n],
            done: vec![0; n],
            log: Vec::new(),
            counts: NetCounts::default(),
            now: Instant::ZERO,
            rng: Rng::new(seed),
            order: 0,
            random_ties: false,
            snapshots: true,
            events: BTreeMap::new(),
            in_flight: 0,
            server_inc: 0,
            server_timer: None,
            gradient,
            factory: None,
            applied: vec![0; n],
            snap: vec![None; n],
            probe: |s| s.version().0,
            iteration: |_| 0,
            restart_requested: false,
        }
    }

    /// A cluster of `server` and `n` workers built by `factory(id, epoch)` (each starts in
    /// epoch 1; a restart takes the next epoch), otherwise as [`Self::new`].
    pub fn from_factory(
        server: S,
        n: usize,
        mut factory: WorkerFactory<W>,
        seed: u64,
        config: NetConfig,
        gradient: GradientFn,
    ) -> Self {
        let workers = (0..n as u32).map(|id| factory(id, 1)).collect();
        let mut cluster = Self::new_quiet(server, workers, seed, config, gradient);
        cluster.factory = Some(factory);
        for node in &mut cluster.nodes {
            node.epoch = 1;
        }
        cluster.start();
        cluster
    }

    /// Records `probe(server)` as the server's tick (default: its version) and
    /// `iteration(worker)` with every computation.
    pub fn with_probes(mut self, probe: fn(&S) -> u64, iteration: fn(&W) -> u64) -> Self {
        self.probe = probe;
        self.iteration = iteration;
        self.last_tick = probe(&self.server);
        self
    }

    /// Breaks ties between events at the same instant at random (drawn from the network's
    /// seed) instead of in the order they were scheduled: the pending ones (the workers'
    /// first messages) and every later one.
    pub fn with_random_ties(mut self) -> Self {
        self.random_ties = true;
        for ((at, _, order), ev) in core::mem::take(&mut self.events) {
            let tie = self.rng.next_u64();
            self.events.insert((at, tie, order), ev);
        }
        self
    }

    /// Leaves out the per-worker snapshots every model and every computation carry into
    /// [`Entry::Compute`] (`snap` and `done`): `O(n)` per message, too much at thousands of
    /// workers for a test that does not read them.
    pub fn without_snapshots(mut self) -> Self {
        self.snapshots = false;
        self
    }

    /// Builds restarted workers (after a crash fault or [`Self::restart_worker`]).
    pub fn with_factory(mut self, factory: WorkerFactory<W>) -> Self {
        self.factory = Some(factory);
        self
    }

    /// The random stream the network draws from (for a caller's own fault choices).
    pub fn rng(&mut self) -> &mut Rng {
        &mut self.rng
    }

    /// The server's version.
    pub fn version(&self) -> Version {
        self.server.version()
    }

    /// Worker `w`'s state machine (`None` while crashed).
    pub fn worker(&self, w: usize) -> Option<&W> {
        self.nodes.get(w).and_then(|n| n.worker.as_ref())
    }

    /// When the next pending event happens, if any.
    pub fn next_at(&self) -> Option<Instant> {
        self.events.keys().next().map(|k| k.0)
    }

    /// Whether any event is pending.
    pub fn is_idle(&self) -> bool {
        self.events.is_empty()
    }

    fn draw(&mut self, range: (Duration, Duration)) -> Duration {
        let (lo, hi) = range;
        let span = hi.as_nanos().saturating_sub(lo.as_nanos());
        lo + Duration::from_nanos(self.rng.below(span.saturating_add(1)))
    }

    fn chance(&mut self, p: f64) -> bool {
        p > 0.0 && self.rng.next_f64() < p
    }

    fn schedule(&mut self, at: Instant, ev: Ev) {
        self.order += 1;
        if !ev.is_timer() {
            self.in_flight += 1;
        }
        let tie = if self.random_ties { self.rng.next_u64() } else { 0 };
        self.events.insert((at, tie, self.order), ev);
    }

    fn latency(&mut self) -> Duration {
        let mut d = self.draw(self.config.latency);
        if self.chance(self.faults.spike) {
            d = d + self.draw(self.config.spike);
            self.counts.delayed += 1;
        }
        d
    }

    /// Copies (1 or 2) of a message after the faults, or why it was lost; `cut` is a
    /// partition's end.
    fn copies(&mut self, cut: Instant) -> Result<u32, CopyLoss> {
        self.counts.sent += 1;
        let dropped = self.chance(self.faults.loss);
        if dropped || cut > self.now {
            self.counts.lost += 1;
            return Err(if dropped { CopyLoss::Dropped } else { CopyLoss::Partition });
        }
        if self.chance(self.faults.duplicate) {
            self.counts.duplicated += 1;
            return Ok(2);
        }
        Ok(1)
    }

    fn send_up(&mut self, from: usize, batch: Vec<ToServerOwned>) {
        let Some(node) = self.nodes.get(from) else { return };
        let epoch = node.epoch;
        let batch_latency = self.draw(self.config.latency);
        for msg in batch {
            self.log.push(Entry::Up { worker: from, epoch, msg: msg.clone() });
            let cut = self.nodes[from].cut_up_until;
            let copies = match self.copies(cut) {
                Ok(n) => n,
                Err(cause) => {
                    self.log.push(Entry::UpLost { worker: from, epoch, msg, cause });
                    continue;
                }
            };
            for _ in 0..copies {
                self.log.push(Entry::UpCopy { worker: from, epoch, msg: msg.clone() });
                let at = if self.config.fifo {
                    let at = (self.now + batch_latency).max(self.nodes[from].last_up);
                    self.nodes[from].last_up = at;
                    at
                } else {
                    self.now + self.latency()
                };
                self.schedule(at, Ev::Up { from, epoch, server_inc: self.server_inc, msg: msg.clone() });
            }
        }
    }

    fn send_down(&mut self, to: usize, msg: &ToWorkerOwned, batch_latency: Duration) {
        let Some(node) = self.nodes.get(to) else { return };
        let (cut, inc) = (node.cut_down_until, node.inc);
        for _ in 0..self.copies(cut).unwrap_or(0) {
            let at = if self.config.fifo {
                let at = (self.now + batch_latency).max(self.nodes[to].last_down);
                self.nodes[to].last_down = at;
                at
            } else {
                self.now + self.latency()
            };
            let applied = if self.snapshots { self.applied.clone() } else { Vec::new() };
            self.schedule(at, Ev::Down { to, inc, msg: msg.clone(), applied });
        }
    }

    /// Drains worker `w`: its messages go on the network, its computations are scheduled,
    /// abandoned ones cancelled, its timer armed.
    pub fn drain_worker(&mut self, w: usize) {
        let Some(node) = self.nodes.get_mut(w) else { return };
        let inc = node.inc;
        let Some(worker) = node.worker.as_mut() else { return };
        let iteration = (self.iteration)(worker);
        let (mut batch, mut computes, mut abandoned) = (Vec::new(), Vec::new(), Vec::new());
        while let Some(out) = worker.poll_output() {
            match out {
                WorkerOutput::Send(msg) => batch.push(ToServerOwned::from(&msg)),
                WorkerOutput::Compute { id, version, params } => computes.push((id, version.0, params.to_vec())),
                WorkerOutput::Event(WorkerEvent::Abandoned { id }) => abandoned.push(id),
                WorkerOutput::Event(_) => {}
            }
        }
        let timeout = worker.poll_timeout();
        for id in abandoned {
            let before = self.events.len();
            self.events.retain(
                |_, e| !matches!(e, Ev::Computed { w: j, inc: i, id: c, .. } if *j == w && *i == inc && *c == id),
            );
            self.in_flight -= before - self.events.len();
        }
        for (id, version, params) in computes {
            self.log.push(Entry::Compute {
                worker: w,
                k: self.done[w],
                version,
                iteration,
                params: params.clone(),
                snap: self.snap[w].clone(),
                done: if self.snapshots { self.done.clone() } else { Vec::new() },
            });
            let speed = self.speed.get(w).copied().unwrap_or(1.0);
            if speed <= 0.0 {
                continue;
            }
            let mut t = if let Some(fixed) = self.compute_time.get(w).copied().flatten() {
                fixed
            } else if self.config.exponential {
                let mean = self.config.compute.1.as_secs_f64();
                self.config.compute.0 + Duration::from_secs_f64(mean * -libm::log(self.rng.next_f64_open()))
            } else {
                self.draw(self.config.compute)
            };
            let (p, lo, hi) = self.config.straggle;
            if self.chance(p) {
                t = t + self.draw((lo, hi));
            }
            let t = Duration::from_secs_f64(t.as_secs_f64() / speed);
            self.schedule(self.now + t, Ev::Computed { w, inc, id, version, params });
        }
        if !batch.is_empty() {
            self.send_up(w, batch);
        }
        self.arm_worker_timer(w, timeout);
    }

    fn arm_worker_timer(&mut self, w: usize, timeout: Option<Instant>) {
        let now = self.now;
        let Some(node) = self.nodes.get_mut(w) else { return };
        match timeout.map(|t| t.max(now)) {
            Some(at) if node.timer != Some(at) => {
                node.timer = Some(at);
                let inc = node.inc;
                self.schedule(at, Ev::WorkerTimer { w, inc, at });
            }
            Some(_) => {}
            None => node.timer = None,
        }
    }

    /// Drains the server: events logged, messages on the network, its timer armed.
    pub fn drain_server(&mut self) {
        let n = self.nodes.len();
        let mut sends = Vec::new();
        while let Some(out) = self.server.poll_output() {
            match out {
                ServerOutput::Event(e) => {
                    if let ServerEvent::Applied { worker, .. } = e {
                        if let Some(c) = self.applied.get_mut(worker.index()) {
                            *c += 1;
                        }
                    }
                    self.log.push(Entry::Event(e));
                }
                ServerOutput::Send { to, msg } => sends.push((to, ToWorkerOwned::from(&msg))),
                ServerOutput::Upstream(msg) => self.log.push(Entry::ToUpstream(ToServerOwned::from(&msg))),
            }
        }
        let batch_latency = self.draw(self.config.latency);
        for (to, msg) in sends {
            match to {
                Recipient::Worker(w) => self.send_down(w.index(), &msg, batch_latency),
                Recipient::AllWorkers => {
                    for w in 0..n {
                        self.send_down(w, &msg, batch_latency);
                    }
                }
            }
            self.log.push(Entry::Sent { to, msg });
        }
        let tick = (self.probe)(&self.server);
        if tick != self.last_tick {
            self.last_tick = tick;
            self.log.push(Entry::Tick { tick, params: self.server.params().to_vec() });
        }
        let at = self.server.poll_timeout().map(|t| t.max(self.now));
        if at != self.server_timer {
            self.server_timer = at;
            if let Some(at) = at {
                self.schedule(at, Ev::ServerTimer { server_inc: self.server_inc, at });
            }
        }
    }

    /// A copy sent to server incarnation `server_inc` arrives: the current server handles
    /// it, or it is logged as missed ([`Entry::UpMissed`]).
    fn arrive_up(&mut self, from: usize, epoch: u32, server_inc: u32, msg: ToServerOwned) {
        if server_inc == self.server_inc {
            let _ = self.deliver_up(from, epoch, msg);
        } else {
            self.log.push(Entry::UpMissed { worker: from, epoch, msg });
        }
    }

    fn deliver_up(&mut self, from: usize, epoch: u32, msg: ToServerOwned) -> Result<(), Reject> {
        let before = self.server.version().0;
        let mut buf = Vec::new();
        let result = self.server.handle(self.now, WorkerId(from as u32), msg.as_msg(&mut buf));
        self.log.push(Entry::ServerIn { worker: from, epoch, msg, before, result });
        self.drain_server();
        result
    }

    /// Hands the server another copy of `msg` from worker `w` now (a retransmission or a
    /// replay), logged as [`Entry::ServerIn`], its outputs on the network; what `handle`
    /// answered.
    pub fn redeliver(&mut self, w: usize, msg: ToServerOwned) -> Result<(), Reject> {
        let epoch = self.nodes.get(w).map_or(0, |n| n.epoch);
        self.deliver_up(w, epoch, msg)
    }

    fn deliver_down(&mut self, to: usize, msg: ToWorkerOwned, applied: Vec<u64>) {
        if self.dead.get(to).copied().unwrap_or(true) {
            return;
        }
        let Some(worker) = self.nodes.get_mut(to).and_then(|n| n.worker.as_mut()) else { return };
        let mut buf = Vec::new();
        match worker.handle(self.now, msg.as_msg(&mut buf)) {
            Ok(()) => {
                if self.snapshots && matches!(msg, ToWorkerOwned::Model { .. }) {
                    self.snap[to] = Some(applied);
                }
            }
            Err(reason) => self.log.push(Entry::WorkerRefused { worker: to, msg, reason }),
        }
        self.drain_worker(to);
    }

    fn finish_job(&mut self, w: usize, id: ComputeId, version: u64, params: &[f64]) {
        let job = Job { worker: w, k: self.done[w], version, params };
        let g = (self.gradient)(&job);
        let Some(worker) = self.nodes.get_mut(w).and_then(|n| n.worker.as_mut()) else { return };
        if worker.handle_gradient(self.now, id, &g).is_ok() {
            self.done[w] += 1;
        }
        self.drain_worker(w);
    }

    /// Handles the next event; `false` when nothing is left to do (no event, or only timers
    /// at or beyond the horizon).
    pub fn step(&mut self) -> bool {
        let Some((&key, ev)) = self.events.iter().next() else { return false };
        let at = key.0;
        if ev.is_timer() && self.in_flight == 0 && at >= self.config.horizon {
            return false;
        }
        let Some(ev) = self.events.remove(&key) else { return false };
        if !ev.is_timer() {
            self.in_flight -= 1;
        }
        self.now = self.now.max(at);
        self.counts.steps += 1;
        match ev {
            Ev::Up { from, epoch, server_inc, msg } => self.arrive_up(from, epoch, server_inc, msg),
            Ev::Down { to, inc, msg, applied } => {
                if self.nodes.get(to).is_some_and(|n| n.inc == inc) {
                    self.deliver_down(to, msg, applied);
                }
            }
            Ev::Computed { w, inc, id, version, params } => {
                let live = self.nodes.get(w).is_some_and(|n| n.inc == inc) && !self.dead[w];
                if live && self.done[w] < self.max_steps {
                    self.finish_job(w, id, version, &params);
                }
            }
            Ev::WorkerTimer { w, inc, at } => {
                let Some(node) = self.nodes.get_mut(w) else { return true };
                if node.inc == inc && node.timer == Some(at) && !self.dead[w] {
                    node.timer = None;
                    if let Some(worker) = node.worker.as_mut() {
                        worker.handle_timeout(self.now);
                        self.drain_worker(w);
                    }
                }
            }
            Ev::ServerTimer { server_inc, at } => {
                if server_inc == self.server_inc && self.server_timer == Some(at) {
                    self.server_timer = None;
                    self.server.handle_timeout(self.now);
                    self.drain_server();
                }
            }
            Ev::Restart { w } => {
                if self.nodes.get(w).is_some_and(|n| n.worker.is_none()) {
                    self.restart_worker(w);
                }
            }
        }
        self.inject();
        true
    }

    /// Steps until nothing is left to do, or `limit` events.
    pub fn run(&mut self, limit: usize) {
        for _ in 0..limit {
            if !self.step() {
                return;
            }
        }
    }

    /// Steps until `done(self)` holds; `false` if the network went quiet or `limit` events
    /// passed first.
    pub fn run_until(&mut self, limit: usize, done: impl Fn(&Self) -> bool) -> bool {
        for _ in 0..limit {
            if done(self) {
                return true;
            }
            if !self.step() {
                return done(self);
            }
        }
        done(self)
    }
}

mod faults;
