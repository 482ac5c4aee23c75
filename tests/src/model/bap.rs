//! BAP: the reference model of the open iterations and their bound.

use super::*;

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
