//! Unit and property tests of the `grouped` protocol.

use super::group::{add_measured, add_scale_measured, apply_copy_clear, parts, scale_measured};
use super::*;
use crate::math::{self, Scalar};
use crate::proto::asp::AspServer;
use crate::proto::bsp::{BspConfig, BspServer};
use crate::proto::common::testkit::prelude::*;
use crate::proto::common::testkit::{Cluster, Entry, NetConfig};
use crate::proto::{
    AnyServer, GradientWorker, GradientWorkerConfig, ProtocolConfig, ToServerOwned, ToWorkerOwned, Worker, WorkerOutput,
};
use proptest::prelude::*;
use std::collections::BTreeMap;
use std::vec;
use std::vec::Vec;

type Grouped = GroupedServer<f64, Vec<f64>>;

fn grouped(config: GroupedConfig, dim: usize) -> Grouped {
    GroupedServer::new(config, vec![1.0; dim], vec![0.0; config.scratch_len(dim)]).unwrap()
}

fn grad(base: u64, seq: u64, values: &[f64]) -> ToServer<'_, f64> {
    ToServer::Grad { base: Version(base), iteration: 0, seq, values: Values::Slice(values), loss: None }
}

/// An output with its payload copied.
#[derive(Clone, Debug, PartialEq)]
enum Out {
    Event(ServerEvent),
    Send(Recipient, ToWorkerOwned),
    /// A message for the central server.
    Up(ToServerOwned),
}

fn drain_server<S: Server<f64>>(s: &mut S) -> Vec<Out> {
    let mut outs = Vec::new();
    while let Some(out) = s.poll_output() {
        outs.push(match out {
            ServerOutput::Event(e) => Out::Event(e),
            ServerOutput::Send { to, msg } => Out::Send(to, ToWorkerOwned::from(&msg)),
            ServerOutput::Upstream(msg) => Out::Up(ToServerOwned::from(&msg)),
        });
    }
    outs
}

/// Anything the harness can drive: a server, or hand-wired group servers and a central one.
trait Harnessed {
    fn feed(&mut self, now: Instant, from: WorkerId, msg: ToServer<'_, f64>) -> Result<(), Reject>;
    fn drain(&mut self) -> Vec<Out>;
    fn central(&self) -> (Version, Vec<f64>);
    fn stats(&self) -> ServerStats;
}

struct Plain<S>(S);

impl<S: Server<f64>> Harnessed for Plain<S> {
    fn feed(&mut self, now: Instant, from: WorkerId, msg: ToServer<'_, f64>) -> Result<(), Reject> {
        self.0.handle(now, from, msg)
    }
    fn drain(&mut self) -> Vec<Out> {
        drain_server(&mut self.0)
    }
    fn central(&self) -> (Version, Vec<f64>) {
        (self.0.version(), self.0.params().to_vec())
    }
    fn stats(&self) -> ServerStats {
        *self.0.stats()
    }
}

/// The distributed deployment in miniature: stand-alone group servers (built generically,
/// [`AnyServer::subserver`] of [`ProtocolConfig::tiers`]) and the central server of the
/// same tiers, their upstream messages delivered instantly by hand.
struct Wired {
    config: GroupedConfig,
    groups: Vec<AnyServer<f64, Vec<f64>>>,
    central: AnyServer<f64, Vec<f64>>,
    /// Each group's outputs toward its members, in order, not yet drained.
    held: Vec<Vec<Out>>,
    stats: ServerStats,
}

impl Wired {
    fn new(config: GroupedConfig, dim: usize) -> Self {
        let protocol = ProtocolConfig::Grouped(config);
        let tiers = protocol.tiers().unwrap();
        assert_eq!(tiers.subservers, config.groups);
        let groups: Vec<_> = (0..tiers.subservers)
            .map(|g| {
                let scratch = vec![0.0; protocol.subserver_scratch_len(dim)];
                AnyServer::subserver(&protocol, g, 0, vec![0.0; dim], scratch).unwrap()
            })
            .collect();
        assert!(groups.iter().all(Server::has_upstream));
        let central =
            AnyServer::new(&tiers.central, vec![1.0; dim], vec![0.0; tiers.central.server_scratch_len(dim)]).unwrap();
        assert!(!central.has_upstream());
        let held = groups.iter().map(|_| Vec::new()).collect();
        let mut wired = Self { config, groups, central, held, stats: ServerStats::default() };
        for g in 0..config.groups as usize {
            wired.pump(g);
        }
        // Joining the central server produced no output toward the workers.
        assert!(wired.drain().is_empty());
        wired
    }

