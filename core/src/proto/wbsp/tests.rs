//! WBSP tests: unit tests of every refusal, and the test network ([`Cluster`]) running a
//! server and its workers with random compute times, latencies and tie orders, checking the
//! invariants after every input (integer gradients, a power-of-two learning rate and worker
//! count, so every float sum is exact in any order).

use super::*;
use crate::proto::common::testkit::prelude::*;
use crate::proto::common::testkit::{Cluster, Entry, Job, NetConfig};
use crate::proto::{AnyServer, AnyWorker, LargeGradient, ProtocolConfig};
use proptest::prelude::*;
use std::collections::BTreeMap;
use std::vec;
use std::vec::Vec;
use std::{format, string::String};

type Srv = WbspServer<f64, Vec<f64>>;
type Wrk = WbspWorker<f64, Vec<f64>>;

fn t(nanos: u64) -> Instant {
    Instant::from_nanos(nanos)
}

fn delta(round: u64, seq: u64, values: &[f64]) -> ToServer<'_, f64> {
    ToServer::Delta { round: Version(round), local_steps: 1, seq, values: Values::Slice(values), loss: None }
}

fn drain_server(s: &mut Srv) -> Vec<String> {
    let mut out = Vec::new();
    while let Some(o) = s.poll_output() {
        out.push(match o {
            ServerOutput::Send { to, msg: ToWorker::Model { version, values, .. } } => {
                format!("model {to:?} v{} {:?}", version.0, values.get(0))
            }
            ServerOutput::Send { to, msg: ToWorker::PushAck { round, pull_now } } => {
                format!("ack {to:?} r{} pull={pull_now}", round.0)
            }
            ServerOutput::Send { to, msg } => format!("send {to:?} {}", msg.kind_name()),
            ServerOutput::Event(ServerEvent::Applied { worker, base, version, staleness, weight }) => {
                format!("applied {} base{} v{} stale{} w{}", worker.0, base.0, version.0, staleness, weight)
            }
            ServerOutput::Event(ServerEvent::ModelUpdated { version, contributions, .. }) => {
                format!("updated v{} n{}", version.0, contributions)
            }
            ServerOutput::Event(e) => format!("{e:?}"),
            ServerOutput::Upstream(m) => format!("upstream {}", m.kind_name()),
        });
    }
    out
}

fn drain_worker(w: &mut Wrk) -> Vec<String> {
    let mut out = Vec::new();
    while let Some(o) = w.poll_output() {
        out.push(match o {
            WorkerOutput::Send(ToServer::Delta { round, local_steps, seq, values, .. }) => {
                format!("delta r{} k{} seq{} {:?}", round.0, local_steps, seq, values.get(0))
            }
            WorkerOutput::Send(ToServer::Pull { have, min_clock }) => format!("pull have{} min{}", have.0, min_clock),
            WorkerOutput::Send(m) => format!("send {}", m.kind_name()),
            WorkerOutput::Compute { id, version, params } => {
                format!("compute {} v{} {:?}", id.0, version.0, params.first())
            }
            WorkerOutput::Event(e) => format!("{e:?}"),
        });
    }
    out
}

fn model(version: u64, values: &[f64]) -> ToWorker<'_, f64> {
    ToWorker::Model { version: Version(version), clock: version, values: Values::Slice(values) }
}

fn ack(round: u64, pull_now: bool) -> ToWorker<'static, f64> {
    ToWorker::PushAck { round: Version(round), pull_now }
}

// ---------------------------------------------------------------- configuration

