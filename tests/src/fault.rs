//! Swarm fault simulation over the pure core: one [`AnyServer`] and `n` [`AnyWorker`]s joined
//! by a seeded, lossy, duplicating, reordering network, with worker crashes and restarts,
//! one-way partitions and server restarts from a checkpoint. A [`Checker`] verifies the
//! invariants after every event; then a quiet phase switches the faults off and requires
//! progress within a virtual-time budget.
//!
//! Gradients are small integers chosen by `(worker, version)` and the learning rate is a power
//! of two, so every float sum is exact and the final model can be compared bit for bit with a
//! reference rebuilt from the applied-update log.

use crate::ledger::{Loss, Tracker};
use crate::rng::Rng;
use core::fmt::Write as _;
use std::collections::{BTreeMap, BinaryHeap, HashMap};
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
use syncopate::{
    AnyServer, AnyWorker, ComputeId, DropReason, Duration, Instant, ProtocolConfig, Recipient, Reject, Server,
    ServerEvent, ServerOutput, ToServer, ToWorker, Values, Version, Worker, WorkerId, WorkerOutput, WorkerSetup,
};

/// Model dimension used by the fault suite.
pub const DIM: usize = 4;
/// Learning rate: a power of two so that scaling is exact.
pub const LR: f64 = 0.25;
/// One virtual tick in core time.
pub const TICK_NANOS: u64 = 1_000_000;

/// The protocols the suite covers, each in a small configuration.
pub fn protocols() -> Vec<(&'static str, ProtocolConfig)> {
    let mut grouped = GroupedConfig::new(6, LR, 2);
    grouped.stall_report = None;
    let mut bap = BapConfig::new(4, LR, 2);
    bap.iteration_timeout = Some(ticks(400));
    let mut wbsp = WbspConfig::new(4, LR);
    wbsp.round_deadline = Some(ticks(400));
    let mut wbsp_o = WbspConfig::new(4, LR).with_overlap();
    wbsp_o.round_deadline = Some(ticks(400));
    vec![
        ("bsp", ProtocolConfig::Bsp(BspConfig::new(4, LR))),
        ("asp", ProtocolConfig::Asp(AspConfig::new(4, LR))),
        ("backup", ProtocolConfig::Backup(BackupConfig::new(5, LR, 1))),
        ("dbw", ProtocolConfig::Dbw(DbwConfig::new(5, LR))),
        ("wbsp", ProtocolConfig::Wbsp(wbsp)),
        ("wbsp-overlap", ProtocolConfig::Wbsp(wbsp_o)),
        ("grouped", ProtocolConfig::Grouped(grouped)),
        ("ssp", ProtocolConfig::Ssp(SspConfig::new(4, LR, 2))),
        ("bap", ProtocolConfig::Bap(bap)),
    ]
}

/// `n` ticks as a core duration.
pub fn ticks(n: u64) -> Duration {
    Duration::from_nanos(n * TICK_NANOS)
}

