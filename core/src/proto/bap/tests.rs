use super::*;
use crate::proto::common::testkit::prelude::*;
use crate::proto::common::testkit::{Cluster, Entry};
use crate::proto::common::testkit::{WorkerOut as Out, drain_server as drain, drain_worker};
use crate::proto::ssp::harness::{check_bsp_trace, net, trace_case};
use crate::proto::{ToServerOwned, ToWorkerOwned};
use proptest::prelude::*;
use std::collections::BTreeSet;
use std::vec;
use std::vec::Vec;

type Srv = BapServer<f64, Vec<f64>>;
type Wrk = BapWorker<f64, Vec<f64>>;

const T0: Instant = Instant::ZERO;

fn ms(x: u64) -> Instant {
    T0 + Duration::from_millis(x)
}

fn server_with(c: BapConfig, dim: usize) -> Srv {
    let scratch = c.open_iterations() * dim;
    BapServer::new(c, vec![1.0; dim], vec![0.0; scratch]).unwrap()
}

fn server(n: u32, s: u64, dim: usize) -> Srv {
    server_with(BapConfig::new(n, 0.5, s), dim)
}

fn grad(base: u64, iteration: u64, seq: u64, values: &[f64]) -> ToServer<'_, f64> {
    ToServer::Grad { base: Version(base), iteration, seq, values: Values::Slice(values), loss: None }
}

fn pull(have: u64, min_clock: u64) -> ToServer<'static, f64> {
    ToServer::Pull { have: Version(have), min_clock }
}

fn model(version: u64, values: &[f64]) -> ToWorker<'_, f64> {
    ToWorker::Model { version: Version(version), clock: version, values: Values::Slice(values) }
}

#[test]
fn config_errors() {
    let mk = |c: BapConfig, p: usize, a: usize| BapServer::<f32, Vec<f32>>::new(c, vec![0.0; p], vec![0.0; a]).err();
    assert_eq!(mk(BapConfig::new(0, 0.1, 1), 1, 2), Some(ConfigError::WorkerCount(0)));
    assert_eq!(mk(BapConfig::new(1, -0.1, 1), 1, 2), Some(ConfigError::LearningRate));
    assert_eq!(mk(BapConfig::new(1, 0.1, MAX_BAP_STALENESS + 1), 1, 64), Some(ConfigError::Knob("staleness")));
    let mut below = BapConfig::new(1, 0.1, 0);
    below.bound = BapBound::Below;
    assert_eq!(mk(below, 1, 1), Some(ConfigError::Knob("staleness")));
    below.staleness = 3;
    assert_eq!(below.s_bap(), Ok(2));
    assert_eq!(below.open_iterations(), 3);
    let mut zero = BapConfig::new(1, 0.1, 0);
    zero.iteration_timeout = Some(Duration::ZERO);
    assert_eq!(mk(zero, 1, 1), Some(ConfigError::Knob("iteration_timeout")));
    assert_eq!(mk(BapConfig::new(1, 0.1, 2), 4, 11), Some(ConfigError::ScratchTooSmall { needed: 12, given: 11 }));
    assert_eq!(mk(BapConfig::new(1, 0.1, 2), 0, 11), Some(ConfigError::EmptyModel));
    assert_eq!(
        BapWorker::<f32, Vec<f32>>::new(BapConfig::new(2, 0.1, 1), setup(0), vec![0.0; 3], vec![0.0; 2]).err(),
        Some(ConfigError::ScratchTooSmall { needed: 3, given: 2 })
    );
    let pc = crate::proto::ProtocolConfig::Bap(BapConfig::new(2, 0.1, 3));
    assert_eq!((pc.name(), pc.server_scratch_len(10), pc.worker_scratch_len(10)), ("bap", 40, 10));
}

