//! Eight gradient workers and a simulated clock around a server: the event loop a host
//! runs, written once for every protocol. Messages are delivered at once; a gradient takes
//! a simulated step time, drawn per job: `base · (1 + Exp(1))` with a base of 10 ms, and
//! 25 ms on the two slow workers (6 and 7). The earliest finished job is handed back
//! first, so the order of events is the one the simulated times give.
//!
//! Driving follows the core's contract: feed one input (`handle`, `handle_gradient`),
//! then drain `poll_output` on every state machine until none has anything left.

use crate::problem::{Problem, Residuals};
use crate::rng::Rng;
use crate::{DIM, WORKERS};
use heapless::Vec;
use syncopate::{
    ComputeId, ConfigError, Duration, GradientWorker, GradientWorkerConfig, Instant, Recipient, Reject, Server,
    ServerEvent, ServerOutput, Worker as _, WorkerEvent, WorkerId, WorkerOutput,
};

/// Base step time of the fast workers (a step is `base · (1 + Exp(1))`).
const FAST_STEP: Duration = Duration::from_millis(10);
/// Base step time of the slow workers.
const SLOW_STEP: Duration = Duration::from_millis(25);
/// Workers `SLOW_FROM..` are slow.
const SLOW_FROM: usize = 6;
/// Generator stream of the step times (the problem uses streams below 100).
const STEP_STREAM: u64 = 1 << 32;

/// What stopped a run before its goal.
#[derive(Clone, Copy, Debug)]
pub enum Failure {
    /// A state machine refused its configuration.
    Config(ConfigError),
    /// A state machine refused an input the cluster routed to it: `who` names it.
    Refused {
        /// `"server"` or `"worker"`.
        who: &'static str,
        /// Its reason.
        reject: Reject,
    },
    /// Nothing is computing and the goal is not reached: the protocol waits forever.
    Stuck,
    /// The server sent a message upstream, but the cluster has no server above it.
    Upstream,
}

/// A gradient job in progress: the residuals at the model it started from, and when it ends.
#[derive(Clone, Copy, Debug)]
struct Job {
    id: ComputeId,
    done_at: Instant,
    residuals: Residuals,
}

/// Counts of what the server reported during a run.
#[derive(Clone, Copy, Debug, Default)]
pub struct Tally {
    /// Gradients applied.
    pub applied: u64,
    /// Valid gradients dropped (late: their iteration had closed).
    pub dropped: u64,
    /// Computations the workers abandoned (a newer model arrived).
    pub abandoned: u64,
    /// DBW: how many times it chose `k` (once per update).
    pub k_choices: u32,
    /// Sum of the chosen `k`.
    pub k_sum: u32,
    /// Smallest chosen `k`.
    pub k_min: u32,
    /// Largest chosen `k`.
    pub k_max: u32,
}

impl Tally {
    fn record(&mut self, event: &ServerEvent) {
        match *event {
            ServerEvent::Applied { .. } => self.applied += 1,
            ServerEvent::Dropped { .. } => self.dropped += 1,
            ServerEvent::BackupChosen { k, .. } => {
                self.k_min = if self.k_choices == 0 { k } else { self.k_min.min(k) };
                self.k_max = self.k_max.max(k);
                self.k_sum += k;
                self.k_choices += 1;
            }
            _ => {}
        }
    }
}

/// How a run ended.
#[derive(Clone, Copy, Debug)]
pub struct Outcome {
    /// Loss of the initial model.
    pub initial_loss: f32,
    /// Loss of the last model.
    pub final_loss: f32,
    /// Whether the loss fell to the goal.
    pub reached: bool,
    /// Model updates.
    pub updates: u64,
    /// Simulated time from the start to the last update.
    pub elapsed: Duration,
    /// Whether every worker acknowledged the server's `Stop`.
    pub all_stopped: bool,
    /// What the server reported.
    pub tally: Tally,
}

/// When a run stops.
#[derive(Clone, Copy, Debug)]
pub struct Goal {
    /// Stop when the loss is at most this fraction of the initial loss.
    pub loss_fraction: f32,
    /// Or after this many model updates.
    pub max_updates: u64,
}

/// A gradient worker whose model lives in the static memory.
pub type Worker<'m> = GradientWorker<f32, &'m mut [f32]>;

/// The workers, their jobs and the simulated clock.
pub struct Cluster<'m> {
    workers: Vec<Worker<'m>, WORKERS>,
    jobs: [Option<Job>; WORKERS],
    grad: &'m mut [f32],
    steps: Rng,
    now: Instant,
    tally: Tally,
}