#[test]
fn config_names_defaults_and_errors() {
    let c = WbspConfig::new(4, 0.5);
    assert_eq!(c.name(), "wbsp");
    assert_eq!(c.with_overlap().name(), "wbsp-overlap");
    assert_eq!(c.delta_scaling, DeltaScaling::PerDelta);
    assert_eq!(c.lr_schedule, LrSchedule::Constant);
    assert_eq!(c.round_deadline, None);
    assert!(!c.overlap);
    let p = ProtocolConfig::Wbsp(c.with_overlap());
    assert_eq!(p.name(), "wbsp-overlap");
    assert_eq!(p.workers(), 4);
    assert_eq!(p.server_scratch_len(10), 10);
    assert_eq!(p.worker_scratch_len(10), 10);

    assert_eq!(Srv::new(WbspConfig::new(0, 0.5), vec![0.0; 2], vec![0.0; 2]).err(), Some(ConfigError::WorkerCount(0)));
    assert_eq!(Srv::new(WbspConfig::new(2, -1.0), vec![0.0; 2], vec![0.0; 2]).err(), Some(ConfigError::LearningRate));
    assert_eq!(Srv::new(WbspConfig::new(2, 0.5), vec![], vec![]).err(), Some(ConfigError::EmptyModel));
    assert_eq!(
        Srv::new(WbspConfig::new(2, 0.5), vec![0.0; 3], vec![0.0; 2]).err(),
        Some(ConfigError::ScratchTooSmall { needed: 3, given: 2 })
    );
    let mut bad = WbspConfig::new(2, 0.5);
    bad.lr_schedule = LrSchedule::ByLocalStep { every: 0, factor: 0.5 };
    assert_eq!(Srv::new(bad, vec![0.0; 2], vec![0.0; 2]).err(), Some(ConfigError::Knob("lr_schedule")));
    bad.lr_schedule = LrSchedule::ByGlobalRound { every: 3, factor: f64::NAN };
    assert_eq!(Wrk::new(bad, setup(0), vec![0.0; 2], vec![0.0; 2]).err(), Some(ConfigError::Knob("lr_schedule")));
    let c = WbspConfig::new(2, 0.5);
    assert_eq!(Wrk::new(c, setup(0), vec![], vec![]).err(), Some(ConfigError::EmptyModel));
    assert_eq!(
        Wrk::new(c, setup(0), vec![0.0; 3], vec![0.0; 1]).err(),
        Some(ConfigError::ScratchTooSmall { needed: 3, given: 1 })
    );
}

#[test]
fn scaling_and_schedules() {
    assert_eq!(DeltaScaling::PerDelta.factor(4, 3), 0.25);
    assert_eq!(DeltaScaling::PerLocalStep.factor(4, 2), 0.125);
    assert_eq!(DeltaScaling::PerLocalStep.factor(4, 0), 0.25);
    assert_eq!(LrSchedule::Constant.rate(0.1, 1000, 1000), 0.1);
    let by_step = LrSchedule::ByLocalStep { every: 10, factor: 0.5 };
    assert_eq!(by_step.rate(1.0, 9, 100), 1.0);
    assert_eq!(by_step.rate(1.0, 10, 100), 0.5);
    assert_eq!(by_step.rate(1.0, 25, 0), 0.25);
    let by_round = LrSchedule::ByGlobalRound { every: 2, factor: 0.5 };
    assert_eq!(by_round.rate(1.0, 100, 1), 1.0);
    assert_eq!(by_round.rate(1.0, 0, 4), 0.25);
}

#[test]
fn any_server_and_worker_dispatch() {
    let p = ProtocolConfig::Wbsp(WbspConfig::new(1, 0.5));
    let mut s: AnyServer<f64, Vec<f64>> = AnyServer::new(&p, vec![1.0f64; 2], vec![0.0; 2]).unwrap();
    let mut w = AnyWorker::new(&p, setup(0), vec![0.0f64; 2], vec![0.0; 2]).unwrap();
    assert!(matches!(s, AnyServer::Wbsp(_)));
    assert!(matches!(w, AnyWorker::Wbsp(_)));
    let Some(WorkerOutput::Send(ToServer::Join { epoch: 0 })) = w.poll_output() else { panic!("join") };
    s.handle(t(0), WorkerId(0), ToServer::Join { epoch: 0 }).unwrap();
    let mut model_msg = None;
    while let Some(o) = s.poll_output() {
        if let ServerOutput::Send { msg: ToWorker::Model { version, values, .. }, .. } = o {
            let mut v = vec![0.0; 2];
            values.copy_into(&mut v).unwrap();
            model_msg = Some((version, v));
        }
    }
    let (version, v) = model_msg.unwrap();
    w.handle(t(1), ToWorker::Model { version, clock: 0, values: Values::Slice(&v) }).unwrap();
    let Some(WorkerOutput::Compute { id, .. }) = w.poll_output() else { panic!("compute") };
    w.handle_gradient(t(2), id, &[2.0, 2.0]).unwrap();
    let Some(WorkerOutput::Send(ToServer::Delta { round, local_steps, seq, values, .. })) = w.poll_output() else {
        panic!("delta")
    };
    let mut d = vec![0.0; 2];
    values.copy_into(&mut d).unwrap();
    assert_eq!(d, [-1.0, -1.0]);
    s.handle(t(3), WorkerId(0), ToServer::Delta { round, local_steps, seq, values: Values::Slice(&d), loss: None })
        .unwrap();
    assert_eq!(s.version(), Version(1));
    assert_eq!(s.params(), &[0.0, 0.0]);
}

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

