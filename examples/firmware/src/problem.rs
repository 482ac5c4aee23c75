//! The problem the firmware trains: least squares `min_x F(x) = (1/2m)‖A x − b‖²` with
//! `d = 1024` unknowns and `m = 64` rows, 8 rows per worker, every worker's share drawn
//! from the same distribution (the data-parallel setting the protocols are built for).
//!
//! `A = (1/32) Z V` has rank 8: `V` holds 8 random sign vectors of length `d` (the latent
//! directions, 128 bytes each, kept as bits) and each row's 8 coefficients `z` are random
//! signs, drawn from the row's own seeded generator stream whenever the row is needed,
//! never stored. `b = A x*` for a hidden `x*` with entries in `{−1, −7/8, …, 1}`, so the
//! system is consistent and the minimum loss is 0; training starts from `x = 0`.
//!
//! Worker `i` holds rows `8i..8i+8` and computes the gradient of its share,
//! `g_i = (1/8) A_iᵀ (A_i x − b_i)`; the mean of all eight is `∇F`. Both products go
//! through the factors (`A_i x = (1/32) Z_i (V x)`, `A_iᵀ r = (1/32) Vᵀ (Z_iᵀ r)`): the
//! same numbers as with `A_i` written out, in `8 d` operations per product instead of
//! `64 d`.
//!
//! Noise: a share's Hessian `(1/8) A_iᵀ A_i` scatters around the full one, so a mean of
//! fewer gradients makes a noisier step. With `η = 0.5` the expected contraction of the
//! error per update is `(1 − η)² + η²·(7/8)/k` for a mean of `k` gradients: 0.36 for
//! `k = 2` against 0.28 for all eight, the trade-off DBW weighs against waiting.

use crate::rng::Rng;
use crate::{DIM, ROWS_PER_WORKER, WORKERS};

/// Rank of `A`: latent directions.
pub const RANK: usize = 8;
/// `A = SCALE · Z V`.
const SCALE: f32 = 1.0 / 32.0;
/// Words of 64 sign bits per latent direction.
const WORDS: usize = DIM / 64;
/// Generator streams: `x*`, then the latent directions, then one per row.
const SOLUTION_STREAM: u64 = 0;
const DIRECTION_STREAM: u64 = 1;
const ROW_STREAM: u64 = DIRECTION_STREAM + RANK as u64;

/// Residuals `A_i x − b_i` of one worker's rows at the model a job started from.
pub type Residuals = [f32; ROWS_PER_WORKER];

/// The least-squares problem of one seed.
#[derive(Clone, Debug)]
pub struct Problem {
    seed: u64,
    /// Sign bits of the latent directions `V` (bit set: `+1`).
    directions: [[u64; WORDS]; RANK],
    /// `b`, by worker and row.
    targets: [Residuals; WORKERS],
}

impl Problem {
    /// The problem of `seed`.
    pub fn new(seed: u64) -> Self {
        let mut directions = [[0; WORDS]; RANK];
        for (l, direction) in directions.iter_mut().enumerate() {
            let mut rng = Rng::new(seed, DIRECTION_STREAM + l as u64);
            direction.iter_mut().for_each(|word| *word = rng.next_u64());
        }
        let mut problem = Self { seed, directions, targets: [[0.0; ROWS_PER_WORKER]; WORKERS] };
        let mut solution = [0.0f32; DIM];
        let mut rng = Rng::new(seed, SOLUTION_STREAM);
        solution.iter_mut().for_each(|x| *x = ((rng.next_u64() % 17) as f32 - 8.0) / 8.0);
        for worker in 0..WORKERS {
            let b = problem.products(worker, &solution);
            if let Some(t) = problem.targets.get_mut(worker) {
                *t = b;
            }
        }
        problem
    }

    /// Rows in the whole problem.
    pub const fn rows() -> usize {
        WORKERS * ROWS_PER_WORKER
    }

    /// The coefficients `z` (±1) of row `row` of `worker`.
    fn coefficients(&self, worker: usize, row: usize) -> [f32; RANK] {
        let bits = Rng::new(self.seed, ROW_STREAM + (worker * ROWS_PER_WORKER + row) as u64).next_u64();
        core::array::from_fn(|l| if (bits >> l) & 1 == 1 { 1.0 } else { -1.0 })
    }

    /// `V x`, one dot product per latent direction.
    fn project(&self, x: &[f32]) -> [f32; RANK] {
        self.directions.map(|direction| {
            let mut sum = 0.0;
            for (word, chunk) in direction.iter().zip(x.chunks(64)) {
                for (k, v) in chunk.iter().enumerate() {
                    sum += if (word >> k) & 1 == 1 { *v } else { -*v };
                }
            }
            sum
        })
    }

    /// `A_i x` for `worker`'s rows.
    fn products(&self, worker: usize, x: &[f32]) -> Residuals {
        let projected = self.project(x);
        core::array::from_fn(|row| {
            let z = self.coefficients(worker, row);
            SCALE * z.iter().zip(projected).map(|(z, p)| z * p).sum::<f32>()
        })
    }

    /// `a_j · x − b_j` for every row `j` of `worker`.
    pub fn residuals(&self, worker: usize, x: &[f32]) -> Residuals {
        let targets = self.targets.get(worker).copied().unwrap_or_default();
        let mut out = self.products(worker, x);
        out.iter_mut().zip(targets).for_each(|(r, b)| *r -= b);
        out
    }

    /// `grad = (1/8) A_iᵀ r`: worker `worker`'s gradient from the residuals of its job.
    pub fn gradient(&self, worker: usize, residuals: &Residuals, grad: &mut [f32]) {
        let mut weights = [0.0f32; RANK];
        for (row, r) in residuals.iter().enumerate() {
            let z = self.coefficients(worker, row);
            weights.iter_mut().zip(z).for_each(|(w, z)| *w += SCALE * z * r / ROWS_PER_WORKER as f32);
        }
        for (k, g) in grad.iter_mut().enumerate() {
            let (word, bit) = (k / 64, k % 64);
            *g = self
                .directions
                .iter()
                .zip(weights)
                .map(|(direction, w)| {
                    let positive = direction.get(word).is_some_and(|bits| (bits >> bit) & 1 == 1);
                    if positive { w } else { -w }
                })
                .sum();
        }
    }

    /// The loss `F(x) = (1/2m) ‖A x − b‖²`.
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