#[test]
fn iterations_aggregate_separately_and_close_in_order() {
    let mut s = server(2, 1, 1);
    // Worker 0 is fast: gradients for iterations 1 and 2 (both on version 0).
    s.handle(T0, WorkerId(0), grad(0, 1, 0, &[2.0])).unwrap();
    s.handle(T0, WorkerId(0), grad(0, 2, 1, &[4.0])).unwrap();
    assert_eq!(s.version(), Version(0));
    assert_eq!(s.received(2), Some(1));
    s.handle(T0, WorkerId(1), grad(0, 2, 0, &[4.0])).unwrap();
    // Iteration 2 is complete but waits for iteration 1.
    assert_eq!(s.version(), Version(0));
    let _ = drain(&mut s);
    s.handle(T0, WorkerId(1), grad(0, 1, 1, &[6.0])).unwrap();
    assert_eq!(s.version(), Version(2));
    // w1 = 1 - 0.5*4 = -1; w2 = -1 - 0.5*4 = -3.
    assert_eq!(s.params(), &[-3.0]);
    let (events, _) = drain(&mut s);
    let updates: Vec<_> = events.iter().filter(|e| matches!(e, ServerEvent::ModelUpdated { .. })).collect();
    assert_eq!(
        updates,
        [
            &ServerEvent::ModelUpdated { version: Version(1), contributions: 2, mean_loss: None },
            &ServerEvent::ModelUpdated { version: Version(2), contributions: 2, mean_loss: None }
        ]
    );
    assert!(events.contains(&ServerEvent::Applied {
        worker: WorkerId(0),
        base: Version(0),
        version: Version(2),
        staleness: 1,
        weight: 0.5
    }));
    assert_eq!(s.stats().applied, 4);
}

#[test]
fn pulls_answer_now_say_not_newer_or_wait() {
    let mut s = server(2, 1, 1);
    s.handle(T0, WorkerId(0), pull(0, 0)).unwrap();
    let (_, sends) = drain(&mut s);
    assert_eq!(sends, [(Recipient::Worker(WorkerId(0)), ToWorkerOwned::NotNewer { version: 0 })]);
    s.handle(T0, WorkerId(0), pull(0, 1)).unwrap();
    assert!(drain(&mut s).1.is_empty());
    s.handle(T0, WorkerId(0), grad(0, 1, 0, &[2.0])).unwrap();
    s.handle(T0, WorkerId(1), grad(0, 1, 0, &[2.0])).unwrap();
    let (_, sends) = drain(&mut s);
    assert_eq!(
        sends,
        [(Recipient::Worker(WorkerId(0)), ToWorkerOwned::Model { version: 1, clock: 1, values: vec![0.0] })]
    );
    s.handle(T0, WorkerId(1), pull(0, 0)).unwrap();
    assert!(matches!(drain(&mut s).1[..], [(_, ToWorkerOwned::Model { version: 1, .. })]));
}

#[test]
fn refusals_change_nothing() {
    let mut s = server(2, 1, 2);
    s.handle(T0, WorkerId(0), grad(0, 1, 3, &[1.0, 1.0])).unwrap();
    let _ = drain(&mut s);
    let before = (s.params().to_vec(), s.version(), s.received(1), s.received(2));
    let cases: Vec<(u32, ToServer<'_, f64>)> = vec![
        (0, grad(0, 2, 3, &[1.0, 1.0])),      // seq replay
        (0, grad(0, 1, 4, &[1.0, 1.0])),      // second gradient for iteration 1
        (1, grad(1, 2, 0, &[1.0, 1.0])),      // base from the future
        (1, grad(0, 0, 0, &[1.0, 1.0])),      // base >= iteration
        (1, grad(0, 1, 0, &[1.0])),           // wrong length
        (1, grad(0, 1, 0, &[f64::NAN, 0.0])), // not finite
        (2, grad(0, 1, 0, &[1.0, 1.0])),      // unknown worker
        (1, pull(1, 0)),                      // have from the future
        (1, pull(0, 3)),                      // unreachable version
        (1, ToServer::Clock { clock: 0, seq: 0, values: Values::Slice(&[1.0, 1.0]), loss: None }),
    ];
    let k = cases.len() as u64;
    for (w, msg) in cases {
        assert!(s.handle(T0, WorkerId(w), msg).is_err());
    }
    assert_eq!((s.params().to_vec(), s.version(), s.received(1), s.received(2)), before);
    assert!(s.poll_output().is_none());
    assert_eq!(s.stats().rejected, k);
    assert_eq!(s.stats().accepted, 1);
}

