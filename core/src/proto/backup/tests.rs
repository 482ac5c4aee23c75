//! Unit and property tests of the `backup` protocol.

use super::harness::{check, grad_of, run};
use super::*;
use crate::msg::ToWorker;
use crate::proto::bsp::{BspConfig, BspServer};
use crate::proto::common::testkit::drain_server as drain;
use crate::proto::common::testkit::prelude::*;
use crate::proto::{ToWorkerOwned, WorkerEvent};
use proptest::prelude::*;
use std::vec;
use std::vec::Vec;

fn server(n: u32, b: u32, interrupt: Interrupt, dim: usize) -> BackupServer<f64, Vec<f64>> {
    let mut c = BackupConfig::new(n, 0.5, b);
    c.interrupt = interrupt;
    BackupServer::new(c, vec![1.0; dim], vec![0.0; dim]).unwrap()
}

#[test]
fn closes_after_k_and_drops_the_rest() {
    for interrupt in [Interrupt::Abort, Interrupt::RunToCompletion] {
        let mut s = server(3, 1, interrupt, 2);
        let t = Instant::from_nanos(10);
        for w in 0..3 {
            s.handle(Instant::ZERO, WorkerId(w), ToServer::Join { epoch: 0 }).unwrap();
        }
        let _ = drain(&mut s);
        s.handle(t, WorkerId(2), grad(0, 0, &[2.0, 4.0])).unwrap();
        assert_eq!(s.version(), Version(0));
        s.handle(t, WorkerId(0), grad(0, 0, &[4.0, 8.0])).unwrap();
        assert_eq!(s.version(), Version(1));
        assert_eq!(s.params(), &[-0.5, -2.0]);
        let (events, sends) = drain(&mut s);
        assert!(events.contains(&ServerEvent::ModelUpdated { version: Version(1), contributions: 2, mean_loss: None }));
        let model = ToWorkerOwned::Model { version: 1, clock: 1, values: vec![-0.5, -2.0] };
        match interrupt {
            Interrupt::Abort => assert_eq!(sends, [(Recipient::AllWorkers, model.clone())]),
            Interrupt::RunToCompletion => assert_eq!(
                sends,
                [(Recipient::Worker(WorkerId(0)), model.clone()), (Recipient::Worker(WorkerId(2)), model.clone())]
            ),
        }
        // The backup worker's late gradient is dropped, reported, never counted later.
        s.handle(t, WorkerId(1), grad(0, 0, &[100.0, 100.0])).unwrap();
        let (events, sends) = drain(&mut s);
        assert_eq!(events, [ServerEvent::Dropped { worker: WorkerId(1), base: Version(0), reason: DropReason::Stale }]);
        match interrupt {
            Interrupt::Abort => assert!(sends.is_empty()),
            Interrupt::RunToCompletion => assert_eq!(sends, [(Recipient::Worker(WorkerId(1)), model)]),
        }
        assert_eq!(s.received(), 0);
        assert_eq!(s.stats().dropped_for(DropReason::Stale), 1);
        assert_eq!((s.stats().accepted, s.stats().applied), (3, 2));
    }
}

