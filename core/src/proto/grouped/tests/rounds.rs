//! Examples of the grouped protocol's rounds: partitions, configuration, a group's steps, refusals, stale gradients, membership, local steps and overflow.

use super::*;

#[test]
fn partitions() {
    let groups = |p: Partition, n: u32, g: u32| (0..n).map(|i| p.group_of(i, n, g)).collect::<Vec<_>>();
    assert_eq!(groups(Partition::Contiguous, 8, 4), [0, 0, 1, 1, 2, 2, 3, 3]);
    assert_eq!(groups(Partition::Contiguous, 5, 2), [0, 0, 0, 1, 1]);
    assert_eq!(groups(Partition::RoundRobin, 5, 2), [0, 1, 0, 1, 0]);
    let explicit = Partition::explicit(&[1, 0, 1]).unwrap();
    assert_eq!(groups(explicit, 3, 2), [1, 0, 1]);
    assert!(Partition::explicit(&[0; MAX_WORKERS + 1]).is_none());
    let mut c = GroupedConfig::new(3, 0.5, 2);
    c.partition = explicit;
    assert_eq!(c.group_of(WorkerId(0)), Some(1));
    assert_eq!(c.group_of(WorkerId(3)), None);
    assert_eq!(LrScaling::Linear.factor(4, 16), 0.25);
    assert_eq!(LrScaling::Sqrt.factor(4, 16), 0.5);
    assert_eq!(LrScaling::None.factor(4, 16), 1.0);
}

#[test]
fn config_errors() {
    let bad = |c: GroupedConfig, scratch: usize| {
        GroupedServer::<f32, Vec<f32>>::new(c, vec![0.0; 2], vec![0.0; scratch]).err()
    };
    assert_eq!(bad(GroupedConfig::new(4, 0.5, 0), 100), Some(ConfigError::Knob("groups")));
    assert_eq!(bad(GroupedConfig::new(4, 0.5, 5), 100), Some(ConfigError::Knob("groups")));
    assert_eq!(bad(GroupedConfig::new(0, 0.5, 1), 100), Some(ConfigError::WorkerCount(0)));
    assert_eq!(bad(GroupedConfig::new(4, 0.0, 2), 100), Some(ConfigError::LearningRate));
    let mut c = GroupedConfig::new(4, 0.5, 2);
    c.local_steps = 0;
    assert_eq!(bad(c, 100), Some(ConfigError::Knob("local_steps")));
    let mut c = GroupedConfig::new(4, 0.5, 2);
    c.partition = Partition::explicit(&[0, 0, 0, 0]).unwrap();
    assert_eq!(bad(c, 100), Some(ConfigError::Knob("partition")), "group 1 is empty");
    c.partition = Partition::explicit(&[0, 1, 2, 1]).unwrap();
    assert_eq!(bad(c, 100), Some(ConfigError::Knob("partition")), "group 2 does not exist");
    let c = GroupedConfig::new(4, 0.5, 2);
    assert_eq!(c.scratch_len(2), 8);
    assert_eq!(bad(c, 7), Some(ConfigError::ScratchTooSmall { needed: 8, given: 7 }));
    let mut h = GroupedConfig::new(4, 0.5, 2);
    h.local_steps = 3;
    assert_eq!((h.scratch_len(2), h.group_scratch_len(2)), (12, 4));
    assert!(GroupedServer::<f32, Vec<f32>>::new(c, vec![], vec![0.0; 8]).is_err());
    let standalone =
        |g, m: usize, s: usize| GroupServer::<f32, Vec<f32>>::new(c, g, 0, vec![0.0; m], vec![0.0; s]).err();
    assert_eq!(standalone(2, 2, 2), Some(ConfigError::Knob("group")));
    assert_eq!(standalone(0, 0, 2), Some(ConfigError::EmptyModel));
    assert_eq!(standalone(0, 2, 1), Some(ConfigError::ScratchTooSmall { needed: 2, given: 1 }));
    assert!(standalone(1, 2, 2).is_none());
}