#[test]
fn gradients_beyond_the_bound_are_dropped_with_a_reason() {
    let mut s = server(2, 1, 1);
    // Iteration 3 is outside the window 1..=2; iteration 2 on base... lag is fine.
    s.handle(T0, WorkerId(0), grad(0, 3, 0, &[1.0])).unwrap();
    let (events, _) = drain(&mut s);
    assert_eq!(
        events,
        [ServerEvent::Dropped { worker: WorkerId(0), base: Version(0), reason: DropReason::OverStalenessBound }]
    );
    assert_eq!(s.stats().dropped_for(DropReason::OverStalenessBound), 1);
    assert_eq!(s.stats().accepted, 1);
}

#[test]
fn timeout_closes_with_the_gradients_received_and_aborts_the_rest() {
    let mut c = BapConfig::new(3, 0.5, 1);
    c.iteration_timeout = Some(Duration::from_millis(10));
    let mut s = server_with(c, 1);
    assert_eq!(s.poll_timeout(), None);
    s.handle(ms(5), WorkerId(0), grad(0, 1, 0, &[2.0])).unwrap();
    assert_eq!(s.poll_timeout(), Some(ms(15)));
    s.handle(ms(8), WorkerId(1), grad(0, 1, 0, &[4.0])).unwrap();
    s.handle(ms(9), WorkerId(0), pull(0, 1)).unwrap();
    let _ = drain(&mut s);
    s.handle_timeout(ms(14));
    assert_eq!(s.version(), Version(0));
    s.handle_timeout(ms(15));
    assert_eq!(s.version(), Version(1));
    assert_eq!(s.params(), &[-0.5]); // 1 - 0.5 * mean(2, 4)
    let (events, sends) = drain(&mut s);
    assert!(events.contains(&ServerEvent::ModelUpdated { version: Version(1), contributions: 2, mean_loss: None }));
    assert!(sends.contains(&(Recipient::Worker(WorkerId(2)), ToWorkerOwned::Abort { iteration: 1 })));
    assert!(sends.contains(&(
        Recipient::Worker(WorkerId(0)),
        ToWorkerOwned::Model { version: 1, clock: 1, values: vec![-0.5] }
    )));
    assert_eq!(sends.len(), 2);
    // The straggler's gradient, already on its way, is dropped and reported.
    s.handle(ms(16), WorkerId(2), grad(0, 1, 0, &[8.0])).unwrap();
    let (events, _) = drain(&mut s);
    assert_eq!(events, [ServerEvent::Dropped { worker: WorkerId(2), base: Version(0), reason: DropReason::Aborted }]);
    assert_eq!(s.params(), &[-0.5]);
    let st = s.stats();
    assert_eq!((st.accepted, st.applied, st.dropped_total()), (3, 2, 1));
}

#[test]
fn timeout_reference_points() {
    // Worker 0 sends iteration 2's gradient at 1 ms, before version 1 is published at 9 ms.
    let run = |from: TimeoutFrom| {
        let mut c = BapConfig::new(2, 0.5, 1);
        c.iteration_timeout = Some(Duration::from_millis(10));
        c.timeout_from = from;
        let mut s = server_with(c, 1);
        s.handle(ms(1), WorkerId(0), grad(0, 1, 0, &[1.0])).unwrap();
        s.handle(ms(1), WorkerId(0), grad(0, 2, 1, &[1.0])).unwrap();
        s.handle(ms(9), WorkerId(1), grad(0, 1, 0, &[1.0])).unwrap();
        let _ = drain(&mut s);
        assert_eq!(s.version(), Version(1));
        s.poll_timeout()
    };
    assert_eq!(run(TimeoutFrom::LaterOfBoth), Some(ms(19)));
    assert_eq!(run(TimeoutFrom::Publication), Some(ms(19)));
    assert_eq!(run(TimeoutFrom::FirstGradient), Some(ms(11)));
}

