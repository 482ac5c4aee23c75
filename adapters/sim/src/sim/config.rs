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

/// One direction of a worker's connection.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum Direction {
    /// Worker → server (or → its group node).
    Up,
    /// Server (or group node) → worker.
    Down,
}

/// A one-way partition: worker `worker`'s link in `direction` is cut during
/// `from..until` (virtual time). A message handed to a cut link is lost.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct LinkCut {
    /// The worker whose link is cut.
    pub worker: u32,
    /// Which direction.
    pub direction: Direction,
    /// Start of the cut (inclusive).
    pub from: Duration,
    /// End of the cut (exclusive).
    pub until: Duration,
}

/// A server crash: at `at` the server's state is lost except its checkpoint, the model and
/// version as of its last update (the model only changes with the version, so no applied
/// update is lost). After `down_for` a new server resumes from the checkpoint
/// (`AnyServer::resume`). Messages reaching the server while it is down are lost; workers
/// find the new server through their `Join` retry, so set [`SimConfig::rejoin_after`] in such
/// scenarios (the resumed server knows no member until they join again).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct ServerCrash {
    /// Virtual time of the crash.
    pub at: Duration,
    /// How long the server stays down.
    pub down_for: Duration,
}

/// Injected faults (docs/RELIABILITY.md, "Fault model"). The default injects nothing and draws no random
/// numbers, so a config without faults runs exactly as before they existed.
///
/// Message faults apply to every message on a worker's links (never to computation, and
/// never to the group↔central links of a two-level grouped run, which model reliable TCP),
/// each decided when the message is handed to its link, in this order: partition (lost),
/// loss, delay spike, duplication. Random draws come from the dedicated stream
/// `Rng::derive(seed, FAULT_STREAM)` (random partitions and crashes from sub-streams of it),
/// so faults never disturb the straggler or minibatch draws.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct FaultConfig {
    /// Probability that a message is lost (0–0.3 in the fault model).
    pub loss: f64,
    /// Probability that a message is delivered twice (0–0.5): the copy is a replay that
    /// arrives [`Self::replay_delay`] (mean, exponential) after the original.
    pub duplicate: f64,
    /// Mean extra delay of a duplicate after the original (zero: at the same instant).
    pub replay_delay: Duration,
    /// Probability of a delay spike on a message.
    pub delay: f64,
    /// Mean of the exponential extra delay of a spike. A delayed message does not hold up
    /// its link, so later messages may overtake it (reordering).
    pub delay_mean: Duration,
    /// Scripted one-way partitions.
    pub cuts: Vec<LinkCut>,
    /// Random one-way partitions: each worker link is cut at this rate per virtual second
    /// (0: none) ...
    pub cut_rate: f64,
    /// ... for an exponential time of this mean.
    pub cut_mean: Duration,
    /// Random worker crashes: probability per virtual second per worker (a Poisson rate;
    /// 0: none). A crashed worker restarts (next epoch) after an exponential delay of mean
    /// [`Self::restart_mean`].
    pub crash_rate: f64,
    /// Mean restart delay of a random crash.
    pub restart_mean: Duration,
    /// Random crashes tell the server (`handle_worker_lost`), as a transport that sees the
    /// connection close would.
    pub crash_notify_server: bool,
    /// Server crashes and restarts from checkpoint (not supported with
    /// [`SimConfig::group_link`]).
    pub server_crashes: Vec<ServerCrash>,
    /// Virtual time after which no new fault happens (the liveness phase): messages sent
    /// from then on are untouched, cuts end, no random crash starts (scripted crashes and
    /// pending restarts still happen as configured).
    pub quiet_after: Option<Duration>,
}

impl FaultConfig {
    /// Whether any message-level fault is configured.
    pub fn message_faults(&self) -> bool {
        self.loss > 0.0
            || self.duplicate > 0.0
            || self.delay > 0.0
            || !self.cuts.is_empty()
            || (self.cut_rate > 0.0 && self.cut_mean > Duration::ZERO)
    }

    /// Whether `now` (from the start of the run) is before the quiet phase.
    pub fn active_at(&self, now: Duration) -> bool {
        self.quiet_after.is_none_or(|q| now < q)
    }
}

