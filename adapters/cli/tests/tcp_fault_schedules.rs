//! Seeded fault schedules on real processes over loopback, for every protocol of
//! `ProtocolKind::ALL`: while a `serve` and three `work` processes train, workers are frozen
//! (SIGSTOP, then SIGCONT: past `--lost-after` the server declares them lost and they
//! rejoin), killed with SIGKILL and started again, and the server is killed with SIGKILL and
//! restarted with `--resume` from its checkpoint on the same address (the workers reconnect
//! by themselves). Every run finishes its budget: each protocol goes on once its workers are
//! back, and no run outlives its time limit.
//!
//! At the end the conservation ledger is checked across every process, session by session:
//! a worker logs how many contributions it wrote in each session that ended, and writes the
//! rest in its last one (its report's total), a killed worker's open session wrote what the
//! server read from it (the kernel delivers what it wrote). Per session with the final
//! server, what it read (received, discarded with a replaced session, or in flight at the
//! stop) is what was written, up to two frames a worker woken from a freeze wrote into a
//! connection the server had cut; the final server's received ones were accepted or refused;
//! the killed server's part comes from its checkpoint journal: applied up to the checkpoint
//! (kept), applied after it (rolled back: exactly the versions the journal names, which cover
//! every version a worker computed on), dropped, refused, held at the kill, and what it read
//! after its last journal line or never read (at most a few per worker). Then
//! `sent = applied + dropped + held + in flight + lost`: nothing applied twice, nothing
//! vanished.
//!
//! The CI version runs two short schedules per protocol, one of them with a server kill;
//! `every_protocol_survives_many_fault_schedules` (`--ignored`) runs many.

#[path = "../../../tests/src/ledger.rs"]
#[allow(dead_code, unreachable_pub)]
mod ledger;

#[path = "procs/mod.rs"]
mod procs;

mod resume;

use core::time::Duration;
use ledger::{Ledger, Loss};
use procs::{Proc, json, serve_as_given};
use resume::{add_killed_server, journal};
use std::thread;
use std::time::Instant;
use syncopate::ProtocolKind;
use syncopate::rng::Rng;

const N: u32 = 3;
/// The server's time limit, seconds: a run that does not finish its budget stops here.
const TIME_LIMIT: u64 = 40;
/// Model updates between checkpoints when the schedule kills the server.
const CHECKPOINT_EVERY: &str = "4";

fn work(addr: &str, id: u32) -> Proc {
    let id = id.to_string();
    Proc::spawn(&["work", "--connect", addr, "--id", &id, "--give-up-after", "5", "--lost-after", "1", "--json"])
}

fn knobs(kind: ProtocolKind) -> Vec<&'static str> {
    let mut k = vec!["--protocol", kind.as_str(), "--workers", "3", "--model", "softmax"];
    match kind {
        ProtocolKind::Backup => k.extend(["--backup-workers", "1"]),
        ProtocolKind::Ssp | ProtocolKind::Bap => k.extend(["--staleness", "2"]),
        _ => {}
    }
    k
}

/// Which server a session was with.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Server {
    /// The first server, killed with SIGKILL.
    Killed,
    /// The server that ran to the end (the first, or the one resumed after the kill).
    Last,
}

/// One session of a worker process, from its log.
#[derive(Debug)]
struct Session {
    epoch: u32,
    with: Server,
    /// Contributions written in it, logged when it ended (`None`: still open).
    written: Option<u64>,
}

/// One process of a worker id.
struct Incarnation {
    proc: Proc,
    /// Its stderr lines before this index were logged while the first server lived (only
    /// for a process running when the server was killed).
    killed_server_lines: usize,
    /// Killed with SIGKILL by the schedule.
    killed: bool,
}

impl Incarnation {
    fn sessions(&self) -> Vec<Session> {
        let mut out: Vec<Session> = Vec::new();
        for (i, line) in self.proc.lines().iter().enumerate() {
            if let Some(rest) = line.split("(epoch ").nth(1) {
                let epoch = rest.split(',').next().unwrap().parse().unwrap();
                let with = if i < self.killed_server_lines { Server::Killed } else { Server::Last };
                out.push(Session { epoch, with, written: None });
            } else if let Some(rest) = line.split("connection lost after ").nth(1) {
                let n = rest.split(' ').next().unwrap().parse().unwrap();
                let open = out.last_mut().filter(|s| s.written.is_none());
                open.unwrap_or_else(|| panic!("a session ended that never started: {line}")).written = Some(n);
            }
        }
        out
    }
}

