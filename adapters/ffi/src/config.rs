//! [`SyncopateConfig`], the plain C struct that covers every protocol and knob, and its
//! conversion to and from the core's [`ProtocolConfig`].

use crate::error::{Detail, Failure, SYNCOPATE_ERR_CONFIG};
use syncopate::proto::DEFAULT_INLINE_WORKERS;
use syncopate::proto::asp::AspConfig;
use syncopate::proto::backup::{BackupConfig, Interrupt};
use syncopate::proto::bap::{BapBound, BapConfig, TimeoutFrom};
use syncopate::proto::bsp::BspConfig;
use syncopate::proto::dbw::{DbwConfig, LEta};
use syncopate::proto::grouped::MAX_EXPLICIT_WORKERS;
use syncopate::proto::grouped::{GroupedConfig, LrScaling, Partition};
use syncopate::proto::ssp::{SspConfig, SspStep};
use syncopate::proto::wbsp::{DeltaScaling, LrSchedule, WbspConfig};
use syncopate::proto::{GradientPolicy, LargeGradient};
use syncopate::{Duration, ProtocolConfig, ProtocolKind};

/// The most workers a configuration may have (the length of `partition_table`).
pub const SYNCOPATE_MAX_WORKERS: usize = 256;
// It is also the capacity of a handle's inline per-worker table.
const _: () = assert!(SYNCOPATE_MAX_WORKERS == DEFAULT_INLINE_WORKERS && SYNCOPATE_MAX_WORKERS == MAX_EXPLICIT_WORKERS);

/// Bulk synchronous parallel.
pub const SYNCOPATE_PROTOCOL_BSP: u32 = 0;
/// Asynchronous parallel.
pub const SYNCOPATE_PROTOCOL_ASP: u32 = 1;
/// Synchronous with `backup_workers` static backup workers.
pub const SYNCOPATE_PROTOCOL_BACKUP: u32 = 2;
/// Dynamic backup workers.
pub const SYNCOPATE_PROTOCOL_DBW: u32 = 3;
/// Worker-busy synchronous parallel (`wbsp_overlap` selects the optimized variant).
pub const SYNCOPATE_PROTOCOL_WBSP: u32 = 4;
/// Grouped hybrid: BSP inside `groups` groups, ASP between them.
pub const SYNCOPATE_PROTOCOL_GROUPED: u32 = 5;
/// Stale synchronous parallel (bound `staleness`).
pub const SYNCOPATE_PROTOCOL_SSP: u32 = 6;
/// Bounded asynchronous parallel (bound `staleness`).
pub const SYNCOPATE_PROTOCOL_BAP: u32 = 7;

/// The `protocol` value and `wbsp_overlap` flag of a [`SyncopateConfig`] that select `kind`
/// (WBSP's two kinds share [`SYNCOPATE_PROTOCOL_WBSP`]). The values never change.
pub const fn protocol_code(kind: ProtocolKind) -> (u32, u32) {
    match kind {
        ProtocolKind::Bsp => (SYNCOPATE_PROTOCOL_BSP, 0),
        ProtocolKind::Asp => (SYNCOPATE_PROTOCOL_ASP, 0),
        ProtocolKind::Ssp => (SYNCOPATE_PROTOCOL_SSP, 0),
        ProtocolKind::Bap => (SYNCOPATE_PROTOCOL_BAP, 0),
        ProtocolKind::Backup => (SYNCOPATE_PROTOCOL_BACKUP, 0),
        ProtocolKind::Dbw => (SYNCOPATE_PROTOCOL_DBW, 0),
        ProtocolKind::Wbsp => (SYNCOPATE_PROTOCOL_WBSP, 0),
        ProtocolKind::WbspOverlap => (SYNCOPATE_PROTOCOL_WBSP, 1),
        ProtocolKind::Grouped => (SYNCOPATE_PROTOCOL_GROUPED, 0),
    }
}

/// DBW `Lη`: the fixed value `l_eta_initial`.
pub const SYNCOPATE_L_ETA_FIXED: u32 = 0;
/// DBW `Lη`: the secant estimate from `l_eta_initial`, clipped to `[l_eta_min, l_eta_max]`.
pub const SYNCOPATE_L_ETA_SECANT: u32 = 1;
/// DBW `Lη`: the Rayleigh-quotient estimate from `l_eta_initial`, clipped likewise.
pub const SYNCOPATE_L_ETA_RAYLEIGH: u32 = 2;
/// DBW `Lη`: separate signal and noise curvatures fitted online (the default), each clipped
/// to `[l_eta_min, l_eta_max]`, `l_eta_initial` until the first estimate.
pub const SYNCOPATE_L_ETA_SPLIT: u32 = 3;

