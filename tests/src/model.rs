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

mod bap;
mod grouped;
mod run;
mod select;
mod ssp;
mod sync;
mod wbsp;

pub use bap::BapModel;
pub use grouped::GroupedModel;
pub use run::{Coverage, run, search};
pub use select::model_for;
pub use ssp::SspModel;
pub use sync::SyncModel;
pub use wbsp::WbspModel;

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
