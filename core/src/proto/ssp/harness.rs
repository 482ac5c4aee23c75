//! Test-only: the SSP and BAP tests' runs on the test kit's [`Cluster`]: FIFO links (the
//! protocols assume an ordered transport; everything one drain of a node sends travels as
//! one batch), seeded latencies and compute times scaled by each worker's speed, and
//! integer-valued gradients that depend on the parameters (so computing on the wrong model
//! shows). Each worker finishes at most 4 computations unless the test says otherwise.

use crate::id::{Version, WorkerId};
use crate::proto::bsp::{BspConfig, BspServer};
use crate::proto::common::testkit::{Cluster, Job, NetConfig};
use crate::proto::{GradientWorker, GradientWorkerConfig, Server, Worker};
use proptest::prelude::*;
use std::vec;
use std::vec::Vec;

/// The integer gradient of worker `w`'s `k`-th computation at `params`: depends on the
/// parameters, so computing on the wrong model shows.
pub(crate) fn grad(job: &Job<'_>) -> Vec<f64> {
    job.params
        .iter()
        .enumerate()
        .map(|(i, p)| {
            ((libm::floor(p * 4.0) as i64 + job.worker as i64 * 3 + i as i64 + job.k as i64).rem_euclid(5) - 2) as f64
        })
        .collect()
}

/// A cluster of `server` and `workers` on FIFO links, recording `probe(server)` as the
/// server's tick and `iteration(worker)` with every computation.
pub(crate) fn net<S: Server<f64>, W: Worker<f64>>(
    server: S,
    workers: Vec<W>,
    seed: u64,
    probe: fn(&S) -> u64,
    iteration: fn(&W) -> u64,
) -> Cluster<S, W> {
    let config = NetConfig { fifo: true, ..NetConfig::default() };
    let mut net = Cluster::new(server, workers, seed, config, grad).with_probes(probe, iteration);
    net.max_steps = 4;
    net
}

/// The BSP reference the bound-zero traces are compared with: `n` workers from the model
/// `[1.0, -0.5, 0.25]` at learning rate 0.5, every one joined first, run until each made
/// `steps` computations.
pub(crate) fn bsp_reference(
    n: u32,
    seed: u64,
    steps: u64,
) -> Cluster<BspServer<f64, Vec<f64>>, GradientWorker<f64, Vec<f64>>> {
    let server = BspServer::new(BspConfig::new(n, 0.5), vec![1.0, -0.5, 0.25], vec![0.0; 3]).unwrap();
    let workers =
        (0..n).map(|i| GradientWorker::new(GradientWorkerConfig::new(WorkerId(i)), vec![0.0; 3]).unwrap()).collect();
    let mut bsp = net(server, workers, seed, |s| s.version().0, |w| w.steps());
    bsp.max_steps = steps;
    bsp.deliver_joins();
    bsp.run(100_000);
    bsp
}

/// A bound-zero trace case: `(n, seed of the run, seed of BSP's run, worker speeds, steps)`.
pub(crate) fn trace_case() -> impl Strategy<Value = (u32, u64, u64, Vec<u32>, u64)> {
    (0u32..4, any::<u64>(), any::<u64>(), proptest::collection::vec(1u32..8, 8), 1u64..7)
        .prop_map(|(n_log, seed_a, seed_b, speeds, steps)| (1u32 << n_log, seed_a, seed_b, speeds, steps))
}

/// Runs `net` (every worker joined before the first update arrives, worker `i` at speed
/// `speeds[i]`, `steps` computations each) and checks that it computes on exactly BSP's
/// models and goes through BSP's models, bit for bit ([`bsp_reference`] seeded `seed_b`).
pub(crate) fn check_bsp_trace<S: Server<f64>, W: Worker<f64>>(
    net: &mut Cluster<S, W>,
    seed_b: u64,
    speeds: &[u32],
    steps: u64,
) -> Result<(), TestCaseError> {
    let n = net.nodes.len();
    net.speed = speeds.iter().take(n).map(|&s| f64::from(s)).collect();
    net.max_steps = steps;
    net.deliver_joins();
    net.run(100_000);
    let bsp = bsp_reference(n as u32, seed_b, steps);
    prop_assert_eq!(bsp.version(), Version(steps));
    prop_assert_eq!(net.computes(), bsp.computes());
    prop_assert_eq!(net.ticks(), bsp.ticks());
    prop_assert_eq!(net.server.params(), bsp.server.params());
    Ok(())
}
