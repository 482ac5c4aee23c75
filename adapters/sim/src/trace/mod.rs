//! Step-time traces: what `train --record-trace` writes and `compare --trace` / `advise`
//! replay. A CSV file with the header `worker,step,seconds`, one line per gradient step.
//!
//! A recorded run may add four columns, `loss,grad_norm,mean_norm,mean_of` (the header
//! names them; any of them may be empty on a line): the worker's minibatch loss, the L2 norm
//! of its gradient, and the L2 norm of the mean of the `mean_of` gradients computed on the
//! same model as this one (this one included). Gradients at two batch sizes on the same
//! model are what [`crate::advise::noise_estimate`] needs to estimate the model's gradient
//! noise scale. A trace without those columns reads as before.
//!
//! [`served`] records such a trace from what a TCP server's workers send
//! (`serve --record-trace`).

pub mod served;

use std::io::{BufRead, BufReader, Write};
use std::path::Path;

/// One recorded step.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct Step {
    /// The worker's id.
    pub worker: u32,
    /// The step's index on that worker.
    pub step: u64,
    /// How long it took.
    pub seconds: f64,
}

/// What a recorded step's gradient measured: a trace's optional columns.
#[derive(Clone, Copy, Debug, Default, PartialEq, serde::Serialize)]
pub struct GradientStats {
    /// The worker's loss on the step's minibatch, if known.
    pub loss: Option<f64>,
    /// The L2 norm of the worker's gradient, if known.
    pub grad_norm: Option<f64>,
    /// The L2 norm of the mean of the [`GradientStats::mean_of`] gradients computed on the
    /// same model as this one (this one included), if known.
    pub mean_norm: Option<f64>,
    /// How many gradients [`GradientStats::mean_norm`] averages (0: unknown).
    pub mean_of: u32,
}

impl GradientStats {
    /// Whether no column is known.
    pub fn is_empty(&self) -> bool {
        self.loss.is_none() && self.grad_norm.is_none() && self.mean_norm.is_none() && self.mean_of == 0
    }
}

/// The header of a trace with gradient columns.
pub const HEADER_WITH_GRADIENTS: &str = "worker,step,seconds,loss,grad_norm,mean_norm,mean_of";

/// The L2 norm of `values`, summed in `f64`.
pub fn norm(values: &[f32]) -> f64 {
    values.iter().map(|&v| f64::from(v) * f64::from(v)).sum::<f64>().sqrt()
}

/// A key naming the model `params` bit for bit (FNV-1a of the bits): gradients with equal
/// keys were computed on the same model.
pub fn model_key(params: &[f32]) -> u64 {
    params.iter().fold(0xcbf2_9ce4_8422_2325u64, |h, p| {
        p.to_bits().to_le_bytes().iter().fold(h, |h, &b| (h ^ u64::from(b)).wrapping_mul(0x0100_0000_01b3))
    })
}

/// Groups the gradients a run records by the model they were computed on (its
/// [`model_key`]) and gives each recorded row (named by an `R` of the recorder's choice) the
/// norm of its group's mean: the gradient at a larger batch on the same model. At most
/// [`GradientGroups::MAX_OPEN`] groups are open at once; a gradient on a new model then
/// closes the oldest group (later gradients on that model start a new one), so memory stays
/// bounded by that many model-sized sums ([`GradientGroups::with_max_open`] sets another
/// bound).
#[derive(Debug)]
pub struct GradientGroups<R = usize> {
    open: std::collections::VecDeque<OpenGroup<R>>,
    closed: Vec<(R, f64, u32)>,
    max_open: usize,
}

impl<R> Default for GradientGroups<R> {
    fn default() -> Self {
        Self::with_max_open(Self::MAX_OPEN)
    }
}

#[derive(Debug)]
struct OpenGroup<R> {
    key: u64,
    sum: Vec<f64>,
    rows: Vec<R>,
}

impl<R> GradientGroups<R> {
    /// The most groups open at once by default.
    pub const MAX_OPEN: usize = 64;

    /// Groups of which at most `max_open` (at least 1) are open at once: the memory bound is
    /// that many model-sized `f64` sums.
    pub fn with_max_open(max_open: usize) -> Self {
        Self { open: std::collections::VecDeque::new(), closed: Vec::new(), max_open: max_open.max(1) }
    }

