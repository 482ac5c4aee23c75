//! Benchmark helpers: the hand-written baseline loops the kernels are compared against, the
//! sizes the benches sweep, and a reader for criterion's result files (for the summary).
//!
//! The baselines live here, not in the bench, so the summary and the tests can name them.
//! "SIMD loop" means a chunked loop with 16 explicit lanes per step: the best the compiler
//! makes of plain Rust on this target (std::simd is nightly-only), measured in the same run
//! as the kernel.
//!
//! Layering: this file and [`drive`] import nothing of this crate; [`inmem`] imports
//! [`drive`]; the binaries under `src/bin` import only the crate's public items.

pub mod drive;
pub mod inmem;

use std::path::{Path, PathBuf};

/// Model dimensions (in `f32` elements) the kernel benches sweep.
pub const KERNEL_DIMS: [usize; 4] = [1_000, 100_000, 1_000_000, 10_000_000];

/// Lanes of the hand-written baseline loops.
pub const LANES: usize = 16;

/// Baseline `y += x`, 16 explicit lanes per step.
#[allow(clippy::needless_range_loop)] // explicit lanes are the point
pub fn simd_add(y: &mut [f32], x: &[f32]) {
    let mut yc = y.chunks_exact_mut(LANES);
    let mut xc = x.chunks_exact(LANES);
    for (ys, xs) in (&mut yc).zip(&mut xc) {
        let (Ok(ys), Ok(xs)) = (<&mut [f32; LANES]>::try_from(ys), <&[f32; LANES]>::try_from(xs)) else {
            continue;
        };
        for i in 0..LANES {
            ys[i] += xs[i];
        }
    }
    for (y, x) in yc.into_remainder().iter_mut().zip(xc.remainder()) {
        *y += *x;
    }
}

/// Baseline `y += a * x; x = 0` (the server's apply step), 16 explicit lanes per step.
#[allow(clippy::needless_range_loop)] // explicit lanes are the point
pub fn simd_apply_and_clear(y: &mut [f32], a: f32, x: &mut [f32]) {
    let mut yc = y.chunks_exact_mut(LANES);
    let mut xc = x.chunks_exact_mut(LANES);
    for (ys, xs) in (&mut yc).zip(&mut xc) {
        let (Ok(ys), Ok(xs)) = (<&mut [f32; LANES]>::try_from(ys), <&mut [f32; LANES]>::try_from(xs)) else {
            continue;
        };
        for i in 0..LANES {
            ys[i] += a * xs[i];
            xs[i] = 0.0;
        }
    }
    for (y, x) in yc.into_remainder().iter_mut().zip(xc.into_remainder()) {
        *y += a * *x;
        *x = 0.0;
    }
}

/// Baseline `y *= a`, 16 explicit lanes per step.
pub fn simd_scale(y: &mut [f32], a: f32) {
    let mut yc = y.chunks_exact_mut(LANES);
    for ys in &mut yc {
        let Ok(ys) = <&mut [f32; LANES]>::try_from(ys) else { continue };
        for v in ys.iter_mut() {
            *v *= a;
        }
    }
    for v in yc.into_remainder() {
        *v *= a;
    }
}

/// Baseline `Σ x²` with 16 independent accumulators.
#[allow(clippy::needless_range_loop)] // explicit lanes are the point
pub fn simd_squared_norm(x: &[f32]) -> f32 {
    let mut lanes = [0.0f32; LANES];
    let mut xc = x.chunks_exact(LANES);
    for xs in &mut xc {
        let Ok(xs) = <&[f32; LANES]>::try_from(xs) else { continue };
        for i in 0..LANES {
            lanes[i] += xs[i] * xs[i];
        }
    }
    let tail: f32 = xc.remainder().iter().map(|v| v * v).sum();
    lanes.iter().sum::<f32>() + tail
}

/// Baseline `y += decode_le(bytes)`, 16 explicit lanes (64 bytes) per step.
#[allow(clippy::needless_range_loop)] // explicit lanes are the point
pub fn simd_add_le(y: &mut [f32], bytes: &[u8]) {
    let mut yc = y.chunks_exact_mut(LANES);
    let mut bc = bytes.chunks_exact(LANES * 4);
    for (ys, bs) in (&mut yc).zip(&mut bc) {
        let (Ok(ys), Ok(bs)) = (<&mut [f32; LANES]>::try_from(ys), <&[u8; LANES * 4]>::try_from(bs)) else {
            continue;
        };
        for i in 0..LANES {
            ys[i] += f32::from_le_bytes([bs[4 * i], bs[4 * i + 1], bs[4 * i + 2], bs[4 * i + 3]]);
        }
    }
    for (y, b) in yc.into_remainder().iter_mut().zip(bc.remainder().chunks_exact(4)) {
        *y += f32::from_le_bytes([b[0], b[1], b[2], b[3]]);
    }
}

/// `n` deterministic, finite, non-trivial `f32` values (a cheap LCG), so no kernel sees
/// zeros or denormals.
pub fn test_vector(n: usize, seed: u32) -> Vec<f32> {
    let mut s = seed.wrapping_mul(2_654_435_761).wrapping_add(1);
    (0..n)
        .map(|_| {
            s = s.wrapping_mul(1_664_525).wrapping_add(1_013_904_223);
            (s >> 8) as f32 / (1u32 << 24) as f32 - 0.5
        })
        .collect()
}

/// `xs` as little-endian bytes (what a decoded wire payload points at).
pub fn to_le_bytes(xs: &[f32]) -> Vec<u8> {
    xs.iter().flat_map(|x| x.to_le_bytes()).collect()
}

/// Where criterion writes its results: `$CARGO_TARGET_DIR/criterion`, or the workspace's
/// `target/criterion`.
pub fn criterion_dir() -> PathBuf {
    let target = std::env::var_os("CARGO_TARGET_DIR")
        .map(PathBuf::from)
        .unwrap_or_else(|| Path::new(env!("CARGO_MANIFEST_DIR")).join("../target"));
    target.join("criterion")
}

/// The median time in nanoseconds of one criterion benchmark (`group/function/param`), from
/// its last run, if it ran.
pub fn criterion_median_ns(id: &str) -> Option<f64> {
    let path = criterion_dir().join(id).join("new").join("estimates.json");
    let text = std::fs::read_to_string(path).ok()?;
    let json: serde_json::Value = serde_json::from_str(&text).ok()?;
    json.get("median")?.get("point_estimate")?.as_f64()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn baselines_agree_with_plain_loops() {
        for n in [0, 1, 15, 16, 17, 100] {
            let x = test_vector(n, 1);
            let mut y = test_vector(n, 2);
            let mut want = y.clone();
            simd_add(&mut y, &x);
            want.iter_mut().zip(&x).for_each(|(w, x)| *w += *x);
            assert_eq!(y, want);
            let mut z = y.clone();
            simd_add_le(&mut z, &to_le_bytes(&x));
            want.iter_mut().zip(&x).for_each(|(w, x)| *w += *x);
            assert_eq!(z, want);
            let mut acc = x.clone();
            simd_apply_and_clear(&mut y, 0.5, &mut acc);
            assert!(acc.iter().all(|v| *v == 0.0));
            let plain: f32 = x.iter().map(|v| v * v).sum();
            assert!((simd_squared_norm(&x) - plain).abs() <= 1e-4 * plain.max(1.0));
            let mut s = x.clone();
            simd_scale(&mut s, 2.0);
            assert!(s.iter().zip(&x).all(|(s, x)| *s == 2.0 * x));
        }
    }
}
