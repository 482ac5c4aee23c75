//! The gradient noise scale of the operator's model, estimated from a recorded trace's
//! gradient columns ([`crate::trace::GradientStats`]).
//!
//! McCandlish et al. (2018, "An Empirical Model of Large-Batch Training", appendix A) estimate
//! the "simple" noise scale `B_simple = tr(Σ)/|G|²` (`Σ` the per-example gradient covariance,
//! `G` the full-batch gradient) from gradient norms at two batch sizes on the same model: a
//! gradient of batch `b` has `E|g_b|² = |G|² + tr(Σ)/b`. A recorded row holds one worker's
//! gradient `g` (batch `b`) and the mean `ḡ` of the `k` gradients computed on the same model
//! (batch `k·b`), so, with `T = tr(Σ)/b` (the noise of one worker gradient):
//!
//! ```text
//! E|g|² = |G|² + T        E|ḡ|² = |G|² + T/k
//! T̂ = k (|g|² − |ḡ|²) / (k − 1)        |Ĝ|² = (k |ḡ|² − |g|²) / (k − 1)        (both unbiased)
//! B̂ = mean T̂ / mean |Ĝ|²                (worker gradients; × b for examples)
//! ```
//!
//! Both means are taken before the division (one row's `|Ĝ|²` is noisy and may be negative),
//! over the rows of the last [`WINDOW_SHARE`] of the trace's steps: the noise scale grows as
//! training nears its target, and `advise` calibrates to the loss an ideal run reaches after
//! most of the trace. Their uncertainty comes from [`BLOCKS`] contiguous blocks of steps
//! (each block's means, a 95% Student-t interval over the blocks); the interval of `B̂` is
//! the ratio of the ends of the two intervals (`T̂` low over `|Ĝ|²` high, and the reverse),
//! unbounded above when `|Ĝ|²`'s interval reaches zero. Rows whose mean holds only their own
//! gradient (`k` = 1) carry no information and are left out.

use super::stats::{Interval, interval};
use crate::trace::{GradientStats, Step};
use serde::Serialize;

/// The share of the trace's steps, at its end, whose gradients the estimate uses.
pub const WINDOW_SHARE: f64 = 0.25;
/// The contiguous blocks of steps the uncertainty is measured over.
pub const BLOCKS: usize = 10;
/// The fewest rows with a partner gradient (`k` ≥ 2) an estimate needs.
pub const MIN_ROWS: usize = 20;

/// The noise scale estimated from a trace.
#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct NoiseEstimate {
    /// `B̂` in worker gradients (multiply by the examples per worker gradient for examples).
    pub gradients: f64,
    /// Lower end of its interval (module docs).
    pub low: f64,
    /// Upper end of its interval (infinite when `|Ĝ|²`'s interval reaches zero).
    pub high: f64,
    /// `T̂ = tr(Σ)/b`, the noise of one worker gradient, with its 95% interval over blocks.
    pub noise: Interval,
    /// `|Ĝ|²`, with its 95% interval over blocks.
    pub signal: Interval,
    /// Rows used.
    pub rows: usize,
    /// The first step of the window.
    pub from_step: u64,
    /// The step after it.
    pub until_step: u64,
    /// The mean minibatch loss over the window's rows, when they report one.
    pub loss: Option<f64>,
}

/// One row's unbiased estimates `(T̂, |Ĝ|²)` (module docs); `None` without both norms and a
/// partner gradient.
pub fn row_estimates(g: &GradientStats) -> Option<(f64, f64)> {
    let (norm, mean, k) = (g.grad_norm?, g.mean_norm?, g.mean_of);
    if k < 2 {
        return None;
    }
    let k = f64::from(k);
    let (small, big) = (norm * norm, mean * mean);
    Some((k * (small - big) / (k - 1.0), (k * big - small) / (k - 1.0)))
}

