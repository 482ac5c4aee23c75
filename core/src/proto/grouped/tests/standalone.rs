//! Stand-alone group servers speaking to a central server, the upstream link, and a straggler's reach (one group only).

use super::*;

#[test]
fn standalone_group_server_speaks_to_a_central_asp_server() {
    let c = GroupedConfig::new(4, 0.5, 2);
    let mut g1: GroupServer<f64, Vec<f64>> = GroupServer::new(c, 1, 7, vec![0.0; 1], vec![0.0; 1]).unwrap();
    let mut buf = Vec::new();
    assert_eq!(g1.group(), 1);
    assert!(g1.awaiting_central());
    assert!(g1.has_upstream());
    assert_eq!(drain_server(&mut g1), [Out::Up(ToServerOwned::Join { epoch: 7 })]);
    // Members only; no gradient before the group has a model.
    assert_eq!(
        g1.handle(Instant::ZERO, WorkerId(0), ToServer::Join { epoch: 0 }),
        Err(Reject::UnknownWorker(WorkerId(0)))
    );
    assert_eq!(g1.handle(Instant::ZERO, WorkerId(2), grad(0, 0, &[1.0])), Err(Reject::Unexpected { kind: "Grad" }));
    g1.handle(Instant::ZERO, WorkerId(2), ToServer::Join { epoch: 0 }).unwrap();
    let outs = drain_server(&mut g1);
    assert_eq!(outs, [Out::Event(ServerEvent::WorkerJoined { worker: WorkerId(2), epoch: 0 })], "model deferred");
    let model = ToWorkerOwned::Model { version: 5, clock: 5, values: vec![3.0] };
    g1.handle_upstream(Instant::ZERO, model.as_msg(&mut buf)).unwrap();
    assert_eq!(drain_server(&mut g1), [Out::Send(Recipient::Worker(WorkerId(2)), model.clone())]);
    assert_eq!(g1.handle_upstream(Instant::ZERO, model.as_msg(&mut buf)), Err(Reject::Unexpected { kind: "Model" }));
    assert_eq!(
        g1.handle_upstream(Instant::ZERO, ToWorker::Abort { iteration: 0 }),
        Err(Reject::Unexpected { kind: "Abort" })
    );
    g1.handle(Instant::ZERO, WorkerId(2), grad(5, 0, &[2.0])).unwrap();
    g1.handle(Instant::ZERO, WorkerId(3), grad(5, 0, &[4.0])).unwrap();
    // The exchange goes upstream after the members' outputs of the same input.
    let outs = drain_server(&mut g1);
    assert_eq!(
        outs.last(),
        Some(&Out::Up(ToServerOwned::Grad { base: 5, iteration: 0, seq: crate::id::first_seq(7), values: vec![3.0] }))
    );
    assert_eq!(outs.iter().filter(|o| matches!(o, Out::Up(_))).count(), 1);
    // While the exchange is out, the closed step takes nothing more.
    g1.handle(Instant::ZERO, WorkerId(2), grad(5, 1, &[2.0])).unwrap();
    assert!(drain_server(&mut g1).contains(&Out::Event(ServerEvent::Dropped {
        worker: WorkerId(2),
        base: Version(5),
        reason: DropReason::Stale
    })));
    let stale = ToWorkerOwned::Model { version: 5, clock: 5, values: vec![0.0] };
    assert_eq!(
        g1.handle_upstream(Instant::ZERO, stale.as_msg(&mut buf)),
        Err(Reject::OutdatedModel { received: Version(5), have: Version(5) })
    );
    let reply = ToWorkerOwned::Model { version: 9, clock: 9, values: vec![-1.0] };
    g1.handle_upstream(Instant::ZERO, reply.as_msg(&mut buf)).unwrap();
    let outs = drain_server(&mut g1);
    assert_eq!(
        outs[0],
        Out::Event(ServerEvent::GroupApplied {
            group: 1,
            base: Version(5),
            version: Version(9),
            staleness: 3,
            contributions: 2
        })
    );
    assert_eq!((g1.version(), g1.central_base(), g1.params()), (Version(9), Version(9), &[-1.0][..]));
    g1.handle_upstream(Instant::ZERO, ToWorker::Stop).unwrap();
    assert_eq!(drain_server(&mut g1).last(), Some(&Out::Send(Recipient::AllWorkers, ToWorkerOwned::Stop)));
}

