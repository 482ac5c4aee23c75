//! Slice kernels: add, scaled add, mean of k, squared norm, finite check, clip by norm, and
//! the fused passes (copy-and-check, apply-and-clear, add-apply-and-clear, add-and-measure
//! into a second buffer).

use super::scalar::Scalar;
use crate::error::LengthMismatch;

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

/// The sum of the lanes as a fixed tree: lanes `j, j + 4, j + 8, j + 12` pairwise for each
/// `j < 4` (`(a_j + a_{j+4}) + (a_{j+8} + a_{j+12})`: elementwise adds of four-lane groups,
/// which stay vector adds in the caller), then those four pairwise, `(s0 + s2) + (s1 + s3)`.
/// Always the same order, so the same bits, and a dependency chain of 4 adds instead of the
/// 16 of an in-order fold.
#[inline(always)]
pub(crate) fn sum_lanes<T: Scalar>(lanes: &[T; LANES]) -> T {
    let [a0, a1, a2, a3, a4, a5, a6, a7, a8, a9, a10, a11, a12, a13, a14, a15] = *lanes;
    sum_quad((a0 + a4) + (a8 + a12), (a1 + a5) + (a9 + a13), (a2 + a6) + (a10 + a14), (a3 + a7) + (a11 + a15))
}

/// The last two levels of [`sum_lanes`]: `(s0 + s2) + (s1 + s3)`. Out of line, and taking
/// the four sums as four arguments rather than an array, so that the callers' main loops
/// stay four lanes wide (docs/perf-log.md, "Hot-path shapes").
#[inline(never)]
fn sum_quad<T: Scalar>(s0: T, s1: T, s2: T, s3: T) -> T {
    (s0 + s2) + (s1 + s3)
}

/// `Σ x_i²`, accumulated in `T` with `LANES` independent lanes (vectorisable, and
/// deterministic: the same input always gives the same bits; lane `i` sums elements
/// `i, i + 16, …` of the whole chunks, the lanes are summed pairwise by `sum_lanes`,
/// then the sum of the tail is added).
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
    sum_lanes(&{ lanes }) + tail
}

/// Whether every element is finite (no NaN, no ±∞): the verdict of `x.iter().all(is_finite)`.
///
/// Vectorised: `LANES` independent lanes each accumulate `v - v`, which is exactly `+0` for
/// every finite `v` (subnormals and `-0` included) and NaN for NaN and ±∞; a NaN never
/// becomes a number again under addition, so the lanes are all zero exactly when every
/// element is finite. Branch-free within a block of 1024 elements; it stops after the
/// first block that holds a non-finite value.
pub fn all_finite<T: Scalar>(x: &[T]) -> bool {
    let mut blocks = x.chunks_exact(FINITE_BLOCK);
    for b in &mut blocks {
        if !finite_lanes(b) {
            return false;
        }
    }
    finite_lanes(blocks.remainder())
}

/// Elements per early-exit test of the finiteness checks (4 KiB of `f32`): long enough
/// that the test costs nothing, short enough that garbage is refused at once.
pub(crate) const FINITE_BLOCK: usize = 64 * LANES;

/// The lanes of `v - v` over `x` (see [`all_finite`]): whether all of `x` is finite.
#[inline(always)]
fn finite_lanes<T: Scalar>(x: &[T]) -> bool {
    let mut lanes = [T::zero(); LANES];
    let mut chunks = x.chunks_exact(LANES);
    for c in &mut chunks {
        let Ok(c) = <&[T; LANES]>::try_from(c) else { continue };
        for (l, v) in lanes.iter_mut().zip(c) {
            *l = *l + zero_if_finite(*v);
        }
    }
    let tail = chunks.remainder().iter().fold(T::zero(), |a, v| a + zero_if_finite(*v));
    lanes_are_zero(&lanes) & (tail == T::zero())
}

/// `v - v`: exactly `+0` for every finite `v` (subnormals and `-0` included), NaN for NaN
/// and ±∞ (the probe of the finiteness checks: one subtraction, no branch, no bit access).
#[inline(always)]
#[allow(clippy::eq_op)]
pub(crate) fn zero_if_finite<T: Scalar>(v: T) -> T {
    v - v
}

/// Whether every lane is (±)0, branch-free (the lanes of the finiteness checks).
#[inline(always)]
pub(crate) fn lanes_are_zero<T: Scalar>(lanes: &[T; LANES]) -> bool {
    lanes.iter().fold(true, |ok, l| ok & (*l == T::zero()))
}

