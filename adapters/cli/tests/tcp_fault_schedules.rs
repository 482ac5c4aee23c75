//! Seeded fault schedules on real processes over loopback, for every protocol: while a
//! `serve` and three `work` processes train, workers are frozen (SIGSTOP, then SIGCONT: past
//! `--lost-after` the server declares them lost and they rejoin), killed with SIGKILL and
//! started again. At the end the conservation ledger is checked across the processes: every
//! contribution a worker wrote was read by the server from one of its sessions (received,
//! discarded with a replaced session, or in flight at the stop), the server's received ones
//! were accepted or refused, and `sent = applied + dropped + held + in flight + lost`, so
//! nothing was applied twice and nothing vanished; no run outlives its time limit.
//!
//! The CI version runs one short schedule per protocol; `every_protocol_survives_many_fault_schedules`
//! (`--ignored`) runs many.

#[path = "../../../tests/src/ledger.rs"]
#[allow(dead_code, unreachable_pub)]
mod ledger;

#[path = "procs/mod.rs"]
mod procs;

use core::time::Duration;
use ledger::{Ledger, Loss};
use procs::Proc;
use std::thread;
use std::time::Instant;
use syncopate::rng::Rng;

const N: u32 = 3;
const PROTOCOLS: [&str; 8] = ["bsp", "asp", "ssp", "bap", "backup", "dbw", "wbsp", "grouped"];
/// The server's time limit, seconds: a run that does not finish its budget stops here.
const TIME_LIMIT: u64 = 40;

fn serve(args: &[&str]) -> (Proc, String) {
    let p = Proc::spawn(&[&["serve", "--listen", "127.0.0.1:0"][..], args].concat());
    let line = p.wait_err("listening on ", Duration::from_secs(20));
    let addr = line.split("listening on ").nth(1).unwrap().split([' ', ',']).next().unwrap().to_owned();
    (p, addr)
}

fn work(addr: &str, id: u32) -> Proc {
    let id = id.to_string();
    Proc::spawn(&["work", "--connect", addr, "--id", &id, "--give-up-after", "3", "--lost-after", "1", "--json"])
}

fn json(s: &str) -> serde_json::Value {
    serde_json::from_str(s.trim()).unwrap_or_else(|e| panic!("{e}: {s}"))
}

