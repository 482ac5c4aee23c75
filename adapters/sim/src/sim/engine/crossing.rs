//! When the run first reached its target accuracy, whatever the evaluation interval.

use crate::workload::{Scratch, Workload};

/// Finds the first published model that reaches the target: every model the server
/// publishes (the model standing when virtual time moves on) is kept (a copy of its parameters) until the target is reached, and checked in
/// publication order, in batches of [`Crossing::CAPACITY`] or at once when an evaluation
/// reaches the target. The time to target is then the time of the first model at or above
/// it, the same whatever the evaluation interval; each model is evaluated at most once, and
/// none after the target is reached.
#[derive(Debug, Default)]
pub(super) struct Crossing {
    /// (virtual seconds, version, parameters) of each model since the last evaluation.
    models: Vec<(f64, u64, Vec<f32>)>,
    /// Parameter buffers for reuse.
    spare: Vec<Vec<f32>>,
    /// The version of the last model kept.
    version: Option<u64>,
}

impl Crossing {
    /// Models kept before they are checked in place.
    const CAPACITY: usize = 32;

    /// Keeps the server's model if its version is new; checks the kept models once there
    /// are [`Self::CAPACITY`] of them, returning the first that reaches `target`.
    pub(super) fn record(
        &mut self,
        version: u64,
        time_s: f64,
        params: &[f32],
        workload: &Workload,
        target: f64,
        scratch: &mut Scratch,
    ) -> Option<(f64, u64)> {
        if self.version == Some(version) {
            return None;
        }
        self.version = Some(version);
        let mut buffer = self.spare.pop().unwrap_or_default();
        buffer.clear();
        buffer.extend_from_slice(params);
        self.models.push((time_s, version, buffer));
        if self.models.len() < Self::CAPACITY {
            return None;
        }
        let found = self.first_reaching(workload, target, scratch);
        self.clear();
        found
    }

    /// The first kept model whose test accuracy reaches `target`, as (seconds, version).
    pub(super) fn first_reaching(&self, workload: &Workload, target: f64, scratch: &mut Scratch) -> Option<(f64, u64)> {
        self.models.iter().find_map(|(t, v, params)| {
            let e = workload.model.evaluate_with(params, &workload.test, scratch);
            (e.accuracy >= target).then_some((*t, *v))
        })
    }

    /// Forgets the kept models (their buffers are reused).
    pub(super) fn clear(&mut self) {
        self.spare.extend(self.models.drain(..).map(|(_, _, p)| p));
    }
}
