//! The noisy quadratic model (NQM) of Zhang et al., "Which Algorithmic Choices Matter at Which
//! Batch Sizes? Insights From a Noisy Quadratic Model", NeurIPS 2019.
//!
//! Loss `F(x) = ½ Σ_i h_i x_i²` over `d` coordinates with the spectrum `h_i = 1/i`
//! (`i = 1..=d`, condition number `d`, as in the paper). A stochastic gradient on a batch of
//! `B` is `h ∘ x + ξ` with `ξ` of covariance `diag(h)/B`: here `ξ = √h ∘ z̄` with `z̄` the
//! mean of the `B` batch rows of a [`Dataset`] of standard normal noise vectors
//! ([`noise_dataset`], seeded, centred so that it has mean exactly zero). The noise is thus
//! drawn from a finite pool (default 8192 vectors) rather than fresh each time: a finite
//! "training set" of noise, which keeps the model inside the workload machinery (a
//! per-worker seeded [`super::BatchSampler`] picks the rows) at the cost of reusing each
//! noise vector about once per `8192/B` gradients.
//!
//! The metric is the exact loss `F(x)` of the model being evaluated (the expected loss
//! over the noise is the loss of the mean iterate plus its variance term; the evaluation
//! sees one iterate, whose loss is exact, no sampling). Accuracy is not defined and is
//! reported as 0: use loss targets. A worker's minibatch loss is the loss whose gradient
//! its batch gradient is, `F(x) + Σ_i √h_i z̄_i x_i`: unbiased for `F(x)`, with variance
//! `2F(x)/B` over batches.
//!
//! Why it matters for backup workers: with learning rate `α` and `k` gradients averaged per
//! step, coordinate `i` contracts by `1 − α h_i` per step and settles at variance
//! `α / (k B (2 − α h_i))`, so the loss floor is `≈ (α / 2kB) Σ_i h_i / (2 − α h_i)`: waiting
//! for more gradients lowers the floor in proportion, which is the trade-off DBW's choice of
//! `k` balances against the longer wait. Initialisation: `x_i = 1`.

use super::dataset::Dataset;
use crate::rng::Rng;

/// Noise vectors in the pool of [`super::Workload::builtin`].
pub const DEFAULT_POOL: usize = 8192;

/// PRNG sub-stream of the noise pool.
const NOISE_STREAM: u64 = 0x4e51_4d00; // "NQM"

/// Curvature of coordinate `i` (0-based): `1/(i+1)`.
#[inline]
pub(super) fn curvature(i: usize) -> f32 {
    1.0 / (i as f32 + 1.0)
}

/// `rows` standard normal noise vectors of length `dim` (centred: every column has mean
/// exactly zero up to rounding), one class label 0, seeded.
pub fn noise_dataset(dim: usize, rows: usize, seed: u64) -> Dataset {
    let mut rng = Rng::derive(seed, NOISE_STREAM);
    let mut features: Vec<f32> = (0..dim * rows).map(|_| rng.normal() as f32).collect();
    if rows > 0 {
        for j in 0..dim {
            let mean = (0..rows).map(|r| f64::from(features[r * dim + j])).sum::<f64>() / rows as f64;
            for r in 0..rows {
                features[r * dim + j] -= mean as f32;
            }
        }
    }
    Dataset { features, labels: vec![0; rows], n_features: dim, n_classes: 1 }
}

/// Writes the batch gradient `h ∘ x + √h ∘ z̄` (`z̄` the mean of the batch rows) into `grad`
/// and returns the minibatch loss `½ Σ h_i x_i² + Σ √h_i z̄_i x_i`: the loss whose gradient
/// that is, whose expectation over batches is the exact loss (the pool is centred), as a
/// worker computing on a sample of the data would report it.
pub(super) fn gradient(params: &[f32], data: &Dataset, batch: &[usize], grad: &mut [f32]) -> f32 {
    grad.fill(0.0);
    for &r in batch {
        for (g, &z) in grad.iter_mut().zip(data.row(r)) {
            *g += z;
        }
    }
    let inv = 1.0 / batch.len().max(1) as f32;
    let mut noise = 0.0f64;
    for (i, (g, &x)) in grad.iter_mut().zip(params).enumerate() {
        let h = curvature(i);
        let z = h.sqrt() * *g * inv;
        noise += f64::from(z) * f64::from(x);
        *g = h * x + z;
    }
    (loss(params) + noise) as f32
}

