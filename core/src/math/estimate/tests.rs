//! Tests of the estimators against closed forms, exact small cases and sample formulas.

use super::*;
use crate::proto::Heap;
use proptest::prelude::*;
use std::vec;
use std::vec::Vec;

fn secs(x: f64) -> Duration {
    Duration::from_secs_f64(x)
}

/// Deterministic quantiles of `shift + Exp(rate)`.
fn shifted_exp_quantile(u: f64, shift: f64, rate: f64) -> f64 {
    shift - libm::log(1.0 - u) / rate
}

#[test]
fn ema_is_bias_corrected() {
    let mut e = Ema::new(0.5);
    assert_eq!(e.get(), None);
    e.update(4.0);
    assert_eq!(e.get(), Some(4.0));
    e.update(f64::NAN);
    assert_eq!(e.get(), Some(4.0));
    // Weights 1/2 and 1 (β = 1/2): (4·½ + 0·1) / (½ + 1).
    e.update(0.0);
    assert_eq!(e.get(), Some(4.0 / 3.0));
    // Long run: the weights decay geometrically, the average tracks the recent samples.
    for _ in 0..60 {
        e.update(2.0);
    }
    assert!((e.get().unwrap() - 2.0).abs() < 1e-12);
    // β = 0.9, samples 1 then 0: a plain EMA started at the first sample says 0.9; the
    // bias-corrected one weighs them 0.9 : 1.
    let mut e = Ema::new(0.9);
    e.update(1.0);
    e.update(0.0);
    assert!((e.get().unwrap() - 0.9 / 1.9).abs() < 1e-12);
    let mut keep_last = Ema::new(f64::NAN);
    keep_last.update(1.0);
    keep_last.update(3.0);
    assert_eq!(keep_last.get(), Some(3.0));
}

#[test]
fn noise_estimate_matches_the_sample_formulas() {
    // Gradients (1,0), (3,0), (2,3): mean (2,1), Σ‖g‖² = 1 + 9 + 13 = 23, ‖ḡ‖² = 5.
    let e = noise_estimate(3, 23.0, 5.0).unwrap();
    // Σ‖g_i − ḡ‖² = (1+1) + (1+1) + (0+4) = 8 → S = 4; G = 5 − 4/3.
    assert_eq!(e.s, 4.0);
    assert!((e.g - (5.0 - 4.0 / 3.0)).abs() < 1e-12);
    assert_eq!(noise_estimate(1, 1.0, 1.0), None);
    assert_eq!(noise_estimate(2, f64::NAN, 1.0), None);
    // Identical gradients: no variance.
    assert_eq!(noise_estimate(4, 8.0, 2.0), Some(NoiseEstimate { g: 2.0, s: 0.0 }));
}

#[test]
fn binomial_pmf_sums_to_one_and_matches_small_cases() {
    let mut pmf = [0.0; MAX_EXACT_ORDER + 1];
    assert!(binomial_pmf(2, 0.5, &mut pmf));
    assert_eq!(&pmf[..3], &[0.25, 0.5, 0.25]);
    for &(n, p) in &[(16usize, 0.3), (256, 0.999), (256, 1e-6), (1, 0.7), (0, 0.5)] {
        assert!(binomial_pmf(n, p, &mut pmf));
        let total: f64 = pmf[..=n].iter().sum();
        assert!((total - 1.0).abs() < 1e-9, "n={n} p={p} total={total}");
    }
    assert!(binomial_pmf(3, 1.0, &mut pmf));
    assert_eq!(&pmf[..4], &[0.0, 0.0, 0.0, 1.0]);
    assert!(!binomial_pmf(MAX_EXACT_ORDER + 1, 0.5, &mut pmf));
}

#[test]
fn order_statistics_of_a_discrete_distribution_are_exact() {
    // Uniform on {1, 2, 3}, n = 2: min has E = (1·5 + 2·3 + 3·1)/9, max E = (1·1 + 2·3 + 3·5)/9.
    let mut w = RttWindow::<Heap>::new(16, MAX_EXACT_ORDER).unwrap();
    for t in [1.0, 2.0, 3.0] {
        w.push(secs(t), false);
    }
    let mut out = [0.0; 2];
    assert!(w.expected_order_statistics(2, &mut out));
    assert!((out[0] - 14.0 / 9.0).abs() < 1e-9, "{out:?}");
    assert!((out[1] - 22.0 / 9.0).abs() < 1e-9, "{out:?}");
    assert!(!w.expected_order_statistics(0, &mut out));
    assert!(!w.expected_order_statistics(3, &mut out));
    assert!(!RttWindow::<Heap>::new(4, MAX_EXACT_ORDER).unwrap().expected_order_statistics(1, &mut out));
}

