//! WBSP worker unit tests: the basic and overlapping variants, refusals and rejoining.

use super::*;

// ---------------------------------------------------------------- worker unit tests

fn worker(overlap: bool) -> Wrk {
    let mut c = WbspConfig::new(2, 0.5);
    c.overlap = overlap;
    Wrk::new(c, setup(1), vec![0.0; 2], vec![0.0; 2]).unwrap()
}

#[test]
fn basic_worker_waits_for_the_ack_and_pulls_when_told() {
    let mut w = worker(false);
    assert_eq!(drain_worker(&mut w), ["send Join"]);
    w.handle(t(0), model(0, &[4.0, 4.0])).unwrap();
    assert_eq!(drain_worker(&mut w), ["compute 0 v0 Some(4.0)"]);
    w.handle_gradient(t(1), ComputeId(0), &[2.0, -2.0]).unwrap();
    assert_eq!(drain_worker(&mut w), ["delta r0 k1 seq0 Some(-1.0)"]);
    assert_eq!(w.params(), &[3.0, 5.0]);
    assert!(w.upload_in_flight());
    w.handle(t(2), ack(0, false)).unwrap();
    assert_eq!(drain_worker(&mut w), ["compute 1 v0 Some(3.0)"]);
    w.handle_gradient(t(3), ComputeId(1), &[2.0, 2.0]).unwrap();
    assert_eq!(drain_worker(&mut w), ["delta r0 k1 seq1 Some(-1.0)"]);
    w.handle(t(4), ack(1, true)).unwrap();
    assert_eq!(drain_worker(&mut w), ["pull have0 min0"]);
    w.handle(t(5), model(1, &[10.0, 10.0])).unwrap();
    assert_eq!(drain_worker(&mut w), ["compute 2 v1 Some(10.0)"]);
    w.handle_gradient(t(6), ComputeId(2), &[2.0, 0.0]).unwrap();
    // The delta is relative to the pulled model.
    assert_eq!(drain_worker(&mut w), ["delta r1 k1 seq2 Some(-1.0)"]);
    assert_eq!(w.local_steps(), 3);
    assert_eq!(w.uploads(), 3);
    assert_eq!(w.discarded_steps(), 0);
}

#[test]
fn overlap_worker_computes_while_uploading_and_coalesces() {
    let mut w = worker(true);
    drain_worker(&mut w);
    w.handle(t(0), model(0, &[0.0, 0.0])).unwrap();
    assert_eq!(drain_worker(&mut w), ["compute 0 v0 Some(0.0)"]);
    w.handle_gradient(t(1), ComputeId(0), &[2.0, 2.0]).unwrap();
    // Upload and the next computation at once.
    assert_eq!(drain_worker(&mut w), ["delta r0 k1 seq0 Some(-1.0)", "compute 1 v0 Some(-1.0)"]);
    w.handle_gradient(t(2), ComputeId(1), &[2.0, 2.0]).unwrap();
    assert_eq!(drain_worker(&mut w), ["compute 2 v0 Some(-2.0)"]);
    w.handle_gradient(t(3), ComputeId(2), &[2.0, 2.0]).unwrap();
    assert_eq!(drain_worker(&mut w), ["compute 3 v0 Some(-3.0)"]);
    // The reply frees the link: the two steps since go out as one delta.
    w.handle(t(4), ack(0, false)).unwrap();
    assert_eq!(drain_worker(&mut w), ["delta r0 k2 seq1 Some(-2.0)"]);
    // Told to pull: the running computation goes on, no new one starts.
    w.handle(t(5), ack(1, true)).unwrap();
    assert_eq!(drain_worker(&mut w), ["pull have0 min0"]);
    w.handle_gradient(t(6), ComputeId(3), &[2.0, 2.0]).unwrap();
    assert_eq!(drain_worker(&mut w), Vec::<String>::new());
    // The model overwrites the step made since the upload.
    w.handle(t(7), model(1, &[5.0, 5.0])).unwrap();
    assert_eq!(drain_worker(&mut w), ["compute 4 v1 Some(5.0)"]);
    assert_eq!(w.discarded_steps(), 1);
    // A model arriving while a computation runs: its gradient lands on the new model.
    w.handle_gradient(t(8), ComputeId(4), &[2.0, 2.0]).unwrap();
    assert_eq!(drain_worker(&mut w), ["delta r1 k1 seq2 Some(-1.0)", "compute 5 v1 Some(4.0)"]);
    w.handle(t(9), ack(2, true)).unwrap();
    assert_eq!(drain_worker(&mut w), ["pull have1 min0"]);
    w.handle(t(10), model(2, &[20.0, 20.0])).unwrap();
    assert_eq!(drain_worker(&mut w), Vec::<String>::new());
    w.handle_gradient(t(11), ComputeId(5), &[2.0, 2.0]).unwrap();
    assert_eq!(w.params(), &[19.0, 19.0]);
    assert_eq!(drain_worker(&mut w), ["delta r2 k1 seq3 Some(-1.0)", "compute 6 v2 Some(19.0)"]);
    assert_eq!(w.local_steps(), 6);
}