    /// Drains group `g`: its members' outputs are held for [`Harnessed::drain`], its
    /// upstream messages go to the central server and the replies back, until quiet.
    fn pump(&mut self, g: usize) {
        let mut buf = Vec::new();
        loop {
            let mut up = Vec::new();
            for out in drain_server(&mut self.groups[g]) {
                match out {
                    Out::Up(msg) => up.push(msg),
                    other => self.held[g].push(other),
                }
            }
            if up.is_empty() {
                break;
            }
            for msg in up {
                self.central.handle(Instant::ZERO, WorkerId(g as u32), msg.as_msg(&mut buf)).unwrap();
                for reply in drain_server(&mut self.central) {
                    if let Out::Send(Recipient::Worker(to), msg) = reply {
                        assert_eq!(to, WorkerId(g as u32));
                        self.groups[g].handle_upstream(Instant::ZERO, msg.as_msg(&mut buf)).unwrap();
                    }
                }
            }
        }
    }
}

impl Harnessed for Wired {
    fn feed(&mut self, now: Instant, from: WorkerId, msg: ToServer<'_, f64>) -> Result<(), Reject> {
        let Some(g) = self.config.group_of(from) else {
            self.stats.rejected += 1;
            return Err(Reject::UnknownWorker(from));
        };
        let result = self.groups[g as usize].handle(now, from, msg);
        self.pump(g as usize);
        result
    }
    fn drain(&mut self) -> Vec<Out> {
        self.held.iter_mut().flat_map(core::mem::take).collect()
    }
    fn central(&self) -> (Version, Vec<f64>) {
        (self.central.version(), self.central.params().to_vec())
    }
    fn stats(&self) -> ServerStats {
        let mut total = self.stats;
        for g in &self.groups {
            let s = g.stats();
            total.accepted += s.accepted;
            total.applied += s.applied;
            total.rejected += s.rejected;
            total.updates += s.updates;
            for (t, d) in total.dropped.iter_mut().zip(s.dropped) {
                *t += d;
            }
        }
        total
    }
}

/// What the harness records: every output, the central model after every update, and
/// what became of every message a worker sent.
#[derive(Clone, Debug, PartialEq)]
enum Rec {
    Out(Out),
    Central(u64, Vec<u64>),
    Fed(u32, Result<(), Reject>),
}

enum Msg {
    Up(u32, ToServerOwned),
    Down(u32, ToWorkerOwned),
}

struct Run {
    trace: Vec<Rec>,
    /// Every gradient sent: (worker, base) → values.
    sent: BTreeMap<(u32, u64), Vec<f64>>,
    /// Gradient messages the server took (`Ok`).
    admitted: u64,
}

/// An integer-valued gradient that depends on the worker, the version and the model.
fn gradient(worker: u32, version: u64, params: &[f64]) -> Vec<f64> {
    params
        .iter()
        .enumerate()
        .map(|(j, p)| {
            let k = (u64::from(worker) * 31 + version * 7 + j as u64 * 3) % 17;
            k as f64 - 8.0 + p.floor().rem_euclid(3.0)
        })
        .collect()
}

/// Runs `n` gradient workers against `h`, delivering messages in a seeded random order
/// (and, with `dup_percent`, delivering some messages twice: any message if `dup_all`,
/// else only gradients), until the central model reaches `updates` versions or nothing is
/// in flight.
fn run(h: &mut impl Harnessed, n: u32, seed: u64, updates: u64, dup_percent: u64, dup_all: bool) -> Run {
    let mut rng = seed | 1;
    let mut next = move || {
        rng ^= rng << 13;
        rng ^= rng >> 7;
        rng ^= rng << 17;
        rng
    };
    let dim = h.central().1.len();
    let mut workers: Vec<_> = (0..n)
        .map(|i| GradientWorker::new(GradientWorkerConfig::new(WorkerId(i)), vec![0.0f64; dim]).unwrap())
        .collect();
    let mut inflight = Vec::new();
    let mut out = Run { trace: Vec::new(), sent: BTreeMap::new(), admitted: 0 };
    let mut buf = Vec::new();
    let now = Instant::ZERO;
    fn pump_worker(
        w: &mut GradientWorker<f64, Vec<f64>>,
        inflight: &mut Vec<Msg>,
        sent: &mut BTreeMap<(u32, u64), Vec<f64>>,
    ) {
        let mut job = None;
        let me = w.id().0;
        while let Some(o) = w.poll_output() {
            match o {
                WorkerOutput::Send(msg) => {
                    if let ToServer::Grad { base, values, .. } = &msg {
                        let mut v = vec![0.0; values.len()];
                        values.copy_into(&mut v).unwrap();
                        sent.insert((me, base.0), v);
                    }
                    inflight.push(Msg::Up(me, ToServerOwned::from(&msg)));
                }
                WorkerOutput::Compute { id, version, params } => {
                    job = Some((id, gradient(me, version.0, params)));
                }
                WorkerOutput::Event(_) => {}
            }
        }
        if let Some((id, g)) = job {
            w.handle_gradient(Instant::ZERO, id, &g).unwrap();
            pump_worker(w, inflight, sent);
        }
    }
    for w in workers.iter_mut() {
        pump_worker(w, &mut inflight, &mut out.sent);
    }
    while !inflight.is_empty() && h.central().0.0 < updates {
        let i = (next() % inflight.len() as u64) as usize;
        let duplicate =
            next() % 100 < dup_percent && (dup_all || matches!(inflight[i], Msg::Up(_, ToServerOwned::Grad { .. })));
        let msg = if duplicate {
            match &inflight[i] {
                Msg::Up(w, m) => Msg::Up(*w, m.clone()),
                Msg::Down(w, m) => Msg::Down(*w, m.clone()),
            }
        } else {
            inflight.swap_remove(i)
        };
        match msg {
            Msg::Up(w, m) => {
                let result = h.feed(now, WorkerId(w), m.as_msg(&mut buf));
                if result.is_ok() && matches!(m, ToServerOwned::Grad { .. }) {
                    out.admitted += 1;
                }
                out.trace.push(Rec::Fed(w, result));
                for o in h.drain() {
                    match &o {
                        Out::Event(ServerEvent::ModelUpdated { .. }) => {
                            let (v, p) = h.central();
                            out.trace.push(Rec::Out(o.clone()));
                            out.trace.push(Rec::Central(v.0, p.iter().map(|x| x.to_bits()).collect()));
                            continue;
                        }
                        Out::Send(Recipient::AllWorkers, m) => {
                            for i in 0..n {
                                inflight.push(Msg::Down(i, m.clone()));
                            }
                        }
                        Out::Send(Recipient::Worker(to), m) => inflight.push(Msg::Down(to.0, m.clone())),
                        Out::Event(_) => {}
                        Out::Up(m) => panic!("the harness routes upstream messages itself: {m:?}"),
                    }
                    out.trace.push(Rec::Out(o));
                }
            }
            Msg::Down(w, m) => {
                let worker = &mut workers[w as usize];
                let _ = worker.handle(now, m.as_msg(&mut buf));
                pump_worker(worker, &mut inflight, &mut out.sent);
            }
        }
    }
    out
}

fn without_group_events(trace: &[Rec]) -> Vec<Rec> {
    trace.iter().filter(|r| !matches!(r, Rec::Out(Out::Event(ServerEvent::GroupApplied { .. })))).cloned().collect()
}

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
    assert_eq!(
        s.handle(now, WorkerId(0), grad(0, 3, &[1.0, 1.0])),
        Err(Reject::Duplicate { worker: WorkerId(0), seq: 3 })
    );
    assert_eq!(
        s.handle(now, WorkerId(0), grad(0, 4, &[1.0, 1.0])),
        Err(Reject::Duplicate { worker: WorkerId(0), seq: 4 })
    );
    assert_eq!(s.handle(now, WorkerId(4), grad(0, 0, &[1.0, 1.0])), Err(Reject::UnknownWorker(WorkerId(4))));
    assert_eq!(
        s.handle(now, WorkerId(u32::MAX), grad(0, 0, &[1.0, 1.0])),
        Err(Reject::UnknownWorker(WorkerId(u32::MAX)))
    );
    assert!(matches!(s.handle(now, WorkerId(1), grad(0, 0, &[1.0])), Err(Reject::WrongLength(_))));
    assert_eq!(s.handle(now, WorkerId(1), grad(0, 0, &[f64::NAN, 1.0])), Err(Reject::NotFinite));
    assert_eq!(s.handle(now, WorkerId(1), grad(0, 0, &[f64::INFINITY, 1.0])), Err(Reject::NotFinite));
    assert_eq!(s.handle(now, WorkerId(1), grad(0, 0, &[1e300, 1e300])), Err(Reject::NormTooLarge));
    assert_eq!(
        s.handle(now, WorkerId(1), grad(1, 0, &[1.0, 1.0])),
        Err(Reject::FutureVersion { claimed: Version(1), current: Version(0) })
    );
    assert_eq!(
        s.handle(now, WorkerId(1), ToServer::Pull { have: Version(0), min_clock: 0 }),
        Err(Reject::Unexpected { kind: "Pull" })
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
    let _ = drain_server_f32(&mut s);
    s.handle(Instant::ZERO, WorkerId(0), g(1, 1)).unwrap();
    let outs = drain_server_f32(&mut s);
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

fn drain_server_f32<S: Server<f32>>(s: &mut S) -> Vec<Out> {
    let mut outs = Vec::new();
    while let Some(out) = s.poll_output() {
        outs.push(match out {
            ServerOutput::Event(e) => Out::Event(e),
            ServerOutput::Send { to, msg } => Out::Send(to, ToWorkerOwned::from(&msg)),
            ServerOutput::Upstream(msg) => Out::Up(ToServerOwned::from(&msg)),
        });
    }
    outs
}

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

proptest! {
    #![proptest_config(ProptestConfig::with_cases(48))]

    /// The fused scaling and screening of an aggregate writes the bits of `math::scale` and
    /// returns the bits of `math::squared_norm` of the result, up to a NaN's payload (so it passes and fails
    /// exactly the aggregates the central server's policy would), whatever the values:
    /// across the chunk boundary, near overflow, non-finite.
    #[test]
    fn fused_scale_and_measure_is_scale_then_squared_norm(
        x in proptest::collection::vec(proptest::num::f32::ANY, 0..40),
        big in proptest::collection::vec(-3.0e19f32..3.0e19, 0..40),
        a in proptest::num::f32::ANY,
    ) {
        for x in [x, big] {
            let (mut fused, mut plain) = (x.clone(), x);
            let sq = scale_measured(&mut fused, a);
            math::scale(&mut plain, a);
            // Bit for bit but for which NaN payload a sum of NaNs keeps.
            let want = math::squared_norm(&plain);
            prop_assert!(sq.to_bits() == want.to_bits() || (sq.is_nan() && want.is_nan()), "{sq} {want}");
            let bits = |v: &[f32]| v.iter().map(|e| e.to_bits()).collect::<Vec<_>>();
            prop_assert_eq!(bits(&fused), bits(&plain));
        }
    }

    /// H4: one group of n is BSP, message for message and bit for bit, under any
    /// delivery order and with duplicated messages.
    #[test]
    fn one_group_is_bsp(log_n in 0u32..4, dim in 1usize..4, seed in any::<u64>(), dup in 0u64..30, scaling in 0u8..3) {
        let n = 1u32 << log_n;
        let mut c = GroupedConfig::new(n, 0.5, 1);
        c.lr_scaling = [LrScaling::None, LrScaling::Linear, LrScaling::Sqrt][scaling as usize];
        let mut bsp = Plain(BspServer::<f64, Vec<f64>>::new(BspConfig::new(n, 0.5), vec![1.0; dim], vec![0.0; dim]).unwrap());
        let mut g = Plain(grouped(c, dim));
        let a = run(&mut bsp, n, seed, 12, dup, true);
        let b = run(&mut g, n, seed, 12, dup, true);
        prop_assert!(a.trace.len() > 10);
        prop_assert_eq!(&a.trace, &without_group_events(&b.trace));
        prop_assert_eq!(bsp.stats(), g.stats());
        // The stand-alone group server wired to a plain ASP central does the same.
        let mut w = Wired::new(c, dim);
        let d = run(&mut w, n, seed, 12, dup, true);
        prop_assert_eq!(&b.trace, &d.trace);
    }

    /// H4: n groups of one are ASP, message for message and bit for bit, under any delivery
    /// order and with duplicated gradients. (Not with duplicated models or joins: a worker
    /// handed a model twice, or answered twice, may compute on a model its group has since
    /// replaced; ASP applies that gradient with its staleness, a group drops it as stale,
    /// because its step on that version has closed.)
    #[test]
    fn n_groups_of_one_are_asp(n in 2u32..9, dim in 1usize..4, seed in any::<u64>(), dup in 0u64..30) {
        let mut asp = Plain(AspServer::<f64, Vec<f64>>::new(AspConfig::new(n, 0.5), vec![1.0; dim]).unwrap());
        let mut g = Plain(grouped(GroupedConfig::new(n, 0.5, n), dim));
        let a = run(&mut asp, n, seed, 40, dup, false);
        let b = run(&mut g, n, seed, 40, dup, false);
        prop_assert!(a.trace.len() > 40);
        prop_assert_eq!(&a.trace, &without_group_events(&b.trace));
        prop_assert_eq!(asp.stats(), g.stats());
        let mut w = Wired::new(GroupedConfig::new(n, 0.5, n), dim);
        let d = run(&mut w, n, seed, 40, dup, false);
        prop_assert_eq!(&b.trace, &d.trace);
    }

    /// H1–H3: every admitted worker gradient has exactly one outcome; each group step
    /// takes one gradient from each member at the group's version; each aggregate reaches
    /// the central model exactly once (C2: the central model is the initial one minus η
    /// times the weighted sum of exactly the gradients reported applied and exchanged);
    /// staleness is `version − 1 − base`. Any partition, G, H and scaling; the stand-alone
    /// deployment gives the same trace.
    #[test]
    fn every_gradient_reaches_the_central_model_once_through_its_group(
        n in 1u32..9,
        g_pick in any::<u32>(),
        h in 1u32..4,
        part in 0u8..3,
        table in proptest::collection::vec(any::<u8>(), 8),
        scaling in 0u8..3,
        seed in any::<u64>(),
        dup in 0u64..30,
    ) {
        let groups = 1 + g_pick % n;
        let mut c = GroupedConfig::new(n, 0.25, groups);
        c.local_steps = h;
        c.lr_scaling = [LrScaling::None, LrScaling::Linear, LrScaling::Sqrt][scaling as usize];
        c.partition = match part {
            0 => Partition::Contiguous,
            1 => Partition::RoundRobin,
            _ => {
                // A random table in which every group has a member.
                let mut t: Vec<u8> = (0..n).map(|i| (table[i as usize] as u32 % groups) as u8).collect();
                for g in 0..groups { t[g as usize] = g as u8; }
                Partition::explicit(&t).unwrap()
            }
        };
        let dim = 2;
        let mut s = Plain(grouped(c, dim));
        let r = run(&mut s, n, seed, 30, dup, true);
        let outcomes: Vec<&ServerEvent> = r.trace.iter().filter_map(|x| match x {
            Rec::Out(Out::Event(e @ (ServerEvent::Applied { .. } | ServerEvent::Dropped { .. }))) => Some(e),
            _ => None,
        }).collect();
        // Gradients in steps still open at the end have no outcome yet.
        let open: u64 = s.0.groups.iter().map(|g| u64::from(g.count)).sum();
        prop_assert_eq!(outcomes.len() as u64 + open, r.admitted);
        let stats = s.stats();
        prop_assert_eq!(stats.accepted, r.admitted);
        prop_assert_eq!(stats.applied + stats.dropped_total() + open, r.admitted);
        prop_assert_eq!(stats.dropped_total(), stats.dropped_for(DropReason::Stale));
        // Conservation and per-step membership.
        let mut expected = vec![1.0f64; dim];
        let mut pending: Vec<Vec<(f64, Vec<f64>)>> = vec![Vec::new(); groups as usize];
        let mut step_members: BTreeMap<(u32, u64), Vec<u32>> = BTreeMap::new();
        let mut last_group = None;
        let mut exchanges = 0u64;
        for x in &r.trace {
            match x {
                Rec::Out(Out::Event(ServerEvent::GroupApplied { group, base, version, staleness, contributions })) => {
                    prop_assert_eq!(*staleness, version.0 - 1 - base.0);
                    prop_assert_eq!(*contributions, c.local_steps * s.0.shared.layout.size[*group as usize] as u32);
                    last_group = Some(*group);
                    exchanges += 1;
                }
                Rec::Out(Out::Event(ServerEvent::Applied { worker, base, weight, .. })) => {
                    let g = c.group_of(*worker).unwrap();
                    let values = r.sent.get(&(worker.0, base.0)).unwrap().clone();
                    pending[g as usize].push((*weight, values));
                    step_members.entry((g, base.0)).or_default().push(worker.0);
                }
                Rec::Out(Out::Event(ServerEvent::ModelUpdated { version, .. })) => {
                    let g = last_group.take().unwrap() as usize;
                    for (weight, values) in pending[g].drain(..) {
                        for (e, v) in expected.iter_mut().zip(values) { *e -= 0.25 * weight * v; }
                    }
                    let (cv, params) = s.central();
                    if cv == *version {
                        for (p, e) in params.iter().zip(&expected) {
                            prop_assert!((p - e).abs() <= 1e-9 * (1.0 + e.abs()), "{:?} vs {:?}", params, expected);
                        }
                    }
                }
                _ => {}
            }
        }
        prop_assert_eq!(s.central().0, Version(exchanges));
        for ((g, _), members) in &step_members {
            let mut m = members.clone();
            m.sort_unstable();
            let expected: Vec<u32> = (0..n).filter(|w| c.group_of(WorkerId(*w)) == Some(*g)).collect();
            prop_assert_eq!(m, expected);
        }
        let mut w = Wired::new(c, dim);
        let d = run(&mut w, n, seed, 30, dup, true);
        prop_assert_eq!(&r.trace, &d.trace);
    }
}

/// A gradient element: mostly ordinary, sometimes large enough to overflow a squared norm or
/// a sum, sometimes not finite.
fn element() -> impl Strategy<Value = f64> {
    prop_oneof![
        8 => -4.0f64..4.0,
        1 => prop_oneof![Just(1e200f64), Just(-3e307f64), Just(f64::NAN), Just(f64::INFINITY), Just(-0.0f64)],
    ]
}

/// `values` as little-endian bytes.
fn le_bytes(values: &[f64]) -> Vec<u8> {
    let mut out = vec![0u8; values.len() * 8];
    for (v, b) in values.iter().zip(out.chunks_exact_mut(8)) {
        assert!(Scalar::write_le(*v, b));
    }
    out
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(64))]

