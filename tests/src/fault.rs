//! Swarm fault simulation over the pure core: one [`AnyServer`] and `n` [`AnyWorker`]s on the
//! core's one test network (`syncopate::testkit::Cluster`): seeded, lossy, duplicating,
//! reordering, with worker crashes and restarts, one-way partitions and server restarts
//! from a checkpoint. A [`Checker`] verifies the
//! invariants after every event; then a quiet phase switches the faults off and requires
//! progress within a virtual-time budget.
//!
//! Gradients are small integers chosen by `(worker, version)` and the learning rate is a power
//! of two, so every float sum is exact and the final model can be compared bit for bit with a
//! reference rebuilt from the applied-update log.

use crate::ledger::{Loss, Tracker};
use crate::rng::Rng;
use core::fmt::Write as _;
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
use syncopate::testkit::{Cluster, CopyLoss, Entry, Job, NetConfig, NetCounts, ToServerOwned};
use syncopate::{
    AnyServer, AnyWorker, DropReason, Duration, Instant, ProtocolConfig, ProtocolKind, Recipient, Reject, Server,
    ServerEvent, Version, WorkerId, WorkerSetup,
};

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

pub use checker::Checker;
use checker::Ctx;

fn is_contribution(msg: &ToServerOwned) -> bool {
    matches!(msg, ToServerOwned::Grad { .. } | ToServerOwned::Delta { .. } | ToServerOwned::Clock { .. })
}

type Net = Cluster<AnyServer<f64, Vec<f64>>, AnyWorker<f64, Vec<f64>>>;

/// The simulation: the test network plus the [`Checker`] reading its log after every event.
pub struct Sim {
    spec: SimSpec,
    net: Net,
    checker: Checker,
    ctx: Ctx,
    /// The conservation ledger's network side, fed from the log (checked after every event).
    tracker: Tracker,
    counts: Counts,
    /// Log entries already checked.
    cursor: usize,
    last_progress: u64,
    /// Print every log entry (set by `SYNCOPATE_DEBUG` in the quiet phase).
    debug: bool,
}

/// The tick an instant falls in.
fn tick_of(t: Instant) -> u64 {
    t.saturating_duration_since(Instant::ZERO).as_nanos() / TICK_NANOS
}

impl Sim {
    /// A simulation ready to run.
    pub fn new(spec: SimSpec) -> Self {
        let initial: Vec<f64> = (0..DIM).map(|i| i as f64).collect();
        let scratch = vec![0.0; spec.protocol.server_scratch_len(DIM).max(1)];
        let server = AnyServer::new(&spec.protocol, initial.clone(), scratch).expect("valid test configuration");
        let n = spec.protocol.workers();
        let protocol = spec.protocol;
        let factory = Box::new(move |id: u32, epoch: u32| {
            let setup = WorkerSetup { id: WorkerId(id), epoch, rejoin_after: Some(ticks(150)) };
            let scratch = vec![0.0; protocol.worker_scratch_len(DIM).max(DIM)];
            AnyWorker::new(&protocol, setup, vec![0.0; DIM], scratch).expect("valid worker")
        });
        let config = NetConfig {
            latency: (ticks(1), ticks(5)),
            compute: (ticks(2), ticks(11)),
            straggle: (0.1, ticks(30), ticks(129)),
            spike: (ticks(20), ticks(299)),
            restart_after: (ticks(10), ticks(299)),
            partition_for: (ticks(20), ticks(419)),
            horizon: Instant::MAX,
            ..NetConfig::default()
        };
        let gradient = |job: &Job<'_>| test_gradient(job.worker as u32, job.version).to_vec();
        let mut net = Net::from_factory(server, n as usize, factory, spec.seed, config, gradient);
        net.faults = spec.faults;
        let mut sim = Self {
            net,
            checker: Checker::new(spec.protocol.name(), n, &initial),
            ctx: Ctx::of(&spec.protocol),
            tracker: Tracker::new(n),
            counts: Counts::default(),
            cursor: 0,
            last_progress: 0,
            debug: false,
            spec,
        };
        sim.check_log();
        sim
    }

