//! The trace as a table of step times per worker, and its summary.

use super::stats;
use crate::sim::ComputeModel;
use crate::trace::Step;
use serde::Serialize;

/// A trace as a table: `times[w][k]` is worker `w`'s step `k`, in seconds.
#[derive(Clone, Debug, PartialEq)]
pub struct TraceTable {
    /// Workers.
    pub workers: u32,
    /// Steps per worker.
    pub steps: usize,
    /// Step times per worker.
    pub times: Vec<Vec<f64>>,
}

impl TraceTable {
    /// The table of `steps`, which must be a full table (as [`crate::trace::read`] checks).
    pub fn from_steps(steps: &[Step]) -> Result<Self, String> {
        let workers = steps.iter().map(|s| s.worker).max().map_or(0, |w| w + 1);
        let per = steps.iter().map(|s| s.step).max().map_or(0, |s| s + 1) as usize;
        let mut times = vec![vec![f64::NAN; per]; workers as usize];
        for s in steps {
            if let Some(slot) = times.get_mut(s.worker as usize).and_then(|v| v.get_mut(s.step as usize)) {
                *slot = s.seconds;
            }
        }
        if workers == 0 || times.iter().flatten().any(|t| t.is_nan()) {
            return Err("the trace is not a full table of workers and steps".into());
        }
        Ok(Self { workers, steps: per, times })
    }

    /// The median step time over every worker and step.
    pub fn median_step(&self) -> f64 {
        stats::median(&self.times.iter().flatten().copied().collect::<Vec<_>>())
    }

    /// Steps `from..until` of every worker.
    pub fn slice(&self, from: usize, until: usize) -> Self {
        let times: Vec<Vec<f64>> = self.times.iter().map(|v| v[from..until].to_vec()).collect();
        Self { workers: self.workers, steps: until - from, times }
    }

    /// How long BSP takes to replay the whole trace (compute only): `Σ_k max_w t[w][k]`.
    pub fn bsp_duration(&self) -> f64 {
        (0..self.steps).map(|k| self.times.iter().map(|v| v[k]).fold(0.0, f64::max)).sum()
    }

    /// The replay model of every worker.
    pub fn compute(&self) -> Vec<ComputeModel> {
        self.times.iter().map(|v| ComputeModel::Trace(v.clone())).collect()
    }

    /// Per step: the level `ln(median_w t)` and the spread `ln(max_w t / median_w t)`.
    pub fn level_and_spread(&self) -> (Vec<f64>, Vec<f64>) {
        (0..self.steps)
            .map(|k| {
                let col: Vec<f64> = self.times.iter().map(|v| v[k]).collect();
                let med = stats::median(&col);
                let max = col.iter().copied().fold(0.0, f64::max);
                (med.ln(), (max / med).ln())
            })
            .unzip()
    }
}

/// A short description of a trace.
#[derive(Clone, Debug, Serialize)]
pub struct TraceSummary {
    /// Workers.
    pub workers: u32,
    /// Steps per worker.
    pub steps: usize,
    /// The median step.
    pub median_step_s: f64,
    /// The 90th percentile step.
    pub p90_step_s: f64,
    /// The slowest step.
    pub max_step_s: f64,
    /// The slowest worker's mean step over the median worker's.
    pub slowest_worker_ratio: f64,
    /// Seconds BSP needs to replay the whole trace.
    pub bsp_replay_s: f64,
}

impl TraceSummary {
    /// The summary of `trace`.
    pub fn of(trace: &TraceTable) -> Self {
        let mut all: Vec<f64> = trace.times.iter().flatten().copied().collect();
        all.sort_by(f64::total_cmp);
        let p90 = all.get(((all.len() as f64 * 0.9) as usize).min(all.len().saturating_sub(1))).copied();
        let means: Vec<f64> = trace.times.iter().map(|v| v.iter().sum::<f64>() / v.len().max(1) as f64).collect();
        let slowest = means.iter().copied().fold(0.0, f64::max);
        Self {
            workers: trace.workers,
            steps: trace.steps,
            median_step_s: trace.median_step(),
            p90_step_s: p90.unwrap_or(f64::NAN),
            max_step_s: all.last().copied().unwrap_or(f64::NAN),
            slowest_worker_ratio: slowest / stats::median(&means),
            bsp_replay_s: trace.bsp_duration(),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_table_needs_every_worker_and_step() {
        let steps = super::super::tracegen::generate(super::super::tracegen::Kind::Uniform, 3, 10, 0.01, 1);
        let t = TraceTable::from_steps(&steps).unwrap();
        assert_eq!((t.workers, t.steps), (3, 10));
        assert!(TraceTable::from_steps(&steps[1..]).is_err());
        assert_eq!(t.slice(2, 5).steps, 3);
    }
}
