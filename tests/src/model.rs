//! Reference models of the protocol servers, for the model-based (state-machine) tests in
//! `tests/tests/model_*.rs`: a small, obviously-correct restatement of each protocol's rules
//! (who is a member, which sequence numbers are new, when a round or iteration closes, which
//! gradients are applied into which version and which are dropped and why) run side by side
//! with the real server on the same arbitrary sequence of inputs — joins, gradients (current,
//! stale, future, NaN), replays, pulls, lost workers, leaves, time passing. After every input
//! the driver compares the verdict (accepted, or the kind of refusal), the events (`Applied`
//! with worker, base and version; `Dropped` with its reason; `ModelUpdated`; `WorkerLost`;
//! `WorkerJoined`), the version, the server's counters and its conservation ledger, and for
//! SSP and WBSP the models it sends and its next deadline.
//!
//! Models: [`AspModel`]; [`GroupedModel`] (one local step, through the composite server's
//! `Server` verbs); [`SyncModel`] for BSP (`k = n`), static backup workers (`k = n − b`)
//! and DBW (`k` as the server chose it, read before every input); [`WbspModel`] (with a round
//! deadline); [`BapModel`]; [`SspModel`].

use crate::ledger::Ledger;
use proptest::prelude::*;
use std::collections::BTreeSet;
use std::string::String;
use std::vec::Vec;
use syncopate::id::first_seq;
use syncopate::{
    AnyServer, DropReason, Instant, ProtocolConfig, Recipient, Reject, Server, ServerEvent, ServerOutput, ToServer,
    ToWorker, Values, Version, WorkerId,
};

/// Model dimension.
pub const DIM: usize = 2;

/// One generated input, before it is made concrete against the current state.
#[derive(Clone, Copy, Debug)]
pub enum Op {
    /// `Join` with the worker's current epoch (`0`), the next (`1`) or an older one (`2`).
    Join { w: u8, epoch: u8 },
    /// A contribution: computed `lag` versions behind (`future`: one ahead), for the iteration
    /// `ahead` past the next (BAP), with NaN values if `nan`.
    Send { w: u8, lag: u8, ahead: u8, future: bool, nan: bool },
    /// The worker's last contribution again (same sequence number).
    Replay { w: u8 },
    /// A `Pull` (SSP, BAP, WBSP): `have` `lag` versions behind, `min_clock` `ahead` past the
    /// server's clock.
    Pull { w: u8, lag: u8, ahead: u8 },
    /// The transport lost the worker.
    Lost { w: u8 },
    /// The worker said `Leave`.
    Leave { w: u8 },
    /// `ms` milliseconds pass (deadlines that passed fire).
    Tick { ms: u16 },
}

/// Sequences of up to `len` inputs over workers `0..=n` (`n` is not a member).
pub fn ops(n: u32, len: usize) -> impl Strategy<Value = Vec<Op>> {
    let w = 0..=(n as u8);
    let op = prop_oneof![
        2 => (w.clone(), 0u8..3).prop_map(|(w, epoch)| Op::Join { w, epoch }),
        10 => (w.clone(), prop_oneof![4 => Just(0u8), 1 => 1u8..5], 0u8..3, proptest::bool::weighted(0.05), proptest::bool::weighted(0.05))
            .prop_map(|(w, lag, ahead, future, nan)| Op::Send { w, lag, ahead, future, nan }),
        1 => w.clone().prop_map(|w| Op::Replay { w }),
        2 => (w.clone(), 0u8..3, 0u8..4).prop_map(|(w, lag, ahead)| Op::Pull { w, lag, ahead }),
        1 => w.clone().prop_map(|w| Op::Lost { w }),
        1 => w.prop_map(|w| Op::Leave { w }),
        1 => (1u16..200).prop_map(|ms| Op::Tick { ms }),
    ];
    proptest::collection::vec(op, 1..len)
}

/// A message as both the model and the real server see it.
#[derive(Clone, Debug, PartialEq)]
pub enum Msg {
    /// `Join`.
    Join { epoch: u32 },
    /// `Grad`.
    Grad { base: u64, iteration: u64, seq: u64, nan: bool },
    /// `Delta`.
    Delta { round: u64, seq: u64, nan: bool },
    /// `Clock`.
    Clock { clock: u64, seq: u64, nan: bool },
    /// `Pull`.
    Pull { have: u64, min_clock: u64 },
    /// `Leave`.
    Leave,
}

/// A concrete input.
#[derive(Clone, Debug, PartialEq)]
pub enum Input {
    /// A message from a worker.
    Msg { from: u32, msg: Msg },
    /// The transport lost a worker.
    Lost { w: u32 },
    /// The deadline passed (`handle_timeout` at the current time).
    Timeout,
}

/// An event, reduced to what the models predict.
#[derive(Clone, Debug, PartialEq, Eq, PartialOrd, Ord)]
pub enum Ev {
    /// `Applied { worker, base, version }`.
    Applied(u32, u64, u64),
    /// `Dropped { worker, base, reason }`.
    Dropped(u32, u64, &'static str),
    /// `ModelUpdated { version, contributions }`.
    Updated(u64, u32),
    /// `WorkerLost`.
    Lost(u32),
    /// `WorkerJoined { worker, epoch }`.
    Joined(u32, u32),
}

/// What one input produced.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Step {
    /// `Ok` or the refusal's kind.
    pub verdict: String,
    /// Events, sorted.
    pub events: Vec<Ev>,
    /// Workers sent a model (SSP and WBSP pulls are compared), sorted; `u32::MAX` = all.
    pub models_to: Vec<u32>,
}

