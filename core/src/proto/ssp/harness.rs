//! Test-only: a tiny deterministic network for one server and `n` workers, with seeded
//! random delivery order, per-worker speeds, virtual time and integer-valued gradients,
//! recording a log the tests check invariants on. Shared by the SSP and BAP tests.
//!
//! Links are FIFO per worker and direction; the randomness is which link moves next and
//! which worker finishes its computation next. Everything one input makes a worker send
//! travels as one batch (one network send).

use crate::id::{ComputeId, Version, WorkerId};
use crate::proto::{
    Server, ServerEvent, ServerOutput, ToServerOwned, ToWorkerOwned, Worker, WorkerEvent, WorkerOutput,
};
use crate::time::{Duration, Instant};
use std::collections::VecDeque;
use std::vec;
use std::vec::Vec;

/// The integer gradient of worker `w`'s `k`-th computation at `params`: depends on the
/// parameters, so computing on the wrong model shows.
pub(crate) fn grad(params: &[f64], w: usize, k: u64) -> Vec<f64> {
    params
        .iter()
        .enumerate()
        .map(|(i, p)| ((libm::floor(p * 4.0) as i64 + w as i64 * 3 + i as i64 + k as i64).rem_euclid(5) - 2) as f64)
        .collect()
}

#[derive(Clone, Debug)]
pub(crate) enum Entry {
    /// Worker `worker` was asked for its `k`-th gradient.
    Compute {
        worker: usize,
        k: u64,
        version: u64,
        /// `Net::iteration` of the worker at that moment.
        iteration: u64,
        params: Vec<f64>,
        /// Per worker, the updates applied in the last model this worker received.
        snap: Option<Vec<u64>>,
        /// Per worker, computations finished so far.
        done: Vec<u64>,
    },
    /// A worker sent this.
    Up {
        worker: usize,
        msg: ToServerOwned,
    },
    /// The server handled `msg` from `worker` at version `before`.
    ServerIn {
        worker: usize,
        msg: ToServerOwned,
        before: u64,
        ok: bool,
    },
    Event(ServerEvent),
    /// The server's probe moved to `tick`; the model at that moment.
    Tick {
        tick: u64,
        params: Vec<f64>,
    },
    /// A worker refused a message.
    WorkerRefused {
        worker: usize,
        msg: ToWorkerOwned,
    },
}

struct Job {
    id: ComputeId,
    params: Vec<f64>,
}

pub(crate) struct Net<S, W> {
    pub(crate) server: S,
    pub(crate) workers: Vec<W>,
    up: Vec<VecDeque<Vec<ToServerOwned>>>,
    down: Vec<VecDeque<(ToWorkerOwned, Vec<u64>)>>,
    jobs: Vec<Option<Job>>,
    pub(crate) done: Vec<u64>,
    applied: Vec<u64>,
    snap: Vec<Option<Vec<u64>>>,
    /// Relative speed of each worker (weight when picking who finishes next).
    pub(crate) speed: Vec<u32>,
    /// A dead worker never finishes a computation; messages to it are lost.
    pub(crate) dead: Vec<bool>,
    pub(crate) max_steps: u64,
    pub(crate) now: Instant,
    pub(crate) log: Vec<Entry>,
    probe: fn(&S) -> u64,
    iteration: fn(&W) -> u64,
    last_tick: u64,
    rng: u64,
}

impl<S: Server<f64>, W: Worker<f64>> Net<S, W> {
    pub(crate) fn new(server: S, workers: Vec<W>, seed: u64, probe: fn(&S) -> u64, iteration: fn(&W) -> u64) -> Self {
        let n = workers.len();
        let last_tick = probe(&server);
        let mut net = Self {
            server,
            workers,
            up: (0..n).map(|_| VecDeque::new()).collect(),
            down: (0..n).map(|_| VecDeque::new()).collect(),
            jobs: (0..n).map(|_| None).collect(),
            done: vec![0; n],
            applied: vec![0; n],
            snap: vec![None; n],
            speed: vec![1; n],
            dead: vec![false; n],
            max_steps: 4,
            now: Instant::ZERO,
            log: Vec::new(),
            probe,
            iteration,
            last_tick,
            rng: seed ^ 0x9e37_79b9_7f4a_7c15,
        };
        for w in 0..n {
            net.drain_worker(w);
        }
        net
    }

