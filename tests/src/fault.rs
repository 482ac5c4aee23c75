//! Swarm fault simulation over the pure core: one [`AnyServer`](syncopate::AnyServer) and
//! `n` [`AnyWorker`](syncopate::AnyWorker)s on the core's one test network
//! (`syncopate::testkit::Cluster`): seeded, lossy, duplicating,
//! reordering, with worker crashes and restarts, one-way partitions and server restarts
//! from a checkpoint. A [`Checker`] verifies the
//! invariants after every event; then a quiet phase switches the faults off and requires
//! progress within a virtual-time budget.
//!
//! Gradients are small integers chosen by `(worker, version)` and the learning rate is a power
//! of two, so every float sum is exact and the final model can be compared bit for bit with a
//! reference rebuilt from the applied-update log.

use crate::rng::Rng;

use std::collections::{BTreeMap, HashMap};
use std::string::String;
use std::vec::Vec;
use syncopate::proto::asp::AspConfig;
use syncopate::proto::backup::BackupConfig;
use syncopate::proto::bap::BapConfig;
use syncopate::proto::bsp::BspConfig;
use syncopate::proto::dbw::DbwConfig;
use syncopate::proto::grouped::GroupedConfig;
use syncopate::proto::ssp::SspConfig;
use syncopate::proto::wbsp::WbspConfig;
use syncopate::testkit::{NetCounts, ToServerOwned};
use syncopate::{DropReason, Duration, ProtocolConfig, ProtocolKind, Reject, ServerEvent};

/// Which faults a seed enables and how strongly (swarm testing: [`Faults::swarm`] turns each
/// kind on or off per seed, then draws its rate): the test kit's fault model.
pub use syncopate::testkit::Faults;

/// Model dimension used by the fault suite.
pub const DIM: usize = 4;
/// Learning rate: a power of two so that scaling is exact.
pub const LR: f64 = 0.25;
/// One virtual tick in core time.
pub const TICK_NANOS: u64 = 1_000_000;

/// The protocols the suite covers (every one of [`ProtocolKind::ALL`]), each in a small
/// configuration, with its name.
pub fn protocols() -> Vec<(&'static str, ProtocolConfig)> {
    ProtocolKind::ALL.into_iter().map(|kind| (kind.as_str(), small_config(kind))).collect()
}

/// `kind` in the suite's small configuration.
pub fn small_config(kind: ProtocolKind) -> ProtocolConfig {
    match kind {
        ProtocolKind::Bsp => ProtocolConfig::Bsp(BspConfig::new(4, LR)),
        ProtocolKind::Asp => ProtocolConfig::Asp(AspConfig::new(4, LR)),
        ProtocolKind::Ssp => ProtocolConfig::Ssp(SspConfig::new(4, LR, 2)),
        ProtocolKind::Bap => {
            let mut bap = BapConfig::new(4, LR, 2);
            bap.iteration_timeout = Some(ticks(400));
            ProtocolConfig::Bap(bap)
        }
        ProtocolKind::Backup => ProtocolConfig::Backup(BackupConfig::new(5, LR, 1)),
        ProtocolKind::Dbw => ProtocolConfig::Dbw(DbwConfig::new(5, LR)),
        ProtocolKind::Wbsp | ProtocolKind::WbspOverlap => {
            let mut wbsp = WbspConfig::new(4, LR);
            wbsp.overlap = kind == ProtocolKind::WbspOverlap;
            wbsp.round_deadline = Some(ticks(400));
            ProtocolConfig::Wbsp(wbsp)
        }
        ProtocolKind::Grouped => {
            let mut grouped = GroupedConfig::new(6, LR, 2);
            grouped.stall_report = None;
            ProtocolConfig::Grouped(grouped)
        }
    }
}

/// `n` ticks as a core duration.
pub fn ticks(n: u64) -> Duration {
    Duration::from_nanos(n * TICK_NANOS)
}

