//! The workers' reported losses as a trend (module docs of [`super`], "The loss above the
//! noise floor").

use super::choice::{finite_non_negative, usable};

/// An exponentially weighted straight-line fit of the reported loss against the iteration
/// count: its level at the latest iteration, its slope (the progress per iteration) and the
/// scatter of the reports about the line (their noise), in fixed storage.
///
/// Each sample is one closed iteration: the mean of the losses its contributions reported.
/// Weights decay by `β` per sample (the caller passes the same `β` every time), as in
/// [`crate::math::estimate::Ema`]; the fit is the weighted least-squares line, so with
/// equal weights (`β → 1`) it is the ordinary regression line. The abscissae are kept
/// relative to the latest sample (every stored moment is shifted by one iteration when a
/// sample arrives), so they stay within the forgetting window however long the run, and
/// the moments fit in `f32` (24 bytes: a DBW server for eight workers fits in 8 KiB).
#[derive(Clone, Copy, Debug, Default, PartialEq)]
pub struct LossTrend {
    /// Weighted sums `Σw, Σw·x, Σw·y, Σw·x², Σw·x·y, Σw·y²`, `x` the iteration relative to
    /// the latest sample (0 for it, −1 for the one before, …).
    sums: [f32; 6],
}

/// What a [`LossTrend`] says now.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct LossFit {
    /// The fitted loss at the latest sample.
    pub level: f64,
    /// The fitted slope, loss per iteration (negative while the loss falls).
    pub slope: f64,
    /// The variance of the reports about the line.
    pub noise: f64,
    /// The standard error of `level`.
    pub level_error: f64,
}

impl LossTrend {
    /// An empty trend.
    pub const fn new() -> Self {
        Self { sums: [0.0; 6] }
    }

    /// Adds the mean reported loss `loss` of the iteration that just closed, the older
    /// samples' weights decaying by `beta` (clamped to `[0, 1)`). A non-finite loss is
    /// ignored, and so is one whose moments would not be finite.
    #[inline]
    pub fn update(&mut self, beta: f64, loss: f64) {
        let b = clamp_beta(beta);
        let [sw, sx, sy, sxx, sxy, syy] = self.sums.map(f64::from);
        // The stored samples move one iteration back: x → x − 1.
        let (sx, sxx, sxy) = (sx - sw, sxx - 2.0 * sx + sw, sxy - sy);
        let w = 1.0 - b;
        let next =
            [b * sw + w, b * sx, b * sy + w * loss, b * sxx, b * sxy, b * syy + w * loss * loss].map(|v| v as f32);
        if next.iter().all(|v| v.is_finite()) {
            self.sums = next;
        }
    }

    /// The fit with forgetting factor `beta` (the one the updates used), once at least one
    /// sample arrived. With a single effective sample (`β = 0`) the slope is 0 and the
    /// level is that sample.
    pub fn fit(&self, beta: f64) -> Option<LossFit> {
        let beta = clamp_beta(beta);
        let [sw, sx, sy, sxx, sxy, syy] = self.sums.map(f64::from);
        if !usable(sw) {
            return None;
        }
        let (mx, my) = (sx / sw, sy / sw);
        let var_x = (sxx / sw - mx * mx).max(0.0);
        let cov = sxy / sw - mx * my;
        let var_y = (syy / sw - my * my).max(0.0);
        // A slope needs a spread of abscissae well above rounding.
        let spread = var_x > 1e-4;
        let slope = if spread { cov / var_x } else { 0.0 };
        let level = my - slope * mx;
        let noise = if spread { (var_y - slope * cov).max(0.0) } else { var_y };
        // Effective number of samples (Kish): (Σw)²/Σw². After t samples `Σw = 1 − β^t`
        // and `Σw² = (1 − β)/(1 + β)·(1 − β^(2t))`, with `β^t = 1 − Σw`.
        let sww = (1.0 - beta) / (1.0 + beta) * (1.0 - (1.0 - sw) * (1.0 - sw));
        let n_eff = if usable(sww) { (sw * sw / sww).max(1.0) } else { 1.0 };
        let leverage = 1.0 / n_eff + if spread { mx * mx / (n_eff * var_x) } else { 0.0 };
        let level_error = libm::sqrt(noise * leverage);
        let fit = LossFit { level, slope, noise, level_error };
        (level.is_finite() && slope.is_finite() && finite_non_negative(noise) && level_error.is_finite()).then_some(fit)
    }
}

/// `beta` clamped to `[0, 1)`, 0 if not finite (as [`crate::math::estimate::Ema`]).
fn clamp_beta(beta: f64) -> f64 {
    if beta.is_finite() { beta.clamp(0.0, 0.999_999) } else { 0.0 }
}

/// The `k` in `k_min..=k_max` maximising the loss-rate model's decrease per second
/// `(level − floor/k)/τ(k)` (module docs of [`super`], "The loss above the noise floor"):
/// the expected decrease of one iteration is proportional to the loss above the noise floor
/// `floor/k` of its `k`, and it takes `τ(k)`. `tau[k-1] = τ(k)`; `k` with a non-positive or
/// non-finite `τ(k)`, or no loss above its floor, are skipped; ties go to the larger `k`.
/// `None` when no `k` qualifies (the loss is at or below every floor, or the inputs are not
/// finite): the caller keeps the gradient-statistics rule.
pub fn choose_k_loss_rate(level: f64, floor: f64, tau: &[f64], (k_min, k_max): (u32, u32)) -> Option<u32> {
    if !(level.is_finite() && finite_non_negative(floor)) {
        return None;
    }
    let mut best: Option<(u32, f64)> = None;
    for k in k_min.max(1)..=k_max {
        let Some(&t) = tau.get(k as usize - 1) else { break };
        let excess = level - floor / f64::from(k);
        if !(excess > 0.0 && usable(t)) {
            continue;
        }
        let rate = excess / t;
        if best.is_none_or(|(_, r)| rate >= r) {
            best = Some((k, rate));
        }
    }
    best.map(|(k, _)| k)
}

#[cfg(test)]
mod tests;
