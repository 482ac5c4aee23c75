//! Contributions with values or losses that are not finite, from a raw worker session: a
//! gradient holding NaN means the model diverged, and the run ends as `Diverged` saying
//! which worker sent it; a gradient whose loss is NaN is refused, logged naming the worker,
//! counted, named by the stall reports of the round that waits for it (which name every
//! worker the round lacks, and every worker not connected), and the worker is told; three
//! in a row from one worker end the run as diverged, as does a worker whose protocol
//! refused to send a gradient whose loss is not finite, three times in a row.

#[path = "tcp_common/mod.rs"]
mod common;

use common::*;
use core::time::Duration;
use std::net::{SocketAddr, TcpStream};
use std::time::Instant;
use syncopate::wire::{self, Limits};
use syncopate::{ToServer, ToWorker, Values, Version, WorkerId};
use syncopate_adapters::tcp::frame::{FrameReader, FrameTimeout, FrameWriter};
use syncopate_adapters::tcp::handshake::{self, ClientSide, Role};
use syncopate_adapters::tcp::{DEFAULT_LOST_AFTER, ServerOptions, StopReason, session_max_len};

/// A raw session as worker 0: the handshake and a Join, then the model's version once the
/// server sends it.
fn join(addr: SocketAddr, dim: usize) -> (FrameReader, FrameWriter<TcpStream>, Version) {
    let s = TcpStream::connect(addr).unwrap();
    let mut w = FrameWriter::new(s.try_clone().unwrap(), 0);
    let mut r = FrameReader::new(s, 0, FrameTimeout::default());
    let me = ClientSide {
        worker: WorkerId(0),
        role: Role::Worker,
        key: None,
        want: None,
        dim: None,
        lost_after: DEFAULT_LOST_AFTER,
        wire: None,
    };
    handshake::client_handshake(&mut r, &mut w, &me, Instant::now() + Duration::from_secs(3)).unwrap();
    r.set_max_len(session_max_len(dim));
    w.set_max_len(session_max_len(dim));
    send(&mut w, &ToServer::Join { epoch: 0 });
    let limits = Limits::for_model(dim);
    let mut buf = Vec::new();
    loop {
        let p = r.read_frame(&mut buf, Some(Instant::now() + Duration::from_secs(5))).unwrap();
        if let Ok(ToWorker::Model { version, .. }) = wire::decode_to_worker::<f32>(p.of(&buf), &limits) {
            return (r, w, version);
        }
    }
}

fn send(w: &mut FrameWriter<TcpStream>, msg: &ToServer<'_, f32>) {
    let mut buf = vec![0u8; wire::encoded_len_to_server(msg)];
    let n = wire::encode_to_server(msg, &mut buf).unwrap();
    w.write_frame(&buf[..n]).unwrap();
}

fn server(n: u32) -> (Running, usize) {
    let w = workload();
    (start_server(ServerOptions::new(bsp(n)), &w, plan(u64::MAX, 30)), w.model.dim())
}

#[test]
fn a_gradient_holding_nan_ends_the_run_as_diverged_naming_the_worker() {
    bounded(Duration::from_secs(30), || {
        let (server, dim) = server(2);
        let (_r, mut w, base) = join(server.addr, dim);
        let mut grad = vec![0.5f32; dim];
        grad[3] = f32::NAN;
        send(&mut w, &ToServer::Grad { base, iteration: 0, seq: 0, values: Values::Slice(&grad), loss: None });
        server.wait_log(
            "worker 0 sent a Grad holding NaN or ±∞: refused; the model has diverged",
            Duration::from_secs(5),
        );
        let report = server.finish();
        assert_eq!(report.reason, StopReason::Diverged);
        assert_eq!(report.refused_not_finite, 1);
        assert_eq!(report.version, base, "the refused gradient changed nothing");
    });
}

