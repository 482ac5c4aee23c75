//! Contributions with values or losses that are not finite, from a raw worker session: a
//! gradient holding NaN means the model diverged, and the run ends as `Diverged` saying
//! which worker sent it; a gradient whose loss is NaN is refused, logged naming the worker,
//! counted, and named by the stall reports of the round that waits for it, which also name
//! every worker not connected.

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
        server.handle.stop();
        let report = server.finish();
        assert_eq!(report.reason, StopReason::Stopped, "a bad loss alone is no divergence");
        assert_eq!(report.refused_loss_not_finite, [1, 0, 0]);
        assert_eq!((report.refused_not_finite, report.version), (0, base));
    });
}
