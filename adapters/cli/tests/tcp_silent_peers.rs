//! Silent peers over TCP, with real processes: a worker frozen with SIGSTOP sends nothing,
//! not even its heartbeats, so `serve --lost-after` declares it lost; a protocol that goes
//! on without a lost worker (SSP) finishes its budget, and BSP reports whom it waits for;
//! woken up, the worker says it was the one stopped.
//! Every process is bounded by a deadline and killed on failure.

#[path = "procs/mod.rs"]
mod procs;

use core::time::Duration;
use procs::{Proc, json, serve};

fn work(addr: &str, id: u32) -> Proc {
    let id = id.to_string();
    Proc::spawn(&["work", "--connect", addr, "--id", &id, "--give-up-after", "10", "--lost-after", "1"])
}

#[test]
fn a_stopped_worker_is_lost_after_lost_after_and_ssp_finishes_without_it() {
    let args = ["--protocol", "ssp", "--workers", "3", "--steps", "300", "--time-limit", "60", "--json"];
    let (server, addr) = serve(&[&args[..], &["--lost-after", "1"]].concat());
    let mut workers: Vec<Proc> = (0..3).map(|i| work(&addr, i)).collect();
    server.wait_err("version", Duration::from_secs(20));
    workers[1].signal("STOP");
    let line = server.wait_err("worker 1 lost", Duration::from_secs(10));
    assert!(line.contains("silent for 1.0 s"), "{line}");
    let (code, out) = server.finish(Duration::from_secs(60));
    assert_eq!(code, 0);
    let summary = json(&out);
    assert!(summary["gradients"]["accepted"].as_u64().unwrap() >= 900, "{out}");
    // Woken up, the worker finds its session gone and reconnects to a server that is gone.
    let stopped = workers.remove(1);
    stopped.signal("CONT");
    let _ = stopped.finish(Duration::from_secs(30));
    for w in workers {
        let (code, out) = w.finish(Duration::from_secs(10));
        assert_eq!(code, 0);
        assert!(out.contains("stopped by the server"), "{out}");
    }
}

#[test]
fn a_stopped_worker_stalls_bsp_naming_it_until_the_time_limit() {
    let args = ["--protocol", "bsp", "--workers", "3", "--steps", "100000", "--time-limit", "4", "--json"];
    let (server, addr) = serve(&[&args[..], &["--lost-after", "1", "--stall-report", "200"]].concat());
    let mut workers: Vec<Proc> = (0..3).map(|i| work(&addr, i)).collect();
    server.wait_err("version", Duration::from_secs(20));
    workers[2].signal("STOP");
    server.wait_err("worker 2 lost", Duration::from_secs(10));
    server.wait_err("stalled: waiting for worker 2 (1 missing)", Duration::from_secs(5));
    let (code, out) = server.finish(Duration::from_secs(20));
    assert_eq!(code, 0);
    assert!(json(&out)["stalls"].as_u64().unwrap() >= 1, "{out}");
    let stopped = workers.remove(2);
    stopped.signal("CONT");
    let _ = stopped.finish(Duration::from_secs(30));
    for w in workers {
        assert_eq!(w.finish(Duration::from_secs(10)).0, 0);
    }
}

#[test]
fn a_stopped_server_is_lost_by_its_workers() {
    let args = ["--protocol", "asp", "--workers", "1", "--steps", "100000", "--time-limit", "30"];
    let (server, addr) = serve(&[&args[..], &["--lost-after", "1"]].concat());
    let worker = work(&addr, 0);
    server.wait_err("version", Duration::from_secs(20));
    server.signal("STOP");
    let line = worker.wait_err("server was silent for 1.0 s", Duration::from_secs(10));
    assert!(line.contains("worker 0"), "{line}");
    server.signal("CONT");
    server.signal("TERM");
    let _ = server.finish(Duration::from_secs(20));
    let _ = worker.finish(Duration::from_secs(30));
}

#[test]
fn a_worker_woken_from_sigstop_says_it_was_stopped_and_does_not_blame_the_server() {
    let args = ["--protocol", "asp", "--workers", "1", "--steps", "100000", "--time-limit", "30"];
    let (server, addr) = serve(&[&args[..], &["--lost-after", "1"]].concat());
    let worker = work(&addr, 0);
    server.wait_err("version", Duration::from_secs(20));
    worker.signal("STOP");
    std::thread::sleep(Duration::from_millis(2500));
    worker.signal("CONT");
    let line = worker.wait_err("this worker was stopped for", Duration::from_secs(10));
    assert!(line.contains("worker 0") && line.contains("1.0 s silence limit"), "{line}");
    // The server counted it as lost meanwhile; the worker finds out by reading, not by
    // judging the server silent over time it did not run.
    server.wait_err("worker 0 lost", Duration::from_secs(10));
    std::thread::sleep(Duration::from_millis(1500));
    let blamed = worker.lines().into_iter().filter(|l| l.contains("server was silent")).collect::<Vec<_>>();
    assert!(blamed.is_empty(), "{blamed:#?}");
    server.signal("TERM");
    let _ = server.finish(Duration::from_secs(20));
    let _ = worker.finish(Duration::from_secs(30));
}
