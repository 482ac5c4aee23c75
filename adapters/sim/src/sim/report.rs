//! What a run produced: [`SimReport`] (serializable), and the [`Observation`]s a test or a
//! tool can watch while it runs.

use core::fmt;
use serde::Serialize;
use std::collections::BTreeMap;
use syncopate::proto::Heap;
use syncopate::{AnyServer, Instant, Reject, ServerEvent, WorkerEvent, WorkerId};

/// A node of the simulated cluster.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize)]
pub enum Node {
    /// The parameter server.
    Server,
    /// A worker, by index.
    Worker(u32),
    /// A group node of a two-level grouped run (then [`Node::Server`] is the central node).
    Group(u32),
}

impl fmt::Display for Node {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Self::Server => f.write_str("server"),
            Self::Worker(i) => write!(f, "worker {i}"),
            Self::Group(g) => write!(f, "group {g}"),
        }
    }
}

/// What a run shows every [`Observation`] to as it happens.
pub(crate) type Observer<'o> = &'o mut dyn FnMut(&Observation<'_>);

/// Something that happened during a run, shown to the observer of [`super::run_observed`].
#[derive(Debug)]
#[non_exhaustive]
pub enum Observation<'a> {
    /// The server emitted an event (in a two-level grouped run: a group node; the central
    /// node's events are [`Observation::Central`]).
    Server {
        /// Virtual time.
        at: Instant,
        /// The event.
        event: ServerEvent,
    },
    /// The central node of a two-level grouped run emitted an event (its "workers" are the
    /// groups).
    Central {
        /// Virtual time.
        at: Instant,
        /// The event.
        event: ServerEvent,
    },
    /// A message fault was injected.
    Fault {
        /// Virtual time (when the message was handed to its link).
        at: Instant,
        /// Sender.
        from: Node,
        /// Receiver.
        to: Node,
        /// Message kind.
        kind: &'static str,
        /// What happened to it.
        fault: Fault,
    },
    /// The server crashed (its state is lost except the checkpoint).
    ServerCrashed {
        /// Virtual time.
        at: Instant,
        /// The checkpointed model version it will resume from.
        version: syncopate::Version,
    },
    /// The server restarted from its checkpoint.
    ServerRestarted {
        /// Virtual time.
        at: Instant,
    },
    /// A worker emitted an event.
    Worker {
        /// Virtual time.
        at: Instant,
        /// The worker.
        worker: WorkerId,
        /// The event.
        event: WorkerEvent,
    },
    /// A node put a message on the network.
    Sent {
        /// Virtual time.
        at: Instant,
        /// Sender.
        from: Node,
        /// Receiver.
        to: Node,
        /// Message kind ([`syncopate::ToServer::kind_name`] / [`syncopate::ToWorker::kind_name`]).
        kind: &'static str,
        /// Encoded length.
        bytes: usize,
    },
    /// A message reached its receiver, which took it (`Ok`) or refused it.
    Delivered {
        /// Virtual time.
        at: Instant,
        /// Sender.
        from: Node,
        /// Receiver.
        to: Node,
        /// Message kind.
        kind: &'static str,
        /// Encoded length.
        bytes: usize,
        /// What the receiver's `handle` returned.
        result: Result<(), Reject>,
    },
    /// A worker finished a computation and handed the gradient over (`Ok`), or the worker
    /// refused it because the job had been abandoned.
    GradientComputed {
        /// Virtual time.
        at: Instant,
        /// The worker.
        worker: WorkerId,
        /// What `handle_gradient` returned.
        result: Result<(), Reject>,
    },
    /// A worker crashed.
    Crashed {
        /// Virtual time.
        at: Instant,
        /// The worker.
        worker: WorkerId,
    },
    /// A crashed worker restarted with a new epoch.
    Restarted {
        /// Virtual time.
        at: Instant,
        /// The worker.
        worker: WorkerId,
        /// Its new epoch.
        epoch: u32,
    },
    /// The server's model was evaluated on the test set.
    Evaluated {
        /// The curve point.
        point: CurvePoint,
    },
    /// One simulation step (one event and everything it caused) is complete; the server
    /// (the central node of a two-level grouped run) can be inspected.
    Step {
        /// Virtual time.
        at: Instant,
        /// The server, read-only.
        server: &'a AnyServer<f32, Vec<f32>, Heap>,
    },
}

