use super::*;
use crate::proto::common::testkit::prelude::*;
use crate::proto::common::testkit::{Cluster, Entry};
use crate::proto::common::testkit::{WorkerOut as Out, drain_server, drain_worker};
use crate::proto::ssp::harness::{check_bsp_trace, net, trace_case};
use crate::proto::{DropReason, ToServerOwned, ToWorkerOwned};
use proptest::prelude::*;
use std::vec;
use std::vec::Vec;

type Srv = SspServer<f64, Vec<f64>>;
type Wrk = SspWorker<f64, Vec<f64>>;

const T0: Instant = Instant::ZERO;

fn server(n: u32, s: u64, dim: usize) -> Srv {
    SspServer::new(SspConfig::new(n, 0.5, s), vec![1.0; dim]).unwrap()
}

fn worker(n: u32, s: u64, i: u32, dim: usize) -> Wrk {
    SspWorker::new(SspConfig::new(n, 0.5, s), setup(i), vec![0.0; dim], vec![0.0; dim]).unwrap()
}

fn clock(c: u64, seq: u64, values: &[f64]) -> ToServer<'_, f64> {
    ToServer::Clock { clock: c, seq, values: Values::Slice(values), loss: None }
}

fn model(version: u64, clock: u64, values: &[f64]) -> ToWorker<'_, f64> {
    ToWorker::Model { version: Version(version), clock, values: Values::Slice(values) }
}

#[test]
fn config_errors() {
    let bad = |c: SspConfig, p: usize| SspServer::<f32, Vec<f32>>::new(c, vec![0.0; p]).err();
    assert_eq!(bad(SspConfig::new(0, 0.1, 1), 1), Some(ConfigError::WorkerCount(0)));
    assert_eq!(bad(SspConfig::new(1, f64::NAN, 1), 1), Some(ConfigError::LearningRate));
    assert_eq!(bad(SspConfig::new(1, 0.0, 1), 1), Some(ConfigError::LearningRate));
    assert_eq!(bad(SspConfig::new(1, 0.1, 1), 0), Some(ConfigError::EmptyModel));
    let c = SspConfig::new(2, 0.1, 1);
    assert_eq!(
        SspWorker::<f32, Vec<f32>>::new(c, setup(0), vec![0.0; 3], vec![0.0; 2]).err(),
        Some(ConfigError::ScratchTooSmall { needed: 3, given: 2 })
    );
    assert_eq!(SspWorker::<f32, Vec<f32>>::new(c, setup(0), vec![], vec![]).err(), Some(ConfigError::EmptyModel));
    assert_eq!(SspConfig::new(4, 0.5, 0).step_size(), 0.125);
    let mut per = SspConfig::new(4, 0.5, 0);
    per.step = SspStep::PerWorker;
    assert_eq!(per.step_size(), 0.5);
}

#[test]
fn updates_apply_on_arrival_and_the_clock_is_the_live_minimum() {
    let mut s = server(2, 1, 2);
    s.handle(T0, WorkerId(0), clock(0, 0, &[1.0, -1.0])).unwrap();
    assert_eq!(s.params(), &[2.0, 0.0]);
    assert_eq!((s.version(), s.clock()), (Version(1), 0));
    let (events, _) = drain_server(&mut s);
    assert!(events.contains(&ServerEvent::Applied {
        worker: WorkerId(0),
        base: Version(0),
        version: Version(1),
        staleness: 0,
        weight: 1.0
    }));
    s.handle(T0, WorkerId(0), clock(1, 1, &[1.0, 1.0])).unwrap();
    assert_eq!(s.clock(), 0);
    s.handle(T0, WorkerId(1), clock(0, 0, &[1.0, 1.0])).unwrap();
    assert_eq!((s.version(), s.clock()), (Version(3), 1));
    // Staleness: worker 1's base is version 0; two updates of worker 0 came in between.
    let (events, _) = drain_server(&mut s);
    assert!(events.iter().any(|e| matches!(e, ServerEvent::Applied { worker: WorkerId(1), staleness: 2, .. })));
    assert_eq!(s.worker_clock(WorkerId(0)), Some(2));
    assert_eq!(s.worker_clock(WorkerId(5)), None);
    // A lost worker stops holding the clock back.
    s.handle_worker_lost(T0, WorkerId(1)).unwrap();
    assert_eq!(s.clock(), 2);
    // It comes back: its clock is raised, the server clock does not go backwards.
    s.handle(T0, WorkerId(1), clock(1, 1, &[0.0, 0.0])).unwrap();
    assert_eq!(s.clock(), 2);
    assert_eq!(s.worker_clock(WorkerId(1)), Some(2));
}