#[test]
fn refusals_change_nothing() {
    let mut s = server(3, 1, Interrupt::Abort, 2);
    let now = Instant::ZERO;
    s.handle(now, WorkerId(0), ToServer::Join { epoch: 1 }).unwrap();
    let seq = crate::id::first_seq(1) + 3;
    s.handle(now, WorkerId(0), grad(0, seq, &[1.0, 1.0])).unwrap();
    let _ = drain(&mut s);
    let before = (s.params().to_vec(), s.version(), s.contributors().collect::<Vec<_>>(), *s.stats());
    assert_eq!(
        s.handle(now, WorkerId(0), grad(0, seq, &[1.0, 1.0])),
        Err(Reject::Duplicate { worker: WorkerId(0), seq })
    );
    // A message of the earlier session (seq below first_seq(1)) is a replay.
    assert_eq!(
        s.handle(now, WorkerId(0), grad(0, 4, &[1.0, 1.0])),
        Err(Reject::Duplicate { worker: WorkerId(0), seq: 4 })
    );
    assert_eq!(
        s.handle(now, WorkerId(0), grad(0, seq + 1, &[1.0, 1.0])),
        Err(Reject::Duplicate { worker: WorkerId(0), seq: seq + 1 })
    );
    assert_eq!(s.handle(now, WorkerId(3), grad(0, 0, &[1.0, 1.0])), Err(Reject::UnknownWorker(WorkerId(3))));
    assert!(matches!(s.handle(now, WorkerId(1), grad(0, 0, &[1.0])), Err(Reject::WrongLength(_))));
    assert_eq!(s.handle(now, WorkerId(1), grad(0, 0, &[f64::NAN, 1.0])), Err(Reject::NotFinite));
    assert_eq!(
        s.handle(now, WorkerId(1), grad(5, 0, &[1.0, 1.0])),
        Err(Reject::FutureVersion { claimed: Version(5), current: Version(0) })
    );
    assert_eq!(
        s.handle(now, WorkerId(1), ToServer::Pull { have: Version(0), min_clock: 0 }),
        Err(Reject::Unexpected { kind: "Pull" })
    );
    assert_eq!(
        s.handle(now, WorkerId(0), ToServer::Join { epoch: 0 }),
        Err(Reject::StaleEpoch { worker: WorkerId(0), epoch: 0 })
    );
    assert_eq!(s.handle_worker_lost(now, WorkerId(9)), Err(Reject::UnknownWorker(WorkerId(9))));
    let after = (s.params().to_vec(), s.version(), s.contributors().collect::<Vec<_>>());
    assert_eq!(after, (before.0, before.1, before.2));
    assert!(s.poll_output().is_none());
    assert_eq!(s.stats().rejected, before.3.rejected + 9);
    assert_eq!(s.stats().accepted, before.3.accepted);
}

#[test]
fn config_errors() {
    let bad =
        |c: BackupConfig, p: usize, a: usize| BackupServer::<f32, Vec<f32>>::new(c, vec![0.0; p], vec![0.0; a]).err();
    assert_eq!(bad(BackupConfig::new(3, 0.1, 3), 1, 1), Some(ConfigError::Knob("backup_workers")));
    assert_eq!(bad(BackupConfig::new(0, 0.1, 0), 1, 1), Some(ConfigError::WorkerCount(0)));
    assert_eq!(bad(BackupConfig::new(2, 0.0, 1), 1, 1), Some(ConfigError::LearningRate));
    assert_eq!(bad(BackupConfig::new(2, 0.1, 1), 0, 1), Some(ConfigError::EmptyModel));
    assert_eq!(bad(BackupConfig::new(2, 0.1, 1), 4, 3), Some(ConfigError::ScratchTooSmall { needed: 4, given: 3 }));
    assert_eq!(BackupConfig::new(16, 0.1, 5).aggregate(), 11);
    assert_eq!(Interrupt::default(), Interrupt::Abort);
    assert_eq!(Interrupt::RunToCompletion.name(), "run-to-completion");
}

/// K4: with `b = 1`, losing one worker costs nothing; losing two stalls, and the stall
/// is reported naming a live missing worker.
#[test]
fn progress_with_k_live_and_a_reported_stall_below() {
    let mut c = BackupConfig::new(3, 0.5, 1);
    c.stall_report = Some(Duration::from_secs(1));
    let mut s: BackupServer<f64, Vec<f64>> = BackupServer::new(c, vec![0.0], vec![0.0]).unwrap();
    let t0 = Instant::ZERO;
    s.handle_worker_lost(t0, WorkerId(2)).unwrap();
    s.handle(t0, WorkerId(0), grad(0, 0, &[1.0])).unwrap();
    s.handle(t0, WorkerId(1), grad(0, 0, &[1.0])).unwrap();
    assert_eq!(s.version(), Version(1));
    let _ = drain(&mut s);
    s.handle(t0, WorkerId(1), ToServer::Leave).unwrap();
    s.handle(t0, WorkerId(0), grad(1, 1, &[1.0])).unwrap();
    let (events, _) = drain(&mut s);
    assert!(events.contains(&ServerEvent::WorkerLost { worker: WorkerId(1) }));
    let at = s.poll_timeout().unwrap();
    s.handle_timeout(at);
    let (events, _) = drain(&mut s);
    assert_eq!(events.len(), 1);
    assert!(matches!(events[0], ServerEvent::Stalled { missing: 1, .. }));
    assert!(s.poll_timeout().unwrap() > at);
    s.stop();
    assert!(matches!(s.poll_output(), Some(ServerOutput::Send { to: Recipient::AllWorkers, msg: ToWorker::Stop })));
    assert_eq!(s.poll_timeout(), None);
}