/// The exact loss `½ Σ h_i x_i²`.
pub(super) fn loss(params: &[f32]) -> f64 {
    params.iter().enumerate().map(|(i, &x)| 0.5 * f64::from(curvature(i)) * f64::from(x) * f64::from(x)).sum()
}

/// The stationary expected loss of SGD with learning rate `lr` averaging `k` batch-`b`
/// gradients per step: `Σ_i ½ h_i · lr / (k b (2 − lr h_i))` (module docs).
pub fn noise_floor(dim: usize, lr: f64, k: usize, batch: usize) -> f64 {
    let kb = (k * batch).max(1) as f64;
    (0..dim)
        .map(|i| {
            let h = f64::from(curvature(i));
            0.5 * h * lr / (kb * (2.0 - lr * h))
        })
        .sum()
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::workload::{BatchSampler, Model, ModelKind};

    #[test]
    fn noise_has_the_stated_covariance_and_sgd_reaches_the_closed_form_floor() {
        let (dim, rows) = (20, 8192);
        let data = noise_dataset(dim, rows, 3);
        for j in [0, 7, 19] {
            let mean: f64 = (0..rows).map(|r| f64::from(data.row(r)[j])).sum::<f64>() / rows as f64;
            let var: f64 = (0..rows).map(|r| f64::from(data.row(r)[j]).powi(2)).sum::<f64>() / rows as f64;
            assert!(mean.abs() < 1e-5 && (var - 1.0).abs() < 0.05, "col {j}: {mean} {var}");
        }
        let model = Model::new(ModelKind::Nqm { dim }, dim, 1);
        let mut x = model.init_params(0);
        assert!(x.iter().all(|&v| v == 1.0));
        let start = model.evaluate(&x, &data).loss;
        let exact: f64 = (1..=dim).map(|i| 0.5 / i as f64).sum();
        assert!((start - exact).abs() < 1e-6);
        let (lr, batch) = (0.5, 2);
        let mut g = vec![0.0; dim];
        let mut sampler = BatchSampler::new(rows, 5);
        let mut b = Vec::new();
        let mut scratch = model.scratch();
        let mut tail = 0.0;
        let steps = 40_000;
        for t in 0..steps {
            sampler.next_batch(batch, &mut b);
            model.gradient(&x, &data, &b, &mut g, &mut scratch);
            x.iter_mut().zip(&g).for_each(|(p, d)| *p -= lr as f32 * d);
            if t >= steps / 2 {
                tail += model.evaluate(&x, &data).loss;
            }
        }
        let measured = tail / (steps / 2) as f64;
        let floor = noise_floor(dim, lr, 1, batch);
        assert!((measured - floor).abs() / floor < 0.15, "measured {measured} vs closed form {floor}");
    }

    #[test]
    fn the_minibatch_loss_is_the_loss_whose_gradient_is_reported() {
        let (dim, rows) = (10, 64);
        let data = noise_dataset(dim, rows, 4);
        let x: Vec<f32> = (0..dim).map(|i| 1.0 - 0.15 * i as f32).collect();
        let mut g = vec![0.0; dim];
        // One row: the loss exceeds the exact one by ⟨g − h∘x, x⟩.
        let one = gradient(&x, &data, &[3], &mut g);
        let excess: f64 = (0..dim).map(|i| f64::from(g[i] - curvature(i) * x[i]) * f64::from(x[i])).sum();
        assert!((f64::from(one) - (loss(&x) + excess)).abs() < 1e-5, "{one} vs {} + {excess}", loss(&x));
        assert!(excess.abs() > 1e-3, "the noise term is not empty: {excess}");
        // The whole (centred) pool: the exact loss.
        let all: Vec<usize> = (0..rows).collect();
        let mean = gradient(&x, &data, &all, &mut g);
        assert!((f64::from(mean) - loss(&x)).abs() < 1e-5, "{mean} vs {}", loss(&x));
    }
}
