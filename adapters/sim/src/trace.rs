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

/// Writes `steps` as a trace file.
pub fn write(path: &Path, steps: &[Step]) -> Result<(), String> {
    let fail = |e: std::io::Error| format!("{}: cannot write the trace: {e}", path.display());
    let mut out = std::io::BufWriter::new(std::fs::File::create(path).map_err(fail)?);
    writeln!(out, "worker,step,seconds").map_err(fail)?;
    for s in steps {
        writeln!(out, "{},{},{:.9}", s.worker, s.step, s.seconds).map_err(fail)?;
    }
    out.flush().map_err(fail)
}

/// Reads a trace file.
pub fn read(path: &Path) -> Result<Vec<Step>, String> {
    let file = std::fs::File::open(path).map_err(|e| format!("{}: cannot open: {e}", path.display()))?;
    let mut steps = Vec::new();
    for (i, line) in BufReader::new(file).lines().enumerate() {
        let at = |what: String| format!("{} line {}: {what}", path.display(), i + 1);
        let line = line.map_err(|e| at(format!("cannot read: {e}")))?;
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
        let seconds: f64 = t.parse().map_err(|_| at(format!("seconds '{t}' is not a number")))?;
        if !(seconds.is_finite() && seconds >= 0.0) {
            return Err(at(format!("seconds '{t}' must be a non-negative number")));
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
        std::fs::remove_dir_all(&dir).unwrap();
    }
}
