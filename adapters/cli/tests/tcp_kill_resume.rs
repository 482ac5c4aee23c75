//! Kill -9 in the middle of real multi-process runs on loopback, for BSP, backup, SSP and
//! WBSP, each followed by a restart, with the conservation ledger checked at the end:
//!
//! - a worker process killed with SIGKILL and started again (it rejoins with a new epoch): for
//!   every surviving process, the contributions it wrote equal what the server read from its
//!   sessions (received, discarded with a replaced session, or in flight at the stop); the
//!   killed process's are what the server read from its sessions (the kernel delivers what it
//!   wrote; its counters died with it); and the whole run balances: `sent = applied + dropped
//!   + held + in flight + lost (refused, connection)`.
//! - the server killed with SIGKILL between two checkpoints and restarted with `--resume` on
//!   the same port: the workers reconnect; the resumed server names exactly the versions made
//!   after its checkpoint (from the checkpoint's journal: they start right after the
//!   checkpoint's version and end at the newest version any worker computed on, or one past
//!   it), their contributions equal what the journal's totals say was applied after the
//!   checkpoint (and, for the synchronous protocols, versions × k), and what the workers wrote
//!   balances with both servers' counts, the rest (held or unread when the server died) being
//!   at most a few per worker.
//!
//! Small model (softmax on digits), 3 workers, every process bounded by a deadline.

#[path = "../../../tests/src/ledger.rs"]
#[allow(dead_code, unreachable_pub)]
mod ledger;

#[path = "procs/mod.rs"]
mod procs;

mod resume;

use core::time::Duration;
use ledger::{Ledger, Loss};
use procs::{Proc, json, serve_as_given};
use resume::{check_ledger_across_kill, has_update, knobs, wait_for_checkpoint};
use std::path::PathBuf;
use std::thread;

const N: u32 = 3;

fn work(addr: &str, id: u32) -> Proc {
    let id = id.to_string();
    Proc::spawn(&["work", "--connect", addr, "--id", &id, "--give-up-after", "20", "--step-ms", "20", "--json"])
}

/// Per session: received + discarded + in flight at the stop.
fn session_total(s: &serde_json::Value) -> u64 {
    ["received", "discarded", "in_flight_at_stop"].iter().map(|k| s[*k].as_u64().unwrap()).sum()
}

/// A worker process's copies written (new and retransmitted contributions).
fn written(report: &serde_json::Value) -> u64 {
    report["sent"].as_u64().unwrap() + report["resent"].as_u64().unwrap()
}

fn kill_a_worker_then_restart_it(protocol: &'static str) {
    let mut args = vec!["--listen", "127.0.0.1:0", "--steps", "80", "--json", "--time-limit", "60"];
    args.extend(knobs(protocol));
    let (server, addr) = serve_as_given(&args);
    let mut workers: Vec<Option<Proc>> = (0..N).map(|i| Some(work(&addr, i))).collect();
    server.wait_err("version", Duration::from_secs(20));
    thread::sleep(Duration::from_millis(200));
    let mut killed = workers[1].take().unwrap();
    killed.kill9();
    let killed_epochs = killed.epochs();
    server.wait_err("worker 1 lost", Duration::from_secs(10));
    workers[1] = Some(work(&addr, 1));
    let (code, out) = server.finish(Duration::from_secs(90));
    assert_eq!(code, 0, "{protocol}: serve");
    let summary = json(&out);
    let sessions = summary["ledger"]["sessions"].as_array().unwrap().clone();
    let of = |w: u32, epochs: &[u32]| -> u64 {
        sessions
            .iter()
            .filter(|s| s["worker"] == w && epochs.contains(&(s["epoch"].as_u64().unwrap() as u32)))
            .map(session_total)
            .sum()
    };
    let mut ledger = Ledger::from_summary_json(&summary["gradients"]).unwrap();
    let killed_sent = of(1, &killed_epochs);
    assert!(killed_sent > 0, "{protocol}: the killed worker had sent something: {sessions:?}");
    ledger.sent = killed_sent;
    for (i, w) in workers.into_iter().enumerate() {
        let w = w.unwrap();
        let epochs = w.epochs();
        let (code, out) = w.finish(Duration::from_secs(20));
        assert_eq!(code, 0, "{protocol}: work {i}");
        let report = json(&out);
        assert!(report["stopped"].as_bool().unwrap(), "{protocol}: worker {i} stopped by the server");
        let read = of(i as u32, &epochs);
        assert_eq!(written(&report), read, "{protocol}: worker {i} wrote {report} but the server read {read}");
        ledger.sent += written(&report);
    }
    let l = &summary["ledger"];
    ledger.in_flight = l["in_flight_at_stop"].as_u64().unwrap();
    ledger.add_lost(Loss::Refused, l["refused"].as_u64().unwrap());
    ledger.add_lost(Loss::ConnectionLost, l["discarded"].as_u64().unwrap());
    assert_eq!(
        l["received"].as_u64().unwrap(),
        ledger.accepted + l["refused"].as_u64().unwrap(),
        "{protocol}: received = accepted + refused"
    );
    eprintln!("{protocol}, worker 1 killed and restarted: {}", ledger.line());
    ledger.check().unwrap_or_else(|e| panic!("{protocol}: {e}"));
}