/// A message fault.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize)]
pub enum Fault {
    /// Lost (random loss).
    Dropped,
    /// Lost because its link was cut (a partition).
    Partitioned,
    /// Delayed by this much extra (it may be overtaken).
    Delayed(syncopate::Duration),
    /// Delivered a second time, this long after the original.
    Duplicated(syncopate::Duration),
    /// Lost because the server was down when it arrived.
    ServerDown,
}

/// Injected faults, counted (all zero without [`super::FaultConfig`]). Message counts are by
/// message kind (`Grad`, `Model`, `Join`, …).
#[derive(Clone, Debug, Default, PartialEq, Serialize)]
pub struct FaultStats {
    /// Messages lost at random.
    pub dropped: BTreeMap<&'static str, u64>,
    /// Messages delivered twice.
    pub duplicated: BTreeMap<&'static str, u64>,
    /// Messages given a delay spike.
    pub delayed: BTreeMap<&'static str, u64>,
    /// Messages lost to a cut link.
    pub partitioned: BTreeMap<&'static str, u64>,
    /// Messages lost because the server was down.
    pub server_down: BTreeMap<&'static str, u64>,
    /// Random worker crashes (scripted ones are in [`WorkerReport::crashes`] only).
    pub random_crashes: u64,
    /// Server crashes.
    pub server_crashes: u64,
    /// Server restarts from checkpoint.
    pub server_restarts: u64,
}

impl FaultStats {
    /// All messages lost to faults (dropped, partitioned, server down).
    pub fn messages_lost(&self) -> u64 {
        [&self.dropped, &self.partitioned, &self.server_down].iter().flat_map(|m| m.values()).sum()
    }

    /// Total of one counter map.
    pub fn total(map: &BTreeMap<&'static str, u64>) -> u64 {
        map.values().sum()
    }

    pub(crate) fn count(&mut self, fault: Fault, kind: &'static str) {
        let map = match fault {
            Fault::Dropped => &mut self.dropped,
            Fault::Partitioned => &mut self.partitioned,
            Fault::Delayed(_) => &mut self.delayed,
            Fault::Duplicated(_) => &mut self.duplicated,
            Fault::ServerDown => &mut self.server_down,
        };
        *map.entry(kind).or_default() += 1;
    }
}

/// One evaluation of the server's model on the test set.
#[derive(Clone, Copy, Debug, PartialEq, Serialize)]
pub struct CurvePoint {
    /// Virtual time in seconds.
    pub time_s: f64,
    /// The server's model version.
    pub version: u64,
    /// Test accuracy.
    pub accuracy: f64,
    /// Test loss.
    pub loss: f64,
}

/// A test loss this many times the first evaluation's marks a diverged run.
pub const DIVERGED_LOSS_GROWTH: f64 = 10.0;

/// Why a run diverged, if it did, as one clause: its test loss became NaN or infinite, or
/// grew past [`DIVERGED_LOSS_GROWTH`] times its first value, or `not_finite` inputs were
/// refused because they held NaN or ±∞ or overflowed their norm (a diverging model's
/// gradients).
pub fn divergence(curve: &[CurvePoint], not_finite: u64) -> Option<String> {
    let first = curve.first().map(|p| p.loss).filter(|l| l.is_finite() && *l > 0.0);
    let not_finite_at = curve.iter().find(|p| !p.loss.is_finite());
    let grown = first.and_then(|f| curve.iter().find(|p| p.loss > DIVERGED_LOSS_GROWTH * f).map(|p| (f, p)));
    let mut why = match (not_finite_at, grown) {
        (Some(p), _) => format!("the test loss was {} at {:.3} s (version {})", p.loss, p.time_s, p.version),
        (None, Some((f, p))) => {
            format!("the test loss grew from {f:.4} to {:.3e} by {:.3} s (version {})", p.loss, p.time_s, p.version)
        }
        (None, None) if not_finite > 0 => String::new(),
        (None, None) => return None,
    };
    if not_finite > 0 {
        if !why.is_empty() {
            why.push_str("; ");
        }
        why.push_str(&format!("{not_finite} gradient(s) refused for holding NaN, ±∞ or an overflowing norm"));
    }
    Some(why)
}

