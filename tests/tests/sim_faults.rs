//! Network faults, random crashes and server restarts in the simulator (docs/RELIABILITY.md, "Fault model"):
//! each fault happens and is counted, the fault phase ends at `quiet_after`, runs stay
//! deterministic, and faults never disturb the compute draws.

use std::collections::BTreeMap;
use syncopate::proto::asp::AspConfig;
use syncopate::proto::bsp::BspConfig;
use syncopate::{Duration, Instant, ProtocolConfig, Reject, Server};
use syncopate_adapters::sim::{
    self, Direction, Fault, FaultConfig, FaultStats, LinkCut, Node, Observation, ServerCrash, SimConfig, SimReport,
};
use syncopate_adapters::workload::{ModelKind, Workload};

const N: u32 = 4;

fn ms(x: u64) -> Duration {
    Duration::from_millis(x)
}

fn workload() -> Workload {
    Workload::digits(ModelKind::Softmax, 1)
}

fn config(protocol: ProtocolConfig, faults: FaultConfig) -> SimConfig {
    let mut c = SimConfig::new(protocol, ModelKind::Softmax).with_faults(faults).with_max_time(ms(1000));
    c.rejoin_after = Some(ms(25));
    c.eval_interval = ms(250);
    c
}

fn bsp() -> ProtocolConfig {
    ProtocolConfig::Bsp(BspConfig::new(N, 0.5))
}

fn asp() -> ProtocolConfig {
    ProtocolConfig::Asp(AspConfig::new(N, 0.1))
}