#[test]
fn a_pull_waits_for_the_clock_and_for_the_pullers_own_updates() {
    let mut s = server(2, 1, 1);
    // Worker 0 finished clocks 0 and 1 (at clock 2, needs server clock >= 1) but its
    // second update is still in flight when its pull arrives.
    s.handle(T0, WorkerId(0), clock(0, 0, &[1.0])).unwrap();
    s.handle(T0, WorkerId(0), ToServer::Pull { have: Version(0), min_clock: 1 }).unwrap();
    assert!(s.is_waiting(WorkerId(0)));
    s.handle(T0, WorkerId(1), clock(0, 0, &[1.0])).unwrap();
    assert_eq!(s.clock(), 1);
    // Server clock reached 1, but the puller's update of clock 1 is not in yet.
    assert!(s.is_waiting(WorkerId(0)));
    let _ = drain_server(&mut s);
    s.handle(T0, WorkerId(0), clock(1, 1, &[1.0])).unwrap();
    assert!(!s.is_waiting(WorkerId(0)));
    let (_, sends) = drain_server(&mut s);
    assert_eq!(
        sends,
        [(Recipient::Worker(WorkerId(0)), ToWorkerOwned::Model { version: 3, clock: 1, values: vec![4.0] })]
    );
}

#[test]
fn refusals_change_nothing() {
    let mut s = server(2, 1, 2);
    s.handle(T0, WorkerId(0), clock(0, 3, &[1.0, 1.0])).unwrap();
    let _ = drain_server(&mut s);
    let before = (s.params().to_vec(), s.version(), s.clock(), s.worker_clock(WorkerId(0)));
    let cases: Vec<(u32, ToServer<'_, f64>)> = vec![
        (0, clock(1, 3, &[1.0, 1.0])),
        (0, clock(1, 2, &[1.0, 1.0])),
        (2, clock(0, 0, &[1.0, 1.0])),
        (u32::MAX, clock(0, 0, &[1.0, 1.0])),
        (1, clock(0, 0, &[1.0])),
        (1, clock(0, 0, &[f64::NAN, 1.0])),
        (1, clock(0, 0, &[f64::INFINITY, 1.0])),
        (1, ToServer::Pull { have: Version(9), min_clock: 0 }),
        (1, ToServer::Grad { base: Version(0), iteration: 0, seq: 0, values: Values::Slice(&[1.0, 1.0]), loss: None }),
        (
            1,
            ToServer::Delta {
                round: Version(0),
                local_steps: 1,
                seq: 0,
                values: Values::Slice(&[1.0, 1.0]),
                loss: None,
            },
        ),
    ];
    let k = cases.len() as u64;
    for (w, msg) in cases {
        assert!(s.handle(T0, WorkerId(w), msg).is_err());
    }
    assert_eq!((s.params().to_vec(), s.version(), s.clock(), s.worker_clock(WorkerId(0))), before);
    assert!(s.poll_output().is_none());
    assert_eq!(s.stats().rejected, k);
    assert_eq!(s.stats().accepted, 1);
    assert_eq!(s.handle_worker_lost(T0, WorkerId(7)), Err(Reject::UnknownWorker(WorkerId(7))));
}