    /// Feeds the checker what happened since the last call, then checks the server.
    fn check_log(&mut self) {
        let n = self.net.nodes.len();
        let now = tick_of(self.net.now);
        let mut buf = Vec::new();
        for e in self.net.log.get(self.cursor..).unwrap_or_default() {
            if self.debug {
                eprintln!("t={now} v={} {e:?}", self.net.server.version().0);
            }
            match e {
                Entry::Up { worker, epoch, msg } => {
                    self.tracker.worker_sent(*worker as u32, &msg.as_msg(&mut buf));
                    self.checker.sent(*worker as u32, *epoch, msg);
                }
                Entry::UpCopy { worker, epoch, msg } => {
                    self.tracker.copy_sent(*worker as u32, *epoch, &msg.as_msg(&mut buf));
                }
                Entry::UpLost { worker, epoch, msg, cause } => {
                    let cause = match cause {
                        CopyLoss::Dropped => Loss::Network,
                        CopyLoss::Partition => Loss::Partition,
                    };
                    self.tracker.copy_lost(*worker as u32, *epoch, &msg.as_msg(&mut buf), cause);
                }
                Entry::UpMissed { worker, epoch, msg } => {
                    self.tracker.copy_missed_server(*worker as u32, *epoch, &msg.as_msg(&mut buf));
                }
                Entry::ServerIn { worker, epoch, msg, result, .. } => {
                    self.tracker.copy_handled(*worker as u32, *epoch, &msg.as_msg(&mut buf), *result);
                    self.checker.handled(*worker as u32, *epoch, msg, *result);
                    if result.is_err() {
                        self.counts.rejected += 1;
                    }
                }
                Entry::Event(ev) => {
                    self.tracker.event(ev);
                    match ev {
                        ServerEvent::ModelUpdated { .. } => {
                            self.last_progress = now;
                            self.counts.updates += 1;
                        }
                        ServerEvent::Applied { .. } => self.counts.applied += 1,
                        ServerEvent::Dropped { .. } => self.counts.dropped += 1,
                        _ => {}
                    }
                    self.checker.event(ev, &self.ctx);
                }
                Entry::Sent { to: Recipient::Worker(w), .. } if w.index() >= n => {
                    self.checker.fail(format!("server sent to unknown {w}"));
                }
                Entry::Compute { worker, params, .. } => {
                    let finite = params.iter().all(|p| p.is_finite());
                    check!(self.checker, finite, format!("C7 worker {worker} asked to compute on a non-finite model"));
                }
                Entry::ServerRestarted => self.checker.restore(),
                _ => {}
            }
        }
        self.cursor = self.net.log.len();
        self.check_server();
    }

    /// Invariants checked after every event.
    fn check_server(&mut self) {
        let c = &mut self.checker;
        let server = &self.net.server;
        let version = server.version().0;
        let st = *server.stats();
        let finite = server.params().iter().all(|p| p.is_finite());
        check!(c, finite, "C7 server model is not finite".into());
        check!(c, version == c.version, format!("C3 server at version {version}, events say {}", c.version));
        check!(c, st.applied == c.applied_events, {
            format!("stats.applied {} but {} Applied events", st.applied, c.applied_events)
        });
        check!(c, st.dropped_total() == c.dropped_events, {
            format!("stats.dropped {} but {} Dropped events", st.dropped_total(), c.dropped_events)
        });
        check!(c, st.accepted == c.ok_contributions || self.ctx.grouped, {
            format!("stats.accepted {} but {} contributions were accepted by handle()", st.accepted, c.ok_contributions)
        });
        // Every accepted contribution has an outcome or waits in bounded state.
        let outstanding = c.ok_contributions.saturating_sub(c.applied_events + c.dropped_events);
        let cap = 4 * u64::from(self.spec.protocol.workers()) * 8;
        check!(c, c.applied_events + c.dropped_events <= c.ok_contributions.max(st.accepted) || self.ctx.grouped, {
            format!(
                "{} outcomes for {} accepted contributions",
                c.applied_events + c.dropped_events,
                c.ok_contributions
            )
        });
        check!(c, outstanding <= cap, format!("C4 {outstanding} accepted contributions without an outcome"));
        // Conservation: sent = applied + dropped + held + in flight + lost (with causes).
        let ledger = self.tracker.ledger(&st).and_then(|l| l.check());
        check!(c, ledger.is_ok(), ledger.err().unwrap_or_default());
        if c.pending.len() > 64 {
            let n = c.pending.len();
            c.fail(format!("C4 Applied events for {n} future versions"));
        }
        if self.ctx.exact && c.pending.is_empty() {
            let same = server.params().iter().zip(&c.reference).all(|(a, b)| a.to_bits() == b.to_bits());
            check!(c, same, {
                format!("C2 model {:?} differs from reference {:?} at version {version}", server.params(), c.reference)
            });
        }
        if let AnyServer::Ssp(s) = server {
            let clocks: Vec<u64> =
                (0..self.spec.protocol.workers()).filter_map(|w| s.worker_clock(WorkerId(w))).collect();
            if let (Some(lo), Some(hi)) = (clocks.iter().min(), clocks.iter().max()) {
                check!(c, lo <= hi, "clock order".into());
            }
        }
    }

