//! WBSP server unit tests: round closing, scaling, refusals, clipping and lost workers.

use super::*;

// ---------------------------------------------------------------- server unit tests

fn server(n: u32) -> Srv {
    Srv::new(WbspConfig::new(n, 0.5), vec![0.0; 2], vec![7.0; 3]).unwrap()
}

#[test]
fn round_closes_on_the_last_live_uploader_and_late_deltas_go_to_the_next_round() {
    let mut s = server(2);
    for w in 0..2 {
        s.handle(t(0), WorkerId(w), ToServer::Join { epoch: 0 }).unwrap();
    }
    drain_server(&mut s);
    // Worker 0 is fast: two deltas in round 0, the second replied without a pull.
    s.handle(t(1), WorkerId(0), delta(0, 0, &[2.0, 0.0])).unwrap();
    assert_eq!(drain_server(&mut s), ["applied 0 base0 v1 stale0 w0.5", "ack Worker(WorkerId(0)) r0 pull=false"]);
    s.handle(t(2), WorkerId(0), delta(0, 1, &[2.0, 0.0])).unwrap();
    assert_eq!(drain_server(&mut s), ["applied 0 base0 v1 stale0 w0.5", "ack Worker(WorkerId(0)) r0 pull=false"]);
    assert_eq!(s.version(), Version(0));
    assert_eq!(s.accumulator(), &[2.0, 0.0]);
    // Worker 1, the slowest, closes the round and is told to pull at once.
    s.handle(t(3), WorkerId(1), delta(0, 0, &[0.0, 4.0])).unwrap();
    assert_eq!(
        drain_server(&mut s),
        ["applied 1 base0 v1 stale0 w0.5", "updated v1 n3", "ack Worker(WorkerId(1)) r1 pull=true"]
    );
    assert_eq!(s.params(), &[2.0, 2.0]);
    assert_eq!(s.accumulator(), &[0.0, 0.0]);
    // Worker 0's next delta is late (tag 0): applied into round 1, reply says pull.
    s.handle(t(4), WorkerId(0), delta(0, 2, &[2.0, 0.0])).unwrap();
    assert_eq!(drain_server(&mut s), ["applied 0 base0 v2 stale1 w0.5", "ack Worker(WorkerId(0)) r1 pull=true"]);
    s.handle(t(5), WorkerId(0), ToServer::Pull { have: Version(0), min_clock: 0 }).unwrap();
    assert_eq!(drain_server(&mut s), ["model Worker(WorkerId(0)) v1 Some(2.0)"]);
    s.handle(t(5), WorkerId(0), ToServer::Pull { have: Version(1), min_clock: 0 }).unwrap();
    assert_eq!(drain_server(&mut s), ["send Worker(WorkerId(0)) NotNewer"]);
    // Worker 1 pulls too and gets the same version (W2).
    s.handle(t(6), WorkerId(1), ToServer::Pull { have: Version(0), min_clock: 0 }).unwrap();
    assert_eq!(drain_server(&mut s), ["model Worker(WorkerId(1)) v1 Some(2.0)"]);
    // Round 1 closes when worker 1 uploads again (worker 0's late delta counted for it).
    s.handle(t(7), WorkerId(1), delta(1, 1, &[0.0, 2.0])).unwrap();
    assert_eq!(
        drain_server(&mut s),
        ["applied 1 base1 v2 stale0 w0.5", "updated v2 n2", "ack Worker(WorkerId(1)) r2 pull=true"]
    );
    assert_eq!(s.params(), &[3.0, 3.0]);
    assert_eq!(s.stats().accepted, 5);
    assert_eq!(s.stats().applied, 5);
    assert_eq!(s.stats().updates, 2);
    assert_eq!(s.stats().rejected, 0);
}

