//! The protocols: one module per synchronization protocol, each a server and a worker state
//! machine with the same verbs, plus [`AnyServer`] / [`AnyWorker`] to pick one from
//! configuration.
//!
//! # Driving contract
//!
//! Both sides are driven the same way (quinn-proto's and str0m's contract):
//!
//! 1. Feed one input: [`Server::handle`] (a message from a worker),
//!    [`Server::handle_worker_lost`] (the transport lost a worker), [`Worker::handle`] (a
//!    message from the server), [`Worker::handle_gradient`] (the host finished a
//!    computation the worker asked for), or `handle_timeout(now)` when the deadline from
//!    `poll_timeout` has passed.
//! 2. Drain `poll_output()` until it returns `None`, acting on each output: send the message,
//!    record the event, start the computation. Outputs borrow the state machine's buffers,
//!    so finish with one (copy or encode it) before asking for the next.
//! 3. Ask `poll_timeout()` and wake up at that instant (or at the next input, if sooner).
//!
//! A `handle*` call that returns `Err(Reject)` changed nothing: no state, no output.
//!
//! A lost worker is never refused for want of room: [`Server::handle_worker_lost`] during
//! a batch's expansion records the loss, and the drain applies it once the batch is out.
//!
//! # Servers with an upstream
//!
//! A server can itself be a worker of a server above it (its *upstream*): a grouped
//! protocol's group server run on its own ([`AnyServer::subserver`], from
//! [`ProtocolConfig::tiers`]) is BSP toward its members and an ASP worker of the central
//! server. The upstream link is part of the same verbs, so a driver needs no
//! protocol-specific code:
//!
//! - [`ServerOutput::Upstream`] is one more output of `poll_output`: send this message to the
//!   server above (encode it as any worker's message; the upstream server sees this server
//!   as one of its workers).
//! - [`Server::handle_upstream`] is one more input: a message from the server above
//!   arrived (`Model`, `Stop`). Drain `poll_output` after it as after any input.
//! - [`Server::has_upstream`] says, before the run, whether the server needs an upstream
//!   link. A driver that has none refuses to run such a server; a server without an
//!   upstream never emits `Upstream` and refuses `handle_upstream` with
//!   [`Reject::NoUpstream`].
//!
//! Outputs toward the workers come before the upstream ones queued by the same input. The
//! upstream queue is bounded: an input that could not queue its upstream message is
//! refused with [`Reject::Capacity`] (nothing changed), so nothing is dropped. The link must
//! be reliable and ordered (TCP, or a simulated lossless link): the protocol does not
//! retransmit upstream messages, and a driver that loses the link ends the server's run
//! (its workers then rejoin a restarted one).
//!
//! # Outcomes
//!
//! Every gradient (or delta, or clock update) a server receives has exactly one outcome:
//! refused with an `Err` ([`Reject`]: malformed, duplicate, from an unknown worker, not
//! finite…), or later an [`ServerEvent::Applied`] or a [`ServerEvent::Dropped`] event (valid
//! but discarded by the protocol's rules, with a [`DropReason`]).

mod any;
pub mod asp;
pub mod backup;
pub mod bap;
pub mod bsp;
pub mod common;
pub mod dbw;
pub mod grouped;
mod kind;
pub mod sharded;
pub mod ssp;
pub mod wbsp;

pub use any::{AnyServer, AnyWorker, ProtocolConfig, Tiers};
pub use common::engine::{CoreOf, HasSlot, ProtocolServer, Rules, ServerCore};
pub use common::gradient_worker::{GradientRules, GradientWorker, GradientWorkerConfig};
pub use common::optim::{AdamW, Optimizer, Rule, Schedule};
#[cfg(any(feature = "alloc", test))]
pub use common::table::Heap;
pub use common::table::{DEFAULT_INLINE_WORKERS, Inline, Slot, Storage, WorkerRecord};
#[cfg(test)]
#[allow(unused_imports)]
pub(crate) use common::testkit::{ToServerOwned, ToWorkerOwned};
pub use common::validate::{GradientPolicy, LargeGradient};
pub use common::worker::{ProtocolWorker, WorkerCore, WorkerRules, WorkerSetup};
pub use kind::{Knob, ProtocolKind};