#[test]
fn lost_workers_are_not_waited_for() {
    let mut s = server(2, 0, 1);
    s.handle(T0, WorkerId(0), grad(0, 1, 0, &[2.0])).unwrap();
    s.handle_worker_lost(T0, WorkerId(1)).unwrap();
    assert_eq!(s.version(), Version(1));
    let (events, sends) = drain(&mut s);
    assert!(events.contains(&ServerEvent::WorkerLost { worker: WorkerId(1) }));
    assert!(sends.is_empty(), "no abort when not closed by timeout");
    // Its late gradient is dropped as from a lost worker (and makes it live again).
    s.handle(T0, WorkerId(1), grad(0, 1, 0, &[2.0])).unwrap();
    let (events, _) = drain(&mut s);
    assert_eq!(
        events,
        [ServerEvent::Dropped { worker: WorkerId(1), base: Version(0), reason: DropReason::WorkerLost }]
    );
    s.handle(T0, WorkerId(0), grad(1, 2, 1, &[2.0])).unwrap();
    assert_eq!(s.version(), Version(1), "worker 1 is live again and waited for");
}

#[test]
fn stall_is_reported_naming_the_missing_worker() {
    let mut c = BapConfig::new(3, 0.5, 0);
    c.stall_report = Some(Duration::from_secs(1));
    let mut s = server_with(c, 1);
    s.handle(T0, WorkerId(0), grad(0, 1, 0, &[1.0])).unwrap();
    s.handle(T0, WorkerId(2), grad(0, 1, 0, &[1.0])).unwrap();
    let _ = drain(&mut s);
    let at = s.poll_timeout().unwrap();
    s.handle_timeout(at);
    let (events, _) = drain(&mut s);
    assert!(matches!(events[..], [ServerEvent::Stalled { waiting_for: WorkerId(1), missing: 1, .. }]));
}

#[test]
fn worker_runs_ahead_then_blocks_at_the_bound() {
    let mut w: Wrk = BapWorker::new(BapConfig::new(2, 0.5, 1), setup(0), vec![0.0; 1], vec![0.0; 1]).unwrap();
    assert_eq!(drain_worker(&mut w), [Out::Send(ToServerOwned::Join { epoch: 0 })]);
    w.handle(T0, model(0, &[1.0])).unwrap();
    assert_eq!(drain_worker(&mut w), [Out::Compute(ComputeId(0), Version(0), vec![1.0])]);
    assert_eq!(w.iteration(), 1);
    w.handle_gradient(T0, ComputeId(0), &[3.0]).unwrap();
    assert_eq!(
        drain_worker(&mut w),
        [
            Out::Send(ToServerOwned::Grad { base: 0, iteration: 1, seq: 0, values: vec![3.0] }),
            Out::Send(ToServerOwned::Pull { have: 0, min_clock: 0 }),
        ]
    );
    // Nothing newer: iteration 2 runs on the stale cache (lag 1 <= 1), without its own gradient.
    w.handle(T0, ToWorker::NotNewer { version: Version(0) }).unwrap();
    assert_eq!(drain_worker(&mut w), [Out::Compute(ComputeId(1), Version(0), vec![1.0])]);
    w.handle_gradient(T0, ComputeId(1), &[5.0]).unwrap();
    // Iteration 3 needs version >= 1.
    assert_eq!(
        drain_worker(&mut w),
        [
            Out::Send(ToServerOwned::Grad { base: 0, iteration: 2, seq: 1, values: vec![5.0] }),
            Out::Send(ToServerOwned::Pull { have: 0, min_clock: 1 }),
            Out::Event(WorkerEvent::Blocked { have: Version(0) }),
        ]
    );
    w.handle(T0, model(1, &[7.0])).unwrap();
    assert_eq!(drain_worker(&mut w), [Out::Compute(ComputeId(2), Version(1), vec![7.0])]);
    assert_eq!(w.iteration(), 3);
    // Aborted: abandon, pull at least version 3, continue with iteration 4.
    w.handle(T0, ToWorker::Abort { iteration: 2 }).unwrap();
    assert!(drain_worker(&mut w).is_empty(), "an abort for another iteration is ignored");
    w.handle(T0, ToWorker::Abort { iteration: 3 }).unwrap();
    assert_eq!(
        drain_worker(&mut w),
        [
            Out::Event(WorkerEvent::Abandoned { id: ComputeId(2) }),
            Out::Send(ToServerOwned::Pull { have: 1, min_clock: 3 }),
            Out::Event(WorkerEvent::Blocked { have: Version(1) }),
        ]
    );
    assert_eq!(w.handle_gradient(T0, ComputeId(2), &[1.0]), Err(Reject::NoSuchComputation));
    w.handle(T0, model(3, &[9.0])).unwrap();
    assert_eq!(drain_worker(&mut w), [Out::Compute(ComputeId(3), Version(3), vec![9.0])]);
    assert_eq!(w.iteration(), 4);
}

