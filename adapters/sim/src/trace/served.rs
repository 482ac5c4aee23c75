//! A trace recorded by a TCP server (`serve --record-trace`): the step times each worker
//! reports before its contributions (the transport's step-times message), with the
//! gradient columns the server can measure itself.
//!
//! Every reported step is a row, numbered per worker in arrival order. The last row of a
//! contribution carries its reported loss (a gradient's minibatch loss; the mean over a WBSP
//! delta's or an SSP clock's steps). A gradient's row also carries its norm and the norm of
//! the mean of every gradient computed on the same model version (the gradient at a larger
//! batch on the same model, which the noise-scale estimate needs). A contribution that
//! comes without step times (from a worker that did not send them) adds no row and is
//! counted in [`ServedTrace::without_times`].

use super::{GradientGroups, GradientStats, MAX_STEP_SECONDS, MIN_STEP_SECONDS, Step};
use std::path::Path;
use syncopate::{ToServer, WorkerId};

/// The memory the open gradient groups may take, in bytes: the number of groups open at
/// once is this over one model-sized `f64` sum (at least 2, at most
/// [`GradientGroups::MAX_OPEN`]).
pub const GROUP_MEMORY: usize = 64 << 20;

/// The rows recorded so far (see the module docs).
#[derive(Debug)]
pub struct ServedTrace {
    steps: Vec<Step>,
    stats: Vec<GradientStats>,
    /// Per worker: its next step's index.
    next_step: Vec<u64>,
    groups: GradientGroups<usize>,
    scratch: Vec<f32>,
    /// Contributions that came without step times (no row).
    pub without_times: u64,
}

impl ServedTrace {
    /// An empty trace of `workers` workers of a model of `dim` parameters.
    pub fn new(workers: u32, dim: usize) -> Self {
        let open = (GROUP_MEMORY / (8 * dim.max(1))).clamp(2, GradientGroups::<usize>::MAX_OPEN);
        Self {
            steps: Vec::new(),
            stats: Vec::new(),
            next_step: vec![0; workers as usize],
            groups: GradientGroups::with_max_open(open),
            scratch: Vec::new(),
            without_times: 0,
        }
    }

    /// Records `worker`'s contribution `msg` and the times of the steps it holds. Messages
    /// that are not contributions, and workers outside the run, are ignored.
    pub fn record(&mut self, worker: WorkerId, msg: &ToServer<'_, f32>, step_seconds: &[f32]) {
        if !matches!(msg, ToServer::Grad { .. } | ToServer::Delta { .. } | ToServer::Clock { .. }) {
            return;
        }
        let Some(next) = self.next_step.get_mut(worker.index()) else {
            return;
        };
        if step_seconds.is_empty() {
            self.without_times += 1;
            return;
        }
        for &s in step_seconds {
            self.steps.push(Step {
                worker: worker.0,
                step: *next,
                seconds: f64::from(s).clamp(MIN_STEP_SECONDS, MAX_STEP_SECONDS),
            });
            self.stats.push(GradientStats::default());
            *next += 1;
        }
        let row = self.stats.len() - 1;
        let loss = msg.loss().filter(|l| l.is_finite()).map(f64::from);
        if let Some(last) = self.stats.last_mut() {
            last.loss = loss;
        }
        if let ToServer::Grad { base, values, .. } = msg {
            self.scratch.resize(values.len(), 0.0);
            if values.copy_into(&mut self.scratch).is_ok() && self.scratch.iter().all(|v| v.is_finite()) {
                if let Some(last) = self.stats.last_mut() {
                    last.grad_norm = Some(super::norm(&self.scratch));
                }
                self.groups.add(row, base.0, &self.scratch);
            }
        }
    }

    /// The rows recorded so far.
    pub fn len(&self) -> usize {
        self.steps.len()
    }

    /// Whether no row was recorded.
    pub fn is_empty(&self) -> bool {
        self.steps.is_empty()
    }