/// What became of one worker.
#[derive(Clone, Debug, Default, PartialEq, Serialize)]
pub struct WorkerReport {
    /// The worker's index.
    pub worker: u32,
    /// Computations finished and handed to the worker.
    pub gradients_computed: u64,
    /// Contributions (gradients, deltas, clock updates) the worker sent.
    pub gradients_sent: u64,
    /// Computations abandoned before they finished, or refused at the end.
    pub jobs_abandoned: u64,
    /// Virtual time spent computing (abandoned work included), in seconds.
    pub compute_time_s: f64,
    /// `compute_time_s` / run time: how busy the worker was.
    pub compute_share: f64,
    /// Times it crashed.
    pub crashes: u32,
}

/// One bucket of the staleness histogram: `lo..=hi`.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize)]
pub struct Bucket {
    /// Smallest staleness in the bucket.
    pub lo: u64,
    /// Largest staleness in the bucket (`u64::MAX` for the last).
    pub hi: u64,
    /// Applied contributions in the bucket.
    pub count: u64,
}

/// Staleness of the applied contributions (from [`ServerEvent::Applied`]).
#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct StalenessStats {
    /// Applied contributions.
    pub count: u64,
    /// Mean staleness.
    pub mean: f64,
    /// Largest staleness.
    pub max: u64,
    /// Buckets 0, 1, 2–3, 4–7, …, 512+.
    pub histogram: Vec<Bucket>,
}

impl StalenessStats {
    const BUCKETS: usize = 11;

    pub(crate) fn new() -> Self {
        let histogram = (0..Self::BUCKETS)
            .map(|i| {
                let lo = if i == 0 { 0 } else { 1u64 << (i - 1) };
                let hi = if i == 0 {
                    0
                } else if i == Self::BUCKETS - 1 {
                    u64::MAX
                } else {
                    (1u64 << i) - 1
                };
                Bucket { lo, hi, count: 0 }
            })
            .collect();
        Self { count: 0, mean: 0.0, max: 0, histogram }
    }

    pub(crate) fn record(&mut self, staleness: u64) {
        self.count += 1;
        // Running sum kept in `mean` until `finish`.
        self.mean += staleness as f64;
        self.max = self.max.max(staleness);
        let i = if staleness == 0 { 0 } else { (64 - staleness.leading_zeros() as usize).min(Self::BUCKETS - 1) };
        if let Some(b) = self.histogram.get_mut(i) {
            b.count += 1;
        }
    }

    pub(crate) fn finish(&mut self) {
        if self.count > 0 {
            self.mean /= self.count as f64;
        }
    }
}

/// One recorded step time (for `--record-trace` and replay with
/// [`super::ComputeModel::Trace`]).
#[derive(Clone, Copy, Debug, PartialEq, Serialize)]
pub struct TraceStep {
    /// The worker.
    pub worker: u32,
    /// Its step index (0, 1, …).
    pub step: u64,
    /// The sampled compute time in seconds.
    pub seconds: f64,
    /// What the step's gradient measured (loss, norms), when the run computed gradients.
    pub gradient: crate::trace::GradientStats,
}

/// Records a run's step times and, when gradients are computed, their loss, norm and the
/// norm of the mean of the gradients computed on the same model
/// ([`crate::trace::GradientGroups`]).
#[derive(Debug, Default)]
pub(crate) struct TraceRecorder {
    steps: Vec<TraceStep>,
    groups: crate::trace::GradientGroups,
}

