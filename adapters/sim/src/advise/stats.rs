//! The statistics behind `advise`: a mean with its 95% confidence interval (Student's t) and
//! the paired difference of two candidates measured on the same seeds and data splits.

use serde::Serialize;

/// A mean with a two-sided 95% confidence interval.
#[derive(Clone, Copy, Debug, PartialEq, Serialize)]
pub struct Interval {
    /// The sample mean.
    pub mean: f64,
    /// Lower end of the 95% interval.
    pub low: f64,
    /// Upper end of the 95% interval.
    pub high: f64,
}

impl Interval {
    /// Half the interval's width.
    pub fn half_width(&self) -> f64 {
        (self.high - self.low) / 2.0
    }
}

/// The 0.975 quantile of Student's t with `df` degrees of freedom (`df` 0: infinite, no
/// interval can be given from one value).
pub fn t975(df: usize) -> f64 {
    const TABLE: [f64; 30] = [
        12.706, 4.303, 3.182, 2.776, 2.571, 2.447, 2.365, 2.306, 2.262, 2.228, 2.201, 2.179, 2.160, 2.145, 2.131,
        2.120, 2.110, 2.101, 2.093, 2.086, 2.080, 2.074, 2.069, 2.064, 2.060, 2.056, 2.052, 2.048, 2.045, 2.042,
    ];
    match df {
        0 => f64::INFINITY,
        d => TABLE.get(d - 1).copied().unwrap_or(1.96),
    }
}

/// The mean of `xs` with its 95% interval (`mean ± t · s / √n`); one value gives an
/// unbounded interval, none gives NaN.
pub fn interval(xs: &[f64]) -> Interval {
    let n = xs.len();
    if n == 0 {
        return Interval { mean: f64::NAN, low: f64::NAN, high: f64::NAN };
    }
    let mean = xs.iter().sum::<f64>() / n as f64;
    if n == 1 {
        return Interval { mean, low: f64::NEG_INFINITY, high: f64::INFINITY };
    }
    let var = xs.iter().map(|x| (x - mean).powi(2)).sum::<f64>() / (n - 1) as f64;
    let half = t975(n - 1) * (var / n as f64).sqrt();
    Interval { mean, low: mean - half, high: mean + half }
}

/// The 95% interval of the mean of `a[i] − b[i]` (the same seeds and splits on both sides).
pub fn paired(a: &[f64], b: &[f64]) -> Interval {
    let d: Vec<f64> = a.iter().zip(b).map(|(x, y)| x - y).collect();
    interval(&d)
}

/// The median of `xs` (NaN when empty).
pub fn median(xs: &[f64]) -> f64 {
    let mut v: Vec<f64> = xs.iter().copied().filter(|x| !x.is_nan()).collect();
    if v.is_empty() {
        return f64::NAN;
    }
    v.sort_by(f64::total_cmp);
    let n = v.len();
    if n % 2 == 1 { v[n / 2] } else { (v[n / 2 - 1] + v[n / 2]) / 2.0 }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn intervals_match_hand_computed_values() {
        let i = interval(&[1.0, 2.0, 3.0]);
        assert_eq!(i.mean, 2.0);
        // s = 1, t(2) = 4.303, half = 4.303 / √3.
        assert!((i.half_width() - 4.303 / 3f64.sqrt()).abs() < 1e-12);
        assert!(interval(&[5.0]).high.is_infinite());
        assert!(interval(&[]).mean.is_nan());
        let p = paired(&[2.0, 3.0, 4.0], &[1.0, 2.0, 3.0]);
        assert_eq!((p.mean, p.low, p.high), (1.0, 1.0, 1.0));
        assert_eq!(median(&[3.0, 1.0, 2.0, 10.0]), 2.5);
        assert_eq!(t975(40), 1.96);
    }
}
