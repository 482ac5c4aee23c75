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
    let fail = |e: std::io::Error| format!("{}: cannot write the trace: {e}", path.display());
    let mut out = std::io::BufWriter::new(file);
    writeln!(out, "worker,step,seconds").map_err(fail)?;
    for s in steps {
        writeln!(out, "{},{},{:.9}", s.worker, s.step, s.seconds).map_err(fail)?;
    }
    out.flush().map_err(fail)
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
/// every step time a positive number of seconds of at least [`MIN_STEP_SECONDS`].
pub fn read(path: &Path) -> Result<Vec<Step>, String> {
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
        if !is_complete_number(t) {
            return Err(at(format!("seconds '{t}' is not a complete number (e.g. 0.0125)")));
        }
        let seconds: f64 = t.parse().map_err(|_| at(format!("seconds '{t}' is not a number")))?;
        if !(seconds.is_finite() && seconds >= MIN_STEP_SECONDS) {
            return Err(at(format!(
                "seconds '{t}' is not a step time: each step must take at least {MIN_STEP_SECONDS} s (1 µs)"
            )));
        }
        steps.push(Step { worker, step, seconds });
    }
    if steps.is_empty() {
        return Err(format!("{}: the trace has no steps", path.display()));
    }
    Ok(steps)
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
            ("worker,step,seconds\n0,0,-0.5\n", "line 2: seconds '-0.5' is not a complete number"),
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
}