/// Kills the server with SIGKILL and waits until every worker process noticed (it logged a
/// retry after its last connection): every line a worker logged until the next server
/// starts was logged while the killed one lived or after it died, so its sessions so far
/// were with the killed server.
fn kill_the_server(server: &mut Proc, workers: &mut [Incarnation]) {
    server.kill9();
    // Lines written before the kill are collected by now.
    thread::sleep(Duration::from_millis(100));
    for w in workers.iter_mut() {
        let end = Instant::now() + Duration::from_secs(10);
        loop {
            let lines = w.proc.lines();
            let last_connect = lines.iter().rposition(|l| l.contains("(epoch "));
            let retried = lines.iter().rposition(|l| l.contains("; retrying in "));
            if retried.is_some() && retried > last_connect {
                break;
            }
            assert!(Instant::now() < end, "a worker did not notice the server's death: {lines:#?}");
            thread::sleep(Duration::from_millis(5));
        }
    }
    for w in workers.iter_mut() {
        w.killed_server_lines = w.proc.lines().len();
    }
}

/// The newest version a worker computed on before losing its session with the killed
/// server (0 if it logged none).
fn newest_seen(inc: &Incarnation) -> u64 {
    let lines = inc.proc.lines();
    lines
        .iter()
        .take(inc.killed_server_lines)
        .filter_map(|l| l.split("computed on: version ").nth(1)?.split(')').next()?.parse().ok())
        .max()
        .unwrap_or(0)
}

