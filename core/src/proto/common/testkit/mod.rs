//! The test kit (feature `testkit`, and the core's own unit tests): owned copies of
//! messages, so tests can collect outputs and deliver them later in any order, and the one
//! sans-IO test network ([`Cluster`]) with its fault model, used by the core's unit tests,
//! the fault swarm (`tests/src/fault.rs`) and the benches.

mod cluster;
mod log;
mod net;

pub use cluster::{Cluster, Node};
pub use log::{CopyLoss, Entry, NetCounts};
pub use net::{Faults, GradientFn, Job, NetConfig, WorkerFactory};

use crate::id::Version;
use crate::math::Scalar;
use crate::msg::{ToServer, ToWorker, Values};
use std::vec;
use std::vec::Vec;

fn owned<T: Scalar>(values: &Values<'_, T>) -> Vec<f64> {
    let mut out = vec![T::zero(); values.len()];
    let _ = values.copy_into(&mut out);
    out.into_iter().map(Scalar::to_f64).collect()
}

/// An owned [`ToWorker`], elements widened to `f64`.
#[allow(missing_docs)] // variants and fields mirror `ToWorker`'s one for one (documented there)
#[derive(Clone, Debug, PartialEq)]
pub enum ToWorkerOwned {
    Model { version: u64, clock: u64, values: Vec<f64> },
    NotNewer { version: u64 },
    PushAck { round: u64, pull_now: bool },
    Abort { iteration: u64 },
    Stop,
}

impl<T: Scalar> From<&ToWorker<'_, T>> for ToWorkerOwned {
    fn from(msg: &ToWorker<'_, T>) -> Self {
        match msg {
            ToWorker::Model { version, clock, values } => {
                Self::Model { version: version.0, clock: *clock, values: owned(values) }
            }
            ToWorker::NotNewer { version } => Self::NotNewer { version: version.0 },
            ToWorker::PushAck { round, pull_now } => Self::PushAck { round: round.0, pull_now: *pull_now },
            ToWorker::Abort { iteration } => Self::Abort { iteration: *iteration },
            ToWorker::Stop => Self::Stop,
        }
    }
}

impl ToWorkerOwned {
    /// Borrows back as a message (elements narrowed to `T`; `buf` holds them).
    pub fn as_msg<'a, T: Scalar>(&self, buf: &'a mut Vec<T>) -> ToWorker<'a, T> {
        match self {
            Self::Model { version, clock, values } => {
                *buf = values.iter().map(|v| T::from_f64(*v)).collect();
                ToWorker::Model { version: Version(*version), clock: *clock, values: Values::Slice(buf) }
            }
            Self::NotNewer { version } => ToWorker::NotNewer { version: Version(*version) },
            Self::PushAck { round, pull_now } => ToWorker::PushAck { round: Version(*round), pull_now: *pull_now },
            Self::Abort { iteration } => ToWorker::Abort { iteration: *iteration },
            Self::Stop => ToWorker::Stop,
        }
    }
}

/// An owned [`ToServer`], elements widened to `f64`.
#[allow(missing_docs)] // variants and fields mirror `ToServer`'s one for one (documented there)
#[derive(Clone, Debug, PartialEq)]
pub enum ToServerOwned {
    Join { epoch: u32 },
    Grad { base: u64, iteration: u64, seq: u64, values: Vec<f64> },
    Delta { round: u64, local_steps: u32, seq: u64, values: Vec<f64> },
    Pull { have: u64, min_clock: u64 },
    Clock { clock: u64, seq: u64, values: Vec<f64> },
    Leave,
}

