//! A deterministic discrete-event simulator: the experiment engine and test harness.
//!
//! One server and `n` workers run any protocol through [`AnyServer`](syncopate::AnyServer) /
//! [`AnyWorker`](syncopate::AnyWorker), exactly as a real transport drives them, but in
//! virtual time:
//!
//! - **Compute**: a worker's `Compute` output is answered with a real gradient of the
//!   [`Workload`] at the given parameters on a fresh minibatch (computed at once), handed back
//!   at `now + step time`, the step time drawn from the worker's [`ComputeModel`] (straggler
//!   models, seeded per worker). A worker computes one job at a time; a new `Compute` replaces
//!   the old job, and an `Abandoned` event ends it early.
//! - **Network**: each worker has an uplink and a downlink ([`network::Link`]): a message
//!   occupies its link for `bytes / bandwidth`, arrives `latency` later, and stays in order
//!   behind earlier messages on that link. A broadcast is one copy per downlink (the
//!   server's network card is not a shared bottleneck). Computing and communicating are
//!   independent, so a worker computes while its upload is in flight. Messages cross as the
//!   bytes [`syncopate::wire`] encodes (exactly what TCP carries), from a pool of reused
//!   buffers; a codec error is a bug (counted, and a panic in debug builds).
//! - **Faults**: [`Crash`]es stop a worker (its job and its messages in flight vanish),
//!   optionally tell the server (`handle_worker_lost`), and optionally restart it with the
//!   next epoch. [`FaultConfig`] (docs/RELIABILITY.md, "Fault model"; default: none, and then no random
//!   number is drawn) adds message faults on the worker links (loss, duplication as a later
//!   replay, delay spikes that let later messages overtake, scripted and random one-way
//!   partitions [`LinkCut`]), random worker crashes with restarts, and [`ServerCrash`]es:
//!   the server resumes from a checkpoint of its model and version (`AnyServer::resume`)
//!   after a downtime during which messages to it are lost; workers find the new server
//!   through their `Join` retry, so set [`SimConfig::rejoin_after`]. Everything stops at
//!   [`FaultConfig::quiet_after`] (the liveness phase). Faults come from their own seeded
//!   stream ([`FAULT_STREAM`]), are counted in [`SimReport::faults`] and shown as
//!   [`Observation::Fault`]. Computation is never faulted.
//! - **Two-level grouped network**: with [`SimConfig::group_link`] and a protocol with
//!   sub-servers (`ProtocolConfig::tiers`: the grouped protocol), each group is its own node
//!   (`AnyServer::subserver`, [`Node::Group`]) with a link pair to a central node
//!   ([`Node::Server`], whose events are [`Observation::Central`]); workers talk to their
//!   group's node. The nodes' `ServerOutput::Upstream` messages and the central replies
//!   (`Server::handle_upstream`) cross the link; the engine has no protocol-specific code. The group links are reliable (no faults: they model TCP between
//!   servers). With an instant group link this is the single-process `GroupedServer`, run for
//!   run. The model evaluated and reported is the central one.
//! - **Sharded servers**: with [`SimConfig::shards`] > 1 the model is split over that many
//!   server nodes, each with its own network card (or sharing a worker's,
//!   [`SimConfig::colocate_shards`]); see [`SimReport::shards`] and the `shards` module.
//! - **Trivial workload**: [`GradientSource::Constant`] skips gradient evaluation, to measure
//!   the engine and protocol throughput (`tests/tests/sim_throughput.rs`; BENCHMARKS.md,
//!   "Simulator").
//! - **Driving contract**: after every input the node's outputs are drained, then its timer
//!   is re-armed from `poll_timeout`; a timer that fires calls `handle_timeout` only if the
//!   deadline is still due.
//! - **Measurement**: the server's model is evaluated on the test set every
//!   [`SimConfig::eval_interval`]; the [`SimReport`] has the curve, time to target, the
//!   server's counters, per-worker compute shares, staleness, traffic, and a hash of the
//!   whole event trace.
//!
//! Events are ordered by (virtual time, insertion sequence), nothing iterates a hash map
//! and nothing reads a clock, so the same config and workload give the same report, bit for
//! bit. [`SimReport::events`] counts the events processed, for throughput measurements.
//!
//! ```
//! use syncopate::ProtocolConfig;
//! use syncopate::proto::bsp::BspConfig;
//! use syncopate_sim::sim::{self, ComputeModel, SimConfig};
//! use syncopate_sim::workload::ModelKind;
//!
//! let config = SimConfig::new(ProtocolConfig::Bsp(BspConfig::new(4, 0.5)), ModelKind::Softmax)
//!     .with_compute(ComputeModel::one_straggler(4, 0, 2.0))
//!     .with_max_updates(20);
//! let report = sim::run(&config, &config.digits_workload());
//! assert_eq!(report.updates, 20);
//! assert_eq!(report.applied, 80);
//! ```

mod compute;
mod config;
mod engine;
mod error;
pub mod network;
mod report;
mod run_loop;
mod shards;

pub use compute::{ComputeModel, ComputeSampler, compute_models};
pub use config::{
    Crash, Direction, FaultConfig, GradientSource, LinkCut, NetworkConfig, ServerCrash, SimConfig, StopRule,
};
pub use engine::FAULT_STREAM;
pub use error::SimError;
pub(crate) use report::Observer;
pub use report::{
    Bucket, CurvePoint, DIVERGED_LOSS_GROWTH, Fault, FaultStats, Node, Observation, ShardReport, SimReport,
    StalenessStats, Target, TraceStep, WorkerReport, divergence,
};

use crate::workload::Workload;

/// Runs `config` on `workload` and reports.
///
/// # Panics
///
/// If the configuration is invalid (see [`try_run`]).
pub fn run(config: &SimConfig, workload: &Workload) -> SimReport {
    run_observed(config, workload, &mut |_| {})
}

/// Runs `config` on `workload`, showing every [`Observation`] to `observer` as it happens.
///
/// # Panics
///
/// If the configuration is invalid (see [`try_run_observed`]).
pub fn run_observed(config: &SimConfig, workload: &Workload, observer: &mut dyn FnMut(&Observation<'_>)) -> SimReport {
    match try_run_observed(config, workload, observer) {
        Ok(r) => r,
        Err(e) => panic!("simulation not started: {e}"),
    }
}

/// Runs `config` on the sharded-server network model whatever [`SimConfig::shards`] is (at
/// least 1): with one shard, a single server whose network card carries every worker's
/// traffic (the engine [`try_run`] uses for one server gives the server no card of its own).
/// For comparing server layouts over the same links.
pub fn try_run_sharded(config: &SimConfig, workload: &Workload) -> Result<SimReport, SimError> {
    shards::run(config, workload, &mut |_| {})
}

/// Runs `config` on `workload`, or says why it cannot.
pub fn try_run(config: &SimConfig, workload: &Workload) -> Result<SimReport, SimError> {
    try_run_observed(config, workload, &mut |_| {})
}

/// [`run_observed`], or why the simulation cannot start.
pub fn try_run_observed(
    config: &SimConfig,
    workload: &Workload,
    observer: &mut dyn FnMut(&Observation<'_>),
) -> Result<SimReport, SimError> {
    if config.shards != 1 {
        return shards::run(config, workload, observer);
    }
    Ok(engine::Engine::new(config, workload, observer)?.run())
}
