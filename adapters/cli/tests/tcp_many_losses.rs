//! Several workers lost in one pass, with real processes on loopback, for every protocol of
//! `ProtocolKind::ALL`: two or more `work` processes killed with one `kill -9` (the server
//! finds their connections closed together), or frozen with one `kill -STOP` past
//! `--lost-after` (their silence runs out together). Every one of them is logged lost and
//! counted (`ledger.workers_lost`); a protocol that goes on without them finishes its budget
//! (ASP, SSP, BAP, WBSP, DBW, backup while at most `b` are lost, grouped while one group keeps
//! all its members), the others report a stall naming a lost worker and end at their time
//! limit. The surviving workers end on the server's `Stop`. Every process is bounded by a deadline and killed on failure.
//!
//! The CI version runs every protocol once, the ways taking turns (two workers of four
//! killed, three frozen); `every_protocol_loses_many_workers_at_once` (`--ignored`) loses
//! two to four of five each way, for every protocol.

#[path = "procs/mod.rs"]
mod procs;

use core::time::Duration;
use procs::{Proc, serve};
use std::process::Command;
use std::thread;
use std::time::Instant;
use syncopate::ProtocolKind;

/// How the workers are lost.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Loss {
    /// One `kill -9` for all of them: their connections close together.
    Kill,
    /// One `kill -STOP` for all of them: silent together past `--lost-after`.
    Freeze,
}

fn work(addr: &str, id: u32) -> Proc {
    let id = id.to_string();
    let args = ["work", "--connect", addr, "--id", &id, "--give-up-after", "3", "--lost-after", "1"];
    Proc::spawn(&[&args[..], &["--step-ms", "5", "--json"]].concat())
}

/// One signal to several processes at the same instant (one `kill` system call each, from
/// one command, with nothing in between).
fn signal_all(signal: &str, procs: &[&Proc]) {
    let pids: Vec<String> = procs.iter().map(|p| p.child.id().to_string()).collect();
    let status = Command::new("kill").arg(format!("-{signal}")).args(&pids).status();
    assert!(status.is_ok_and(|s| s.success()), "kill -{signal} {pids:?}");
}

/// The groups of the grouped protocol: worker `i` of `n` is in group `⌊i·g/n⌋`.
fn group_of(i: u32, n: u32, g: u32) -> u32 {
    i * g / n
}

/// What `kind` (with this test's knobs) promises with the workers `lost` of `n` gone for
/// good.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Promise {
    /// It finishes its budget without them.
    GoesOn,
    /// It waits for them: it reports a stall naming one and ends at its time limit.
    Stalls,
}

fn promise(kind: ProtocolKind, n: u32, lost: &[u32]) -> Promise {
    let live = n - lost.len() as u32;
    let goes_on = match kind {
        ProtocolKind::Bsp => false,
        ProtocolKind::Backup => lost.len() as u32 <= BACKUP_WORKERS,
        ProtocolKind::Grouped => (0..GROUPS).any(|g| !lost.iter().any(|w| group_of(*w, n, GROUPS) == g)),
        ProtocolKind::Asp
        | ProtocolKind::Ssp
        | ProtocolKind::Bap
        | ProtocolKind::Wbsp
        | ProtocolKind::WbspOverlap
        | ProtocolKind::Dbw => live > 0,
    };
    if goes_on { Promise::GoesOn } else { Promise::Stalls }
}

const BACKUP_WORKERS: u32 = 1;
const DBW_K_MIN: u32 = 2;
const GROUPS: u32 = 2;

/// Whether `kind` reports a stall (`--stall-report`).
fn reports_stalls(kind: ProtocolKind) -> bool {
    !matches!(kind, ProtocolKind::Asp | ProtocolKind::Wbsp | ProtocolKind::WbspOverlap)
}

