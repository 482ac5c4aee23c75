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
//!
//! **Written as it goes** ([`ServedTrace::write_as_you_go`]): the header at once, then the
//! rows in arrival order as their columns become final, buffered and written whole lines at
//! a time at least every [`FLUSH_EVERY`], at [`ServedTrace::flush`], and all of them at
//! [`ServedTrace::flush_all`] (the server calls it at every checkpoint). A row's mean norm is
//! final when its version's group closes: at each write every group but the newest is
//! closed, so a gradient that arrives later on an older version starts a new group (its
//! `mean_of` says how many gradients the mean holds). A server killed while recording
//! leaves every row written up to its last write: each worker's first steps, whole lines,
//! readable with `advise --truncate`.

use super::{GradientGroups, GradientStats, MAX_STEP_SECONDS, MIN_STEP_SECONDS, Step};
use std::collections::VecDeque;
use std::io::Write;
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};
use syncopate::{ToServer, WorkerId};

/// The memory the open gradient groups may take, in bytes: the number of groups open at
/// once is this over one model-sized `f64` sum (at least 2, at most
/// [`GradientGroups::MAX_OPEN`]).
pub const GROUP_MEMORY: usize = 64 << 20;

/// The longest a recorded row waits in memory before it is written (once final).
pub const FLUSH_EVERY: Duration = Duration::from_secs(2);

/// Where rows go as they are recorded.
#[derive(Debug)]
struct Sink {
    file: std::fs::File,
    path: PathBuf,
    last: Instant,
    /// The first write error (nothing is written after it).
    error: Option<String>,
}

/// A row not yet written: its step, its columns, and whether it waits for its group's
/// mean norm.
#[derive(Debug)]
struct Row {
    step: Step,
    stats: GradientStats,
    waiting: bool,
}

/// The rows recorded so far (see the module docs).
#[derive(Debug)]
pub struct ServedTrace {
    /// Rows not yet written, in arrival order; the first is row number `written`.
    rows: VecDeque<Row>,
    written: usize,
    /// Per worker: its next step's index.
    next_step: Vec<u64>,
    groups: GradientGroups<usize>,
    scratch: Vec<f32>,
    sink: Option<Sink>,
    /// Contributions that came without step times (no row).
    pub without_times: u64,
}

impl ServedTrace {
    /// An empty trace of `workers` workers of a model of `dim` parameters, kept in memory
    /// until [`Self::write_to`] (or written as it goes after [`Self::write_as_you_go`]).
    pub fn new(workers: u32, dim: usize) -> Self {
        let open = (GROUP_MEMORY / (8 * dim.max(1))).clamp(2, GradientGroups::<usize>::MAX_OPEN);
        Self {
            rows: VecDeque::new(),
            written: 0,
            next_step: vec![0; workers as usize],
            groups: GradientGroups::with_max_open(open),
            scratch: Vec::new(),
            sink: None,
            without_times: 0,
        }
    }

