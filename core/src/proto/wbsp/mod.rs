//! WBSP, worker-busy synchronous parallel (Yang, Hu, Liu, Jin, Yeung, You; Parallel
//! Computing 121 (2024) 103092), basic and optimized ("overlap") variants.
//!
//! Workers never idle waiting for the slowest one. Each worker runs local SGD steps on its
//! own copy of the model and uploads the change of its copy since its previous upload (a
//! *delta*). The server adds every delta, scaled, into the accumulator of the open round;
//! the round closes, and the global model advances by the accumulator, once every live
//! worker has uploaded at least once during it. The last uploader is by definition the
//! slowest worker of that round, whoever it is (the reference code hard-codes worker 1). A
//! worker learns that the round closed from the reply to its next upload
//! (`PushAck{pull_now: true}`) and then pulls the new model.
//!
//! Rules as implemented (docs/PROTOCOLS.md, "WBSP", gives the reference code and the semantics;
//! choices marked \[RECON\] there are this project's decisions, documented here):
//!
//! * **Round r** has the published model `w_r` (server version `r`) and an accumulator `A`.
//! * **Upload** `Delta{round, local_steps, seq, Δ}` from worker `i`, where `round` is the
//!   version of the model the worker's copy started from: the server refuses it if `seq`
//!   was used ([`Reject::Duplicate`](crate::Reject::Duplicate)), `round` is in the future,
//!   `local_steps` is 0, or `Δ` fails the [`GradientPolicy`]; otherwise `A += s · Δ` with
//!   `s` from [`DeltaScaling`] (times a clipping factor), and `i` is marked as having
//!   uploaded in this round.
//! * **Late deltas** (tagged with a round that already closed) are applied, never dropped:
//!   they go into the accumulator of the round open when they arrive (the next round after
//!   their tag in normal operation), so they are part of exactly one published version.
//!   They count as their sender's upload for the round they arrive in: a round is a window
//!   of time, and "every live worker has uploaded at least once in it" is what closes it.
//!   This is what makes equal-speed workers do exactly one local step per round.
//! * **Close**: when every live worker has uploaded in the round, `w_{r+1} = w_r + A`,
//!   `A = 0`, version `r+1`. Pulls served after that return `w_{r+1}` (W2).
//! * **Reply** to every upload: `PushAck{round: current version, pull_now: tag < current}`;
//!   the closing upload itself gets `pull_now = true`. A worker pulls with
//!   `Pull{have, min_clock: 0}` and receives `Model`; a pull for the version it already has
//!   gets `NotNewer`.
//!
//! # Outcomes and events
//!
//! Every accepted delta gets its [`ServerEvent::Applied`](super::ServerEvent::Applied)
//! event **on arrival**, naming the version that will first contain it (`current + 1`),
//! its staleness (`current − tag`) and its weight (the scaling times any clipping factor).
//! The accumulator is never discarded, so that promise always holds once the round closes;
//! until then the delta is in the open round (the server's [`params`](super::Server::params)
//! are the published model, without the open round). Each close emits one
//! [`ServerEvent::ModelUpdated`](super::ServerEvent::ModelUpdated) whose `contributions` is
//! the number of deltas in the round. No delta is ever dropped, so the server keeps no
//! per-delta log and needs no per-round capacity.
//!
//! # Invariants (tested)
//!
//! * W1: the version advances exactly once per round, on the upload that completes the
//!   round (or on the round deadline, see below); a round closes only after every live
//!   worker uploaded in it.
//! * W2: every pull answered after round r closed returns the same model, version r+1.
//! * W3: every delta is applied exactly once: per-worker sequence numbers refuse
//!   duplicates and replays; nothing is dropped.
//! * W4: workers never block on the server: the only waits are network round trips (the
//!   upload's reply in the basic variant, the pull transfer), so the worker emits no
//!   [`WorkerEvent::Blocked`](super::WorkerEvent::Blocked).
//! * W5: the server keeps fixed-size state (an accumulator of the model's length and
//!   per-worker bit sets); a worker has at most one upload in flight.
//!
//! # Knobs ([`WbspConfig`])
//!
//! * `overlap` (default `false`): the optimized variant. In the basic variant a worker
//!   uploads after every local step and waits for the reply before its next step (as the
//!   reference basic worker does: one network round trip per step). In the overlap variant
//!   it asks for its next computation at once and uploads whenever no upload is in flight,
//!   so the upload overlaps computation and several steps are coalesced into one delta
//!   (`local_steps > 1`) when the link is slower than computation. Pick it whenever
//!   communication takes a noticeable share of a step.
//! * `delta_scaling` (default [`DeltaScaling::PerDelta`], `1/n` per delta as in the code):
//!   fast workers contribute proportionally more progress. [`DeltaScaling::PerLocalStep`]
//!   (`1/(n · local_steps)`) makes a coalesced delta weigh as one step, which damps fast
//!   workers when they run far ahead. `n` is the configured worker count, also while some
//!   workers are not live.
//! * `lr_schedule` (default [`LrSchedule::Constant`]): the workers' local learning rate.
//!   The reference code decays it by each worker's own step count
//!   ([`LrSchedule::ByLocalStep`], fast workers decay earlier);
//!   [`LrSchedule::ByGlobalRound`] decays by the round of the worker's model, the same for
//!   every worker.
//! * `round_deadline` (default `None`): see liveness.
//! * `gradient_policy`: screening of incoming deltas (length, finiteness, norm bound).
//!
//! # Liveness when a worker dies
//!
//! The transport reporting a loss ([`Server::handle_worker_lost`](super::Server)) or a
//! `Leave` removes the worker from the live set at once, and the round closes if everybody
//! else has uploaded. A worker that dies silently stalls the round until
//! `round_deadline`: when a round has been open that long (round 0 counts from the first
//! message the server receives), every live worker that has not uploaded in it is declared
//! lost ([`ServerEvent::WorkerLost`](super::ServerEvent::WorkerLost)) and the round closes
//! without it if it holds at least one delta (otherwise it closes on the next upload). A
//! lost worker is live again as soon as it uploads (or joins) again; its delta is applied
//! like any late delta and the reply tells it to pull. With no deadline and no loss report
//! the round waits for the dead worker forever while the others keep computing into it,
//! so set a deadline of a few slowest-step times whenever workers can die silently.
//!
//! # Tested against the paper's claim
//!
//! `tests/tests/wbsp_sim.rs` checks in the simulator, with the paper's slow odd workers, that
//! both variants reach 0.90 test accuracy before BSP and SSP do, and that the fast workers
//! keep computing under WBSP while they wait under BSP (computation-time share);
//! REPRODUCTION.md, "WBSP", has the figures.
//!
//! # Memory
//!
//! Server: the model (`params`) and an accumulator of the same length (scratch,
//! [`ProtocolConfig::server_scratch_len`](super::ProtocolConfig::server_scratch_len) =
//! `dim`). Worker: its local model (`params`) and one scratch buffer of the model's length
//! that holds the model at its last upload, and, from the upload until the worker next
//! changes its model, the outgoing delta itself (computed in place: `last ← local − last`;
//! since the local model has not changed since the upload, `last` is restored by copying
//! it back before the next change). The delta is attached to the `Send(Delta)` output when
//! that output is polled, so by the driving contract (drain after every input) it has been
//! encoded or copied before the buffer is reused; a worker with an undrained delta refuses
//! inputs that would change its model with [`Reject::Capacity`](crate::Reject::Capacity).
//!
//! # Messages
//!
//! Server receives `Join`, `Delta`, `Pull`, `Leave`; sends `Model` (to a joiner or a
//! puller), `NotNewer`, `PushAck`, `Stop`. Worker sends `Join`, `Delta`, `Pull`; receives
//! `Model`, `NotNewer`, `PushAck`, `Stop`.

