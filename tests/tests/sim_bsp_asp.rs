//! BSP and ASP in the simulator: both learn digits; a straggler slows every BSP update by
//! its factor while ASP shrugs it off; every gradient has exactly one outcome; a crashed
//! worker stalls BSP (reported) but not ASP.

use std::collections::BTreeSet;
use syncopate::proto::asp::AspConfig;
use syncopate::proto::bsp::BspConfig;
use syncopate::{Duration, Instant, ProtocolConfig, Server, ServerEvent};
use syncopate_adapters::sim::{self, ComputeModel, Crash, Node, Observation, SimConfig, SimReport};
use syncopate_adapters::workload::{ModelKind, Workload};

const N: u32 = 8;
const BSP_LR: f64 = 0.5;
const ASP_LR: f64 = 0.1;

fn bsp() -> ProtocolConfig {
    ProtocolConfig::Bsp(BspConfig::new(N, BSP_LR))
}

fn asp() -> ProtocolConfig {
    ProtocolConfig::Asp(AspConfig::new(N, ASP_LR))
}

fn workload() -> Workload {
    Workload::digits(ModelKind::Softmax, 1)
}

fn to_target(protocol: ProtocolConfig, compute: Vec<ComputeModel>, w: &Workload) -> SimReport {
    let c =
        SimConfig::new(protocol, ModelKind::Softmax).with_compute(compute).stop_at_target(0.90).with_max_updates(3000);
    let r = sim::run(&c, w);
    eprintln!(
        "{}: time to 0.90 {:?} s at update {:?}, {} events, mean compute share {:.2}, mean staleness {:.2}",
        r.protocol, r.time_to_target, r.updates_to_target, r.events, r.mean_compute_share, r.staleness.mean
    );
    r
}

#[test]
fn bsp_reaches_90_percent() {
    let w = workload();
    let r = to_target(bsp(), vec![], &w);
    assert_eq!(r.stop_reason, "target");
    assert!(r.final_accuracy >= 0.90, "{}", r.final_accuracy);
    assert!(r.time_to_target.is_some());
    // Every update averages exactly one gradient per worker; nothing is dropped.
    assert_eq!(r.applied, u64::from(N) * r.updates);
    assert_eq!(r.dropped.values().sum::<u64>(), 0);
    assert_eq!(r.staleness.max, 0);
    assert_eq!(r.codec_errors, 0);
    // Equal workers are busy most of the time (10 ms compute, ~1 ms of network per round).
    assert!(r.mean_compute_share > 0.8 && r.mean_compute_share < 0.95, "{}", r.mean_compute_share);
    // The learning curve starts low and ends high.
    assert!(r.curve.first().unwrap().accuracy < 0.5);
}

#[test]
fn asp_converges() {
    let w = workload();
    let r = to_target(asp(), vec![], &w);
    assert_eq!(r.stop_reason, "target");
    assert!(r.final_accuracy >= 0.90);
    assert_eq!(r.applied, r.updates);
    // Eight workers in flight: updates are typically about n - 1 versions stale.
    assert!(r.staleness.mean > 3.0 && r.staleness.max < 4 * u64::from(N), "{:?}", r.staleness);
}

#[test]
fn a_4x_straggler_makes_every_bsp_update_4x_slower() {
    let w = workload();
    let run = |compute| {
        let c = SimConfig::new(bsp(), ModelKind::Softmax).with_compute(compute).with_max_updates(40);
        sim::run(&c, &w)
    };
    let fast = run(vec![]);
    let slow = run(ComputeModel::one_straggler(N, 3, 4.0));
    let (tf, ts) = (fast.seconds_per_update().unwrap(), slow.seconds_per_update().unwrap());
    // Per round: compute, then upload and broadcast (2 × 0.5 ms latency + transfer).
    let net = 2.0 * 0.0005;
    assert!((tf - (0.010 + net)).abs() < 1e-4, "{tf}");
    assert!((ts - (0.040 + net)).abs() < 1e-4, "{ts}");
    let ratio = ts / tf;
    assert!(ratio > 3.5 && ratio < 4.0, "ratio {ratio}");
    // The fast workers now idle three quarters of the time; the straggler is always busy.
    let share = |i: usize| slow.per_worker[i].compute_share;
    assert!(share(3) > 0.95 && share(0) < 0.3, "{:?}", slow.per_worker);
}

#[test]
fn asp_beats_bsp_to_target_with_a_straggler() {
    let w = workload();
    let straggler = ComputeModel::one_straggler(N, 0, 4.0);
    let b = to_target(bsp(), straggler.clone(), &w).time_to_target.expect("BSP reaches 0.90");
    let a = to_target(asp(), straggler, &w).time_to_target.expect("ASP reaches 0.90");
    assert!(a < b, "ASP {a} s, BSP {b} s");
}

