//! Tensors on the wire in bf16 or fp16: training over loopback reaches the same accuracy
//! target as `f32`, the server keeping `f32`; a worker asking for another encoding than the
//! server's is refused at the handshake with a line naming both; a gradient that does not
//! stay finite in fp16 is refused by its worker as one not finite.

#[path = "tcp_common/mod.rs"]
mod common;

use common::*;
use core::time::Duration;
use std::sync::Arc;
use syncopate::wire::Encoding;
use syncopate_adapters::tcp::{ServerOptions, StopReason, WorkerJob, run_worker};

const WORKERS: u32 = 3;
const STEPS: u64 = 150;
/// The accuracy `tcp_train` asks of the same run in `f32`.
const TARGET: f64 = 0.85;

/// BSP over loopback with the server speaking `server`, worker 0 asking for `asked` and the
/// others taking the server's; the model's accuracy and parameters at the end.
fn train(server_wire: Encoding, asked: Option<Encoding>) -> (f64, Vec<f32>) {
    let w = workload();
    let mut options = ServerOptions::new(bsp(WORKERS));
    options.wire = server_wire;
    let server = start_server(options, &w, plan(STEPS * u64::from(WORKERS), 30));
    let workers: Vec<_> = (0..WORKERS)
        .map(|i| {
            let mut o = worker_options(server.addr, i);
            o.wire = if i == 0 { asked } else { None };
            spawn_worker(o, Arc::clone(&w))
        })
        .collect();
    let report = server.finish();
    let mut reports = Vec::new();
    for h in workers {
        let (r, logs) = h.join().unwrap();
        let r = r.unwrap_or_else(|e| panic!("worker failed: {e}; {logs:?}"));
        assert!(r.stopped && r.steps > 0);
        reports.push(r);
    }
    check_ledger(&report, &reports);
    assert_eq!(report.reason, StopReason::Budget);
    (accuracy(&w, &report.params), report.params)
}

#[test]
fn bsp_in_bf16_and_fp16_reaches_the_f32_target() {
    bounded(Duration::from_secs(120), || {
        let (f32_acc, f32_params) = train(Encoding::F32, None);
        let (bf16, bf16_params) = train(Encoding::Bf16, Some(Encoding::Bf16));
        let (fp16, fp16_params) = train(Encoding::Fp16, None);
        // The rounding on the wire shows in the models (the runs are otherwise alike).
        assert_ne!(bf16_params, f32_params);
        assert_ne!(fp16_params, f32_params);
        eprintln!("digits softmax, BSP x{WORKERS}, {STEPS} rounds: f32 {f32_acc:.4}, bf16 {bf16:.4}, fp16 {fp16:.4}");
        for (name, acc) in [("f32", f32_acc), ("bf16", bf16), ("fp16", fp16)] {
            assert!(acc > TARGET, "{name} accuracy {acc} below the target {TARGET}");
        }
        assert!((bf16 - f32_acc).abs() < 0.03, "bf16 {bf16} vs f32 {f32_acc}");
    });
}

#[test]
fn a_worker_asking_for_another_encoding_is_refused_naming_both() {
    bounded(Duration::from_secs(30), || {
        let w = workload();
        let server = start_server(ServerOptions::new(bsp(1)), &w, plan(u64::MAX, 20));
        let mut o = worker_options(server.addr, 0);
        o.wire = Some(Encoding::Bf16);
        let (r, logs) = spawn_worker(o, Arc::clone(&w)).join().unwrap();
        let e = r.expect_err("refused").to_string();
        assert!(e.contains("worker asks for bf16, server speaks f32"), "{e}; {logs:?}");
        server.wait_log("worker asks for bf16, server speaks f32 (worker 0)", Duration::from_secs(5));
        server.handle.stop();
        let _ = server.join.join();
    });
}

/// Gradients of 1e5 in every element: finite in `f32` and bf16, ±∞ in fp16.
struct Huge;

impl WorkerJob for Huge {
    fn gradient(&mut self, _params: &[f32], grad: &mut [f32]) -> Duration {
        grad.fill(1.0e5);
        Duration::ZERO
    }
}

#[test]
fn a_gradient_beyond_fp16_is_refused_as_not_finite_by_its_worker() {
    bounded(Duration::from_secs(30), || {
        let w = workload();
        let mut options = ServerOptions::new(bsp(1));
        options.wire = Encoding::Fp16;
        let server = start_server(options, &w, plan(u64::MAX, 20));
        let o = worker_options(server.addr, 0);
        let mut logs = Vec::new();
        let r = run_worker(&o, &mut Huge, &mut |l| logs.push(l.to_owned())).unwrap();
        assert!(r.refused > 0, "the worker refused its own gradient: {r:?}; {logs:?}");
        let report = server.finish();
        assert_eq!(report.reason, StopReason::Diverged, "{report:?}");
        assert_eq!(report.stats.accepted, 0, "nothing beyond fp16 reached the server as a gradient");
    });
}

#[test]
fn a_model_beyond_fp16_ends_the_run_as_diverged() {
    bounded(Duration::from_secs(30), || {
        let w = workload();
        let mut options = ServerOptions::new(bsp(1));
        options.wire = Encoding::Fp16;
        let mut params = vec![0.0f32; w.model.dim()];
        params[3] = 1.0e5;
        let server = start_server_at("127.0.0.1:0", options, params, syncopate::Version::ZERO, plan(u64::MAX, 20));
        let worker = spawn_worker(worker_options(server.addr, 0), Arc::clone(&w));
        server.wait_log("cannot encode a Model message: value 3 of the tensor is not finite in fp16; the model has diverged, stopping", Duration::from_secs(10));
        let report = server.finish();
        assert_eq!(report.reason, StopReason::Diverged);
        let _ = worker.join();
    });
}

/// Gradients of 6e4 in every element: within fp16's range.
struct Large;

impl WorkerJob for Large {
    fn gradient(&mut self, _params: &[f32], grad: &mut [f32]) -> Duration {
        grad.fill(6.0e4);
        Duration::ZERO
    }
}

#[test]
fn a_delta_beyond_fp16_is_reported_as_not_finite_and_the_run_diverges() {
    bounded(Duration::from_secs(30), || {
        let w = workload();
        // WBSP uploads the worker's model change: 2 x 6e4 per step, beyond fp16.
        let settings = run_settings(syncopate_adapters::tcp::ProtocolSettings::named(
            syncopate_adapters::scenario::ProtocolKind::Wbsp,
            1,
            2.0,
        ));
        let mut options = ServerOptions::new(settings);
        options.wire = Encoding::Fp16;
        let server = start_server(options, &w, plan(u64::MAX, 20));
        let mut logs = Vec::new();
        let _ = run_worker(&worker_options(server.addr, 0), &mut Large, &mut |l| logs.push(l.to_owned()));
        let report = server.finish();
        assert_eq!(report.reason, StopReason::Diverged, "{report:?}; {logs:?}");
        assert_eq!(report.stats.accepted, 0, "no delta beyond fp16 reached the server");
    });
}
