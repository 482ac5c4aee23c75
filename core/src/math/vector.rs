//! Slice kernels: add, scaled add, mean of k, squared norm, finite check, clip by norm.

use super::Scalar;
use core::fmt;

/// Two slices that must have the same length did not.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct LengthMismatch {
    /// The length the operation expected (the destination's).
    pub expected: usize,
    /// The length it got.
    pub actual: usize,
}

impl fmt::Display for LengthMismatch {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "length mismatch: expected {} elements, got {}", self.expected, self.actual)
    }
}

impl core::error::Error for LengthMismatch {}

#[inline]
fn check(expected: usize, actual: usize) -> Result<(), LengthMismatch> {
    if expected == actual { Ok(()) } else { Err(LengthMismatch { expected, actual }) }
}

/// `y += x`.
pub fn add<T: Scalar>(y: &mut [T], x: &[T]) -> Result<(), LengthMismatch> {
    check(y.len(), x.len())?;
    for (y, x) in y.iter_mut().zip(x) {
        *y = *y + *x;
    }
    Ok(())
}

/// `y += a * x` (axpy).
pub fn scaled_add<T: Scalar>(y: &mut [T], a: T, x: &[T]) -> Result<(), LengthMismatch> {
    check(y.len(), x.len())?;
    for (y, x) in y.iter_mut().zip(x) {
        *y = *y + a * *x;
    }
    Ok(())
}

/// `y = x`.
pub fn copy<T: Scalar>(y: &mut [T], x: &[T]) -> Result<(), LengthMismatch> {
    check(y.len(), x.len())?;
    y.copy_from_slice(x);
    Ok(())
}

/// `y = x - z` elementwise.
pub fn sub_into<T: Scalar>(y: &mut [T], x: &[T], z: &[T]) -> Result<(), LengthMismatch> {
    check(y.len(), x.len())?;
    check(y.len(), z.len())?;
    for ((y, x), z) in y.iter_mut().zip(x).zip(z) {
        *y = *x - *z;
    }
    Ok(())
}

/// `y *= a`.
pub fn scale<T: Scalar>(y: &mut [T], a: T) {
    for y in y.iter_mut() {
        *y = *y * a;
    }
}

/// `y = 0`.
pub fn fill_zero<T: Scalar>(y: &mut [T]) {
    y.fill(T::zero());
}

/// Turns a sum of `k` vectors into their mean: `y /= k`. With `k == 0` nothing changes.
pub fn mean_of<T: Scalar>(y: &mut [T], k: usize) {
    if k > 1 {
        scale(y, T::one() / T::from_f64(k as f64));
    }
}

/// Elements per step of the chunked kernels: enough independent lanes to hide the latency
/// of a vector add on current x86-64 and AArch64 cores, and a multiple of every vector width.
pub(crate) const LANES: usize = 16;

/// `Σ x_i²`, accumulated in `T` with `LANES` independent lanes (vectorisable, and
/// deterministic: the same input always gives the same bits; lane `i` sums elements
/// `i, i + 16, …` of the whole chunks, the lanes are added in order, then the sum of the
/// tail).
/// [`crate::Values::squared_norm`] of the same elements as little-endian bytes gives the
/// same bits.
pub fn squared_norm<T: Scalar>(x: &[T]) -> T {
    let mut lanes = [T::zero(); LANES];
    let mut chunks = x.chunks_exact(LANES);
    for c in &mut chunks {
        // As a fixed-size array the inner loop has a constant trip count and vectorises.
        let Ok(c) = <&[T; LANES]>::try_from(c) else { continue };
        for (l, v) in lanes.iter_mut().zip(c) {
            *l = *l + *v * *v;
        }
    }
    // The tail in its own sum: writing it into `lanes` would keep the lanes in memory.
    let tail = chunks.remainder().iter().fold(T::zero(), |a, v| a + *v * *v);
    lanes.iter().fold(T::zero(), |a, b| a + *b) + tail
}

/// Whether every element is finite (no NaN, no ±∞). Branch-free, so it vectorises.
pub fn all_finite<T: Scalar>(x: &[T]) -> bool {
    x.iter().fold(true, |ok, v| ok & v.is_finite())
}

/// Scales `x` so its L2 norm is at most `max_norm`; returns the factor applied (1 when
/// already within bound). A non-finite norm or bound leaves `x` unchanged and returns 1.
pub fn clip_by_norm<T: Scalar>(x: &mut [T], max_norm: T) -> T {
    let norm = squared_norm(x).sqrt();
    if norm.is_finite() && max_norm.is_finite() && norm > max_norm && norm > T::zero() {
        let f = max_norm / norm;
        scale(x, f);
        f
    } else {
        T::one()
    }
}

/// The server's update step, fused: `params += a * acc; acc = 0`, one pass over both.
pub fn apply_and_clear<T: Scalar>(params: &mut [T], a: T, acc: &mut [T]) -> Result<(), LengthMismatch> {
    check(params.len(), acc.len())?;
    for (p, g) in params.iter_mut().zip(acc.iter_mut()) {
        *p = *p + a * *g;
        *g = T::zero();
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;
    use std::vec::Vec;

    #[test]
    fn length_mismatch_is_an_error() {
        let mut y = [0.0f32; 3];
        assert_eq!(add(&mut y, &[1.0; 2]), Err(LengthMismatch { expected: 3, actual: 2 }));
        assert!(scaled_add(&mut y, 1.0, &[1.0; 4]).is_err());
        assert!(apply_and_clear(&mut y, 1.0, &mut [0.0; 1]).is_err());
        assert!(sub_into(&mut y, &[0.0; 3], &[0.0; 2]).is_err());
        assert_eq!(y, [0.0; 3]);
    }

    #[test]
    fn kernels_match_closed_forms() {
        let mut y = [1.0f64, 2.0, 3.0];
        scaled_add(&mut y, 2.0, &[1.0, 1.0, 1.0]).unwrap();
        assert_eq!(y, [3.0, 4.0, 5.0]);
        mean_of(&mut y, 2);
        assert_eq!(y, [1.5, 2.0, 2.5]);
        assert_eq!(squared_norm(&[3.0f32, 4.0]), 25.0);
        let mut c = [3.0f32, 4.0];
        assert_eq!(clip_by_norm(&mut c, 1.0), 0.2);
        assert!((squared_norm(&c) - 1.0).abs() < 1e-6);
        assert!(all_finite(&[0.0f32, -1.0, f32::MAX]));
        assert!(!all_finite(&[0.0f32, f32::NAN]));
        assert!(!all_finite(&[f64::INFINITY]));
        let (mut p, mut a) = ([1.0f32; 2], [2.0f32; 2]);
        apply_and_clear(&mut p, -0.5, &mut a).unwrap();
        assert_eq!((p, a), ([0.0; 2], [0.0; 2]));
    }

    proptest! {
        #[test]
        fn squared_norm_matches_f64_reference(x in proptest::collection::vec(-100i32..100, 0..100)) {
            let xs: Vec<f64> = x.iter().map(|v| *v as f64).collect();
            let reference: f64 = xs.iter().map(|v| v * v).sum();
            prop_assert_eq!(squared_norm(&xs), reference);
        }

        #[test]
        fn finite_check_agrees_with_std(x in proptest::collection::vec(proptest::num::f32::ANY, 0..40)) {
            prop_assert_eq!(all_finite(&x), x.iter().all(|v| v.is_finite()));
        }
    }
}