/// `y = x`, returning whether every element of `x` is finite (the verdict of
/// [`all_finite`]`(x)`): the copy and the check in one pass. On a matching length `y` is
/// written entirely whatever the verdict; on a mismatch nothing is written.
pub fn copy_finite<T: Scalar>(y: &mut [T], x: &[T]) -> Result<bool, LengthMismatch> {
    check(y.len(), x.len())?;
    let mut tail_ok = true;
    let mut lanes = [T::zero(); LANES];
    let mut yc = y.chunks_exact_mut(LANES);
    let mut xc = x.chunks_exact(LANES);
    for (ys, xs) in (&mut yc).zip(&mut xc) {
        let (Ok(ys), Ok(xs)) = (<&mut [T; LANES]>::try_from(ys), <&[T; LANES]>::try_from(xs)) else { continue };
        *ys = *xs;
        for (l, v) in lanes.iter_mut().zip(xs) {
            *l = *l + zero_if_finite(*v);
        }
    }
    for (y, v) in yc.into_remainder().iter_mut().zip(xc.remainder()) {
        *y = *v;
        tail_ok &= zero_if_finite(*v) == T::zero();
    }
    Ok(tail_ok & lanes_are_zero(&lanes))
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

/// The server's update step, fused: `params += a * acc; acc = 0`, one pass over both, in
/// chunks of `LANES` (16) elements (as plain zipped iterators the zeroing store kept the loop
/// scalar-width and it ran at half the speed of the chunked loop).
pub fn apply_and_clear<T: Scalar>(params: &mut [T], a: T, acc: &mut [T]) -> Result<(), LengthMismatch> {
    check(params.len(), acc.len())?;
    let mut pc = params.chunks_exact_mut(LANES);
    let mut gc = acc.chunks_exact_mut(LANES);
    for (ps, gs) in (&mut pc).zip(&mut gc) {
        let (Ok(ps), Ok(gs)) = (<&mut [T; LANES]>::try_from(ps), <&mut [T; LANES]>::try_from(gs)) else { continue };
        for (p, g) in ps.iter_mut().zip(gs.iter()) {
            *p = *p + a * *g;
        }
        *gs = [T::zero(); LANES];
    }
    for (p, g) in pc.into_remainder().iter_mut().zip(gc.into_remainder()) {
        *p = *p + a * *g;
        *g = T::zero();
    }
    Ok(())
}

/// A round's last gradient folded into the server's update step: `params += a * (acc + x);
/// acc = 0`, one pass over the three. Every element has the bits of [`add`]`(acc, x)` then
/// [`apply_and_clear`]`(params, a, acc)` (the same operations in the same order per element:
/// `t = acc_i + x_i; params_i += a * t; acc_i = 0`), with one pass over `acc` fewer.
pub fn add_apply_and_clear<T: Scalar>(params: &mut [T], a: T, acc: &mut [T], x: &[T]) -> Result<(), LengthMismatch> {
    check(params.len(), acc.len())?;
    check(params.len(), x.len())?;
    fold_apply(params, a, acc, x, |g, v| g + v);
    Ok(())
}

/// [`add_apply_and_clear`] of a scaled gradient: `params += a * (acc + f * x); acc = 0`, with
/// the bits of [`scaled_add`]`(acc, f, x)` then [`apply_and_clear`]`(params, a, acc)`.
pub fn scaled_add_apply_and_clear<T: Scalar>(
    params: &mut [T],
    a: T,
    acc: &mut [T],
    f: T,
    x: &[T],
) -> Result<(), LengthMismatch> {
    check(params.len(), acc.len())?;
    check(params.len(), x.len())?;
    fold_apply(params, a, acc, x, |g, v| g + f * v);
    Ok(())
}

/// `t = add(acc_i, x_i); params_i += a * t; acc_i = 0`, in `LANES`-element chunks. The
/// caller checked the lengths.
#[inline(always)]
fn fold_apply<T: Scalar>(params: &mut [T], a: T, acc: &mut [T], x: &[T], add: impl Fn(T, T) -> T) {
    let mut pc = params.chunks_exact_mut(LANES);
    let mut gc = acc.chunks_exact_mut(LANES);
    let mut xc = x.chunks_exact(LANES);
    for ((ps, gs), xs) in (&mut pc).zip(&mut gc).zip(&mut xc) {
        let (Ok(ps), Ok(gs), Ok(xs)) =
            (<&mut [T; LANES]>::try_from(ps), <&mut [T; LANES]>::try_from(gs), <&[T; LANES]>::try_from(xs))
        else {
            continue;
        };
        for ((p, g), v) in ps.iter_mut().zip(gs.iter()).zip(xs) {
            *p = *p + a * add(*g, *v);
        }
        *gs = [T::zero(); LANES];
    }
    for ((p, g), v) in pc.into_remainder().iter_mut().zip(gc.into_remainder()).zip(xc.remainder()) {
        *p = *p + a * add(*g, *v);
        *g = T::zero();
    }
}

/// `out = acc + x`, returning `Σ x_i²` with exactly the bits of [`squared_norm`]`(x)`: the
/// admission measure and the accumulation in one pass over the gradient, writing a second
/// buffer so that `acc` is untouched whatever the verdict (a server swaps `acc` and `out`
/// only when it accepts the gradient). Each `out_i` has the bits `add` would give `acc_i`.
pub fn add_to_measured<T: Scalar>(out: &mut [T], acc: &[T], x: &[T]) -> Result<T, LengthMismatch> {
    check(out.len(), acc.len())?;
    check(out.len(), x.len())?;
    let mut lanes = [T::zero(); LANES];
    let mut oc = out.chunks_exact_mut(LANES);
    let mut ac = acc.chunks_exact(LANES);
    let mut xc = x.chunks_exact(LANES);
    for ((os, as_), xs) in (&mut oc).zip(&mut ac).zip(&mut xc) {
        let (Ok(os), Ok(as_), Ok(xs)) =
            (<&mut [T; LANES]>::try_from(os), <&[T; LANES]>::try_from(as_), <&[T; LANES]>::try_from(xs))
        else {
            continue;
        };
        for (((o, a), v), l) in os.iter_mut().zip(as_).zip(xs).zip(lanes.iter_mut()) {
            *o = *a + *v;
            *l = *l + *v * *v;
        }
    }
    let mut tail = T::zero();
    for ((o, a), v) in oc.into_remainder().iter_mut().zip(ac.remainder()).zip(xc.remainder()) {
        *o = *a + *v;
        tail = tail + *v * *v;
    }
    Ok(sum_lanes(&{ lanes }) + tail)
}

/// `out = acc + a * x` (each `out_i` with the bits `scaled_add` would give `acc_i`).
pub fn scaled_add_to<T: Scalar>(out: &mut [T], acc: &[T], a: T, x: &[T]) -> Result<(), LengthMismatch> {
    check(out.len(), acc.len())?;
    check(out.len(), x.len())?;
    for ((o, g), v) in out.iter_mut().zip(acc).zip(x) {
        *o = *g + a * *v;
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
        assert!(add_to_measured(&mut y, &[0.0; 3], &[0.0; 2]).is_err());
        assert!(add_to_measured(&mut y, &[0.0; 2], &[0.0; 3]).is_err());
        assert!(scaled_add_to(&mut y, &[0.0; 3], 1.0, &[0.0; 4]).is_err());
        assert!(sub_into(&mut y, &[0.0; 3], &[0.0; 2]).is_err());
        assert!(copy_finite(&mut y, &[1.0; 2]).is_err());
        assert!(add_apply_and_clear(&mut y, 1.0, &mut [1.0; 3], &[1.0; 2]).is_err());
        assert!(add_apply_and_clear(&mut y, 1.0, &mut [1.0; 2], &[1.0; 3]).is_err());
        assert!(scaled_add_apply_and_clear(&mut y, 1.0, &mut [1.0; 3], 2.0, &[1.0; 4]).is_err());
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
        // The fused kernels give the bits of the separate ones at every length around the
        // chunk boundary.
        #[test]
        fn fused_kernels_match_separate_ones_bitwise(
            x in proptest::collection::vec(-1e3f32..1e3, 0..70),
            a in -4.0f32..4.0,
        ) {
            let acc: Vec<f32> = (0..x.len()).map(|i| i as f32 * 0.37 - 3.0).collect();
            let mut out = std::vec![f32::NAN; x.len()];
            let sq = add_to_measured(&mut out, &acc, &x).unwrap();
            prop_assert_eq!(sq.to_bits(), squared_norm(&x).to_bits());
            let mut want = acc.clone();
            add(&mut want, &x).unwrap();
            prop_assert_eq!(&out, &want);
            scaled_add_to(&mut out, &acc, a, &x).unwrap();
            let mut want = acc.clone();
            scaled_add(&mut want, a, &x).unwrap();
            prop_assert_eq!(&out, &want);
            let (mut p, mut g) = (acc.clone(), x.clone());
            apply_and_clear(&mut p, a, &mut g).unwrap();
            let want: Vec<f32> = acc.iter().zip(&x).map(|(p, g)| *p + a * *g).collect();
            prop_assert_eq!(p, want);
            prop_assert!(g.iter().all(|v| v.to_bits() == 0));
        }

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

        // The vectorised checks against the scalar definition on every class of value
        // (NaN payloads of both signs, ±∞, subnormals, ±0, the extremes), one bad value at
        // any position of vectors spanning the chunk and block boundaries, f32 and f64;
        // the fused copy copies every bit whatever the verdict.
        #[test]
        fn vectorised_finite_checks_match_the_scalar_definition(
            len in 0usize..2200,
            fill in 0usize..8,
            bad in proptest::option::of((0usize..2200, 0usize..8)),
            payload in 1u32..0x0040_0000,
        ) {
            let special32 = |k: usize, i: usize| -> f32 {
                match k {
                    0 => f32::from_bits(0x7f80_0000 | payload),
                    1 => f32::from_bits(0xff80_0000 | payload.rotate_left(i as u32 % 7) & 0x007f_ffff | 1),
                    2 => f32::INFINITY,
                    3 => f32::NEG_INFINITY,
                    4 => f32::from_bits(payload & 0x007f_ffff | 1),
                    5 => -0.0,
                    6 => f32::MAX,
                    _ => -f32::MIN_POSITIVE * (i as f32 + 1.0),
                }
            };
            let fin = |i: usize| -> f32 { special32(4 + (fill + i) % 4, i) };
            let mut x: Vec<f32> = (0..len).map(fin).collect();
            if let Some((at, k)) = bad {
                if let Some(v) = x.get_mut(at) {
                    *v = special32(k, at);
                }
            }
            let want = x.iter().all(|v| v.is_finite());
            prop_assert_eq!(all_finite(&x), want);
            let mut y = std::vec![1.0f32; len];
            prop_assert_eq!(copy_finite(&mut y, &x), Ok(want));
            prop_assert!(y.iter().zip(&x).all(|(a, b)| a.to_bits() == b.to_bits()));
            let x64: Vec<f64> = x.iter().map(|v| {
                if v.is_nan() { f64::from_bits(0x7ff0_0000_0000_0000 | u64::from(payload)) } else { f64::from(*v) }
            }).collect();
            prop_assert_eq!(all_finite(&x64), x64.iter().all(|v| v.is_finite()));
            let mut y64 = std::vec![0.0f64; len];
            prop_assert_eq!(copy_finite(&mut y64, &x64), Ok(want));
            let sub64 = [f64::from_bits(1), -f64::from_bits(payload.into()), f64::MIN, 5e-324, -0.0];
            prop_assert!(all_finite(&sub64));
        }

        // The folded close gives the bits of add (or scaled_add) then apply_and_clear.
        #[test]
        fn folded_close_matches_add_then_apply_bitwise(
            x in proptest::collection::vec(-1e3f32..1e3, 0..70),
            a in -4.0f32..4.0,
            f in -2.0f32..2.0,
        ) {
            let acc: Vec<f32> = (0..x.len()).map(|i| i as f32 * 0.37 - 3.0).collect();
            let params: Vec<f32> = (0..x.len()).map(|i| 1.0 - i as f32 * 0.11).collect();
            let (mut p1, mut g1) = (params.clone(), acc.clone());
            add(&mut g1, &x).unwrap();
            apply_and_clear(&mut p1, a, &mut g1).unwrap();
            let (mut p2, mut g2) = (params.clone(), acc.clone());
            add_apply_and_clear(&mut p2, a, &mut g2, &x).unwrap();
            prop_assert!(p1.iter().zip(&p2).all(|(u, v)| u.to_bits() == v.to_bits()));
            prop_assert!(g2.iter().all(|v| v.to_bits() == 0));
            let (mut p1, mut g1) = (params.clone(), acc.clone());
            scaled_add(&mut g1, f, &x).unwrap();
            apply_and_clear(&mut p1, a, &mut g1).unwrap();
            let (mut p2, mut g2) = (params.clone(), acc.clone());
            scaled_add_apply_and_clear(&mut p2, a, &mut g2, f, &x).unwrap();
            prop_assert!(p1.iter().zip(&p2).all(|(u, v)| u.to_bits() == v.to_bits()));
            prop_assert!(g2.iter().all(|v| v.to_bits() == 0));
        }
    }
}