#[test]
fn norm_bound_applies_to_the_gradient() {
    let mut c = SspConfig::new(2, 1.0, 0);
    c.gradient_policy.max_norm = Some(1.0);
    let mut s: Srv = SspServer::new(c, vec![0.0; 2]).unwrap();
    // u = -0.5 g with |g| = 5: clipped to |g| = 1, i.e. |u| = 0.5.
    s.handle(T0, WorkerId(0), clock(0, 0, &[-1.5, -2.0])).unwrap();
    assert!((s.params()[0] + 0.3).abs() < 1e-12 && (s.params()[1] + 0.4).abs() < 1e-12);
    let (events, _) = drain_server(&mut s);
    assert!(events.iter().any(|e| matches!(e, ServerEvent::Applied { weight, .. } if (weight - 0.2).abs() < 1e-12)));
    c.gradient_policy.on_large = crate::proto::LargeGradient::Reject;
    let mut s: Srv = SspServer::new(c, vec![0.0; 2]).unwrap();
    assert_eq!(s.handle(T0, WorkerId(0), clock(0, 0, &[-1.5, -2.0])), Err(Reject::NormTooLarge));
    s.handle(T0, WorkerId(0), clock(0, 0, &[-0.3, -0.3])).unwrap();
}

#[test]
fn worker_runs_ahead_within_the_bound_then_blocks_and_reads_its_own_writes() {
    let mut w = worker(2, 1, 0, 2);
    assert_eq!(drain_worker(&mut w), [Out::Send(ToServerOwned::Join { epoch: 0 })]);
    w.handle(T0, model(0, 0, &[1.0, 1.0])).unwrap();
    let out = drain_worker(&mut w);
    assert_eq!(out, [Out::Compute(ComputeId(0), Version(0), vec![1.0, 1.0])]);
    // Clock 0 done: u = -0.25 * g; cache has it (read-my-writes); clock 1 is within s = 1.
    w.handle_gradient(T0, ComputeId(0), &[4.0, -4.0]).unwrap();
    let out = drain_worker(&mut w);
    assert_eq!(
        out,
        [
            Out::Send(ToServerOwned::Clock { clock: 0, seq: 0, values: vec![-1.0, 1.0] }),
            Out::Compute(ComputeId(1), Version(0), vec![0.0, 2.0]),
        ]
    );
    assert_eq!(w.clock(), 1);
    // Clock 1 done: clock 2 needs a cache at server clock >= 1.
    w.handle_gradient(T0, ComputeId(1), &[4.0, 4.0]).unwrap();
    let out = drain_worker(&mut w);
    assert_eq!(
        out,
        [
            Out::Send(ToServerOwned::Clock { clock: 1, seq: 1, values: vec![-1.0, -1.0] }),
            Out::Send(ToServerOwned::Pull { have: 0, min_clock: 1 }),
            Out::Event(WorkerEvent::Blocked { have: Version(0) }),
        ]
    );
    assert!(w.is_blocked());
    // A too-stale answer is refused and changes nothing.
    assert_eq!(w.handle(T0, model(1, 0, &[9.0, 9.0])), Err(Reject::Unexpected { kind: "Model" }));
    assert!(drain_worker(&mut w).is_empty());
    w.handle(T0, model(3, 1, &[5.0, 5.0])).unwrap();
    assert_eq!(drain_worker(&mut w), [Out::Compute(ComputeId(2), Version(3), vec![5.0, 5.0])]);
    assert_eq!((w.cache_clock(), w.model_version(), w.clock()), (1, Version(3), 2));
}

#[test]
fn worker_refusals_change_nothing() {
    let mut w = worker(2, 0, 0, 2);
    let _ = drain_worker(&mut w);
    assert_eq!(w.handle_gradient(T0, ComputeId(0), &[1.0, 1.0]), Err(Reject::NoSuchComputation));
    assert!(matches!(w.handle(T0, model(0, 0, &[1.0])), Err(Reject::WrongLength(_))));
    w.handle(T0, model(0, 0, &[1.0, 1.0])).unwrap();
    let _ = drain_worker(&mut w);
    assert_eq!(w.handle_gradient(T0, ComputeId(7), &[1.0, 1.0]), Err(Reject::NoSuchComputation));
    assert!(matches!(w.handle_gradient(T0, ComputeId(0), &[1.0]), Err(Reject::WrongLength(_))));
    assert_eq!(w.handle_gradient(T0, ComputeId(0), &[f64::NAN, 1.0]), Err(Reject::NotFinite));
    assert_eq!(w.handle(T0, model(0, 0, &[1.0, 1.0])), Err(Reject::Duplicate { worker: WorkerId(0), seq: 0 }));
    assert_eq!(w.handle(T0, model(4, 4, &[1.0, 1.0])), Err(Reject::Unexpected { kind: "Model" }));
    assert_eq!(w.handle(T0, ToWorker::NotNewer { version: Version(0) }), Err(Reject::Unexpected { kind: "NotNewer" }));
    assert_eq!(w.handle(T0, ToWorker::Abort { iteration: 0 }), Err(Reject::Unexpected { kind: "Abort" }));
    assert!(drain_worker(&mut w).is_empty());
    assert_eq!(w.clock(), 0);
    w.handle_gradient(T0, ComputeId(0), &[1.0, 1.0]).unwrap();
    let _ = drain_worker(&mut w);
    assert_eq!(w.handle(T0, model(0, 0, &[1.0, 1.0])), Err(Reject::Unexpected { kind: "Model" }));
    w.handle(T0, ToWorker::Stop).unwrap();
    assert!(w.is_stopped());
    assert_eq!(drain_worker(&mut w), [Out::Event(WorkerEvent::Stopped)]);
    assert_eq!(w.handle(T0, model(5, 5, &[1.0, 1.0])), Err(Reject::Stopped));
}