/// Runs one schedule of `kind` drawn from `seed` (a server kill among its faults if
/// `kill_server`); panics on a broken ledger, a run that does not finish its budget or a
/// hang.
fn schedule(kind: ProtocolKind, seed: u64, steps: u64, kill_server: bool) -> String {
    let protocol = kind.as_str();
    let mut rng = Rng::new(seed);
    let started = Instant::now();
    let dir = std::env::temp_dir().join(format!("syncopate-faults-{protocol}-{seed}-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let ckpt = dir.join("m.ckpt");
    let ck = ckpt.to_str().unwrap();
    let (steps_arg, limit) = (steps.to_string(), TIME_LIMIT.to_string());
    let mut args = vec!["--json", "--time-limit", &limit, "--lost-after", "1"];
    args.extend(knobs(kind));
    if kill_server {
        args.extend(["--checkpoint", ck, "--checkpoint-every", CHECKPOINT_EVERY]);
    }
    // A server to be killed never ends on its own: the resumed one runs the budget.
    let first_steps = if kill_server { "100000" } else { &steps_arg };
    let (mut server, addr) =
        serve_as_given(&[&["--listen", "127.0.0.1:0", "--steps", first_steps][..], &args].concat());
    let mut live: Vec<Incarnation> =
        (0..N).map(|i| Incarnation { proc: work(&addr, i), killed_server_lines: 0, killed: false }).collect();
    let mut ended: Vec<Vec<Incarnation>> = (0..N).map(|_| Vec::new()).collect();
    server.wait_err("version", Duration::from_secs(20));
    // The server kill comes before worker event `kill_at` (2: after both); worker kills
    // only come after it, so every killed worker's sessions with the killed server ended
    // (and were logged) while it lived.
    let kill_at = kill_server.then(|| rng.below(3) as usize);
    let mut story = Vec::new();
    let mut seen = 0;
    for event in 0..=2 {
        if kill_at == Some(event) {
            // Between two checkpoints, right after an update: once a checkpoint was written and
            // updates followed, at the first to third new update from now (a server that
            // receives without updating for a while, as WBSP while it waits for a frozen
            // worker, would read more than its journal says before the kill).
            let end = Instant::now() + Duration::from_secs(20);
            let (mut last, mut fresh, wanted) = (String::new(), 0, 1 + rng.below(3));
            loop {
                let text = std::fs::read_to_string(journal(&ckpt)).unwrap_or_default();
                let first = text.lines().next().unwrap_or_default();
                let newest = text.strip_suffix('\n').and_then(|t| t.lines().last()).unwrap_or_default();
                if newest.starts_with("update") && newest != last {
                    last = newest.to_owned();
                    fresh += 1;
                }
                let checkpointed = first.starts_with("checkpoint") && !first.starts_with("checkpoint 0 ");
                if checkpointed && text.contains("\nupdate") && fresh > wanted {
                    break;
                }
                assert!(Instant::now() < end, "{protocol} seed {seed}: no checkpoint followed by updates: {text}");
                thread::sleep(Duration::from_micros(200));
            }
            kill_the_server(&mut server, &mut live);
            seen = live.iter().map(newest_seen).max().unwrap_or(0);
            let resume = ["--listen", &addr, "--steps", &steps_arg, "--resume"];
            let (resumed, _) = serve_as_given(&[&resume[..], &args].concat());
            server = resumed;
            story.push("server killed".to_owned());
        }
        if event == 2 {
            break;
        }
        thread::sleep(Duration::from_millis(50 + rng.below(250)));
        if server.lines().iter().any(|l| l.contains("finished")) {
            break;
        }
        let w = rng.below(u64::from(N)) as usize;
        let kill_allowed = kill_at.is_none_or(|k| event >= k);
        if rng.below(2) == 0 || !kill_allowed {
            let frozen = 200 + rng.below(1600);
            live[w].proc.signal("STOP");
            thread::sleep(Duration::from_millis(frozen));
            live[w].proc.signal("CONT");
            story.push(format!("stop {w} {frozen} ms"));
        } else {
            let fresh = Incarnation { proc: work(&addr, w as u32), killed_server_lines: 0, killed: false };
            let mut killed = core::mem::replace(&mut live[w], fresh);
            killed.proc.kill9();
            killed.killed = true;
            ended[w].push(killed);
            story.push(format!("kill {w}"));
        }
    }
    let end = server.wait_err("serve: finished (", Duration::from_secs(TIME_LIMIT + 30));
    assert!(end.contains("finished (Budget)"), "{protocol} seed {seed} ({story:?}): {end}");
    let (code, out) = server.finish(Duration::from_secs(30));
    assert_eq!(code, 0, "{protocol} seed {seed} ({story:?}): serve");
    assert!(started.elapsed() < Duration::from_secs(TIME_LIMIT + 20), "{protocol} seed {seed}: ran past its limit");
    // Every process ends: on the server's `Stop`, or (frozen past the end of the run) by
    // giving up on a server that is gone.
    for (i, mut w) in live.into_iter().enumerate() {
        let exited = w.proc.wait_exit(Duration::from_secs(40));
        assert!(exited, "{protocol} seed {seed} ({story:?}): work {i} still runs: {:#?}", w.proc.lines());
        ended[i].push(w);
    }
    let summary = json(&out);
    let sessions = summary["ledger"]["sessions"].as_array().unwrap().clone();
    let read = |w: usize, epoch: u32| -> u64 {
        sessions
            .iter()
            .filter(|s| s["worker"] == w as u64 && s["epoch"].as_u64() == Some(u64::from(epoch)))
            .map(|s| {
                ["received", "discarded", "in_flight_at_stop"].iter().map(|k| s[*k].as_u64().unwrap()).sum::<u64>()
            })
            .sum()
    };
    let whence = |w: usize| format!("{protocol} seed {seed} ({story:?}): worker {w}");
    let (mut sent, mut to_killed_server, mut cut_lost, mut killed_server_sessions) = (0u64, 0u64, 0u64, 0u64);
    for (w, incarnations) in ended.into_iter().enumerate() {
        for inc in incarnations {
            let mut sessions = inc.sessions();
            let lines = inc.proc.lines();
            let (code, out) = inc.proc.finish(Duration::from_secs(5));
            let report = (code == 0).then(|| json(&out));
            if !inc.killed && report.is_none() {
                // Frozen past the end of the run, or restarted as it ended, or reconnecting
                // while a resumed server (which goes on with what is left of the whole run's
                // budget) spent that rest without it: it found no server and gave up (every
                // session it had ended, and was logged).
                let gave_up = lines.iter().any(|l| l.contains("gave up after"));
                let faulted = story
                    .iter()
                    .any(|e| e.starts_with(&format!("stop {w} ")) || *e == format!("kill {w}") || e == "server killed");
                assert!(gave_up && faulted, "{}: exited {code}: {lines:#?}", whence(w));
            }
            if let Some(r) = &report {
                // The last session ended on the server's `Stop`: its writes are the rest.
                let total = r["sent"].as_u64().unwrap() + r["resent"].as_u64().unwrap();
                let logged: u64 = sessions.iter().filter_map(|s| s.written).sum();
                let open = sessions.iter_mut().rev().find(|s| s.written.is_none());
                let open = open.unwrap_or_else(|| panic!("{}: no session got the Stop: {lines:#?}", whence(w)));
                open.written = Some(total.checked_sub(logged).unwrap());
            }
            for s in sessions {
                match (s.with, s.written) {
                    (Server::Killed, Some(n)) => {
                        killed_server_sessions += 1;
                        to_killed_server += n;
                        sent += n;
                    }
                    (Server::Killed, None) => panic!("{}: a session with the killed server never ended", whence(w)),
                    // A killed process's open session: the kernel delivered what it wrote.
                    (Server::Last, None) => {
                        assert!(inc.killed, "{}: session {} never ended: {lines:#?}", whence(w), s.epoch);
                        sent += read(w, s.epoch);
                    }
                    (Server::Last, Some(n)) => {
                        let r = read(w, s.epoch);
                        // Written into a connection the server had cut: at most two frames.
                        let lost = n.checked_sub(r).unwrap_or_else(|| {
                            panic!("{}: session {} wrote {n}, the server read {r}", whence(w), s.epoch)
                        });
                        assert!(lost <= 2, "{}: session {} wrote {n}, the server read {r}", whence(w), s.epoch);
                        cut_lost += lost;
                        sent += n;
                    }
                }
            }
        }
    }
    let l = &summary["ledger"];
    let mut ledger = Ledger::from_summary_json(&summary["gradients"]).unwrap();
    ledger.sent = sent;
    ledger.in_flight = l["in_flight_at_stop"].as_u64().unwrap();
    ledger.add_lost(Loss::Refused, l["refused"].as_u64().unwrap());
    ledger.add_lost(Loss::ConnectionLost, l["discarded"].as_u64().unwrap() + cut_lost);
    assert_eq!(
        l["received"].as_u64().unwrap(),
        ledger.accepted + l["refused"].as_u64().unwrap(),
        "{protocol} seed {seed}: received = accepted + refused"
    );
    if kill_server {
        let r = &l["resumed"];
        let at = |k: &str, i: usize| r[k][i].as_u64().unwrap();
        let rolled_back = r["lost_contributions"].as_u64().unwrap();
        // The versions after the checkpoint are lost, and they are all a worker saw.
        let ckpt_v = r["checkpoint_version"].as_u64().unwrap();
        let last = r["lost_versions"].as_array().and_then(|v| v.get(1)?.as_u64()).unwrap_or(ckpt_v);
        assert!(last >= seen, "{protocol} seed {seed}: workers computed on version {seen}, lost up to {last}");
        assert_eq!(
            rolled_back,
            at("at_last_update", 2) - at("at_checkpoint", 2),
            "lost = applied after the checkpoint"
        );
        add_killed_server(&mut ledger, r, rolled_back);
        // Read by the killed server after its last journal line, read from a session it had
        // replaced, or never read.
        let gone = to_killed_server.checked_sub(at("at_last_update", 0)).unwrap_or_else(|| {
            panic!("{protocol} seed {seed}: wrote {to_killed_server} to the killed server, it received more: {r}")
        });
        assert!(
            gone <= 4 * u64::from(N) + 2 * killed_server_sessions,
            "{protocol} seed {seed} ({story:?}): {gone} contributions unaccounted for at the kill"
        );
        ledger.add_lost(Loss::ServerGone, gone);
    }
    ledger.check().unwrap_or_else(|e| panic!("{protocol} seed {seed} ({story:?}): {e}"));
    let _ = std::fs::remove_dir_all(&dir);
    format!("{protocol} seed {seed} [{}] {:.1} s: {}", story.join(", "), started.elapsed().as_secs_f64(), ledger.line())
}

#[test]
fn every_protocol_keeps_its_ledger_through_a_fault_schedule() {
    for (i, kind) in ProtocolKind::ALL.into_iter().enumerate() {
        eprintln!("{}", schedule(kind, 1000 + i as u64, 60, false));
    }
}

#[test]
fn every_protocol_keeps_its_ledger_through_a_server_kill_and_resume() {
    for (i, kind) in ProtocolKind::ALL.into_iter().enumerate() {
        eprintln!("{}", schedule(kind, 2000 + i as u64, 60, true));
    }
}

/// Many schedules: `SYNCOPATE_FAULT_SCHEDULES` per protocol (default 40), every other one
/// with a server kill.
#[test]
#[ignore = "long: many seeded schedules per protocol"]
fn every_protocol_survives_many_fault_schedules() {
    let per: u64 = std::env::var("SYNCOPATE_FAULT_SCHEDULES").ok().and_then(|v| v.parse().ok()).unwrap_or(40);
    let started = Instant::now();
    for kind in ProtocolKind::ALL {
        for seed in 0..per {
            eprintln!("{}", schedule(kind, seed, 60, seed % 2 == 1));
        }
    }
    eprintln!("{} schedules in {:.0} s", per * ProtocolKind::ALL.len() as u64, started.elapsed().as_secs_f64());
}