/// Option A: a straggler's computation is abandoned when the new model arrives.
#[test]
fn option_a_makes_stragglers_abandon() {
    use crate::proto::{GradientWorker, GradientWorkerConfig, Worker, WorkerOutput};
    let mut s = server(2, 1, Interrupt::Abort, 1);
    let mut w = GradientWorker::new(GradientWorkerConfig::new(WorkerId(1)), vec![0.0f64]).unwrap();
    let _ = w.poll_output();
    s.handle(Instant::ZERO, WorkerId(1), ToServer::Join { epoch: 0 }).unwrap();
    let (_, sends) = drain(&mut s);
    let mut buf = Vec::new();
    w.handle(Instant::ZERO, sends[0].1.as_msg(&mut buf)).unwrap();
    assert!(matches!(w.poll_output(), Some(WorkerOutput::Compute { .. })));
    s.handle(Instant::ZERO, WorkerId(0), grad(0, 0, &[1.0])).unwrap();
    let (_, sends) = drain(&mut s);
    assert_eq!(sends[0].0, Recipient::AllWorkers);
    w.handle(Instant::ZERO, sends[0].1.as_msg(&mut buf)).unwrap();
    assert!(matches!(w.poll_output(), Some(WorkerOutput::Event(WorkerEvent::Abandoned { .. }))));
    assert!(matches!(w.poll_output(), Some(WorkerOutput::Compute { version: Version(1), .. })));
}

#[test]
fn harness_gradients_are_small_integers() {
    let g = grad_of(3, 7, 5);
    assert!(g.iter().all(|x| x.fract() == 0.0 && x.abs() <= 8.0));
    assert_eq!(g, grad_of(3, 7, 5));
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(48))]

    /// K1, K2, one outcome per gradient and conservation, for random n, b, interrupt
    /// option, delivery order and stragglers.
    #[test]
    fn k_invariants_hold(n in 1u32..7, b in 0u32..6, abort in any::<bool>(), seed in any::<u64>(), dim in 1usize..4, slow in 0u32..7) {
        let b = b % n;
        let interrupt = if abort { Interrupt::Abort } else { Interrupt::RunToCompletion };
        let mut s = server(n, b, interrupt, dim);
        let trace = run(&mut s, n, dim, 6, seed, &[slow]);
        let dropped = check(&trace, dim, 0.5, 1.0, |_| (n - b) as usize);
        prop_assert_eq!(dropped, s.stats().dropped_total());
        prop_assert_eq!(trace.updates.len(), 6);
    }

    /// `b = 0` under option A is BSP, event for event and bit for bit; under option B
    /// the model trace is BSP's (only the addressing of the model messages differs).
    #[test]
    fn zero_backups_is_bsp(n in 1u32..7, seed in any::<u64>(), dim in 1usize..4) {
        let mut bsp: BspServer<f64, Vec<f64>> = BspServer::new(BspConfig::new(n, 0.5), vec![1.0; dim], vec![0.0; dim]).unwrap();
        let reference = run(&mut bsp, n, dim, 5, seed, &[0]);
        let mut a = server(n, 0, Interrupt::Abort, dim);
        prop_assert_eq!(&run(&mut a, n, dim, 5, seed, &[0]), &reference);
        let mut b = server(n, 0, Interrupt::RunToCompletion, dim);
        prop_assert_eq!(&run(&mut b, n, dim, 5, seed, &[0]).updates, &reference.updates);
    }

    /// No input sequence panics; an update happens only when k distinct gradients of
    /// the current version are in.
    #[test]
    fn arbitrary_inputs_never_panic(ops in proptest::collection::vec((0u32..6, 0u64..4, 0u64..6, 0usize..4, -2.0f64..2.0, 0u8..9), 0..200)) {
        check_arbitrary_inputs(&mut server(4, 1, Interrupt::RunToCompletion, 3), &ops, |s| s.received(), 2)?;
    }
}
