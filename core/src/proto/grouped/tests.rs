//! Unit and property tests of the `grouped` protocol.

use super::kernels::{add_measured, add_scale_measured, apply_copy_clear, parts, scale_measured};
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

fn drain_server<T: Scalar, S: Server<T>>(s: &mut S) -> Vec<Out> {
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

mod equivalence;
mod kernels;
mod rounds;
mod standalone;
