//! The grouped protocol's fused kernels: each does in one pass what two or three of
//! [`crate::math`]'s passes do, with the same bits.

use crate::math::{self, Scalar};

/// `y *= a`, returning the squared norm of the result with the bits
/// [`math::squared_norm`] gives (the same lanes, summed in the same order): the scaling and
/// the screening of an aggregate in one pass.
pub(super) fn scale_measured<T: Scalar>(y: &mut [T], a: T) -> T {
    let mut lanes = [T::zero(); math::LANES];
    let mut chunks = y.chunks_exact_mut(math::LANES);
    for c in &mut chunks {
        let Ok(c) = <&mut [T; math::LANES]>::try_from(c) else { continue };
        for (l, v) in lanes.iter_mut().zip(c.iter_mut()) {
            *v = *v * a;
            *l = *l + *v * *v;
        }
    }
    let tail = chunks.into_remainder().iter_mut().fold(T::zero(), |s, v| {
        *v = *v * a;
        s + *v * *v
    });
    math::sum_lanes(&{ lanes }) + tail
}

/// The lanes of the fused kernels below: `each(y, x)` updates `y_i` from `x_i` and returns
/// the value whose square is measured, over whole [`math::LANES`] chunks then the tail, with
/// the sums of [`math::squared_norm`] (the same lanes, summed in the same order). `y` and
/// `x` have the same length (the callers check; extra elements of either are not visited).
#[inline(always)]
fn fused_measured<T: Scalar>(y: &mut [T], x: &[T], each: impl Fn(&mut T, T) -> T) -> T {
    let mut lanes = [T::zero(); math::LANES];
    let mut ys = y.chunks_exact_mut(math::LANES);
    let mut xs = x.chunks_exact(math::LANES);
    for (yc, xc) in (&mut ys).zip(&mut xs) {
        let (Ok(yc), Ok(xc)) = (<&mut [T; math::LANES]>::try_from(yc), <&[T; math::LANES]>::try_from(xc)) else {
            continue;
        };
        for ((l, y), x) in lanes.iter_mut().zip(yc.iter_mut()).zip(xc) {
            let m = each(y, *x);
            *l = *l + m * m;
        }
    }
    let tail = ys.into_remainder().iter_mut().zip(xs.remainder()).fold(T::zero(), |s, (y, x)| {
        let m = each(y, *x);
        s + m * m
    });
    math::sum_lanes(&{ lanes }) + tail
}

/// `acc += x` with the bits of [`math::add`], returning `Σ x_i²` with the bits of
/// [`math::squared_norm`]`(x)`: a gradient's admission measure and its accumulation in one
/// pass. `acc` and `x` have the same length.
// Not inlined: as a function of its own its slices keep their no-alias guarantee, so
// the loop vectorises.
#[inline(never)]
pub(super) fn add_measured<T: Scalar>(acc: &mut [T], x: &[T]) -> T {
    fused_measured(acc, x, |a, v| {
        *a = *a + v;
        v
    })
}

/// A step's last gradient and its close in one pass: `acc = (acc + factor · x) · w` (the
/// bits of [`math::add`] when `factor` is 1, else of [`math::scaled_add`], then of the
/// scaling in [`scale_measured`]), returning the squared norm of the result with the bits
/// [`scale_measured`] gives. `acc` and `x` have the same length.
// Not inlined: as a function of its own its slices keep their no-alias guarantee, so
// the loop vectorises.
#[inline(never)]
pub(super) fn add_scale_measured<T: Scalar>(acc: &mut [T], x: &[T], factor: T, w: T) -> T {
    if factor == T::one() {
        fused_measured(acc, x, |a, v| {
            *a = (*a + v) * w;
            *a
        })
    } else {
        fused_measured(acc, x, |a, v| {
            *a = (*a + factor * v) * w;
            *a
        })
    }
}

/// The central update of an aggregate and the group's re-base in one pass:
/// `params += scale · agg` (the bits of [`math::scaled_add`]), `model = params`, `agg = 0`.
/// The three have the same length (extra elements are not visited).
// Not inlined: as a function of its own its slices keep their no-alias guarantee, so
// the loop vectorises.
#[inline(never)]
pub(super) fn apply_copy_clear<T: Scalar>(params: &mut [T], scale: T, agg: &mut [T], model: &mut [T]) {
    for ((p, a), m) in params.iter_mut().zip(agg.iter_mut()).zip(model.iter_mut()) {
        *p = *p + scale * *a;
        *m = *p;
        *a = T::zero();
    }
}

/// Splits group `g`'s part of a [`GroupedServer`]'s scratch into (model, accumulator, sum).
pub(super) fn parts<T>(scratch: &mut [T], g: usize, dim: usize, per: usize) -> Option<(&mut [T], &mut [T], &mut [T])> {
    let len = per.checked_mul(dim)?;
    let start = g.checked_mul(len)?;
    let region = scratch.get_mut(start..start.checked_add(len)?)?;
    let (model, rest) = region.split_at_mut_checked(dim)?;
    let (acc, total) = rest.split_at_mut_checked(dim)?;
    Some((model, acc, total))
}

pub(super) fn part<T>(scratch: &[T], g: usize, dim: usize, per: usize) -> &[T] {
    let start = g.saturating_mul(per).saturating_mul(dim);
    scratch.get(start..start.saturating_add(dim)).unwrap_or(&[])
}