use crate::error::Reject;
use crate::id::{ComputeId, Version, WorkerId};
use crate::math::Scalar;
use crate::msg::{ToServer, ToWorker};
use crate::time::Instant;

/// Storage for a tensor: anything that lends out a mutable slice (a `Vec<T>`, a
/// `&mut [T]`, a `[T; N]`, a static array). The caller owns the memory; the state machine
/// only borrows it for its lifetime.
pub trait Buffer<T>: AsRef<[T]> + AsMut<[T]> {}
impl<T, B: AsRef<[T]> + AsMut<[T]> + ?Sized> Buffer<T> for B {}

/// Where a server's message goes.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Recipient {
    /// One worker.
    Worker(WorkerId),
    /// Every worker the transport is connected to.
    AllWorkers,
}

/// One output of a server state machine.
#[derive(Debug)]
#[must_use]
// The tag is as wide as the event's alignment, so an output holds no padding between the
// two and is copied in whole words.
#[repr(u64)]
pub enum ServerOutput<'a, T> {
    /// Send `msg` to `to`.
    Send {
        /// The recipient.
        to: Recipient,
        /// The message (its payload borrows the server's model).
        msg: ToWorker<'a, T>,
    },
    /// Send `msg` to the server above this one (see [Servers with an upstream](self#servers-with-an-upstream)).
    /// Only a server whose [`Server::has_upstream`] is true emits it.
    Upstream(ToServer<'a, T>),
    /// Something happened that a user may want to log, count or plot.
    Event(ServerEvent),
}

/// One output of a worker state machine.
#[derive(Debug)]
#[must_use]
pub enum WorkerOutput<'a, T> {
    /// Send `msg` to the server.
    Send(ToServer<'a, T>),
    /// Compute a gradient at `params` and hand it back with
    /// [`Worker::handle_gradient`]`(now, id, &grad)`.
    Compute {
        /// The job's token, to pass back with the gradient.
        id: ComputeId,
        /// The model version `params` belongs to.
        version: Version,
        /// The parameters to compute the gradient at.
        params: &'a [T],
    },
    /// Something happened on the worker.
    Event(WorkerEvent),
}

/// Why a valid gradient was discarded rather than applied.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
#[non_exhaustive]
pub enum DropReason {
    /// Computed on a version whose iteration already closed (a backup worker, or reordering).
    Stale,
    /// The protocol told the worker to abandon this iteration (timeout or backup cut-off).
    Aborted,
    /// Its iteration closed by timeout before it arrived.
    TimedOut,
    /// Its staleness exceeds the protocol's bound.
    OverStalenessBound,
    /// Its worker was declared lost before the gradient could be used.
    WorkerLost,
}

impl DropReason {
    /// Every reason, for counters and reports.
    pub const ALL: [Self; 5] = [Self::Stale, Self::Aborted, Self::TimedOut, Self::OverStalenessBound, Self::WorkerLost];

    /// A short lowercase name.
    pub fn name(self) -> &'static str {
        match self {
            Self::Stale => "stale",
            Self::Aborted => "aborted",
            Self::TimedOut => "timed_out",
            Self::OverStalenessBound => "over_staleness_bound",
            Self::WorkerLost => "worker_lost",
        }
    }

    fn index(self) -> usize {
        match self {
            Self::Stale => 0,
            Self::Aborted => 1,
            Self::TimedOut => 2,
            Self::OverStalenessBound => 3,
            Self::WorkerLost => 4,
        }
    }
}

