//! WBSP: the reference model of rounds closed by the last live uploader, with a deadline.

use super::*;

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
