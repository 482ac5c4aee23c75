//! Heavy-ball momentum: the coefficient's range, closed forms on BSP and ASP, and `β = 0`
//! as plain SGD, bit for bit, on every protocol.

use super::check_beta_named;
use crate::error::ConfigError;
use crate::id::{Version, WorkerId};
use crate::msg::{ToServer, Values};
use crate::proto::Server;
use crate::proto::asp::{AspConfig, AspServer};
use crate::proto::bsp::{BspConfig, BspServer};
use crate::time::Instant;
use std::vec;
use std::vec::Vec;

fn grad(base: u64, seq: u64, values: &[f64]) -> ToServer<'_, f64> {
    ToServer::Grad { base: Version(base), iteration: base, seq, values: Values::Slice(values), loss: None }
}

/// Feeds one gradient and drains the outputs.
fn feed<S: Server<f64>>(s: &mut S, worker: u32, msg: ToServer<'_, f64>) {
    s.handle(Instant::ZERO, WorkerId(worker), msg).unwrap();
    while s.poll_output().is_some() {}
}

#[test]
fn coefficients_outside_zero_to_one_are_refused() {
    for bad in [-0.1, 1.0, 1.5, f64::NAN, f64::INFINITY] {
        assert_eq!(check_beta_named(bad, "momentum"), Err(ConfigError::Knob("momentum")));
    }
    assert!(check_beta_named(0.0, "momentum").is_ok() && check_beta_named(0.9, "momentum").is_ok());
}

#[test]
fn two_bsp_steps_match_the_closed_form() {
    // x0 = 1, η = 0.5, β = 0.9, gradients 2 then 4 (one worker):
    // x1 = x0 − η g1 = 0; x2 = x1 + β(x1 − x0) − η g2 = 0 − 0.9 − 2 = −2.9,
    // which is PyTorch's v1 = g1, v2 = β v1 + g2, x2 = x1 − η v2.
    let mut s: BspServer<f64, Vec<f64>> = BspServer::new(BspConfig::new(1, 0.5), vec![1.0], vec![0.0]).unwrap();
    s = s.with_momentum(0.9, vec![0.0]).unwrap();
    feed(&mut s, 0, grad(0, 0, &[2.0]));
    assert_eq!(s.params(), &[0.0]);
    feed(&mut s, 0, grad(1, 1, &[4.0]));
    assert!((s.params()[0] + 2.9).abs() < 1e-12, "{:?}", s.params());
    assert_eq!(s.momentum_buffer(), Some(&[0.0][..]), "the model before the last update");
}

#[test]
fn asp_steps_carry_the_velocity_of_every_update() {
    let mut s: AspServer<f64, Vec<f64>> = AspServer::new(AspConfig::new(2, 1.0), vec![0.0]).unwrap();
    s = s.with_momentum(0.5, vec![9.0]).unwrap();
    // The step of each gradient is −lr·g (ASP's learning rate per gradient).
    let step = -s.config().learning_rate;
    let (mut x, mut prev) = (0.0f64, 0.0f64);
    for (i, g) in [1.0f64, 3.0, -2.0].iter().enumerate() {
        feed(&mut s, i as u32 % 2, grad(i as u64, i as u64 / 2, &[*g]));
        let next = x + 0.5 * (x - prev) + step * g;
        (prev, x) = (x, next);
        assert!((s.params()[0] - x).abs() < 1e-12, "update {i}: {:?} vs {x}", s.params());
    }
}

#[test]
fn zero_momentum_is_plain_sgd_bit_for_bit() {
    let run = |beta: Option<f64>| {
        let mut s: BspServer<f64, Vec<f64>> =
            BspServer::new(BspConfig::new(2, 0.3), vec![0.7, -1.1, 2.5], vec![0.0; 3]).unwrap();
        if let Some(b) = beta {
            s = s.with_momentum(b, vec![0.0; 3]).unwrap();
        }
        for v in 0..5u64 {
            for w in 0..2u32 {
                let g = [0.1 * v as f64 + f64::from(w), -0.37, 1.0 / (1.0 + v as f64)];
                feed(&mut s, w, grad(v, v, &g));
            }
        }
        s.params().iter().map(|x| x.to_bits()).collect::<Vec<_>>()
    };
    assert_eq!(run(Some(0.0)), run(None));
    assert_ne!(run(Some(0.5)), run(None));
}

/// `server` and `config`'s workers on the test network (lock-step, each step's gradient from
/// `gradient`) for at most 400 steps; the server at the end.
pub(super) fn run_lockstep(
    config: &crate::proto::ProtocolConfig,
    server: crate::proto::AnyServer<f64, Vec<f64>, crate::proto::Heap>,
    gradient: fn(&crate::proto::common::testkit::Job<'_>) -> Vec<f64>,
) -> crate::proto::AnyServer<f64, Vec<f64>, crate::proto::Heap> {
    use crate::proto::Server;
    use crate::proto::common::testkit::{Cluster, NetConfig};
    use crate::proto::{AnyWorker, WorkerSetup};
    use crate::time::Duration;
    let dim = server.params().len();
    let workers: Vec<AnyWorker<f64, Vec<f64>>> = (0..config.workers())
        .map(|i| {
            let setup = WorkerSetup { id: WorkerId(i), epoch: 1, rejoin_after: None };
            AnyWorker::new(config, setup, vec![0.0; dim], vec![0.0; config.worker_scratch_len(dim)]).unwrap()
        })
        .collect();
    let us = Duration::from_micros;
    let links =
        NetConfig { latency: (us(100), us(900)), compute: (us(700), us(700)), fifo: true, ..NetConfig::default() };
    let mut net = Cluster::new(server, workers, 3, links, gradient).without_snapshots();
    for _ in 0..400 {
        if !net.step() {
            break;
        }
    }
    net.server
}

/// Every protocol on the test network (lock-step workers, a constant gradient) for a
/// fixed number of steps: the final model and version.
fn cluster_run(config: &crate::proto::ProtocolConfig, beta: Option<f64>) -> (Vec<u64>, Vec<f64>, u64) {
    use crate::proto::AnyServer;
    let dim = 4;
    let mut server: AnyServer<f64, Vec<f64>, crate::proto::Heap> =
        AnyServer::new(config, vec![0.0; dim], vec![0.0; config.server_scratch_len(dim)]).unwrap();
    if let Some(b) = beta {
        server = server.with_momentum(b, vec![0.0; dim]).unwrap();
    }
    let server = run_lockstep(config, server, |_| vec![1.0, -1.0, 0.5, 0.25]);
    let params = server.params().to_vec();
    (params.iter().map(|x| x.to_bits()).collect(), params, server.version().0)
}

#[test]
fn every_protocol_applies_momentum_and_zero_is_plain_sgd() {
    for config in crate::proto::common::capacity_tests::configs(16) {
        let name = config.name();
        let plain = cluster_run(&config, None);
        assert_eq!(cluster_run(&config, Some(0.0)).0, plain.0, "{name}: β = 0 is plain SGD, bit for bit");
        let heavy = cluster_run(&config, Some(0.5));
        assert_eq!(heavy.2, plain.2, "{name}: momentum does not change the schedule");
        assert!(plain.2 >= 3, "{name}: only {} updates", plain.2);
        // A constant gradient: every update moves the same way, so the velocity adds
        // to every step after the first and the model goes further.
        for (h, p) in heavy.1.iter().zip(&plain.1) {
            assert!(h.abs() > p.abs() * 1.2, "{name}: {:?} vs plain {:?}", heavy.1, plain.1);
        }
    }
}