/// WBSP learning rate: constant.
pub const SYNCOPATE_LR_CONSTANT: u32 = 0;
/// WBSP learning rate: `η · factor^⌊local_steps / every⌋` (each worker's own step count).
pub const SYNCOPATE_LR_BY_LOCAL_STEP: u32 = 1;
/// WBSP learning rate: `η · factor^⌊round / every⌋` (the global round).
pub const SYNCOPATE_LR_BY_GLOBAL_ROUND: u32 = 2;

/// Grouped partition: contiguous blocks.
pub const SYNCOPATE_PARTITION_CONTIGUOUS: u32 = 0;
/// Grouped partition: worker `i` in group `i mod groups`.
pub const SYNCOPATE_PARTITION_ROUND_ROBIN: u32 = 1;
/// Grouped partition: worker `i` in group `partition_table[i]`.
pub const SYNCOPATE_PARTITION_EXPLICIT: u32 = 2;

/// Every protocol and knob in one plain struct. Fill it with [`syncopate_config_default`]
/// for a protocol, then change the knobs you need; fields of other protocols are ignored.
/// Durations are nanoseconds, with 0 meaning "none".
///
/// [`syncopate_config_default`]: crate::syncopate_config_default
#[repr(C)]
#[derive(Clone, Copy, Debug)]
pub struct SyncopateConfig {
    /// One of the `SYNCOPATE_PROTOCOL_*` values.
    pub protocol: u32,
    /// The number of workers `n` (ids `0..n`), at most 256.
    pub workers: u32,
    /// The learning rate `η` (finite, positive).
    pub learning_rate: f64,
    /// Gradients with a larger L2 norm are clipped or refused; 0 for no bound.
    pub max_norm: f64,
    /// Above `max_norm`: 0 clips to the bound, 1 refuses the gradient.
    pub refuse_large: u32,
    /// Report a stall after this long without progress (ns); 0 never (all but ASP and WBSP).
    pub stall_report_ns: u64,
    /// BACKUP: the number of backup workers `b` (each update averages `n − b` gradients).
    pub backup_workers: u32,
    /// BACKUP and DBW: 0 aborts the late workers' computations, 1 lets them run to completion.
    pub run_to_completion: u32,
    /// DBW: the fewest gradients an update waits for.
    pub dbw_k_min: u32,
    /// DBW: iterations in the estimation window.
    pub dbw_window: u32,
    /// DBW: the smoothing factor of the estimates, in `[0, 1)`.
    pub dbw_ema_beta: f64,
    /// DBW: iterations at the start that wait for `dbw_warmup_k` gradients before estimating.
    pub dbw_warmup_iterations: u32,
    /// DBW: how many gradients the warm-up iterations wait for; 0 for every live worker.
    pub dbw_warmup_k: u32,
    /// DBW: one of the `SYNCOPATE_L_ETA_*` modes.
    pub dbw_l_eta_mode: u32,
    /// DBW: the fixed `Lη`, or the estimate's starting value.
    pub dbw_l_eta_initial: f64,
    /// DBW: the estimate's lower clip.
    pub dbw_l_eta_min: f64,
    /// DBW: the estimate's upper clip.
    pub dbw_l_eta_max: f64,
    /// WBSP: 1 for the optimized variant (uploads overlap local steps).
    pub wbsp_overlap: u32,
    /// WBSP: 0 scales each delta by `1/n`, 1 by `1/(n · local_steps)`.
    pub wbsp_scale_per_local_step: u32,
    /// WBSP: one of the `SYNCOPATE_LR_*` schedules.
    pub wbsp_lr_schedule: u32,
    /// WBSP: steps or rounds between learning-rate decays (at least 1 with a schedule).
    pub wbsp_lr_every: u64,
    /// WBSP: the multiplier per decay.
    pub wbsp_lr_factor: f64,
    /// WBSP: close a round open this long without its missing workers (ns); 0 waits.
    pub wbsp_round_deadline_ns: u64,
    /// GROUPED: the number of groups `G` (1 is BSP, `n` is ASP).
    pub groups: u32,
    /// GROUPED: one of the `SYNCOPATE_PARTITION_*` values.
    pub partition: u32,
    /// GROUPED with an explicit partition: the group of worker `i` is `partition_table[i]`.
    pub partition_table: [u8; SYNCOPATE_MAX_WORKERS],
    /// GROUPED: group steps per exchange with the central server.
    pub local_steps: u32,
    /// GROUPED: the central learning rate scaled by 0 nothing, 1 the group count, 2 its root.
    pub lr_scaling: u32,
    /// SSP and BAP: the staleness bound.
    pub staleness: u64,
    /// SSP: 0 averages the step over the workers (`η/n`), 1 takes `η` per worker.
    pub ssp_per_worker_step: u32,
    /// BAP: 0 allows a lag of at most `staleness`, 1 below it.
    pub bap_bound_below: u32,
    /// BAP: close an iteration after this long (ns); 0 never.
    pub bap_iteration_timeout_ns: u64,
    /// BAP: the time limit runs from 0 the later of first gradient and publication, 1 the
    /// first gradient, 2 the publication.
    pub bap_timeout_from: u32,
    /// Server: SGD with momentum `β` in `[0, 1)` on every update (PyTorch's `v ← βv + g;
    /// x ← x − ηv`); 0 is plain SGD. Not 0: the server's memory holds one more model-sized
    /// buffer (`syncopate_server_size` counts it). Workers ignore it.
    pub momentum: f64,
}

