//! Admission checks shared by every server: length, finiteness, norm bound.

use crate::error::Reject;
use crate::math::Scalar;
use crate::msg::Values;

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
        values.check_len(dim)?;
        let sq = values.squared_norm();
        if !sq.is_finite() {
            return Err(if values.all_finite() { Reject::NormTooLarge } else { Reject::NotFinite });
        }
        let Some(max) = self.max_norm else {
            return Ok(T::one());
        };
        let norm = libm::sqrt(sq.to_f64());
        if max.is_nan() || norm <= max {
            return Ok(T::one());
        }
        match self.on_large {
            LargeGradient::Clip => Ok(T::from_f64(max.max(0.0) / norm)),
            LargeGradient::Reject => Err(Reject::NormTooLarge),
        }
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
}
