//! A TCP server for a model it knows nothing about: workers that compute a least-squares
//! gradient through the Rust API report their minibatch loss, the server keeps the loss
//! curve, and a worker whose model has another size is refused at the handshake. A server
//! may also take its initial model from worker 0.

mod tcp_common;

use core::time::Duration;
use syncopate::Version;
use syncopate_adapters::scenario::ProtocolKind;
use syncopate_adapters::tcp::{
    DEFAULT_LOST_AFTER, ProtocolSettings, RunPlan, RunSettings, ServerOptions, WorkerJob, run_worker,
};
use tcp_common::{bounded, plan, start_server_at, worker_options};

/// `f(w) = ½‖w − target‖²`: gradient `w − target`, loss `f(w)`.
struct LeastSquares {
    target: Vec<f32>,
    loss: Option<f32>,
}

/// [`LeastSquares`] that also has initial parameters to give (worker 0 of a server that
/// takes its model from it).
struct WithInitial(LeastSquares, Vec<f32>);

impl WorkerJob for WithInitial {
    fn gradient(&mut self, params: &[f32], grad: &mut [f32]) -> Duration {
        self.0.gradient(params, grad)
    }

    fn loss(&mut self) -> Option<f32> {
        self.0.loss()
    }

    fn initial_params(&mut self, params: &mut [f32]) -> Result<(), String> {
        if params.len() != self.1.len() {
            return Err(format!("{} parameters asked, {} held", params.len(), self.1.len()));
        }
        params.copy_from_slice(&self.1);
        Ok(())
    }
}

/// A server of [`settings`] that takes its initial model from worker 0.
fn start_server_awaiting_initial(plan: RunPlan) -> tcp_common::Running {
    use std::sync::{Arc, Mutex};
    use syncopate_adapters::tcp::{Note, TcpServer};
    let mut s = settings();
    s.initial_from_worker = true;
    let server = TcpServer::bind("127.0.0.1:0", ServerOptions::new(s)).expect("bind");
    let addr = server.local_addr().unwrap();
    let handle = server.handle();
    let (logs, events) = (Arc::new(Mutex::new(Vec::new())), Arc::new(Mutex::new(Vec::new())));
    let (l2, e2) = (Arc::clone(&logs), Arc::clone(&events));
    let join = std::thread::spawn(move || {
        server.run_with_initial_from_worker(&plan, &mut |n| match n {
            Note::Log(line) => l2.lock().unwrap().push(line.to_owned()),
            Note::Event(ev) => e2.lock().unwrap().push(*ev),
            Note::Model { .. } | Note::Started | Note::Contribution { .. } | Note::Checkpoint { .. } => {}
        })
    });
    tcp_common::Running { addr, handle, logs, events, join }
}

#[test]
fn bsp_waits_for_worker_0s_initial_parameters_and_trains_from_them() {
    bounded(Duration::from_secs(60), || {
        let updates = 10u64;
        let server = start_server_awaiting_initial(plan(2 * updates, 30));
        // Worker 1 connects first: its Join is held until worker 0 has sent the model.
        let o1 = worker_options(server.addr, 1);
        let w1 = std::thread::spawn(move || {
            run_worker(&o1, &mut LeastSquares { target: TARGET.to_vec(), loss: None }, &mut |_| {})
        });
        server.wait_log("worker 1 connected", Duration::from_secs(10));
        std::thread::sleep(Duration::from_millis(300));
        let initial = vec![9.0f32, -3.0, 5.0, 0.5];
        let o0 = worker_options(server.addr, 0);
        let mut job0 = WithInitial(LeastSquares { target: TARGET.to_vec(), loss: None }, initial.clone());
        let r0 = run_worker(&o0, &mut job0, &mut |_| {}).unwrap();
        assert!(server.logs_contain("the initial model (4 parameters) came from worker 0"));
        let report = server.finish();
        assert!(r0.stopped && w1.join().unwrap().unwrap().stopped);
        assert!(report.initial_model_known);
        // The first update reports the loss at the initial model, so it was worker 0's.
        let first = report.loss_curve.first().expect("a loss curve");
        let expect: f32 = initial.iter().zip(&TARGET).map(|(w, t)| 0.5 * (w - t) * (w - t)).sum();
        assert_eq!(first.version, 1);
        assert!((first.loss - expect).abs() < 1e-4, "first loss {} expected {expect}", first.loss);
        assert_eq!(report.version.0, updates);
        for (i, (w, t)) in report.params.iter().zip(&TARGET).enumerate() {
            let x = f64::from(*t) + (1.0 - LR).powi(updates as i32) * f64::from(initial[i] - t);
            assert!((f64::from(*w) - x).abs() < 1e-4, "parameter {i}: {w} vs {x}");
        }
    });
}