impl<T: Scalar> From<&ToServer<'_, T>> for ToServerOwned {
    fn from(msg: &ToServer<'_, T>) -> Self {
        match msg {
            ToServer::Join { epoch } => Self::Join { epoch: *epoch },
            ToServer::Grad { base, iteration, seq, values, .. } => {
                Self::Grad { base: base.0, iteration: *iteration, seq: *seq, values: owned(values) }
            }
            ToServer::Delta { round, local_steps, seq, values, .. } => {
                Self::Delta { round: round.0, local_steps: *local_steps, seq: *seq, values: owned(values) }
            }
            ToServer::Pull { have, min_clock } => Self::Pull { have: have.0, min_clock: *min_clock },
            ToServer::Clock { clock, seq, values, .. } => {
                Self::Clock { clock: *clock, seq: *seq, values: owned(values) }
            }
            ToServer::Leave => Self::Leave,
        }
    }
}

impl ToServerOwned {
    /// Borrows back as a message (elements narrowed to `T`; `buf` holds them).
    pub fn as_msg<'a, T: Scalar>(&self, buf: &'a mut Vec<T>) -> ToServer<'a, T> {
        let mut fill = |values: &[f64]| *buf = values.iter().map(|v| T::from_f64(*v)).collect();
        match self {
            Self::Join { epoch } => ToServer::Join { epoch: *epoch },
            Self::Grad { base, iteration, seq, values } => {
                fill(values);
                ToServer::Grad {
                    base: Version(*base),
                    iteration: *iteration,
                    seq: *seq,
                    values: Values::Slice(buf),
                    loss: None,
                }
            }
            Self::Delta { round, local_steps, seq, values } => {
                fill(values);
                ToServer::Delta {
                    round: Version(*round),
                    local_steps: *local_steps,
                    seq: *seq,
                    values: Values::Slice(buf),
                    loss: None,
                }
            }
            Self::Pull { have, min_clock } => ToServer::Pull { have: Version(*have), min_clock: *min_clock },
            Self::Clock { clock, seq, values } => {
                fill(values);
                ToServer::Clock { clock: *clock, seq: *seq, values: Values::Slice(buf), loss: None }
            }
            Self::Leave => ToServer::Leave,
        }
    }
}

/// Drains a server without an upstream: its events, and its messages as owned values with
/// their recipients. A test assertion fails if the server sends a message upstream (drain a
/// server with an upstream with [`drain_server_up`]).
pub fn drain_server<T: Scalar, S: crate::proto::Server<T> + ?Sized>(
    s: &mut S,
) -> (Vec<crate::proto::ServerEvent>, Vec<(crate::proto::Recipient, ToWorkerOwned)>) {
    let (events, sends, up) = drain_server_up(s);
    assert!(up.is_empty(), "drain_server: the server sent {up:?} upstream (use drain_server_up)");
    (events, sends)
}

/// The outputs of a server, owned: events, messages to workers, messages upstream.
pub type Drained = (Vec<crate::proto::ServerEvent>, Vec<(crate::proto::Recipient, ToWorkerOwned)>, Vec<ToServerOwned>);

/// Drains a server: its events, its messages to workers with their recipients, and its
/// messages for the server above it ([`ServerOutput::Upstream`](crate::proto::ServerOutput::Upstream)),
/// as owned values.
pub fn drain_server_up<T: Scalar, S: crate::proto::Server<T> + ?Sized>(s: &mut S) -> Drained {
    let (mut events, mut sends, mut up) = (Vec::new(), Vec::new(), Vec::new());
    while let Some(out) = s.poll_output() {
        match out {
            crate::proto::ServerOutput::Event(e) => events.push(e),
            crate::proto::ServerOutput::Send { to, msg } => sends.push((to, ToWorkerOwned::from(&msg))),
            crate::proto::ServerOutput::Upstream(msg) => up.push(ToServerOwned::from(&msg)),
        }
    }
    (events, sends, up)
}

/// An owned [`WorkerOutput`](crate::proto::WorkerOutput), elements widened to `f64`.
#[derive(Clone, Debug, PartialEq)]
pub enum WorkerOut {
    /// A message to the server.
    Send(ToServerOwned),
    /// A computation: its token, the version and the parameters.
    Compute(crate::id::ComputeId, Version, Vec<f64>),
    /// An event.
    Event(crate::proto::WorkerEvent),
}

