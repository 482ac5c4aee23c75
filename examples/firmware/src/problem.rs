//! The problem the firmware trains: least squares `min_x (1/2m)‖A x − b‖²` with `d = 1024`
//! unknowns and `m = 64` rows, 8 rows per worker. `A`'s entries are random signs scaled
//! by 1/8 (row norm² 16), regenerated from a seeded integer generator whenever a row is
//! needed, never stored: the firmware keeps only `b` (64 numbers). `b = A x*` for a hidden
//! `x*` with entries in `{−1, −7/8, …, 1}`, so the system is consistent and the minimum
//! loss is 0; training starts from `x = 0`.
//!
//! Worker `i` holds rows `8i..8i+8` and computes the gradient of its share,
//! `g_i = (1/8) A_iᵀ (A_i x − b_i)`; the mean of all eight is the gradient of the loss.

use crate::rng::Rng;
use crate::{DIM, ROWS_PER_WORKER, WORKERS};

/// Every entry of `A` is `±SCALE`.
const SCALE: f32 = 0.125;
/// Generator stream of `x*` (rows use streams `1..=m`).
const SOLUTION_STREAM: u64 = 0;

/// Residuals `A_i x − b_i` of one worker's rows at the model a job started from.
pub type Residuals = [f32; ROWS_PER_WORKER];

/// The least-squares problem of one seed.
#[derive(Clone, Debug)]
pub struct Problem {
    seed: u64,
    /// `b`, by worker and row.
    targets: [Residuals; WORKERS],
}

impl Problem {
    /// The problem of `seed`.
    pub fn new(seed: u64) -> Self {
        let mut problem = Self { seed, targets: [[0.0; ROWS_PER_WORKER]; WORKERS] };
        for worker in 0..WORKERS {
            for row in 0..ROWS_PER_WORKER {
                let mut solution = Rng::new(seed, SOLUTION_STREAM);
                let b = problem.row_fold(worker, row, |sum, sign, _| {
                    let x = ((solution.next_u64() % 17) as f32 - 8.0) / 8.0;
                    sum + sign * x
                });
                if let Some(t) = problem.targets.get_mut(worker).and_then(|rows| rows.get_mut(row)) {
                    *t = b * SCALE;
                }
            }
        }
        problem
    }

    /// Rows in the whole problem.
    pub const fn rows() -> usize {
        WORKERS * ROWS_PER_WORKER
    }

    /// Folds `f(acc, sign, k)` over row `row` of `worker`: `sign = ±1` is the sign of entry
    /// `k`, 64 entries per draw of the row's generator.
    fn row_fold(&self, worker: usize, row: usize, mut f: impl FnMut(f32, f32, usize) -> f32) -> f32 {
        let mut signs = Rng::new(self.seed, 1 + (worker * ROWS_PER_WORKER + row) as u64);
        let mut acc = 0.0;
        let mut bits = 0;
        for k in 0..DIM {
            if k % 64 == 0 {
                bits = signs.next_u64();
            }
            let sign = if (bits >> (k % 64)) & 1 == 1 { 1.0 } else { -1.0 };
            acc = f(acc, sign, k);
        }
        acc
    }

    /// `a_j · x − b_j` for every row `j` of `worker`.
    pub fn residuals(&self, worker: usize, x: &[f32]) -> Residuals {
        let mut out = [0.0; ROWS_PER_WORKER];
        let targets = self.targets.get(worker).copied().unwrap_or_default();
        for (row, (r, b)) in out.iter_mut().zip(targets).enumerate() {
            let dot = self.row_fold(worker, row, |sum, sign, k| sum + sign * x.get(k).copied().unwrap_or(0.0));
            *r = dot * SCALE - b;
        }
        out
    }

    /// `grad = (1/8) A_iᵀ r`: worker `worker`'s gradient from the residuals of its job.
    pub fn gradient(&self, worker: usize, residuals: &Residuals, grad: &mut [f32]) {
        grad.fill(0.0);
        for (row, r) in residuals.iter().enumerate() {
            let c = r * SCALE / ROWS_PER_WORKER as f32;
            self.row_fold(worker, row, |_, sign, k| {
                if let Some(g) = grad.get_mut(k) {
                    *g += sign * c;
                }
                0.0
            });
        }
    }

    /// The loss `(1/2m) ‖A x − b‖²`.
    pub fn loss(&self, x: &[f32]) -> f32 {
        let mut sum = 0.0f32;
        for worker in 0..WORKERS {
            for r in self.residuals(worker, x) {
                sum += r * r;
            }
        }
        sum / (2 * Self::rows()) as f32
    }
}