fn verdict(r: Result<(), Reject>) -> String {
    match r {
        Ok(()) => "Ok".into(),
        Err(e) => {
            let s = format!("{e:?}");
            s.split(|c: char| !c.is_alphanumeric()).next().unwrap_or("").to_string()
        }
    }
}

/// The membership and deduplication rules every protocol shares.
#[derive(Clone, Debug)]
pub struct Roster {
    n: u32,
    epoch: Vec<u32>,
    next_seq: Vec<u64>,
    joined: Vec<bool>,
    live: Vec<bool>,
}

impl Roster {
    /// `n` members, all live, none joined.
    pub fn new(n: u32) -> Self {
        let m = n as usize;
        Self { n, epoch: vec![0; m], next_seq: vec![0; m], joined: vec![false; m], live: vec![true; m] }
    }

    fn member(&self, w: u32) -> Result<usize, Reject> {
        if w < self.n { Ok(w as usize) } else { Err(Reject::UnknownWorker(WorkerId(w))) }
    }

    /// `Ok(fresh)`: whether the join is news (a `WorkerJoined`).
    fn check_join(&self, w: u32, e: u32) -> Result<bool, Reject> {
        let i = self.member(w)?;
        if self.joined[i] {
            if e < self.epoch[i] {
                return Err(Reject::StaleEpoch { worker: WorkerId(w), epoch: e });
            }
            return Ok(e > self.epoch[i] || !self.live[i]);
        }
        Ok(true)
    }

    fn commit_join(&mut self, w: u32, e: u32) {
        let i = w as usize;
        self.next_seq[i] = self.next_seq[i].max(first_seq(e));
        self.epoch[i] = e;
        self.joined[i] = true;
        self.live[i] = true;
    }

    /// The common answer to a join (the event; the model to the joiner is the caller's).
    fn join(&mut self, w: u32, e: u32, out: &mut Step) -> Result<(), Reject> {
        let fresh = self.check_join(w, e)?;
        self.commit_join(w, e);
        if fresh {
            out.events.push(Ev::Joined(w, e));
        }
        Ok(())
    }

    fn check_seq(&self, w: u32, seq: u64) -> Result<(), Reject> {
        let i = self.member(w)?;
        if seq >= self.next_seq[i] && seq != u64::MAX {
            Ok(())
        } else {
            Err(Reject::Duplicate { worker: WorkerId(w), seq })
        }
    }

    fn commit_seq(&mut self, w: u32, seq: u64) {
        self.next_seq[w as usize] = seq.saturating_add(1);
        self.live[w as usize] = true;
    }

    /// The screening every gradient-like message passes first: a new sequence number, finite
    /// values, a base not in the future.
    fn screen(&self, w: u32, seq: u64, nan: bool, base: u64, version: u64) -> Result<(), Reject> {
        self.check_seq(w, seq)?;
        not_finite(nan)?;
        future(base, version)
    }

    fn lose(&mut self, w: u32) -> bool {
        std::mem::replace(&mut self.live[w as usize], false)
    }

    fn live(&self, w: u32) -> bool {
        self.live.get(w as usize).copied().unwrap_or(false)
    }
}

fn not_finite(nan: bool) -> Result<(), Reject> {
    if nan { Err(Reject::NotFinite) } else { Ok(()) }
}

fn future(claimed: u64, current: u64) -> Result<(), Reject> {
    if claimed > current {
        Err(Reject::FutureVersion { claimed: Version(claimed), current: Version(current) })
    } else {
        Ok(())
    }
}

fn unexpected(kind: &'static str) -> Reject {
    Reject::Unexpected { kind }
}

/// A reference model of one protocol's server.
pub trait Model {
    /// The model's version.
    fn version(&self) -> u64;
    /// The version worker `w` computes on (grouped: its group's version).
    fn version_of(&self, w: u32) -> u64 {
        let _ = w;
        self.version()
    }
    /// The model's clock (SSP) or version, for `Pull`s.
    fn clock(&self) -> u64 {
        self.version()
    }
    /// Applies a message from a member (`Leave` and membership are handled by the driver).
    fn message(&mut self, now: u64, from: u32, msg: &Msg, out: &mut Step) -> Result<(), Reject>;
    /// The worker was lost (`was_live`: it was live until now).
    fn lost(&mut self, now: u64, w: u32, was_live: bool, out: &mut Step);
    /// A deadline passed at `now`.
    fn timeout(&mut self, now: u64, out: &mut Step) {
        let _ = (now, out);
    }
    /// The next deadline, when the model predicts one (ms); `None` when it does not compare.
    fn deadline(&self) -> Option<Option<u64>> {
        None
    }
    /// Whether the driver compares the models sent to workers.
    fn compares_models(&self) -> bool {
        false
    }
    /// The roster.
    fn roster(&mut self) -> &mut Roster;
    /// Gives the model what the real server chose (DBW's `k`).
    fn sync_with(&mut self, real: &AnyServer<f64, Vec<f64>>) {
        let _ = real;
    }
}