#[test]
fn blocked_worker_retries_its_update_and_pull() {
    let mut cfg = setup(0);
    cfg.rejoin_after = Some(Duration::from_secs(1));
    let mut w: Wrk = SspWorker::new(SspConfig::new(2, 0.5, 0), cfg, vec![0.0; 1], vec![0.0; 1]).unwrap();
    let _ = drain_worker(&mut w);
    assert_eq!(w.poll_timeout(), Some(T0 + Duration::from_secs(1)));
    w.handle_timeout(T0 + Duration::from_secs(1));
    assert_eq!(drain_worker(&mut w), [Out::Send(ToServerOwned::Join { epoch: 0 })]);
    w.handle(T0, model(0, 0, &[1.0])).unwrap();
    let _ = drain_worker(&mut w);
    assert_eq!(w.poll_timeout(), None);
    let t = T0 + Duration::from_secs(5);
    w.handle_gradient(t, ComputeId(0), &[2.0]).unwrap();
    let _ = drain_worker(&mut w);
    w.handle_timeout(t + Duration::from_secs(1));
    assert_eq!(
        drain_worker(&mut w),
        [
            Out::Send(ToServerOwned::Clock { clock: 0, seq: 0, values: vec![-0.5] }),
            Out::Send(ToServerOwned::Pull { have: 0, min_clock: 1 }),
        ]
    );
    // The server refuses the repeat of an update it already has.
    let mut s = server(2, 0, 1);
    s.handle(T0, WorkerId(0), clock(0, 0, &[-0.5])).unwrap();
    assert_eq!(s.handle(T0, WorkerId(0), clock(0, 0, &[-0.5])), Err(Reject::Duplicate { worker: WorkerId(0), seq: 0 }));
    assert_eq!(s.stats().applied, 1);
}

fn ssp_net(n: u32, s: u64, seed: u64) -> Cluster<Srv, Wrk> {
    let dim = 3;
    let server: Srv = SspServer::new(SspConfig::new(n, 0.5, s), vec![1.0, -0.5, 0.25]).unwrap();
    let workers = (0..n).map(|i| worker(n, s, i, dim)).collect();
    net(server, workers, seed, |s| s.clock(), |w| w.clock())
}

#[test]
fn a_silent_worker_stalls_the_others_at_the_bound_until_declared_lost() {
    let mut cfg = SspConfig::new(3, 0.5, 2);
    cfg.stall_report = Some(Duration::from_secs(1));
    let server: Srv = SspServer::new(cfg, vec![1.0, -0.5, 0.25]).unwrap();
    let workers = (0..3).map(|i| worker(3, 2, i, 3)).collect();
    let mut net = net(server, workers, 7, |s| s.clock(), |w| w.clock());
    net.max_steps = 20;
    net.dead[2] = true;
    net.run(100_000);
    // Workers 0 and 1 computed clocks 0..=2 (s = 2 ahead of the silent worker's clock 0),
    // then blocked on clock 3.
    assert_eq!(&net.done[..2], &[3, 3]);
    assert!((0..2).all(|i| net.worker(i).is_some_and(|w| w.clock() == 3)));
    assert!(net.worker(0).is_some_and(|w| w.is_blocked()) && net.worker(1).is_some_and(|w| w.is_blocked()));
    assert!(net.events().any(|e| matches!(e, ServerEvent::Stalled { waiting_for: WorkerId(2), missing: 1, .. })));
    // Declared lost: the others go on to the end.
    net.lose(2);
    net.run(100_000);
    assert_eq!(&net.done[..2], &[20, 20]);
}

