//! Step-time traces: what `train --record-trace` writes and `compare --trace` / `advise`
//! replay. A CSV file with the header `worker,step,seconds`, one line per gradient step.

use crate::sim::ComputeModel;
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
    let mut out = std::io::BufWriter::new(out);
    writeln!(out, "worker,step,seconds")?;
    for s in steps {
        writeln!(out, "{},{},{:.9}", s.worker, s.step, s.seconds)?;
    }
    out.flush()
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
    let text = std::fs::read(path).map_err(|e| format!("{}: cannot open: {e}", path.display()))?;
    let mut steps = Vec::new();
    let line_count = text.split(|b| *b == b'\n').count();
    for (i, line) in BufReader::new(text.as_slice()).lines().enumerate() {
        let at = |what: String| format!("{} line {}: {what}", path.display(), i + 1);
        let line = line.map_err(|e| at(format!("cannot read: {e}")))?;
        let last = i + 1 == line_count;
        if last && !line.trim().is_empty() {
            return Err(at("the line has no end (the file looks truncated)".into()));
        }
        let line = line.trim();
        if line.is_empty() || (i == 0 && line.starts_with("worker")) {
            continue;
        }
        let fields: Vec<&str> = line.split(',').map(str::trim).collect();
        let [w, s, t] = fields[..] else {
            return Err(at(format!("expected worker,step,seconds, got {} fields", fields.len())));
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
        steps.push((i + 1, Step { worker, step, seconds }));
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

/// One replay model per worker (`Trace` of its step times in step order).
pub fn compute_models(steps: &[Step], workers: u32, source: &str) -> Result<Vec<ComputeModel>, String> {
    let mut per: Vec<Vec<(u64, f64)>> = vec![Vec::new(); workers as usize];
    for s in steps {
        let slot = per
            .get_mut(s.worker as usize)
            .ok_or_else(|| format!("{source}: worker {} is outside the scenario's {workers} workers", s.worker))?;
        slot.push((s.step, s.seconds));
    }
    per.into_iter()
        .enumerate()
        .map(|(i, mut v)| {
            if v.is_empty() {
                return Err(format!("{source}: no steps for worker {i} (the scenario has {workers} workers)"));
            }
            v.sort_by_key(|(step, _)| *step);
            Ok(ComputeModel::Trace(v.into_iter().map(|(_, t)| t).collect()))
        })
        .collect()
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
        let models = compute_models(&back, 2, "t").unwrap();
        assert_eq!(models[1], ComputeModel::Trace(vec![0.125, 0.5]));
        assert!(compute_models(&back, 3, "t").unwrap_err().contains("no steps for worker 2"));
        assert!(compute_models(&back, 1, "t").unwrap_err().contains("outside"));
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