    /// The fused kernels have the bits of the passes they replace: `add_measured` is
    /// `math::add` and `math::squared_norm` of the gradient, `add_scale_measured` is
    /// `math::add` (or `math::scaled_add`) then `scale_measured`, `apply_copy_clear` is
    /// `math::scaled_add`, `math::copy`, `math::fill_zero` (up to a NaN's payload),
    /// across the chunk boundary, near overflow and for non-finite values.
    #[test]
    fn fused_kernels_are_the_passes_they_replace(
        acc in proptest::collection::vec(proptest::num::f32::ANY, 0..40),
        x in proptest::collection::vec(proptest::num::f32::ANY, 0..40),
        big in proptest::collection::vec(-3.0e19f32..3.0e19, 0..40),
        factor in prop_oneof![Just(1.0f32), proptest::num::f32::ANY],
        w in proptest::num::f32::ANY,
    ) {
        let same = |a: f32, b: f32| a.to_bits() == b.to_bits() || (a.is_nan() && b.is_nan());
        // Bit for bit but for which NaN payload an operation on two NaNs keeps.
        let bits = |v: &[f32]| v.iter().map(|e| if e.is_nan() { u32::MAX } else { e.to_bits() }).collect::<Vec<_>>();
        for x in [x, big] {
            let len = acc.len().min(x.len());
            let (acc, x) = (&acc[..len], &x[..len]);

            let (mut fused, mut plain) = (acc.to_vec(), acc.to_vec());
            let sq = add_measured(&mut fused, x);
            math::add(&mut plain, x).unwrap();
            prop_assert!(same(sq, math::squared_norm(x)));
            prop_assert_eq!(bits(&fused), bits(&plain));

            let (mut fused, mut plain) = (acc.to_vec(), acc.to_vec());
            let sq = add_scale_measured(&mut fused, x, factor, w);
            if factor == 1.0 {
                math::add(&mut plain, x).unwrap();
            } else {
                math::scaled_add(&mut plain, factor, x).unwrap();
            }
            prop_assert!(same(sq, scale_measured(&mut plain, w)));
            prop_assert_eq!(bits(&fused), bits(&plain));

            let (mut params, mut agg, mut model) = (acc.to_vec(), x.to_vec(), vec![7.0f32; len]);
            apply_copy_clear(&mut params, w, &mut agg, &mut model);
            let mut plain = acc.to_vec();
            math::scaled_add(&mut plain, w, x).unwrap();
            prop_assert_eq!(bits(&params), bits(&plain));
            prop_assert_eq!(bits(&model), bits(&plain));
            prop_assert_eq!(bits(&agg), bits(&vec![0.0f32; len]));
        }
    }