/// The integer test gradient of `worker` at `version`: values in `-4..=4`.
pub fn test_gradient(worker: u32, version: u64) -> [f64; DIM] {
    let mut g = [0.0; DIM];
    let mut h =
        (u64::from(worker) + 1).wrapping_mul(0x9E37_79B9_7F4A_7C15) ^ version.wrapping_mul(0xBF58_476D_1CE4_E5B9);
    for v in &mut g {
        h ^= h >> 29;
        h = h.wrapping_mul(0x94D0_49BB_1331_11EB);
        *v = (h >> 60) as f64 % 9.0 - 4.0;
    }
    g
}

/// One simulation's settings.
#[derive(Clone, Copy, Debug)]
pub struct SimSpec {
    /// The protocol.
    pub protocol: ProtocolConfig,
    /// The seed.
    pub seed: u64,
    /// Events processed in the faulty (safety) phase.
    pub steps: u64,
    /// The faults.
    pub faults: Faults,
    /// Versions the quiet phase must add.
    pub quiet_versions: u64,
    /// Virtual-time budget of the quiet phase, ticks.
    pub quiet_budget: u64,
}

impl SimSpec {
    /// A spec with swarm faults drawn from `seed`.
    pub fn swarm(protocol: ProtocolConfig, seed: u64, steps: u64) -> Self {
        let mut rng = Rng::new(seed ^ 0x5A5A_5A5A);
        Self { protocol, seed, steps, faults: Faults::swarm(&mut rng), quiet_versions: 3, quiet_budget: 20_000 }
    }
}

/// What a run injected (the test network's [`NetCounts`], read through `Deref` as before:
/// `counts.steps`, `counts.crashes`, …) and observed.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Counts {
    /// What the network injected.
    pub net: NetCounts,
    /// Contributions applied.
    pub applied: u64,
    /// Contributions dropped with a reason.
    pub dropped: u64,
    /// Inputs rejected.
    pub rejected: u64,
    /// Model updates.
    pub updates: u64,
    /// Invariant checks executed.
    pub checks: u64,
    /// Virtual ticks the quiet phase needed.
    pub quiet_ticks: u64,
}

impl core::ops::Deref for Counts {
    type Target = NetCounts;
    fn deref(&self) -> &NetCounts {
        &self.net
    }
}

impl core::ops::DerefMut for Counts {
    fn deref_mut(&mut self) -> &mut NetCounts {
        &mut self.net
    }
}

impl Counts {
    /// Adds `o` into `self`.
    pub fn add(&mut self, o: &Self) {
        self.net.add(&o.net);
        self.applied += o.applied;
        self.dropped += o.dropped;
        self.rejected += o.rejected;
        self.updates += o.updates;
        self.checks += o.checks;
        self.quiet_ticks = self.quiet_ticks.max(o.quiet_ticks);
    }
}

/// The outcome of one run.
#[derive(Clone, Debug)]
pub struct RunResult {
    /// What happened.
    pub counts: Counts,
    /// The first invariant violation, if any.
    pub violation: Option<String>,
    /// A hash of the event trace (determinism).
    pub trace_hash: u64,
}

/// Counts a check on a [`Checker`] and records a violation when `cond` is false.
macro_rules! check {
    ($c:expr, $cond:expr, $what:expr) => {{
        $c.checks += 1;
        if !$cond {
            let what: String = $what;
            $c.fail(what);
        }
    }};
}

/// Every distinct `(epoch, seq)` contribution sent for one `(worker, base)`, in sending order,
/// with its values.
mod checker;

mod sim;

pub use checker::Checker;
pub use sim::Sim;

fn is_contribution(msg: &ToServerOwned) -> bool {
    matches!(msg, ToServerOwned::Grad { .. } | ToServerOwned::Delta { .. } | ToServerOwned::Clock { .. })
}

/// Drop reasons are part of the trace; kept referenced for documentation.
pub const DROP_REASONS: [DropReason; 5] = DropReason::ALL;

#[cfg(test)]
mod tests;