/// Checks S1–S4 on a finished run.
fn check_ssp_invariants(net: &Cluster<Srv, Wrk>, s: u64, theta0: &[f64]) -> Result<(), TestCaseError> {
    let n = net.nodes.len();
    // The updates each worker sent, by clock.
    let mut updates: Vec<Vec<Vec<f64>>> = vec![Vec::new(); n];
    for e in &net.log {
        if let Entry::Up { worker, msg: ToServerOwned::Clock { clock, values, .. }, .. } = e {
            prop_assert_eq!(*clock as usize, updates[*worker].len());
            updates[*worker].push(values.clone());
        }
    }
    let sum = |counts: &[u64], own: usize, upto: u64| -> Vec<f64> {
        let mut x = theta0.to_vec();
        for (q, &c) in counts.iter().enumerate() {
            let c = if q == own { upto } else { c };
            for u in updates[q].iter().take(c as usize) {
                for (xi, ui) in x.iter_mut().zip(u) {
                    *xi += ui;
                }
            }
        }
        x
    };
    for e in &net.log {
        if let Entry::Compute { worker, k, params, snap, done, .. } = e {
            let c = *k;
            // S2: the clock being computed is at most s ahead of the slowest worker.
            let slowest = done.iter().copied().min().unwrap_or(0);
            prop_assert!(c <= slowest + s, "worker {} computes clock {} with slowest at {}", worker, c, slowest);
            // S1 + S3: the read holds every update of clocks <= c - s - 1 and all own ones.
            let snap = snap.clone().unwrap_or_else(|| vec![0; n]);
            for (q, &got) in snap.iter().enumerate() {
                prop_assert!(got + s >= c || q == *worker, "read at clock {} misses clock {} of worker {}", c, got, q);
            }
            prop_assert!(snap[*worker] <= c);
            let expected = sum(&snap, *worker, c);
            prop_assert_eq!(params, &expected, "worker {} clock {}", worker, c);
        }
    }
    // S4: every update applied exactly once, nothing dropped, nothing refused.
    let mut applied = vec![0u64; n];
    for e in net.events() {
        if let ServerEvent::Applied { worker, .. } = e {
            applied[worker.index()] += 1;
        }
    }
    let sent: Vec<u64> = updates.iter().map(|u| u.len() as u64).collect();
    prop_assert_eq!(&applied, &sent);
    prop_assert_eq!(net.server.stats().dropped_total(), 0);
    prop_assert_eq!(net.server.stats().rejected, 0);
    prop_assert_eq!(net.refused(), vec![]);
    let all: Vec<u64> = sent.clone();
    prop_assert_eq!(net.server.params(), &sum(&all, usize::MAX, 0)[..]);
    Ok(())
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(96))]

    /// S1–S4 over random arrival orders and worker speeds.
    #[test]
    fn invariants_hold_for_any_order_and_speeds(
        n_log in 0u32..4,
        s in 0u64..4,
        seed in any::<u64>(),
        speeds in proptest::collection::vec(1u32..8, 8),
        steps in 1u64..8,
    ) {
        let n = 1 << n_log;
        let mut net = ssp_net(n, s, seed);
        net.speed = speeds[..n as usize].iter().map(|&s| f64::from(s)).collect();
        net.max_steps = steps;
        net.run(100_000);
        prop_assert!(net.done.iter().all(|&d| d == steps), "all workers finish: {:?}", net.done);
        check_ssp_invariants(&net, s, &[1.0, -0.5, 0.25])?;
    }

    /// S5: with s = 0, SSP computes on exactly BSP's models and reaches BSP's model after
    /// every clock, bit for bit.
    #[test]
    fn staleness_zero_is_the_bsp_trace((n, seed_a, seed_b, speeds, steps) in trace_case()) {
        // Everybody joins before the first update arrives (see the module docs).
        check_bsp_trace(&mut ssp_net(n, 0, seed_a), seed_b, &speeds, steps)?;
    }

    /// No input sequence panics; a refused input changes nothing.
    #[test]
    fn arbitrary_inputs_never_panic(ops in proptest::collection::vec((0u32..5, 0u64..6, 0u64..6, 0usize..4, -2.0f64..2.0, 0u8..9), 0..200)) {
        let mut s = server(3, 1, 3);
        for (w, a, b, len, x, kind) in ops {
            let values = match kind { 0 => vec![f64::NAN; len], 1 => vec![f64::INFINITY; len], _ => vec![x; len] };
            let before = (s.params().to_vec(), s.version(), s.clock());
            let msg = match kind {
                5 => ToServer::Join { epoch: a as u32 },
                6 => ToServer::Leave,
                7 => ToServer::Pull { have: Version(a), min_clock: b },
                8 => ToServer::Grad { base: Version(a), iteration: b, seq: b, values: Values::Slice(&values), loss: None },
                _ => clock(a, b, &values),
            };
            if s.handle(T0, WorkerId(w), msg).is_err() {
                prop_assert_eq!((s.params().to_vec(), s.version(), s.clock()), before);
            }
            let _ = drain_server(&mut s);
            prop_assert!(s.params().iter().all(|p| p.is_finite()));
            // The count of the slowest live workers, kept as workers come, go and move on,
            // is what a pass over the table finds.
            prop_assert!(s.rules().slowest_is_current(&s.core));
        }
        let st = s.stats();
        prop_assert_eq!(st.accepted, st.applied + st.dropped_total());
        prop_assert_eq!(st.dropped_for(DropReason::Stale), 0);
    }
}