/// What a server reports.
#[derive(Clone, Copy, Debug, PartialEq)]
#[non_exhaustive]
pub enum ServerEvent {
    /// A contribution from `worker`, computed on `base`, is part of model `version`.
    Applied {
        /// Who sent it.
        worker: WorkerId,
        /// The version it was computed on. SSP: the version of the last model the server
        /// sent to that worker (the base of its cache).
        base: Version,
        /// The model version that first includes it.
        version: Version,
        /// Updates applied between `base` and this one (`version - 1 - base`). SSP: only
        /// other workers' updates (the worker's own are in its cache).
        staleness: u64,
        /// The factor it was multiplied by before the learning rate (1/k for a mean of k,
        /// times any clipping factor). SSP: only the clipping factor, since its payload is
        /// already the step `−η_step · g`.
        weight: f64,
    },
    /// A valid contribution was discarded.
    Dropped {
        /// Who sent it.
        worker: WorkerId,
        /// The version it was computed on.
        base: Version,
        /// Why.
        reason: DropReason,
    },
    /// The model moved to `version`, combining `contributions` gradients or deltas.
    ModelUpdated {
        /// The new version.
        version: Version,
        /// How many contributions it combines.
        contributions: u32,
        /// The mean of the minibatch losses the applied contributions reported (`None` if
        /// none reported one). Grouped: the central update's mean over the group's members.
        mean_loss: Option<f32>,
    },
    /// Grouped protocol: group `group`'s aggregate (the mean gradient of its members, or the
    /// sum of `H` such means) was applied to the central model, making `version`. One per
    /// central update; the per-gradient outcomes are the members' [`Self::Applied`] events.
    GroupApplied {
        /// The group (an index into the partition).
        group: u32,
        /// The central version the group's model was based on.
        base: Version,
        /// The central version that first includes the aggregate.
        version: Version,
        /// Central updates applied between `base` and this one (other groups' updates).
        staleness: u64,
        /// Worker gradients the aggregate combines.
        contributions: u32,
    },
    /// Grouped protocol: the central server refused group `group`'s message (its aggregate
    /// computed on central version `base`, or its re-join), so the group's step since its
    /// last exchange is not in the central model (its members' gradients were reported
    /// [`Self::Applied`] to the group model). Never expected: the aggregate passed the same
    /// screening as every gradient in it; reported, in release builds too, so that nothing
    /// is lost silently.
    GroupExchangeRefused {
        /// The group.
        group: u32,
        /// The central version the group's model was based on.
        base: Version,
        /// Why the central server refused.
        reason: Reject,
    },
    /// Grouped protocol: group `group` could not take the central model `version` (the
    /// reply to its exchange); it keeps its own model. Never expected; reported, in release
    /// builds too.
    GroupRebaseFailed {
        /// The group.
        group: u32,
        /// The central version it could not take.
        version: Version,
        /// Why.
        reason: Reject,
    },
    /// A worker joined (or rejoined with a newer epoch).
    WorkerJoined {
        /// The worker.
        worker: WorkerId,
        /// Its session epoch.
        epoch: u32,
    },
    /// A worker was declared lost (by the transport, a `Leave`, or a timeout).
    WorkerLost {
        /// The worker.
        worker: WorkerId,
    },
    /// DBW chose how many gradients version `version` waits for (`b = n − k` backup
    /// workers), once per iteration, with the estimates behind the choice.
    BackupChosen {
        /// The version whose iteration waits for `k` gradients.
        version: Version,
        /// Gradients to wait for.
        k: u32,
        /// Smoothed squared gradient norm `Ĝ` (0 until estimated). The estimates are `f32`
        /// to keep every server's output queue small.
        g_estimate: f32,
        /// Smoothed per-gradient variance `Ŝ` (0 until estimated).
        s_estimate: f32,
        /// The smoothness product `Lη` used.
        l_eta_estimate: f32,
        /// Expected duration of the iteration with this `k`, seconds (0 until estimated).
        tau_estimate: f32,
        /// Observed duration of the iteration that just closed, seconds.
        observed_iteration_time: f32,
    },
    /// The current iteration has made no progress since `since`; it waits for `waiting_for`
    /// (the lowest-numbered missing worker). Reported again every stall interval.
    Stalled {
        /// A worker the server is waiting for.
        waiting_for: WorkerId,
        /// How many workers are missing.
        missing: u32,
        /// When the iteration started waiting.
        since: Instant,
    },
}