/// Where a worker's gradient comes from.
#[derive(Clone, Copy, Debug, Default, PartialEq)]
pub enum GradientSource {
    /// A real gradient of the workload at the given parameters on a fresh minibatch.
    #[default]
    Workload,
    /// Every element is this value and nothing is evaluated: computing costs (almost)
    /// nothing, for measuring the throughput of the protocol and the engine. The model does
    /// not learn anything meaningful (turn evaluations off with a zero `eval_interval`).
    Constant(f32),
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
    /// Stop once the target accuracy is found reached (at an evaluation, or when the kept
    /// models are checked; see [`super::SimReport::time_to_target`]).
    pub stop_at_target: bool,
    /// Stop at the first evaluation whose test loss is at or below this (a loss target, for
    /// workloads without an accuracy such as the noisy quadratic model; `None`: never).
    pub stop_at_loss: Option<f64>,
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
            stop_at_loss: None,
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
    /// Virtual time between evaluations of the server's model on the test set. Zero turns
    /// evaluation off: no accuracy curve and no time-to-target search, only the final model
    /// is evaluated (for throughput runs with [`GradientSource::Constant`]).
    pub eval_interval: Duration,
    /// The accuracy that defines "time to target".
    pub target_accuracy: f64,
    /// Record every step time in [`super::SimReport::compute_trace`].
    pub record_trace: bool,
    /// Injected faults (default: none).
    pub faults: FaultConfig,
    /// Where gradients come from (default: the workload).
    pub gradient: GradientSource,
    /// Two-level network for a protocol with sub-servers ([`ProtocolConfig::tiers`]: the
    /// grouped protocol): when set, each group runs as its own node
    /// ([`syncopate::AnyServer::subserver`]) with this link pair to a central node (for
    /// grouped, an ASP server over the groups); workers talk to their group's node. `None`:
    /// the single-process server (instant group↔central exchanges). Ignored for protocols
    /// without sub-servers.
    pub group_link: Option<NetworkConfig>,
    /// Sharded servers: the model split over this many server nodes, each running the
    /// protocol over its slice (default 1: one server). See [`super::SimReport::shards`].
    pub shards: u32,
    /// With [`Self::shards`] > 1: shard `k` runs on worker `k`'s machine and shares its
    /// network card (default `false`: every shard has a card of its own).
    pub colocate_shards: bool,
    /// SGD with momentum on every update of the server's model (each shard's, or the
    /// grouped protocol's central model), in `[0, 1)`; 0 (the default) is plain SGD. A
    /// server restarted after an injected crash resumes without velocity.
    pub momentum: f64,
}

impl SimConfig {
    /// Refuses what no simulator can run: a batch of no rows.
    pub(crate) fn check_runnable(&self) -> Result<(), super::SimError> {
        if self.batch_size == 0 { Err(super::SimError::BatchSize) } else { Ok(()) }
    }

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
            faults: FaultConfig::default(),
            gradient: GradientSource::Workload,
            group_link: None,
            shards: 1,
            colocate_shards: false,
            momentum: 0.0,
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

    /// The built-in workload for this config's model and seed ([`Workload::builtin`]: the
    /// digits data, or the noisy quadratic model's noise).
    pub fn digits_workload(&self) -> Workload {
        Workload::builtin(self.model, self.seed)
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

    /// Builder: the injected faults.
    pub fn with_faults(mut self, faults: FaultConfig) -> Self {
        self.faults = faults;
        self
    }

    /// Builder: the gradient source.
    pub fn with_gradient(mut self, gradient: GradientSource) -> Self {
        self.gradient = gradient;
        self
    }

    /// Builder: run a grouped protocol on a two-level network with this group↔central link.
    pub fn with_group_link(mut self, link: NetworkConfig) -> Self {
        self.group_link = Some(link);
        self
    }

    /// Builder: split the model over `shards` server nodes, co-located with the first
    /// workers or on machines of their own.
    pub fn with_shards(mut self, shards: u32, colocate: bool) -> Self {
        self.shards = shards;
        self.colocate_shards = colocate;
        self
    }

    /// Builder: stop as soon as the target accuracy is reached.
    pub fn stop_at_target(mut self, target: f64) -> Self {
        self.target_accuracy = target;
        self.stop.stop_at_target = true;
        self
    }
}
