//! Admission under attack: a slow-loris attacker without the secret, with far
//! more connections than the server keeps unverified, each sending one byte a second and
//! reopening as soon as it is cut, cannot keep an authenticated worker out. A BSP worker is
//! killed and restarted during the attack; it is back within 2 s of its restart and
//! training finishes with the accuracy of an undisturbed run.
//!
//! Loopback only, bounded: 200 attacker connections at a time, at most 200,000 in all, for
//! at most 40 s.

#[path = "tcp_common/mod.rs"]
mod common;

use common::*;
use core::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use core::time::Duration;
use std::io::{Read, Write};
use std::net::{SocketAddr, TcpStream};
use std::sync::Arc;
use std::thread;
use std::time::Instant;
use syncopate::WorkerId;
use syncopate_adapters::tcp::{Secret, ServerOptions, StopReason};

const WORKERS: u32 = 4;
const STEPS: u64 = 200;
/// Emulated compute time of a step, so the run lasts long enough to be attacked.
const STEP: Duration = Duration::from_millis(20);
const ATTACKERS: usize = 200;
const MAX_ATTACK_CONNECTIONS: u64 = 200_000;
const ATTACK_FOR: Duration = Duration::from_secs(40);

/// Connections opened and how many of them the server cut.
#[derive(Default)]
struct AttackStats {
    opened: AtomicU64,
    cut: AtomicU64,
}

/// One attacker: connect, send one byte a second, reconnect as soon as the server cuts.
fn attacker(addr: SocketAddr, stop: &AtomicBool, stats: &AttackStats, until: Instant) {
    while !stop.load(Ordering::SeqCst) && Instant::now() < until {
        if stats.opened.fetch_add(1, Ordering::SeqCst) >= MAX_ATTACK_CONNECTIONS {
            return;
        }
        let Ok(mut s) = TcpStream::connect_timeout(&addr, Duration::from_secs(2)) else {
            thread::sleep(Duration::from_millis(10));
            continue;
        };
        let _ = s.set_read_timeout(Some(Duration::from_secs(1)));
        // A plausible frame header, then a byte a second.
        let mut bytes = [60u8, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 1].into_iter().cycle();
        let mut buf = [0u8; 64];
        loop {
            if stop.load(Ordering::SeqCst) || s.write_all(&[bytes.next().unwrap_or(0)]).is_err() {
                break;
            }
            match s.read(&mut buf) {
                Ok(0) => break,
                Ok(_) => {}
                Err(e) if matches!(e.kind(), std::io::ErrorKind::WouldBlock | std::io::ErrorKind::TimedOut) => {}
                Err(_) => break,
            }
        }
        stats.cut.fetch_add(1, Ordering::SeqCst);
    }
}

/// Sessions the server has logged for `worker`.
fn sessions_of(server: &Running, worker: u32) -> usize {
    let needle = format!("worker {worker} connected from");
    server.logs.lock().unwrap().iter().filter(|l| l.contains(&needle)).count()
}

#[test]
fn an_authenticated_worker_always_gets_in_under_a_slow_loris_attack() {
    bounded(Duration::from_secs(150), || {
        let w = workload();
        let secret = Secret::new(b"admission test secret").unwrap();
        let mut options = ServerOptions::new(bsp(WORKERS));
        options.secret = Some(secret.clone());
        // Fewer unverified slots than attacker connections: the table stays full and every
        // new connection evicts one.
        options.max_unauthenticated = 64;
        let server = start_server(options, &w, plan(STEPS * u64::from(WORKERS), 120));
        let addr = server.addr;
        let key = |i: u32| Some(secret.worker_key(WorkerId(i)));
        let kill = kill_switch();
        let mut workers = Vec::new();
        for i in 0..WORKERS {
            let mut o = worker_options(addr, i);
            o.key = key(i);
            if i == 1 {
                o.kill = Some(Arc::clone(&kill));
            }
            workers.push(spawn_worker_paced(o, Arc::clone(&w), STEP));
        }
        server.wait_log("worker 3 connected", Duration::from_secs(20));
        // The attack.
        let stop = Arc::new(AtomicBool::new(false));
        let stats = Arc::new(AttackStats::default());
        let until = Instant::now() + ATTACK_FOR;
        let attack: Vec<_> = (0..ATTACKERS)
            .map(|_| {
                let (stop, stats) = (Arc::clone(&stop), Arc::clone(&stats));
                thread::Builder::new()
                    .stack_size(64 * 1024)
                    .spawn(move || attacker(addr, &stop, &stats, until))
                    .unwrap()
            })
            .collect();
        server.wait_log("unauthenticated connections table full", Duration::from_secs(20));
        // Kill worker 1 under attack; BSP stalls waiting for it.
        kill.store(true, Ordering::SeqCst);
        let (killed, _) = workers.remove(1).join().unwrap();
        assert!(!killed.unwrap().stopped);
        server.wait_log("worker 1 lost", Duration::from_secs(10));
        thread::sleep(Duration::from_millis(500));
        // Restart it (a new process would start with the same id and secret).
        let restarted_at = Instant::now();
        let mut o = worker_options(addr, 1);
        o.key = key(1);
        let restarted = spawn_worker_paced(o, Arc::clone(&w), STEP);
        let end = restarted_at + Duration::from_secs(10);
        while sessions_of(&server, 1) < 2 && Instant::now() < end {
            thread::sleep(Duration::from_millis(5));
        }
        let back_after = restarted_at.elapsed();
        let report = server.finish();
        stop.store(true, Ordering::SeqCst);
        for a in attack {
            a.join().unwrap();
        }
        let (opened, cut) = (stats.opened.load(Ordering::SeqCst), stats.cut.load(Ordering::SeqCst));
        eprintln!(
            "worker 1 back {back_after:?} after its restart; attack: {opened} connections opened, {cut} cut by the \
             server, {} evicted; server: {} handshake failures, {} sessions",
            report.evicted, report.handshake_failures, report.sessions
        );
        assert!(back_after < Duration::from_secs(2), "worker 1 needed {back_after:?} to get back in");
        assert!(report.evicted > 0, "the attack filled the table");
        assert!(opened > ATTACKERS as u64, "attackers were cut and came back");
        assert_eq!(report.reason, StopReason::Budget, "training finished");
        let acc = accuracy(&w, &report.params);
        assert!(acc > 0.85, "accuracy {acc}");
        let (r, logs) = restarted.join().unwrap();
        let r = r.unwrap_or_else(|e| panic!("restarted worker failed: {e}; {logs:?}"));
        assert!(r.stopped && r.steps > 0, "{r:?}");
        for h in workers {
            assert!(h.join().unwrap().0.unwrap().stopped);
        }
    });
}
