//! WBSP on the test network (Cluster): an oracle checked after every event under random schedules, and the pace of fast and slow workers.

use super::*;

// ---------------------------------------------------------------- the test network

const DIM: usize = 3;

/// An integer gradient that depends on the worker and its job count only.
fn gradient(job: &Job<'_>) -> Vec<f64> {
    (0..DIM).map(|j| ((job.worker as u64 * 7 + job.k * 3 + j as u64 * 5) % 7) as f64 - 3.0).collect()
}

/// A server and `n` workers on the test network ([`Cluster`]) in simulated time, with
/// random tie orders, and an oracle checked after every event.
struct Harness {
    net: Cluster<Srv, Wrk>,
    n: usize,
    /// The log entries already checked.
    cursor: usize,
    /// Percent of accepted deltas handed to the server a second time at once.
    duplicate_percent: u64,
    duplicates: u64,
    // Oracle.
    /// θ0 + Σ accepted deltas / n, summed exactly.
    expected: Vec<f64>,
    uploads_this_round: Vec<u32>,
    closed_rounds: Vec<Vec<u32>>,
    models: BTreeMap<u64, Vec<f64>>,
    /// Per worker, the version of the last model sent to it.
    sent_model: Vec<u64>,
    in_flight_uploads: Vec<u32>,
    sent_deltas: u64,
    accepted: u64,
    applied_events: u64,
}

impl Harness {
    /// `compute`: per worker, its compute time in nanoseconds (`None`: its computations
    /// never end); a message takes `latency` plus up to `jitter` nanoseconds.
    fn new(config: WbspConfig, compute: Vec<Option<u64>>, latency: u64, jitter: u64, seed: u64) -> Self {
        let n = config.workers as usize;
        let theta0: Vec<f64> = (0..DIM).map(|j| j as f64 - 1.0).collect();
        let server = Srv::new(config, theta0.clone(), vec![0.0; DIM]).unwrap();
        let workers =
            (0..n as u32).map(|i| Wrk::new(config, setup(i), vec![0.0; DIM], vec![0.0; DIM]).unwrap()).collect();
        let ns = Duration::from_nanos;
        let links = NetConfig { latency: (ns(latency), ns(latency + jitter)), ..NetConfig::default() };
        let mut net = Cluster::new(server, workers, seed, links, gradient).with_random_ties();
        net.speed = compute.iter().map(|c| if c.is_some() { 1.0 } else { 0.0 }).collect();
        net.compute_time = compute.iter().map(|c| c.map(ns)).collect();
        Self {
            net,
            n,
            cursor: 0,
            duplicate_percent: 0,
            duplicates: 0,
            expected: theta0,
            uploads_this_round: vec![0; n],
            closed_rounds: Vec::new(),
            models: BTreeMap::new(),
            sent_model: vec![0; n],
            in_flight_uploads: vec![0; n],
            sent_deltas: 0,
            accepted: 0,
            applied_events: 0,
        }
    }

    fn workers(&self) -> impl Iterator<Item = &Wrk> {
        (0..self.n).filter_map(|i| self.net.worker(i))
    }

    fn check_conservation(&self) {
        let server = &self.net.server;
        for j in 0..DIM {
            assert_eq!(server.params()[j] + server.accumulator()[j], self.expected[j], "conservation");
        }
        assert_eq!(server.stats().applied, self.accepted);
        assert_eq!(self.applied_events, self.accepted);
    }