#[test]
fn a_group_step_updates_the_central_model_on_arrival() {
    // 4 workers in 2 groups {0,1} {2,3}; η = 0.5.
    let mut s = grouped(GroupedConfig::new(4, 0.5, 2), 1);
    s.handle(Instant::ZERO, WorkerId(2), grad(0, 0, &[2.0])).unwrap();
    s.handle(Instant::ZERO, WorkerId(0), grad(0, 0, &[4.0])).unwrap();
    assert_eq!(s.version(), Version(0));
    let _ = drain_server(&mut s);
    s.handle(Instant::ZERO, WorkerId(3), grad(0, 0, &[6.0])).unwrap();
    // Group 1 closed: mean 4, w = 1 - 0.5 * 4 = -1.
    assert_eq!((s.version(), s.params()), (Version(1), &[-1.0][..]));
    assert_eq!(s.group_version(1), Some(Version(1)));
    assert_eq!(s.group_version(0), Some(Version(0)));
    let outs = drain_server(&mut s);
    assert_eq!(
        outs,
        [
            Out::Event(ServerEvent::GroupApplied {
                group: 1,
                base: Version(0),
                version: Version(1),
                staleness: 0,
                contributions: 2
            }),
            Out::Event(ServerEvent::Applied {
                worker: WorkerId(2),
                base: Version(0),
                version: Version(1),
                staleness: 0,
                weight: 0.5
            }),
            Out::Event(ServerEvent::Applied {
                worker: WorkerId(3),
                base: Version(0),
                version: Version(1),
                staleness: 0,
                weight: 0.5
            }),
            Out::Event(ServerEvent::ModelUpdated { version: Version(1), contributions: 2, mean_loss: None }),
            Out::Send(
                Recipient::Worker(WorkerId(2)),
                ToWorkerOwned::Model { version: 1, clock: 1, values: vec![-1.0] }
            ),
            Out::Send(
                Recipient::Worker(WorkerId(3)),
                ToWorkerOwned::Model { version: 1, clock: 1, values: vec![-1.0] }
            ),
        ]
    );
    // Group 0 closes on its old base: staleness 1, applied to the current central model.
    s.handle(Instant::ZERO, WorkerId(1), grad(0, 0, &[8.0])).unwrap();
    assert_eq!((s.version(), s.params()), (Version(2), &[-4.0][..]));
    let outs = drain_server(&mut s);
    assert!(outs.contains(&Out::Event(ServerEvent::GroupApplied {
        group: 0,
        base: Version(0),
        version: Version(2),
        staleness: 1,
        contributions: 2
    })));
    assert!(outs.contains(&Out::Send(
        Recipient::Worker(WorkerId(0)),
        ToWorkerOwned::Model { version: 2, clock: 2, values: vec![-4.0] }
    )));
    assert_eq!(s.group_base(0), Some(Version(2)));
    assert_eq!(s.group_model(0), Some(&[-4.0][..]));
    assert_eq!(s.group_model(1), Some(&[-1.0][..]));
    assert_eq!(s.group_model(2), None);
    assert_eq!((s.stats().accepted, s.stats().applied, s.stats().updates), (4, 4, 2));
}