#[test]
fn worker_refusals_change_nothing() {
    let mut rc = setup(0);
    rc.rejoin_after = Some(Duration::from_secs(1));
    let mut w: Wrk = BapWorker::new(BapConfig::new(2, 0.5, 0), rc, vec![0.0; 2], vec![0.0; 2]).unwrap();
    let _ = drain_worker(&mut w);
    assert_eq!(w.handle_gradient(T0, ComputeId(0), &[1.0, 1.0]), Err(Reject::NoSuchComputation));
    assert!(matches!(w.handle(T0, model(0, &[1.0])), Err(Reject::WrongLength(_))));
    w.handle(T0, model(2, &[1.0, 1.0])).unwrap();
    let _ = drain_worker(&mut w);
    assert_eq!(w.iteration(), 3, "a late joiner starts at the next open iteration");
    assert!(matches!(w.handle_gradient(T0, ComputeId(0), &[1.0]), Err(Reject::WrongLength(_))));
    assert_eq!(w.handle_gradient(T0, ComputeId(0), &[f64::INFINITY, 1.0]), Err(Reject::NotFinite));
    assert_eq!(w.handle(T0, model(2, &[1.0, 1.0])), Err(Reject::Duplicate { worker: WorkerId(0), seq: 2 }));
    assert_eq!(
        w.handle(T0, model(1, &[1.0, 1.0])),
        Err(Reject::OutdatedModel { received: Version(1), have: Version(2) })
    );
    assert_eq!(
        w.handle(T0, ToWorker::PushAck { round: Version(0), pull_now: true }),
        Err(Reject::Unexpected { kind: "PushAck" })
    );
    assert!(drain_worker(&mut w).is_empty());
    // A retry while pulling re-sends the gradient (same seq) and the pull.
    w.handle_gradient(T0, ComputeId(0), &[1.0, 2.0]).unwrap();
    let _ = drain_worker(&mut w);
    assert_eq!(w.poll_timeout(), Some(T0 + Duration::from_secs(1)));
    w.handle_timeout(T0 + Duration::from_secs(1));
    assert_eq!(
        drain_worker(&mut w),
        [
            Out::Send(ToServerOwned::Grad { base: 2, iteration: 3, seq: 0, values: vec![1.0, 2.0] }),
            Out::Send(ToServerOwned::Pull { have: 2, min_clock: 3 }),
        ]
    );
    w.handle(T0, ToWorker::Stop).unwrap();
    assert_eq!(drain_worker(&mut w), [Out::Event(WorkerEvent::Stopped)]);
    assert_eq!(w.handle(T0, model(5, &[1.0, 1.0])), Err(Reject::Stopped));
}