// ---------------------------------------------------------------- the test network

const DIM: usize = 3;

/// An integer gradient that depends on the worker and its job count only.
fn gradient(job: &Job<'_>) -> Vec<f64> {
    (0..DIM).map(|j| ((job.worker as u64 * 7 + job.k * 3 + j as u64 * 5) % 7) as f64 - 3.0).collect()
}

/// A server and `n` workers on the test network ([`Cluster`]) in simulated time, with
/// random tie orders, and an oracle checked after every event.
struct Harness {
    net: Cluster<Srv, Wrk>,
    n: usize,
    /// The log entries already checked.
    cursor: usize,
    /// Percent of accepted deltas handed to the server a second time at once.
    duplicate_percent: u64,
    duplicates: u64,
    // Oracle.
    /// θ0 + Σ accepted deltas / n, summed exactly.
    expected: Vec<f64>,
    uploads_this_round: Vec<u32>,
    closed_rounds: Vec<Vec<u32>>,
    models: BTreeMap<u64, Vec<f64>>,
    /// Per worker, the version of the last model sent to it.
    sent_model: Vec<u64>,
    in_flight_uploads: Vec<u32>,
    sent_deltas: u64,
    accepted: u64,
    applied_events: u64,
}

impl Harness {
    /// `compute`: per worker, its compute time in nanoseconds (`None`: its computations
    /// never end); a message takes `latency` plus up to `jitter` nanoseconds.
    fn new(config: WbspConfig, compute: Vec<Option<u64>>, latency: u64, jitter: u64, seed: u64) -> Self {
        let n = config.workers as usize;
        let theta0: Vec<f64> = (0..DIM).map(|j| j as f64 - 1.0).collect();
        let server = Srv::new(config, theta0.clone(), vec![0.0; DIM]).unwrap();
        let workers =
            (0..n as u32).map(|i| Wrk::new(config, setup(i), vec![0.0; DIM], vec![0.0; DIM]).unwrap()).collect();
        let ns = Duration::from_nanos;
        let links = NetConfig { latency: (ns(latency), ns(latency + jitter)), ..NetConfig::default() };
        let mut net = Cluster::new(server, workers, seed, links, gradient).with_random_ties();
        net.speed = compute.iter().map(|c| if c.is_some() { 1.0 } else { 0.0 }).collect();
        net.compute_time = compute.iter().map(|c| c.map(ns)).collect();
        Self {
            net,
            n,
            cursor: 0,
            duplicate_percent: 0,
            duplicates: 0,
            expected: theta0,
            uploads_this_round: vec![0; n],
            closed_rounds: Vec::new(),
            models: BTreeMap::new(),
            sent_model: vec![0; n],
            in_flight_uploads: vec![0; n],
            sent_deltas: 0,
            accepted: 0,
            applied_events: 0,
        }
    }

    fn workers(&self) -> impl Iterator<Item = &Wrk> {
        (0..self.n).filter_map(|i| self.net.worker(i))
    }

    fn check_conservation(&self) {
        let server = &self.net.server;
        for j in 0..DIM {
            assert_eq!(server.params()[j] + server.accumulator()[j], self.expected[j], "conservation");
        }
        assert_eq!(server.stats().applied, self.accepted);
        assert_eq!(self.applied_events, self.accepted);
    }

