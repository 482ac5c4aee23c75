//! What a simulation runs: protocol, workload, straggler models, network, faults and when to
//! stop.

use super::compute::ComputeModel;
use crate::workload::{ModelKind, Workload};
use syncopate::{Duration, ProtocolConfig};

/// The network between the server and each worker (the same for every link).
#[derive(Clone, Debug, PartialEq)]
pub struct NetworkConfig {
    /// One-way latency of every link.
    pub latency: Duration,
    /// Bandwidth of every link in bytes per second (`f64::INFINITY`: no transfer time).
    pub bandwidth: f64,
}

impl Default for NetworkConfig {
    /// 0.5 ms latency, 1 GB/s.
    fn default() -> Self {
        Self { latency: Duration::from_micros(500), bandwidth: 1e9 }
    }
}

/// A worker crash: at `at` the worker stops; its computation and its messages in flight
/// (both directions) vanish.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Crash {
    /// The worker's index.
    pub worker: u32,
    /// Virtual time of the crash.
    pub at: Duration,
    /// Restart this long after the crash: a new worker with the next epoch joins again.
    pub restart_after: Option<Duration>,
    /// Tell the server at once (`handle_worker_lost`), as a transport that sees the
    /// connection close would.
    pub notify_server: bool,
}

/// When a run ends (whichever comes first; with none set it runs until nothing is left to
/// do).
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct StopRule {
    /// Stop at this virtual time.
    pub max_time: Option<Duration>,
    /// Stop once the server's model version reaches this many updates.
    pub max_updates: Option<u64>,
    /// Stop once the server has accepted this many contributions (gradients, deltas or
    /// clock updates): a compute budget that means the same for every protocol.
    pub max_gradients: Option<u64>,
    /// Stop at the first evaluation that reaches the target accuracy.
    pub stop_at_target: bool,
    /// Safety net: stop after this many events.
    pub max_events: u64,
}

impl Default for StopRule {
    /// 60 s of virtual time, no update limit, do not stop at the target, 100 M events.
    fn default() -> Self {
        Self {
            max_time: Some(Duration::from_secs(60)),
            max_updates: None,
            max_gradients: None,
            stop_at_target: false,
            max_events: 100_000_000,
        }
    }
}

/// Everything a simulation run depends on. Same config, same workload ⇒ same report, bit for
/// bit.
#[derive(Clone, Debug, PartialEq)]
pub struct SimConfig {
    /// The protocol and its settings (the worker count comes from here).
    pub protocol: ProtocolConfig,
    /// The model trained (used by [`SimConfig::digits_workload`]; [`super::run`] trains the
    /// model of the workload it is given).
    pub model: ModelKind,
    /// The run seed: model initialisation, minibatches, straggler draws.
    pub seed: u64,
    /// Examples per gradient.
    pub batch_size: usize,
    /// Virtual time of one gradient computation on an unhindered worker.
    pub base_step: Duration,
    /// Per-worker compute-time models (missing entries are [`ComputeModel::None`]).
    pub compute: Vec<ComputeModel>,
    /// The network.
    pub network: NetworkConfig,
    /// Worker crashes.
    pub crashes: Vec<Crash>,
    /// Workers re-send `Join` after waiting this long for the server (`None`: never).
    pub rejoin_after: Option<Duration>,
    /// When to stop.
    pub stop: StopRule,
    /// Virtual time between evaluations of the server's model on the test set.
    pub eval_interval: Duration,
    /// The accuracy that defines "time to target".
    pub target_accuracy: f64,
    /// Record every step time in [`super::SimReport::compute_trace`].
    pub record_trace: bool,
}

impl SimConfig {
    /// Defaults: seed 1, batch 32, 10 ms per step, no stragglers, 0.5 ms / 1 GB/s links, no
    /// crashes, 60 s of virtual time, evaluation every 50 ms, target 0.90.
    pub fn new(protocol: ProtocolConfig, model: ModelKind) -> Self {
        Self {
            protocol,
            model,
            seed: 1,
            batch_size: 32,
            base_step: Duration::from_millis(10),
            compute: Vec::new(),
            network: NetworkConfig::default(),
            crashes: Vec::new(),
            rejoin_after: None,
            stop: StopRule::default(),
            eval_interval: Duration::from_millis(50),
            target_accuracy: 0.90,
            record_trace: true,
        }
    }

    /// The number of workers.
    pub fn workers(&self) -> u32 {
        self.protocol.workers()
    }

    /// Worker `i`'s compute model.
    pub fn compute_model(&self, worker: u32) -> ComputeModel {
        self.compute.get(worker as usize).cloned().unwrap_or(ComputeModel::None)
    }

    /// The built-in digits workload for this config's model and seed.
    pub fn digits_workload(&self) -> Workload {
        Workload::digits(self.model, self.seed)
    }

    /// Builder: the seed.
    pub fn with_seed(mut self, seed: u64) -> Self {
        self.seed = seed;
        self
    }

    /// Builder: the compute models.
    pub fn with_compute(mut self, compute: Vec<ComputeModel>) -> Self {
        self.compute = compute;
        self
    }

    /// Builder: stop after `updates` model updates.
    pub fn with_max_updates(mut self, updates: u64) -> Self {
        self.stop.max_updates = Some(updates);
        self
    }

    /// Builder: stop at `time` of virtual time.
    pub fn with_max_time(mut self, time: Duration) -> Self {
        self.stop.max_time = Some(time);
        self
    }

    /// Builder: stop as soon as the target accuracy is reached.
    pub fn stop_at_target(mut self, target: f64) -> Self {
        self.target_accuracy = target;
        self.stop.stop_at_target = true;
        self
    }
}