mod server;
#[cfg(test)]
mod tests;
mod worker;

pub use server::{WbspRules, WbspServer};
pub use worker::{WbspWorker, WbspWorkerRules};

use super::GradientPolicy;
use crate::error::ConfigError;
use crate::proto::common::validate::check_learning_rate;
use crate::time::Duration;

/// How the server scales a delta before adding it to the round's accumulator.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum DeltaScaling {
    /// `1/n` per delta, however many local steps it contains (the reference code).
    #[default]
    PerDelta,
    /// `1/(n · local_steps)`: a coalesced delta weighs as much as a one-step delta.
    PerLocalStep,
}

impl DeltaScaling {
    /// The factor for a delta of `local_steps` (at least 1) steps with `n` workers.
    #[inline]
    pub fn factor(self, n: u32, local_steps: u32) -> f64 {
        let n = f64::from(n.max(1));
        match self {
            Self::PerDelta => 1.0 / n,
            Self::PerLocalStep => 1.0 / (n * f64::from(local_steps.max(1))),
        }
    }
}

/// The workers' local learning rate over time: `η · factor^⌊k / every⌋`, where `k` is the
/// clock the variant names.
#[derive(Clone, Copy, Debug, Default, PartialEq)]
pub enum LrSchedule {
    /// `η` throughout.
    #[default]
    Constant,
    /// `k` = the worker's own count of local steps (the reference code: each worker has its
    /// own schedule position, so fast workers decay earlier).
    ByLocalStep {
        /// Steps between decays (at least 1).
        every: u64,
        /// The multiplier per decay (finite, positive).
        factor: f64,
    },
    /// `k` = the round (model version) the worker's local copy started from: every worker
    /// uses the same rate in the same round.
    ByGlobalRound {
        /// Rounds between decays (at least 1).
        every: u64,
        /// The multiplier per decay (finite, positive).
        factor: f64,
    },
}