#[test]
fn worker_refusals_change_nothing() {
    let mut w = worker(false);
    drain_worker(&mut w);
    assert_eq!(w.handle(t(0), ack(0, false)), Err(Reject::Unexpected { kind: "PushAck" }));
    assert_eq!(
        w.handle(t(0), ToWorker::NotNewer { version: Version(0) }),
        Err(Reject::Unexpected { kind: "NotNewer" })
    );
    assert_eq!(w.handle_gradient(t(0), ComputeId(0), &[1.0, 1.0]), Err(Reject::NoSuchComputation));
    assert!(matches!(w.handle(t(0), model(0, &[1.0])), Err(Reject::WrongLength(_))));
    w.handle(t(0), model(3, &[1.0, 1.0])).unwrap();
    drain_worker(&mut w);
    assert_eq!(w.handle(t(0), model(4, &[1.0, 1.0])), Err(Reject::Unexpected { kind: "Model" }));
    assert_eq!(
        w.handle(t(0), model(2, &[1.0, 1.0])),
        Err(Reject::OutdatedModel { received: Version(2), have: Version(3) })
    );
    assert_eq!(w.handle(t(0), ToWorker::Abort { iteration: 0 }), Err(Reject::Unexpected { kind: "Abort" }));
    assert_eq!(w.handle_gradient(t(0), ComputeId(7), &[1.0, 1.0]), Err(Reject::NoSuchComputation));
    assert!(matches!(w.handle_gradient(t(0), ComputeId(0), &[1.0]), Err(Reject::WrongLength(_))));
    assert_eq!(w.handle_gradient(t(0), ComputeId(0), &[f64::NAN, 1.0]), Err(Reject::NotFinite));
    assert_eq!(w.params(), &[1.0, 1.0]);
    assert_eq!(w.local_steps(), 0);
    // An undrained delta: the buffer is still in use, inputs that would reuse it are refused.
    w.handle_gradient(t(0), ComputeId(0), &[2.0, 2.0]).unwrap();
    assert_eq!(w.handle(t(0), ack(3, false)), Err(Reject::Unexpected { kind: "PushAck" }));
    drain_worker(&mut w);
    w.handle(t(0), ack(3, false)).unwrap();
    drain_worker(&mut w);
    w.handle(t(0), ToWorker::Stop).unwrap();
    assert_eq!(drain_worker(&mut w), ["Stopped"]);
    assert!(w.is_stopped());
    assert_eq!(w.handle(t(0), ack(3, false)), Err(Reject::Stopped));
    assert_eq!(w.handle_gradient(t(0), ComputeId(1), &[1.0, 1.0]), Err(Reject::Stopped));
}

#[test]
fn undrained_delta_refuses_the_next_step() {
    let mut w = worker(true);
    drain_worker(&mut w);
    w.handle(t(0), model(0, &[0.0, 0.0])).unwrap();
    drain_worker(&mut w);
    w.handle_gradient(t(1), ComputeId(0), &[2.0, 2.0]).unwrap();
    // The host did not drain; the compute it would have seen is id 1.
    assert_eq!(w.handle_gradient(t(1), ComputeId(1), &[2.0, 2.0]), Err(Reject::Capacity));
    assert_eq!(drain_worker(&mut w), ["delta r0 k1 seq0 Some(-1.0)", "compute 1 v0 Some(-1.0)"]);
    w.handle_gradient(t(1), ComputeId(1), &[2.0, 2.0]).unwrap();
}

#[test]
fn worker_rejoins_after_waiting_too_long() {
    let mut c = WbspConfig::new(2, 0.5);
    c.overlap = false;
    let s = WorkerSetup { id: WorkerId(0), epoch: 2, rejoin_after: Some(Duration::from_nanos(50)) };
    let mut w = Wrk::new(c, s, vec![0.0; 1], vec![0.0; 1]).unwrap();
    assert_eq!(drain_worker(&mut w), ["send Join"]);
    assert_eq!(w.poll_timeout(), Some(t(50)));
    w.handle(t(10), model(0, &[0.0])).unwrap();
    drain_worker(&mut w);
    assert_eq!(w.poll_timeout(), None, "computing, not waiting");
    w.handle_gradient(t(20), ComputeId(0), &[2.0]).unwrap();
    drain_worker(&mut w);
    assert_eq!(w.poll_timeout(), Some(t(70)));
    w.handle_timeout(t(60));
    assert!(w.poll_output().is_none());
    // The reply was lost: rejoin, and take the model the server answers with.
    w.handle_timeout(t(70));
    assert_eq!(drain_worker(&mut w), ["send Join"]);
    w.handle(t(75), model(1, &[3.0])).unwrap();
    assert_eq!(drain_worker(&mut w), ["compute 1 v1 Some(3.0)"]);
    // The late reply is now unexpected.
    assert_eq!(w.handle(t(76), ack(1, false)), Err(Reject::Unexpected { kind: "PushAck" }));
}