    /// Adds the gradient `grad` of recorded row `row`, computed on the model with key `key`.
    pub fn add(&mut self, row: R, key: u64, grad: &[f32]) {
        let at = match self.open.iter().position(|g| g.key == key) {
            Some(at) => at,
            None => {
                if self.open.len() >= self.max_open {
                    if let Some(oldest) = self.open.pop_front() {
                        self.close(oldest);
                    }
                }
                self.open.push_back(OpenGroup { key, sum: vec![0.0; grad.len()], rows: Vec::new() });
                self.open.len() - 1
            }
        };
        if let Some(g) = self.open.get_mut(at) {
            g.sum.iter_mut().zip(grad).for_each(|(s, &v)| *s += f64::from(v));
            g.rows.push(row);
        }
    }

    fn close(&mut self, g: OpenGroup<R>) {
        let k = g.rows.len().max(1) as f64;
        let mean_norm = g.sum.iter().map(|s| (s / k) * (s / k)).sum::<f64>().sqrt();
        let count = g.rows.len() as u32;
        self.closed.extend(g.rows.into_iter().map(|r| (r, mean_norm, count)));
    }

    /// Closes every group but the `keep` newest (later gradients on a closed group's model
    /// start a new group).
    pub fn close_all_but(&mut self, keep: usize) {
        while self.open.len() > keep {
            if let Some(g) = self.open.pop_front() {
                self.close(g);
            }
        }
    }

    /// The rows of the groups closed so far (each once), with their group's mean norm and
    /// size.
    pub fn take_closed(&mut self) -> Vec<(R, f64, u32)> {
        std::mem::take(&mut self.closed)
    }

    /// Whether any group is open.
    pub fn is_open(&self) -> bool {
        !self.open.is_empty()
    }

    /// Closes every group: each recorded row with its group's mean norm and size.
    pub fn finish(mut self) -> Vec<(R, f64, u32)> {
        while let Some(g) = self.open.pop_front() {
            self.close(g);
        }
        self.closed
    }
}

/// The shortest step a trace may hold: 1 µs. Shorter (or zero) steps are not measurements,
/// and replaying them would let a simulation do unbounded work in no virtual time.
pub const MIN_STEP_SECONDS: f64 = 1e-6;
/// The longest step time a trace may hold: one day (a longer one is a unit mistake or a
/// worker that died, and would make every derived budget astronomical).
pub const MAX_STEP_SECONDS: f64 = 86_400.0;

/// Creates (truncates) the trace file at `path` now, so that an unwritable path is refused
/// before a run rather than after it.
pub fn create(path: &Path) -> Result<std::fs::File, String> {
    std::fs::File::create(path).map_err(|e| format!("{}: cannot create the trace file: {e}", path.display()))
}

/// Writes `steps` as a trace file.
pub fn write(path: &Path, steps: &[Step]) -> Result<(), String> {
    write_to(create(path)?, path, steps)
}

/// Writes `steps` as a trace into `file` (opened with [`create`]); `path` names it in errors.
pub fn write_to(file: std::fs::File, path: &Path, steps: &[Step]) -> Result<(), String> {
    write_csv(file, steps).map_err(|e| format!("{}: cannot write the trace: {e}", path.display()))
}

/// Writes `steps` as trace CSV (a header, then `worker,step,seconds` lines) to `out`,
/// buffered, and flushes it.
pub fn write_csv(out: impl Write, steps: &[Step]) -> std::io::Result<()> {
    write_csv_with(out, steps, &[])
}

/// [`write_csv`] with the gradient columns of `stats` (row for row with `steps`) when it is
/// not empty.
pub fn write_csv_with(out: impl Write, steps: &[Step], stats: &[GradientStats]) -> std::io::Result<()> {
    let mut out = std::io::BufWriter::new(out);
    if stats.is_empty() {
        writeln!(out, "worker,step,seconds")?;
        for s in steps {
            writeln!(out, "{},{},{:.9}", s.worker, s.step, s.seconds)?;
        }
        return out.flush();
    }
    writeln!(out, "{HEADER_WITH_GRADIENTS}")?;
    for (s, g) in steps.iter().zip(stats.iter().copied().chain(std::iter::repeat(GradientStats::default()))) {
        out.write_all(row_with_gradients(s, &g).as_bytes())?;
    }
    out.flush()
}

/// One line (with its newline) of a trace with gradient columns.
pub(crate) fn row_with_gradients(s: &Step, g: &GradientStats) -> String {
    let field = |v: Option<f64>| v.map_or(String::new(), |v| format!("{v:e}"));
    let of = if g.mean_of > 0 { g.mean_of.to_string() } else { String::new() };
    format!(
        "{},{},{:.9},{},{},{},{of}\n",
        s.worker,
        s.step,
        s.seconds,
        field(g.loss),
        field(g.grad_norm),
        field(g.mean_norm)
    )
}