impl<'m> Cluster<'m> {
    /// Eight workers whose models live in `buffers`; `grad` is the host's gradient scratch.
    /// Step times come from `seed`.
    pub fn new(buffers: &'m mut [[f32; DIM]; WORKERS], grad: &'m mut [f32], seed: u64) -> Result<Self, Failure> {
        let mut workers = Vec::new();
        for (i, buffer) in buffers.iter_mut().enumerate() {
            let config = GradientWorkerConfig::new(WorkerId(i as u32));
            let worker = GradientWorker::new(config, &mut buffer[..]).map_err(Failure::Config)?;
            if workers.push(worker).is_err() {
                return Err(Failure::Config(ConfigError::WorkerCount(i as u32 + 1)));
            }
        }
        Ok(Self {
            workers,
            jobs: [None; WORKERS],
            grad,
            steps: Rng::new(seed, STEP_STREAM),
            now: Instant::ZERO,
            tally: Tally::default(),
        })
    }

    /// Trains `server` on `problem` until `goal`, then stops it and its workers.
    pub fn train<S: Server<f32>>(&mut self, server: &mut S, problem: &Problem, goal: Goal) -> Result<Outcome, Failure> {
        let initial_loss = problem.loss(server.params());
        let target = initial_loss * goal.loss_fraction;
        let (mut loss, mut version, mut last_update) = (initial_loss, server.version(), self.now);
        self.pump(server, problem)?;
        while loss > target && server.stats().updates < goal.max_updates {
            let (worker, job) = self.next_job().ok_or(Failure::Stuck)?;
            self.now = job.done_at;
            problem.gradient(worker, &job.residuals, self.grad);
            if let Some(w) = self.workers.get_mut(worker) {
                w.handle_gradient(self.now, job.id, self.grad)
                    .map_err(|reject| Failure::Refused { who: "worker", reject })?;
            }
            self.pump(server, problem)?;
            if server.version() != version {
                (loss, version, last_update) = (problem.loss(server.params()), server.version(), self.now);
            }
        }
        server.stop();
        self.pump(server, problem)?;
        Ok(Outcome {
            initial_loss,
            final_loss: loss,
            reached: loss <= target,
            updates: server.stats().updates,
            elapsed: last_update.saturating_duration_since(Instant::ZERO),
            all_stopped: self.workers.iter().all(|w| w.is_stopped()),
            tally: self.tally,
        })
    }

    /// Removes and returns the job that finishes first (the lowest worker id on a tie).
    fn next_job(&mut self) -> Option<(usize, Job)> {
        let (worker, _) = self
            .jobs
            .iter()
            .enumerate()
            .filter_map(|(i, job)| job.map(|j| (i, j.done_at)))
            .min_by_key(|&(i, done_at)| (done_at, i))?;
        let job = self.jobs.get_mut(worker)?.take()?;
        Some((worker, job))
    }

    /// Drains every state machine until none has output left: workers' messages go to the
    /// server, the server's to the workers, computations start on the simulated clock.
    fn pump<S: Server<f32>>(&mut self, server: &mut S, problem: &Problem) -> Result<(), Failure> {
        let now = self.now;
        loop {
            let mut moved = false;
            for (i, worker) in self.workers.iter_mut().enumerate() {
                let me = worker.id();
                while let Some(output) = worker.poll_output() {
                    moved = true;
                    let job = self.jobs.get_mut(i);
                    match output {
                        WorkerOutput::Send(msg) => {
                            server.handle(now, me, msg).map_err(|reject| Failure::Refused { who: "server", reject })?;
                        }
                        WorkerOutput::Compute { id, params, .. } => {
                            let base = if i < SLOW_FROM { FAST_STEP } else { SLOW_STEP };
                            let tail = (base.as_nanos() as f32 * self.steps.exponential()) as u64;
                            let step = base + Duration::from_nanos(tail);
                            let residuals = problem.residuals(i, params);
                            if let Some(job) = job {
                                *job = Some(Job { id, done_at: now + step, residuals });
                            }
                        }
                        WorkerOutput::Event(WorkerEvent::Abandoned { id }) => {
                            self.tally.abandoned += 1;
                            if let Some(slot) = job.filter(|slot| slot.is_some_and(|j| j.id == id)) {
                                *slot = None;
                            }
                        }
                        WorkerOutput::Event(_) => {}
                    }
                }
            }
            while let Some(output) = server.poll_output() {
                moved = true;
                match output {
                    ServerOutput::Send { to, msg } => {
                        for worker in self.workers.iter_mut().filter(|w| addressed(to, w.id())) {
                            worker.handle(now, msg).map_err(|reject| Failure::Refused { who: "worker", reject })?;
                        }
                    }
                    ServerOutput::Event(event) => self.tally.record(&event),
                    // The cluster's server has no server above it.
                    ServerOutput::Upstream(_) => return Err(Failure::Upstream),
                }
            }
            if !moved {
                return Ok(());
            }
        }
    }
}

/// Whether a message sent to `to` reaches worker `id`.
fn addressed(to: Recipient, id: WorkerId) -> bool {
    match to {
        Recipient::Worker(w) => w == id,
        Recipient::AllWorkers => true,
    }
}
