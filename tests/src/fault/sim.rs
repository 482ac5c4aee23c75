//! The simulation: the test network, its faults and the quiet phase, with the [`Checker`]
//! reading its log after every event.

use super::checker::{Checker, Ctx};
use super::{Counts, DIM, Faults, RunResult, SimSpec, TICK_NANOS, test_gradient, ticks};
use crate::ledger::{Loss, Tracker};
use core::fmt::Write as _;
use std::string::String;
use std::vec::Vec;
use syncopate::testkit::{Cluster, CopyLoss, Entry, Job, NetConfig};
use syncopate::{AnyServer, AnyWorker, Instant, Recipient, Server, ServerEvent, Version, WorkerId, WorkerSetup};

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