    /// The rows, each with its gradient columns (the mean norms filled in).
    pub fn finish(mut self) -> (Vec<Step>, Vec<GradientStats>) {
        for (row, mean_norm, of) in std::mem::take(&mut self.groups).finish() {
            if let Some(g) = self.stats.get_mut(row) {
                g.mean_norm = Some(mean_norm);
                g.mean_of = of;
            }
        }
        (self.steps, self.stats)
    }

    /// Writes the trace into `file` (opened with [`super::create`]); `path` names it in
    /// errors.
    pub fn write_to(self, file: std::fs::File, path: &Path) -> Result<(), String> {
        let (steps, stats) = self.finish();
        let stats = if stats.iter().all(GradientStats::is_empty) { Vec::new() } else { stats };
        super::write_with_stats_to(file, path, &steps, &stats)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use syncopate::Version;
    use syncopate::msg::Values;

    fn grad(base: u64, values: &[f32], loss: Option<f32>) -> ToServer<'_, f32> {
        ToServer::Grad { base: Version(base), iteration: 0, seq: 1, values: Values::Slice(values), loss }
    }

    #[test]
    fn steps_become_rows_and_gradients_on_one_model_share_their_mean_norm() {
        let mut t = ServedTrace::new(2, 2);
        t.record(WorkerId(0), &grad(0, &[3.0, 4.0], Some(1.5)), &[0.02]);
        t.record(WorkerId(1), &grad(0, &[1.0, 0.0], Some(0.5)), &[0.03]);
        t.record(WorkerId(0), &grad(1, &[0.0, 2.0], None), &[0.01, 0.04]);
        t.record(WorkerId(1), &grad(1, &[0.0, 2.0], None), &[]);
        t.record(WorkerId(7), &grad(1, &[0.0, 2.0], None), &[0.01]);
        t.record(WorkerId(0), &ToServer::Pull { have: Version(0), min_clock: 0 }, &[0.01]);
        assert_eq!((t.len(), t.without_times), (4, 1));
        let (steps, stats) = t.finish();
        let rows: Vec<(u32, u64, f64)> = steps.iter().map(|s| (s.worker, s.step, s.seconds)).collect();
        assert_eq!(
            rows,
            [(0, 0, 0.02f32 as f64), (1, 0, 0.03f32 as f64), (0, 1, 0.01f32 as f64), (0, 2, 0.04f32 as f64)]
        );
        assert_eq!((stats[0].loss, stats[0].grad_norm), (Some(1.5), Some(5.0)));
        // The mean of (3, 4) and (1, 0) is (2, 2).
        assert_eq!((stats[0].mean_norm, stats[0].mean_of), (Some(8f64.sqrt()), 2));
        assert_eq!((stats[1].mean_norm, stats[1].mean_of), (Some(8f64.sqrt()), 2));
        assert!(stats[2].is_empty(), "an earlier step of a contribution has no gradient of its own");
        assert_eq!((stats[3].loss, stats[3].grad_norm, stats[3].mean_of), (None, Some(2.0), 1));
    }

    #[test]
    fn a_trace_written_reads_back_with_its_columns() {
        let path = std::env::temp_dir().join(format!("syncopate-served-trace-{}.csv", std::process::id()));
        let mut t = ServedTrace::new(1, 1);
        t.record(WorkerId(0), &grad(0, &[2.0], Some(0.25)), &[0.5]);
        t.record(WorkerId(0), &grad(1, &[1.0], Some(0.125)), &[1e-9]);
        t.write_to(super::super::create(&path).unwrap(), &path).unwrap();
        let back = super::super::read_lines_with_stats(&path).unwrap();
        std::fs::remove_file(&path).unwrap();
        assert_eq!(back.len(), 2);
        assert_eq!(back[0].1.seconds, 0.5);
        assert_eq!(back[1].1.seconds, MIN_STEP_SECONDS, "a step shorter than a trace holds is raised to the least");
        assert_eq!((back[0].2.loss, back[0].2.grad_norm, back[0].2.mean_of), (Some(0.25), Some(2.0), 1));
    }
}