/// One observed fault: time, from, to, kind, fault.
type Seen = (Instant, Node, Node, &'static str, Fault);

/// Runs and collects the fault observations.
fn run_watched(c: &SimConfig, w: &Workload) -> (SimReport, Vec<Seen>) {
    let mut faults = Vec::new();
    let r = sim::run_observed(c, w, &mut |o| {
        if let Observation::Fault { at, from, to, kind, fault } = o {
            faults.push((*at, *from, *to, *kind, *fault));
        }
    });
    (r, faults)
}

#[test]
fn no_faults_by_default() {
    let w = workload();
    let r = sim::run(&config(bsp(), FaultConfig::default()).with_max_updates(20), &w);
    assert_eq!(r.faults, FaultStats::default());
    assert!(!FaultConfig::default().message_faults());
}

#[test]
fn loss_drops_messages_and_rejoin_keeps_training_going() {
    let w = workload();
    for protocol in [bsp(), asp()] {
        let faults = FaultConfig { loss: 0.1, ..FaultConfig::default() };
        let (r, seen) = run_watched(&config(protocol, faults), &w);
        let dropped = FaultStats::total(&r.faults.dropped);
        assert!(dropped > 10, "{}: {:?}", r.protocol, r.faults);
        assert_eq!(seen.len() as u64, dropped);
        assert!(seen.iter().all(|s| s.4 == Fault::Dropped));
        // Both directions lose messages, of several kinds.
        assert!(r.faults.dropped.contains_key("Grad") && r.faults.dropped.contains_key("Model"), "{:?}", r.faults);
        // About 10% of what was sent (every message is either delivered, lost to a fault,
        // or still in flight at the end).
        let sent = r.messages_delivered + dropped;
        let share = dropped as f64 / sent as f64;
        assert!((0.05..0.15).contains(&share), "{}: {share}", r.protocol);
        // Workers retry and the model keeps moving (BSP needs all eight messages of a round
        // through, 43% of the time at 10% loss, and retries after 25 ms: about 30 updates).
        assert!(r.updates > 15, "{}: {} updates", r.protocol, r.updates);
        assert_eq!(r.codec_errors, 0);
    }
}

#[test]
fn duplicates_are_replays_the_server_refuses() {
    let w = workload();
    let faults = FaultConfig { duplicate: 0.3, replay_delay: ms(3), ..FaultConfig::default() };
    let r = sim::run(&config(asp(), faults), &w);
    let dup = FaultStats::total(&r.faults.duplicated);
    assert!(dup > 20, "{:?}", r.faults);
    // Every message arrives once, duplicates once more.
    let clean = sim::run(&config(asp(), FaultConfig::default()), &w);
    assert!(r.messages_delivered > clean.messages_delivered);
    // A replayed gradient is refused (never applied twice): each applied gradient was sent
    // once by its worker.
    let sent: u64 = r.per_worker.iter().map(|p| p.gradients_sent).sum();
    assert!(r.applied + r.dropped.values().sum::<u64>() <= sent);
    assert!(r.rejected > 0, "duplicate gradients must be refused");
    assert!(r.updates > 100);
}

#[test]
fn delay_spikes_reorder_messages() {
    let w = workload();
    // Track the arrival order of models at each worker: a delayed model overtaken by a newer
    // one arrives late and the worker refuses it as outdated.
    let faults = FaultConfig { delay: 0.3, delay_mean: ms(20), ..FaultConfig::default() };
    let mut outdated = 0;
    let r = sim::run_observed(&config(asp(), faults), &w, &mut |o| {
        if let Observation::Delivered { kind: "Model", result: Err(Reject::OutdatedModel { .. }), .. } = o {
            outdated += 1;
        }
    });
    assert!(FaultStats::total(&r.faults.delayed) > 20, "{:?}", r.faults);
    assert!(outdated > 0, "no message was overtaken");
    assert_eq!(FaultStats::total(&r.faults.dropped), 0);
    // Without delays nothing is overtaken.
    let mut clean_outdated = 0;
    sim::run_observed(&config(asp(), FaultConfig::default()), &w, &mut |o| {
        if let Observation::Delivered { kind: "Model", result: Err(Reject::OutdatedModel { .. }), .. } = o {
            clean_outdated += 1;
        }
    });
    assert_eq!(clean_outdated, 0);
}

#[test]
fn a_one_way_partition_cuts_one_link_for_its_window() {
    let w = workload();
    let cut = LinkCut { worker: 2, direction: Direction::Up, from: ms(200), until: ms(400) };
    let faults = FaultConfig { cuts: vec![cut], ..FaultConfig::default() };
    let mut last_update_in_cut = 0;
    let mut version_at_cut_end = None;
    let (r, seen) = {
        let mut faults_seen = Vec::new();
        let c = config(bsp(), faults);
        let r = sim::run_observed(&c, &w, &mut |o| match o {
            Observation::Fault { at, from, to, kind, fault } => faults_seen.push((*at, *from, *to, *kind, *fault)),
            Observation::Step { at, server } => {
                if *at >= Instant::ZERO + ms(220) && *at < Instant::ZERO + ms(400) {
                    last_update_in_cut = last_update_in_cut.max(server.version().0);
                }
                if *at >= Instant::ZERO + ms(400) && version_at_cut_end.is_none() {
                    version_at_cut_end = Some(server.version().0);
                }
            }
            _ => {}
        });
        (r, faults_seen)
    };
    assert!(!seen.is_empty());
    for (at, from, to, _, fault) in &seen {
        assert_eq!((*from, *to, *fault), (Node::Worker(2), Node::Server, Fault::Partitioned));
        assert!(*at >= Instant::ZERO + ms(200) && *at < Instant::ZERO + ms(400), "{at:?}");
    }
    // BSP waits for worker 2 during the cut, then recovers through its Join retry.
    let stuck = version_at_cut_end.unwrap();
    assert!(last_update_in_cut <= stuck);
    assert!(r.updates > stuck + 20, "{} updates, {} at the end of the cut", r.updates, stuck);
    assert_eq!(FaultStats::total(&r.faults.partitioned), seen.len() as u64);
}

#[test]
fn random_partitions_and_quiet_phase() {
    let w = workload();
    let faults = FaultConfig {
        loss: 0.2,
        duplicate: 0.2,
        delay: 0.2,
        delay_mean: ms(5),
        cut_rate: 4.0,
        cut_mean: ms(30),
        quiet_after: Some(ms(500)),
        ..FaultConfig::default()
    };
    let mut at_quiet = None;
    let mut seen = Vec::new();
    let r = sim::run_observed(&config(bsp(), faults), &w, &mut |o| match o {
        Observation::Fault { at, fault, .. } => seen.push((*at, *fault)),
        Observation::Step { at, server } if *at >= Instant::ZERO + ms(500) && at_quiet.is_none() => {
            at_quiet = Some(server.version().0);
        }
        _ => {}
    });
    assert!(FaultStats::total(&r.faults.partitioned) > 0, "{:?}", r.faults);
    assert!(seen.iter().all(|(at, _)| *at < Instant::ZERO + ms(500)));
    // Liveness phase: training goes on at full speed (about one update per 11 ms).
    let after = r.updates - at_quiet.unwrap();
    assert!(after > 30, "{after} updates after the faults stopped");
}

#[test]
fn random_crashes_restart_and_stop_in_the_quiet_phase() {
    let w = workload();
    let faults = FaultConfig {
        crash_rate: 2.0,
        restart_mean: ms(40),
        crash_notify_server: true,
        quiet_after: Some(ms(800)),
        ..FaultConfig::default()
    };
    let mut crashes = Vec::new();
    let mut restarts = 0;
    let r = sim::run_observed(&config(asp(), faults).with_max_time(ms(1500)), &w, &mut |o| match o {
        Observation::Crashed { at, worker } => crashes.push((*at, worker.0)),
        Observation::Restarted { .. } => restarts += 1,
        _ => {}
    });
    assert!(r.faults.random_crashes >= 3, "{:?}", r.faults);
    assert_eq!(crashes.len() as u64, r.faults.random_crashes);
    assert_eq!(r.per_worker.iter().map(|p| u64::from(p.crashes)).sum::<u64>(), r.faults.random_crashes);
    assert!(crashes.iter().all(|(at, _)| *at < Instant::ZERO + ms(800)));
    assert!(restarts as u64 >= r.faults.random_crashes - 1);
    assert!(r.updates > 200);
}

#[test]
fn server_restarts_from_its_checkpoint_without_losing_updates() {
    let w = workload();
    let faults =
        FaultConfig { server_crashes: vec![ServerCrash { at: ms(200), down_for: ms(50) }], ..FaultConfig::default() };
    let mut crashed_at = None;
    let mut versions = Vec::new();
    let mut lost_at = Vec::new();
    let r = sim::run_observed(&config(bsp(), faults), &w, &mut |o| match o {
        Observation::ServerCrashed { version, .. } => crashed_at = Some(version.0),
        Observation::Step { server, .. } => versions.push(server.version().0),
        Observation::Fault { at, fault: Fault::ServerDown, .. } => lost_at.push(*at),
        _ => {}
    });
    assert_eq!((r.faults.server_crashes, r.faults.server_restarts), (1, 1));
    let v = crashed_at.unwrap();
    assert!(v > 5);
    // The version never goes back: the resumed server starts at the checkpoint.
    assert!(versions.windows(2).all(|p| p[0] <= p[1]));
    assert!(!lost_at.is_empty() && FaultStats::total(&r.faults.server_down) == lost_at.len() as u64);
    assert!(lost_at.iter().all(|t| *t >= Instant::ZERO + ms(200) && *t < Instant::ZERO + ms(250)));
    // Workers rejoin the new server and training goes on; counters span both servers.
    assert!(r.updates > v + 20, "{} updates, crashed at {v}", r.updates);
    assert_eq!(r.applied, u64::from(N) * r.updates);
}

fn everything(seed: u64) -> SimConfig {
    let faults = FaultConfig {
        loss: 0.1,
        duplicate: 0.2,
        replay_delay: ms(2),
        delay: 0.2,
        delay_mean: ms(4),
        cuts: vec![LinkCut { worker: 1, direction: Direction::Down, from: ms(100), until: ms(150) }],
        cut_rate: 1.0,
        cut_mean: ms(20),
        crash_rate: 1.0,
        restart_mean: ms(30),
        crash_notify_server: false,
        server_crashes: vec![ServerCrash { at: ms(300), down_for: ms(20) }],
        quiet_after: Some(ms(700)),
    };
    config(asp(), faults).with_seed(seed)
}

#[test]
fn faults_are_deterministic() {
    let w = workload();
    let (a, b) = (sim::run(&everything(7), &w), sim::run(&everything(7), &w));
    assert_eq!(a, b);
    assert_eq!(a.trace_hash, b.trace_hash);
    assert!(a.faults.messages_lost() > 0 && a.faults.random_crashes > 0 && a.faults.server_restarts == 1);
    let c = sim::run(&everything(8), &w);
    assert_ne!(a.trace_hash, c.trace_hash);
}

#[test]
fn faults_do_not_disturb_the_compute_draws() {
    // The fault stream is separate: each worker's step-time sequence is the same with and
    // without faults (a prefix of it, since the runs do different amounts of work).
    let w = workload();
    let mut clean = everything(7);
    clean.faults = FaultConfig::default();
    let with = everything(7);
    let straggly = |mut c: SimConfig| {
        c.compute = sim::ComputeModel::all(N, &sim::ComputeModel::ShiftedExp { shift: 1.0, rate: 2.0 });
        sim::run(&c, &w)
    };
    let (a, b) = (straggly(clean), straggly(with));
    let mut compared = BTreeMap::new();
    for i in 0..N {
        let (ta, tb) = (a.worker_trace(i), b.worker_trace(i));
        let k = ta.len().min(tb.len());
        assert!(k > 10);
        assert_eq!(ta[..k], tb[..k], "worker {i}");
        compared.insert(i, k);
    }
    assert_eq!(compared.len(), N as usize);
}