    /// Checks what the last event did (the server was at `version_before`), then may replay
    /// an accepted delta.
    fn check(&mut self, version_before: u64) {
        let entries = self.net.log.get(self.cursor..).unwrap_or_default().to_vec();
        self.cursor = self.net.log.len();
        let mut accepted_delta = None;
        for e in entries {
            match e {
                Entry::Compute { worker, version, params, .. } => {
                    assert_eq!(params.len(), DIM);
                    let have = self.net.worker(worker).and_then(|w| w.model_version());
                    assert_eq!(Some(Version(version)), have);
                }
                Entry::Up { worker, msg: ToServerOwned::Delta { .. }, .. } => {
                    self.sent_deltas += 1;
                    self.in_flight_uploads[worker] += 1;
                    assert!(self.in_flight_uploads[worker] <= 1, "W5: at most one upload in flight");
                }
                Entry::Up { msg: ToServerOwned::Pull { have, .. }, .. } => {
                    assert!(have < self.net.version().0, "a pull is only sent after a close");
                }
                Entry::ServerIn { worker, msg, result, .. } => {
                    assert_eq!(result, Ok(()), "{msg:?} from {worker}");
                    if let ToServerOwned::Delta { values, .. } = &msg {
                        self.in_flight_uploads[worker] -= 1;
                        self.accepted += 1;
                        for (e, v) in self.expected.iter_mut().zip(values) {
                            *e += v / self.n as f64;
                        }
                        accepted_delta = Some((worker, msg));
                    }
                }
                Entry::Sent { to: Recipient::Worker(w), msg: ToWorkerOwned::Model { version, values, .. } } => {
                    // W2: every model of a version is the same model.
                    let known = self.models.entry(version).or_insert_with(|| values.clone());
                    assert_eq!(*known, values, "W2");
                    self.sent_model[w.index()] = version;
                }
                Entry::Sent { to: Recipient::Worker(w), msg: ToWorkerOwned::PushAck { round, pull_now: true } } => {
                    assert!(round > self.sent_model[w.index()], "pull_now only after a close");
                }
                Entry::Event(ServerEvent::Applied { worker, version, staleness, base, weight }) => {
                    assert_eq!(version.0, version_before + 1, "an applied delta is in the next published version");
                    assert_eq!(staleness, version_before - base.0);
                    assert_eq!(weight, 1.0 / self.n as f64);
                    self.applied_events += 1;
                    self.uploads_this_round[worker.index()] += 1;
                }
                Entry::Event(ServerEvent::ModelUpdated { version, contributions, .. }) => {
                    assert_eq!(version.0, version_before + 1, "W1: one version per round");
                    let counts = core::mem::replace(&mut self.uploads_this_round, vec![0; self.n]);
                    assert_eq!(counts.iter().sum::<u32>(), contributions);
                    let server = &self.net.server;
                    for (w, c) in counts.iter().enumerate() {
                        if server.is_live(WorkerId(w as u32)) {
                            assert!(*c >= 1, "a round closes only after every live worker uploaded in it");
                        }
                    }
                    self.closed_rounds.push(counts);
                    assert_eq!(server.params(), &self.expected[..], "conservation at a close");
                    assert!(server.accumulator().iter().all(|a| *a == 0.0));
                    self.models.entry(version.0).or_insert_with(|| server.params().to_vec());
                }
                Entry::WorkerRefused { worker, msg, reason } => panic!("worker {worker} refused {msg:?}: {reason:?}"),
                _ => {}
            }
        }
        self.check_conservation();
        // A duplicate (a retransmission or a replay) is refused and changes nothing.
        let Some((from, msg)) = accepted_delta else { return };
        if self.net.rng().below(100) < self.duplicate_percent {
            let params = self.net.server.params().to_vec();
            let acc = self.net.server.accumulator().to_vec();
            assert!(matches!(self.net.redeliver(from, msg), Err(Reject::Duplicate { .. })));
            self.duplicates += 1;
            let outputs = self.net.log.get(self.cursor..).unwrap_or_default();
            assert!(outputs.iter().all(|e| matches!(e, Entry::ServerIn { .. })), "{outputs:?}");
            self.cursor = self.net.log.len();
            assert_eq!(self.net.server.params(), &params[..]);
            assert_eq!(self.net.server.accumulator(), &acc[..]);
        }
    }

    /// Runs until `max_steps` local steps in total or `max_time` nanoseconds.
    fn run(&mut self, max_steps: u64, max_time: u64) {
        self.check(self.net.version().0);
        while let Some(at) = self.net.next_at() {
            if at > t(max_time) || self.net.done.iter().sum::<u64>() >= max_steps {
                break;
            }
            let version_before = self.net.version().0;
            if !self.net.step() {
                break;
            }
            self.check(version_before);
        }
        self.check_conservation();
    }
}