impl LrSchedule {
    /// The learning rate for base rate `lr` after `local_steps` local steps in round `round`.
    pub fn rate(&self, lr: f64, local_steps: u64, round: u64) -> f64 {
        let (k, every, factor) = match *self {
            Self::Constant => return lr,
            Self::ByLocalStep { every, factor } => (local_steps, every, factor),
            Self::ByGlobalRound { every, factor } => (round, every, factor),
        };
        let decays = k / every.max(1);
        lr * libm::pow(factor, decays as f64)
    }

    fn check(&self) -> Result<(), ConfigError> {
        match *self {
            Self::Constant => Ok(()),
            Self::ByLocalStep { every, factor } | Self::ByGlobalRound { every, factor } => {
                if every >= 1 && factor.is_finite() && factor > 0.0 {
                    Ok(())
                } else {
                    Err(ConfigError::Knob("lr_schedule"))
                }
            }
        }
    }
}

/// Settings of a WBSP server and its workers (one config for both: the workers apply their
/// own SGD steps, so the learning rate and its schedule live here).
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct WbspConfig {
    /// The number of workers `n` (ids `0..n`).
    pub workers: u32,
    /// The workers' local learning rate `η`.
    pub learning_rate: f64,
    /// The optimized variant: uploads overlap local steps and coalesce (default `false`).
    pub overlap: bool,
    /// How the server scales each delta (default [`DeltaScaling::PerDelta`]).
    pub delta_scaling: DeltaScaling,
    /// The local learning-rate schedule (default [`LrSchedule::Constant`]).
    pub lr_schedule: LrSchedule,
    /// Close a round that has been open this long without the live workers that have not
    /// uploaded in it, and treat those as lost until they upload again (default `None`:
    /// wait for them; see the module docs on liveness).
    pub round_deadline: Option<Duration>,
    /// Screening of incoming deltas.
    pub gradient_policy: GradientPolicy,
}

impl WbspConfig {
    /// `n` workers, local learning rate `η`, the basic variant, `1/n` per delta, constant
    /// rate, no round deadline, no norm bound.
    pub fn new(workers: u32, learning_rate: f64) -> Self {
        Self {
            workers,
            learning_rate,
            overlap: false,
            delta_scaling: DeltaScaling::default(),
            lr_schedule: LrSchedule::default(),
            round_deadline: None,
            gradient_policy: GradientPolicy::default(),
        }
    }

    /// The same settings with the optimized (overlap) variant switched on.
    pub fn with_overlap(mut self) -> Self {
        self.overlap = true;
        self
    }

    /// The protocol's short name: `"wbsp"`, or `"wbsp-overlap"` for the optimized variant.
    pub fn name(&self) -> &'static str {
        let kind = if self.overlap { super::ProtocolKind::WbspOverlap } else { super::ProtocolKind::Wbsp };
        kind.as_str()
    }

    pub(crate) fn check(&self) -> Result<(), ConfigError> {
        check_learning_rate(self.learning_rate)?;
        self.lr_schedule.check()
    }
}