/// Writes `steps` with their gradient columns `stats` as a trace into `file` (opened with
/// [`create`]); `path` names it in errors.
pub fn write_with_stats_to(
    file: std::fs::File,
    path: &Path,
    steps: &[Step],
    stats: &[GradientStats],
) -> Result<(), String> {
    write_csv_with(file, steps, stats).map_err(|e| format!("{}: cannot write the trace: {e}", path.display()))
}

/// Whether `text` is a whole decimal number with digits on both sides of any point and
/// after any exponent (`0.25`, `3`, `2.5e-3`): a number cut short (`0.`, `1e`, `.5`) is not.
fn is_complete_number(text: &str) -> bool {
    let digits = |s: &str| !s.is_empty() && s.bytes().all(|b| b.is_ascii_digit());
    let (mantissa, exponent) = match text.split_once(['e', 'E']) {
        Some((m, e)) => (m, Some(e.strip_prefix(['+', '-']).unwrap_or(e))),
        None => (text, None),
    };
    let mantissa_ok = match mantissa.split_once('.') {
        Some((int, frac)) => digits(int) && digits(frac),
        None => digits(mantissa),
    };
    mantissa_ok && exponent.is_none_or(digits)
}

/// Reads a trace file. Every line must be complete (a file cut mid-line is refused), and
/// every step time a positive number of seconds of at least [`MIN_STEP_SECONDS`]. The
/// steps must form a full table (see [`check_table`]): refused otherwise, with the file, the
/// line and the reason.
pub fn read(path: &Path) -> Result<Vec<Step>, String> {
    let lines = read_lines(path)?;
    check_table(&lines, &path.display().to_string(), false)?;
    Ok(lines.into_iter().map(|(_, s)| s).collect())
}

/// Reads a trace file line by line: every step with its line number (1-based), checking
/// each line on its own (fields, numbers, step times) but not the table they form.
pub fn read_lines(path: &Path) -> Result<Vec<(usize, Step)>, String> {
    Ok(read_lines_with_stats(path)?.into_iter().map(|(line, step, _)| (line, step)).collect())
}

/// Reads a trace's gradient columns: `(step, stats)` for every line that has any (none for
/// a trace without them).
pub fn read_gradient_stats(path: &Path) -> Result<Vec<(Step, GradientStats)>, String> {
    Ok(read_lines_with_stats(path)?
        .into_iter()
        .filter(|(_, _, g)| !g.is_empty())
        .map(|(_, step, g)| (step, g))
        .collect())
}

/// An optional finite number of a gradient column (a norm: also non-negative); empty is
/// unknown.
fn optional_column(text: &str, name: &str, norm: bool) -> Result<Option<f64>, String> {
    if text.is_empty() {
        return Ok(None);
    }
    match text.parse::<f64>() {
        Ok(v) if v.is_finite() && (v >= 0.0 || !norm) => Ok(Some(v)),
        _ if norm => Err(format!("{name} '{text}' is not a norm (a finite non-negative number)")),
        _ => Err(format!("{name} '{text}' is not a finite number")),
    }
}