    fn restart_server(&mut self) {
        let (params, version) = (self.checker.checkpoint.0.clone(), self.checker.checkpoint.1);
        let scratch = vec![0.0; self.spec.protocol.server_scratch_len(DIM).max(1)];
        let Ok(server) = AnyServer::resume(&self.spec.protocol, params, scratch, Version(version)) else {
            self.checker.fail("resume from checkpoint failed".into());
            return;
        };
        // The log is checked up to here: what the old server applied after the checkpoint
        // is rolled back, what it held and what is on its way to it are lost.
        self.tracker.server_restarted(self.net.server.stats(), version);
        // The cluster restarts with the server: workers rejoin with new epochs.
        self.net.restart_server(server);
    }

    fn step(&mut self) -> bool {
        let faults_on = self.net.faults != Faults::none();
        if !self.net.step() {
            return false;
        }
        self.check_log();
        if faults_on {
            if self.net.rng().next_f64() < 0.01 {
                // Take a checkpoint at a quiet moment (no half-built version).
                if self.checker.pending.is_empty() && self.net.server.params() == self.checker.reference.as_slice() {
                    self.checker.checkpoint();
                }
            }
            if self.net.take_restart_request() {
                self.restart_server();
                self.check_log();
            }
        }
        true
    }

    /// Runs the safety phase then the quiet (liveness) phase.
    pub fn run(mut self) -> RunResult {
        let mut hang = None;
        for _ in 0..self.spec.steps {
            if !self.step() {
                hang = Some("no events left in the safety phase (hang)".to_string());
                break;
            }
            if self.checker.violation.is_some() {
                break;
            }
        }
        if self.checker.violation.is_none() && hang.is_none() {
            // Quiet phase: faults stop; crashed workers come back; partitions heal.
            self.net.calm();
            self.check_log();
            let start = tick_of(self.net.now);
            self.debug = std::env::var_os("SYNCOPATE_DEBUG").is_some();
            let target = self.net.version().0 + self.spec.quiet_versions;
            while self.net.version().0 < target {
                if tick_of(self.net.now) > start + self.spec.quiet_budget {
                    let v = self.net.version().0;
                    if self.debug {
                        eprintln!("server {:?}", self.net.server);
                    }
                    hang = Some(format!(
                        "L1 no progress: version {v} < {target} after {} quiet ticks (last progress at {})",
                        self.spec.quiet_budget, self.last_progress
                    ));
                    break;
                }
                if !self.step() {
                    hang = Some(format!("L1 deadlock: nothing in flight at version {}", self.net.version().0));
                    break;
                }
                if self.checker.violation.is_some() {
                    break;
                }
            }
            self.counts.quiet_ticks = tick_of(self.net.now) - start;
        }
        self.counts.net = self.net.counts;
        self.counts.checks = self.checker.checks;
        self.counts.rejected = self.checker.rejected.max(self.counts.rejected);
        let mut violation = self.checker.violation.take().or(hang);
        if let Some(v) = violation.as_mut() {
            let _ =
                write!(v, " (seed {}, faults {:?}, tick {})", self.spec.seed, self.spec.faults, tick_of(self.net.now));
        }
        RunResult { counts: self.counts, violation, trace_hash: self.checker.trace }
    }
}

/// Drop reasons are part of the trace; kept referenced for documentation.
pub const DROP_REASONS: [DropReason; 5] = DropReason::ALL;

#[cfg(test)]
mod tests;
