//! The signal and noise curvatures of the decrease model (module docs of [`super`],
//! "Signal and noise curvature").

use super::choice::usable;

/// Online estimate of the signal and noise curvatures `(a, b)` (times `η`) by exponentially
/// weighted, regularised least squares on `y ≈ a·x_signal + b·x_noise` ([`crate::math::dbw_policy`]).
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct CurvatureSplit {
    beta: f64,
    /// Weighted sums `Σx₁², Σx₁x₂, Σx₂², Σx₁y, Σx₂y, Σy, Σ(x₁+x₂)`, scaled to be
    /// dimensionless per sample by the running normaliser below.
    sums: [f64; 7],
    weight: f64,
}

impl CurvatureSplit {
    /// Regularisation towards the pooled ratio, as a fraction of the mean diagonal of the
    /// normal equations. Where noise dominates, the two regressors hardly vary and a weakly
    /// regularised fit is ill-posed (it drives the noise curvature to its lower clip and
    /// `k` to its minimum, docs/DBW.md); the ridge trades a bias towards the pooled ratio
    /// (see the unit test) for a stable estimate.
    pub const RIDGE: f64 = 0.3;

    /// An empty estimate with forgetting factor `beta` (clamped to `[0, 1)`).
    pub fn new(beta: f64) -> Self {
        let beta = if beta.is_finite() { beta.clamp(0.0, 0.999_999) } else { 0.0 };
        Self { beta, sums: [0.0; 7], weight: 0.0 }
    }

    /// Adds one secant sample: `signal` = `Ĝ` and `noise` = `Ŝ/k` of the earlier iteration,
    /// `y` the measured `η ḡᵀHḡ`. Samples are normalised by `signal + noise` (so that
    /// iterations with large gradients do not dominate); non-finite or non-positive totals
    /// are ignored.
    #[inline]
    pub fn update(&mut self, signal: f64, noise: f64, y: f64) {
        let total = signal + noise;
        // `total > 0.0 && total.is_finite() && y.is_finite() && signal >= 0.0 && noise >= 0.0`,
        // the first two from the bits ([`usable`]).
        if !(usable(total) && y.is_finite() && signal >= 0.0 && noise >= 0.0) {
            return;
        }
        let (x1, x2, y) = (signal / total, noise / total, y / total);
        let sample = [x1 * x1, x1 * x2, x2 * x2, x1 * y, x2 * y, y, x1 + x2];
        for (s, x) in self.sums.iter_mut().zip(sample) {
            *s = self.beta * *s + (1.0 - self.beta) * x;
        }
        self.weight = self.beta * self.weight + (1.0 - self.beta);
    }

    /// The pooled (single-curvature) ratio `Σy / Σ(x₁ + x₂)`, if any sample arrived.
    pub fn pooled(&self) -> Option<f64> {
        let [.., sy, sx] = self.sums;
        (self.weight > 0.0 && sx > 0.0).then(|| sy / sx)
    }

    /// `(a, b)` clipped to `[min, max]`, or `None` before the first sample.
    #[inline]
    pub fn get(&self, min: f64, max: f64) -> Option<(f64, f64)> {
        let r = self.pooled()?;
        let [s11, s12, s22, s1y, s2y, ..] = self.sums;
        let lambda = Self::RIDGE * (s11 + s22) / 2.0;
        // (X'X + λI) θ = X'y + λ r 1.
        let (m11, m12, m22) = (s11 + lambda, s12, s22 + lambda);
        let (v1, v2) = (s1y + lambda * r, s2y + lambda * r);
        let det = m11 * m22 - m12 * m12;
        let (a, b) = if det > 1e-300 && det.is_finite() {
            ((v1 * m22 - v2 * m12) / det, (m11 * v2 - m12 * v1) / det)
        } else {
            (r, r)
        };
        let clip = |x: f64| if x.is_finite() { x.clamp(min, max) } else { r.clamp(min, max) };
        Some((clip(a), clip(b)))
    }
}
