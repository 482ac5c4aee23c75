//! Worker loss, rejoin and server restart over real loopback sockets: a lost connection is a
//! lost worker for the protocol (BSP stalls and names the worker; ASP goes on), a worker that
//! reconnects with its id rejoins at the current version, and a server restarted from its
//! checkpoint loses no applied update.

#[path = "tcp_common/mod.rs"]
mod common;

use common::*;
use core::sync::atomic::{AtomicBool, Ordering};
use core::time::Duration;
use std::sync::Arc;
use std::thread;
use std::time::Instant;
use syncopate::{ServerEvent, WorkerId};
use syncopate_adapters::tcp::{ServerOptions, StopReason, WorkerJob, checkpoint, run_worker};
use syncopate_adapters::workload::{BatchSampler, Scratch, Workload};

fn wait_version(server: &Running, v: u64, within: Duration) {
    let end = Instant::now() + within;
    while Instant::now() < end {
        let reached = server
            .events
            .lock()
            .unwrap()
            .iter()
            .any(|e| matches!(e, ServerEvent::ModelUpdated { version, .. } if version.0 >= v));
        if reached {
            return;
        }
        thread::sleep(Duration::from_millis(5));
    }
    panic!("version {v} not reached within {within:?}");
}

fn wait_event(server: &Running, within: Duration, f: impl Fn(&ServerEvent) -> bool) -> ServerEvent {
    let end = Instant::now() + within;
    while Instant::now() < end {
        if let Some(e) = server.events.lock().unwrap().iter().find(|e| f(e)) {
            return *e;
        }
        thread::sleep(Duration::from_millis(5));
    }
    panic!("event not seen within {within:?}: {:?}", server.events.lock().unwrap().last());
}

#[test]
fn bsp_stalls_naming_the_lost_worker_then_a_rejoin_resumes() {
    bounded(Duration::from_secs(60), || {
        let w = workload();
        let server = start_server(ServerOptions::new(bsp(3)), &w, plan(3 * 120, 40));
        let kill = kill_switch();
        let mut handles = Vec::new();
        for i in 0..3 {
            let mut o = worker_options(server.addr, i);
            if i == 1 {
                o.kill = Some(Arc::clone(&kill));
            }
            handles.push(spawn_worker(o, Arc::clone(&w)));
        }
        wait_version(&server, 10, Duration::from_secs(20));
        kill.store(true, Ordering::SeqCst);
        // BSP names the worker it waits for. The report repeats once per interval: on a
        // loaded machine an earlier one may still count a survivor that is late with its
        // gradient, so the test waits for the report that names worker 1 alone.
        wait_event(&server, Duration::from_secs(20), |e| {
            matches!(e, ServerEvent::Stalled { waiting_for: WorkerId(1), missing: 1, .. })
        });
        server.wait_log("worker 1 lost", Duration::from_secs(5));
        // While worker 1 is away the model does not move.
        let frozen = server.events.lock().unwrap().iter().rev().find_map(|e| match e {
            ServerEvent::ModelUpdated { version, .. } => Some(*version),
            _ => None,
        });
        thread::sleep(Duration::from_millis(300));
        let still = server.events.lock().unwrap().iter().rev().find_map(|e| match e {
            ServerEvent::ModelUpdated { version, .. } => Some(*version),
            _ => None,
        });
        assert_eq!(frozen, still);
        // The killed worker returns without a Stop.
        let (r1, _) = handles.remove(1).join().unwrap();
        let r1 = r1.unwrap();
        assert!(!r1.stopped);
        // Rejoin with the same id: training resumes at the current version and finishes.
        let rejoin = spawn_worker(worker_options(server.addr, 1), Arc::clone(&w));
        let report = server.finish();
        assert_eq!(report.reason, StopReason::Budget);
        assert!(report.sessions >= 4, "{report:?}");
        assert!(report.lost >= 1);
        assert!(report.version > frozen.unwrap());
        let (r, logs) = rejoin.join().unwrap();
        let r = r.unwrap();
        assert!(r.stopped && r.steps > 0, "{r:?} {logs:?}");
        assert!(r.last_version.unwrap() >= frozen.unwrap().0, "rejoined at the current version");
        let mut reports = vec![r1, r];
        for h in handles {
            let r = h.join().unwrap().0.unwrap();
            assert!(r.stopped);
            reports.push(r);
        }
        // The killed worker's report survives (a thread): the ledger is exact.
        check_ledger(&report, &reports);
    });
}

/// Gradients of the test workload with a hook after each step: `kill` (worker 2) sets its
/// kill switch after `KILL_AT` steps (that step's gradient is still sent, then the
/// connection drops as a dying process's does); `gate` (the survivors) waits after `HOLD_AT`
/// steps until the test opens it. So the loss happens, and is seen, before the budget can be
/// spent, however slow or loaded the machine is.
struct Scripted {
    w: Arc<Workload>,
    sampler: BatchSampler,
    scratch: Scratch,
    batch: Vec<usize>,
    steps: u64,
    kill: Option<Arc<AtomicBool>>,
    gate: Option<Arc<AtomicBool>>,
}

const KILL_AT: u64 = 5;
const HOLD_AT: u64 = 10;

