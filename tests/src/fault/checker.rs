//! The invariant checker: reads the test network's log after every event and records every
//! violation of conservation, ordering and the protocols' rules.

use super::*;

type LedgerEntry = Vec<((u32, u64), Vec<f64>)>;

/// An `Applied` event of the version being built: worker, base, weight, and the `(epoch,
/// seq)` of the very message applied when the checker knows it (SSP).
type PendingApplied = (u32, u64, f64, Option<(u32, u64)>);

/// Reference model, version and applied counts saved with a server checkpoint.
type Checkpoint = (Vec<f64>, u64, HashMap<(u32, u64), u32>);

/// The invariant checker: consumes server events and rejects, keeps the ledger of every
/// contribution sent and the reference model rebuilt from the applied-update log.
pub struct Checker {
    pub(super) name: &'static str,
    pub(super) workers: u32,
    /// `(worker, base)` → distinct `(epoch, seq)` contributions sent, each with its values.
    pub(super) ledger: HashMap<(u32, u64), LedgerEntry>,
    /// `(worker, base)` → times applied (in the current server incarnation lineage).
    pub(super) applied: HashMap<(u32, u64), u32>,
    /// Applied events of the version being built.
    pub(super) pending: BTreeMap<u64, Vec<PendingApplied>>,
    /// Reference model and version.
    pub(super) reference: Vec<f64>,
    pub(super) version: u64,
    /// Events seen in this server incarnation.
    pub(super) applied_events: u64,
    pub(super) dropped_events: u64,
    pub(super) rejected: u64,
    pub(super) ok_contributions: u64,
    /// Checkpoint: reference model, version and the applied counts at that point.
    pub(super) checkpoint: Checkpoint,
    /// The first violation.
    pub violation: Option<String>,
    /// Checks executed.
    pub checks: u64,
    pub(super) trace: u64,
    /// The SSP `Clock` just accepted, `(worker, clock, epoch, seq)`: SSP reports its own
    /// version as `base`, so its `Applied` event is matched to the message it answers. (Not
    /// by `(worker, clock)` alone: two sessions of a worker can both send clock `c`, with
    /// different values, and both be applied.)
    pub(super) last_ok: Option<(u32, u64, u32, u64)>,
    /// Every `(worker, epoch, seq)` contribution the server accepted.
    pub(super) accepted: std::collections::HashSet<(u32, u32, u64)>,
}

impl Checker {
    pub(super) fn new(name: &'static str, workers: u32, initial: &[f64]) -> Self {
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

    pub(super) fn fail(&mut self, what: String) {
        if self.violation.is_none() {
            self.violation = Some(format!("[{}] {what}", self.name));
        }
    }

    pub(super) fn mix(&mut self, x: u64) {
        self.trace = (self.trace ^ x).wrapping_mul(0x100_0000_01b3);
    }

    pub(super) fn sent(&mut self, w: u32, epoch: u32, msg: &ToServerOwned) {
        let (base, seq, values) = match msg {
            ToServerOwned::Grad { base, seq, values, .. } => (*base, *seq, values),
            ToServerOwned::Delta { round, seq, values, .. } => (*round, *seq, values),
            ToServerOwned::Clock { clock, seq, values } => (*clock, *seq, values),
            _ => return,
        };
        let e = self.ledger.entry((w, base)).or_default();
        match e.iter().find(|(id, _)| *id == (epoch, seq)) {
            // A retransmission carries the same values.
            Some((_, v)) => {
                let same = v == values;
                check!(self, same, format!("worker {w} epoch {epoch} seq {seq} sent again with other values"));
            }
            None => e.push(((epoch, seq), values.clone())),
        }
    }

    pub(super) fn handled(&mut self, from: u32, epoch: u32, msg: &ToServerOwned, result: Result<(), Reject>) {
        self.mix(u64::from(result.is_ok()));
        let seq = match msg {
            ToServerOwned::Grad { seq, .. } | ToServerOwned::Delta { seq, .. } | ToServerOwned::Clock { seq, .. } => {
                Some(*seq)
            }
            _ => None,
        };
        if let (Some(seq), Ok(())) = (seq, result) {
            let fresh = self.accepted.insert((from, epoch, seq));
            check!(self, fresh, format!("C1 worker {from} epoch {epoch} seq {seq} accepted twice (duplicate counted)"));
        }
        self.last_ok = match (msg, result) {
            (ToServerOwned::Clock { clock, seq, .. }, Ok(())) => Some((from, *clock, epoch, *seq)),
            _ => None,
        };
        match result {
            Ok(()) if is_contribution(msg) => self.ok_contributions += 1,
            Ok(()) => {}
            Err(_) => self.rejected += 1,
        }
    }

    pub(super) fn event(&mut self, ev: &ServerEvent, ctx: &Ctx) {
        match *ev {
            ServerEvent::Applied { worker, base, version, staleness, weight } => {
                self.mix(u64::from(worker.0) << 32 ^ version.0);
                self.applied_events += 1;
                let (key, id) = match (ctx.by_message, self.last_ok) {
                    (true, Some((w, clock, epoch, seq))) if w == worker.0 => ((w, clock), Some((epoch, seq))),
                    _ => ((worker.0, base.0), None),
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
                self.pending.entry(version.0).or_default().push((key.0, key.1, weight, id));
            }
            ServerEvent::Dropped { worker, base, reason } => {
                self.mix(0xD ^ u64::from(worker.0) << 8 ^ base.0);
                self.dropped_events += 1;
                let _ = reason;
            }
            ServerEvent::ModelUpdated { version, contributions, .. } => {
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
    /// small integers are exact, so the order does not matter). A contribution's values are
    /// those of the very message applied when known, else the last ones sent for its `(worker,
    /// base)` (every protocol but SSP computes them from `(worker, base)` alone).
    pub(super) fn apply_reference(&mut self, list: &[PendingApplied], lr: f64) {
        let mut by_weight: Vec<(f64, Vec<f64>)> = Vec::new();
        for &(w, base, weight, id) in list {
            let sent = self.ledger.get(&(w, base)).and_then(|e| match id {
                Some(id) => e.iter().find(|(x, _)| *x == id),
                None => e.last(),
            });
            let Some(values) = sent.map(|(_, v)| v.clone()) else {
                self.fail(format!("applied a contribution of worker {w} base {base} ({id:?}) that was never sent"));
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

    pub(super) fn checkpoint(&mut self) {
        self.checkpoint = (self.reference.clone(), self.version, self.applied.clone());
    }

    pub(super) fn restore(&mut self) {
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
pub(super) struct Ctx {
    pub(super) synchronous: bool,
    pub(super) distinct_per_version: bool,
    pub(super) max_per_version: Option<u32>,
    pub(super) staleness_bound: u64,
    pub(super) grouped: bool,
    pub(super) exact: bool,
    /// The step the server multiplies `weight` by (SSP's averaged step is `η/n`).
    pub(super) lr: f64,
    /// Applied events are matched to the message just handled (SSP).
    pub(super) by_message: bool,
}

impl Ctx {
    pub(super) fn of(p: &ProtocolConfig) -> Self {
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