/// Observed 1, 2, 5 and censored 6: Kaplan–Meier masses ¼ at 1, 2 and 5, survival ¼ past
/// 6; median 2, so the tail mean is ((5 − 2) + (6 − 2))/1 = 7. For n = 1,
/// E T = ∫ S = 1 + ¾ + ½·3 + ¼·1 + ¼·7 = 5.25; for n = 2 the minimum is
/// ∫ S² = 1 + 9/16 + ¼·3 + 1/16 + (1/16)·7/2 = 2.59375 and the maximum 2·5.25 − 2.59375.
#[test]
fn censored_tail_is_integrated_exactly() {
    let mut w = RttWindow::<Heap>::new(8, MAX_EXACT_ORDER).unwrap();
    for (t, censored) in [(5.0, false), (1.0, false), (6.0, true), (2.0, false)] {
        w.push(secs(t), censored);
    }
    assert_eq!(w.fresh(), 4);
    let mut one = [0.0; 1];
    assert!(w.expected_order_statistics(1, &mut one));
    assert_eq!(w.fresh(), 0);
    assert!((one[0] - 5.25).abs() < 1e-9, "{one:?}");
    let mut two = [0.0; 2];
    assert!(w.expected_order_statistics(2, &mut two));
    assert!((two[0] - 2.593_75).abs() < 1e-9, "{two:?}");
    assert!((two[1] - (10.5 - 2.593_75)).abs() < 1e-9, "{two:?}");
}

#[test]
fn shifted_exponential_closed_form_uncensored() {
    let (n, shift, rate) = (16usize, 1.0, 1.0);
    let mut w = RttWindow::<Heap>::new(MAX_RTT_SAMPLES, MAX_EXACT_ORDER).unwrap();
    let m = MAX_RTT_SAMPLES;
    for i in 0..m {
        w.push(secs(shifted_exp_quantile((i as f64 + 0.5) / m as f64, shift, rate)), false);
    }
    let mut out = [0.0; 16];
    assert!(w.expected_order_statistics(n, &mut out));
    for k in 1..=n {
        let exact = shifted_exp_order_statistic(n as u32, k as u32, shift, rate);
        assert!((out[k - 1] - exact).abs() / exact < 0.01, "k={k} est={} exact={exact}", out[k - 1]);
    }
    assert!((shifted_exp_order_statistic(16, 16, 1.0, 1.0) - (1.0 + 3.380_728_993)).abs() < 1e-8);
    assert_eq!(shifted_exp_order_statistic(4, 1, 0.0, 2.0), 0.125);
}

/// Option A censoring: each iteration observes only its k fastest round trips; the other
/// n − k are censored at the k-th. Kaplan–Meier plus the exponential tail still recovers
/// the closed form for every k, including those never observed.
#[test]
fn shifted_exponential_closed_form_censored() {
    let (n, shift, rate) = (16usize, 1.0, 0.5);
    for k_obs in [2usize, 8, 14] {
        let mut w = RttWindow::<Heap>::new(MAX_RTT_SAMPLES, MAX_EXACT_ORDER).unwrap();
        let mut rng = 0x9E37_79B9_7F4A_7C15u64;
        for _ in 0..MAX_RTT_SAMPLES / n {
            let mut draws: Vec<f64> = (0..n)
                .map(|_| {
                    rng ^= rng << 13;
                    rng ^= rng >> 7;
                    rng ^= rng << 17;
                    shifted_exp_quantile((rng >> 11) as f64 / (1u64 << 53) as f64, shift, rate)
                })
                .collect();
            draws.sort_by(f64::total_cmp);
            let close = draws[k_obs - 1];
            for (i, d) in draws.iter().enumerate() {
                if i < k_obs { w.push(secs(*d), false) } else { w.push(secs(close), true) }
            }
        }
        let mut out = [0.0; 16];
        assert!(w.expected_order_statistics(n, &mut out));
        for k in 1..=n {
            let exact = shifted_exp_order_statistic(n as u32, k as u32, shift, rate);
            let tol = if k <= k_obs { 0.03 } else { 0.08 };
            assert!(
                (out[k - 1] - exact).abs() / exact < tol,
                "observed {k_obs}: k={k} est={} exact={exact}",
                out[k - 1]
            );
        }
    }
}