/// What a worker reports.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub enum WorkerEvent {
    /// The worker cannot start its next computation until the server sends a newer model.
    Blocked {
        /// The version the worker holds.
        have: Version,
    },
    /// A computation was abandoned (a newer model or an abort arrived).
    Abandoned {
        /// The abandoned job.
        id: ComputeId,
    },
    /// The server said training is over.
    Stopped,
}

/// Counters every server keeps: what it received and what became of it.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct ServerStats {
    /// Contributions (gradients, deltas, clock updates) accepted for processing.
    pub accepted: u64,
    /// Contributions applied to the model.
    pub applied: u64,
    /// Contributions dropped, by [`DropReason`] (index order of [`DropReason::ALL`]).
    pub dropped: [u64; 5],
    /// Inputs refused with a [`Reject`].
    pub rejected: u64,
    /// Model updates (version increments).
    pub updates: u64,
    /// Outputs that found the output queue full. Zero by construction (every input is
    /// refused with [`Reject::Capacity`] unless there is room for all it can produce); a
    /// nonzero count is a bug, reported here instead of lost silently.
    pub outputs_lost: u64,
}

impl ServerStats {
    /// All drops together.
    pub fn dropped_total(&self) -> u64 {
        self.dropped.iter().sum()
    }

    /// Drops for one reason.
    pub fn dropped_for(&self, reason: DropReason) -> u64 {
        self.dropped.get(reason.index()).copied().unwrap_or(0)
    }

    pub(crate) fn count_drop(&mut self, reason: DropReason) {
        if let Some(c) = self.dropped.get_mut(reason.index()) {
            *c += 1;
        }
    }
}

/// Counters of what a worker sent, kept by whoever drives it (the state machines do not
/// count; a driver records every [`WorkerOutput::Send`] with [`Self::record`] and keeps the
/// tally across the worker's sessions, so a restarted worker's counts go on). With the
/// server's [`ServerStats`] they make the conservation ledger: every contribution counted
/// here is applied, dropped, held by the server, in flight, or lost with a cause.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct WorkerStats {
    /// Distinct contributions (gradients, deltas, clock updates) sent: a sequence number
    /// above every one sent before.
    pub contributions: u64,
    /// Contributions sent again with a sequence number already sent (retransmissions the
    /// server refuses as duplicates if an earlier copy arrived).
    pub resent: u64,
    /// `Join` messages sent.
    pub joins: u64,
    /// Other messages sent (`Pull`, `Leave`).
    pub other: u64,
    /// The highest contribution sequence number sent.
    pub last_seq: Option<u64>,
}

impl WorkerStats {
    /// Counts one message the worker sent.
    pub fn record<T>(&mut self, msg: &ToServer<'_, T>) {
        match *msg {
            ToServer::Grad { seq, .. } | ToServer::Delta { seq, .. } | ToServer::Clock { seq, .. } => {
                if self.last_seq.is_none_or(|last| seq > last) {
                    self.contributions += 1;
                    self.last_seq = Some(seq);
                } else {
                    self.resent += 1;
                }
            }
            ToServer::Join { .. } => self.joins += 1,
            ToServer::Pull { .. } | ToServer::Leave => self.other += 1,
        }
    }
}