impl TraceRecorder {
    /// Records worker `worker`'s step `step` of `seconds`; with `gradient`, the model it was
    /// computed on, the gradient and its minibatch loss.
    pub(crate) fn record(&mut self, worker: u32, step: u64, seconds: f64, gradient: Option<(&[f32], &[f32], f64)>) {
        let mut stats = crate::trace::GradientStats::default();
        if let Some((params, grad, loss)) = gradient {
            stats.loss = loss.is_finite().then_some(loss);
            stats.grad_norm = Some(crate::trace::norm(grad));
            self.groups.add(self.steps.len(), crate::trace::model_key(params), grad);
        }
        self.steps.push(TraceStep { worker, step, seconds, gradient: stats });
    }

    /// Every recorded step, with its group's mean norm.
    pub(crate) fn finish(self) -> Vec<TraceStep> {
        let Self { mut steps, groups } = self;
        for (row, mean_norm, count) in groups.finish() {
            if let Some(s) = steps.get_mut(row) {
                s.gradient.mean_norm = mean_norm.is_finite().then_some(mean_norm);
                s.gradient.mean_of = count;
            }
        }
        steps
    }
}

/// Everything a run measured. Two runs with the same config and workload produce equal
/// reports (including [`SimReport::trace_hash`] and [`SimReport::final_params_hash`]).
#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct SimReport {
    /// The protocol's short name.
    pub protocol: String,
    /// The run seed.
    pub seed: u64,
    /// Number of workers.
    pub workers: u32,
    /// Why the run ended: `max_time`, `max_updates`, `max_gradients`, `target`,
    /// `target_loss`, `diverged` (an evaluation found the test loss not finite, or an input
    /// was refused for holding NaN or ±∞ or overflowing its norm), `idle`
    /// (nothing left to do) or `max_events`.
    pub stop_reason: &'static str,
    /// Test accuracy and loss over virtual time.
    pub curve: Vec<CurvePoint>,
    /// The target accuracy.
    pub target_accuracy: f64,
    /// Virtual seconds until the server published the first model whose test accuracy is at
    /// or above the target (every model is checked, whatever the evaluation interval).
    pub time_to_target: Option<f64>,
    /// That model's version.
    pub updates_to_target: Option<u64>,
    /// Test accuracy at the end.
    pub final_accuracy: f64,
    /// Test loss at the end.
    pub final_loss: f64,
    /// Virtual time at the end, in seconds.
    pub virtual_time_s: f64,
    /// Model updates (server version increments).
    pub updates: u64,
    /// Contributions the server accepted.
    pub accepted: u64,
    /// Contributions applied.
    pub applied: u64,
    /// Contributions dropped, by reason name (every reason of [`syncopate::DropReason::ALL`]).
    pub dropped: BTreeMap<&'static str, u64>,
    /// Inputs the server refused.
    pub rejected: u64,
    /// [`ServerEvent::Stalled`] reports (the server waited a stall interval without progress).
    pub stalls: u64,
    /// Inputs workers refused (messages and gradients).
    pub worker_rejects: u64,
    /// Inputs refused (by the server or a worker) because a tensor held NaN or ±∞ or its
    /// norm overflowed: a diverging model's gradients.
    pub not_finite: u64,
    /// Per-worker figures.
    pub per_worker: Vec<WorkerReport>,
    /// Mean of the workers' compute shares.
    pub mean_compute_share: f64,
    /// Staleness of the applied contributions.
    pub staleness: StalenessStats,
    /// Events processed.
    pub events: u64,
    /// Messages delivered.
    pub messages_delivered: u64,
    /// Messages lost with a crashed worker (fault losses are in [`SimReport::faults`]).
    pub messages_lost: u64,
    /// Injected faults.
    pub faults: FaultStats,
    /// Encoded bytes put on the network.
    pub bytes_moved: u64,
    /// Message buffers the pool had to allocate or grow: bounded by the messages in flight at
    /// once, flat in the steady state (no allocation per message).
    pub buffers_allocated: usize,
    /// Messages that failed to encode or decode, or that a server without an uplink sent
    /// upstream (a bug; always 0).
    pub codec_errors: u64,
    /// FNV-1a hash of every event in order, for determinism checks.
    pub trace_hash: u64,
    /// FNV-1a hash of the bits of the final model.
    pub final_params_hash: u64,
    /// Every sampled step time, in order (empty unless `record_trace`); not serialized.
    #[serde(skip)]
    pub compute_trace: Vec<TraceStep>,
    /// The final model; not serialized.
    #[serde(skip)]
    pub final_params: Vec<f32>,
    /// Sharded servers ([`super::SimConfig::shards`] > 1): each shard's counters and ledger,
    /// in shard order (empty for a run with one server). The counters above are then sums
    /// over the shards (a gradient is one contribution to every shard), and `updates` is the
    /// fewest any shard made.
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub shards: Vec<ShardReport>,
}