#[test]
fn refusals_change_nothing() {
    let mut s = grouped(GroupedConfig::new(4, 0.5, 2), 2);
    let now = Instant::ZERO;
    s.handle(now, WorkerId(0), grad(0, 3, &[1.0, 1.0])).unwrap();
    let _ = drain_server(&mut s);
    let snapshot = |s: &Grouped| {
        (
            s.params().to_vec(),
            s.version(),
            s.group_version(0),
            (s.groups[0].count, s.groups[0].mark),
            s.group_model(0).unwrap().to_vec(),
        )
    };
    let before = snapshot(&s);
    let acc_before = parts(s.scratch.as_mut(), 0, 2, 2).unwrap().1.to_vec();
    assert_duplicates(&mut s, now, &[3, 4]);
    assert_gradient_refusals(&mut s, now, 4);
    assert_eq!(s.handle(now, WorkerId(1), grad(0, 0, &[1e300, 1e300])), Err(Reject::NormTooLarge));
    assert_eq!(
        s.handle(now, WorkerId(1), grad(1, 0, &[1.0, 1.0])),
        Err(Reject::FutureVersion { claimed: Version(1), current: Version(0) })
    );
    assert_eq!(s.handle(now, WorkerId(1), ToServer::Join { epoch: 2 }), Ok(()));
    let _ = drain_server(&mut s);
    assert_eq!(
        s.handle(now, WorkerId(1), ToServer::Join { epoch: 1 }),
        Err(Reject::StaleEpoch { worker: WorkerId(1), epoch: 1 })
    );
    assert_eq!(s.handle_worker_lost(now, WorkerId(9)), Err(Reject::UnknownWorker(WorkerId(9))));
    assert_eq!(snapshot(&s), before);
    assert_eq!(parts(s.scratch.as_mut(), 0, 2, 2).unwrap().1.to_vec(), acc_before);
    assert!(s.poll_output().is_none());
    assert_eq!(s.stats().rejected, 11);
    assert_eq!(s.stats().accepted, 1);
}

#[test]
fn a_gradient_for_a_closed_step_is_dropped_as_stale() {
    let mut s = grouped(GroupedConfig::new(2, 0.5, 2), 1);
    s.handle(Instant::ZERO, WorkerId(0), grad(0, 0, &[1.0])).unwrap();
    let _ = drain_server(&mut s);
    s.handle(Instant::ZERO, WorkerId(0), grad(0, 1, &[1.0])).unwrap();
    assert_eq!(
        drain_server(&mut s),
        [Out::Event(ServerEvent::Dropped { worker: WorkerId(0), base: Version(0), reason: DropReason::Stale })]
    );
    assert_eq!(s.stats().dropped_for(DropReason::Stale), 1);
    assert_eq!(s.version(), Version(1));
}

#[test]
fn joins_losses_and_stall_reports_are_per_group() {
    let mut c = GroupedConfig::new(4, 0.5, 2);
    c.stall_report = Some(Duration::from_secs(1));
    let mut s = grouped(c, 1);
    s.handle(Instant::ZERO, WorkerId(3), ToServer::Join { epoch: 0 }).unwrap();
    assert_eq!(
        drain_server(&mut s),
        [
            Out::Event(ServerEvent::WorkerJoined { worker: WorkerId(3), epoch: 0 }),
            Out::Send(Recipient::Worker(WorkerId(3)), ToWorkerOwned::Model { version: 0, clock: 0, values: vec![1.0] }),
        ]
    );
    s.handle(Instant::ZERO, WorkerId(2), grad(0, 0, &[1.0])).unwrap();
    s.handle(Instant::ZERO, WorkerId(3), grad(0, 0, &[1.0])).unwrap();
    let mut outs = drain_server(&mut s);
    s.handle(Instant::ZERO, WorkerId(1), grad(0, 0, &[1.0])).unwrap();
    s.handle(Instant::ZERO, WorkerId(0), ToServer::Leave).unwrap();
    outs.extend(drain_server(&mut s));
    assert!(outs.contains(&Out::Event(ServerEvent::WorkerLost { worker: WorkerId(0) })));
    let at = s.poll_timeout().unwrap();
    assert_eq!(at, Instant::ZERO + Duration::from_secs(1));
    s.handle_timeout(at);
    // Group 0 waits for worker 0; group 1 has an open step with nobody in: it waits for 2.
    let outs = drain_server(&mut s);
    let t0 = Instant::ZERO;
    assert_eq!(
        outs,
        [
            Out::Event(ServerEvent::Stalled { waiting_for: WorkerId(0), missing: 1, since: t0 }),
            Out::Event(ServerEvent::Stalled { waiting_for: WorkerId(2), missing: 2, since: t0 }),
        ]
    );
    assert!(s.poll_timeout().unwrap() > at);
    s.stop();
    assert_eq!(s.poll_timeout(), None);
    assert_eq!(drain_server(&mut s), [Out::Send(Recipient::AllWorkers, ToWorkerOwned::Stop)]);
}