/// Regression (swarm seed 13): a duplicated or delayed `Join` of the current session reset
/// the worker's clock at the server to the server clock. The worker's updates were already
/// in, so the repeat of its last `Clock` was refused as a duplicate and the server clock
/// stayed behind for good: every puller hung.
#[test]
fn a_repeated_join_does_not_lower_a_running_workers_clock() {
    let mut s = server(2, 1, 1);
    s.handle(T0, WorkerId(0), ToServer::Join { epoch: 0 }).unwrap();
    s.handle(T0, WorkerId(1), ToServer::Join { epoch: 0 }).unwrap();
    s.handle(T0, WorkerId(0), clock(0, 0, &[-0.5])).unwrap();
    s.handle(T0, WorkerId(0), clock(1, 1, &[-0.5])).unwrap();
    // Worker 0 is at clock 2 and pulls for server clock 1.
    s.handle(T0, WorkerId(0), ToServer::Pull { have: Version(0), min_clock: 1 }).unwrap();
    let _ = drain_server(&mut s);
    // The network delivers a second copy of worker 0's join.
    s.handle(T0, WorkerId(0), ToServer::Join { epoch: 0 }).unwrap();
    assert_eq!(s.worker_clock(WorkerId(0)), Some(2));
    assert!(s.is_waiting(WorkerId(0)), "the parked pull of the same session stays parked");
    // Its retry of the last update is a duplicate, and changes nothing.
    assert!(s.handle(T0, WorkerId(0), clock(1, 1, &[-0.5])).is_err());
    let _ = drain_server(&mut s);
    // Worker 1 finishes clock 0: the server clock reaches 1 and the pull is answered.
    s.handle(T0, WorkerId(1), clock(0, 0, &[-0.5])).unwrap();
    assert_eq!(s.clock(), 1);
    let (_, sends) = drain_server(&mut s);
    assert!(
        sends
            .iter()
            .any(|(to, m)| *to == Recipient::Worker(WorkerId(0)) && matches!(m, ToWorkerOwned::Model { clock: 1, .. }))
    );
}

