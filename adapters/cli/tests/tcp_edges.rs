//! `serve` and `work` processes at the edges a new user meets: `timeout` and batch
//! schedulers signal twice and the checkpoint is still written; a server stopped before its
//! workers came reports no run; two processes claiming one worker id are told so. Every
//! process is bounded by a deadline and killed on failure.

#[path = "procs/mod.rs"]
mod procs;

use core::time::Duration;
use procs::{Proc, json, serve, work};

/// `timeout` sends SIGTERM to `serve` and then to its process group at once: the second
/// signal, within the grace period, changes nothing. A third one after it exits at once.
#[test]
fn a_second_sigterm_within_the_grace_period_keeps_the_checkpoint() {
    let dir = std::env::temp_dir().join(format!("syncopate-tcp-edges-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let ckpt = dir.join("y.ckpt");
    let args = ["--workers", "2", "--steps", "100000000", "--json", "--checkpoint", ckpt.to_str().unwrap()];
    let (server, addr) = serve(&args);
    let workers: Vec<Proc> = (0..2).map(|i| work(&addr, i, &[])).collect();
    server.wait_err("version", Duration::from_secs(20));
    // Back to back, as `timeout` sends them (the kernel may merge the two into one).
    server.signal("TERM");
    server.signal("TERM");
    server.wait_err("SIGTERM: stopping", Duration::from_secs(10));
    let (code, out) = server.finish(Duration::from_secs(20));
    assert_eq!(code, 0, "serve after two SIGTERMs");
    assert!(json(&out)["updates"].as_u64().is_some_and(|u| u > 0), "{out}");
    assert!(std::fs::metadata(&ckpt).is_ok_and(|m| m.len() > 0), "checkpoint written");
    for w in workers {
        let (code, out) = w.finish(Duration::from_secs(10));
        assert_eq!(code, 0, "a worker told to stop");
        assert!(out.contains("stopped by the server"), "{out}");
    }
    let _ = std::fs::remove_dir_all(&dir);
}

/// A server stopped while one of its two workers has connected: the run never started, so
/// its summary reports no time.
#[test]
fn a_server_stopped_before_every_worker_came_reports_no_time() {
    let (server, addr) = serve(&["--workers", "2", "--steps", "100000000"]);
    let _worker = work(&addr, 0, &[]);
    server.wait_err("worker 0 connected", Duration::from_secs(20));
    server.signal("INT");
    let (code, out) = server.finish(Duration::from_secs(20));
    assert_eq!(code, 0);
    assert!(out.contains("wall time      0.000 s"), "{out}");
}

#[test]
fn a_server_stopped_before_its_workers_came_says_the_run_never_started() {
    let (server, _addr) = serve(&["--workers", "2", "--json"]);
    server.signal("TERM");
    server.wait_err("the run never started", Duration::from_secs(10));
    let (code, out) = server.finish(Duration::from_secs(20));
    assert_eq!(code, 0);
    assert_eq!(json(&out)["time_s"].as_f64(), Some(0.0), "{out}");
}

/// Two `work --id 0`: the sessions replace each other twice, then the third claim is
/// refused and that process exits 2 naming the cause; the run finishes with the other.
#[test]
fn two_processes_claiming_one_worker_id_are_told_so() {
    let (server, addr) = serve(&["--workers", "2", "--steps", "300", "--json"]);
    let first = work(&addr, 0, &["--step-ms", "1"]);
    first.wait_err("connected to", Duration::from_secs(20));
    let second = work(&addr, 0, &["--step-ms", "1"]);
    let told = |p: &Proc| p.lines().iter().any(|l| l.contains("claim this worker id"));
    let end = std::time::Instant::now() + Duration::from_secs(20);
    while !(told(&first) || told(&second)) {
        assert!(std::time::Instant::now() < end, "no process was told: {:#?} {:#?}", first.lines(), second.lines());
        std::thread::sleep(Duration::from_millis(10));
    }
    let other = work(&addr, 1, &["--step-ms", "1"]);
    let (code, _) = server.finish(Duration::from_secs(60));
    assert_eq!(code, 0);
    let codes: Vec<i32> = [first, second].map(|p| p.finish(Duration::from_secs(20)).0).to_vec();
    codes.iter().for_each(|c| assert!(*c == 0 || *c == 2, "{codes:?}"));
    assert_eq!(codes.iter().filter(|c| **c == 2).count(), 1, "exactly one process refused: {codes:?}");
    assert_eq!(other.finish(Duration::from_secs(20)).0, 0);
}