/// Counts, through the observer, that each gradient sent got exactly one outcome: refused
/// on delivery, or accepted and later applied or dropped, once.
fn check_outcomes(protocol: ProtocolConfig) {
    let w = workload();
    let compute = ComputeModel::all(N, &ComputeModel::Pareto { scale: 1.0, shape: 2.5 });
    let c = SimConfig::new(protocol, ModelKind::Softmax).with_compute(compute).with_max_updates(100);
    // Per worker: sent, refused on delivery, accepted on delivery, applied, dropped.
    let mut count = vec![[0u64; 5]; N as usize];
    let mut seen = BTreeSet::new();
    let mut last_version = 0;
    let r = sim::run_observed(&c, &w, &mut |o| match o {
        Observation::Sent { kind: "Grad", from: Node::Worker(i), .. } => count[*i as usize][0] += 1,
        Observation::Delivered { kind: "Grad", from: Node::Worker(i), result, .. } => {
            count[*i as usize][if result.is_err() { 1 } else { 2 }] += 1;
        }
        Observation::Server { event: ServerEvent::Applied { worker, base, .. }, .. } => {
            count[worker.index()][3] += 1;
            assert!(seen.insert((worker.0, base.0)), "gradient of {worker:?} on {base:?} applied twice");
        }
        Observation::Server { event: ServerEvent::Dropped { worker, .. }, .. } => count[worker.index()][4] += 1,
        Observation::Step { server, .. } => {
            // Invariants after every step: the version never goes back, and the server has
            // applied no more than it accepted.
            let v = server.version().0;
            assert!(v >= last_version);
            last_version = v;
            let stats = server.stats();
            assert!(stats.applied + stats.dropped_total() <= stats.accepted);
        }
        _ => {}
    });
    for (i, &[sent, refused, accepted, applied, dropped]) in count.iter().enumerate() {
        // A worker has at most one gradient in flight, and at most one accepted but not yet
        // decided (waiting for its round) when the run stops.
        let in_flight = sent - refused - accepted;
        let pending = accepted - applied - dropped;
        assert!(in_flight <= 1 && pending <= 1, "worker {i}: {:?}", count[i]);
        assert_eq!(r.per_worker[i].gradients_sent, sent);
    }
    let total = |k: usize| count.iter().map(|c| c[k]).sum::<u64>();
    assert!(total(0) >= r.updates && r.updates == 100);
    assert_eq!(r.applied, total(3));
    assert_eq!(r.accepted, total(2));
    assert_eq!(r.rejected, total(1));
}

#[test]
fn every_gradient_has_exactly_one_outcome_bsp() {
    check_outcomes(bsp());
}

#[test]
fn every_gradient_has_exactly_one_outcome_asp() {
    check_outcomes(asp());
}

fn crash_run(protocol: ProtocolConfig, restart_after: Option<Duration>) -> (SimReport, Vec<(Instant, ServerEvent)>) {
    let w = workload();
    let mut c = SimConfig::new(protocol, ModelKind::Softmax).with_max_time(Duration::from_millis(600));
    c.crashes = vec![Crash { worker: 2, at: Duration::from_millis(205), restart_after, notify_server: true }];
    let mut events = Vec::new();
    let r = sim::run_observed(&c, &w, &mut |o| {
        if let Observation::Server { at, event } = o {
            events.push((*at, *event));
        }
    });
    (r, events)
}

#[test]
fn a_crash_stalls_bsp_visibly_but_not_asp() {
    let crash_at = Instant::from_nanos(205_000_000);
    let stall = Duration::from_millis(50);
    let bsp = ProtocolConfig::Bsp(BspConfig { stall_report: Some(stall), ..BspConfig::new(N, BSP_LR) });
    let (r, events) = crash_run(bsp, None);
    let updates_after = |events: &[(Instant, ServerEvent)]| {
        events.iter().filter(|(t, e)| *t > crash_at && matches!(e, ServerEvent::ModelUpdated { .. })).count()
    };
    // At most the round already complete in flight closes; then nothing.
    assert!(updates_after(&events) <= 1, "{}", updates_after(&events));
    assert!(
        events.iter().any(|(t, e)| *t >= crash_at && matches!(e, ServerEvent::WorkerLost { worker } if worker.0 == 2))
    );
    let stalls: Vec<_> = events.iter().filter(|(_, e)| matches!(e, ServerEvent::Stalled { .. })).collect();
    assert!(stalls.len() >= 5, "{stalls:?}");
    assert!(stalls.iter().all(|(_, e)| matches!(e, ServerEvent::Stalled { waiting_for, .. } if waiting_for.0 == 2)));
    assert_eq!(r.per_worker[2].crashes, 1);
    assert!(r.updates < 25);

    let (r, events) = crash_run(asp(), None);
    assert!(updates_after(&events) > 7 * 30, "{}", updates_after(&events));
    assert!(r.messages_lost <= 2);
}

#[test]
fn a_restarted_worker_rejoins_bsp() {
    let (r, events) = crash_run(bsp(), Some(Duration::from_millis(100)));
    assert!(events.iter().any(|(_, e)| matches!(e, ServerEvent::WorkerJoined { worker, epoch: 1 } if worker.0 == 2)));
    // Stalled for ~100 ms, then back to ~11 ms per round.
    let updated: Vec<Instant> =
        events.iter().filter(|(_, e)| matches!(e, ServerEvent::ModelUpdated { .. })).map(|(t, _)| *t).collect();
    let after = updated.iter().filter(|t| t.as_nanos() > 310_000_000).count();
    assert!(after > 20, "{after} updates after the restart");
    assert!(r.updates > 40);
}
