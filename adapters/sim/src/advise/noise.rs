//! The NQM's gradient noise, calibrated to the operator's model by its critical batch.
//!
//! The noisy quadratic model ([`crate::workload::nqm`]) has loss `F(x) = ½ Σ_i h_i x_i²`,
//! `h_i = 1/i`, and per-example gradient noise of covariance `Σ = c · diag(h)` (`c` = 1 in the
//! built-in model; here `c` scales it). SGD from `x = 1` with step `η` averaging `k`
//! gradients of `b` examples each has `ρ_i = 1 − η h_i` and
//!
//! ```text
//! E[x_i(t)²] = ρ_i^{2t} + c · η² h_i / (k b) · (1 − ρ_i^{2t}) / (1 − ρ_i²)
//! E[F(x(t))] = S(t) + c · N(t) / (k b)
//! S(t) = Σ_i ½ h_i ρ_i^{2t}                                  (the signal: the start, decayed)
//! N(t) = Σ_i ½ h_i · η² h_i (1 − ρ_i^{2t}) / (1 − ρ_i²)      (the noise of one example)
//! ```
//!
//! McCandlish et al. (2018, "An Empirical Model of Large-Batch Training") define the noise
//! scale `B_noise = tr(HΣ) / GᵀHG`: the batch at which the noise term of a step's expected
//! improvement, `ε²/2 · tr(HΣ)/B`, equals its curvature term `ε²/2 · GᵀHG`. Below it, averaging
//! more examples per step pays almost in proportion; above it, extra examples are wasted.
//! With `H ≈ I` it is the "simple" noise scale `tr(Σ)/|G|²`, which an operator measures.
//! The NQM's counterpart over a whole run to the target (step `t*`, where an ideal BSP run
//! meets it) is the batch at which the noise part of the expected loss equals the signal
//! part:
//!
//! ```text
//! B_crit = c · N(t*) / S(t*)      so      c = B · S(t*) / N(t*)
//! ```
//!
//! Below `B_crit` examples per update, noise dominates the loss at the target and
//! aggregating more gradients per update lowers it in proportion; above, the run is bound
//! by its number of updates. With `c` so chosen, an ideal BSP run of `n` one-example
//! gradients meets the target `S(t*) (1 + B/n)`.

/// The signal and the one-example noise parts `(S(t), N(t))` of the expected NQM loss over
/// `dim` coordinates after `t` steps of `lr` (module docs).
pub fn nqm_loss_parts(dim: usize, lr: f64, t: f64) -> (f64, f64) {
    (0..dim)
        .map(|i| {
            let h = 1.0 / (i as f64 + 1.0);
            let rho = 1.0 - lr * h;
            let decay = rho.abs().powf(2.0 * t);
            let noise = lr * lr * h * (1.0 - decay) / (1.0 - rho * rho).max(1e-12);
            (0.5 * h * decay, 0.5 * h * noise)
        })
        .fold((0.0, 0.0), |(s, n), (a, b)| (s + a, n + b))
}

/// The expected squared norm of the NQM's full-batch gradient `|G(x(t))|² = Σ_i h_i² x_i(t)²`
/// after `t` steps of SGD with learning rate `lr` averaging `k` gradients of batch `batch`,
/// from `x = 1`, noise covariance scaled by `noise` (`E[x_i(t)²]` as in the module docs).
/// With `tr(Σ) = noise · Σ_i h_i` per example, `tr(Σ)` over it is the model's simple noise
/// scale at step `t`.
pub fn nqm_expected_gradient_sq(dim: usize, lr: f64, k: usize, batch: usize, t: f64, noise: f64) -> f64 {
    let kb = (k * batch).max(1) as f64;
    (0..dim)
        .map(|i| {
            let h = 1.0 / (i as f64 + 1.0);
            let rho = 1.0 - lr * h;
            let decay = rho.abs().powf(2.0 * t);
            let x2 = decay + noise * lr * lr * h / kb * (1.0 - decay) / (1.0 - rho * rho).max(1e-12);
            h * h * x2
        })
        .sum()
}

/// The trace of the NQM's per-example gradient covariance, `noise · Σ_i h_i`.
pub fn nqm_noise_trace(dim: usize, noise: f64) -> f64 {
    noise * (1..=dim).map(|i| 1.0 / i as f64).sum::<f64>()
}

/// The expected NQM loss after `t` steps of SGD with learning rate `lr` averaging `k`
/// gradients of batch `batch` per step, from `x = 1`, with the noise covariance scaled by
/// `noise`: `S(t) + noise · N(t) / (k b)` (module docs).
pub fn nqm_expected_loss(dim: usize, lr: f64, k: usize, batch: usize, t: f64, noise: f64) -> f64 {
    let (signal, one) = nqm_loss_parts(dim, lr, t);
    signal + noise * one / (k * batch).max(1) as f64
}

/// The noise multiplier `c` whose critical batch at step `t` is `examples`: `B · S(t)/N(t)`.
pub fn nqm_noise_for(dim: usize, lr: f64, t: f64, examples: f64) -> f64 {
    let (signal, one) = nqm_loss_parts(dim, lr, t);
    examples * signal / one.max(f64::MIN_POSITIVE)
}

/// The critical batch at step `t` of noise multiplier `noise`: `c · N(t)/S(t)`.
pub fn nqm_critical_batch(dim: usize, lr: f64, t: f64, noise: f64) -> f64 {
    let (signal, one) = nqm_loss_parts(dim, lr, t);
    noise * one / signal.max(f64::MIN_POSITIVE)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_noise_for_a_critical_batch_inverts_it_and_splits_the_target_as_stated() {
        let (dim, lr, t, n) = (100, 0.05, 1800.0, 16);
        for b in [2.0, 16.0, 160.0] {
            let c = nqm_noise_for(dim, lr, t, b);
            assert!((nqm_critical_batch(dim, lr, t, c) - b).abs() < 1e-9 * b);
            let (signal, _) = nqm_loss_parts(dim, lr, t);
            let target = nqm_expected_loss(dim, lr, n, 1, t, c);
            assert!((target - signal * (1.0 + b / n as f64)).abs() < 1e-12, "{target} {signal}");
            // At the critical batch the two parts are equal.
            let at = nqm_expected_loss(dim, lr, b as usize, 1, t, c);
            assert!((at / signal - 2.0).abs() < 1e-9, "{at} {signal}");
        }
        // Noise 1 is the built-in model: its floor is the workload's closed form.
        let floor = crate::workload::nqm::noise_floor(dim, lr, 16, 1);
        assert!((nqm_expected_loss(dim, lr, 16, 1, 1e7, 1.0) - floor).abs() < 1e-9);
    }
}
