//! The grouped protocol on the simulator's two-level network ([`SimConfig::group_link`]):
//! group nodes (`GroupServer`) and a central ASP node with their own links. With an instant
//! group link it is the single-process `GroupedServer` run for run; a slow group link makes
//! every central exchange cost a round trip, so training takes longer.

use syncopate::proto::grouped::GroupedConfig;
use syncopate::{Duration, ProtocolConfig, ServerEvent};
use syncopate_adapters::sim::{self, ComputeModel, NetworkConfig, Node, Observation, SimConfig, SimReport};
use syncopate_adapters::workload::{ModelKind, Workload};

const N: u32 = 8;

fn config(groups: u32) -> SimConfig {
    let compute = ComputeModel::all(N, &ComputeModel::ShiftedExp { shift: 1.0, rate: 2.0 });
    SimConfig::new(ProtocolConfig::Grouped(GroupedConfig::new(N, 0.5, groups)), ModelKind::Softmax)
        .with_seed(3)
        .with_compute(compute)
        .with_max_time(Duration::from_millis(1500))
}

fn instant() -> NetworkConfig {
    NetworkConfig { latency: Duration::ZERO, bandwidth: f64::INFINITY }
}

#[test]
fn an_instant_group_link_is_the_single_process_server() {
    let w = Workload::digits(ModelKind::Softmax, 1);
    for groups in [1, 2, 4] {
        let single = sim::run(&config(groups), &w);
        let two = sim::run(&config(groups).with_group_link(instant()), &w);
        let bits = |r: &SimReport| r.final_params.iter().map(|x| x.to_bits()).collect::<Vec<_>>();
        assert_eq!(bits(&single), bits(&two), "G = {groups}");
        assert_eq!(single.updates, two.updates);
        assert_eq!(single.applied, two.applied);
        assert_eq!(single.accepted, two.accepted);
        assert_eq!(single.virtual_time_s, two.virtual_time_s);
        assert_eq!(single.curve, two.curve);
        assert_eq!(single.staleness, two.staleness);
        assert_eq!(single.per_worker, two.per_worker);
        assert_eq!(two.codec_errors, 0);
        // The group↔central exchanges really crossed the network.
        assert!(two.messages_delivered > single.messages_delivered + 2 * two.updates);
        if groups > 1 {
            assert!(two.staleness.max > 0);
        }
    }
}

#[test]
fn staleness_and_group_events_come_from_the_group_nodes() {
    let w = Workload::digits(ModelKind::Softmax, 1);
    let c = config(4)
        .with_group_link(NetworkConfig { latency: Duration::from_millis(2), bandwidth: 1e8 })
        .with_max_updates(120);
    let (mut group_applied, mut central_applied, mut applied) = (0u64, 0u64, 0u64);
    let mut central_to_group = 0;
    let r = sim::run_observed(&c, &w, &mut |o| match o {
        Observation::Server { event: ServerEvent::GroupApplied { staleness, base, version, .. }, .. } => {
            assert_eq!(*staleness, version.0 - 1 - base.0);
            group_applied += 1;
        }
        Observation::Server { event: ServerEvent::Applied { .. }, .. } => applied += 1,
        Observation::Central { event: ServerEvent::Applied { worker, .. }, .. } => {
            assert!(worker.0 < 4);
            central_applied += 1;
        }
        Observation::Delivered { from: Node::Server, to: Node::Group(_), kind: "Model", .. } => central_to_group += 1,
        _ => {}
    });
    assert_eq!(r.updates, 120);
    assert_eq!(central_applied, 120);
    // The run stops at the central update; its reply may still be on the group link.
    assert!(group_applied <= central_applied && group_applied + 1 >= central_applied);
    assert_eq!(applied, r.applied);
    assert_eq!(r.staleness.count, r.applied);
    assert!(r.staleness.mean > 0.5, "{:?}", r.staleness);
    assert!(central_to_group >= central_applied);
}

#[test]
fn a_slow_group_link_slows_training() {
    let w = Workload::digits(ModelKind::Softmax, 1);
    let to_target = |link: Option<NetworkConfig>| {
        let mut c = config(2).stop_at_target(0.85);
        c.eval_interval = Duration::from_millis(10);
        c.group_link = link;
        let r = sim::run(&c, &w);
        assert_eq!(r.stop_reason, "target");
        r.time_to_target.unwrap()
    };
    let fast = to_target(Some(instant()));
    let slow = to_target(Some(NetworkConfig { latency: Duration::from_millis(10), bandwidth: 1e7 }));
    eprintln!("time to 0.85: instant group link {fast:.3} s, 10 ms / 10 MB/s group link {slow:.3} s");
    // Each exchange now costs a 20 ms round trip (the group idles meanwhile) on top of a
    // group step of about 16 ms (the slowest of four shifted-exponential draws plus 1 ms of
    // worker network).
    assert!(slow > 1.3 * fast, "{slow} vs {fast}");
}

#[test]
fn two_level_is_deterministic_and_server_crashes_are_refused() {
    let w = Workload::digits(ModelKind::Softmax, 1);
    let c = config(2).with_group_link(NetworkConfig::default());
    assert_eq!(sim::run(&c, &w), sim::run(&c, &w));
    let mut bad = c.clone();
    bad.faults.server_crashes =
        vec![sim::ServerCrash { at: Duration::from_millis(10), down_for: Duration::from_millis(10) }];
    assert!(matches!(sim::try_run(&bad, &w), Err(sim::SimError::Unsupported(_))));
}