/// [`read_lines`] with each line's gradient columns (all unknown in a trace without them).
pub fn read_lines_with_stats(path: &Path) -> Result<Vec<(usize, Step, GradientStats)>, String> {
    let text = std::fs::read(path).map_err(|e| format!("{}: cannot open: {e}", path.display()))?;
    let mut steps = Vec::new();
    let line_count = text.split(|b| *b == b'\n').count();
    let mut with_gradients = false;
    for (i, line) in BufReader::new(text.as_slice()).lines().enumerate() {
        let at = |what: String| format!("{} line {}: {what}", path.display(), i + 1);
        let line = line.map_err(|e| at(format!("cannot read: {e}")))?;
        let last = i + 1 == line_count;
        if last && !line.trim().is_empty() {
            return Err(at("the line has no end (the file looks truncated)".into()));
        }
        let line = line.trim();
        if i == 0 && line.starts_with("worker") {
            let header: Vec<&str> = line.split(',').map(str::trim).collect();
            with_gradients = header.len() > 3;
            if with_gradients && header.join(",") != HEADER_WITH_GRADIENTS {
                return Err(at(format!(
                    "the header '{line}' is neither worker,step,seconds nor {HEADER_WITH_GRADIENTS}"
                )));
            }
            continue;
        }
        if line.is_empty() {
            continue;
        }
        let fields: Vec<&str> = line.split(',').map(str::trim).collect();
        let (w, s, t, rest) = match (with_gradients, &fields[..]) {
            (false, &[w, s, t]) => (w, s, t, None),
            (true, &[w, s, t, loss, norm, mean, of]) => (w, s, t, Some([loss, norm, mean, of])),
            (false, _) => {
                return Err(at(format!("expected worker,step,seconds, got {} fields", fields.len())));
            }
            (true, _) => {
                return Err(at(format!("expected {HEADER_WITH_GRADIENTS}, got {} fields", fields.len())));
            }
        };
        let worker = w.parse().map_err(|_| at(format!("worker '{w}' is not a whole number")))?;
        let step = s.parse().map_err(|_| at(format!("step '{s}' is not a whole number")))?;
        if !is_complete_number(t.strip_prefix('-').unwrap_or(t)) {
            return Err(at(format!("seconds '{t}' is not a complete number (e.g. 0.0125)")));
        }
        let seconds: f64 = t.parse().map_err(|_| at(format!("seconds '{t}' is not a number")))?;
        if !(seconds.is_finite() && (MIN_STEP_SECONDS..=MAX_STEP_SECONDS).contains(&seconds)) {
            return Err(at(format!(
                "seconds '{t}' is not a step time: each step must take from {MIN_STEP_SECONDS} s (1 µs) to {MAX_STEP_SECONDS} s (a day)"
            )));
        }
        let stats = match rest {
            None => GradientStats::default(),
            Some([loss, norm, mean, of]) => GradientStats {
                loss: optional_column(loss, "loss", false).map_err(at)?,
                grad_norm: optional_column(norm, "grad_norm", true).map_err(at)?,
                mean_norm: optional_column(mean, "mean_norm", true).map_err(at)?,
                mean_of: if of.is_empty() {
                    0
                } else {
                    of.parse().map_err(|_| at(format!("mean_of '{of}' is not a whole number")))?
                },
            },
        };
        steps.push((i + 1, Step { worker, step, seconds }, stats));
    }
    if steps.is_empty() {
        return Err(format!("{}: the trace has no steps", path.display()));
    }
    Ok(steps)
}

/// Checks that `lines` (steps with their line numbers, from [`read_lines`]) form a full
/// table: workers `0..n` each with steps `0..S`, every (worker, step) once. Refused, naming
/// `source`, the line and the reason: a duplicate (worker, step), a gap in a worker's steps,
/// a missing worker, and (unless `truncate`) workers with unequal step counts. With
/// `truncate`, the policy for unequal counts is to keep every worker's first `S` steps, `S`
/// the shortest worker's count (as `advise --truncate` documents); the steps beyond are
/// dropped by [`truncate_to_shortest`]. Returns `(n, S)`.
pub fn check_table(lines: &[(usize, Step)], source: &str, truncate: bool) -> Result<(u32, u64), String> {
    use std::collections::BTreeMap;
    let mut seen: BTreeMap<(u32, u64), usize> = BTreeMap::new();
    for &(line, s) in lines {
        if let Some(first) = seen.insert((s.worker, s.step), line) {
            return Err(format!(
                "{source} line {line}: worker {} step {} is a duplicate of line {first}",
                s.worker, s.step
            ));
        }
    }
    let workers = lines.iter().map(|(_, s)| s.worker).max().map_or(0, |w| w.saturating_add(1));
    if workers as usize > syncopate::MAX_WORKERS {
        return Err(format!(
            "{source}: worker {} is beyond the {} workers a run may have",
            workers - 1,
            syncopate::MAX_WORKERS
        ));
    }
    let mut counts = Vec::with_capacity(workers as usize);
    for w in 0..workers {
        let mut expected = 0u64;
        for (&(_, step), &line) in seen.range((w, 0)..=(w, u64::MAX)) {
            if step != expected {
                return Err(format!(
                    "{source} line {line}: worker {w} step {step} follows a gap: steps {expected}..{step} are missing"
                ));
            }
            expected += 1;
        }
        if expected == 0 {
            return Err(format!(
                "{source}: no steps for worker {w} (workers 0..{workers} appear; each needs its own steps)"
            ));
        }
        counts.push(expected);
    }
    let shortest = counts.iter().copied().min().unwrap_or(0);
    let longest = counts.iter().copied().max().unwrap_or(0);
    if shortest != longest && !truncate {
        let short = counts.iter().position(|&c| c == shortest).unwrap_or(0) as u32;
        let long = counts.iter().position(|&c| c == longest).unwrap_or(0) as u32;
        let line = seen.get(&(long, shortest)).copied().unwrap_or(0);
        return Err(format!(
            "{source} line {line}: worker {long} has {longest} steps but worker {short} only {shortest}: unequal step counts (advise --truncate keeps every worker's first {shortest})"
        ));
    }
    Ok((workers, shortest))
}

