//! A deterministic discrete-event harness for the backup-worker tests (shared with DBW's):
//! `n` [`GradientWorker`](super::GradientWorker)s, seeded message latencies and
//! shifted-exponential compute times, integer-valued gradients (so every sum is exact),
//! cancellation of abandoned computations, and a record of everything the server did.

use crate::id::{ComputeId, Version, WorkerId};
use crate::proto::{
    GradientWorker, GradientWorkerConfig, Recipient, Server, ServerEvent, ServerOutput, ToServerOwned, ToWorkerOwned,
    Worker, WorkerEvent, WorkerOutput,
};
use crate::time::{Duration, Instant};
use std::vec;
use std::vec::Vec;

/// SplitMix64.
pub(crate) struct Rng(pub(crate) u64);

impl Rng {
    pub(crate) fn next(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9E37_79B9_7F4A_7C15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
        z ^ (z >> 31)
    }
    pub(crate) fn uniform(&mut self) -> f64 {
        (self.next() >> 11) as f64 / (1u64 << 53) as f64
    }
}

/// The gradient worker `w` computes at version `v`: small integers, a pure function.
pub(crate) fn grad_of(w: u32, v: u64, dim: usize) -> Vec<f64> {
    (0..dim)
        .map(|j| {
            let mut r = Rng(u64::from(w) << 40 ^ v << 8 ^ j as u64);
            (r.next() % 17) as f64 - 8.0
        })
        .collect()
}

enum Action {
    ToServer(u32, ToServerOwned),
    ToWorker(u32, ToWorkerOwned),
    Done(u32, ComputeId, u64),
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
    let mut rng = Rng(seed);
    let mut workers: Vec<GradientWorker<f64, Vec<f64>>> =
        (0..n).map(|i| GradientWorker::new(GradientWorkerConfig::new(WorkerId(i)), vec![0.0; dim]).unwrap()).collect();
    let mut queue: Vec<(Instant, u64, Action)> = Vec::new();
    let mut order = 0u64;
    let mut trace = Trace::default();
    let mut now = Instant::ZERO;
    let latency = |rng: &mut Rng| Duration::from_micros(rng.next() % 200);
    macro_rules! drain_worker {
        ($i:expr) => {{
            let i: u32 = $i;
            let w = &mut workers[i as usize];
            while let Some(out) = w.poll_output() {
                match out {
                    WorkerOutput::Send(msg) => {
                        order += 1;
                        queue.push((now + latency(&mut rng), order, Action::ToServer(i, ToServerOwned::from(&msg))));
                    }
                    WorkerOutput::Compute { id, version, .. } => {
                        let factor = if slow.contains(&i) { 5.0 } else { 1.0 };
                        let t = factor * (1.0 - libm::log(1.0 - rng.uniform()));
                        order += 1;
                        queue.push((now + Duration::from_secs_f64(t * 1e-3), order, Action::Done(i, id, version.0)));
                    }
                    WorkerOutput::Event(WorkerEvent::Abandoned { id }) => {
                        queue.retain(|(_, _, a)| !matches!(a, Action::Done(j, c, _) if *j == i && *c == id));
                    }
                    WorkerOutput::Event(_) => {}
                }
            }
        }};
    }
    for i in 0..n {
        drain_worker!(i);
    }
    let mut steps = 0;
    while server.version().0 < rounds {
        steps += 1;
        assert!(steps < 1_000_000, "no progress");
        let Some(pos) = (0..queue.len()).min_by_key(|&p| (queue[p].0, queue[p].1)) else {
            panic!("deadlock at {:?}", server.version());
        };
        let (at, _, action) = queue.swap_remove(pos);
        now = now.max(at);
        match action {
            Action::ToServer(i, msg) => {
                let mut buf = Vec::new();
                let before = server.version();
                let is_grad = matches!(msg, ToServerOwned::Grad { .. });
                if server.handle(now, WorkerId(i), msg.as_msg(&mut buf)).is_ok() && is_grad {
                    trace.accepted += 1;
                }
                if server.version() != before {
                    trace.updates.push((server.version().0, server.params().iter().map(|p| p.to_bits()).collect()));
                }
                while let Some(out) = server.poll_output() {
                    match out {
                        ServerOutput::Event(e) => trace.events.push(e),
                        ServerOutput::Send { to, msg } => {
                            let owned = ToWorkerOwned::from(&msg);
                            let targets: Vec<u32> = match to {
                                Recipient::AllWorkers => (0..n).collect(),
                                Recipient::Worker(w) => vec![w.0],
                            };
                            for t in targets {
                                order += 1;
                                queue.push((now + latency(&mut rng), order, Action::ToWorker(t, owned.clone())));
                            }
                            trace.sends.push((to, owned));
                        }
                    }
                }
            }
            Action::ToWorker(i, msg) => {
                let mut buf = Vec::new();
                let _ = workers[i as usize].handle(now, msg.as_msg(&mut buf));
                drain_worker!(i);
            }
            Action::Done(i, id, version) => {
                let g = grad_of(i, version, dim);
                let _ = workers[i as usize].handle_gradient(now, id, &g);
                drain_worker!(i);
            }
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
        assert!(trace.events.contains(&ServerEvent::ModelUpdated { version: Version(*v), contributions: k as u32 }));
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