fn kill_the_server_then_resume(protocol: &'static str) {
    let dir = std::env::temp_dir().join(format!("syncopate-kill-{protocol}-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let ckpt = dir.join("m.ckpt");
    let ck = ckpt.to_str().unwrap();
    let mut args = vec!["--steps", "100000", "--json", "--time-limit", "60", "--checkpoint", ck];
    args.extend(["--checkpoint-every", "4"]);
    args.extend(knobs(protocol));
    let (mut server, addr) = serve_as_given(&[&["--listen", "127.0.0.1:0"][..], &args].concat());
    let workers: Vec<Proc> = (0..N).map(|i| work(&addr, i)).collect();
    // Kill it between two checkpoints: once a checkpoint was written and updates followed.
    wait_for_checkpoint(&ckpt, 1, has_update);
    server.kill9();
    drop(server);
    // Each worker notices and logs the newest version it computed on.
    let mut seen = 0;
    for w in &workers {
        let line = w.wait_err("connection lost", Duration::from_secs(20));
        let v = line.split("computed on: version ").nth(1).and_then(|r| r.split(')').next()?.parse().ok());
        seen = seen.max(v.unwrap_or(0));
    }
    let mut resume = vec!["--listen", addr.as_str(), "--resume", "--steps", "40", "--json", "--time-limit", "60"];
    resume.extend(["--checkpoint", ck, "--checkpoint-every", "4"]);
    resume.extend(knobs(protocol));
    let (resumed, _) = serve_as_given(&resume);
    let line = resumed.wait_err("serve: resumed: ", Duration::from_secs(5));
    let (code, out) = resumed.finish(Duration::from_secs(90));
    assert_eq!(code, 0, "{protocol}: resumed serve");
    let summary = json(&out);
    let r = &summary["ledger"]["resumed"];
    let ckpt_v = r["checkpoint_version"].as_u64().unwrap();
    let [first, last] = [r["lost_versions"][0].as_u64().unwrap(), r["lost_versions"][1].as_u64().unwrap()];
    eprintln!("{protocol}: {line} (workers had computed on up to version {seen})");
    assert!(ckpt_v >= 4 && ckpt_v % 4 == 0, "{protocol}: checkpoint version {ckpt_v}");
    assert_eq!(first, ckpt_v + 1, "{protocol}: the lost versions start right after the checkpoint");
    assert!(last >= seen, "{protocol}: workers computed on version {seen}, beyond the lost {first}..={last}");
    if protocol != "ssp" && protocol != "wbsp" {
        // Every version is broadcast when made: the newest a worker saw is the last or the one before.
        assert!(last <= seen + 1, "{protocol}: lost up to {last}, but workers saw only {seen}");
    }
    let at = |k: &str, i: usize| r[k][i].as_u64().unwrap();
    let lost = r["lost_contributions"].as_u64().unwrap();
    assert_eq!(
        lost,
        at("at_last_update", 2) - at("at_checkpoint", 2),
        "{protocol}: lost = applied after the checkpoint"
    );
    let by_worker: u64 = r["lost_by_worker"].as_array().unwrap().iter().map(|x| x.as_u64().unwrap()).sum();
    assert_eq!(by_worker, lost);
    match protocol {
        "bsp" => assert_eq!(lost, (last - first + 1) * u64::from(N)),
        "backup" => assert_eq!(lost, (last - first + 1) * u64::from(N - 1)),
        _ => assert!(lost > last - first, "at least one contribution per lost version"),
    }
    // The ledger across the kill.
    let mut sent = 0;
    for (i, w) in workers.into_iter().enumerate() {
        let (code, out) = w.finish(Duration::from_secs(30));
        assert_eq!(code, 0, "{protocol}: work {i}");
        sent += written(&json(&out));
    }
    check_ledger_across_kill(&summary, sent, 4 * u64::from(N), &format!("{protocol}, server killed and resumed"));
    let _ = std::fs::remove_dir_all(&dir);
}

#[test]
fn bsp_worker_killed_and_restarted() {
    kill_a_worker_then_restart_it("bsp");
}

#[test]
fn backup_worker_killed_and_restarted() {
    kill_a_worker_then_restart_it("backup");
}

#[test]
fn ssp_worker_killed_and_restarted() {
    kill_a_worker_then_restart_it("ssp");
}

#[test]
fn wbsp_worker_killed_and_restarted() {
    kill_a_worker_then_restart_it("wbsp");
}

#[test]
fn bsp_server_killed_and_resumed() {
    kill_the_server_then_resume("bsp");
}

#[test]
fn backup_server_killed_and_resumed() {
    kill_the_server_then_resume("backup");
}

#[test]
fn ssp_server_killed_and_resumed() {
    kill_the_server_then_resume("ssp");
}

#[test]
fn wbsp_server_killed_and_resumed() {
    kill_the_server_then_resume("wbsp");
}

fn temp_dir(name: &str) -> PathBuf {
    let dir = std::env::temp_dir().join(format!("syncopate-{name}-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).unwrap();
    dir
}

#[test]
fn a_resumed_run_ends_at_the_whole_runs_steps_budget() {
    let dir = temp_dir("budget");
    let ckpt = dir.join("m.ckpt");
    let ck = ckpt.to_str().unwrap();
    let mut args = vec!["--steps", "60", "--json", "--time-limit", "60", "--checkpoint", ck];
    args.extend(["--checkpoint-every", "2"]);
    args.extend(knobs("bsp"));
    let (mut server, addr) = serve_as_given(&[&["--listen", "127.0.0.1:0"][..], &args].concat());
    let workers: Vec<Proc> = (0..N).map(|i| work(&addr, i)).collect();
    wait_for_checkpoint(&ckpt, 10, |_| true);
    server.kill9();
    drop(server);
    let (resumed, _) = serve_as_given(&[&["--listen", addr.as_str(), "--resume"][..], &args].concat());
    let line = resumed.wait_err("whole run's budget", Duration::from_secs(10));
    assert!(line.contains("--steps 60 is the whole run's budget (180 gradients)"), "{line}");
    let (code, out) = resumed.finish(Duration::from_secs(60));
    assert_eq!(code, 0, "resumed serve");
    // BSP makes one version of 3 gradients per step: the whole run ends at version 60, not
    // 60 steps past the checkpoint.
    let updates = json(&out)["updates"].as_u64().unwrap();
    assert!((60..=61).contains(&updates), "the resumed run ended at version {updates}, the budget is 60 steps");
    for w in workers {
        let (code, _) = w.finish(Duration::from_secs(30));
        assert_eq!(code, 0, "work");
    }
    let _ = std::fs::remove_dir_all(&dir);
}

#[test]
fn resume_refuses_a_checkpoint_of_other_settings_or_one_an_earlier_run_left() {
    let dir = temp_dir("identity");
    let ckpt = dir.join("m.ckpt");
    let ck = ckpt.to_str().unwrap();
    let mut args = vec!["--steps", "5", "--time-limit", "60", "--checkpoint", ck];
    args.extend(knobs("bsp"));
    // Run A finishes and leaves its checkpoint.
    let (a, addr) = serve_as_given(&[&["--listen", "127.0.0.1:0"][..], &args].concat());
    let workers: Vec<Proc> = (0..N).map(|i| work(&addr, i)).collect();
    assert_eq!(a.finish(Duration::from_secs(60)).0, 0, "run A");
    for w in workers {
        assert_eq!(w.finish(Duration::from_secs(30)).0, 0, "work");
    }
    // A model of the same size is another run's settings.
    let mut other = vec!["serve", "--listen", "127.0.0.1:0", "--resume", "--checkpoint", ck];
    other.extend(["--protocol", "bsp", "--workers", "3", "--model", "nqm:650"]);
    let p = Proc::spawn(&other);
    p.wait_err("other settings", Duration::from_secs(20));
    assert_eq!(p.finish(Duration::from_secs(20)).0, 2, "a checkpoint of another model is refused");
    // Run B starts on the same checkpoint and is killed before it writes one.
    let (mut b, _) = serve_as_given(&[&["--listen", "127.0.0.1:0"][..], &args].concat());
    b.kill9();
    drop(b);
    let resume = [&["serve", "--listen", "127.0.0.1:0", "--resume"][..], &args].concat();
    let p = Proc::spawn(&resume);
    let line = p.wait_err("started on this checkpoint after it", Duration::from_secs(20));
    assert!(line.contains("start the run afresh"), "{line}");
    assert_eq!(p.finish(Duration::from_secs(20)).0, 2, "run A's checkpoint is not run B's");
    let _ = std::fs::remove_dir_all(&dir);
}
