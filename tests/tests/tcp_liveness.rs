//! Liveness over real loopback sockets: both sides of a session announce their silence limit
//! (`lost_after`) in the handshake and beat often enough for the stricter one, so a short
//! limit on either side never declares a healthy peer lost; a limit too short for any beat is
//! refused with one line.

#[path = "tcp_common/mod.rs"]
mod common;

use common::*;
use core::time::Duration;
use syncopate_adapters::tcp::{DEFAULT_LOST_AFTER, ServerOptions, TcpServer, run_worker};

/// Steps that take this long: longer than the short silence limit, so only heartbeats keep
/// the session alive between two uploads.
const STEP: Duration = Duration::from_millis(500);
const SHORT: Duration = Duration::from_millis(200);

#[test]
fn a_server_with_a_short_lost_after_keeps_a_default_worker_whose_steps_are_longer() {
    bounded(Duration::from_secs(60), || {
        let w = workload();
        let mut options = ServerOptions::new(asp(1));
        options.lost_after = SHORT;
        let server = start_server(options, &w, plan(4, 30));
        let mut o = worker_options(server.addr, 0);
        o.lost_after = DEFAULT_LOST_AFTER;
        let (r, logs) = spawn_worker_paced(o, w, STEP).join().unwrap();
        let report = server.finish();
        assert_eq!(report.lost, 0, "a healthy worker was declared lost: {logs:#?}");
        assert!(report.stats.accepted >= 4, "{report:?}");
        assert_eq!(r.unwrap().sessions, 1);
    });
}

#[test]
fn a_worker_with_a_short_lost_after_keeps_a_default_server_that_is_quiet_between_replies() {
    bounded(Duration::from_secs(60), || {
        let w = workload();
        let mut options = ServerOptions::new(asp(1));
        options.lost_after = DEFAULT_LOST_AFTER;
        let server = start_server(options, &w, plan(4, 30));
        let mut o = worker_options(server.addr, 0);
        o.lost_after = SHORT;
        let (r, logs) = spawn_worker_paced(o, w, STEP).join().unwrap();
        let report = server.finish();
        assert!(!logs.iter().any(|l| l.contains("silent")), "{logs:#?}");
        assert_eq!(r.unwrap().sessions, 1, "{logs:#?}");
        assert_eq!(report.lost, 0);
    });
}

#[test]
fn a_lost_after_shorter_than_two_beats_is_refused_on_both_sides() {
    let mut options = ServerOptions::new(asp(1));
    options.lost_after = Duration::from_millis(10);
    let Err(e) = TcpServer::bind("127.0.0.1:0", options) else { panic!("a 10 ms lost_after was accepted") };
    assert!(e.0.contains("below twice the shortest heartbeat interval"), "{e}");
    let mut o = worker_options("127.0.0.1:9".parse().unwrap(), 0);
    o.lost_after = Duration::from_millis(10);
    let e = run_worker(&o, &mut |_: &[f32], _: &mut [f32]| {}, &mut |_| {}).unwrap_err();
    assert!(e.0.contains("worker 0: lost_after: a silence limit of 0.01 s"), "{e}");
}