impl WorkerJob for Scripted {
    fn gradient(&mut self, params: &[f32], grad: &mut [f32]) -> Duration {
        self.sampler.next_batch(BATCH, &mut self.batch);
        self.w.model.gradient(params, &self.w.train, &self.batch, grad, &mut self.scratch);
        self.steps += 1;
        if let Some(kill) = self.kill.as_ref().filter(|_| self.steps == KILL_AT) {
            kill.store(true, Ordering::SeqCst);
        }
        if let Some(gate) = self.gate.as_ref().filter(|_| self.steps == HOLD_AT) {
            while !gate.load(Ordering::SeqCst) {
                thread::sleep(Duration::from_millis(5));
            }
        }
        Duration::ZERO
    }
}

#[test]
fn asp_goes_on_when_a_worker_process_dies() {
    // Deadlines only bound a broken run (generous: the run takes well under a second alone).
    bounded(Duration::from_secs(240), || {
        let w = workload();
        let budget = 3 * 100;
        let server = start_server(ServerOptions::new(asp(3)), &w, plan(budget, 180));
        let kill = kill_switch();
        let gate = kill_switch();
        let handles: Vec<_> = (0..3u32)
            .map(|i| {
                let mut o = worker_options(server.addr, i);
                let (kill, gate) = if i == 2 {
                    o.kill = Some(Arc::clone(&kill));
                    (Some(Arc::clone(&kill)), None)
                } else {
                    (None, Some(Arc::clone(&gate)))
                };
                let seed = SEED ^ (u64::from(i) + 1).wrapping_mul(0x9E37_79B9_7F4A_7C15);
                let mut job = Scripted {
                    sampler: BatchSampler::new(w.train.len(), seed),
                    scratch: w.model.scratch(),
                    batch: Vec::new(),
                    steps: 0,
                    kill,
                    gate,
                    w: Arc::clone(&w),
                };
                thread::spawn(move || run_worker(&o, &mut job, &mut |_| {}))
            })
            .collect();
        // At most 2 * HOLD_AT + KILL_AT of the budget's gradients are in before the loss.
        server.wait_log("worker 2 lost", Duration::from_secs(120));
        gate.store(true, Ordering::SeqCst);
        let report = server.finish();
        assert_eq!(report.reason, StopReason::Budget, "ASP finishes its budget with two workers");
        assert!(report.lost >= 1);
        assert!(report.stats.accepted >= budget);
        assert!(report.stats.applied + report.stats.dropped_total() <= report.stats.accepted);
        assert!(accuracy(&w, &report.params) > 0.8);
        let reports: Vec<_> = handles.into_iter().map(|h| h.join().unwrap().unwrap()).collect();
        assert!(!reports[2].stopped && reports[2].steps == KILL_AT, "worker 2 died after its step {KILL_AT}");
        assert!(reports[0].stopped && reports[1].stopped, "the survivors got their Stop");
        check_ledger(&report, &reports);
    });
}

#[test]
fn server_restart_from_checkpoint_loses_no_applied_update() {
    bounded(Duration::from_secs(60), || {
        let w = workload();
        let dim = w.model.dim();
        let dir = std::env::temp_dir().join(format!("syncopate-tcp-restart-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let path = dir.join("model.ckpt");
        let mut options = ServerOptions::new(bsp(2));
        options.checkpoint = Some((path.clone(), 1));
        let first = start_server(options.clone(), &w, plan(2 * 1000, 40));
        let addr = first.addr;
        let handles: Vec<_> = (0..2).map(|i| spawn_worker(worker_options(addr, i), Arc::clone(&w))).collect();
        wait_version(&first, 15, Duration::from_secs(20));
        first.handle.crash();
        let events = Arc::clone(&first.events);
        let crashed = first.finish();
        assert_eq!(crashed.reason, StopReason::Crashed);
        let last_update = events
            .lock()
            .unwrap()
            .iter()
            .rev()
            .find_map(|e| match e {
                ServerEvent::ModelUpdated { version, .. } => Some(*version),
                _ => None,
            })
            .unwrap();
        let ck = checkpoint::load(&path, "bsp", dim).unwrap();
        assert_eq!(ck.version, last_update, "every applied update is in the checkpoint");
        assert_eq!(ck.version, crashed.version);
        assert_eq!(ck.params, crashed.params);
        // Restart on the same address; the workers reconnect by themselves.
        let second = start_server_at(&addr.to_string(), options, ck.params.clone(), ck.version, plan(2 * 60, 30));
        let events2 = Arc::clone(&second.events);
        let report = second.finish();
        assert_eq!(report.reason, StopReason::Budget);
        assert!(report.version.0 > ck.version.0 + 10, "{report:?}");
        let first_after = events2.lock().unwrap().iter().find_map(|e| match e {
            ServerEvent::ModelUpdated { version, .. } => Some(*version),
            _ => None,
        });
        assert_eq!(first_after, Some(ck.version.next()), "the restarted server continues from the checkpoint");
        for h in handles {
            let (r, logs) = h.join().unwrap();
            let r = r.unwrap();
            assert!(r.stopped && r.sessions >= 2, "{r:?} {logs:?}");
        }
        let again = checkpoint::load(&path, "bsp", dim).unwrap();
        assert_eq!(again.version, report.version, "final checkpoint at the end of the run");
        assert_eq!(again.params, report.params);
        std::fs::remove_dir_all(&dir).unwrap();
    });
}