/// One shard of a sharded run: its slice, its counters and its ledger.
#[derive(Clone, Debug, Default, PartialEq, Serialize)]
pub struct ShardReport {
    /// The shard's index.
    pub shard: u32,
    /// Model elements it holds.
    pub elements: usize,
    /// Its model updates.
    pub updates: u64,
    /// Contributions (gradients, deltas, clock updates) workers sent it, resent copies
    /// included.
    pub contributions_sent: u64,
    /// Of those, delivered to it.
    pub delivered: u64,
    /// Of those delivered, refused.
    pub refused: u64,
    /// Sent and not yet delivered when the run ended.
    pub in_flight: u64,
    /// Accepted by the shard.
    pub accepted: u64,
    /// Applied to its model.
    pub applied: u64,
    /// Dropped by its protocol's rules.
    pub dropped: u64,
    /// Virtual time of each of its model updates, seconds.
    #[serde(skip)]
    pub update_times_s: Vec<f64>,
}

impl ShardReport {
    /// Whether the shard's ledger balances: every contribution sent was delivered or is in
    /// flight, every delivered one accepted or refused, and every accepted one applied,
    /// dropped or held (held: `accepted − applied − dropped`, never negative).
    pub fn balanced(&self) -> bool {
        self.contributions_sent == self.delivered + self.in_flight
            && self.delivered == self.accepted + self.refused
            && self.applied + self.dropped <= self.accepted
    }
}

/// One rung of a ladder of targets: a test loss to get down to or a test accuracy to get
/// up to. Progress over a long run is reported as the time to each rung
/// ([`SimReport::time_to`]) rather than to one threshold.
#[derive(Clone, Copy, Debug, PartialEq, Serialize)]
pub enum Target {
    /// Test loss at or below this.
    Loss(f64),
    /// Test accuracy at or above this.
    Accuracy(f64),
}

impl Target {
    /// Whether an evaluation reached the target.
    pub fn reached(&self, point: &CurvePoint) -> bool {
        match *self {
            Self::Loss(x) => point.loss <= x,
            Self::Accuracy(x) => point.accuracy >= x,
        }
    }
}

impl fmt::Display for Target {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Self::Loss(x) => write!(f, "loss {x}"),
            Self::Accuracy(x) => write!(f, "acc {x}"),
        }
    }
}

impl SimReport {
    /// Virtual seconds until the first evaluation that reached `target` (`None`: never).
    /// An accuracy rung at or below the run's own target is also known reached at
    /// [`Self::time_to_target`] (the exact crossing of the target, which a run stopped there
    /// may not have evaluated on the curve); the earlier of the two counts.
    pub fn time_to(&self, target: Target) -> Option<f64> {
        let on_curve = self.curve.iter().find(|p| target.reached(p)).map(|p| p.time_s);
        let at_target = match target {
            Target::Accuracy(x) if x <= self.target_accuracy => self.time_to_target,
            _ => None,
        };
        match (on_curve, at_target) {
            (Some(a), Some(b)) => Some(a.min(b)),
            (a, b) => a.or(b),
        }
    }