/// ASP: every admitted gradient is applied on arrival.
#[derive(Clone, Debug)]
pub struct AspModel {
    roster: Roster,
    version: u64,
}

impl AspModel {
    /// For `n` workers.
    pub fn new(n: u32) -> Self {
        Self { roster: Roster::new(n), version: 0 }
    }
}

impl Model for AspModel {
    fn version(&self) -> u64 {
        self.version
    }
    fn message(&mut self, _now: u64, from: u32, msg: &Msg, out: &mut Step) -> Result<(), Reject> {
        match *msg {
            Msg::Join { epoch } => self.roster.join(from, epoch, out),
            Msg::Grad { base, seq, nan, .. } => {
                self.roster.screen(from, seq, nan, base, self.version)?;
                self.roster.commit_seq(from, seq);
                self.version += 1;
                out.events.push(Ev::Applied(from, base, self.version));
                out.events.push(Ev::Updated(self.version, 1));
                Ok(())
            }
            _ => Err(unexpected("")),
        }
    }
    fn lost(&mut self, _now: u64, _w: u32, _was_live: bool, _out: &mut Step) {}
    fn roster(&mut self) -> &mut Roster {
        &mut self.roster
    }
}

/// BSP, static backup workers and DBW: one round per version, closed by its `k`-th distinct
/// gradient computed on the current version; older gradients are dropped as stale.
#[derive(Clone, Debug)]
pub struct SyncModel {
    roster: Roster,
    version: u64,
    k: usize,
    got: BTreeSet<u32>,
    dbw: bool,
}

impl SyncModel {
    /// `n` workers, rounds of `k`; `dbw`: `k` is read from the server before every input.
    pub fn new(n: u32, k: u32, dbw: bool) -> Self {
        Self { roster: Roster::new(n), version: 0, k: k as usize, got: BTreeSet::new(), dbw }
    }
}

impl SyncModel {
    /// Applies the round's gradients into the next version.
    fn close(&mut self, out: &mut Step) {
        let count = self.got.len() as u32;
        for w in std::mem::take(&mut self.got) {
            out.events.push(Ev::Applied(w, self.version, self.version + 1));
        }
        out.events.push(Ev::Updated(self.version + 1, count));
        self.version += 1;
    }
}

impl Model for SyncModel {
    fn version(&self) -> u64 {
        self.version
    }
    fn message(&mut self, _now: u64, from: u32, msg: &Msg, out: &mut Step) -> Result<(), Reject> {
        match *msg {
            Msg::Join { epoch } => self.roster.join(from, epoch, out),
            Msg::Grad { base, seq, nan, .. } => {
                self.roster.screen(from, seq, nan, base, self.version)?;
                if base == self.version && self.got.contains(&from) {
                    return Err(Reject::Duplicate { worker: WorkerId(from), seq });
                }
                self.roster.commit_seq(from, seq);
                if base < self.version {
                    out.events.push(Ev::Dropped(from, base, DropReason::Stale.name()));
                    return Ok(());
                }
                self.got.insert(from);
                if self.got.len() >= self.k {
                    self.close(out);
                }
                Ok(())
            }
            _ => Err(unexpected("")),
        }
    }
    /// DBW: a loss lowers the open round's `k` to what it holds plus one gradient from each
    /// live worker not in it, and closes it if it holds them (static `b` keeps its `k`).
    fn lost(&mut self, _now: u64, _w: u32, _was_live: bool, out: &mut Step) {
        if !self.dbw {
            return;
        }
        let open = (0..self.roster.n).filter(|w| self.roster.live(*w) && !self.got.contains(w)).count();
        let reachable = self.got.len() + open;
        if reachable == 0 || reachable >= self.k {
            return;
        }
        self.k = reachable;
        if self.got.len() >= self.k {
            self.close(out);
        }
    }
    fn roster(&mut self) -> &mut Roster {
        &mut self.roster
    }
    fn sync_with(&mut self, real: &AnyServer<f64, Vec<f64>>) {
        if let (true, AnyServer::Dbw(s)) = (self.dbw, real) {
            self.k = s.current_k() as usize;
        }
    }
}

/// WBSP: deltas are applied into the next version on arrival; the round closes when every
/// live worker uploaded (at least one delta in); a round deadline declares the missing
/// workers lost.
#[derive(Clone, Debug)]
pub struct WbspModel {
    roster: Roster,
    version: u64,
    got: BTreeSet<u32>,
    deltas: u32,
    started: Option<u64>,
    deadline: Option<u64>,
}

impl WbspModel {
    /// `n` workers, a round deadline of `deadline` ms.
    pub fn new(n: u32, deadline: Option<u64>) -> Self {
        Self { roster: Roster::new(n), version: 0, got: BTreeSet::new(), deltas: 0, started: None, deadline }
    }

    fn missing_live(&self) -> Option<u32> {
        (0..self.roster.n).find(|w| !self.got.contains(w) && self.roster.live(*w))
    }

