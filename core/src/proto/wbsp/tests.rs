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

mod network;
mod server;
mod worker;