fn knobs(protocol: &'static str) -> Vec<&'static str> {
    let mut k = vec!["--protocol", protocol, "--workers", "3", "--model", "softmax"];
    match protocol {
        "backup" => k.extend(["--backup-workers", "1"]),
        "ssp" | "bap" => k.extend(["--staleness", "2"]),
        _ => {}
    }
    k
}

/// One process of a worker id, with the session epochs it logged.
struct Incarnation {
    epochs: Vec<u32>,
    /// Its report, if it exited on its own (a killed one has none).
    report: Option<serde_json::Value>,
}

/// Runs one schedule of `protocol` drawn from `seed`; panics on a broken ledger or a hang.
fn schedule(protocol: &'static str, seed: u64, steps: u64) -> String {
    let mut rng = Rng::new(seed);
    let started = Instant::now();
    let steps_arg = steps.to_string();
    let limit = TIME_LIMIT.to_string();
    let mut args = vec!["--steps", &steps_arg, "--json", "--time-limit", &limit, "--lost-after", "1"];
    args.extend(knobs(protocol));
    let (server, addr) = serve(&args);
    let mut workers: Vec<Proc> = (0..N).map(|i| work(&addr, i)).collect();
    let mut gone: Vec<Vec<Incarnation>> = (0..N).map(|_| Vec::new()).collect();
    server.wait_err("version", Duration::from_secs(20));
    let mut story = Vec::new();
    for _ in 0..2 {
        thread::sleep(Duration::from_millis(50 + rng.below(250)));
        if server.lines().iter().any(|l| l.contains("finished")) {
            break;
        }
        let w = rng.below(u64::from(N)) as usize;
        if rng.below(2) == 0 {
            let frozen = 200 + rng.below(1600);
            workers[w].signal("STOP");
            thread::sleep(Duration::from_millis(frozen));
            workers[w].signal("CONT");
            story.push(format!("stop {w} {frozen} ms"));
        } else {
            let mut killed = core::mem::replace(&mut workers[w], work(&addr, w as u32));
            killed.kill9();
            gone[w].push(Incarnation { epochs: killed.epochs(), report: None });
            story.push(format!("kill {w}"));
        }
    }
    let (code, out) = server.finish(Duration::from_secs(TIME_LIMIT + 30));
    assert_eq!(code, 0, "{protocol} seed {seed} ({story:?}): serve");
    assert!(started.elapsed() < Duration::from_secs(TIME_LIMIT + 20), "{protocol} seed {seed}: ran past its limit");
    for (i, mut w) in workers.into_iter().enumerate() {
        let end = Instant::now() + Duration::from_secs(40);
        while w.child.try_wait().unwrap().is_none() && Instant::now() < end {
            thread::sleep(Duration::from_millis(10));
        }
        thread::sleep(Duration::from_millis(50));
        let (epochs, lines) = (w.epochs(), w.lines());
        let (code, out) = w.finish(Duration::from_secs(5));
        if code == 0 {
            gone[i].push(Incarnation { epochs, report: Some(json(&out)) });
            continue;
        }
        // A worker frozen past the end of the run finds no server when it wakes up and gives
        // up: like a killed one, what it wrote is what the server read from its sessions.
        let gave_up = lines.iter().any(|l| l.contains("gave up after"));
        let frozen = story.iter().any(|e| e.starts_with(&format!("stop {i} ")));
        assert!(gave_up && frozen, "{protocol} seed {seed} ({story:?}): work {i} exited {code}: {lines:#?}");
        gone[i].push(Incarnation { epochs, report: None });
    }
    let summary = json(&out);
    let sessions = summary["ledger"]["sessions"].as_array().unwrap().clone();
    let read = |w: usize, epochs: &[u32]| -> u64 {
        sessions
            .iter()
            .filter(|s| s["worker"] == w as u64 && epochs.contains(&(s["epoch"].as_u64().unwrap() as u32)))
            .map(|s| {
                ["received", "discarded", "in_flight_at_stop"].iter().map(|k| s[*k].as_u64().unwrap()).sum::<u64>()
            })
            .sum()
    };
    let mut ledger = Ledger::from_summary_json(&summary["gradients"]).unwrap();
    for (w, incarnations) in gone.iter().enumerate() {
        for inc in incarnations {
            let server_read = read(w, &inc.epochs);
            match &inc.report {
                Some(r) => {
                    let wrote = r["sent"].as_u64().unwrap() + r["resent"].as_u64().unwrap();
                    assert_eq!(wrote, server_read, "{protocol} seed {seed} ({story:?}): worker {w} wrote {r}");
                    ledger.sent += wrote;
                }
                // A killed process's counters died with it: what it wrote is what the kernel
                // delivered, which the server read.
                None => ledger.sent += server_read,
            }
        }
    }
    let l = &summary["ledger"];
    ledger.in_flight = l["in_flight_at_stop"].as_u64().unwrap();
    ledger.add_lost(Loss::Refused, l["refused"].as_u64().unwrap());
    ledger.add_lost(Loss::ConnectionLost, l["discarded"].as_u64().unwrap());
    assert_eq!(
        l["received"].as_u64().unwrap(),
        ledger.accepted + l["refused"].as_u64().unwrap(),
        "{protocol} seed {seed}: received = accepted + refused"
    );
    ledger.check().unwrap_or_else(|e| panic!("{protocol} seed {seed} ({story:?}): {e}"));
    format!("{protocol} seed {seed} [{}] {:.1} s: {}", story.join(", "), started.elapsed().as_secs_f64(), ledger.line())
}

#[test]
fn every_protocol_keeps_its_ledger_through_a_fault_schedule() {
    for (i, protocol) in PROTOCOLS.into_iter().enumerate() {
        eprintln!("{}", schedule(protocol, 1000 + i as u64, 60));
    }
}

/// Many schedules: `SYNCOPATE_FAULT_SCHEDULES` per protocol (default 40).
#[test]
#[ignore = "long: many seeded schedules per protocol"]
fn every_protocol_survives_many_fault_schedules() {
    let per: u64 = std::env::var("SYNCOPATE_FAULT_SCHEDULES").ok().and_then(|v| v.parse().ok()).unwrap_or(40);
    let started = Instant::now();
    for protocol in PROTOCOLS {
        for seed in 0..per {
            eprintln!("{}", schedule(protocol, seed, 60));
        }
    }
    eprintln!("{} schedules in {:.0} s", per * PROTOCOLS.len() as u64, started.elapsed().as_secs_f64());
}