    fn close_if_complete(&mut self, now: u64, out: &mut Step) {
        if self.deltas > 0 && self.missing_live().is_none() {
            self.version += 1;
            out.events.push(Ev::Updated(self.version, self.deltas));
            self.got.clear();
            self.deltas = 0;
            self.started = Some(now);
        }
    }
}

impl Model for WbspModel {
    fn version(&self) -> u64 {
        self.version
    }
    fn message(&mut self, now: u64, from: u32, msg: &Msg, out: &mut Step) -> Result<(), Reject> {
        match *msg {
            Msg::Join { epoch } => {
                self.roster.join(from, epoch, out)?;
                self.started.get_or_insert(now);
                out.models_to.push(from);
                Ok(())
            }
            Msg::Delta { round, seq, nan } => {
                self.roster.check_seq(from, seq)?;
                future(round, self.version)?;
                not_finite(nan)?;
                self.roster.commit_seq(from, seq);
                self.started.get_or_insert(now);
                self.got.insert(from);
                self.deltas += 1;
                out.events.push(Ev::Applied(from, round, self.version + 1));
                self.close_if_complete(now, out);
                Ok(())
            }
            Msg::Pull { have, .. } => {
                future(have, self.version)?;
                if have < self.version {
                    out.models_to.push(from);
                }
                Ok(())
            }
            _ => Err(unexpected("")),
        }
    }
    fn lost(&mut self, now: u64, _w: u32, was_live: bool, out: &mut Step) {
        if was_live {
            self.close_if_complete(now, out);
        }
    }
    fn timeout(&mut self, now: u64, out: &mut Step) {
        let Some(Some(at)) = self.deadline() else { return };
        if now < at {
            return;
        }
        while let Some(w) = self.missing_live() {
            self.roster.lose(w);
            out.events.push(Ev::Lost(w));
        }
        self.close_if_complete(now, out);
    }
    fn deadline(&self) -> Option<Option<u64>> {
        Some(match (self.deadline, self.started) {
            (Some(d), Some(s)) if self.missing_live().is_some() => Some(s + d),
            _ => None,
        })
    }
    fn compares_models(&self) -> bool {
        true
    }
    fn roster(&mut self) -> &mut Roster {
        &mut self.roster
    }
}

/// BAP without an iteration time limit: the `s + 1` iterations after the version are open;
/// a gradient for iteration `j` computed on `base` lags `j − 1 − base` and is dropped over
/// the bound when the lag exceeds `s` or `j` is not open; a gradient for a closed iteration
/// is dropped (as `WorkerLost` if its worker was missing when that iteration closed); the
/// head closes, in order, when it has a gradient from every live worker.
#[derive(Clone, Debug)]
pub struct BapModel {
    roster: Roster,
    version: u64,
    s: u64,
    /// Iteration → `(worker, lag)` received.
    slots: std::collections::BTreeMap<u64, Vec<(u32, u64)>>,
    /// Per worker: the last iteration that closed without it.
    missed: Vec<u64>,
}

impl BapModel {
    /// `n` workers, bound `s`.
    pub fn new(n: u32, s: u64) -> Self {
        Self { roster: Roster::new(n), version: 0, s, slots: Default::default(), missed: vec![0; n as usize] }
    }

    fn try_close(&mut self, out: &mut Step) {
        loop {
            let head = self.version + 1;
            let got = self.slots.get(&head).cloned().unwrap_or_default();
            let complete =
                !got.is_empty() && (0..self.roster.n).all(|w| !self.roster.live(w) || got.iter().any(|g| g.0 == w));
            if !complete {
                return;
            }
            self.slots.remove(&head);
            for (w, lag) in &got {
                out.events.push(Ev::Applied(*w, head - 1 - lag, head));
            }
            out.events.push(Ev::Updated(head, got.len() as u32));
            for w in 0..self.roster.n {
                if !got.iter().any(|g| g.0 == w) {
                    self.missed[w as usize] = head;
                }
            }
            self.version = head;
        }
    }
}

impl Model for BapModel {
    fn version(&self) -> u64 {
        self.version
    }
    fn message(&mut self, _now: u64, from: u32, msg: &Msg, out: &mut Step) -> Result<(), Reject> {
        match *msg {
            Msg::Join { epoch } => self.roster.join(from, epoch, out),
            Msg::Grad { base, iteration: j, seq, nan } => {
                self.roster.screen(from, seq, nan, base, self.version)?;
                if base >= j {
                    return Err(unexpected("Grad"));
                }
                let open = j > self.version && j - self.version - 1 < self.s + 1;
                if open && self.slots.get(&j).is_some_and(|g| g.iter().any(|x| x.0 == from)) {
                    return Err(Reject::Duplicate { worker: WorkerId(from), seq });
                }
                let lag = j - 1 - base;
                self.roster.commit_seq(from, seq);
                if j <= self.version {
                    let reason =
                        if self.missed[from as usize] >= j { DropReason::WorkerLost } else { DropReason::Stale };
                    out.events.push(Ev::Dropped(from, base, reason.name()));
                } else if open && lag <= self.s {
                    self.slots.entry(j).or_default().push((from, lag));
                    self.try_close(out);
                } else {
                    out.events.push(Ev::Dropped(from, base, DropReason::OverStalenessBound.name()));
                }
                Ok(())
            }
            Msg::Pull { have, min_clock } => {
                future(have, self.version)?;
                future(min_clock, self.version + 1 + self.s)?;
                Ok(())
            }
            _ => Err(unexpected("")),
        }
    }
    fn lost(&mut self, _now: u64, _w: u32, _was_live: bool, out: &mut Step) {
        self.try_close(out);
    }
    fn roster(&mut self) -> &mut Roster {
        &mut self.roster
    }
}