#[test]
fn a_loss_that_is_not_finite_is_refused_logged_counted_and_named_by_stall_reports() {
    bounded(Duration::from_secs(30), || {
        let (server, dim) = server(3);
        let (_r, mut w, base) = join(server.addr, dim);
        let grad = vec![0.01f32; dim];
        send(
            &mut w,
            &ToServer::Grad { base, iteration: 0, seq: 0, values: Values::Slice(&grad), loss: Some(f32::NAN) },
        );
        server.wait_log("worker 0 sent a Grad whose loss is not finite: refused", Duration::from_secs(5));
        server.wait_log(
            "stalled: contributions refused for a loss that is not finite: worker 0 (1)",
            Duration::from_secs(5),
        );
        // Every worker the round lacks for want of a connection is named, not only the first.
        server.wait_log("stalled: not connected: workers 1, 2", Duration::from_secs(5));
        // The round lacks all three (worker 0's gradient was refused): the report names them.
        server.wait_log("stalled: waiting for worker 0 (3 missing: workers 0, 1, 2)", Duration::from_secs(5));
        server.handle.stop();
        let report = server.finish();
        assert_eq!(report.reason, StopReason::Stopped, "a bad loss alone is no divergence");
        assert_eq!(report.refused_loss_not_finite, [1, 0, 0]);
        assert_eq!((report.refused_not_finite, report.version), (0, base));
    });
}

#[test]
fn a_worker_is_told_of_each_loss_refused_and_three_in_a_row_end_the_run_as_diverged() {
    use syncopate_adapters::tcp::refusal::{CODEC, Refusal};
    bounded(Duration::from_secs(30), || {
        let (server, dim) = server(2);
        let (mut r, mut w, base) = join(server.addr, dim);
        let grad = vec![0.01f32; dim];
        let mut buf = Vec::new();
        for seq in 0..3u64 {
            let loss = Some(f32::INFINITY);
            send(&mut w, &ToServer::Grad { base, iteration: 0, seq, values: Values::Slice(&grad), loss });
            let told = loop {
                let p = r.read_frame(&mut buf, Some(Instant::now() + Duration::from_secs(5))).unwrap();
                if CODEC.is(p.of(&buf)) {
                    break Refusal::decode(p.of(&buf)).unwrap();
                }
            };
            assert_eq!(told, Refusal { total: seq + 1, in_a_row: seq as u32 + 1, limit: 3 });
        }
        server.wait_log(
            "worker 0 sent 3 contributions in a row whose loss is not finite: the model has diverged, stopping",
            Duration::from_secs(5),
        );
        let report = server.finish();
        assert_eq!(report.reason, StopReason::Diverged);
        assert_eq!((report.refused_loss_not_finite, report.version), (vec![3, 0], base));
    });
}

/// Gradients whose loss is always NaN: the worker's own protocol refuses to send them.
struct NanLoss;

impl syncopate_adapters::tcp::WorkerJob for NanLoss {
    fn gradient(&mut self, _params: &[f32], grad: &mut [f32]) -> Duration {
        grad.fill(0.01);
        Duration::ZERO
    }

    fn loss(&mut self) -> Option<f32> {
        Some(f32::NAN)
    }
}

/// A connected worker whose every loss is NaN sends no gradient (its protocol refuses
/// them); it tells the server so, and the BSP round that waits for it ends as diverged at
/// the third in a row instead of waiting for ever. The worker logs what the server said.
#[test]
fn a_worker_that_only_computes_losses_that_are_not_finite_ends_a_bsp_run_as_diverged() {
    bounded(Duration::from_secs(60), || {
        let w = workload();
        let server = start_server(ServerOptions::new(bsp(2)), &w, plan(u64::MAX, 50));
        let options = worker_options(server.addr, 0);
        let nan = std::thread::spawn(move || {
            let mut logs = Vec::new();
            let r = syncopate_adapters::tcp::run_worker(&options, &mut NanLoss, &mut |l| logs.push(l.to_owned()));
            (r, logs)
        });
        let good = spawn_worker(worker_options(server.addr, 1), w);
        server.wait_log(
            "worker 0 sent 3 contributions in a row whose loss is not finite: the model has diverged, stopping",
            Duration::from_secs(30),
        );
        let report = server.finish();
        assert_eq!(report.reason, StopReason::Diverged);
        assert_eq!(report.refused_loss_not_finite[0], 3);
        let (r, logs) = nan.join().unwrap();
        r.unwrap();
        let told = "the server refused a contribution whose loss is not finite (refusal 3 of this worker, 3 in a row";
        assert!(logs.iter().any(|l| l.contains(told)), "{logs:#?}");
        good.join().unwrap().0.unwrap();
    });
}