    /// The fused paths of a group step (taken for gradients lent as slices) and the two-pass
    /// paths (taken for the same gradients as bytes) give the same refusals, outputs, group
    /// models and central model, bit for bit, whatever the partition, the local steps, the
    /// norm bound and the gradients (overflowing and non-finite ones included).
    #[test]
    fn fused_and_two_pass_group_steps_agree(
        n in 1u32..6,
        groups_seed in any::<u32>(),
        local_steps in 1u32..4,
        scaling in 0u8..3,
        bound in prop_oneof![Just(None), (0.5f64..20.0).prop_map(Some)],
        dim in 1usize..20,
        steps in proptest::collection::vec((any::<u32>(), any::<bool>(), proptest::collection::vec(element(), 20)), 1..80),
    ) {
        let mut c = GroupedConfig::new(n, 0.25, 1 + groups_seed % n);
        c.local_steps = local_steps;
        c.lr_scaling = [LrScaling::None, LrScaling::Linear, LrScaling::Sqrt][scaling as usize];
        c.gradient_policy.max_norm = bound;
        let (mut fused, mut plain) = (grouped(c, dim), grouped(c, dim));
        let show = |outs: Vec<Out>| std::format!("{outs:?}");
        prop_assert_eq!(show(drain_server(&mut fused)), show(drain_server(&mut plain)));
        let mut seqs = vec![0u64; n as usize];
        for (pick, stale, values) in &steps {
            let worker = WorkerId(pick % n);
            let g = c.group_of(worker).unwrap();
            let version = fused.group_version(g).unwrap();
            let base = if *stale { Version(version.0.saturating_sub(1)) } else { version };
            let seq = &mut seqs[worker.0 as usize];
            *seq += 1;
            let values = &values[..dim];
            let bytes = le_bytes(values);
            let slice = ToServer::Grad { base, iteration: 0, seq: *seq, values: Values::Slice(values), loss: None };
            let le = ToServer::Grad { base, iteration: 0, seq: *seq, values: Values::LittleEndian(&bytes), loss: None };
            let now = Instant::ZERO;
            prop_assert_eq!(fused.handle(now, worker, slice), plain.handle(now, worker, le));
            prop_assert_eq!(show(drain_server(&mut fused)), show(drain_server(&mut plain)));
        }
        let bits = |v: &[f64]| v.iter().map(|e| e.to_bits()).collect::<Vec<_>>();
        prop_assert_eq!(fused.version(), plain.version());
        prop_assert_eq!(bits(fused.params()), bits(plain.params()));
        for g in 0..c.groups {
            prop_assert_eq!(fused.group_version(g), plain.group_version(g));
            prop_assert_eq!(bits(fused.group_model(g).unwrap()), bits(plain.group_model(g).unwrap()));
        }
    }
}