/// SSP: every clock update is applied on arrival; the server clock is the slowest live
/// worker's; a parked pull is answered once the server clock reached its `min_clock` and the
/// puller's own updates up to `min_clock + s` are in.
#[derive(Clone, Debug)]
pub struct SspModel {
    roster: Roster,
    version: u64,
    s: u64,
    clock: u64,
    clocks: Vec<u64>,
    pending: Vec<Option<u64>>,
    last_sent: Vec<u64>,
    own_since: Vec<u64>,
    epochs: Vec<Option<u32>>,
}

impl SspModel {
    /// `n` workers, staleness `s`.
    pub fn new(n: u32, s: u64) -> Self {
        let m = n as usize;
        Self {
            roster: Roster::new(n),
            version: 0,
            s,
            clock: 0,
            clocks: vec![0; m],
            pending: vec![None; m],
            last_sent: vec![0; m],
            own_since: vec![0; m],
            epochs: vec![None; m],
        }
    }

    fn send_model(&mut self, w: u32, out: &mut Step) {
        self.last_sent[w as usize] = self.version;
        self.own_since[w as usize] = 0;
        out.models_to.push(w);
    }

    fn advance(&mut self, out: &mut Step) {
        let min = (0..self.roster.n).filter(|w| self.roster.live(*w)).map(|w| self.clocks[w as usize]).min();
        self.clock = self.clock.max(min.unwrap_or(self.clock));
        for w in 0..self.roster.n {
            let i = w as usize;
            if let Some(m) = self.pending[i] {
                if self.clock >= m && self.clocks[i] >= m.saturating_add(self.s) {
                    self.pending[i] = None;
                    self.send_model(w, out);
                }
            }
        }
    }
}

impl Model for SspModel {
    fn version(&self) -> u64 {
        self.version
    }
    fn clock(&self) -> u64 {
        self.clock
    }
    fn message(&mut self, _now: u64, from: u32, msg: &Msg, out: &mut Step) -> Result<(), Reject> {
        let i = from as usize;
        match *msg {
            Msg::Join { epoch } => {
                self.roster.join(from, epoch, out)?;
                if self.epochs[i] == Some(epoch) {
                    self.clocks[i] = self.clocks[i].max(self.clock);
                } else {
                    self.clocks[i] = self.clock;
                    self.pending[i] = None;
                    self.epochs[i] = Some(epoch);
                }
                self.send_model(from, out);
                self.advance(out);
                Ok(())
            }
            Msg::Clock { clock, seq, nan } => {
                self.roster.check_seq(from, seq)?;
                not_finite(nan)?;
                if !self.roster.live(from) {
                    self.clocks[i] = self.clocks[i].max(self.clock);
                }
                let session = u32::try_from(seq >> 32).unwrap_or(u32::MAX);
                if self.epochs[i] != Some(session) {
                    self.epochs[i] = Some(session);
                    self.clocks[i] = self.clock;
                }
                self.roster.commit_seq(from, seq);
                let base = self.last_sent[i];
                self.version += 1;
                self.own_since[i] += 1;
                self.clocks[i] = self.clocks[i].max(clock.saturating_add(1));
                out.events.push(Ev::Applied(from, base, self.version));
                out.events.push(Ev::Updated(self.version, 1));
                self.advance(out);
                Ok(())
            }
            Msg::Pull { have, min_clock } => {
                future(have, self.version)?;
                self.pending[i] = Some(min_clock);
                self.advance(out);
                Ok(())
            }
            _ => Err(unexpected("")),
        }
    }
    fn lost(&mut self, _now: u64, w: u32, _was_live: bool, out: &mut Step) {
        self.pending[w as usize] = None;
        self.advance(out);
    }
    fn compares_models(&self) -> bool {
        true
    }
    fn roster(&mut self) -> &mut Roster {
        &mut self.roster
    }
}

/// The model of `config`'s protocol (grouped has none here).
pub fn model_for(config: &ProtocolConfig, real: &AnyServer<f64, Vec<f64>>) -> Option<Box<dyn Model>> {
    let n = config.workers();
    Some(match (config, real) {
        (ProtocolConfig::Asp(_), _) => Box::new(AspModel::new(n)),
        (ProtocolConfig::Bsp(_), _) => Box::new(SyncModel::new(n, n, false)),
        (ProtocolConfig::Backup(b), _) => Box::new(SyncModel::new(n, n - b.backup_workers, false)),
        (ProtocolConfig::Dbw(_), _) => Box::new(SyncModel::new(n, n, true)),
        (ProtocolConfig::Wbsp(w), _) => {
            Box::new(WbspModel::new(n, w.round_deadline.map(|d| d.as_nanos().div_ceil(1_000_000))))
        }
        (ProtocolConfig::Bap(_), AnyServer::Bap(s)) => Box::new(BapModel::new(n, s.s_bap())),
        (ProtocolConfig::Ssp(s), _) => Box::new(SspModel::new(n, s.staleness)),
        (ProtocolConfig::Grouped(g), _) if g.local_steps == 1 => Box::new(GroupedModel::new(g)),
        _ => return None,
    })
}