fn bap_net(n: u32, config: BapConfig, seed: u64) -> Cluster<Srv, Wrk> {
    let server = BapServer::new(config, vec![1.0, -0.5, 0.25], vec![0.0; config.open_iterations() * 3]).unwrap();
    let workers = (0..n).map(|i| BapWorker::new(config, setup(i), vec![0.0; 3], vec![0.0; 3]).unwrap()).collect();
    net(server, workers, seed, |s| s.version().0, |w| w.iteration())
}

#[test]
fn a_silent_worker_is_left_behind_with_a_time_limit() {
    let mut c = BapConfig::new(4, 0.5, 1);
    c.iteration_timeout = Some(Duration::from_millis(20));
    let mut net = bap_net(4, c, 11);
    net.max_steps = 30;
    net.dead[3] = true;
    net.run(200_000);
    assert_eq!(&net.done[..3], &[30, 30, 30]);
    assert!(net.version().0 >= 30);
    let st = *net.server.stats();
    assert_eq!(st.accepted, st.applied + st.dropped_total() + net.server.open_gradients());
    assert!(st.applied >= 60, "{st:?}");
    // Without a time limit the others stop at the bound.
    let mut net = bap_net(4, BapConfig::new(4, 0.5, 1), 11);
    net.max_steps = 30;
    net.dead[3] = true;
    net.run(200_000);
    assert_eq!(&net.done[..3], &[2, 2, 2]);
    assert_eq!(net.version(), Version(0));
}

