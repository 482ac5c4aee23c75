//! Checkpoints and their journal: the model written after every `every`-th update (before
//! the new model is sent to anyone) and at the end of a run, and between checkpoints a
//! journal of the versions made and the contributions each applied per worker, so that a
//! resumed run can say exactly what was lost (see [`checkpoint`]).

use crate::tcp::checkpoint::{self, Journal, Stamp, Totals};
use std::collections::BTreeMap;
use std::path::PathBuf;
use syncopate::{ServerEvent, Version};

/// The checkpoint file, its period and its journal.
pub(super) struct Persist {
    path: PathBuf,
    every: u64,
    /// `None` if the journal could not be started (its error was logged).
    journal: Option<Journal>,
    workers: usize,
    /// Applied contributions per worker of versions not yet made.
    applied: BTreeMap<u64, Vec<u64>>,
    /// Versions made since the journal was last written, with their contributions.
    made: Vec<(Version, Vec<u64>)>,
    /// An update asked for a checkpoint.
    due: bool,
    /// The run the checkpoints name, and what it accepted before this server started.
    stamp: Stamp,
}

impl Persist {
    /// Checkpoints to `path` every `every` updates of a run of `workers` workers at
    /// `version`, each named by `stamp`; the journal starts now (an error starting it is
    /// returned to be logged, and the checkpoints go on without one).
    pub(super) fn new(
        path: PathBuf,
        every: u64,
        workers: usize,
        version: Version,
        stamp: Stamp,
    ) -> (Self, Option<String>) {
        let run = stamp.identity.as_ref().map(|i| i.run.clone()).unwrap_or_default();
        let (journal, error) = match Journal::start(&path, version, &Totals::default(), &run) {
            Ok(j) => (Some(j), None),
            Err(e) => (None, Some(e.to_string())),
        };
        let persist =
            Self { path, every, journal, workers, applied: BTreeMap::new(), made: Vec::new(), due: false, stamp };
        (persist, error)
    }

    /// Takes in a protocol event: applied contributions are counted per worker until their
    /// version is made; a made version goes to the journal at the next [`flush`](Self::flush),
    /// and every `every`-th one makes a checkpoint due.
    pub(super) fn event(&mut self, ev: &ServerEvent) {
        match *ev {
            ServerEvent::Applied { worker, version, .. } if self.journal.is_some() => {
                let row = self.applied.entry(version.0).or_insert_with(|| vec![0; self.workers]);
                if let Some(c) = row.get_mut(worker.index()) {
                    *c += 1;
                }
            }
            ServerEvent::ModelUpdated { version, .. } => {
                if self.journal.is_some() {
                    let row = self.applied.remove(&version.0).unwrap_or_else(|| vec![0; self.workers]);
                    self.applied.retain(|v, _| *v > version.0);
                    self.made.push((version, row));
                }
                if self.every > 0 && version.0 % self.every == 0 {
                    self.due = true;
                }
            }
            _ => {}
        }
    }

    /// Writes the versions made since the last flush to the journal, with the run's
    /// `totals`; returns the errors to log.
    pub(super) fn flush(&mut self, totals: &Totals) -> Vec<String> {
        let made = core::mem::take(&mut self.made);
        let Some(j) = self.journal.as_mut() else {
            return Vec::new();
        };
        made.iter()
            .filter_map(|(version, by_worker)| j.update(*version, by_worker, totals).err())
            .map(|e| e.to_string())
            .collect()
    }

    /// Whether a checkpoint is due (and no longer, once asked).
    pub(super) fn take_due(&mut self) -> bool {
        core::mem::take(&mut self.due)
    }

    /// Writes a checkpoint of `params` at `version` for protocol `name` (with the update rule
    /// and its state, if it keeps any; `accepted` gradients in this session) and restarts the journal from
    /// it: `Err` if the checkpoint was not written, `Ok(Some(error))` if it was but the
    /// journal could not restart.
    #[allow(clippy::too_many_arguments)]
    pub(super) fn save(
        &mut self,
        name: &str,
        version: Version,
        params: &[f32],
        rule: Option<(syncopate::proto::Optimizer, &[f32])>,
        accepted: u64,
        totals: &Totals,
    ) -> Result<Option<String>, String> {
        checkpoint::save_stamped(&self.path, name, version, params, rule, &self.stamp, accepted)
            .map_err(|e| e.to_string())?;
        Ok(self.journal.as_mut().and_then(|j| j.restart(version, totals).err()).map(|e| e.to_string()))
    }
}