fn knob(name: &'static str, value: u64) -> Failure {
    Failure::new(SYNCOPATE_ERR_CONFIG, name).with(Detail::Value(value))
}

fn duration(ns: u64) -> Option<Duration> {
    (ns != 0).then(|| Duration::from_nanos(ns))
}

fn flag(name: &'static str, v: u32) -> Result<bool, Failure> {
    match v {
        0 => Ok(false),
        1 => Ok(true),
        _ => Err(knob(name, u64::from(v))),
    }
}

impl SyncopateConfig {
    /// Defaults of every knob (the core's constructors), for `protocol`, one of the
    /// `SYNCOPATE_PROTOCOL_*` values.
    pub(crate) fn defaults(protocol: u32, workers: u32, learning_rate: f64) -> Result<Self, Failure> {
        if !ProtocolKind::ALL.into_iter().any(|kind| protocol_code(kind).0 == protocol) {
            return Err(knob("protocol", u64::from(protocol)));
        }
        Ok(Self::plain(protocol, workers, learning_rate))
    }

    /// What [`syncopate_config_default`](crate::syncopate_config_default) fills in for
    /// `kind` ([`protocol_code`]).
    pub fn for_kind(kind: ProtocolKind, workers: u32, learning_rate: f64) -> Self {
        let (protocol, wbsp_overlap) = protocol_code(kind);
        Self { wbsp_overlap, ..Self::plain(protocol, workers, learning_rate) }
    }

    /// The protocol this struct selects; `None` if a `protocol` or other enum value is not
    /// one the C ABI defines.
    pub fn kind(&self) -> Option<ProtocolKind> {
        self.protocol_config().ok().map(|config| config.kind())
    }

    fn plain(protocol: u32, workers: u32, learning_rate: f64) -> Self {
        let dbw = DbwConfig::new(workers, learning_rate);
        let (mode, initial, min, max) = match dbw.l_eta {
            LEta::Fixed(x) => (SYNCOPATE_L_ETA_FIXED, x, x, x),
            LEta::Secant { initial, min, max } => (SYNCOPATE_L_ETA_SECANT, initial, min, max),
            LEta::Rayleigh { initial, min, max } => (SYNCOPATE_L_ETA_RAYLEIGH, initial, min, max),
            LEta::Split { initial, min, max } => (SYNCOPATE_L_ETA_SPLIT, initial, min, max),
        };
        Self {
            protocol,
            workers,
            learning_rate,
            max_norm: 0.0,
            refuse_large: 0,
            stall_report_ns: 0,
            backup_workers: 0,
            run_to_completion: 0,
            dbw_k_min: dbw.k_min,
            dbw_window: dbw.window,
            dbw_ema_beta: dbw.ema_beta,
            dbw_warmup_iterations: dbw.warmup_iterations,
            dbw_warmup_k: dbw.warmup_k.unwrap_or(0),
            dbw_l_eta_mode: mode,
            dbw_l_eta_initial: initial,
            dbw_l_eta_min: min,
            dbw_l_eta_max: max,
            wbsp_overlap: 0,
            wbsp_scale_per_local_step: 0,
            wbsp_lr_schedule: SYNCOPATE_LR_CONSTANT,
            wbsp_lr_every: 1,
            wbsp_lr_factor: 1.0,
            wbsp_round_deadline_ns: 0,
            groups: 1,
            partition: SYNCOPATE_PARTITION_CONTIGUOUS,
            partition_table: [0; SYNCOPATE_MAX_WORKERS],
            local_steps: 1,
            lr_scaling: 0,
            staleness: 0,
            ssp_per_worker_step: 0,
            bap_bound_below: 0,
            bap_iteration_timeout_ns: 0,
            bap_timeout_from: 0,
            momentum: 0.0,
        }
    }