/// Grouped (one local step, `H = 1`; the composite server): BSP inside each group over all
/// its members (a lost member still counts, the group waits for it), ASP between the groups
/// and the central model. A group step closes with its last member's gradient computed on
/// the group's version: every member's gradient is applied into group version
/// `max(group version + 1, central version + 1)`, and the central version grows by one
/// (`ModelUpdated` carries the central version and the group's size). A gradient on an
/// older group version is dropped as stale; a group of one member that (re)joins with no
/// step open first takes the newest central model.
#[derive(Clone, Debug)]
pub struct GroupedModel {
    roster: Roster,
    /// The central version.
    version: u64,
    /// Each worker's group.
    group_of: Vec<usize>,
    /// Per group: its members' count.
    size: Vec<usize>,
    /// Per group: its version, as its members see it.
    group_version: Vec<u64>,
    /// Per group: the central version its model is based on.
    base: Vec<u64>,
    /// Per group: the members whose gradient for the open step is in.
    got: Vec<BTreeSet<u32>>,
}

impl GroupedModel {
    /// For `config` (its partition; `local_steps` must be 1).
    pub fn new(config: &syncopate::proto::grouped::GroupedConfig) -> Self {
        let (n, g) = (config.workers, config.groups);
        let group_of: Vec<usize> = (0..n).map(|w| config.partition.group_of(w, n, g) as usize).collect();
        let groups = g as usize;
        let mut size = vec![0; groups];
        for &x in &group_of {
            size[x] += 1;
        }
        Self {
            roster: Roster::new(n),
            version: 0,
            group_of,
            size,
            group_version: vec![0; groups],
            base: vec![0; groups],
            got: vec![BTreeSet::new(); groups],
        }
    }
}

impl Model for GroupedModel {
    fn version(&self) -> u64 {
        self.version
    }
    fn version_of(&self, w: u32) -> u64 {
        self.group_of.get(w as usize).map_or(self.version, |&g| self.group_version[g])
    }
    fn message(&mut self, _now: u64, from: u32, msg: &Msg, out: &mut Step) -> Result<(), Reject> {
        let g = self.group_of[from as usize];
        match *msg {
            Msg::Join { epoch } => {
                self.roster.check_join(from, epoch)?;
                if self.size[g] == 1 && self.got[g].is_empty() && self.version > self.base[g] {
                    self.base[g] = self.version;
                    self.group_version[g] = (self.group_version[g] + 1).max(self.version);
                }
                self.roster.join(from, epoch, out)
            }
            Msg::Grad { base, seq, nan, .. } => {
                self.roster.check_seq(from, seq)?;
                not_finite(nan)?;
                let gv = self.group_version[g];
                if base > gv {
                    return Err(Reject::FutureVersion { claimed: Version(base), current: Version(gv) });
                }
                if base == gv && self.got[g].contains(&from) {
                    return Err(Reject::Duplicate { worker: WorkerId(from), seq });
                }
                self.roster.commit_seq(from, seq);
                if base < gv {
                    out.events.push(Ev::Dropped(from, base, DropReason::Stale.name()));
                    return Ok(());
                }
                self.got[g].insert(from);
                if self.got[g].len() == self.size[g] {
                    self.version += 1;
                    let next = (gv + 1).max(self.version);
                    for w in std::mem::take(&mut self.got[g]) {
                        out.events.push(Ev::Applied(w, gv, next));
                    }
                    out.events.push(Ev::Updated(self.version, self.size[g] as u32));
                    self.group_version[g] = next;
                    self.base[g] = self.version;
                }
                Ok(())
            }
            _ => Err(unexpected("")),
        }
    }
    fn lost(&mut self, _now: u64, _w: u32, _was_live: bool, _out: &mut Step) {}
    fn roster(&mut self) -> &mut Roster {
        &mut self.roster
    }
}

/// Per worker: the session epoch, the next contribution index, the last contribution sent.
#[derive(Clone, Debug, Default)]
struct Sender {
    epoch: u32,
    next: u64,
    last: Option<Msg>,
    clock: u64,
}

/// What a set of runs exercised (so a test can show its sequences reach the interesting
/// states).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Coverage {
    /// Sequences run.
    pub runs: u64,
    /// Inputs fed.
    pub inputs: u64,
    /// The highest version reached.
    pub max_version: u64,
    /// Inputs refused.
    pub refused: u64,
    /// `Applied` events.
    pub applied: u64,
    /// `Dropped` events.
    pub dropped: u64,
    /// `WorkerLost` events.
    pub lost: u64,
}