    /// [`Self::time_to`] for every rung of a ladder, in order.
    pub fn ladder(&self, targets: &[Target]) -> Vec<Option<f64>> {
        targets.iter().map(|t| self.time_to(*t)).collect()
    }

    /// The recorded step times of `worker`, in step order (for replay with
    /// [`super::ComputeModel::Trace`]).
    pub fn worker_trace(&self, worker: u32) -> Vec<f64> {
        self.compute_trace.iter().filter(|s| s.worker == worker).map(|s| s.seconds).collect()
    }

    /// Mean virtual seconds per model update.
    pub fn seconds_per_update(&self) -> Option<f64> {
        (self.updates > 0).then(|| self.virtual_time_s / self.updates as f64)
    }
}

pub(crate) mod closing;
mod hash;

pub(crate) use hash::{FastDebug, Fnv};

#[cfg(test)]
mod tests {
    use super::*;
    use core::fmt::Write as _;

    #[test]
    fn fnv_matches_reference_vectors() {
        let mut h = Fnv::new();
        h.bytes(b"");
        assert_eq!(h.0, 0xcbf2_9ce4_8422_2325);
        let mut h = Fnv::new();
        h.bytes(b"a");
        assert_eq!(h.0, 0xaf63_dc4c_8601_ec8c);
        let mut h = Fnv::new();
        let bar = "bar";
        write!(h, "foo{bar}").unwrap();
        let mut g = Fnv::new();
        g.bytes(b"foobar");
        assert_eq!(h, g);
        assert_eq!(g.0, 0x85944171f73967e8);
    }

    #[test]
    fn fast_debug_hashes_the_same_bytes() {
        use syncopate::{DropReason, Version, WorkerId};
        let mut fast = FastDebug::default();
        let weights = [0.125, 1.0, 0.0, -0.0, 1e-7, 1e20, 1.0 / 3.0, f64::NAN, f64::INFINITY, 0.125];
        let big = [0, 1, 9, 10, 99, 100, 12_345, u64::from(u32::MAX), u64::MAX];
        let mut events = Vec::new();
        for (i, &weight) in weights.iter().enumerate() {
            let x = big[i % big.len()];
            let y = big[(i + 3) % big.len()];
            events.push(ServerEvent::Applied {
                worker: WorkerId(x as u32),
                base: Version(x),
                version: Version(y),
                staleness: y,
                weight,
            });
            events.push(ServerEvent::ModelUpdated { version: Version(x), contributions: y as u32, mean_loss: None });
            let mean_loss = Some(x as f32 / 3.0);
            events.push(ServerEvent::ModelUpdated { version: Version(x), contributions: y as u32, mean_loss });
        }
        events.push(ServerEvent::Dropped { worker: WorkerId(3), base: Version(7), reason: DropReason::Stale });
        for e in &events {
            let (mut a, mut b) = (Fnv::new(), Fnv::new());
            fast.server_event(&mut a, e);
            write!(b, "{e:?}").unwrap();
            assert_eq!(a, b, "{e:?}");
        }
        for r in [Ok(()), Err(Reject::Stopped)] {
            let (mut a, mut b) = (Fnv::new(), Fnv::new());
            a.result(&r);
            write!(b, "{r:?}").unwrap();
            assert_eq!(a, b);
        }
    }

    #[test]
    fn staleness_buckets() {
        let mut s = StalenessStats::new();
        for x in [0, 1, 2, 3, 4, 7, 8, 600, 100_000] {
            s.record(x);
        }
        s.finish();
        let counts: Vec<u64> = s.histogram.iter().map(|b| b.count).collect();
        assert_eq!(counts, [1, 1, 2, 2, 1, 0, 0, 0, 0, 0, 2]);
        assert_eq!(s.max, 100_000);
        assert_eq!(s.count, 9);
        for (b, x) in s.histogram.iter().zip([0u64, 1, 2, 4, 8]) {
            assert_eq!(b.lo, x);
        }
        assert_eq!(s.histogram[3].hi, 7);
    }
}