    fn rand(&mut self) -> u64 {
        self.rng = self.rng.wrapping_mul(6364136223846793005).wrapping_add(1442695040888963407);
        self.rng >> 33
    }

    fn drain_worker(&mut self, w: usize) {
        let mut batch = Vec::new();
        let iteration = (self.iteration)(&self.workers[w]);
        let mut computes = Vec::new();
        while let Some(out) = self.workers[w].poll_output() {
            match out {
                WorkerOutput::Send(msg) => batch.push(ToServerOwned::from(&msg)),
                WorkerOutput::Compute { id, version, params } => computes.push((id, version, params.to_vec())),
                WorkerOutput::Event(WorkerEvent::Abandoned { id }) => {
                    if self.jobs[w].as_ref().is_some_and(|j| j.id == id) {
                        self.jobs[w] = None;
                    }
                }
                WorkerOutput::Event(_) => {}
            }
        }
        for (id, version, params) in computes {
            self.log.push(Entry::Compute {
                worker: w,
                k: self.done[w],
                version: version.0,
                iteration,
                params: params.clone(),
                snap: self.snap[w].clone(),
                done: self.done.clone(),
            });
            self.jobs[w] = Some(Job { id, params });
        }
        for msg in &batch {
            self.log.push(Entry::Up { worker: w, msg: msg.clone() });
        }
        if !batch.is_empty() {
            self.up[w].push_back(batch);
        }
    }

    fn drain_server(&mut self) {
        let n = self.workers.len();
        while let Some(out) = self.server.poll_output() {
            match out {
                ServerOutput::Event(e) => {
                    if let ServerEvent::Applied { worker, .. } = e {
                        self.applied[worker.index()] += 1;
                    }
                    self.log.push(Entry::Event(e));
                }
                ServerOutput::Send { to, msg } => {
                    let owned = ToWorkerOwned::from(&msg);
                    match to {
                        crate::proto::Recipient::Worker(w) => {
                            if w.index() < n {
                                self.down[w.index()].push_back((owned, self.applied.clone()));
                            }
                        }
                        crate::proto::Recipient::AllWorkers => {
                            for q in &mut self.down {
                                q.push_back((owned.clone(), self.applied.clone()));
                            }
                        }
                    }
                }
            }
        }
        let tick = (self.probe)(&self.server);
        if tick != self.last_tick {
            self.last_tick = tick;
            self.log.push(Entry::Tick { tick, params: self.server.params().to_vec() });
        }
    }

    /// Delivers one batch from worker `w` to the server.
    fn deliver_up(&mut self, w: usize) {
        let Some(batch) = self.up[w].pop_front() else { return };
        for msg in batch {
            let before = self.server.version().0;
            let mut buf = Vec::new();
            let ok = self.server.handle(self.now, WorkerId(w as u32), msg.as_msg(&mut buf)).is_ok();
            self.log.push(Entry::ServerIn { worker: w, msg, before, ok });
            self.drain_server();
        }
    }

    fn deliver_down(&mut self, w: usize) {
        let Some((msg, counts)) = self.down[w].pop_front() else { return };
        if self.dead[w] {
            return;
        }
        let mut buf = Vec::new();
        let ok = self.workers[w].handle(self.now, msg.as_msg(&mut buf)).is_ok();
        if ok {
            if matches!(msg, ToWorkerOwned::Model { .. }) {
                self.snap[w] = Some(counts);
            }
        } else {
            self.log.push(Entry::WorkerRefused { worker: w, msg });
        }
        self.drain_worker(w);
    }

    fn finish_job(&mut self, w: usize) {
        let Some(job) = self.jobs[w].take() else { return };
        let g = grad(&job.params, w, self.done[w]);
        if self.workers[w].handle_gradient(self.now, job.id, &g).is_ok() {
            self.done[w] += 1;
        }
        self.drain_worker(w);
    }

