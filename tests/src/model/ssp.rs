//! SSP: the reference model of per-worker clocks and parked pulls.

use super::*;

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