/// Keeps every worker's steps below `steps` (the policy of [`check_table`] with `truncate`).
pub fn truncate_to_shortest(lines: Vec<(usize, Step)>, steps: u64) -> Vec<Step> {
    lines.into_iter().map(|(_, s)| s).filter(|s| s.step < steps).collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn round_trip_and_errors() {
        let dir = std::env::temp_dir().join(format!("syncopate-trace-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let path = dir.join("t.csv");
        let steps = [
            Step { worker: 1, step: 1, seconds: 0.5 },
            Step { worker: 0, step: 0, seconds: 0.25 },
            Step { worker: 1, step: 0, seconds: 0.125 },
            Step { worker: 0, step: 1, seconds: 0.75 },
        ];
        write(&path, &steps).unwrap();
        let back = read(&path).unwrap();
        assert_eq!(back, steps);
        std::fs::write(&path, "worker,step,seconds\n0,0,abc\n").unwrap();
        let e = read(&path).unwrap_err();
        assert!(e.contains("line 2: seconds 'abc'"), "{e}");
        std::fs::write(&path, "0,1\n").unwrap();
        assert!(read(&path).unwrap_err().contains("line 1: expected worker,step,seconds"));
        for (text, needle) in [
            ("worker,step,seconds\n0,0,0.5\n7,301,0.", "line 3: the line has no end"),
            ("worker,step,seconds\n7,301,0.\n", "line 2: seconds '0.' is not a complete number"),
            ("worker,step,seconds\n0,0,1e\n", "line 2: seconds '1e' is not a complete number"),
            ("worker,step,seconds\n0,0,.5\n", "line 2: seconds '.5' is not a complete number"),
            ("worker,step,seconds\n0,0,0\n", "line 2: seconds '0' is not a step time"),
            ("worker,step,seconds\n0,0,-0.5\n", "line 2: seconds '-0.5' is not a step time"),
            ("worker,step,seconds\n0,0,1e300\n", "line 2: seconds '1e300' is not a step time"),
            ("worker,step,seconds\n0,0,1e-9\n", "line 2: seconds '1e-9' is not a step time"),
        ] {
            std::fs::write(&path, text).unwrap();
            let e = read(&path).unwrap_err();
            assert!(e.contains(needle) && e.contains("t.csv"), "{text:?}: {e}");
        }
        std::fs::write(&path, "worker,step,seconds\n0,0,2.5e-3\n0,1,3\n").unwrap();
        assert_eq!(read(&path).unwrap().len(), 2);
        std::fs::remove_dir_all(&dir).unwrap();
    }

    /// Gradient columns round-trip (empty fields are unknown), a trace without them reads
    /// as before, and a wrong header or a negative norm is refused with the line.
    #[test]
    fn gradient_columns_round_trip_and_bad_ones_are_refused() {
        let dir = std::env::temp_dir().join(format!("syncopate-trace-grad-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let path = dir.join("g.csv");
        let steps = [Step { worker: 0, step: 0, seconds: 0.5 }, Step { worker: 1, step: 0, seconds: 0.25 }];
        let stats = [
            GradientStats { loss: Some(-1.5), grad_norm: Some(3.0), mean_norm: Some(2.0), mean_of: 2 },
            GradientStats { loss: None, grad_norm: Some(0.125), mean_norm: None, mean_of: 0 },
        ];
        let file = create(&path).unwrap();
        write_with_stats_to(file, &path, &steps, &stats).unwrap();
        let text = std::fs::read_to_string(&path).unwrap();
        assert!(text.starts_with(HEADER_WITH_GRADIENTS), "{text}");
        assert_eq!(read(&path).unwrap(), steps);
        let back = read_gradient_stats(&path).unwrap();
        assert_eq!(back, vec![(steps[0], stats[0]), (steps[1], stats[1])]);
        write(&path, &steps).unwrap();
        assert!(read_gradient_stats(&path).unwrap().is_empty());
        for (text, needle) in [
            ("worker,step,seconds,loss\n0,0,0.5,1\n", "line 1: the header 'worker,step,seconds,loss' is neither"),
            (&format!("{HEADER_WITH_GRADIENTS}\n0,0,0.5,1,2\n"), "line 2: expected worker,step,seconds,loss"),
            (&format!("{HEADER_WITH_GRADIENTS}\n0,0,0.5,1,-2,1,2\n"), "line 2: grad_norm '-2' is not a norm"),
            (&format!("{HEADER_WITH_GRADIENTS}\n0,0,0.5,inf,2,1,2\n"), "line 2: loss 'inf' is not a finite number"),
            (&format!("{HEADER_WITH_GRADIENTS}\n0,0,0.5,1,2,1,x\n"), "line 2: mean_of 'x' is not a whole number"),
        ] {
            std::fs::write(&path, text).unwrap();
            let e = read(&path).unwrap_err();
            assert!(e.contains(needle), "{text:?}: {e}");
        }
        std::fs::remove_dir_all(&dir).unwrap();
    }

    /// Gradients on one model form a group whose mean norm every row gets; a model that
    /// does not fit among the open groups closes the oldest.
    #[test]
    fn gradient_groups_give_each_row_its_models_mean() {
        let (a, b) = (model_key(&[1.0, 2.0]), model_key(&[1.0, 2.5]));
        assert_ne!(a, b);
        let mut groups = GradientGroups::default();
        groups.add(0, a, &[3.0, 0.0]);
        groups.add(1, b, &[1.0, 1.0]);
        groups.add(2, a, &[1.0, 0.0]);
        let mut rows = groups.finish();
        rows.sort_by_key(|r| r.0);
        assert_eq!(rows, vec![(0, 2.0, 2), (1, 2f64.sqrt(), 1), (2, 2.0, 2)]);
        let mut groups = GradientGroups::default();
        for row in 0..=GradientGroups::<usize>::MAX_OPEN {
            groups.add(row, row as u64, &[1.0]);
        }
        // Model 0's group was closed to make room: a later gradient on it starts a new one.
        groups.add(100, 0, &[3.0]);
        let rows = groups.finish();
        assert_eq!(rows.iter().find(|r| r.0 == 0), Some(&(0, 1.0, 1)));
        assert_eq!(rows.iter().find(|r| r.0 == 100), Some(&(100, 3.0, 1)));
        assert_eq!(norm(&[3.0, 4.0]), 5.0);
    }

    /// Each way a trace fails to be a full table is refused with the file, the line and the
    /// reason; `truncate` is the documented policy for unequal counts.
    #[test]
    fn tables_with_duplicates_gaps_missing_workers_or_unequal_counts_are_refused() {
        let dir = std::env::temp_dir().join(format!("syncopate-table-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let path = dir.join("t.csv");
        let h = "worker,step,seconds\n";
        for (body, needle) in [
            ("0,0,0.1\n0,1,0.1\n1,0,0.1\n0,1,0.2\n1,1,0.1\n", "line 5: worker 0 step 1 is a duplicate of line 3"),
            (
                "0,0,0.1\n0,1,0.1\n0,3,0.1\n1,0,0.1\n1,1,0.1\n1,2,0.1\n",
                "line 4: worker 0 step 3 follows a gap: steps 2..3",
            ),
            ("0,1,0.1\n1,0,0.1\n", "line 2: worker 0 step 1 follows a gap: steps 0..1"),
            ("0,0,0.1\n2,0,0.1\n", "no steps for worker 1"),
            ("0,0,0.1\n0,1,0.1\n1,0,0.1\n", "line 3: worker 0 has 2 steps but worker 1 only 1: unequal step counts"),
            ("0,0,abc\n", "line 2: seconds 'abc' is not a complete number"),
            ("0,0,-1\n", "line 2: seconds '-1' is not a step time"),
            ("0,0,0\n", "line 2: seconds '0' is not a step time"),
        ] {
            std::fs::write(&path, format!("{h}{body}")).unwrap();
            let e = read(&path).unwrap_err();
            assert!(e.contains(needle) && e.starts_with(&path.display().to_string()), "{body:?}: {e}");
        }
        std::fs::write(&path, format!("{h}0,0,0.1\n0,1,0.2\n1,0,0.3\n")).unwrap();
        let lines = read_lines(&path).unwrap();
        assert_eq!(check_table(&lines, "t", true).unwrap(), (2, 1));
        let kept = truncate_to_shortest(lines, 1);
        assert_eq!(kept.len(), 2);
        assert!(kept.iter().all(|s| s.step == 0));
        std::fs::remove_dir_all(&dir).unwrap();
    }
}
