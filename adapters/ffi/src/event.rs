//! [`SyncopateEvent`]: the server's and worker's events as one flat C struct.

use syncopate::{DropReason, ServerEvent, WorkerEvent};

/// Server: a contribution was applied (`worker`, `base`, `version`, `staleness`, `weight`).
pub const SYNCOPATE_EVENT_APPLIED: u32 = 1;
/// Server: a valid contribution was dropped (`worker`, `base`, `reason`).
pub const SYNCOPATE_EVENT_DROPPED: u32 = 2;
/// Server: the model moved to `version`, combining `count` contributions.
pub const SYNCOPATE_EVENT_MODEL_UPDATED: u32 = 3;
/// Server (grouped): group `group`'s aggregate made `version` from `base` (`staleness`,
/// `count` gradients).
pub const SYNCOPATE_EVENT_GROUP_APPLIED: u32 = 4;
/// Server: `worker` joined with `epoch`.
pub const SYNCOPATE_EVENT_WORKER_JOINED: u32 = 5;
/// Server: `worker` was declared lost.
pub const SYNCOPATE_EVENT_WORKER_LOST: u32 = 6;
/// Server (DBW): `version` waits for `count` gradients; the estimates are in `estimates`
/// (`Ĝ`, `Ŝ`, `Lη`, expected and observed iteration seconds).
pub const SYNCOPATE_EVENT_BACKUP_CHOSEN: u32 = 7;
/// Server: no progress since `since_ns`; waiting for `worker` (`count` missing).
pub const SYNCOPATE_EVENT_STALLED: u32 = 8;
/// Worker: blocked until a model newer than `version` arrives.
pub const SYNCOPATE_EVENT_BLOCKED: u32 = 9;
/// Worker: computation `compute_id` was abandoned.
pub const SYNCOPATE_EVENT_ABANDONED: u32 = 10;
/// Worker: the server said training is over.
pub const SYNCOPATE_EVENT_STOPPED: u32 = 11;
/// An event this version of the C ABI does not describe.
pub const SYNCOPATE_EVENT_OTHER: u32 = 12;

/// Drop reasons (`reason` of [`SYNCOPATE_EVENT_DROPPED`]): stale.
pub const SYNCOPATE_DROP_STALE: u32 = 0;
/// Aborted by the protocol.
pub const SYNCOPATE_DROP_ABORTED: u32 = 1;
/// Its iteration timed out.
pub const SYNCOPATE_DROP_TIMED_OUT: u32 = 2;
/// Over the staleness bound.
pub const SYNCOPATE_DROP_OVER_STALENESS_BOUND: u32 = 3;
/// Its worker was lost.
pub const SYNCOPATE_DROP_WORKER_LOST: u32 = 4;

/// One event; `kind` says which fields are meaningful (the others are 0).
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq)]
pub struct SyncopateEvent {
    /// One of the `SYNCOPATE_EVENT_*` values.
    pub kind: u32,
    /// The worker concerned.
    pub worker: u32,
    /// A base version.
    pub base: u64,
    /// A model version.
    pub version: u64,
    /// Updates between base and version.
    pub staleness: u64,
    /// The weight a contribution was applied with.
    pub weight: f64,
    /// A `SYNCOPATE_DROP_*` reason.
    pub reason: u32,
    /// A count (contributions, gradients waited for, missing workers).
    pub count: u32,
    /// A group index.
    pub group: u32,
    /// A session epoch.
    pub epoch: u32,
    /// An instant (ns).
    pub since_ns: u64,
    /// A computation token.
    pub compute_id: u64,
    /// DBW estimates: `Ĝ`, `Ŝ`, `Lη`, expected and observed iteration time (s).
    pub estimates: [f32; 5],
    /// MODEL_UPDATED: 1 when the update's contributions reported minibatch losses, their
    /// mean in `loss`.
    pub has_loss: u32,
    /// MODEL_UPDATED: the mean reported loss, when `has_loss` is 1.
    pub loss: f32,
}

fn reason_code(r: DropReason) -> u32 {
    match r {
        DropReason::Stale => SYNCOPATE_DROP_STALE,
        DropReason::Aborted => SYNCOPATE_DROP_ABORTED,
        DropReason::TimedOut => SYNCOPATE_DROP_TIMED_OUT,
        DropReason::OverStalenessBound => SYNCOPATE_DROP_OVER_STALENESS_BOUND,
        _ => SYNCOPATE_DROP_WORKER_LOST,
    }
}

impl From<ServerEvent> for SyncopateEvent {
    fn from(e: ServerEvent) -> Self {
        let zero = Self::default();
        match e {
            ServerEvent::Applied { worker, base, version, staleness, weight } => Self {
                kind: SYNCOPATE_EVENT_APPLIED,
                worker: worker.0,
                base: base.0,
                version: version.0,
                staleness,
                weight,
                ..zero
            },
            ServerEvent::Dropped { worker, base, reason } => Self {
                kind: SYNCOPATE_EVENT_DROPPED,
                worker: worker.0,
                base: base.0,
                reason: reason_code(reason),
                ..zero
            },
            ServerEvent::ModelUpdated { version, contributions, mean_loss } => Self {
                kind: SYNCOPATE_EVENT_MODEL_UPDATED,
                version: version.0,
                count: contributions,
                has_loss: u32::from(mean_loss.is_some()),
                loss: mean_loss.unwrap_or(0.0),
                ..zero
            },
            ServerEvent::GroupApplied { group, base, version, staleness, contributions } => Self {
                kind: SYNCOPATE_EVENT_GROUP_APPLIED,
                group,
                base: base.0,
                version: version.0,
                staleness,
                count: contributions,
                ..zero
            },
            ServerEvent::WorkerJoined { worker, epoch } => {
                Self { kind: SYNCOPATE_EVENT_WORKER_JOINED, worker: worker.0, epoch, ..zero }
            }
            ServerEvent::WorkerLost { worker } => Self { kind: SYNCOPATE_EVENT_WORKER_LOST, worker: worker.0, ..zero },
            ServerEvent::BackupChosen {
                version,
                k,
                g_estimate,
                s_estimate,
                l_eta_estimate,
                tau_estimate,
                observed_iteration_time,
            } => Self {
                kind: SYNCOPATE_EVENT_BACKUP_CHOSEN,
                version: version.0,
                count: k,
                estimates: [g_estimate, s_estimate, l_eta_estimate, tau_estimate, observed_iteration_time],
                ..zero
            },
            ServerEvent::Stalled { waiting_for, missing, since } => Self {
                kind: SYNCOPATE_EVENT_STALLED,
                worker: waiting_for.0,
                count: missing,
                since_ns: since.as_nanos(),
                ..zero
            },
            _ => Self { kind: SYNCOPATE_EVENT_OTHER, ..zero },
        }
    }
}

impl From<WorkerEvent> for SyncopateEvent {
    fn from(e: WorkerEvent) -> Self {
        let zero = Self::default();
        match e {
            WorkerEvent::Blocked { have } => Self { kind: SYNCOPATE_EVENT_BLOCKED, version: have.0, ..zero },
            WorkerEvent::Abandoned { id } => Self { kind: SYNCOPATE_EVENT_ABANDONED, compute_id: id.0, ..zero },
            WorkerEvent::Stopped => Self { kind: SYNCOPATE_EVENT_STOPPED, ..zero },
            #[allow(unreachable_patterns)]
            _ => Self { kind: SYNCOPATE_EVENT_OTHER, ..zero },
        }
    }
}