/// The verbs of every server state machine. See the [module docs](self) for the driving
/// contract.
pub trait Server<T: Scalar> {
    /// A message from `from` arrived at `now`.
    fn handle(&mut self, now: Instant, from: WorkerId, msg: ToServer<'_, T>) -> Result<(), Reject>;
    /// The transport lost `worker` (connection closed, heartbeat missed). Refused only for
    /// a worker id outside the run ([`Reject::UnknownWorker`]): a loss reported while the
    /// server takes no input (a batch is being expanded) is recorded and applied once the
    /// outputs have drained, in the same drain, so a driver may report any number of losses
    /// back to back.
    fn handle_worker_lost(&mut self, now: Instant, worker: WorkerId) -> Result<(), Reject>;
    /// The deadline from [`Self::poll_timeout`] passed.
    fn handle_timeout(&mut self, now: Instant);
    /// The next output, borrowing the server's model; `None` when drained.
    fn poll_output(&mut self) -> Option<ServerOutput<'_, T>>;
    /// When [`Self::handle_timeout`] should be called next, if ever.
    fn poll_timeout(&self) -> Option<Instant>;
    /// Tells every worker to stop (queues [`ToWorker::Stop`]).
    fn stop(&mut self);
    /// The current model version.
    fn version(&self) -> Version;
    /// The current model.
    fn params(&self) -> &[T];
    /// What the server received and what became of it.
    fn stats(&self) -> &ServerStats;
    /// The momentum buffer (the model before the last update) of a server with SGD
    /// momentum, for a checkpoint to save; `None` without momentum (the default).
    fn momentum_buffer(&self) -> Option<&[T]> {
        None
    }
    /// The update rule's state ([`Optimizer::state_len`] elements: the momentum buffer,
    /// Nesterov's velocity, AdamW's `m` then `v`) for a checkpoint to save; `None` for a rule
    /// without state (the default).
    fn optimizer_state(&self) -> Option<&[T]> {
        None
    }
    /// Updates applied through the update rule (its schedule's and AdamW's step count), for
    /// a checkpoint to save; 0 without a rule (the default).
    fn optimizer_steps(&self) -> u64 {
        0
    }
    /// Whether the step the server is waiting for lacks `worker`'s contribution: the
    /// workers a [`ServerEvent::Stalled`] report counts (it names only the first), for a
    /// caller that names them all. `false` for every worker when nothing waits, and by
    /// default (a server that does not say).
    fn awaits(&self, worker: WorkerId) -> bool {
        let _ = worker;
        false
    }
    /// Whether this server is a worker of a server above it: it emits
    /// [`ServerOutput::Upstream`] and takes [`Self::handle_upstream`], so its driver must
    /// give it an upstream link. False unless the server says otherwise.
    fn has_upstream(&self) -> bool {
        false
    }
    /// A message from the server above arrived at `now` (see
    /// [Servers with an upstream](self#servers-with-an-upstream)). A server without an
    /// upstream refuses it with [`Reject::NoUpstream`].
    fn handle_upstream(&mut self, now: Instant, msg: ToWorker<'_, T>) -> Result<(), Reject> {
        let _ = (now, msg);
        Err(Reject::NoUpstream)
    }
}

/// The verbs of every worker state machine. See the [module docs](self) for the driving
/// contract. A new worker's first output is its [`ToServer::Join`].
pub trait Worker<T: Scalar> {
    /// A message from the server arrived at `now`.
    fn handle(&mut self, now: Instant, msg: ToWorker<'_, T>) -> Result<(), Reject>;
    /// The host finished the computation `id` that a [`WorkerOutput::Compute`] asked for
    /// and reports no loss: [`Self::handle_gradient_with_loss`] with `None`.
    fn handle_gradient(&mut self, now: Instant, id: ComputeId, grad: &[T]) -> Result<(), Reject> {
        self.handle_gradient_with_loss(now, id, grad, None)
    }
    /// The host finished the computation `id` that a [`WorkerOutput::Compute`] asked for;
    /// `loss` is its minibatch loss, if it reports one, sent to the server with the
    /// contribution. A non-finite loss is refused with [`Reject::LossNotFinite`] (nothing
    /// changed, as for a non-finite gradient).
    fn handle_gradient_with_loss(
        &mut self,
        now: Instant,
        id: ComputeId,
        grad: &[T],
        loss: Option<f32>,
    ) -> Result<(), Reject>;
    /// The deadline from [`Self::poll_timeout`] passed.
    fn handle_timeout(&mut self, now: Instant);
    /// The next output; `None` when drained.
    fn poll_output(&mut self) -> Option<WorkerOutput<'_, T>>;
    /// When [`Self::handle_timeout`] should be called next, if ever.
    fn poll_timeout(&self) -> Option<Instant>;
    /// This worker's id.
    fn id(&self) -> WorkerId;
    /// Whether the server told this worker to stop.
    fn is_stopped(&self) -> bool;
    /// Outputs that found the worker's output queue full: zero by construction (inputs are
    /// refused with [`Reject::Capacity`] unless there is room), nonzero only through a bug.
    fn outputs_lost(&self) -> u64 {
        0
    }
}
