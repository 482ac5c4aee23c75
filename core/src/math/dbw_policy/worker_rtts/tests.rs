use super::*;
use crate::math::estimate::shifted_exp_order_statistic;
use crate::proto::Heap;

fn secs(x: f64) -> Duration {
    Duration::from_secs_f64(x)
}
#[test]
fn poisson_binomial_matches_the_binomial_and_small_cases() {
    let mut out = [0.0; 5];
    assert!(poisson_binomial(&[0.5, 0.5], &mut out));
    assert_eq!(&out[..3], &[0.25, 0.5, 0.25]);
    assert!(poisson_binomial(&[0.2, 1.0, 0.0], &mut out));
    assert!((out[0] - 0.0).abs() < 1e-15 && (out[1] - 0.8).abs() < 1e-15 && (out[2] - 0.2).abs() < 1e-15);
    assert!(!poisson_binomial(&[0.5; 5], &mut out));
}

#[test]
fn identical_shifted_exponential_workers_match_the_closed_form() {
    // 16 workers, 16 deterministic quantiles each of 1 + Exp(1) (all observed).
    let n = 16;
    let mut w = WorkerRtts::<Heap>::new(RTT_TRACKED_WORKERS).unwrap();
    for i in 0..n {
        for j in 0..RTT_PER_WORKER {
            let u = ((j * n + i) as f64 + 0.5) / (n * RTT_PER_WORKER) as f64;
            w.push(i, secs(1.0 - libm::log(1.0 - u)), false);
        }
    }
    let mut tau = [0.0; 16];
    assert!(w.expected_order_statistics(n, |_| true, &mut tau));
    for k in 1..=16u32 {
        let exact = shifted_exp_order_statistic(16, k, 1.0, 1.0);
        let got = tau[k as usize - 1];
        // The empirical distribution truncates the far tail: the largest k is low.
        let tol = if k >= 15 { 0.15 } else { 0.05 };
        assert!((got - exact).abs() / exact < tol, "k {k}: {got} vs {exact}");
    }
    assert_eq!(w.fresh(), 0);
}

#[test]
fn two_speed_cluster_has_a_step_in_its_order_statistics() {
    // 6 workers always at 1 s, 3 at 10 s, all observed.
    let mut w = WorkerRtts::<Heap>::new(RTT_TRACKED_WORKERS).unwrap();
    for _ in 0..4 {
        for i in 0..9 {
            w.push(i, secs(if i < 6 { 1.0 } else { 10.0 }), false);
        }
    }
    let mut tau = [0.0; 9];
    assert!(w.expected_order_statistics(9, |_| true, &mut tau));
    for (k, t) in tau.iter().enumerate() {
        let want = if k < 6 { 1.0 } else { 10.0 };
        assert!((t - want).abs() < 1e-6, "k {}: {t}", k + 1);
    }
    // Only live workers count: without the slow ones every k is 1 s.
    assert!(w.expected_order_statistics(9, |i| i < 6, &mut tau));
    assert!(tau[..6].iter().all(|t| (t - 1.0).abs() < 1e-6));
}

#[test]
fn always_censored_workers_are_taken_to_be_slow_and_forgotten_after_a_regime_change() {
    let mut w = WorkerRtts::<Heap>::new(RTT_TRACKED_WORKERS).unwrap();
    // 4 fast workers observed at 1 s; 2 cut at 1 s every time.
    for _ in 0..RTT_PER_WORKER {
        for i in 0..6 {
            w.push(i, secs(1.0), i >= 4);
        }
    }
    let mut tau = [0.0; 6];
    assert!(w.expected_order_statistics(6, |_| true, &mut tau));
    assert!((tau[3] - 1.0).abs() < 1e-6);
    // Unplaced mass: at least the censoring time, with a long tail.
    assert!(tau[4] > 1.0 && tau[5] > tau[4], "{tau:?}");
    // The cut workers become fast: after a full ring they are like the others.
    for _ in 0..RTT_PER_WORKER {
        for i in 0..6 {
            w.push(i, secs(1.0), false);
        }
    }
    assert!(w.expected_order_statistics(6, |_| true, &mut tau));
    assert!(tau.iter().all(|t| (t - 1.0).abs() < 1e-6), "{tau:?}");
    // Refusals.
    assert!(!w.expected_order_statistics(0, |_| true, &mut tau));
    assert!(!w.expected_order_statistics(RTT_TRACKED_WORKERS + 1, |_| true, &mut tau));
    assert!(!w.expected_order_statistics(7, |_| true, &mut tau), "worker 6 has no sample");
    w.forget(0);
    assert!(!w.expected_order_statistics(6, |_| true, &mut tau));
    assert!(w.expected_order_statistics(6, |i| i > 0, &mut tau));
}