    fn policy(&self) -> Result<GradientPolicy, Failure> {
        let on_large =
            if flag("refuse_large", self.refuse_large)? { LargeGradient::Reject } else { LargeGradient::Clip };
        Ok(GradientPolicy { max_norm: (self.max_norm != 0.0).then_some(self.max_norm), on_large })
    }

    /// The core configuration this struct describes. Unknown enum values are refused here;
    /// ranges are checked by the core when a handle is built.
    pub(crate) fn protocol_config(&self) -> Result<ProtocolConfig, Failure> {
        let (n, lr) = (self.workers, self.learning_rate);
        let policy = self.policy()?;
        let stall = duration(self.stall_report_ns);
        let interrupt = if flag("run_to_completion", self.run_to_completion)? {
            Interrupt::RunToCompletion
        } else {
            Interrupt::Abort
        };
        Ok(match self.protocol {
            SYNCOPATE_PROTOCOL_BSP => {
                ProtocolConfig::Bsp(BspConfig { gradient_policy: policy, stall_report: stall, ..BspConfig::new(n, lr) })
            }
            SYNCOPATE_PROTOCOL_ASP => {
                ProtocolConfig::Asp(AspConfig { gradient_policy: policy, ..AspConfig::new(n, lr) })
            }
            SYNCOPATE_PROTOCOL_BACKUP => ProtocolConfig::Backup(BackupConfig {
                interrupt,
                gradient_policy: policy,
                stall_report: stall,
                ..BackupConfig::new(n, lr, self.backup_workers)
            }),
            SYNCOPATE_PROTOCOL_DBW => {
                let (initial, min, max) = (self.dbw_l_eta_initial, self.dbw_l_eta_min, self.dbw_l_eta_max);
                let l_eta = match self.dbw_l_eta_mode {
                    SYNCOPATE_L_ETA_FIXED => LEta::Fixed(initial),
                    SYNCOPATE_L_ETA_SECANT => LEta::Secant { initial, min, max },
                    SYNCOPATE_L_ETA_RAYLEIGH => LEta::Rayleigh { initial, min, max },
                    SYNCOPATE_L_ETA_SPLIT => LEta::Split { initial, min, max },
                    other => return Err(knob("dbw_l_eta_mode", u64::from(other))),
                };
                ProtocolConfig::Dbw(DbwConfig {
                    k_min: self.dbw_k_min,
                    window: self.dbw_window,
                    ema_beta: self.dbw_ema_beta,
                    warmup_iterations: self.dbw_warmup_iterations,
                    warmup_k: (self.dbw_warmup_k != 0).then_some(self.dbw_warmup_k),
                    l_eta,
                    interrupt,
                    gradient_policy: policy,
                    stall_report: stall,
                    ..DbwConfig::new(n, lr)
                })
            }
            SYNCOPATE_PROTOCOL_WBSP => {
                let (every, factor) = (self.wbsp_lr_every, self.wbsp_lr_factor);
                let lr_schedule = match self.wbsp_lr_schedule {
                    SYNCOPATE_LR_CONSTANT => LrSchedule::Constant,
                    SYNCOPATE_LR_BY_LOCAL_STEP => LrSchedule::ByLocalStep { every, factor },
                    SYNCOPATE_LR_BY_GLOBAL_ROUND => LrSchedule::ByGlobalRound { every, factor },
                    other => return Err(knob("wbsp_lr_schedule", u64::from(other))),
                };
                let per_step = flag("wbsp_scale_per_local_step", self.wbsp_scale_per_local_step)?;
                ProtocolConfig::Wbsp(WbspConfig {
                    overlap: flag("wbsp_overlap", self.wbsp_overlap)?,
                    delta_scaling: if per_step { DeltaScaling::PerLocalStep } else { DeltaScaling::PerDelta },
                    lr_schedule,
                    round_deadline: duration(self.wbsp_round_deadline_ns),
                    gradient_policy: policy,
                    ..WbspConfig::new(n, lr)
                })
            }
            SYNCOPATE_PROTOCOL_GROUPED => {
                let partition = match self.partition {
                    SYNCOPATE_PARTITION_CONTIGUOUS => Partition::Contiguous,
                    SYNCOPATE_PARTITION_ROUND_ROBIN => Partition::RoundRobin,
                    SYNCOPATE_PARTITION_EXPLICIT => Partition::Explicit(self.partition_table),
                    other => return Err(knob("partition", u64::from(other))),
                };
                let lr_scaling = match self.lr_scaling {
                    0 => LrScaling::None,
                    1 => LrScaling::Linear,
                    2 => LrScaling::Sqrt,
                    other => return Err(knob("lr_scaling", u64::from(other))),
                };
                ProtocolConfig::Grouped(GroupedConfig {
                    partition,
                    local_steps: self.local_steps,
                    lr_scaling,
                    gradient_policy: policy,
                    stall_report: stall,
                    ..GroupedConfig::new(n, lr, self.groups)
                })
            }
            SYNCOPATE_PROTOCOL_SSP => {
                let per_worker = flag("ssp_per_worker_step", self.ssp_per_worker_step)?;
                ProtocolConfig::Ssp(SspConfig {
                    step: if per_worker { SspStep::PerWorker } else { SspStep::Averaged },
                    gradient_policy: policy,
                    stall_report: stall,
                    ..SspConfig::new(n, lr, self.staleness)
                })
            }
            SYNCOPATE_PROTOCOL_BAP => {
                let timeout_from = match self.bap_timeout_from {
                    0 => TimeoutFrom::LaterOfBoth,
                    1 => TimeoutFrom::FirstGradient,
                    2 => TimeoutFrom::Publication,
                    other => return Err(knob("bap_timeout_from", u64::from(other))),
                };
                let below = flag("bap_bound_below", self.bap_bound_below)?;
                ProtocolConfig::Bap(BapConfig {
                    bound: if below { BapBound::Below } else { BapBound::AtMost },
                    iteration_timeout: duration(self.bap_iteration_timeout_ns),
                    timeout_from,
                    gradient_policy: policy,
                    stall_report: stall,
                    ..BapConfig::new(n, lr, self.staleness)
                })
            }
            other => return Err(knob("protocol", u64::from(other))),
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_kind_has_its_c_code_and_comes_back() {
        let stable = [
            (ProtocolKind::Bsp, 0, 0),
            (ProtocolKind::Asp, 1, 0),
            (ProtocolKind::Ssp, 6, 0),
            (ProtocolKind::Bap, 7, 0),
            (ProtocolKind::Backup, 2, 0),
            (ProtocolKind::Dbw, 3, 0),
            (ProtocolKind::Wbsp, 4, 0),
            (ProtocolKind::WbspOverlap, 4, 1),
            (ProtocolKind::Grouped, 5, 0),
        ];
        assert_eq!(stable.map(|(kind, _, _)| kind), ProtocolKind::ALL);
        for (kind, protocol, overlap) in stable {
            assert_eq!(protocol_code(kind), (protocol, overlap), "{kind}");
            let config = SyncopateConfig::for_kind(kind, 8, 0.5);
            assert_eq!(config.kind(), Some(kind));
            let defaults = SyncopateConfig::defaults(protocol, 8, 0.5).unwrap();
            assert_eq!(SyncopateConfig { wbsp_overlap: overlap, ..defaults }.kind(), Some(kind));
        }
        assert!(SyncopateConfig::defaults(8, 8, 0.5).is_err());
        assert!(
            SyncopateConfig { protocol: 8, ..SyncopateConfig::for_kind(ProtocolKind::Bsp, 8, 0.5) }.kind().is_none()
        );
    }
}