    /// Checks what the last event did (the server was at `version_before`), then may replay
    /// an accepted delta.
    fn check(&mut self, version_before: u64) {
        let entries = self.net.log.get(self.cursor..).unwrap_or_default().to_vec();
        self.cursor = self.net.log.len();
        let mut accepted_delta = None;
        for e in entries {
            match e {
                Entry::Compute { worker, version, params, .. } => {
                    assert_eq!(params.len(), DIM);
                    let have = self.net.worker(worker).and_then(|w| w.model_version());
                    assert_eq!(Some(Version(version)), have);
                }
                Entry::Up { worker, msg: ToServerOwned::Delta { .. }, .. } => {
                    self.sent_deltas += 1;
                    self.in_flight_uploads[worker] += 1;
                    assert!(self.in_flight_uploads[worker] <= 1, "W5: at most one upload in flight");
                }
                Entry::Up { msg: ToServerOwned::Pull { have, .. }, .. } => {
                    assert!(have < self.net.version().0, "a pull is only sent after a close");
                }
                Entry::ServerIn { worker, msg, result, .. } => {
                    assert_eq!(result, Ok(()), "{msg:?} from {worker}");
                    if let ToServerOwned::Delta { values, .. } = &msg {
                        self.in_flight_uploads[worker] -= 1;
                        self.accepted += 1;
                        for (e, v) in self.expected.iter_mut().zip(values) {
                            *e += v / self.n as f64;
                        }
                        accepted_delta = Some((worker, msg));
                    }
                }
                Entry::Sent { to: Recipient::Worker(w), msg: ToWorkerOwned::Model { version, values, .. } } => {
                    // W2: every model of a version is the same model.
                    let known = self.models.entry(version).or_insert_with(|| values.clone());
                    assert_eq!(*known, values, "W2");
                    self.sent_model[w.index()] = version;
                }
                Entry::Sent { to: Recipient::Worker(w), msg: ToWorkerOwned::PushAck { round, pull_now: true } } => {
                    assert!(round > self.sent_model[w.index()], "pull_now only after a close");
                }
                Entry::Event(ServerEvent::Applied { worker, version, staleness, base, weight }) => {
                    assert_eq!(version.0, version_before + 1, "an applied delta is in the next published version");
                    assert_eq!(staleness, version_before - base.0);
                    assert_eq!(weight, 1.0 / self.n as f64);
                    self.applied_events += 1;
                    self.uploads_this_round[worker.index()] += 1;
                }
                Entry::Event(ServerEvent::ModelUpdated { version, contributions, .. }) => {
                    assert_eq!(version.0, version_before + 1, "W1: one version per round");
                    let counts = core::mem::replace(&mut self.uploads_this_round, vec![0; self.n]);
                    assert_eq!(counts.iter().sum::<u32>(), contributions);
                    let server = &self.net.server;
                    for (w, c) in counts.iter().enumerate() {
                        if server.is_live(WorkerId(w as u32)) {
                            assert!(*c >= 1, "a round closes only after every live worker uploaded in it");
                        }
                    }
                    self.closed_rounds.push(counts);
                    assert_eq!(server.params(), &self.expected[..], "conservation at a close");
                    assert!(server.accumulator().iter().all(|a| *a == 0.0));
                    self.models.entry(version.0).or_insert_with(|| server.params().to_vec());
                }
                Entry::WorkerRefused { worker, msg, reason } => panic!("worker {worker} refused {msg:?}: {reason:?}"),
                _ => {}
            }
        }
        self.check_conservation();
        // A duplicate (a retransmission or a replay) is refused and changes nothing.
        let Some((from, msg)) = accepted_delta else { return };
        if self.net.rng().below(100) < self.duplicate_percent {
            let params = self.net.server.params().to_vec();
            let acc = self.net.server.accumulator().to_vec();
            assert!(matches!(self.net.redeliver(from, msg), Err(Reject::Duplicate { .. })));
            self.duplicates += 1;
            let outputs = self.net.log.get(self.cursor..).unwrap_or_default();
            assert!(outputs.iter().all(|e| matches!(e, Entry::ServerIn { .. })), "{outputs:?}");
            self.cursor = self.net.log.len();
            assert_eq!(self.net.server.params(), &params[..]);
            assert_eq!(self.net.server.accumulator(), &acc[..]);
        }
    }

    /// Runs until `max_steps` local steps in total or `max_time` nanoseconds.
    fn run(&mut self, max_steps: u64, max_time: u64) {
        self.check(self.net.version().0);
        while let Some(at) = self.net.next_at() {
            if at > t(max_time) || self.net.done.iter().sum::<u64>() >= max_steps {
                break;
            }
            let version_before = self.net.version().0;
            if !self.net.step() {
                break;
            }
            self.check(version_before);
        }
        self.check_conservation();
    }
}