/// Estimates the noise scale from a trace's rows with gradient columns, `steps` the trace's
/// steps per worker (module docs). An error says why no estimate can be given: too few rows
/// with a partner gradient, or `|Ĝ|²` not above zero (the gradients are noise at this
/// resolution: the noise scale is beyond what the trace can tell).
pub fn estimate(rows: &[(Step, GradientStats)], steps: u64) -> Result<NoiseEstimate, String> {
    let from = steps - (WINDOW_SHARE * steps as f64).ceil().min(steps as f64) as u64;
    let used: Vec<(u64, f64, f64, Option<f64>)> = rows
        .iter()
        .filter(|(s, _)| s.step >= from && s.step < steps)
        .filter_map(|(s, g)| row_estimates(g).map(|(t, s2)| (s.step, t, s2, g.loss)))
        .collect();
    // Most gradients with a partner: a BSP-like recording, too short for the window.
    let with_norm = rows.iter().filter(|(s, g)| s.step < steps && g.grad_norm.is_some()).count();
    let partnered = rows.iter().filter(|(s, g)| s.step < steps && row_estimates(g).is_some()).count();
    if rows.iter().all(|(s, _)| rows.first().is_some_and(|(f, _)| f.worker == s.worker)) {
        return Err(
            "the trace holds one worker: no gradient has a partner computed on the same model (record 2 or more workers under BSP or backup workers)".to_owned()
        );
    }
    if used.len() < MIN_ROWS && partnered > 0 && 2 * partnered >= with_norm {
        return Err(format!(
            "{} gradient(s) in the last {:.0}% of the steps have a partner computed on the same model; at least {MIN_ROWS} are needed (the trace has partners: record more steps)",
            used.len(),
            WINDOW_SHARE * 100.0
        ));
    }
    if used.len() < MIN_ROWS {
        return Err(format!(
            "{} gradient(s) in the last {:.0}% of the steps have a partner computed on the same model; at least {MIN_ROWS} are needed (record a BSP or backup-workers run: their workers compute on one model per step)",
            used.len(),
            WINDOW_SHARE * 100.0
        ));
    }
    let span = (steps - from).max(1);
    let mut blocks = vec![(0.0, 0.0, 0usize); BLOCKS];
    for &(step, t, s2, _) in &used {
        let b = (((step - from) as u128 * BLOCKS as u128) / u128::from(span)) as usize;
        if let Some(block) = blocks.get_mut(b.min(BLOCKS - 1)) {
            block.0 += t;
            block.1 += s2;
            block.2 += 1;
        }
    }
    let filled: Vec<_> = blocks.into_iter().filter(|b| b.2 > 0).collect();
    let per = |f: fn(&(f64, f64, usize)) -> f64| filled.iter().map(f).collect::<Vec<f64>>();
    let mut noise = interval(&per(|b| b.0 / b.2 as f64));
    let mut signal = interval(&per(|b| b.1 / b.2 as f64));
    // The point estimates are the means over every row (blocks of unequal size weigh in
    // proportion); the intervals' widths come from the blocks.
    let n = used.len() as f64;
    let (t_mean, s_mean) = used.iter().fold((0.0, 0.0), |(a, b), r| (a + r.1 / n, b + r.2 / n));
    let shift = |i: &mut Interval, mean: f64| {
        let (lo, hi) = (i.low - i.mean, i.high - i.mean);
        *i = Interval { mean, low: mean + lo, high: mean + hi };
    };
    shift(&mut noise, t_mean);
    shift(&mut signal, s_mean);
    if !(signal.mean > 0.0 && noise.mean > 0.0) {
        return Err(format!(
            "the gradients' mean is within their noise (|G|² estimated at {:.3e}, noise tr(Σ)/b at {:.3e}): the noise scale is beyond what the trace can tell",
            signal.mean, noise.mean
        ));
    }
    let gradients = noise.mean / signal.mean;
    let low = noise.low.max(0.0) / signal.high;
    let high = if signal.low > 0.0 { noise.high / signal.low } else { f64::INFINITY };
    let losses: Vec<f64> = used.iter().filter_map(|r| r.3).collect();
    let loss = (!losses.is_empty()).then(|| losses.iter().sum::<f64>() / losses.len() as f64);
    Ok(NoiseEstimate {
        gradients,
        low,
        high,
        noise,
        signal,
        rows: used.len(),
        from_step: from,
        until_step: steps,
        loss,
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::rng::Rng;

    /// Rows of `groups` steps, each with `k` gradients `G + diag(σ) z` on one model.
    fn synthetic(g: &[f64], sigma: &[f64], k: usize, groups: u64, seed: u64) -> Vec<(Step, GradientStats)> {
        let mut rng = Rng::derive(seed, 1);
        let mut rows = Vec::new();
        for step in 0..groups {
            let grads: Vec<Vec<f64>> =
                (0..k).map(|_| g.iter().zip(sigma).map(|(m, s)| m + s * rng.normal()).collect()).collect();
            let mean: Vec<f64> = (0..g.len()).map(|j| grads.iter().map(|v| v[j]).sum::<f64>() / k as f64).collect();
            let norm = |v: &[f64]| v.iter().map(|x| x * x).sum::<f64>().sqrt();
            for (w, v) in grads.iter().enumerate() {
                let stats = GradientStats {
                    loss: Some(1.0),
                    grad_norm: Some(norm(v)),
                    mean_norm: Some(norm(&mean)),
                    mean_of: k as u32,
                };
                rows.push((Step { worker: w as u32, step, seconds: 0.01 }, stats));
            }
        }
        rows
    }

    /// The row estimates are exact in expectation: for Gaussian gradients their means over
    /// many rows approach `tr(Σ)` and `|G|²`, and the noise scale their ratio.
    #[test]
    fn the_estimate_recovers_a_known_noise_scale() {
        // |G|² = 1 + 4 = 5; tr(Σ) = 2² · 20 = 80: B = 16.
        let mut g = vec![0.0; 20];
        g[0] = 1.0;
        g[1] = 2.0;
        let sigma = vec![2.0; 20];
        let trace: f64 = sigma.iter().map(|s| s * s).sum();
        assert!((trace - 80.0).abs() < 1e-9, "{trace}");
        for (k, seed) in [(2, 1), (4, 2), (16, 3)] {
            let steps = 4000;
            let rows = synthetic(&g, &sigma, k, steps, seed);
            let e = estimate(&rows, steps).unwrap();
            assert_eq!(e.rows, k * steps as usize / 4);
            assert!((e.noise.mean / 80.0 - 1.0).abs() < 0.05, "k {k}: tr(Σ) {:?}", e.noise);
            assert!((e.signal.mean / 5.0 - 1.0).abs() < 0.15, "k {k}: |G|² {:?}", e.signal);
            assert!((e.gradients / 16.0 - 1.0).abs() < 0.15, "k {k}: B {}", e.gradients);
            assert!(e.low <= 16.0 && 16.0 <= e.high, "k {k}: {} not in {}..{}", 16.0, e.low, e.high);
            assert_eq!((e.from_step, e.until_step, e.loss), (3000, 4000, Some(1.0)));
        }
    }

    /// One row by hand: `k` = 4, `|g|` = 3, `|ḡ|` = 2 give `T̂ = 4 (9 − 4)/3` and
    /// `|Ĝ|² = (16 − 9)/3`.
    #[test]
    fn one_row_gives_the_closed_form() {
        let g = GradientStats { loss: None, grad_norm: Some(3.0), mean_norm: Some(2.0), mean_of: 4 };
        let (t, s) = row_estimates(&g).unwrap();
        assert!((t - 20.0 / 3.0).abs() < 1e-12 && (s - 7.0 / 3.0).abs() < 1e-12, "{t} {s}");
        assert_eq!(row_estimates(&GradientStats { mean_of: 1, ..g }), None);
        assert_eq!(row_estimates(&GradientStats { mean_norm: None, ..g }), None);
    }

    /// Pure noise (`G` = 0) and too few partnered rows give reasons, not a number.
    #[test]
    fn noise_alone_or_too_few_rows_give_no_estimate() {
        let rows = synthetic(&[0.0; 10], &[1.0; 10], 4, 400, 5);
        let e = estimate(&rows, 400);
        // The estimate of |G|² straddles zero: either refused or unbounded above.
        match e {
            Err(why) => assert!(why.contains("within their noise"), "{why}"),
            Ok(e) => assert!(e.high.is_infinite(), "{e:?}"),
        }
        let lonely = synthetic(&[1.0; 10], &[1.0; 10], 1, 400, 6);
        assert!(estimate(&lonely, 400).unwrap_err().contains("partner"));
    }

    #[test]
    fn too_few_partners_ask_for_what_the_recording_lacks() {
        // A BSP recording of 2 workers and 8 steps: partners everywhere, too few in the window.
        let short = synthetic(&[1.0, 2.0], &[1.0, 1.0], 2, 8, 3);
        let e = estimate(&short, 8).unwrap_err();
        assert!(e.contains("record more steps") && !e.contains("record a BSP"), "{e}");
        // One worker: no gradient can have a partner, whatever the protocol.
        let one: Vec<_> = synthetic(&[1.0, 2.0], &[1.0, 1.0], 1, 100, 3);
        let e = estimate(&one, 100).unwrap_err();
        assert!(e.contains("holds one worker") && !e.contains("record a BSP"), "{e}");
    }
}