#[test]
fn per_local_step_scaling_weighs_a_coalesced_delta_as_one_step() {
    let mut c = WbspConfig::new(2, 0.5);
    c.delta_scaling = DeltaScaling::PerLocalStep;
    let mut s = Srv::new(c, vec![0.0; 1], vec![0.0; 1]).unwrap();
    let d = [8.0];
    s.handle(
        t(0),
        WorkerId(0),
        ToServer::Delta { round: Version(0), local_steps: 4, seq: 0, values: Values::Slice(&d), loss: None },
    )
    .unwrap();
    assert_eq!(drain_server(&mut s)[0], "applied 0 base0 v1 stale0 w0.125");
    assert_eq!(s.accumulator(), &[1.0]);
}

#[test]
fn server_refusals_change_nothing() {
    let mut c = WbspConfig::new(2, 0.5);
    c.gradient_policy.max_norm = Some(100.0);
    c.gradient_policy.on_large = LargeGradient::Reject;
    let mut s = Srv::new(c, vec![1.0; 2], vec![0.0; 2]).unwrap();
    s.handle(t(0), WorkerId(0), delta(0, 5, &[1.0, 1.0])).unwrap();
    drain_server(&mut s);
    let snapshot =
        |s: &Srv| (s.params().to_vec(), s.accumulator().to_vec(), s.version(), s.round_deltas(), s.uploaded());
    let before = snapshot(&s);
    let stats = *s.stats();
    let cases: Vec<(ToServer<'_, f64>, WorkerId, Reject)> = vec![
        (delta(0, 6, &[1.0, 1.0]), WorkerId(2), Reject::UnknownWorker(WorkerId(2))),
        (delta(0, 5, &[1.0, 1.0]), WorkerId(0), Reject::Duplicate { worker: WorkerId(0), seq: 5 }),
        (delta(0, 4, &[1.0, 1.0]), WorkerId(0), Reject::Duplicate { worker: WorkerId(0), seq: 4 }),
        (delta(1, 6, &[1.0, 1.0]), WorkerId(0), Reject::FutureVersion { claimed: Version(1), current: Version(0) }),
        (
            ToServer::Delta {
                round: Version(0),
                local_steps: 0,
                seq: 6,
                values: Values::Slice(&[1.0, 1.0]),
                loss: None,
            },
            WorkerId(0),
            Reject::Unexpected { kind: "Delta with local_steps = 0" },
        ),
        (delta(0, 6, &[1.0]), WorkerId(0), Reject::WrongLength(math::LengthMismatch { expected: 2, actual: 1 })),
        (delta(0, 6, &[f64::NAN, 1.0]), WorkerId(0), Reject::NotFinite),
        (delta(0, 6, &[f64::INFINITY, 1.0]), WorkerId(0), Reject::NotFinite),
        (delta(0, 6, &[1000.0, 1.0]), WorkerId(0), Reject::NormTooLarge),
        (
            ToServer::Grad { base: Version(0), iteration: 0, seq: 6, values: Values::Slice(&[1.0, 1.0]), loss: None },
            WorkerId(0),
            Reject::Unexpected { kind: "Grad" },
        ),
        (
            ToServer::Clock { clock: 0, seq: 6, values: Values::Slice(&[1.0, 1.0]), loss: None },
            WorkerId(0),
            Reject::Unexpected { kind: "Clock" },
        ),
        (
            ToServer::Pull { have: Version(3), min_clock: 0 },
            WorkerId(1),
            Reject::FutureVersion { claimed: Version(3), current: Version(0) },
        ),
        (ToServer::Join { epoch: 0 }, WorkerId(9), Reject::UnknownWorker(WorkerId(9))),
    ];
    let count = cases.len() as u64;
    for (msg, from, expected) in cases {
        assert_eq!(s.handle(t(1), from, msg), Err(expected));
        assert!(s.poll_output().is_none());
        assert_eq!(snapshot(&s), before);
    }
    assert_eq!(s.stats().rejected, stats.rejected + count);
    assert_eq!(s.stats().accepted, stats.accepted);
    assert_eq!(s.handle_worker_lost(t(1), WorkerId(7)), Err(Reject::UnknownWorker(WorkerId(7))));
    // A stale epoch's join is refused too.
    s.handle(t(1), WorkerId(1), ToServer::Join { epoch: 3 }).unwrap();
    drain_server(&mut s);
    assert_eq!(
        s.handle(t(1), WorkerId(1), ToServer::Join { epoch: 2 }),
        Err(Reject::StaleEpoch { worker: WorkerId(1), epoch: 2 })
    );
}