/// Drains a worker's outputs as owned values.
pub fn drain_worker<T: Scalar, W: crate::proto::Worker<T> + ?Sized>(w: &mut W) -> Vec<WorkerOut> {
    let mut v = Vec::new();
    while let Some(out) = w.poll_output() {
        v.push(match out {
            crate::proto::WorkerOutput::Send(m) => WorkerOut::Send(ToServerOwned::from(&m)),
            crate::proto::WorkerOutput::Compute { id, version, params } => {
                WorkerOut::Compute(id, version, params.iter().map(|p| Scalar::to_f64(*p)).collect())
            }
            crate::proto::WorkerOutput::Event(e) => WorkerOut::Event(e),
        });
    }
    v
}

/// A borrowed server is a server (so a [`Cluster`] can drive a server the caller keeps).
impl<T: Scalar, S: crate::proto::Server<T> + ?Sized> crate::proto::Server<T> for &mut S {
    fn handle(
        &mut self,
        now: crate::time::Instant,
        from: crate::id::WorkerId,
        msg: ToServer<'_, T>,
    ) -> Result<(), crate::error::Reject> {
        (**self).handle(now, from, msg)
    }
    fn handle_worker_lost(
        &mut self,
        now: crate::time::Instant,
        worker: crate::id::WorkerId,
    ) -> Result<(), crate::error::Reject> {
        (**self).handle_worker_lost(now, worker)
    }
    fn handle_timeout(&mut self, now: crate::time::Instant) {
        (**self).handle_timeout(now);
    }
    fn poll_output(&mut self) -> Option<crate::proto::ServerOutput<'_, T>> {
        (**self).poll_output()
    }
    fn poll_timeout(&self) -> Option<crate::time::Instant> {
        (**self).poll_timeout()
    }
    fn stop(&mut self) {
        (**self).stop();
    }
    fn version(&self) -> Version {
        (**self).version()
    }
    fn params(&self) -> &[T] {
        (**self).params()
    }
    fn stats(&self) -> &crate::proto::ServerStats {
        (**self).stats()
    }
    fn awaits(&self, worker: crate::id::WorkerId) -> bool {
        (**self).awaits(worker)
    }
}

/// What every protocol's test module uses, in one import.
#[cfg(test)]
#[allow(unused_imports)]
pub(crate) mod prelude {
    pub(crate) use super::{ToServerOwned, ToWorkerOwned};
    pub(crate) use crate::error::{ConfigError, Reject};
    pub(crate) use crate::id::{ComputeId, Version, WorkerId};
    pub(crate) use crate::math::{self, Scalar};
    pub(crate) use crate::msg::{ToServer, ToWorker, Values};
    use crate::proto::AnyWorker;
    pub(crate) use crate::proto::{
        Buffer, DropReason, GradientPolicy, GradientWorker, GradientWorkerConfig, Recipient, Server, ServerEvent,
        ServerOutput, ServerStats, Worker, WorkerEvent, WorkerOutput, WorkerSetup,
    };
    pub(crate) use crate::time::{Duration, Instant};
    use proptest::prelude::{TestCaseError, prop_assert, prop_assert_eq};
    use std::vec;
    use std::vec::Vec;