#[test]
fn local_steps_move_the_group_model_and_send_the_sum() {
    // One group of 2, H = 2: two BSP steps on the group model, then one central update
    // that lands where the group model would be after both.
    let mut c = GroupedConfig::new(2, 0.5, 1);
    c.local_steps = 2;
    let mut s = grouped(c, 1);
    s.handle(Instant::ZERO, WorkerId(0), grad(0, 0, &[2.0])).unwrap();
    s.handle(Instant::ZERO, WorkerId(1), grad(0, 0, &[4.0])).unwrap();
    assert_eq!((s.version(), s.group_version(0), s.group_model(0)), (Version(0), Some(Version(1)), Some(&[-0.5][..])));
    let outs = drain_server(&mut s);
    assert_eq!(outs.len(), 3, "{outs:?}");
    assert!(outs.contains(&Out::Event(ServerEvent::Applied {
        worker: WorkerId(0),
        base: Version(0),
        version: Version(1),
        staleness: 0,
        weight: 0.5
    })));
    assert_eq!(
        outs[2],
        Out::Send(Recipient::AllWorkers, ToWorkerOwned::Model { version: 1, clock: 1, values: vec![-0.5] })
    );
    s.handle(Instant::ZERO, WorkerId(0), grad(1, 1, &[6.0])).unwrap();
    s.handle(Instant::ZERO, WorkerId(1), grad(1, 1, &[2.0])).unwrap();
    // Central: 1 - 0.5 * (3 + 4) = -2.5; the group re-bases at central version 1, but its
    // own version must grow: max(1 + 1, 1) = 2.
    assert_eq!((s.version(), s.params()), (Version(1), &[-2.5][..]));
    assert_eq!((s.group_version(0), s.group_base(0)), (Some(Version(2)), Some(Version(1))));
    let outs = drain_server(&mut s);
    assert_eq!(
        outs[0],
        Out::Event(ServerEvent::GroupApplied {
            group: 0,
            base: Version(0),
            version: Version(1),
            staleness: 0,
            contributions: 4
        })
    );
    assert!(outs.contains(&Out::Event(ServerEvent::ModelUpdated {
        version: Version(1),
        contributions: 4,
        mean_loss: None
    })));
    assert!(outs.contains(&Out::Send(
        Recipient::AllWorkers,
        ToWorkerOwned::Model { version: 2, clock: 2, values: vec![-2.5] }
    )));
    assert_eq!(s.stats().applied, 4);
}

#[test]
fn an_aggregate_that_would_overflow_is_dropped_and_the_group_restarts() {
    let mut c = GroupedConfig::new(1, 0.5, 1);
    c.local_steps = 2;
    let mut s: GroupedServer<f32, Vec<f32>> = GroupedServer::new(c, vec![0.0; 1], vec![0.0; 3]).unwrap();
    // Its square is finite; the square of twice it is not.
    const BIG: [f32; 1] = [1.5e19];
    let g = |seq, base: u64| ToServer::Grad {
        base: Version(base),
        iteration: 0,
        seq,
        values: Values::Slice(&BIG[..]),
        loss: None,
    };
    s.handle(Instant::ZERO, WorkerId(0), g(0, 0)).unwrap();
    let _ = drain_server(&mut s);
    s.handle(Instant::ZERO, WorkerId(0), g(1, 1)).unwrap();
    let outs = drain_server(&mut s);
    assert_eq!(
        outs[0],
        Out::Event(ServerEvent::Dropped { worker: WorkerId(0), base: Version(1), reason: DropReason::Aborted })
    );
    // The group re-joined: it is back on the central model (unchanged), with a newer version.
    assert_eq!((s.version(), s.params()), (Version(0), &[0.0f32][..]));
    assert_eq!((s.group_version(0), s.group_model(0)), (Some(Version(2)), Some(&[0.0f32][..])));
    assert!(matches!(outs.last(), Some(Out::Send(Recipient::AllWorkers, ToWorkerOwned::Model { version: 2, .. }))));
    assert_eq!(s.stats().dropped_for(DropReason::Aborted), 1);
    assert_eq!(s.stats().applied, 1);
}
