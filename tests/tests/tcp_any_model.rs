//! A TCP server for a model it knows nothing about: workers that compute a least-squares
//! gradient through the Rust API report their minibatch loss, the server keeps the loss
//! curve, and a worker whose model has another size is refused at the handshake.

mod tcp_common;

use core::time::Duration;
use syncopate::Version;
use syncopate_adapters::scenario::ProtocolKind;
use syncopate_adapters::tcp::{ProtocolSettings, RunSettings, ServerOptions, WorkerJob, run_worker};
use tcp_common::{bounded, plan, start_server_at, worker_options};

/// `f(w) = ½‖w − target‖²`: gradient `w − target`, loss `f(w)`.
struct LeastSquares {
    target: Vec<f32>,
    loss: Option<f32>,
}

impl WorkerJob for LeastSquares {
    fn gradient(&mut self, params: &[f32], grad: &mut [f32]) -> Duration {
        let mut loss = 0.0f32;
        for ((g, p), t) in grad.iter_mut().zip(params).zip(&self.target) {
            *g = p - t;
            loss += 0.5 * *g * *g;
        }
        self.loss = Some(loss);
        Duration::ZERO
    }

    fn loss(&mut self) -> Option<f32> {
        self.loss
    }
}

const TARGET: [f32; 4] = [1.0, 2.0, 3.0, 4.0];
const LR: f64 = 0.25;

fn settings() -> RunSettings {
    RunSettings::new(ProtocolSettings::named(ProtocolKind::Bsp, 2, LR), TARGET.len())
}

#[test]
fn bsp_trains_a_model_it_does_not_know_and_keeps_the_loss_curve() {
    bounded(Duration::from_secs(60), || {
        let updates = 20u64;
        let server = start_server_at(
            "127.0.0.1:0",
            ServerOptions::new(settings()),
            vec![0.0; TARGET.len()],
            Version::ZERO,
            plan(2 * updates, 30),
        );
        let workers: Vec<_> = (0..2)
            .map(|i| {
                let mut o = worker_options(server.addr, i);
                o.dim = Some(TARGET.len());
                std::thread::spawn(move || {
                    let mut job = LeastSquares { target: TARGET.to_vec(), loss: None };
                    run_worker(&o, &mut job, &mut |_| {})
                })
            })
            .collect();
        let report = server.finish();
        for w in workers {
            assert!(w.join().unwrap().unwrap().stopped);
        }
        // Both workers compute on the same model, so update v reports the loss at model
        // v − 1: `w_v − target = (1 − lr)^v (w_0 − target)`, so the loss is
        // `½ (1 − lr)^(2(v−1)) ‖target‖²`.
        let start: f64 = TARGET.iter().map(|t| 0.5 * f64::from(*t) * f64::from(*t)).sum();
        assert_eq!(report.loss_curve.len() as u64, report.version.0, "one point per update");
        for p in &report.loss_curve {
            let expect = start * (1.0 - LR).powi(2 * (p.version as i32 - 1));
            assert!((f64::from(p.loss) - expect).abs() <= 1e-4 * expect.max(1e-3), "{p:?} expected {expect}");
        }
        assert!(report.loss_curve.windows(2).all(|w| w[1].t_s >= w[0].t_s && w[1].loss < w[0].loss));
    });
}

#[test]
fn a_worker_of_another_model_size_is_refused_naming_both_sizes() {
    bounded(Duration::from_secs(30), || {
        let server =
            start_server_at("127.0.0.1:0", ServerOptions::new(settings()), vec![0.0; 4], Version::ZERO, plan(10, 5));
        let mut o = worker_options(server.addr, 0);
        o.dim = Some(5);
        let mut job = LeastSquares { target: vec![0.0; 5], loss: None };
        let err = run_worker(&o, &mut job, &mut |_| {}).unwrap_err().to_string();
        let why = "model size mismatch: the server's model has 4 parameters, worker 0's has 5";
        assert!(err.contains(why), "worker error: {err}");
        server.wait_log(why, Duration::from_secs(5));
        server.handle.stop();
        let _ = server.join.join();
    });
}

#[test]
fn momentum_on_the_tcp_server_follows_the_heavy_ball_recurrence() {
    bounded(Duration::from_secs(60), || {
        let (updates, beta) = (12u64, 0.5);
        let mut options = ServerOptions::new(settings());
        options.momentum = beta;
        let server = start_server_at("127.0.0.1:0", options, vec![0.0; 4], Version::ZERO, plan(2 * updates, 30));
        let workers: Vec<_> = (0..2)
            .map(|i| {
                let o = worker_options(server.addr, i);
                std::thread::spawn(move || {
                    let mut job = LeastSquares { target: TARGET.to_vec(), loss: None };
                    run_worker(&o, &mut job, &mut |_| {})
                })
            })
            .collect();
        let report = server.finish();
        for w in workers {
            assert!(w.join().unwrap().unwrap().stopped);
        }
        // x_{v+1} = x_v + β(x_v − x_{v−1}) − lr (x_v − target), from x_0 = x_{−1} = 0.
        for (i, t) in TARGET.iter().enumerate() {
            let (mut prev, mut x) = (0.0f64, 0.0f64);
            for _ in 0..report.version.0 {
                let next = x + beta * (x - prev) - LR * (x - f64::from(*t));
                (prev, x) = (x, next);
            }
            let got = f64::from(report.params[i]);
            assert!((got - x).abs() < 1e-4, "parameter {i}: {got} vs {x} after {} updates", report.version.0);
        }
    });
}