fn harness_config(n: u32, overlap: bool) -> WbspConfig {
    let mut c = WbspConfig::new(n, 0.5);
    c.overlap = overlap;
    c
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(128))]

    /// W1–W3 and W5 under random compute speeds, latencies and arrival orders, with
    /// duplicated deliveries: every delta applied exactly once, exact conservation, a round
    /// closes only after every worker uploaded in it, pulls only after a close, one model per
    /// version.
    #[test]
    fn invariants_hold_under_random_schedules(
        log_n in 1u32..4,
        overlap in any::<bool>(),
        speeds in proptest::collection::vec(1u64..60, 8),
        latency in 0u64..8,
        jitter in 0u64..8,
        seed in any::<u64>(),
    ) {
        let n = 1u32 << log_n;
        let compute = speeds.iter().take(n as usize).map(|s| Some(*s)).collect();
        let mut h = Harness::new(harness_config(n, overlap), compute, latency, jitter, seed);
        h.duplicate_percent = 20;
        h.run(400, u64::MAX);
        prop_assert!(h.net.server.version().0 >= 1);
        prop_assert_eq!(h.net.server.stats().rejected, h.duplicates);
        prop_assert!(h.duplicates > 0, "some deltas were replayed");
        // Nothing lost: every delta sent was accepted, except those still in flight.
        let in_flight: u32 = h.in_flight_uploads.iter().sum();
        prop_assert_eq!(h.sent_deltas, h.accepted + u64::from(in_flight));
        // Every worker's local steps are uploaded or discarded (overlap) or not yet uploaded.
        for (i, w) in h.workers().enumerate() {
            prop_assert!(w.local_steps() >= w.uploads());
            prop_assert_eq!(w.local_steps(), h.net.done[i]);
            if !overlap {
                prop_assert_eq!(w.discarded_steps(), 0);
            }
        }
    }
}

/// With equal-speed workers every worker takes exactly one local step per round (a round
/// is a window of time closed by the last upload), in both variants.
#[test]
fn equal_speed_workers_take_one_local_step_per_round() {
    for overlap in [false, true] {
        for seed in 0..20 {
            let n = 4;
            let mut h = Harness::new(harness_config(n, overlap), vec![Some(100); 4], 3, 0, seed);
            h.run(u64::MAX, 20_000);
            assert!(h.closed_rounds.len() > 50, "{} rounds", h.closed_rounds.len());
            for (r, counts) in h.closed_rounds.iter().enumerate() {
                assert_eq!(counts, &vec![1; n as usize], "round {r}, overlap {overlap}, seed {seed}");
            }
            assert!(h.workers().all(|w| w.discarded_steps() == 0));
        }
    }
}

/// Fast workers take several steps per slow round and are never held back by the slowest
/// one; the slowest uploads once per round.
#[test]
fn fast_workers_keep_stepping_while_the_slowest_finishes() {
    for overlap in [false, true] {
        let mut h = Harness::new(harness_config(4, overlap), vec![Some(10), Some(40), Some(10), Some(40)], 1, 0, 7);
        h.run(u64::MAX, 10_000);
        let rounds = h.closed_rounds.len() as u64;
        assert!(rounds > 100);
        for r in &h.closed_rounds[2..] {
            assert!(r[0] >= 2 && r[2] >= 2, "fast workers upload several deltas per round: {r:?}");
            assert!(r[1] <= 2 && r[3] <= 2, "slow workers about once: {r:?}");
        }
        // The fast workers step about four times as often as the slow ones.
        assert!(h.net.done[0] >= 3 * h.net.done[1], "{:?}", h.net.done);
    }
}

/// The optimized variant coalesces steps when the link is slower than computation.
#[test]
fn overlap_coalesces_when_the_link_is_slow() {
    let mut h = Harness::new(harness_config(2, true), vec![Some(5), Some(5)], 20, 0, 3);
    h.run(u64::MAX, 20_000);
    let steps: u64 = h.net.done.iter().sum();
    let uploads: u64 = h.workers().map(|w| w.uploads()).sum();
    assert!(steps > 3 * uploads, "steps {steps}, uploads {uploads}");
    // The basic variant waits one round trip per step instead.
    let mut b = Harness::new(harness_config(2, false), vec![Some(5), Some(5)], 20, 0, 3);
    b.run(u64::MAX, 20_000);
    assert!(b.net.done.iter().sum::<u64>() * 3 < steps);
}

/// A silently dead worker stalls the round only until the deadline; the others go on.
#[test]
fn a_dead_worker_does_not_stall_the_others_forever() {
    for overlap in [false, true] {
        let compute = vec![Some(10), Some(10), Some(10), None];
        let mut stuck = Harness::new(harness_config(4, overlap), compute.clone(), 1, 1, 5);
        stuck.run(u64::MAX, 5_000);
        assert_eq!(stuck.net.server.version(), Version(0), "without a deadline the round waits");

        let mut c = harness_config(4, overlap);
        c.round_deadline = Some(Duration::from_nanos(200));
        let mut h = Harness::new(c, compute, 1, 1, 5);
        h.run(u64::MAX, 5_000);
        assert!(h.net.server.version().0 > 100, "version {}", h.net.server.version().0);
        assert!(!h.net.server.is_live(WorkerId(3)));
        for r in &h.closed_rounds {
            assert_eq!(r[3], 0);
        }
    }
}