    /// A `Grad` of iteration 0 on `base`.
    pub(crate) fn grad(base: u64, seq: u64, values: &[f64]) -> ToServer<'_, f64> {
        ToServer::Grad { base: Version(base), iteration: 0, seq, values: Values::Slice(values), loss: None }
    }

    /// Asserts that worker 0's gradients (on version 0, two elements) of the sequence
    /// numbers `seqs` are refused at `now` as duplicates.
    pub(crate) fn assert_duplicates<S: Server<f64>>(s: &mut S, now: Instant, seqs: &[u64]) {
        for &seq in seqs {
            let refused = Err(Reject::Duplicate { worker: WorkerId(0), seq });
            assert_eq!(s.handle(now, WorkerId(0), grad(0, seq, &[1.0, 1.0])), refused);
        }
    }

    /// Asserts the refusals every gradient-taking server without pulls gives at `now` (a
    /// model of two elements, `n` workers, worker 1 a member): a sender outside the roster, a
    /// gradient of the wrong length, one holding NaN or infinity, and a `Pull`.
    pub(crate) fn assert_gradient_refusals<S: Server<f64>>(s: &mut S, now: Instant, n: u32) {
        let one = [1.0, 1.0];
        for outsider in [n, u32::MAX] {
            let refused = Err(Reject::UnknownWorker(WorkerId(outsider)));
            assert_eq!(s.handle(now, WorkerId(outsider), grad(0, 0, &one)), refused);
        }
        assert!(matches!(s.handle(now, WorkerId(1), grad(0, 0, &[1.0])), Err(Reject::WrongLength(_))));
        assert_eq!(s.handle(now, WorkerId(1), grad(0, 0, &[f64::NAN, 1.0])), Err(Reject::NotFinite));
        assert_eq!(s.handle(now, WorkerId(1), grad(0, 0, &[f64::INFINITY, 1.0])), Err(Reject::NotFinite));
        let pull = ToServer::Pull { have: Version(0), min_clock: 0 };
        assert_eq!(s.handle(now, WorkerId(1), pull), Err(Reject::Unexpected { kind: "Pull" }));
    }

    /// `config`'s workers over a model of `dim` elements, one per id, each in session 1
    /// without a rejoin timer.
    pub(crate) fn any_workers(config: &crate::proto::ProtocolConfig, dim: usize) -> Vec<AnyWorker<f64, Vec<f64>>> {
        let worker = |i| {
            let setup = WorkerSetup { id: WorkerId(i), epoch: 1, rejoin_after: None };
            AnyWorker::new(config, setup, vec![0.0; dim], vec![0.0; config.worker_scratch_len(dim)]).unwrap()
        };
        (0..config.workers()).map(worker).collect()
    }

    /// Worker `id`'s setup: session 0, no rejoin timer.
    pub(crate) fn setup(id: u32) -> WorkerSetup {
        WorkerSetup { id: WorkerId(id), epoch: 0, rejoin_after: None }
    }

    /// One arbitrary input: (worker, base, seq, length, value, kind); kind 0 and 1 are
    /// gradients of NaN and infinity, 6 a `Join`, 7 a `Leave`, 8 a `Pull`, any other a
    /// gradient of `value`.
    pub(crate) type ArbitraryInput = (u32, u64, u64, usize, f64, u8);

    /// Feeds a round-based server `ops`: nothing panics, the model stays finite, and the
    /// version moves by one and only when `quorum` distinct gradients (`received`) were in.
    pub(crate) fn check_arbitrary_inputs<S: Server<f64>>(
        s: &mut S,
        ops: &[ArbitraryInput],
        received: fn(&S) -> usize,
        quorum: usize,
    ) -> Result<(), TestCaseError> {
        for &(w, base, seq, len, x, kind) in ops {
            let values = match kind {
                0 => vec![f64::NAN; len],
                1 => vec![f64::INFINITY; len],
                _ => vec![x; len],
            };
            let before = s.version();
            let distinct_before = received(s);
            let msg = match kind {
                6 => ToServer::Join { epoch: seq as u32 },
                7 => ToServer::Leave,
                8 => ToServer::Pull { have: Version(base), min_clock: 0 },
                _ => grad(base, seq, &values),
            };
            let _ = s.handle(Instant::from_nanos(seq), WorkerId(w), msg);
            if s.version() != before {
                prop_assert_eq!(s.version(), before.next());
                prop_assert_eq!(distinct_before, quorum);
            }
            prop_assert!(s.params().iter().all(|p| p.is_finite()));
            while s.poll_output().is_some() {}
        }
        Ok(())
    }
}
