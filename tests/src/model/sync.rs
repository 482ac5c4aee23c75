//! BSP, static backup workers and DBW: the reference model of a round closed by its `k`-th gradient.

use super::*;

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