/// Checks the BAP invariants on a finished run.
fn check_bap_invariants(net: &Cluster<Srv, Wrk>, s: u64) -> Result<(), TestCaseError> {
    // Iterations close in order, each once.
    let versions: Vec<u64> = net
        .events()
        .filter_map(|e| match e {
            ServerEvent::ModelUpdated { version, .. } => Some(version.0),
            _ => None,
        })
        .collect();
    prop_assert_eq!(versions, (1..=net.version().0).collect::<Vec<_>>());
    // Gradients received while their iteration was open, by (worker, iteration).
    let mut open_grads = BTreeSet::new();
    for e in &net.log {
        if let Entry::ServerIn { worker, msg: ToServerOwned::Grad { iteration, .. }, before, result: Ok(()), .. } = e {
            if *iteration > *before {
                open_grads.insert((*worker, *iteration));
            }
        }
    }
    // No gradient of a closed iteration is applied; each applied once, in its iteration.
    let mut applied = BTreeSet::new();
    for e in net.events() {
        if let ServerEvent::Applied { worker, version, staleness, base, .. } = e {
            prop_assert!(open_grads.contains(&(worker.index(), version.0)), "{:?}", e);
            prop_assert!(applied.insert((worker.index(), version.0)), "applied twice: {:?}", e);
            prop_assert!(*staleness <= s && base.0 + staleness + 1 == version.0);
        }
    }
    // The version lag at every iteration start is within the bound.
    for e in &net.log {
        if let Entry::Compute { iteration, version, worker, .. } = e {
            prop_assert!(iteration - 1 - version <= s, "worker {} starts {} on v{}", worker, iteration, version);
        }
    }
    // Every admitted gradient has exactly one outcome.
    let st = net.server.stats();
    prop_assert_eq!(st.accepted, st.applied + st.dropped_total() + net.server.open_gradients());
    prop_assert_eq!(st.applied, applied.len() as u64);
    Ok(())
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(96))]

    /// The BAP invariants over random arrival orders, worker speeds, bounds and time limits.
    #[test]
    fn invariants_hold_for_any_order_and_speeds(
        n in 1u32..6,
        s in 0u64..4,
        timeout in proptest::option::of(2u64..40),
        seed in any::<u64>(),
        speeds in proptest::collection::vec(1u32..8, 6),
        steps in 1u64..8,
    ) {
        let mut c = BapConfig::new(n, 0.5, s);
        c.iteration_timeout = timeout.map(Duration::from_millis);
        let mut net = bap_net(n, c, seed);
        net.speed = speeds[..n as usize].iter().map(|&s| f64::from(s)).collect();
        net.max_steps = steps;
        net.run(200_000);
        check_bap_invariants(&net, s)?;
        if timeout.is_none() {
            prop_assert!(net.done.iter().all(|&d| d == steps));
            prop_assert_eq!(net.server.stats().dropped_total(), 0);
        }
    }

    /// With bound 0 and no time limit, BAP computes on exactly BSP's models and produces
    /// BSP's sequence of versions and parameters, bit for bit.
    #[test]
    fn bound_zero_without_timeout_is_the_bsp_trace((n, seed_a, seed_b, speeds, steps) in trace_case()) {
        let mut bap = bap_net(n, BapConfig::new(n, 0.5, 0), seed_a);
        check_bsp_trace(&mut bap, seed_b, &speeds, steps)?;
        prop_assert_eq!(bap.version(), Version(steps));
    }

    /// No input sequence panics; a refused input changes nothing; outcomes add up.
    #[test]
    fn arbitrary_inputs_never_panic(ops in proptest::collection::vec((0u32..5, 0u64..6, 0u64..6, 0usize..4, -2.0f64..2.0, 0u8..10, 0u64..50), 0..200)) {
        let mut c = BapConfig::new(3, 0.5, 2);
        c.iteration_timeout = Some(Duration::from_millis(5));
        let mut s = server_with(c, 3);
        let mut now = 0;
        for (w, a, b, len, x, kind, dt) in ops {
            now += dt;
            let values = match kind { 0 => vec![f64::NAN; len], 1 => vec![f64::INFINITY; len], _ => vec![x; len] };
            let before = (s.params().to_vec(), s.version());
            let msg = match kind {
                5 => ToServer::Join { epoch: a as u32 },
                6 => ToServer::Leave,
                7 => pull(a, b),
                8 => { s.handle_timeout(ms(now)); let _ = drain(&mut s); continue; }
                9 => { let _ = s.handle_worker_lost(ms(now), WorkerId(w)); let _ = drain(&mut s); continue; }
                _ => grad(a, b, b + a, &values),
            };
            if s.handle(ms(now), WorkerId(w), msg).is_err() {
                prop_assert_eq!((s.params().to_vec(), s.version()), before);
            }
            let _ = drain(&mut s);
            prop_assert!(s.params().iter().all(|p| p.is_finite()));
        }
        let st = s.stats();
        prop_assert_eq!(st.accepted, st.applied + st.dropped_total() + s.open_gradients());
    }
}

/// Regression (swarm seed 38): every gradient of iteration 1 was lost while iteration 2's
/// arrived. An iteration with no gradient never timed out, so version 1 never came and the
/// workers, blocked on it, hung. Now an empty head behind a later iteration with gradients
/// times out (counted from that iteration's first gradient) and closes without a change.
#[test]
fn an_empty_head_behind_a_later_iteration_times_out() {
    let mut c = BapConfig::new(2, 0.5, 1);
    c.iteration_timeout = Some(Duration::from_millis(10));
    let mut s = server_with(c, 1);
    s.handle(ms(2), WorkerId(0), grad(0, 2, 1, &[2.0])).unwrap();
    s.handle(ms(3), WorkerId(1), grad(0, 2, 1, &[4.0])).unwrap();
    s.handle(ms(3), WorkerId(0), pull(0, 1)).unwrap();
    assert_eq!(s.poll_timeout(), Some(ms(12)));
    let _ = drain(&mut s);
    s.handle_timeout(ms(12));
    // Iteration 1 closes empty (the model does not move), then iteration 2 is complete.
    assert_eq!(s.version(), Version(2));
    assert_eq!(s.params(), &[-0.5]); // 1 - 0.5 * mean(2, 4)
    let (events, sends) = drain(&mut s);
    assert!(events.contains(&ServerEvent::ModelUpdated { version: Version(1), contributions: 0, mean_loss: None }));
    assert!(events.contains(&ServerEvent::ModelUpdated { version: Version(2), contributions: 2, mean_loss: None }));
    assert!(sends.contains(&(Recipient::Worker(WorkerId(0)), ToWorkerOwned::Abort { iteration: 1 })));
    assert_eq!(s.stats().applied, 2);
    // Nothing open: no deadline, and an empty server never closes anything.
    assert_eq!(s.poll_timeout(), None);
}