fn harness_config(n: u32, overlap: bool) -> WbspConfig {
    let mut c = WbspConfig::new(n, 0.5);
    c.overlap = overlap;
    c
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(128))]

    /// W1–W3 and W5 under random compute speeds, latencies and arrival orders, with
    /// duplicated deliveries: every delta applied exactly once, exact conservation, a round
    /// closes only after every worker uploaded in it, pulls only after a close, one model per
    /// version.
    #[test]
    fn invariants_hold_under_random_schedules(
        log_n in 1u32..4,
        overlap in any::<bool>(),
        speeds in proptest::collection::vec(1u64..60, 8),
        latency in 0u64..8,
        jitter in 0u64..8,
        seed in any::<u64>(),
    ) {
        let n = 1u32 << log_n;
        let compute = speeds.iter().take(n as usize).map(|s| Some(*s)).collect();
        let mut h = Harness::new(harness_config(n, overlap), compute, latency, jitter, seed);
        h.duplicate_percent = 20;
        h.run(400, u64::MAX);
        prop_assert!(h.net.server.version().0 >= 1);
        prop_assert_eq!(h.net.server.stats().rejected, h.duplicates);
        prop_assert!(h.duplicates > 0, "some deltas were replayed");
        // Nothing lost: every delta sent was accepted, except those still in flight.
        let in_flight: u32 = h.in_flight_uploads.iter().sum();
        prop_assert_eq!(h.sent_deltas, h.accepted + u64::from(in_flight));
        // Every worker's local steps are uploaded or discarded (overlap) or not yet uploaded.
        for (i, w) in h.workers().enumerate() {
            prop_assert!(w.local_steps() >= w.uploads());
            prop_assert_eq!(w.local_steps(), h.net.done[i]);
            if !overlap {
                prop_assert_eq!(w.discarded_steps(), 0);
            }
        }
    }
}

/// With equal-speed workers every worker takes exactly one local step per round (a round
/// is a window of time closed by the last upload), in both variants.
#[test]
fn equal_speed_workers_take_one_local_step_per_round() {
    for overlap in [false, true] {
        for seed in 0..20 {
            let n = 4;
            let mut h = Harness::new(harness_config(n, overlap), vec![Some(100); 4], 3, 0, seed);
            h.run(u64::MAX, 20_000);
            assert!(h.closed_rounds.len() > 50, "{} rounds", h.closed_rounds.len());
            for (r, counts) in h.closed_rounds.iter().enumerate() {
                assert_eq!(counts, &vec![1; n as usize], "round {r}, overlap {overlap}, seed {seed}");
            }
            assert!(h.workers().all(|w| w.discarded_steps() == 0));
        }
    }
}

/// Fast workers take several steps per slow round and are never held back by the slowest
/// one; the slowest uploads once per round.
#[test]
fn fast_workers_keep_stepping_while_the_slowest_finishes() {
    for overlap in [false, true] {
        let mut h = Harness::new(harness_config(4, overlap), vec![Some(10), Some(40), Some(10), Some(40)], 1, 0, 7);
        h.run(u64::MAX, 10_000);
        let rounds = h.closed_rounds.len() as u64;
        assert!(rounds > 100);
        for r in &h.closed_rounds[2..] {
            assert!(r[0] >= 2 && r[2] >= 2, "fast workers upload several deltas per round: {r:?}");
            assert!(r[1] <= 2 && r[3] <= 2, "slow workers about once: {r:?}");
        }
        // The fast workers step about four times as often as the slow ones.
        assert!(h.net.done[0] >= 3 * h.net.done[1], "{:?}", h.net.done);
    }
}

/// The optimized variant coalesces steps when the link is slower than computation.
#[test]
fn overlap_coalesces_when_the_link_is_slow() {
    let mut h = Harness::new(harness_config(2, true), vec![Some(5), Some(5)], 20, 0, 3);
    h.run(u64::MAX, 20_000);
    let steps: u64 = h.net.done.iter().sum();
    let uploads: u64 = h.workers().map(|w| w.uploads()).sum();
    assert!(steps > 3 * uploads, "steps {steps}, uploads {uploads}");
    // The basic variant waits one round trip per step instead.
    let mut b = Harness::new(harness_config(2, false), vec![Some(5), Some(5)], 20, 0, 3);
    b.run(u64::MAX, 20_000);
    assert!(b.net.done.iter().sum::<u64>() * 3 < steps);
}

/// A silently dead worker stalls the round only until the deadline; the others go on.
#[test]
fn a_dead_worker_does_not_stall_the_others_forever() {
    for overlap in [false, true] {
        let compute = vec![Some(10), Some(10), Some(10), None];
        let mut stuck = Harness::new(harness_config(4, overlap), compute.clone(), 1, 1, 5);
        stuck.run(u64::MAX, 5_000);
        assert_eq!(stuck.net.server.version(), Version(0), "without a deadline the round waits");

        let mut c = harness_config(4, overlap);
        c.round_deadline = Some(Duration::from_nanos(200));
        let mut h = Harness::new(c, compute, 1, 1, 5);
        h.run(u64::MAX, 5_000);
        assert!(h.net.server.version().0 > 100, "version {}", h.net.server.version().0);
        assert!(!h.net.server.is_live(WorkerId(3)));
        for r in &h.closed_rounds {
            assert_eq!(r[3], 0);
        }
    }
}