    /// From now on rows go to `file` (opened with [`super::create`]; `path` names it in
    /// errors) as they become final: the header now, the rows at least every
    /// [`FLUSH_EVERY`], the rest at [`Self::close`].
    pub fn write_as_you_go(&mut self, mut file: std::fs::File, path: &Path) -> Result<(), String> {
        writeln!(file, "{}", super::HEADER_WITH_GRADIENTS)
            .map_err(|e| format!("{}: cannot write the trace: {e}", path.display()))?;
        self.sink = Some(Sink { file, path: path.to_owned(), last: Instant::now(), error: None });
        self.flush();
        Ok(())
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
            let seconds = f64::from(s).clamp(MIN_STEP_SECONDS, MAX_STEP_SECONDS);
            let step = Step { worker: worker.0, step: *next, seconds };
            self.rows.push_back(Row { step, stats: GradientStats::default(), waiting: false });
            *next += 1;
        }
        let row = self.len() - 1;
        let loss = msg.loss().filter(|l| l.is_finite()).map(f64::from);
        if let Some(last) = self.rows.back_mut() {
            last.stats.loss = loss;
        }
        if let ToServer::Grad { base, values, .. } = msg {
            self.scratch.resize(values.len(), 0.0);
            if values.copy_into(&mut self.scratch).is_ok() && self.scratch.iter().all(|v| v.is_finite()) {
                if let Some(last) = self.rows.back_mut() {
                    last.stats.grad_norm = Some(super::norm(&self.scratch));
                    last.waiting = true;
                }
                self.groups.add(row, base.0, &self.scratch);
            }
        }
        self.take_closed();
        self.tick();
    }

    /// Writes what is final if the last write was [`FLUSH_EVERY`] ago or more (call it
    /// now and then when no contribution comes).
    pub fn tick(&mut self) {
        if self.sink.as_ref().is_some_and(|s| s.last.elapsed() >= FLUSH_EVERY) {
            self.flush();
        }
    }

    /// Gives the rows of closed groups their mean norms.
    fn take_closed(&mut self) {
        let closed = self.groups.take_closed();
        self.settle(closed);
    }

    /// Gives the `closed` rows (row number, mean norm, group size) their columns.
    fn settle(&mut self, closed: Vec<(usize, f64, u32)>) {
        for (row, mean_norm, of) in closed {
            if let Some(r) = row.checked_sub(self.written).and_then(|i| self.rows.get_mut(i)) {
                r.stats.mean_norm = Some(mean_norm);
                r.stats.mean_of = of;
                r.waiting = false;
            }
        }
    }

    /// Writes every row whose columns are final (closing every gradient group but the
    /// newest first) when rows go to a file; nothing otherwise.
    pub fn flush(&mut self) {
        if self.sink.is_none() {
            return;
        }
        self.groups.close_all_but(1);
        self.take_closed();
        self.write_final();
    }

    /// Writes every row recorded so far, closing every gradient group (a checkpoint was
    /// written: the trace holds every step the model in it has seen). A gradient that
    /// arrives later on one of their versions starts a new group.
    pub fn flush_all(&mut self) {
        if self.sink.is_none() {
            return;
        }
        self.groups.close_all_but(0);
        self.take_closed();
        self.write_final();
    }

    /// Writes the leading rows that wait for nothing, whole lines in one write.
    fn write_final(&mut self) {
        let Some(sink) = self.sink.as_mut() else { return };
        sink.last = Instant::now();
        let ready = self.rows.iter().take_while(|r| !r.waiting).count();
        if ready == 0 || sink.error.is_some() {
            return;
        }
        let mut text = String::new();
        for r in self.rows.drain(..ready) {
            text.push_str(&super::row_with_gradients(&r.step, &r.stats));
        }
        self.written += ready;
        if let Err(e) = sink.file.write_all(text.as_bytes()) {
            sink.error = Some(format!("{}: cannot write the trace: {e}", sink.path.display()));
        }
    }

    /// Ends a trace written as it goes: closes every group and writes the remaining rows.
    pub fn close(mut self) -> Result<(), String> {
        let closed = std::mem::take(&mut self.groups).finish();
        self.settle(closed);
        self.write_final();
        match self.sink.take() {
            Some(Sink { error: Some(e), .. }) => Err(e),
            Some(Sink { file, path, .. }) => {
                file.sync_all().map_err(|e| format!("{}: cannot write the trace: {e}", path.display()))
            }
            None => Ok(()),
        }
    }

    /// The rows recorded so far (written or not).
    pub fn len(&self) -> usize {
        self.written + self.rows.len()
    }

    /// Whether no row was recorded.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// The rows not yet written, each with its gradient columns (the mean norms filled
    /// in): every row of a trace kept in memory.
    pub fn finish(mut self) -> (Vec<Step>, Vec<GradientStats>) {
        let closed = std::mem::take(&mut self.groups).finish();
        self.settle(closed);
        self.rows.into_iter().map(|r| (r.step, r.stats)).unzip()
    }

    /// Writes a trace kept in memory into `file` (opened with [`super::create`]); `path`
    /// names it in errors.
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

    #[test]
    fn a_trace_written_as_it_goes_holds_its_final_rows_before_it_is_closed() {
        let path = std::env::temp_dir().join(format!("syncopate-served-stream-{}.csv", std::process::id()));
        let mut t = ServedTrace::new(2, 2);
        t.write_as_you_go(super::super::create(&path).unwrap(), &path).unwrap();
        t.record(WorkerId(0), &grad(0, &[3.0, 4.0], Some(1.5)), &[0.02]);
        t.record(WorkerId(1), &grad(0, &[1.0, 0.0], Some(0.5)), &[0.03]);
        t.record(WorkerId(0), &grad(1, &[0.0, 2.0], None), &[0.01, 0.04]);
        // Version 0's group closes at the write; version 1's stays open, and with it the
        // last row, while the row before it (no gradient of its own) is final.
        t.flush();
        let back = super::super::read_lines_with_stats(&path).unwrap();
        let rows: Vec<(u32, u64)> = back.iter().map(|(_, s, _)| (s.worker, s.step)).collect();
        assert_eq!(rows, [(0, 0), (1, 0), (0, 1)], "written before the end");
        assert_eq!((back[0].2.mean_norm, back[0].2.mean_of), (Some(8f64.sqrt()), 2));
        // A late gradient on version 0 starts a group of its own.
        t.record(WorkerId(1), &grad(0, &[1.0, 0.0], None), &[0.05]);
        assert_eq!(t.len(), 5);
        t.close().unwrap();
        let back = super::super::read_lines_with_stats(&path).unwrap();
        std::fs::remove_file(&path).unwrap();
        let rows: Vec<(u32, u64, u32)> = back.iter().map(|(_, s, g)| (s.worker, s.step, g.mean_of)).collect();
        assert_eq!(rows, [(0, 0, 2), (1, 0, 2), (0, 1, 0), (0, 2, 1), (1, 1, 1)]);
    }
}