/// Runs `kind` with `n` workers, loses `lost` together by `how`; checks every loss is
/// logged and counted, and the run finishes its budget if the protocol goes on without
/// them (or reports the stall and ends at its time limit if it does not).
fn lose_together(kind: ProtocolKind, n: u32, lost: &[u32], how: Loss) -> String {
    let name = kind.as_str();
    let started = Instant::now();
    let promise = promise(kind, n, lost);
    // A run that goes on finishes long before its limit; one that stalls ends there.
    let limit = match promise {
        Promise::GoesOn => "40",
        Promise::Stalls => "4",
    };
    let workers = n.to_string();
    let mut args = vec!["--protocol", name, "--workers", &workers, "--steps", "150", "--json", "--time-limit", limit];
    args.extend(["--lost-after", "1"]);
    if reports_stalls(kind) {
        args.extend(["--stall-report", "300"]);
    }
    let (backup, k_min, groups) = (BACKUP_WORKERS.to_string(), DBW_K_MIN.to_string(), GROUPS.to_string());
    match kind {
        ProtocolKind::Backup => args.extend(["--backup-workers", &backup]),
        ProtocolKind::Dbw => args.extend(["--k-min", &k_min]),
        ProtocolKind::Grouped => args.extend(["--groups", &groups]),
        ProtocolKind::Ssp | ProtocolKind::Bap => args.extend(["--staleness", "2"]),
        _ => {}
    }
    let (server, addr) = serve(&args);
    let mut workers: Vec<Option<Proc>> = (0..n).map(|i| Some(work(&addr, i))).collect();
    server.wait_err("connected after", Duration::from_secs(20));
    server.wait_err("version", Duration::from_secs(20));
    thread::sleep(Duration::from_millis(150));
    let victims: Vec<&Proc> = lost.iter().map(|w| workers[*w as usize].as_ref().unwrap()).collect();
    let signal = if how == Loss::Kill { "KILL" } else { "STOP" };
    signal_all(signal, &victims);
    for w in lost {
        server.wait_err(&format!("worker {w} lost"), Duration::from_secs(10));
    }
    let named_stall = |server: &Proc| {
        let line = server.wait_err("stalled: waiting for worker ", Duration::from_secs(10));
        let named: u32 = line.split("waiting for worker ").nth(1).unwrap().split(' ').next().unwrap().parse().unwrap();
        assert!(lost.contains(&named), "{name}: the stall names worker {named}, not a lost one: {line}");
    };
    if promise == Promise::Stalls && reports_stalls(kind) {
        named_stall(&server);
    }
    let end = server.wait_err("serve: finished (", Duration::from_secs(60));
    let went_on = end.contains("finished (Budget)");
    let want = match promise {
        Promise::GoesOn => went_on,
        Promise::Stalls => end.contains("finished (TimeLimit)"),
    };
    assert!(want, "{name}, {how:?} {lost:?} of {n}: {end}, expected {promise:?}: {:#?}", server.lines());
    let (code, out) = server.finish(Duration::from_secs(30));
    assert_eq!(code, 0, "{name}: serve");
    let summary: serde_json::Value = serde_json::from_str(out.trim()).unwrap_or_else(|e| panic!("{e}: {out}"));
    let counted = summary["ledger"]["workers_lost"].as_u64().unwrap();
    assert!(counted >= lost.len() as u64, "{name}: {counted} losses counted, {} workers lost", lost.len());
    // Woken up, a frozen worker finds its session gone and then no server; it gives up.
    for w in lost {
        let p = workers[*w as usize].take().unwrap();
        if how == Loss::Freeze {
            p.signal("CONT");
        }
        drop(p);
    }
    for (i, w) in workers.into_iter().enumerate() {
        let Some(w) = w else { continue };
        let (code, out) = w.finish(Duration::from_secs(20));
        assert_eq!(code, 0, "{name}: work {i}");
        assert!(out.contains("\"stopped\":true"), "{name}: worker {i} not stopped by the server: {out}");
    }
    format!(
        "{name}: {how:?} {lost:?} of {n}: {counted} losses counted, {}, {:.1} s",
        if went_on { "went on to its budget" } else { "stalled to its time limit" },
        started.elapsed().as_secs_f64()
    )
}

/// Every protocol once, the ways taking turns: two workers of four killed at once, or three
/// frozen together.
#[test]
fn several_workers_lost_in_one_pass_for_every_protocol() {
    for (i, kind) in ProtocolKind::ALL.into_iter().enumerate() {
        let line = if i % 2 == 0 {
            lose_together(kind, 4, &[2, 3], Loss::Kill)
        } else {
            lose_together(kind, 4, &[1, 2, 3], Loss::Freeze)
        };
        eprintln!("{line}");
    }
}

/// Two to four workers of five, each way, for every protocol.
#[test]
#[ignore = "long: every protocol, several loss sets each way"]
fn every_protocol_loses_many_workers_at_once() {
    let sets: [&[u32]; 4] = [&[0, 4], &[1, 2], &[0, 2, 3], &[1, 2, 3, 4]];
    for kind in ProtocolKind::ALL {
        for lost in sets {
            for how in [Loss::Kill, Loss::Freeze] {
                eprintln!("{}", lose_together(kind, 5, lost, how));
            }
        }
    }
}