#[test]
fn window_evicts_the_oldest() {
    let mut w = RttWindow::<Heap>::new(2, MAX_EXACT_ORDER).unwrap();
    w.push(secs(100.0), false);
    w.push(secs(1.0), false);
    w.push(secs(1.0), false);
    assert_eq!(w.len(), 2);
    let mut out = [0.0; 1];
    assert!(w.expected_order_statistics(1, &mut out));
    assert!((out[0] - 1.0).abs() < 1e-9);
    w.clear();
    assert!(w.is_empty());
    w.push(secs(1.0), true);
    assert!(!w.expected_order_statistics(1, &mut out), "only censored samples");
}

#[test]
fn decrease_grows_with_k_and_saturates() {
    let (g, s, l_eta) = (1.0, 10.0, 0.5);
    let d: Vec<f64> = (1..=64).map(|k| expected_decrease(g, s, l_eta, k)).collect();
    assert!(d.windows(2).all(|w| w[1] > w[0]));
    let limit = (1.0 - l_eta / 2.0) * g;
    assert!(d.iter().all(|x| *x < limit));
    assert!(limit - d[63] < 0.1 * limit);
    // Increments shrink (concave in k): saturation.
    assert!(d.windows(3).all(|w| w[2] - w[1] < w[1] - w[0]));
    assert_eq!(expected_decrease(g, s, l_eta, 0), f64::NEG_INFINITY);
}

#[test]
fn chosen_k_grows_as_the_signal_to_noise_ratio_shrinks() {
    let n = 16u32;
    let tau: Vec<f64> = (1..=n).map(|k| shifted_exp_order_statistic(n, k, 1.0, 1.0)).collect();
    let mut last = 0;
    let mut ks = Vec::new();
    for g_over_s in [10.0, 1.0, 0.3, 0.1, 0.03, 0.01, 0.003] {
        // No k with a positive expected decrease: wait for all.
        let k = choose_k(g_over_s, 1.0, 1.0, &tau, 1, n).map_or(n, |c| c.0);
        assert!(k >= last, "G/S={g_over_s}: k={k} < {last}");
        last = k;
        ks.push(k);
    }
    assert!(ks[0] <= 2 && *ks.last().unwrap() == n, "{ks:?}");
    // Bounds are honoured; no positive decrease means no choice.
    assert_eq!(choose_k(100.0, 1.0, 1.0, &tau, 5, 9).unwrap().0, 5);
    assert_eq!(choose_k(0.0, 1.0, 1.0, &tau, 1, n), None);
    assert_eq!(choose_k(1.0, 0.0, 2.5, &tau, 1, n), None);
    assert_eq!(choose_k(1.0, 1.0, 1.0, &tau[..3], 1, n).map(|c| c.0 <= 3), Some(true));
}

proptest! {
    /// The window holds exactly the newest `capacity` samples since the last clear (as a
    /// multiset: the estimators sort them), and counts the pushes since the last estimate.
    #[test]
    fn window_keeps_the_newest_samples(
        capacity in 1usize..9,
        ops in proptest::collection::vec((0u64..50, any::<bool>(), 0u8..12), 0..80),
    ) {
        let mut w = RttWindow::<Heap>::new(capacity, MAX_EXACT_ORDER).unwrap();
        let mut pushed: Vec<u32> = Vec::new();
        for (t, censored, action) in ops {
            if action == 0 {
                w.clear();
                pushed.clear();
            } else {
                w.push(Duration::from_micros(t), censored);
                pushed.push(rtt_key(Duration::from_micros(t), censored));
            }
            let newest = &pushed[pushed.len().saturating_sub(capacity)..];
            prop_assert_eq!(w.len(), newest.len());
            let mut held = w.ring.as_flattened()[..w.len()].to_vec();
            let mut want = newest.to_vec();
            held.sort_unstable();
            want.sort_unstable();
            prop_assert_eq!(held, want);
            prop_assert_eq!(w.fresh(), pushed.len());
        }
    }

    /// Order statistics are non-decreasing in k, bounded by the sample range (plus the
    /// tail), and never NaN, whatever the samples and censoring.
    #[test]
    fn order_statistics_are_monotone(
        samples in proptest::collection::vec((1u64..10_000, any::<bool>()), 1..300),
        n in 1usize..40,
    ) {
        let mut w = RttWindow::<Heap>::new(256, MAX_EXACT_ORDER).unwrap();
        for (t, c) in &samples { w.push(Duration::from_micros(*t), *c); }
        let mut out = vec![0.0; n];
        if w.expected_order_statistics(n, &mut out) {
            let lo = samples.iter().map(|s| s.0).min().unwrap() as f64 / 1e6;
            prop_assert!(out.iter().all(|x| x.is_finite() && *x >= lo - 1e-9));
            prop_assert!(out.windows(2).all(|p| p[1] >= p[0] - 1e-9), "{:?}", out);
        }
    }
}
