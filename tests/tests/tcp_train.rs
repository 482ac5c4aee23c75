//! Training over real loopback sockets reaches the accuracy the thread adapter reaches with
//! the same protocol, workload and gradient budget, and every gradient the server accepted
//! has an outcome.

#[path = "tcp_common/mod.rs"]
mod common;

use common::*;
use core::time::Duration;
use std::sync::Arc;
use syncopate_adapters::tcp::{RunSettings, ServerOptions};

const WORKERS: u32 = 3;
const STEPS: u64 = 150;

fn tcp_run(settings: &RunSettings, secret: bool) -> (f64, syncopate_adapters::tcp::ServerReport) {
    let w = workload();
    let mut options = ServerOptions::new(settings.clone());
    let key_secret = syncopate_adapters::tcp::Secret::new(b"a test secret of enough bytes").unwrap();
    if secret {
        options.secret = Some(key_secret.clone());
    }
    let server = start_server(options, &w, plan(STEPS * u64::from(WORKERS), 30));
    let workers: Vec<_> = (0..WORKERS)
        .map(|i| {
            let mut o = worker_options(server.addr, i);
            if secret {
                o.key = Some(key_secret.worker_key(syncopate::WorkerId(i)));
            }
            spawn_worker(o, Arc::clone(&w))
        })
        .collect();
    let report = server.finish();
    let mut reports = Vec::new();
    for h in workers {
        let (r, logs) = h.join().unwrap();
        let r = r.unwrap_or_else(|e| panic!("worker failed: {e}; {logs:?}"));
        assert!(r.stopped, "the server told every worker to stop");
        assert!(r.steps > 0);
        reports.push(r);
    }
    check_ledger(&report, &reports);
    (accuracy(&w, &report.params), report)
}

fn check(settings: RunSettings, secret: bool) {
    let (tcp, report) = tcp_run(&settings, secret);
    let threads = threads_accuracy(settings.worker_config().unwrap(), STEPS * u64::from(WORKERS));
    eprintln!("{}: tcp accuracy {tcp:.4}, threads {threads:.4}, report {report:?}", settings.label());
    assert!(report.connect_wait_s.is_some(), "every worker connected");
    assert!(report.busy_s.iter().all(|b| *b > 0.0), "compute time is measured per worker: {:?}", report.busy_s);
    assert_eq!(report.reason, syncopate_adapters::tcp::StopReason::Budget);
    assert!(report.stats.accepted >= STEPS * u64::from(WORKERS));
    let s = report.stats;
    assert!(s.applied + s.dropped_total() <= s.accepted);
    assert!(tcp > 0.85, "tcp accuracy {tcp}");
    assert!((tcp - threads).abs() < 0.05, "tcp {tcp} vs threads {threads}");
}

#[test]
fn bsp_over_tcp_matches_threads() {
    bounded(Duration::from_secs(90), || check(bsp(WORKERS), false));
}

#[test]
fn asp_over_tcp_matches_threads() {
    bounded(Duration::from_secs(90), || check(asp(WORKERS), false));
}

#[test]
fn authenticated_bsp_over_tcp_matches_threads() {
    bounded(Duration::from_secs(90), || check(bsp(WORKERS), true));
}