/// Regression (swarm with worker crashes, seed 9): a crashed worker restarts with a new
/// epoch and starts at the server clock; a repeat of its new join (its retry after a lost
/// model, or a network duplicate) once it has run ahead must not pull its clock back to the
/// server clock, and the old session's parked pull is forgotten.
#[test]
fn a_worker_restarting_with_a_new_epoch_starts_at_the_server_clock() {
    let mut s = server(2, 1, 1);
    for w in 0..2 {
        s.handle(T0, WorkerId(w), ToServer::Join { epoch: 0 }).unwrap();
        s.handle(T0, WorkerId(w), clock(0, 0, &[-0.5])).unwrap();
    }
    s.handle(T0, WorkerId(0), clock(1, 1, &[-0.5])).unwrap();
    s.handle(T0, WorkerId(0), clock(2, 2, &[-0.5])).unwrap();
    s.handle(T0, WorkerId(0), ToServer::Pull { have: Version(0), min_clock: 2 }).unwrap();
    assert_eq!((s.clock(), s.worker_clock(WorkerId(0))), (1, Some(3)));
    // Worker 0 crashes and restarts with epoch 1; the transport told the server.
    s.handle_worker_lost(T0, WorkerId(0)).unwrap();
    let _ = drain_server(&mut s);
    s.handle(T0, WorkerId(0), ToServer::Join { epoch: 1 }).unwrap();
    assert_eq!(s.worker_clock(WorkerId(0)), Some(1));
    assert!(!s.is_waiting(WorkerId(0)));
    let (_, sends) = drain_server(&mut s);
    let Some((_, ToWorkerOwned::Model { version, clock: c, values })) =
        sends.iter().find(|(to, _)| *to == Recipient::Worker(WorkerId(0)))
    else {
        panic!("no model for the new session: {sends:?}")
    };
    // The new worker takes that clock and runs two clocks ahead.
    let mut cfg = setup(0);
    cfg.epoch = 1;
    let mut w: Wrk = SspWorker::new(SspConfig::new(2, 0.5, 1), cfg, vec![0.0; 1], vec![0.0; 1]).unwrap();
    let _ = drain_worker(&mut w);
    w.handle(T0, model(*version, *c, values)).unwrap();
    assert_eq!(w.clock(), 1);
    let seq = crate::id::first_seq(1);
    s.handle(T0, WorkerId(0), clock(1, seq, &[-0.5])).unwrap();
    s.handle(T0, WorkerId(0), clock(2, seq + 1, &[-0.5])).unwrap();
    // A repeat of its join must not lower its clock (its updates are in).
    s.handle(T0, WorkerId(0), ToServer::Join { epoch: 1 }).unwrap();
    assert_eq!(s.worker_clock(WorkerId(0)), Some(3));
    s.handle(T0, WorkerId(1), clock(1, 1, &[-0.5])).unwrap();
    s.handle(T0, WorkerId(1), clock(2, 2, &[-0.5])).unwrap();
    assert_eq!(s.clock(), 3);
}

/// Regression (swarm with worker crashes, seed 811 of 2000): a restarted worker took a model
/// answering a pull of its previous session, so its new session's updates reached the server
/// before its (delayed) `Join`. The late join then reset its clock to the server clock
/// although its updates were in, and the server clock stuck there.
#[test]
fn a_new_sessions_updates_overtaking_its_join_keep_their_clock() {
    let mut s = server(2, 1, 1);
    s.handle(T0, WorkerId(0), ToServer::Join { epoch: 0 }).unwrap();
    s.handle(T0, WorkerId(1), ToServer::Join { epoch: 0 }).unwrap();
    s.handle_worker_lost(T0, WorkerId(0)).unwrap();
    let seq = crate::id::first_seq(1);
    s.handle(T0, WorkerId(0), clock(0, seq, &[-0.5])).unwrap();
    s.handle(T0, WorkerId(0), clock(1, seq + 1, &[-0.5])).unwrap();
    assert_eq!(s.worker_clock(WorkerId(0)), Some(2));
    s.handle(T0, WorkerId(0), ToServer::Join { epoch: 1 }).unwrap();
    assert_eq!(s.worker_clock(WorkerId(0)), Some(2));
    s.handle(T0, WorkerId(1), clock(0, 0, &[-0.5])).unwrap();
    s.handle(T0, WorkerId(1), clock(1, 1, &[-0.5])).unwrap();
    assert_eq!(s.clock(), 2);
}