/// Runs `ops` against the real server of `config` and its model; `Err` describes the first
/// disagreement (with the inputs so far).
pub fn run(config: &ProtocolConfig, ops: &[Op]) -> Result<Coverage, String> {
    let params: Vec<f64> = (0..DIM).map(|i| i as f64).collect();
    let scratch = vec![0.0; config.server_scratch_len(DIM).max(1)];
    let mut real = AnyServer::new(config, params, scratch).map_err(|e| format!("{e:?}"))?;
    let Some(mut model) = model_for(config, &real) else { return Err(format!("no model of {}", config.name())) };
    let mut cov = Coverage { runs: 1, ..Coverage::default() };
    let n = config.workers();
    let mut senders = vec![Sender { epoch: 1, ..Sender::default() }; n as usize + 1];
    let mut now_ms = 0u64;
    let mut log: Vec<Input> = Vec::new();
    let is = |c: &ProtocolConfig| match c {
        ProtocolConfig::Wbsp(_) => 1,
        ProtocolConfig::Ssp(_) => 2,
        ProtocolConfig::Bap(_) => 3,
        _ => 0,
    };
    let family = is(config);
    let mut last_version = 0u64;
    let mut counted = Ledger::default();
    for op in ops {
        now_ms += 1;
        let input = match *op {
            Op::Join { w, epoch } => {
                let s = &mut senders[w as usize];
                match epoch {
                    1 => {
                        s.epoch += 1;
                        s.next = 0;
                        s.clock = model.clock();
                    }
                    2 => {}
                    _ => {}
                }
                let e = if epoch == 2 { s.epoch.saturating_sub(1) } else { s.epoch };
                Input::Msg { from: u32::from(w), msg: Msg::Join { epoch: e } }
            }
            Op::Send { w, lag, ahead, future, nan } => {
                let v = model.version_of(u32::from(w));
                let s = &mut senders[w as usize];
                let seq = first_seq(s.epoch) + s.next;
                s.next += 1;
                let base = if future { v + 1 } else { v.saturating_sub(u64::from(lag)) };
                let msg = match family {
                    1 => Msg::Delta { round: base, seq, nan },
                    2 => {
                        let clock = s.clock;
                        s.clock += 1;
                        Msg::Clock { clock, seq, nan }
                    }
                    3 => Msg::Grad { base, iteration: v + 1 + u64::from(ahead), seq, nan },
                    _ => Msg::Grad { base, iteration: base + 1, seq, nan },
                };
                s.last = Some(msg.clone());
                Input::Msg { from: u32::from(w), msg }
            }
            Op::Replay { w } => match senders[w as usize].last.clone() {
                Some(msg) => Input::Msg { from: u32::from(w), msg },
                None => continue,
            },
            Op::Pull { w, lag, ahead } => {
                let have = model.version().saturating_sub(u64::from(lag));
                Input::Msg { from: u32::from(w), msg: Msg::Pull { have, min_clock: model.clock() + u64::from(ahead) } }
            }
            Op::Lost { w } => Input::Lost { w: u32::from(w) },
            Op::Leave { w } => Input::Msg { from: u32::from(w), msg: Msg::Leave },
            Op::Tick { ms } => {
                now_ms += u64::from(ms);
                Input::Timeout
            }
        };
        log.push(input.clone());
        model.sync_with(&real);
        let now = Instant::from_nanos(now_ms * 1_000_000);
        let mut want = Step::default();
        let result = match &input {
            Input::Msg { from, msg } => {
                let m = to_server(msg);
                let r = real.handle(now, WorkerId(*from), m.as_msg());
                let expected = match model.roster().member(*from) {
                    Err(e) => Err(e),
                    Ok(_) if *msg == Msg::Leave => {
                        let was = model.roster().lose(*from);
                        if was {
                            want.events.push(Ev::Lost(*from));
                        }
                        model.lost(now_ms, *from, was, &mut want);
                        Ok(())
                    }
                    Ok(_) => model.message(now_ms, *from, msg, &mut want),
                };
                want.verdict = verdict(expected);
                r
            }
            Input::Lost { w } => {
                let r = real.handle_worker_lost(now, WorkerId(*w));
                let expected = match model.roster().member(*w) {
                    Err(e) => Err(e),
                    Ok(_) => {
                        let was = model.roster().lose(*w);
                        if was {
                            want.events.push(Ev::Lost(*w));
                        }
                        model.lost(now_ms, *w, was, &mut want);
                        Ok(())
                    }
                };
                want.verdict = verdict(expected);
                r
            }
            Input::Timeout => {
                want.verdict = "Ok".into();
                if real.poll_timeout().is_some_and(|t| t <= now) {
                    real.handle_timeout(now);
                }
                model.timeout(now_ms, &mut want);
                Ok(())
            }
        };
        let mut got = Step { verdict: verdict(result), ..Step::default() };
        cov.inputs += 1;
        cov.refused += u64::from(result.is_err());
        while let Some(out) = real.poll_output() {
            match out {
                ServerOutput::Event(e) => {
                    if let Some(ev) = reduce(&e) {
                        got.events.push(ev);
                    }
                    counted_event(&mut counted, &e);
                }
                ServerOutput::Send { to, msg: ToWorker::Model { .. } } => got.models_to.push(match to {
                    Recipient::Worker(w) => w.0,
                    Recipient::AllWorkers => u32::MAX,
                }),
                ServerOutput::Send { .. } => {}
                ServerOutput::Upstream(m) => panic!("the server under test sent {} upstream", m.kind_name()),
            }
        }
        got.events.sort();
        want.events.sort();
        for e in &got.events {
            match e {
                Ev::Applied(..) => cov.applied += 1,
                Ev::Dropped(..) => cov.dropped += 1,
                Ev::Lost(_) => cov.lost += 1,
                _ => {}
            }
        }
        cov.max_version = cov.max_version.max(real.version().0);
        if !model.compares_models() {
            got.models_to.clear();
        }
        got.models_to.sort_unstable();
        want.models_to.sort_unstable();
        let mut problems = Vec::new();
        if got != want {
            problems.push(format!("real {got:?}\n  model {want:?}"));
        }
        if real.version().0 != model.version() {
            problems.push(format!("version: real {} model {}", real.version().0, model.version()));
        }
        if let Some(d) = model.deadline() {
            let real_d = real.poll_timeout().map(|t| t.saturating_duration_since(Instant::ZERO).as_nanos() / 1_000_000);
            if real_d != d {
                problems.push(format!("deadline: real {real_d:?} model {d:?}"));
            }
        }
        let st = *real.stats();
        match Ledger::from_server(&st) {
            Ok(l) if l.applied == counted.applied && l.dropped == counted.dropped => {}
            Ok(l) => problems.push(format!("counters {l:?} but events {counted:?}")),
            Err(e) => problems.push(e),
        }
        if real.version().0 < last_version {
            problems.push("version went down".into());
        }
        last_version = real.version().0;
        if !problems.is_empty() {
            let mut s =
                format!("{} after {} inputs:\n  {}\ninputs:\n", config.name(), log.len(), problems.join("\n  "));
            for i in &log {
                s.push_str(&format!("  {i:?}\n"));
            }
            return Err(s);
        }
    }
    Ok(cov)
}

