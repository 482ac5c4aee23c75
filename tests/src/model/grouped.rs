//! Grouped (one local step): the reference model of BSP inside groups and ASP between them.

use super::*;

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