    fn fire_timeouts(&mut self) {
        if self.server.poll_timeout().is_some_and(|t| t <= self.now) {
            self.server.handle_timeout(self.now);
            self.drain_server();
        }
        for w in 0..self.workers.len() {
            if !self.dead[w] && self.workers[w].poll_timeout().is_some_and(|t| t <= self.now) {
                self.workers[w].handle_timeout(self.now);
                self.drain_worker(w);
            }
        }
    }

    /// One random action; `false` when nothing can happen any more (quiescent, or only
    /// timers far away).
    pub(crate) fn step(&mut self) -> bool {
        self.now = self.now + Duration::from_millis(1);
        self.fire_timeouts();
        let n = self.workers.len();
        let mut choices: Vec<(u8, usize, u64)> = Vec::new();
        for w in 0..n {
            if !self.up[w].is_empty() {
                choices.push((0, w, 4));
            }
            if !self.down[w].is_empty() {
                choices.push((1, w, 4));
            }
            if self.jobs[w].is_some() && !self.dead[w] && self.done[w] < self.max_steps {
                choices.push((2, w, u64::from(self.speed[w])));
            }
        }
        let total: u64 = choices.iter().map(|c| c.2).sum();
        if total == 0 {
            // Jump to the next deadline, if any.
            let next = core::iter::once(self.server.poll_timeout())
                .chain(self.workers.iter().enumerate().filter(|(w, _)| !self.dead[*w]).map(|(_, w)| w.poll_timeout()))
                .flatten()
                .min();
            return match next {
                Some(t) if t > self.now && t < Instant::ZERO + Duration::from_secs(3600) => {
                    self.now = t;
                    self.fire_timeouts();
                    true
                }
                _ => false,
            };
        }
        let mut pick = self.rand() % total;
        for (kind, w, weight) in choices {
            if pick < weight {
                match kind {
                    0 => self.deliver_up(w),
                    1 => self.deliver_down(w),
                    _ => self.finish_job(w),
                }
                return true;
            }
            pick -= weight;
        }
        true
    }

    /// Delivers every worker's first batch (its `Join`) in id order.
    pub(crate) fn deliver_joins(&mut self) {
        for w in 0..self.workers.len() {
            self.deliver_up(w);
        }
    }

    /// The transport declares worker `w` lost.
    pub(crate) fn lose(&mut self, w: usize) {
        self.dead[w] = true;
        let _ = self.server.handle_worker_lost(self.now, WorkerId(w as u32));
        self.drain_server();
    }

    /// Runs until quiescent (or `limit` steps).
    pub(crate) fn run(&mut self, limit: usize) {
        for _ in 0..limit {
            if !self.step() {
                return;
            }
        }
    }

    /// The `(tick, params)` sequence.
    pub(crate) fn ticks(&self) -> Vec<(u64, Vec<u64>)> {
        self.log
            .iter()
            .filter_map(|e| match e {
                Entry::Tick { tick, params } => Some((*tick, params.iter().map(|p| p.to_bits()).collect())),
                _ => None,
            })
            .collect()
    }

    /// Per worker, the parameters of every computation, in order, as bits.
    pub(crate) fn computes(&self) -> Vec<Vec<Vec<u64>>> {
        let mut out = vec![Vec::new(); self.workers.len()];
        for e in &self.log {
            if let Entry::Compute { worker, params, .. } = e {
                out[*worker].push(params.iter().map(|p| p.to_bits()).collect());
            }
        }
        out
    }

    pub(crate) fn events(&self) -> impl Iterator<Item = &ServerEvent> {
        self.log.iter().filter_map(|e| match e {
            Entry::Event(ev) => Some(ev),
            _ => None,
        })
    }

    /// Messages the workers refused, with the worker.
    pub(crate) fn refused(&self) -> Vec<(usize, ToWorkerOwned)> {
        self.log
            .iter()
            .filter_map(|e| match e {
                Entry::WorkerRefused { worker, msg } => Some((*worker, msg.clone())),
                _ => None,
            })
            .collect()
    }

    pub(crate) fn version(&self) -> Version {
        self.server.version()
    }
}