fn counted_event(l: &mut Ledger, e: &ServerEvent) {
    match *e {
        ServerEvent::Applied { .. } => l.applied += 1,
        ServerEvent::Dropped { reason, .. } => l.add_dropped(reason, 1),
        _ => {}
    }
}

fn reduce(e: &ServerEvent) -> Option<Ev> {
    Some(match *e {
        ServerEvent::Applied { worker, base, version, .. } => Ev::Applied(worker.0, base.0, version.0),
        ServerEvent::Dropped { worker, base, reason } => Ev::Dropped(worker.0, base.0, reason.name()),
        ServerEvent::ModelUpdated { version, contributions, .. } => Ev::Updated(version.0, contributions),
        ServerEvent::WorkerLost { worker } => Ev::Lost(worker.0),
        ServerEvent::WorkerJoined { worker, epoch } => Ev::Joined(worker.0, epoch),
        _ => return None,
    })
}

/// Owned values for a message.
struct Owned {
    msg: Msg,
    values: [f64; DIM],
}

impl Owned {
    fn as_msg(&self) -> ToServer<'_, f64> {
        let values = Values::Slice(&self.values);
        match self.msg {
            Msg::Join { epoch } => ToServer::Join { epoch },
            Msg::Grad { base, iteration, seq, .. } => {
                ToServer::Grad { base: Version(base), iteration, seq, values, loss: None }
            }
            Msg::Delta { round, seq, .. } => {
                ToServer::Delta { round: Version(round), local_steps: 1, seq, values, loss: None }
            }
            Msg::Clock { clock, seq, .. } => ToServer::Clock { clock, seq, values, loss: None },
            Msg::Pull { have, min_clock } => ToServer::Pull { have: Version(have), min_clock },
            Msg::Leave => ToServer::Leave,
        }
    }
}

fn to_server(msg: &Msg) -> Owned {
    let nan = matches!(msg, Msg::Grad { nan: true, .. } | Msg::Delta { nan: true, .. } | Msg::Clock { nan: true, .. });
    let values = if nan { [f64::NAN, 1.0] } else { [1.0, -2.0] };
    Owned { msg: msg.clone(), values }
}

/// Runs `cases` generated sequences of up to `len` inputs (deterministic seed) against
/// `config`'s server and its model; the first disagreement, shrunk, as an error.
pub fn search(config: &ProtocolConfig, cases: u32, len: usize) -> Result<Coverage, String> {
    use proptest::test_runner::{Config, RngAlgorithm, TestCaseError, TestRng, TestRunner};
    let cfg = Config { cases, failure_persistence: None, ..Config::default() };
    let mut runner = TestRunner::new_with_rng(cfg, TestRng::deterministic_rng(RngAlgorithm::ChaCha));
    let config = *config;
    let total = std::cell::RefCell::new(Coverage::default());
    runner
        .run(&ops(config.workers(), len), |ops| {
            let c = run(&config, &ops).map_err(TestCaseError::fail)?;
            let mut t = total.borrow_mut();
            t.runs += c.runs;
            t.inputs += c.inputs;
            t.max_version = t.max_version.max(c.max_version);
            t.refused += c.refused;
            t.applied += c.applied;
            t.dropped += c.dropped;
            t.lost += c.lost;
            Ok(())
        })
        .map_err(|e| e.to_string())?;
    Ok(total.into_inner())
}
