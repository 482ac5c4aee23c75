//! The backup-worker tests' runs (shared with DBW's) on the test kit's [`Cluster`]: `n`
//! [`GradientWorker`](super::GradientWorker)s, seeded message latencies (0–200 µs) and
//! shifted-exponential compute times (1 ms + Exp(mean 1 ms), 5× for slow workers),
//! integer-valued gradients (so every sum is exact), and the checks K1, K2, one outcome per
//! gradient and conservation against a reference replay.

use crate::id::{Version, WorkerId};
use crate::proto::common::testkit::{Cluster, Entry, Job, NetConfig};
use crate::proto::{
    GradientWorker, GradientWorkerConfig, Recipient, Server, ServerEvent, ToServerOwned, ToWorkerOwned,
};
use crate::rng::Rng;
use crate::time::{Duration, Instant};
use std::vec;
use std::vec::Vec;

/// The gradient worker `w` computes at version `v`: small integers, a pure function.
pub(crate) fn grad_of(w: u32, v: u64, dim: usize) -> Vec<f64> {
    (0..dim)
        .map(|j| {
            let mut r = Rng::new(u64::from(w) << 40 ^ v << 8 ^ j as u64);
            (r.next_u64() % 17) as f64 - 8.0
        })
        .collect()
}

/// What a run produced.
#[derive(Debug, Default, PartialEq)]
pub(crate) struct Trace {
    pub(crate) events: Vec<ServerEvent>,
    pub(crate) sends: Vec<(Recipient, ToWorkerOwned)>,
    /// (version, parameter bits) after every update.
    pub(crate) updates: Vec<(u64, Vec<u64>)>,
    /// Gradients the server accepted (`Ok` from `handle`).
    pub(crate) accepted: u64,
}

/// Runs until the server reaches `rounds` updates. `slow` workers compute 5× slower.
pub(crate) fn run<S: Server<f64>>(server: &mut S, n: u32, dim: usize, rounds: u64, seed: u64, slow: &[u32]) -> Trace {
    let workers: Vec<GradientWorker<f64, Vec<f64>>> =
        (0..n).map(|i| GradientWorker::new(GradientWorkerConfig::new(WorkerId(i)), vec![0.0; dim]).unwrap()).collect();
    let config = NetConfig {
        latency: (Duration::ZERO, Duration::from_micros(199)),
        compute: (Duration::from_millis(1), Duration::from_millis(1)),
        exponential: true,
        horizon: Instant::MAX,
        ..NetConfig::default()
    };
    let gradient = |job: &Job<'_>| grad_of(job.worker as u32, job.version, job.params.len());
    let mut net = Cluster::new(server, workers, seed, config, gradient);
    for &w in slow {
        if let Some(s) = net.speed.get_mut(w as usize) {
            *s = 0.2;
        }
    }
    assert!(net.run_until(1_000_000, |c| c.version().0 >= rounds), "no progress");
    let mut trace = Trace::default();
    for e in net.log {
        match e {
            Entry::Event(e) => trace.events.push(e),
            Entry::Sent { to, msg } => trace.sends.push((to, msg)),
            Entry::Tick { tick, params } => trace.updates.push((tick, params.iter().map(|p| p.to_bits()).collect())),
            Entry::ServerIn { msg: ToServerOwned::Grad { .. }, result: Ok(()), .. } => trace.accepted += 1,
            _ => {}
        }
    }
    trace
}

/// Checks K1, K2, one outcome per accepted gradient, and conservation against a
/// reference replay. `k_of(v)` is the number of gradients version `v`'s iteration waits
/// for. Returns the number of dropped gradients.
pub(crate) fn check(trace: &Trace, dim: usize, lr: f64, init: f64, k_of: impl Fn(u64) -> usize) -> u64 {
    let mut applied: Vec<(u32, u64, u64)> = Vec::new();
    let mut dropped = 0u64;
    for e in &trace.events {
        match *e {
            ServerEvent::Applied { worker, base, version, staleness, .. } => {
                assert_eq!(staleness, 0);
                assert_eq!(base.next(), version, "K1: only gradients computed at the model being updated");
                applied.push((worker.0, base.0, version.0));
            }
            ServerEvent::Dropped { worker, base, .. } => {
                dropped += 1;
                assert!(
                    !applied.iter().any(|a| a.0 == worker.0 && a.1 == base.0),
                    "K2: a gradient both applied and dropped"
                );
            }
            _ => {}
        }
    }
    assert_eq!(trace.accepted, applied.len() as u64 + dropped, "one outcome per accepted gradient");
    let mut params = vec![init; dim];
    for (v, bits) in &trace.updates {
        let mut who: Vec<u32> = applied.iter().filter(|a| a.2 == *v).map(|a| a.0).collect();
        let k = who.len();
        assert_eq!(k, k_of(v - 1), "K1: exactly k gradients for version {}", v - 1);
        assert!(trace.events.contains(&ServerEvent::ModelUpdated {
            version: Version(*v),
            contributions: k as u32,
            mean_loss: None
        }));
        who.sort_unstable();
        who.dedup();
        assert_eq!(who.len(), k, "K1: k distinct workers");
        let mut acc = vec![0.0f64; dim];
        for w in &who {
            for (a, g) in acc.iter_mut().zip(grad_of(*w, v - 1, dim)) {
                *a += g;
            }
        }
        crate::math::apply_and_clear(&mut params, -lr / k as f64, &mut acc).unwrap();
        let expect: Vec<u64> = params.iter().map(|p| p.to_bits()).collect();
        assert_eq!(&expect, bits, "C2: model after version {v}");
    }
    dropped
}