/// The estimate as it was computed before it became incremental: every live worker
/// fitted from scratch, each CDF read by a scan from its first step.
fn from_scratch(w: &WorkerRtts<Heap>, n: usize, live: impl Fn(usize) -> bool, out: &mut [f64]) -> bool {
    use std::{vec, vec::Vec};
    let mut w = w.clone();
    let cdf = |w: &WorkerRtts<Heap>, i: usize, x: f64| {
        let steps = usize::from(w.windows[i].km_len);
        let (last, mass, mean) = w.windows[i].tail;
        let mut f = 0.0;
        for (t, v) in w.windows[i].km_t.iter().zip(w.windows[i].km_f.iter()).take(steps) {
            if f64::from(*t) <= x * 1e6 {
                f = *v;
            } else {
                break;
            }
        }
        if x > last && mass > 0.0 {
            f = 1.0 - mass * libm::exp(-(x - last) / mean);
        }
        f64::clamp(f, 0.0, 1.0)
    };
    let live: Vec<usize> = (0..n).filter(|&i| live(i)).collect();
    if live.iter().any(|&i| w.windows[i].len == 0) || live.is_empty() || out.len() < live.len() {
        return false;
    }
    let shift = live
        .iter()
        .flat_map(|&i| w.windows[i].ring[..usize::from(w.windows[i].len)].to_vec())
        .filter(|k| k & CENSORED == 0)
        .map(|k| k >> 1)
        .min();
    let Some(shift) = shift else { return false };
    let (mut grid, mut tail_start, mut tail_mean) = (Vec::new(), 0.0f64, 0.0f64);
    for &i in &live {
        assert!(w.fit(i, shift));
        grid.extend_from_slice(&w.windows[i].km_t[..usize::from(w.windows[i].km_len)]);
        let (last, mass, mean) = w.windows[i].tail;
        tail_start = tail_start.max(last);
        if mass > 0.0 {
            tail_mean = tail_mean.max(mean);
        }
    }
    grid.sort_unstable();
    let m = live.len();
    let out = &mut out[..m];
    out.fill(0.0);
    let segment = |w: &WorkerRtts<Heap>, a: f64, b: f64, out: &mut [f64]| {
        let width = b - a;
        if width.is_nan() || width <= 0.0 {
            return;
        }
        let p: Vec<f64> = live.iter().map(|&i| cdf(w, i, (a + b) / 2.0)).collect();
        let mut pmf = vec![0.0; m + 1];
        pmf[0] = 1.0;
        for (j, &q) in p.iter().enumerate() {
            for c in (0..=j + 1).rev() {
                let up = if c > 0 { pmf[c - 1] * q } else { 0.0 };
                pmf[c] = pmf[c] * (1.0 - q) + up;
            }
        }
        let mut below = 0.0;
        for (o, p) in out.iter_mut().zip(&pmf) {
            below += *p;
            *o += width * f64::min(below, 1.0);
        }
    };
    // The segment ends: 0, every distinct step time, the last sample of any worker, then
    // the geometric tail grid (width `mean/64` growing to `TAIL_SPAN` means in
    // `TAIL_POINTS` steps).
    grid.dedup();
    let mut ends = vec![0.0f64];
    ends.extend(grid.iter().map(|&t| f64::from(t) / 1e6));
    let km_end = *ends.last().unwrap();
    if tail_start > km_end {
        ends.push(tail_start);
    }
    if tail_mean > 0.0 {
        let from = f64::max(km_end, tail_start);
        let stop = from + TAIL_SPAN * tail_mean;
        let ratio = libm::pow((stop - from) / (tail_mean / 64.0), 1.0 / (TAIL_POINTS as f64 - 1.0));
        let steps = core::iter::successors(Some((from, tail_mean / 64.0)), |&(at, w)| {
            Some(((at + w).min(stop.max(from)), w * ratio))
        });
        ends.extend(steps.skip(1).take(TAIL_POINTS).map(|(at, _)| at));
    }
    for pair in ends.windows(2) {
        segment(&w, pair[0], pair[1], out);
    }
    true
}

proptest::proptest! {
    /// The incremental estimate (refits of changed windows only, the last estimate
    /// reused when nothing changed, CDFs read by a forward sweep) is bit for bit the
    /// from-scratch one, over random sequences of pushes (few distinct values, so
    /// that equal evictions and unchanged windows happen), live-set changes and
    /// forgotten workers.
    #[test]
    fn incremental_estimate_is_the_from_scratch_one(
        ops in proptest::collection::vec((0usize..6, 0u32..6, proptest::bool::weighted(0.25), 0u8..20), 1..300),
        wide in proptest::bool::ANY,
    ) {
        let mut w = WorkerRtts::<Heap>::new(6).unwrap();
        let mut dead = 0u64;
        for (worker, value, censored, action) in ops {
            let micros = if wide { 1_000 + value * 7_919 + (action as u32) * 131 } else { 1_000 * (1 + value) };
            match action {
                0 => w.forget(worker),
                1 => dead ^= bit(worker),
                _ => w.push(worker, Duration::from_micros(u64::from(micros)), censored),
            }
            if action % 3 == 0 {
                let live = |i: usize| dead & bit(i) == 0;
                let (mut got, mut want) = ([f64::NAN; 6], [f64::NAN; 6]);
                let ok = w.expected_order_statistics(6, live, &mut got);
                proptest::prop_assert_eq!(ok, from_scratch(&w, 6, live, &mut want));
                if ok {
                    let (got, want) = (got.map(f64::to_bits), want.map(f64::to_bits));
                    proptest::prop_assert_eq!(got, want);
                }
            }
        }
    }
}