fn instant(t: u64) -> Instant {
    Instant::ZERO.checked_add(ticks(t)).unwrap_or(Instant::ZERO)
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

/// Which faults a seed enables and how strongly (swarm testing: each kind is on or off per
/// seed, then its rate is drawn).
#[derive(Clone, Copy, Debug, Default, PartialEq)]
pub struct Faults {
    /// Probability a message is lost (0–0.3).
    pub loss: f64,
    /// Probability a message is delivered twice (0–0.5).
    pub duplicate: f64,
    /// Probability a message takes a delay spike of 20–300 ticks (reordering).
    pub spike: f64,
    /// Per-event probability of starting a one-way partition of one worker.
    pub partition: f64,
    /// Per-event probability of crashing a worker (restarts after 10–300 ticks).
    pub crash: f64,
    /// Per-event probability of restarting the server from its last checkpoint.
    pub server_restart: f64,
}

impl Faults {
    /// Draws a random subset of fault kinds and their rates.
    pub fn swarm(rng: &mut Rng) -> Self {
        let mut f = Self::default();
        if rng.chance(0.6) {
            f.loss = rng.unit() * 0.3;
        }
        if rng.chance(0.6) {
            f.duplicate = rng.unit() * 0.5;
        }
        if rng.chance(0.6) {
            f.spike = rng.unit() * 0.3;
        }
        if rng.chance(0.4) {
            f.partition = rng.unit() * 0.01;
        }
        if rng.chance(0.5) {
            f.crash = rng.unit() * 0.01;
        }
        if rng.chance(0.3) {
            f.server_restart = rng.unit() * 0.002;
        }
        f
    }

    /// Every fault kind off.
    pub fn none() -> Self {
        Self::default()
    }
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

/// What a run injected and observed.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Counts {
    /// Events processed.
    pub steps: u64,
    /// Messages sent.
    pub sent: u64,
    /// Messages lost.
    pub lost: u64,
    /// Extra copies delivered.
    pub duplicated: u64,
    /// Messages given a delay spike.
    pub delayed: u64,
    /// One-way partitions started.
    pub partitions: u64,
    /// Worker crashes.
    pub crashes: u64,
    /// Server restarts from a checkpoint.
    pub server_restarts: u64,
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

impl Counts {
    /// Adds `o` into `self`.
    pub fn add(&mut self, o: &Self) {
        self.steps += o.steps;
        self.sent += o.sent;
        self.lost += o.lost;
        self.duplicated += o.duplicated;
        self.delayed += o.delayed;
        self.partitions += o.partitions;
        self.crashes += o.crashes;
        self.server_restarts += o.server_restarts;
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

#[derive(Clone, Debug)]
enum UpMsg {
    Join { epoch: u32 },
    Grad { base: u64, iteration: u64, seq: u64, values: Vec<f64> },
    Delta { round: u64, local_steps: u32, seq: u64, values: Vec<f64> },
    Pull { have: u64, min_clock: u64 },
    Clock { clock: u64, seq: u64, values: Vec<f64> },
    Leave,
}

impl UpMsg {
    fn own(m: &ToServer<'_, f64>) -> Self {
        fn v(values: &Values<'_, f64>) -> Vec<f64> {
            let mut out = vec![0.0; values.len()];
            let _ = values.copy_into(&mut out);
            out
        }
        match m {
            ToServer::Join { epoch } => Self::Join { epoch: *epoch },
            ToServer::Grad { base, iteration, seq, values } => {
                Self::Grad { base: base.0, iteration: *iteration, seq: *seq, values: v(values) }
            }
            ToServer::Delta { round, local_steps, seq, values } => {
                Self::Delta { round: round.0, local_steps: *local_steps, seq: *seq, values: v(values) }
            }
            ToServer::Pull { have, min_clock } => Self::Pull { have: have.0, min_clock: *min_clock },
            ToServer::Clock { clock, seq, values } => Self::Clock { clock: *clock, seq: *seq, values: v(values) },
            ToServer::Leave => Self::Leave,
        }
    }

    fn msg(&self) -> ToServer<'_, f64> {
        match self {
            Self::Join { epoch } => ToServer::Join { epoch: *epoch },
            Self::Grad { base, iteration, seq, values } => {
                ToServer::Grad { base: Version(*base), iteration: *iteration, seq: *seq, values: Values::Slice(values) }
            }
            Self::Delta { round, local_steps, seq, values } => ToServer::Delta {
                round: Version(*round),
                local_steps: *local_steps,
                seq: *seq,
                values: Values::Slice(values),
            },
            Self::Pull { have, min_clock } => ToServer::Pull { have: Version(*have), min_clock: *min_clock },
            Self::Clock { clock, seq, values } => {
                ToServer::Clock { clock: *clock, seq: *seq, values: Values::Slice(values) }
            }
            Self::Leave => ToServer::Leave,
        }
    }

    fn is_contribution(&self) -> bool {
        matches!(self, Self::Grad { .. } | Self::Delta { .. } | Self::Clock { .. })
    }
}

#[derive(Clone, Debug)]
enum DownMsg {
    Model { version: u64, clock: u64, values: Vec<f64> },
    NotNewer { version: u64 },
    PushAck { round: u64, pull_now: bool },
    Abort { iteration: u64 },
    Stop,
}

impl DownMsg {
    fn own(m: &ToWorker<'_, f64>) -> Self {
        match m {
            ToWorker::Model { version, clock, values } => {
                let mut out = vec![0.0; values.len()];
                let _ = values.copy_into(&mut out);
                Self::Model { version: version.0, clock: *clock, values: out }
            }
            ToWorker::NotNewer { version } => Self::NotNewer { version: version.0 },
            ToWorker::PushAck { round, pull_now } => Self::PushAck { round: round.0, pull_now: *pull_now },
            ToWorker::Abort { iteration } => Self::Abort { iteration: *iteration },
            ToWorker::Stop => Self::Stop,
        }
    }

    fn msg(&self) -> ToWorker<'_, f64> {
        match self {
            Self::Model { version, clock, values } => {
                ToWorker::Model { version: Version(*version), clock: *clock, values: Values::Slice(values) }
            }
            Self::NotNewer { version } => ToWorker::NotNewer { version: Version(*version) },
            Self::PushAck { round, pull_now } => ToWorker::PushAck { round: Version(*round), pull_now: *pull_now },
            Self::Abort { iteration } => ToWorker::Abort { iteration: *iteration },
            Self::Stop => ToWorker::Stop,
        }
    }
}

#[derive(Clone, Debug)]
enum Ev {
    /// A message from worker `from` (incarnation `inc`) reaches the server incarnation `server_inc`.
    Up { from: u32, epoch: u32, server_inc: u32, msg: UpMsg },
    /// A message reaches worker `to` if it is still incarnation `inc`.
    Down { to: u32, inc: u32, msg: DownMsg },
    /// Worker `w` (incarnation `inc`) finished computation `id`.
    Computed { w: u32, inc: u32, id: u64, version: u64 },
    /// A worker deadline.
    WorkerTimer { w: u32, inc: u32 },
    /// A server deadline.
    ServerTimer { server_inc: u32 },
    /// Restart a crashed worker.
    Restart { w: u32 },
}

struct Slot {
    worker: Option<AnyWorker<f64, Vec<f64>>>,
    inc: u32,
    epoch: u32,
    timer: Option<u64>,
    /// One-way partitions: messages up (to the server) or down are lost until the tick.
    cut_up_until: u64,
    cut_down_until: u64,
}

/// Distinct `(epoch, seq)` sent for one `(worker, base)`, and the values.
type LedgerEntry = (Vec<(u32, u64)>, Vec<f64>);

/// Reference model, version and applied counts saved with a server checkpoint.
type Checkpoint = (Vec<f64>, u64, HashMap<(u32, u64), u32>);

/// The invariant checker: consumes server events and rejects, keeps the ledger of every
/// contribution sent and the reference model rebuilt from the applied-update log.
pub struct Checker {
    name: &'static str,
    workers: u32,
    /// `(worker, base)` → distinct `(epoch, seq)` contributions sent, and their values.
    ledger: HashMap<(u32, u64), LedgerEntry>,
    /// `(worker, base)` → times applied (in the current server incarnation lineage).
    applied: HashMap<(u32, u64), u32>,
    /// Applied events of the version being built: `(worker, base, weight)`.
    pending: BTreeMap<u64, Vec<(u32, u64, f64)>>,
    /// Reference model and version.
    reference: Vec<f64>,
    version: u64,
    /// Events seen in this server incarnation.
    applied_events: u64,
    dropped_events: u64,
    rejected: u64,
    ok_contributions: u64,
    /// Checkpoint: reference model, version and the applied counts at that point.
    checkpoint: Checkpoint,
    /// The first violation.
    pub violation: Option<String>,
    /// Checks executed.
    pub checks: u64,
    trace: u64,
    /// The SSP `Clock` just accepted: SSP reports its own version as `base`, so its `Applied`
    /// event is matched to the message it answers.
    last_ok: Option<(u32, u64)>,
    /// Every `(worker, epoch, seq)` contribution the server accepted.
    accepted: std::collections::HashSet<(u32, u32, u64)>,
}

impl Checker {
    fn new(name: &'static str, workers: u32, initial: &[f64]) -> Self {
        Self {
            name,
            workers,
            ledger: HashMap::new(),
            applied: HashMap::new(),
            pending: BTreeMap::new(),
            reference: initial.to_vec(),
            version: 0,
            applied_events: 0,
            dropped_events: 0,
            rejected: 0,
            ok_contributions: 0,
            checkpoint: (initial.to_vec(), 0, HashMap::new()),
            violation: None,
            checks: 0,
            trace: 0xcbf2_9ce4_8422_2325,
            last_ok: None,
            accepted: std::collections::HashSet::new(),
        }
    }

    fn fail(&mut self, what: String) {
        if self.violation.is_none() {
            self.violation = Some(format!("[{}] {what}", self.name));
        }
    }

    fn mix(&mut self, x: u64) {
        self.trace = (self.trace ^ x).wrapping_mul(0x100_0000_01b3);
    }

    fn sent(&mut self, w: u32, epoch: u32, msg: &UpMsg) {
        let (base, seq, values) = match msg {
            UpMsg::Grad { base, seq, values, .. } => (*base, *seq, values),
            UpMsg::Delta { round, seq, values, .. } => (*round, *seq, values),
            UpMsg::Clock { clock, seq, values } => (*clock, *seq, values),
            _ => return,
        };
        let e = self.ledger.entry((w, base)).or_insert_with(|| (Vec::new(), values.clone()));
        if !e.0.contains(&(epoch, seq)) {
            e.0.push((epoch, seq));
        }
        if e.1 != *values {
            // Two different contributions for the same (worker, base): keep the last values;
            // exact conservation is then checked only where it is unambiguous.
            e.1.clone_from(values);
        }
    }

    fn handled(&mut self, from: u32, epoch: u32, msg: &UpMsg, result: Result<(), Reject>) {
        self.mix(u64::from(result.is_ok()));
        let seq = match msg {
            UpMsg::Grad { seq, .. } | UpMsg::Delta { seq, .. } | UpMsg::Clock { seq, .. } => Some(*seq),
            _ => None,
        };
        if let (Some(seq), Ok(())) = (seq, result) {
            let fresh = self.accepted.insert((from, epoch, seq));
            check!(self, fresh, format!("C1 worker {from} epoch {epoch} seq {seq} accepted twice (duplicate counted)"));
        }
        self.last_ok = match (msg, result) {
            (UpMsg::Clock { clock, .. }, Ok(())) => Some((from, *clock)),
            _ => None,
        };
        match result {
            Ok(()) if msg.is_contribution() => self.ok_contributions += 1,
            Ok(()) => {}
            Err(_) => self.rejected += 1,
        }
    }

    fn event(&mut self, ev: &ServerEvent, ctx: &Ctx) {
        match *ev {
            ServerEvent::Applied { worker, base, version, staleness, weight } => {
                self.mix(u64::from(worker.0) << 32 ^ version.0);
                self.applied_events += 1;
                let key = match (ctx.by_message, self.last_ok) {
                    (true, Some((w, clock))) if w == worker.0 => (w, clock),
                    _ => (worker.0, base.0),
                };
                *self.applied.entry(key).or_insert(0) += 1;
                check!(self, weight.is_finite() && weight > 0.0, format!("weight {weight} not positive"));
                check!(self, worker.0 < self.workers, format!("applied from unknown {worker}"));
                if ctx.staleness_bound != u64::MAX {
                    let b = ctx.staleness_bound;
                    check!(self, staleness <= b, {
                        format!(
                            "staleness {staleness} of {worker} above bound {b} (base {}, version {})",
                            base.0, version.0
                        )
                    });
                }
                if ctx.synchronous {
                    check!(self, staleness == 0 && version.0 == base.0 + 1, {
                        format!(
                            "synchronous round applied {worker}'s gradient of base {} into version {}",
                            base.0, version.0
                        )
                    });
                }
                self.pending.entry(version.0).or_default().push((key.0, key.1, weight));
            }
            ServerEvent::Dropped { worker, base, reason } => {
                self.mix(0xD ^ u64::from(worker.0) << 8 ^ base.0);
                self.dropped_events += 1;
                let _ = reason;
            }
            ServerEvent::ModelUpdated { version, contributions } => {
                self.mix(0xAB ^ version.0 << 8);
                let expected = self.version + 1;
                check!(self, version.0 == expected, format!("C3 version {} after {}", version.0, self.version));
                self.version = version.0;
                let list = self.pending.remove(&version.0).unwrap_or_default();
                if !ctx.grouped {
                    check!(self, list.len() as u32 == contributions, {
                        format!(
                            "version {} claims {contributions} contributions, {} Applied events",
                            version.0,
                            list.len()
                        )
                    });
                }
                if ctx.distinct_per_version {
                    let mut ws: Vec<u32> = list.iter().map(|a| a.0).collect();
                    ws.sort_unstable();
                    ws.dedup();
                    check!(self, ws.len() == list.len(), {
                        format!(
                            "version {} combines {} gradients from only {} distinct workers",
                            version.0,
                            list.len(),
                            ws.len()
                        )
                    });
                }
                if let Some(k) = ctx.max_per_version {
                    check!(
                        self,
                        list.len() as u32 <= k,
                        format!("version {} combines {} > k = {k}", version.0, list.len())
                    );
                }
                self.apply_reference(&list, ctx.lr);
            }
            _ => {}
        }
    }

    /// `θ += fl(−η·w) · Σ g` over the version's contributions with the same weight (sums of
    /// small integers are exact, so the order does not matter).
    fn apply_reference(&mut self, list: &[(u32, u64, f64)], lr: f64) {
        let mut by_weight: Vec<(f64, Vec<f64>)> = Vec::new();
        for &(w, base, weight) in list {
            let Some(values) = self.ledger.get(&(w, base)).map(|e| e.1.clone()) else {
                self.fail(format!("applied a contribution of worker {w} base {base} that was never sent"));
                return;
            };
            match by_weight.iter_mut().find(|(x, _)| *x == weight) {
                Some((_, sum)) => sum.iter_mut().zip(&values).for_each(|(s, v)| *s += v),
                None => by_weight.push((weight, values)),
            }
        }
        for (weight, sum) in by_weight {
            let a = -lr * weight;
            for (p, s) in self.reference.iter_mut().zip(&sum) {
                *p += a * s;
            }
        }
    }

    fn checkpoint(&mut self) {
        self.checkpoint = (self.reference.clone(), self.version, self.applied.clone());
    }

    fn restore(&mut self) {
        let (r, v, a) = self.checkpoint.clone();
        self.reference = r;
        self.version = v;
        self.applied = a;
        self.pending.clear();
        self.applied_events = 0;
        self.dropped_events = 0;
        self.ok_contributions = 0;
    }
}

/// Per-protocol bounds the checker enforces.
struct Ctx {
    synchronous: bool,
    distinct_per_version: bool,
    max_per_version: Option<u32>,
    staleness_bound: u64,
    grouped: bool,
    exact: bool,
    /// The step the server multiplies `weight` by (SSP's averaged step is `η/n`).
    lr: f64,
    /// Applied events are matched to the message just handled (SSP).
    by_message: bool,
}

impl Ctx {
    fn of(p: &ProtocolConfig) -> Self {
        let mut c = Self {
            synchronous: false,
            distinct_per_version: false,
            max_per_version: None,
            staleness_bound: u64::MAX,
            grouped: false,
            exact: true,
            lr: LR,
            by_message: false,
        };
        match p {
            ProtocolConfig::Bsp(b) => {
                c.synchronous = true;
                c.distinct_per_version = true;
                c.max_per_version = Some(b.workers);
            }
            ProtocolConfig::Backup(b) => {
                c.synchronous = true;
                c.distinct_per_version = true;
                c.max_per_version = Some(b.workers - b.backup_workers);
            }
            ProtocolConfig::Dbw(d) => {
                c.synchronous = true;
                c.distinct_per_version = true;
                c.max_per_version = Some(d.workers);
            }
            ProtocolConfig::Bap(b) => {
                c.distinct_per_version = true;
                c.staleness_bound = b.staleness;
            }
            ProtocolConfig::Wbsp(_) => {
                c.exact = false;
            }
            ProtocolConfig::Grouped(_) => {
                c.grouped = true;
                c.exact = false;
            }
            ProtocolConfig::Ssp(s) => {
                // SSP workers send the step itself (`−η/n · g`, already scaled); the server
                // adds it times the clipping factor it reports as `weight`.
                let _ = s;
                c.lr = -1.0;
                c.by_message = true;
            }
            _ => {}
        }
        c
    }
}

#[derive(PartialEq, Eq, PartialOrd, Ord)]
struct Key(core::cmp::Reverse<(u64, u64)>);

/// The simulation.
pub struct Sim {
    spec: SimSpec,
    rng: Rng,
    now: u64,
    seq: u64,
    queue: BinaryHeap<(Key, u64)>,
    events: HashMap<u64, Ev>,
    server: AnyServer<f64, Vec<f64>>,
    server_inc: u32,
    server_timer: Option<u64>,
    slots: Vec<Slot>,
    checker: Checker,
    ctx: Ctx,
    /// The conservation ledger's network side (checked after every event).
    tracker: Tracker,
    counts: Counts,
    faults_on: bool,
    last_progress: u64,
    initial: Vec<f64>,
    /// Print every event (set by `SYNCOPATE_DEBUG` in the quiet phase).
    debug: bool,
}

impl Sim {
    /// A simulation ready to run.
    pub fn new(spec: SimSpec) -> Self {
        let initial: Vec<f64> = (0..DIM).map(|i| i as f64).collect();
        let scratch = vec![0.0; spec.protocol.server_scratch_len(DIM).max(1)];
        let server = AnyServer::new(&spec.protocol, initial.clone(), scratch).expect("valid test configuration");
        let n = spec.protocol.workers();
        let mut sim = Self {
            rng: Rng::new(spec.seed),
            now: 0,
            seq: 0,
            queue: BinaryHeap::new(),
            events: HashMap::new(),
            server,
            server_inc: 0,
            server_timer: None,
            slots: Vec::new(),
            checker: Checker::new(spec.protocol.name(), n, &initial),
            ctx: Ctx::of(&spec.protocol),
            tracker: Tracker::new(n),
            counts: Counts::default(),
            faults_on: true,
            last_progress: 0,
            initial,
            debug: false,
            spec,
        };
        for w in 0..n {
            sim.slots.push(Slot { worker: None, inc: 0, epoch: 0, timer: None, cut_up_until: 0, cut_down_until: 0 });
            sim.start_worker(w);
        }
        sim.drain_server();
        sim
    }

    fn schedule(&mut self, at: u64, ev: Ev) {
        self.seq += 1;
        self.events.insert(self.seq, ev);
        self.queue.push((Key(core::cmp::Reverse((at, self.seq))), self.seq));
    }

    fn start_worker(&mut self, w: u32) {
        let slot = &mut self.slots[w as usize];
        slot.inc += 1;
        slot.epoch += 1;
        let setup = WorkerSetup { id: WorkerId(w), epoch: slot.epoch, rejoin_after: Some(ticks(150)) };
        let scratch = vec![0.0; self.spec.protocol.worker_scratch_len(DIM).max(DIM)];
        let worker = AnyWorker::new(&self.spec.protocol, setup, vec![0.0; DIM], scratch).expect("valid worker");
        slot.worker = Some(worker);
        slot.timer = None;
        self.drain_worker(w);
    }

    fn latency(&mut self) -> u64 {
        let mut d = 1 + self.rng.below(5);
        if self.faults_on && self.rng.chance(self.spec.faults.spike) {
            d += 20 + self.rng.below(280);
            self.counts.delayed += 1;
        }
        d
    }

    /// Sends a message through the faulty network.
    fn send_up(&mut self, from: u32, msg: UpMsg) {
        self.counts.sent += 1;
        let epoch = self.slots[from as usize].epoch;
        self.checker.sent(from, epoch, &msg);
        let f = self.spec.faults;
        if self.faults_on {
            let by_loss = self.rng.chance(f.loss);
            if by_loss || self.slots[from as usize].cut_up_until > self.now {
                self.counts.lost += 1;
                let cause = if by_loss { Loss::Network } else { Loss::Partition };
                self.tracker.copy_lost(from, epoch, &msg.msg(), cause);
                return;
            }
        }
        let copies = if self.faults_on && self.rng.chance(f.duplicate) { 2 } else { 1 };
        self.counts.duplicated += copies - 1;
        for _ in 0..copies {
            self.tracker.copy_sent(from, epoch, &msg.msg());
            let at = self.now + self.latency();
            self.schedule(at, Ev::Up { from, epoch, server_inc: self.server_inc, msg: msg.clone() });
        }
    }

    fn send_down(&mut self, to: u32, msg: DownMsg) {
        self.counts.sent += 1;
        let f = self.spec.faults;
        if self.faults_on && (self.rng.chance(f.loss) || self.slots[to as usize].cut_down_until > self.now) {
            self.counts.lost += 1;
            return;
        }
        let copies = if self.faults_on && self.rng.chance(f.duplicate) { 2 } else { 1 };
        self.counts.duplicated += copies - 1;
        let inc = self.slots[to as usize].inc;
        for _ in 0..copies {
            let at = self.now + self.latency();
            self.schedule(at, Ev::Down { to, inc, msg: msg.clone() });
        }
    }

    fn drain_worker(&mut self, w: u32) {
        let mut sends = Vec::new();
        let mut computes = Vec::new();
        let inc = self.slots[w as usize].inc;
        let Some(worker) = self.slots[w as usize].worker.as_mut() else { return };
        while let Some(out) = worker.poll_output() {
            match out {
                WorkerOutput::Send(m) => {
                    self.tracker.worker_sent(w, &m);
                    sends.push(UpMsg::own(&m));
                }
                WorkerOutput::Compute { id, version, params } => {
                    let finite = params.iter().all(|p| p.is_finite());
                    computes.push((id.0, version.0, finite));
                }
                WorkerOutput::Event(_) => {}
            }
        }
        let timeout = worker.poll_timeout();
        for m in sends {
            self.send_up(w, m);
        }
        for (id, version, finite) in computes {
            check!(self.checker, finite, format!("C7 worker {w} asked to compute on a non-finite model"));
            let straggle = if self.rng.chance(0.1) { 30 + self.rng.below(100) } else { 0 };
            let at = self.now + 2 + self.rng.below(10) + straggle;
            self.schedule(at, Ev::Computed { w, inc, id, version });
        }
        self.arm_worker_timer(w, timeout);
    }

    fn arm_worker_timer(&mut self, w: u32, timeout: Option<Instant>) {
        let at = timeout.map(|t| t.saturating_duration_since(Instant::ZERO).as_nanos().div_ceil(TICK_NANOS));
        let now = self.now;
        let slot = &mut self.slots[w as usize];
        if let Some(at) = at.map(|a| a.max(now)) {
            if slot.timer != Some(at) {
                slot.timer = Some(at);
                let inc = slot.inc;
                self.schedule(at, Ev::WorkerTimer { w, inc });
            }
        } else {
            slot.timer = None;
        }
    }

    fn drain_server(&mut self) {
        let mut sends = Vec::new();
        let mut events = Vec::new();
        while let Some(out) = self.server.poll_output() {
            match out {
                ServerOutput::Send { to, msg } => sends.push((to, DownMsg::own(&msg))),
                ServerOutput::Event(e) => events.push(e),
            }
        }
        for e in &events {
            if matches!(e, ServerEvent::ModelUpdated { .. }) {
                self.last_progress = self.now;
                self.counts.updates += 1;
            }
            self.tracker.event(e);
            match e {
                ServerEvent::Applied { .. } => self.counts.applied += 1,
                ServerEvent::Dropped { .. } => self.counts.dropped += 1,
                _ => {}
            }
            self.checker.event(e, &self.ctx);
        }
        for (to, m) in sends {
            match to {
                Recipient::Worker(w) if (w.0 as usize) < self.slots.len() => self.send_down(w.0, m),
                Recipient::Worker(w) => self.checker.fail(format!("server sent to unknown {w}")),
                Recipient::AllWorkers => {
                    for w in 0..self.slots.len() as u32 {
                        self.send_down(w, m.clone());
                    }
                }
            }
        }
        let at = self
            .server
            .poll_timeout()
            .map(|t| t.saturating_duration_since(Instant::ZERO).as_nanos().div_ceil(TICK_NANOS));
        let at = at.map(|a| a.max(self.now));
        if at != self.server_timer {
            self.server_timer = at;
            if let Some(at) = at {
                let server_inc = self.server_inc;
                self.schedule(at, Ev::ServerTimer { server_inc });
            }
        }
        self.check_server();
    }

    /// Invariants checked after every event.
    fn check_server(&mut self) {
        let c = &mut self.checker;
        let version = self.server.version().0;
        let st = *self.server.stats();
        let finite = self.server.params().iter().all(|p| p.is_finite());
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
            let same = self.server.params().iter().zip(&c.reference).all(|(a, b)| a.to_bits() == b.to_bits());
            check!(c, same, {
                format!(
                    "C2 model {:?} differs from reference {:?} at version {version}",
                    self.server.params(),
                    c.reference
                )
            });
        }
        if let AnyServer::Ssp(s) = &self.server {
            let cfg = match self.spec.protocol {
                ProtocolConfig::Ssp(c) => c.staleness,
                _ => 0,
            };
            let clocks: Vec<u64> =
                (0..self.spec.protocol.workers()).filter_map(|w| s.worker_clock(WorkerId(w))).collect();
            if let (Some(lo), Some(hi)) = (clocks.iter().min(), clocks.iter().max()) {
                let _ = cfg;
                check!(c, lo <= hi, "clock order".into());
            }
        }
    }

    fn crash(&mut self, w: u32) {
        let slot = &mut self.slots[w as usize];
        if slot.worker.is_none() {
            return;
        }
        slot.worker = None;
        slot.inc += 1;
        self.counts.crashes += 1;
        let _ = self.server.handle_worker_lost(instant(self.now), WorkerId(w));
        self.drain_server();
        let at = self.now + 10 + self.rng.below(290);
        self.schedule(at, Ev::Restart { w });
    }

    fn restart_server(&mut self) {
        let (params, version) = (self.checker.checkpoint.0.clone(), self.checker.checkpoint.1);
        let scratch = vec![0.0; self.spec.protocol.server_scratch_len(DIM).max(1)];
        let Ok(server) = AnyServer::resume(&self.spec.protocol, params, scratch, Version(version)) else {
            self.checker.fail("resume from checkpoint failed".into());
            return;
        };
        self.counts.server_restarts += 1;
        self.tracker.server_restarted(self.server.stats(), version);
        self.server = server;
        self.server_inc += 1;
        self.server_timer = None;
        self.checker.restore();
        // The cluster restarts with the server: workers rejoin with new epochs.
        for w in 0..self.slots.len() as u32 {
            self.start_worker(w);
        }
        self.drain_server();
    }

    fn inject(&mut self) {
        let f = self.spec.faults;
        let n = self.slots.len() as u32;
        if self.rng.chance(f.crash) {
            let w = self.rng.below(u64::from(n)) as u32;
            self.crash(w);
        }
        if self.rng.chance(f.partition) {
            let w = self.rng.below(u64::from(n)) as usize;
            let until = self.now + 20 + self.rng.below(400);
            if self.rng.chance(0.5) {
                self.slots[w].cut_up_until = until;
            } else {
                self.slots[w].cut_down_until = until;
            }
            self.counts.partitions += 1;
        }
        if self.rng.chance(0.01) {
            // Take a checkpoint at a quiet moment (no half-built version).
            if self.checker.pending.is_empty() && self.server.params() == self.checker.reference.as_slice() {
                self.checker.checkpoint();
            }
        }
        if self.rng.chance(f.server_restart) {
            self.restart_server();
        }
    }

    fn step(&mut self) -> bool {
        let Some((Key(core::cmp::Reverse((at, _))), id)) = self.queue.pop() else { return false };
        let Some(ev) = self.events.remove(&id) else { return true };
        self.now = self.now.max(at);
        self.counts.steps += 1;
        if self.debug {
            eprintln!("t={} v={} {:?}", self.now, self.server.version().0, ev);
        }
        let now = instant(self.now);
        match ev {
            Ev::Up { from, epoch, server_inc, msg } => {
                if server_inc == self.server_inc {
                    let r = self.server.handle(now, WorkerId(from), msg.msg());
                    self.tracker.copy_handled(from, epoch, &msg.msg(), r);
                    self.checker.handled(from, epoch, &msg, r);
                    if r.is_err() {
                        self.counts.rejected += 1;
                    }
                    self.drain_server();
                } else {
                    self.tracker.copy_missed_server(from, epoch, &msg.msg());
                }
            }
            Ev::Down { to, inc, msg } => {
                let slot = &mut self.slots[to as usize];
                if slot.inc == inc {
                    if let Some(w) = slot.worker.as_mut() {
                        let _ = w.handle(now, msg.msg());
                        self.drain_worker(to);
                    }
                }
            }
            Ev::Computed { w, inc, id, version } => {
                let slot = &mut self.slots[w as usize];
                if slot.inc == inc {
                    if let Some(worker) = slot.worker.as_mut() {
                        let g = test_gradient(w, version);
                        let _ = worker.handle_gradient(now, ComputeId(id), &g);
                        self.drain_worker(w);
                    }
                }
            }
            Ev::WorkerTimer { w, inc } => {
                let slot = &mut self.slots[w as usize];
                if slot.inc == inc && slot.timer == Some(at) {
                    slot.timer = None;
                    if let Some(worker) = slot.worker.as_mut() {
                        worker.handle_timeout(now);
                        self.drain_worker(w);
                    }
                }
            }
            Ev::ServerTimer { server_inc } => {
                if server_inc == self.server_inc && self.server_timer == Some(at) {
                    self.server_timer = None;
                    self.server.handle_timeout(now);
                    self.drain_server();
                }
            }
            Ev::Restart { w } => {
                if self.slots[w as usize].worker.is_none() {
                    self.start_worker(w);
                }
            }
        }
        if self.faults_on {
            self.inject();
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
            self.faults_on = false;
            for s in &mut self.slots {
                s.cut_up_until = 0;
                s.cut_down_until = 0;
            }
            for w in 0..self.slots.len() as u32 {
                if self.slots[w as usize].worker.is_none() {
                    self.start_worker(w);
                }
            }
            let start = self.now;
            self.debug = std::env::var_os("SYNCOPATE_DEBUG").is_some();
            let target = self.server.version().0 + self.spec.quiet_versions;
            while self.server.version().0 < target {
                if self.now > start + self.spec.quiet_budget {
                    let v = self.server.version().0;
                    if self.debug {
                        for s in &self.slots {
                            eprintln!("slot inc={} epoch={} timer={:?} worker={:?}", s.inc, s.epoch, s.timer, s.worker);
                        }
                        eprintln!("server {:?}", self.server);
                    }
                    hang = Some(format!(
                        "L1 no progress: version {v} < {target} after {} quiet ticks (last progress at {})",
                        self.spec.quiet_budget, self.last_progress
                    ));
                    break;
                }
                if !self.step() {
                    hang = Some(format!("L1 deadlock: nothing in flight at version {}", self.server.version().0));
                    break;
                }
                if self.checker.violation.is_some() {
                    break;
                }
            }
            self.counts.quiet_ticks = self.now - start;
        }
        let _ = &self.initial;
        self.counts.checks = self.checker.checks;
        self.counts.rejected = self.checker.rejected.max(self.counts.rejected);
        let mut violation = self.checker.violation.take().or(hang);
        if let Some(v) = violation.as_mut() {
            let _ = write!(v, " (seed {}, faults {:?}, tick {})", self.spec.seed, self.spec.faults, self.now);
        }
        RunResult { counts: self.counts, violation, trace_hash: self.checker.trace }
    }
}

/// Drop reasons are part of the trace; kept referenced for documentation.
pub const DROP_REASONS: [DropReason; 5] = DropReason::ALL;
