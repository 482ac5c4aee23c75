//! Admission checks shared by every server: length, finiteness, norm bound.

use crate::error::{ConfigError, Reject};
use crate::math;
use crate::math::Scalar;
use crate::msg::Values;

/// Refuses a learning rate that is not finite and positive.
pub(crate) fn check_learning_rate(lr: f64) -> Result<(), ConfigError> {
    if lr.is_finite() && lr > 0.0 { Ok(()) } else { Err(ConfigError::LearningRate) }
}

/// Zeroes the first `needed` elements of a server's scratch, or refuses a scratch shorter
/// than that with [`ConfigError::ScratchTooSmall`] (every server checks its scratch this way
/// when it is built).
pub(crate) fn zero_scratch<T: Scalar>(scratch: &mut [T], needed: usize) -> Result<(), ConfigError> {
    let given = scratch.len();
    let area = scratch.get_mut(..needed).ok_or(ConfigError::ScratchTooSmall { needed, given })?;
    math::fill_zero(area);
    Ok(())
}

/// What to do with a finite gradient whose L2 norm exceeds [`GradientPolicy::max_norm`].
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum LargeGradient {
    /// Scale it down to the bound and apply it (the `Applied` event's weight shows the factor).
    #[default]
    Clip,
    /// Refuse it with [`Reject::NormTooLarge`].
    Reject,
}

/// How a server screens incoming gradients before using them.
#[derive(Clone, Copy, Debug, Default, PartialEq)]
pub struct GradientPolicy {
    /// The largest L2 norm accepted as is; `None` for no bound.
    pub max_norm: Option<f64>,
    /// What to do above the bound.
    pub on_large: LargeGradient,
}

impl GradientPolicy {
    /// Checks `values` against `dim` and the policy. Returns the factor to multiply the
    /// gradient by (1, or the clipping factor). One pass over the data in the common case.
    pub fn admit<T: Scalar>(&self, values: &Values<'_, T>, dim: usize) -> Result<T, Reject> {
        self.admit_measured(values, dim).map(|(factor, _)| factor)
    }

    /// [`Self::admit`], also returning the squared L2 norm of the gradient as received
    /// (before any clipping; multiply by the factor squared for the admitted gradient's),
    /// so callers that need it do not make a second pass over the data.
    pub fn admit_measured<T: Scalar>(&self, values: &Values<'_, T>, dim: usize) -> Result<(T, f64), Reject> {
        values.check_len(dim)?;
        self.verdict(values, values.squared_norm())
    }

    /// The admission verdict on `values` given its squared norm `sq` (computed by
    /// [`Values::squared_norm`] or a fused kernel giving the same bits).
    fn verdict<T: Scalar>(&self, values: &Values<'_, T>, sq: T) -> Result<(T, f64), Reject> {
        if !sq.is_finite() {
            return Err(if values.all_finite() { Reject::NormTooLarge } else { Reject::NotFinite });
        }
        let sq = sq.to_f64();
        let Some(max) = self.max_norm else {
            return Ok((T::one(), sq));
        };
        let norm = libm::sqrt(sq);
        if max.is_nan() || norm <= max {
            return Ok((T::one(), sq));
        }
        match self.on_large {
            LargeGradient::Clip => Ok((T::from_f64(max.max(0.0) / norm), sq)),
            LargeGradient::Reject => Err(Reject::NormTooLarge),
        }
    }

    /// [`Self::admit_measured`] fused with the accumulation: one pass over `values` reads
    /// `acc` and writes `out = acc + factor · values` while measuring the norm (a second
    /// pass only when the gradient is clipped). `acc` is never written, so on `Err` the
    /// caller's accumulator is unchanged; on `Ok` the caller adopts `out` as its
    /// accumulator (swaps the buffers). `out`'s prior contents are never read.
    /// Returns what [`Self::admit_measured`] returns, and `out` has the bits
    /// `acc.add_into`/`scaled_add_into` would give.
    pub fn admit_add_to<T: Scalar>(
        &self,
        values: &Values<'_, T>,
        acc: &[T],
        out: &mut [T],
    ) -> Result<(T, f64), Reject> {
        values.check_len(acc.len())?;
        let sq = values.add_to_measured(acc, out)?;
        let (factor, sq) = self.verdict(values, sq)?;
        if factor != T::one() {
            values.scaled_add_to(acc, factor, out)?;
        }
        Ok((factor, sq))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn screens_length_finiteness_and_norm() {
        let p = GradientPolicy::default();
        assert_eq!(p.admit(&Values::Slice(&[1.0f32, 2.0]), 2), Ok(1.0));
        assert!(matches!(p.admit(&Values::Slice(&[1.0f32]), 2), Err(Reject::WrongLength(_))));
        assert_eq!(p.admit(&Values::Slice(&[f32::NAN, 0.0]), 2), Err(Reject::NotFinite));
        assert_eq!(p.admit(&Values::Slice(&[f32::INFINITY, 0.0]), 2), Err(Reject::NotFinite));
        assert_eq!(p.admit(&Values::Slice(&[1e30f32, 1e30]), 2), Err(Reject::NormTooLarge));
        let clip = GradientPolicy { max_norm: Some(1.0), on_large: LargeGradient::Clip };
        assert_eq!(clip.admit(&Values::Slice(&[3.0f64, 4.0]), 2), Ok(0.2));
        let refuse = GradientPolicy { max_norm: Some(1.0), on_large: LargeGradient::Reject };
        assert_eq!(refuse.admit(&Values::Slice(&[3.0f64, 4.0]), 2), Err(Reject::NormTooLarge));
        assert_eq!(refuse.admit(&Values::Slice(&[0.5f64, 0.5]), 2), Ok(1.0));
    }

    #[test]
    fn fused_admission_agrees_and_never_writes_the_accumulator() {
        let acc = [1.0f32, -2.0];
        let clip = GradientPolicy { max_norm: Some(1.0), on_large: LargeGradient::Clip };
        let refuse = GradientPolicy { max_norm: Some(1.0), on_large: LargeGradient::Reject };
        let cases: [&[f32]; 6] = [&[3.0, 4.0], &[0.5, 0.5], &[f32::NAN, 0.0], &[1e30, 1e30], &[1.0], &[0.0, 0.0]];
        for p in [GradientPolicy::default(), clip, refuse] {
            for g in cases {
                let v = Values::Slice(g);
                let mut out = [7.0f32; 2];
                let fused = p.admit_add_to(&v, &acc, &mut out);
                assert_eq!(fused, p.admit_measured(&v, 2), "{p:?} {g:?}");
                if let Ok((f, _)) = fused {
                    let mut want = acc;
                    v.scaled_add_into(&mut want, f).unwrap();
                    assert_eq!(out, want);
                }
            }
        }
    }
}