#[test]
fn only_a_subserver_has_an_upstream() {
    let grouped = ProtocolConfig::Grouped(GroupedConfig::new(4, 0.5, 2));
    let bsp = ProtocolConfig::Bsp(BspConfig::new(4, 0.5));
    assert_eq!(bsp.tiers(), None);
    assert_eq!((bsp.subserver_of(WorkerId(0)), bsp.subserver_scratch_len(3)), (None, 0));
    assert_eq!(
        AnyServer::<f64, Vec<f64>>::subserver(&bsp, 0, 0, vec![0.0; 3], vec![0.0; 3]).err(),
        Some(ConfigError::NoSubservers)
    );
    let tiers = grouped.tiers().unwrap();
    assert_eq!(tiers.central, ProtocolConfig::Asp(AspConfig::new(2, 0.5)));
    let of = |w| grouped.subserver_of(WorkerId(w));
    assert_eq!([of(0), of(1), of(2), of(3), of(4)], [Some(0), Some(0), Some(1), Some(1), None]);
    assert_eq!(
        AnyServer::<f64, Vec<f64>>::subserver(&grouped, 2, 0, vec![0.0; 3], vec![0.0; 3]).err(),
        Some(ConfigError::Knob("group"))
    );
    // Servers without an upstream refuse its messages, and change nothing.
    for config in [bsp, grouped, tiers.central] {
        let mut s =
            AnyServer::<f64, Vec<f64>>::new(&config, vec![0.0; 3], vec![0.0; config.server_scratch_len(3)]).unwrap();
        let _ = drain_server(&mut s);
        assert!(!s.has_upstream());
        let model = ToWorkerOwned::Model { version: 1, clock: 1, values: vec![1.0; 3] };
        let mut buf = Vec::new();
        assert_eq!(s.handle_upstream(Instant::ZERO, model.as_msg(&mut buf)), Err(Reject::NoUpstream));
        assert_eq!(s.handle_upstream(Instant::ZERO, ToWorker::Stop), Err(Reject::NoUpstream));
        assert!(drain_server(&mut s).is_empty());
        assert_eq!(s.version(), Version::ZERO);
    }
}

/// A run on the test network ([`Cluster`]) with instant messages: worker `i`'s gradient
/// takes `cost[i]` ticks of 1 ms. Returns the gradients applied per worker by tick `until`.
fn timed(config: GroupedConfig, cost: &[u64], until: u64) -> Vec<u64> {
    let n = config.workers;
    let workers: Vec<_> =
        (0..n).map(|i| GradientWorker::new(GradientWorkerConfig::new(WorkerId(i)), vec![0.0f64; 1]).unwrap()).collect();
    // Compute times are the slowest cost divided by each worker's speed: exact in nanoseconds.
    let slowest = cost.iter().copied().max().unwrap_or(1);
    let step = Duration::from_millis(slowest);
    let net = NetConfig { latency: (Duration::ZERO, Duration::ZERO), compute: (step, step), ..NetConfig::default() };
    let mut cluster = Cluster::new(grouped(config, 1), workers, 1, net, |_| vec![1.0]);
    cluster.speed = cost.iter().map(|c| slowest as f64 / *c as f64).collect();
    // Everything at tick `until` happens; the first event after it is a computation ending,
    // which reaches the server only later.
    let end = Instant::ZERO + Duration::from_millis(until);
    assert!(cluster.run_until(1_000_000, |c| c.now > end));
    let mut applied = vec![0u64; n as usize];
    for e in &cluster.log {
        if let Entry::Event(ServerEvent::Applied { worker, .. }) = e {
            applied[worker.index()] += 1;
        }
    }
    applied
}

#[test]
fn a_straggler_delays_only_its_own_group() {
    // 8 workers, worker 0 four times slower, 100 ticks of one-tick steps.
    let mut cost = vec![1u64; 8];
    cost[0] = 4;
    let bsp = timed(GroupedConfig::new(8, 0.5, 1), &cost, 100);
    assert!(bsp.iter().all(|a| *a == 25), "G = 1 is BSP: everyone at the straggler's pace: {bsp:?}");
    let g4 = timed(GroupedConfig::new(8, 0.5, 4), &cost, 100);
    assert_eq!(&g4[..2], &[25, 25], "the straggler's group (contiguous: workers 0 and 1)");
    assert!(g4[2..].iter().all(|a| *a == 100), "the other groups run at full speed: {g4:?}");
    let mut rr = GroupedConfig::new(8, 0.5, 4);
    rr.partition = Partition::RoundRobin;
    let rr = timed(rr, &cost, 100);
    assert_eq!((rr[0], rr[4]), (25, 25), "round-robin: worker 0's group is {{0, 4}}: {rr:?}");
    assert!(rr.iter().enumerate().filter(|(i, _)| i % 4 != 0).all(|(_, a)| *a == 100));
}