/// Regression: without a time limit, a gradient lost while the worker ran ahead (`s_bap >
/// 0`) was never sent again (the worker retries only its last one), and the iteration
/// waited for it forever. The server now answers a repeated parked pull from a worker
/// missing from the head with the model it already has, and the worker computes the head
/// again.
#[test]
fn a_lost_gradient_is_computed_again_without_a_time_limit() {
    let c = BapConfig::new(2, 0.5, 1);
    let mut s = server_with(c, 1);
    let mut cfg = setup(0);
    cfg.rejoin_after = Some(Duration::from_millis(100));
    let mut w: Wrk = BapWorker::new(c, cfg, vec![0.0; 1], vec![0.0; 1]).unwrap();
    let _ = drain_worker(&mut w);
    w.handle(T0, model(0, &[1.0])).unwrap();
    assert!(matches!(drain_worker(&mut w)[..], [Out::Compute(ComputeId(0), Version(0), _)]));
    // Iteration 1's gradient and pull are lost; the worker's pull (min 0) is answered anyway.
    w.handle_gradient(T0, ComputeId(0), &[2.0]).unwrap();
    let _ = drain_worker(&mut w);
    w.handle(T0, ToWorker::NotNewer { version: Version(0) }).unwrap();
    let _ = drain_worker(&mut w);
    // Iteration 2 arrives, then the pull for version 1 is parked.
    w.handle_gradient(T0, ComputeId(1), &[4.0]).unwrap();
    for out in drain_worker(&mut w) {
        if let Out::Send(m) = out {
            let mut buf = Vec::new();
            s.handle(T0, WorkerId(0), m.as_msg::<f64>(&mut buf)).unwrap();
        }
    }
    assert!(drain(&mut s).1.is_empty(), "a first pull overtaking the gradient just waits");
    // The worker's retry: its last gradient (a duplicate now) and the pull again.
    w.handle_timeout(ms(100));
    for out in drain_worker(&mut w) {
        if let Out::Send(m) = out {
            let mut buf = Vec::new();
            let _ = s.handle(T0, WorkerId(0), m.as_msg::<f64>(&mut buf));
        }
    }
    let (_, sends) = drain(&mut s);
    assert_eq!(
        sends,
        [(Recipient::Worker(WorkerId(0)), ToWorkerOwned::Model { version: 0, clock: 0, values: vec![1.0] })]
    );
    w.handle(T0, model(0, &[1.0])).unwrap();
    assert!(matches!(drain_worker(&mut w)[..], [Out::Compute(ComputeId(2), Version(0), _)]));
    assert_eq!(w.iteration(), 1);
    w.handle_gradient(T0, ComputeId(2), &[2.0]).unwrap();
    let outs = drain_worker(&mut w);
    assert!(outs.contains(&Out::Send(ToServerOwned::Grad { base: 0, iteration: 1, seq: 2, values: vec![2.0] })));
    for out in outs {
        if let Out::Send(m) = out {
            let mut buf = Vec::new();
            s.handle(T0, WorkerId(0), m.as_msg::<f64>(&mut buf)).unwrap();
        }
    }
    s.handle(T0, WorkerId(1), grad(0, 1, 0, &[6.0])).unwrap();
    let _ = drain(&mut s);
    s.handle(T0, WorkerId(1), grad(0, 2, 1, &[8.0])).unwrap();
    assert_eq!(s.version(), Version(2));
    assert_eq!(s.stats().applied, 4);
}