#[test]
fn initial_parameters_that_are_not_finite_end_worker_0_and_the_server_never_has_a_model() {
    bounded(Duration::from_secs(60), || {
        let server =
            start_server_awaiting_initial(RunPlan { max_gradients: 10, time_limit: Some(Duration::from_secs(2)) });
        let o0 = worker_options(server.addr, 0);
        let mut job0 = WithInitial(LeastSquares { target: TARGET.to_vec(), loss: None }, vec![1.0, f32::NAN, 0.0, 0.0]);
        let err = run_worker(&o0, &mut job0, &mut |_| {}).unwrap_err().to_string();
        assert!(
            err.contains("the initial parameters: parameter 1 is NaN: the initial parameters must be finite"),
            "{err}"
        );
        // A worker 0 with nothing to give ends too, saying so.
        let mut plain = LeastSquares { target: TARGET.to_vec(), loss: None };
        let err = run_worker(&o0, &mut plain, &mut |_| {}).unwrap_err().to_string();
        assert!(err.contains("this worker has no initial parameters to send"), "{err}");
        let report = server.join.join().unwrap().unwrap();
        assert!(!report.initial_model_known, "the run ended without a model");
        assert_eq!(report.stats.accepted, 0);
    });
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
        let mut s = settings();
        s.optimizer = syncopate::proto::Optimizer::momentum(beta);
        let options = ServerOptions::new(s);
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

#[test]
fn a_run_resumed_from_a_checkpoint_goes_on_with_its_momentum() {
    bounded(Duration::from_secs(60), || {
        let (updates, beta) = (6u64, 0.5);
        let path = std::env::temp_dir().join(format!("syncopate-momentum-resume-{}.ckpt", std::process::id()));
        let run = |params: Vec<f32>, version: Version, buffer: Option<Vec<f32>>| {
            let mut s = settings();
            s.optimizer = syncopate::proto::Optimizer::momentum(beta);
            let mut options = ServerOptions::new(s);
            options.optimizer_state = buffer;
            options.checkpoint = Some((path.clone(), 1));
            let server = start_server_at("127.0.0.1:0", options, params, version, plan(2 * updates, 30));
            let workers: Vec<_> = (0..2)
                .map(|i| {
                    let o = worker_options(server.addr, i);
                    std::thread::spawn(move || {
                        run_worker(&o, &mut LeastSquares { target: TARGET.to_vec(), loss: None }, &mut |_| {})
                    })
                })
                .collect();
            let report = server.finish();
            for w in workers {
                assert!(w.join().unwrap().unwrap().stopped);
            }
            report
        };
        let first = run(vec![0.0; 4], Version::ZERO, None);
        assert_eq!(first.version.0, updates);
        let saved = syncopate_adapters::tcp::checkpoint::load(&path, "bsp", 4).unwrap();
        assert_eq!(saved.momentum(), beta);
        assert_eq!(saved.version, first.version);
        let buffer = saved.momentum_buffer().map(<[f32]>::to_vec);
        let second = run(saved.params, saved.version, buffer);
        assert_eq!(second.version.0, 2 * updates);
        // The same heavy-ball recurrence as a run that never stopped.
        for (i, t) in TARGET.iter().enumerate() {
            let (mut prev, mut x) = (0.0f64, 0.0f64);
            for _ in 0..second.version.0 {
                let next = x + beta * (x - prev) - LR * (x - f64::from(*t));
                (prev, x) = (x, next);
            }
            let got = f64::from(second.params[i]);
            assert!((got - x).abs() < 1e-4, "parameter {i}: {got} vs {x}");
        }
        let _ = std::fs::remove_file(&path);
        let _ = std::fs::remove_file(syncopate_adapters::tcp::checkpoint::Journal::path_for(&path));
    });
}

/// A hand-made worker session: the handshake, then `frames` as they are (no checks).
fn send_raw(addr: std::net::SocketAddr, id: u32, frames: &[Vec<u8>]) {
    use std::io::BufWriter;
    use syncopate_adapters::tcp::frame::{FrameReader, FrameTimeout, FrameWriter};
    use syncopate_adapters::tcp::handshake::{ClientSide, Role, client_handshake};
    let stream = std::net::TcpStream::connect(addr).unwrap();
    let mut reader = FrameReader::new(stream.try_clone().unwrap(), 0, FrameTimeout::default());
    let mut writer = FrameWriter::new(BufWriter::new(stream.try_clone().unwrap()), 0);
    let me = ClientSide {
        worker: syncopate::WorkerId(id),
        role: Role::Worker,
        key: None,
        want: None,
        dim: None,
        lost_after: DEFAULT_LOST_AFTER,
        wire: None,
    };
    let deadline = std::time::Instant::now() + Duration::from_secs(5);
    client_handshake(&mut reader, &mut writer, &me, deadline).unwrap();
    for f in frames {
        writer.write_frame(f).unwrap();
    }
    // The server cuts the connection: reading ends.
    let mut buf = Vec::new();
    while reader.read_frame(&mut buf, Some(std::time::Instant::now() + Duration::from_secs(5))).is_ok() {}
}

#[test]
fn the_server_refuses_initial_parameters_of_another_length_not_finite_or_not_from_worker_0() {
    bounded(Duration::from_secs(60), || {
        let server =
            start_server_awaiting_initial(RunPlan { max_gradients: 10, time_limit: Some(Duration::from_secs(3)) });
        let init = |v: &[f32]| {
            let mut out = b"INIT".to_vec();
            out.extend(v.iter().flat_map(|x| x.to_le_bytes()));
            out
        };
        send_raw(server.addr, 0, &[init(&[1.0, 2.0, 3.0])]);
        server.wait_log(
            "worker 0's initial parameters refused: 3 parameters, the server's model has 4; disconnecting",
            Duration::from_secs(5),
        );
        send_raw(server.addr, 0, &[init(&[1.0, f32::INFINITY, 3.0, 4.0])]);
        server.wait_log("parameter 1 is inf: the initial parameters must be finite", Duration::from_secs(5));
        send_raw(server.addr, 1, &[init(&[1.0, 2.0, 3.0, 4.0])]);
        server.wait_log("worker 1 sent initial parameters, but only worker 0 sends them", Duration::from_secs(5));
        let report = server.join.join().unwrap().unwrap();
        assert!(!report.initial_model_known);
        assert_eq!(report.refused, 3);
    });
}

/// Step times are refused, naming why, from a worker of a server that did not ask for them
/// and when they are not a list of finite positive `f32` seconds; the connection is cut.
#[test]
fn the_server_refuses_step_times_it_did_not_ask_for_or_that_are_not_times() {
    bounded(Duration::from_secs(60), || {
        let steps = |v: &[f32]| {
            let mut out = b"STEP".to_vec();
            out.extend(v.iter().flat_map(|x| x.to_le_bytes()));
            out
        };
        let short = RunPlan { max_gradients: 10, time_limit: Some(Duration::from_secs(3)) };
        let plain = start_server_at("127.0.0.1:0", ServerOptions::new(settings()), vec![0.0; 4], Version::ZERO, short);
        send_raw(plain.addr, 0, &[steps(&[0.01])]);
        plain.wait_log(
            "worker 0 sent step times, but this server did not ask for them; disconnecting",
            Duration::from_secs(5),
        );
        let mut asking = settings();
        asking.report_step_times = true;
        let asking = start_server_at("127.0.0.1:0", ServerOptions::new(asking), vec![0.0; 4], Version::ZERO, short);
        send_raw(asking.addr, 0, &[steps(&[0.01, f32::NAN])]);
        asking.wait_log(
            "worker 0 sent bad step times (step time 1 is NaN: a step time must be a finite number of seconds above 0)",
            Duration::from_secs(5),
        );
        send_raw(asking.addr, 1, &[b"STEP\x01".to_vec()]);
        asking.wait_log(
            "worker 1 sent bad step times (1 bytes of step times, not a whole number",
            Duration::from_secs(5),
        );
        assert_eq!(plain.join.join().unwrap().unwrap().refused, 1);
        assert_eq!(asking.join.join().unwrap().unwrap().refused, 2);
    });
}