#[test]
fn clipped_delta_reports_its_weight() {
    let mut c = WbspConfig::new(2, 0.5);
    c.gradient_policy.max_norm = Some(5.0);
    let mut s = Srv::new(c, vec![0.0; 2], vec![0.0; 2]).unwrap();
    s.handle(t(0), WorkerId(0), delta(0, 0, &[6.0, 8.0])).unwrap();
    assert_eq!(drain_server(&mut s)[0], "applied 0 base0 v1 stale0 w0.25");
    assert_eq!(s.accumulator(), &[1.5, 2.0]);
}

#[test]
fn lost_worker_and_deadline_let_the_round_close() {
    let mut c = WbspConfig::new(3, 0.5);
    c.round_deadline = Some(Duration::from_nanos(100));
    let mut s = Srv::new(c, vec![0.0; 1], vec![0.0; 1]).unwrap();
    assert_eq!(s.poll_timeout(), None, "the deadline clock starts with the first message");
    s.handle(t(10), WorkerId(0), delta(0, 0, &[2.0])).unwrap();
    drain_server(&mut s);
    assert_eq!(s.poll_timeout(), Some(t(110)));
    // The transport reports worker 2 lost: the round still waits for worker 1.
    s.handle_worker_lost(t(20), WorkerId(2)).unwrap();
    assert_eq!(drain_server(&mut s), ["WorkerLost { worker: WorkerId(2) }"]);
    assert_eq!(s.version(), Version(0));
    // Early timeout call: nothing happens.
    s.handle_timeout(t(50));
    assert!(s.poll_output().is_none());
    // The deadline evicts worker 1 and closes the round without it.
    s.handle_timeout(t(110));
    assert_eq!(drain_server(&mut s), ["WorkerLost { worker: WorkerId(1) }", "updated v1 n1"]);
    assert_eq!(s.version(), Version(1));
    assert_eq!(s.params(), &[2.0 / 3.0]);
    assert_eq!(s.poll_timeout(), Some(t(210)), "the next round waits for worker 0 until its own deadline");
    // Worker 1 comes back with a late delta: live again, the round now needs worker 0 too.
    s.handle(t(120), WorkerId(1), delta(0, 0, &[3.0])).unwrap();
    assert_eq!(
        drain_server(&mut s),
        ["applied 1 base0 v2 stale1 w0.3333333333333333", "ack Worker(WorkerId(1)) r1 pull=true"]
    );
    assert_eq!(s.poll_timeout(), Some(t(210)));
    s.handle(t(130), WorkerId(0), delta(1, 1, &[3.0])).unwrap();
    assert_eq!(drain_server(&mut s)[1], "updated v2 n2");
    // A round with no delta at all at the deadline evicts everyone and closes on the next upload.
    s.handle_timeout(t(230));
    assert_eq!(drain_server(&mut s), ["WorkerLost { worker: WorkerId(0) }", "WorkerLost { worker: WorkerId(1) }"]);
    assert_eq!(s.poll_timeout(), None);
    s.handle(t(300), WorkerId(0), delta(2, 2, &[3.0])).unwrap();
    assert_eq!(drain_server(&mut s)[1], "updated v3 n1");
    // A clean Leave also removes the worker from the live set.
    s.handle(t(310), WorkerId(0), ToServer::Leave).unwrap();
    assert_eq!(drain_server(&mut s), ["WorkerLost { worker: WorkerId(0) }"]);
}

#[test]
fn without_deadline_a_silent_dead_worker_stalls_the_round() {
    let mut s = server(2);
    for seq in 0..50 {
        s.handle(t(seq), WorkerId(0), delta(0, seq, &[1.0, 1.0])).unwrap();
        drain_server(&mut s);
    }
    assert_eq!(s.version(), Version(0));
    assert_eq!(s.round_deltas(), 50);
    assert_eq!(s.poll_timeout(), None);
}
