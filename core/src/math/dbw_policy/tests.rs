use super::choice::{finite_non_negative, usable};
use super::*;
use crate::math::estimate::{choose_k, shifted_exp_order_statistic};

#[test]
fn bit_tests_give_the_comparisons_verdicts() {
    let edge = [
        0.0,
        -0.0,
        f64::MIN_POSITIVE,
        f64::MIN_POSITIVE / 4.0,
        -f64::MIN_POSITIVE / 4.0,
        f64::from_bits(1),
        -f64::from_bits(1),
        1.0,
        -1.0,
        f64::MAX,
        f64::MIN,
        f64::INFINITY,
        f64::NEG_INFINITY,
        f64::NAN,
        -f64::NAN,
        f64::from_bits(0x7ff0_0000_0000_0001),
        f64::from_bits(u64::MAX),
    ];
    for x in edge {
        assert_eq!(usable(x), x > 0.0 && x.is_finite(), "{x:e} ({:#x})", x.to_bits());
        assert_eq!(finite_non_negative(x), x >= 0.0 && x.is_finite(), "{x:e} ({:#x})", x.to_bits());
    }
}

#[test]
fn split_decrease_reduces_to_the_descent_lemma() {
    // a = b = Lη is the single-curvature model.
    for k in 1..8 {
        let single = super::super::estimate::expected_decrease(3.0, 5.0, 0.7, k);
        assert!((expected_decrease_split(3.0, 5.0, 0.7, 0.7, k) - single).abs() < 1e-12);
    }
    assert_eq!(expected_decrease_split(1.0, 1.0, 1.0, 1.0, 0), f64::NEG_INFINITY);
}

#[test]
fn low_noise_curvature_keeps_a_positive_choice_where_the_bound_gives_none() {
    // G = 1, S = 100, 16 workers with τ(k) = 1 + k/16: with one curvature Lη = 1 no k
    // has D > 0 (0.5 − 50/k < 0 for k ≤ 16), with the noise at b = 0.05 it is
    // 0.5 − 2.5/k > 0 from k = 6, and the rate (0.5 − 2.5/k)/(1 + k/16) peaks at
    // k = 10 (0.25/1.625 = 0.1538 vs k = 9: 0.2222/1.5625 = 0.1422, k = 11:
    // 0.2727/1.6875 = 0.1616, k = 12: 0.2917/1.75 = 0.1667, k = 13: 0.3077/1.8125 =
    // 0.1698, k = 14: 0.3214/1.875 = 0.1714, k = 15: 0.3333/1.9375 = 0.1720,
    // k = 16: 0.34375/2 = 0.1719).
    let tau: [f64; 16] = core::array::from_fn(|i| 1.0 + (i + 1) as f64 / 16.0);
    assert_eq!(choose_k(1.0, 100.0, 1.0, &tau, 1, 16), None);
    let (k, rate) = choose_k_split(1.0, 100.0, 1.0, 0.05, &tau, 1, 16).unwrap();
    assert_eq!(k, 15);
    assert!((rate - (0.5 - 2.5 / 15.0) / (1.0 + 15.0 / 16.0)).abs() < 1e-12);
    // Nothing positive: None (the caller holds its k).
    assert_eq!(choose_k_split(1.0, 100.0, 2.5, 0.05, &tau, 1, 16), None);
}

#[test]
fn noise_scale_choice_matches_the_closed_form() {
    // τ(k) = 1 + k/16 (16 workers). Cost τ(k)(G + S/k) = (1 + k/16)(G + S/k); its
    // derivative vanishes where k² G/16 = S, i.e. k* = 4·sqrt(S/G).
    let tau: [f64; 16] = core::array::from_fn(|i| 1.0 + (i + 1) as f64 / 16.0);
    // S/G = 4: k* = 8 exactly (cost 1.5·(1 + 0.5) = 2.25 against 2.2578 at k = 7, 9).
    let (k, cost) = choose_k_noise_scale(1.0, 4.0, &tau, 1, 16).unwrap();
    assert_eq!(k, 8);
    assert!((cost - 2.25).abs() < 1e-12);
    // S/G = 1: k* = 4 (cost 1.25·1.25 = 1.5625; k = 3: 1.1875·1.3333 = 1.5833; k = 5:
    // 1.3125·1.2 = 1.575).
    assert_eq!(choose_k_noise_scale(1.0, 1.0, &tau, 1, 16).map(|c| c.0), Some(4));
    // No signal (G ≤ 0 or not finite): the most gradients per second, argmin τ(k)/k =
    // argmin 1/k + 1/16, the largest k.
    assert_eq!(choose_k_noise_scale(0.0, 1.0, &tau, 1, 16).map(|c| c.0), Some(16));
    assert_eq!(choose_k_noise_scale(-3.0, 1.0, &tau, 1, 16).map(|c| c.0), Some(16));
    assert_eq!(choose_k_noise_scale(f64::NAN, 1.0, &tau, 1, 16).map(|c| c.0), Some(16));
    // A steep order statistic: τ(k) of 16 shifted exponentials (shift 0.2, mean 1)
    // has its throughput optimum argmin τ(k)/k well inside (k = 7: τ(7)/7 = 0.752/7 =
    // 0.107, against 3.58/16 = 0.224 at k = 16).
    let steep: [f64; 16] = core::array::from_fn(|i| shifted_exp_order_statistic(16, i as u32 + 1, 0.2, 1.0));
    let (k, _) = choose_k_noise_scale(0.0, 1.0, &steep, 1, 16).unwrap();
    let per = |k: usize| steep[k - 1] / k as f64;
    assert!((1..=16).all(|j| per(k as usize) <= per(j) + 1e-12), "k {k}");
    assert_eq!(k, 7);
    // Limits: k_min/k_max respected, unusable τ skipped, bad S refused.
    assert_eq!(choose_k_noise_scale(1.0, 4.0, &tau, 10, 16).map(|c| c.0), Some(10));
    assert_eq!(choose_k_noise_scale(1.0, 4.0, &tau, 1, 5).map(|c| c.0), Some(5));
    let mut holes = tau;
    holes[7] = f64::INFINITY;
    // k = 9: 1.5625·1.4444 = 2.2569 beats k = 7: 1.4375·1.5714 = 2.2589.
    assert_eq!(choose_k_noise_scale(1.0, 4.0, &holes, 1, 16).map(|c| c.0), Some(9));
    assert_eq!(choose_k_noise_scale(1.0, f64::NAN, &tau, 1, 16), None);
    assert_eq!(choose_k_noise_scale(1.0, 4.0, &[0.0; 16], 1, 16), None);
}

#[test]
fn the_default_takes_the_smaller_bound_and_never_falls_back_to_n() {
    let tau: [f64; 16] = core::array::from_fn(|i| 1.0 + (i + 1) as f64 / 16.0);
    // G = 1, S = 100, a = 1, b = 0.05: the greedy rule picks 15 (see
    // low_noise_curvature_keeps_a_positive_choice_where_the_bound_gives_none); the
    // noise-scale k* = 4·sqrt(100) = 40 is cut at 16. The smaller: 15.
    assert_eq!(choose_k_bounded(1.0, 100.0, (1.0, 0.05), &tau, (1, 16), 16, 0.0), Some(15));
    // S/G = 4: noise scale 8; greedy with b = 1: D/η = 0.5 − 2/k > 0 from k = 5, rate
    // (0.5 − 2/k)/(1 + k/16) peaks at k = 10 (0.3/1.625 = 0.1846; k = 9: 0.2778/1.5625 =
    // 0.1778; k = 11: 0.3182/1.6875 = 0.1886; k = 12: 0.3333/1.75 = 0.1905; k = 13:
    // 0.3462/1.8125 = 0.1910; k = 14: 0.3571/1.875 = 0.1905): 13. The smaller: 8.
    assert_eq!(choose_k_split(1.0, 4.0, 1.0, 1.0, &tau, 1, 16).map(|c| c.0), Some(13));
    assert_eq!(choose_k_bounded(1.0, 4.0, (1.0, 1.0), &tau, (1, 16), 16, 0.0), Some(8));
    // Signal dominant (S/G = 0.01, small noise curvature): greedy k = 1 (D barely
    // depends on k, τ does), noise scale k* = 0.4 → 1.
    assert_eq!(choose_k_bounded(1.0, 0.01, (0.5, 0.1), &tau, (1, 16), 16, 0.0), Some(1));
    // No k predicts a decrease (a = 2.5): the noise-scale k, not n.
    assert_eq!(choose_k_split(1.0, 4.0, 2.5, 1.0, &tau, 1, 16), None);
    assert_eq!(choose_k_bounded(1.0, 4.0, (2.5, 1.0), &tau, (1, 16), 16, 0.0), Some(8));
    // Nothing usable: None (the caller holds its k).
    assert_eq!(choose_k_bounded(1.0, 4.0, (1.0, 1.0), &[f64::NAN; 16], (1, 16), 16, 0.0), None);
    // Growth: at most twice the current k (8 from 4, 2 = k_min from 0); down is free.
    assert_eq!(choose_k_bounded(1.0, 100.0, (1.0, 0.05), &tau, (1, 16), 4, 0.0), Some(8));
    assert_eq!(choose_k_bounded(1.0, 100.0, (1.0, 0.05), &tau, (2, 16), 0, 0.0), Some(2));
    assert_eq!(choose_k_bounded(1.0, 4.0, (1.0, 1.0), &tau, (1, 16), 5, 0.0), Some(8));
    assert_eq!(choose_k_bounded(1.0, 0.01, (0.5, 0.1), &tau, (1, 16), 16, 0.0), Some(1));
}

#[test]
fn flat_valley_takes_the_largest_k_within_the_tolerance() {
    // τ(k) = 1 + k/16, G = 1, S = 4: cost (1 + k/16)(1 + 4/k) is 2.25 at k = 8 (the
    // minimum), 2.2569 at k = 9 (+0.31%), 2.275 at k = 10 (+1.11%), 2.3011 at k = 11
    // (+2.27%); 2.2589 at k = 7.
    let tau: [f64; 16] = core::array::from_fn(|i| 1.0 + (i + 1) as f64 / 16.0);
    let within = |tol: f64| choose_k_noise_scale_within(1.0, 4.0, &tau, (1, 16), tol);
    assert_eq!(within(0.0), Some(8));
    assert_eq!(within(0.005), Some(9));
    assert_eq!(within(0.01), Some(9));
    assert_eq!(within(0.02), Some(10));
    assert_eq!(within(0.025), Some(11));
    // Never below the plain choice, never above k_max; bad tolerances count as 0.
    assert_eq!(within(10.0), Some(16));
    assert_eq!(choose_k_noise_scale_within(1.0, 4.0, &tau, (1, 9), 0.5), Some(9));
    assert_eq!(within(-1.0), Some(8));
    assert_eq!(within(f64::NAN), Some(8));
    assert_eq!(within(f64::INFINITY), Some(8));
    // Unusable τ inside the range is skipped, not taken.
    let mut holes = tau;
    holes[9] = f64::NAN;
    assert_eq!(choose_k_noise_scale_within(1.0, 4.0, &holes, (1, 16), 0.02), Some(9));
    assert_eq!(choose_k_noise_scale_within(1.0, f64::NAN, &tau, (1, 16), 0.02), None);
    // The default choice with a tolerance: the noise-scale bound moves up (8 → 10), the
    // greedy one (13) stays above it.
    assert_eq!(choose_k_bounded(1.0, 4.0, (1.0, 1.0), &tau, (1, 16), 16, 0.02), Some(10));
    // Pure noise on the two-speed throughput curve of 11 fast shifted-exponential
    // workers (0.2 + Exp(1), five more always far slower): τ(k)/k is 0.1568, 0.1540,
    // 0.1561, 0.1624 for k = 4..7: the plain rule takes 5, 2% takes 6, 6% takes 7.
    let fast: [f64; 16] =
        core::array::from_fn(|i| if i < 11 { shifted_exp_order_statistic(11, i as u32 + 1, 0.2, 1.0) } else { 100.0 });
    let pick = |tol: f64| choose_k_noise_scale_within(0.0, 1.0, &fast, (1, 16), tol);
    assert_eq!(pick(0.0), Some(5));
    assert_eq!(pick(0.02), Some(6));
    assert_eq!(pick(0.06), Some(7));
}

#[test]
fn curvature_split_recovers_separate_coefficients() {
    // y = 0.8 x1 + 0.1 x2 exactly, with the regressors varying independently.
    let mut c = CurvatureSplit::new(0.95);
    assert_eq!(c.get(0.0, 2.0), None);
    for t in 0..400 {
        let g = if t % 2 == 0 { 0.02 } else { 2.0 + 0.1 * f64::from(t % 7) };
        let noise = 0.2 + 0.1 * f64::from(t % 5);
        c.update(g, noise, 0.8 * g + 0.1 * noise);
    }
    let (a, b) = c.get(0.001, 1.9).unwrap();
    // The ridge (RIDGE = 0.3) pulls both towards the pooled ratio: measured
    // a ≈ 0.69, b ≈ 0.19. The split is what matters: the noise curvature comes out well
    // below the signal one, where a single curvature would charge both alike.
    assert!((a - 0.8).abs() < 0.15 && (b - 0.1).abs() < 0.12 && a > 3.0 * b, "a {a} b {b}");
    // Indistinguishable regressors: both go to the pooled ratio.
    let mut c = CurvatureSplit::new(0.9);
    for _ in 0..50 {
        c.update(1.0, 1.0, 0.6);
    }
    let (a, b) = c.get(0.0, 2.0).unwrap();
    assert!((a - 0.3).abs() < 1e-9 && (b - 0.3).abs() < 1e-9, "a {a} b {b}");
    // Garbage is ignored; clipping applies.
    c.update(f64::NAN, 1.0, 1.0);
    c.update(-1.0, 0.0, 1.0);
    assert_eq!(c.get(0.5, 0.6), Some((0.5, 0.5)));
}

/// A value from `range` or one of the awkward ones (NaN, ±∞, ±0, negative).
fn awkward(range: core::ops::Range<f64>) -> impl proptest::strategy::Strategy<Value = f64> {
    use proptest::prelude::*;
    prop_oneof![
        8 => range,
        1 => Just(f64::NAN),
        1 => Just(f64::INFINITY),
        1 => Just(f64::NEG_INFINITY),
        1 => Just(0.0),
        1 => Just(-0.0),
        1 => Just(-1.0),
    ]
}

/// A value from `range`, or exactly 0 or 0.1: as jitters, equal values give costs equal
/// up to rounding; 0.1 as both a jitter and a tolerance puts costs at the limit's edge.
fn or_edges(range: core::ops::Range<f64>) -> impl proptest::strategy::Strategy<Value = f64> {
    use proptest::prelude::*;
    prop_oneof![Just(0.0), Just(0.1), range]
}

proptest::proptest! {
    /// The fused default choice is the composition of the single-rule functions it
    /// replaces (noise-scale minimum, flat-valley scan, greedy maximum), on every input:
    /// unusable `τ`, a `τ` shorter than `k_max`, non-finite or negative statistics.
    #[test]
    fn fused_choice_is_the_composition(
        g in awkward(-1.0..10.0), s in awkward(0.0..100.0), a in awkward(0.0..2.5), b in awkward(0.0..2.5),
        tau in proptest::collection::vec(awkward(0.0..3.0), 0..20), k_min in 0u32..20, k_max in 0u32..20,
        current in 0u32..20, tol in awkward(0.0..0.2), sorted in proptest::bool::ANY,
    ) {
        let mut tau = tau;
        if sorted {
            // Increasing like a real τ, with the awkward values left in place.
            let mut t = 0.0;
            for x in tau.iter_mut().filter(|x| x.is_finite() && **x >= 0.0) {
                t += *x;
                *x = t;
            }
        }
        let composed = choose_k_noise_scale_within(g, s, &tau, (k_min, k_max), tol).map(|scale| {
            let k = choose_k_split(g, s, a, b, &tau, k_min, k_max).map_or(scale, |(greedy, _)| greedy.min(scale));
            k.min(current.saturating_mul(2).max(k_min))
        });
        proptest::prop_assert_eq!(choose_k_bounded(g, s, (a, b), &tau, (k_min, k_max), current, tol), composed);
    }

    /// The same on flat valleys, where the one-pass valley scan has work to do: `τ(k)`
    /// makes every cost `c·(1 + jitter)` up to rounding, so many candidates lie within the
    /// tolerance of the minimum (some at the limit's edge, [`or_edges`]), and
    /// `a = 2` predicts no decrease, so the greedy bound does not hide the valley's top.
    #[test]
    fn fused_valley_is_the_scan(
        g in 0.0f64..10.0, s in 0.001f64..100.0, c in 0.01f64..10.0,
        jitter in proptest::collection::vec(or_edges(0.0..0.3), 0..20), k_min in 0u32..20,
        k_max in 0u32..20, tol in or_edges(0.0..0.2),
    ) {
        let tau: std::vec::Vec<f64> = jitter.iter().enumerate().map(|(i, j)| {
            let k = (i + 1) as f64;
            c * (1.0 + j) / (g + s / k)
        }).collect();
        let scan = choose_k_noise_scale_within(g, s, &tau, (k_min, k_max), tol);
        proptest::prop_assert_eq!(choose_k_bounded(g, s, (2.0, 1.0), &tau, (k_min, k_max), u32::MAX, tol), scan);
    }
}

proptest::proptest! {
    /// The default choice stays in `[k_min, k_max]` and at most doubles; it exists
    /// whenever some `τ(k)` is usable; when no `k` predicts a decrease it is the
    /// noise-scale `k` (never `n` merely because the bound is negative); the flat-valley
    /// `k` is never below the plain one and its cost is within the tolerance.
    #[test]
    fn default_choice_invariants(
        g in -1.0f64..10.0, s in 0.0f64..100.0, a in 0.001f64..1.9, b in 0.001f64..1.9,
        steps in proptest::collection::vec(0.0f64..2.0, 16), n in 1u32..17, k_min in 1u32..17,
        current in 0u32..17, tol in 0.0f64..0.2,
    ) {
        let k_min = k_min.min(n);
        let mut tau = [0.0; 16];
        let mut t = 0.0;
        for (x, step) in tau.iter_mut().zip(&steps) {
            t += step + 1e-3;
            *x = t;
        }
        let k = choose_k_bounded(g, s, (a, b), &tau, (k_min, n), current, tol);
        proptest::prop_assert!(k.is_some());
        let k = k.unwrap_or(0);
        proptest::prop_assert!(k >= k_min && k <= n, "k {} outside [{}, {}]", k, k_min, n);
        proptest::prop_assert!(k <= current.saturating_mul(2).max(k_min));
        let plain = choose_k_noise_scale(g, s, &tau, k_min, n);
        let within = choose_k_noise_scale_within(g, s, &tau, (k_min, n), tol);
        if let (Some((p, cost)), Some(w)) = (plain, within) {
            proptest::prop_assert!(w >= p);
            let gp = g.max(0.0);
            let cw = tau[w as usize - 1] * (gp + s / f64::from(w));
            proptest::prop_assert!(cw <= cost * (1.0 + tol) * (1.0 + 1e-12));
        }
        if choose_k_split(g, s, a, b, &tau, k_min, n).is_none() {
            let w = within.unwrap_or(0);
            proptest::prop_assert_eq!(k, w.min(current.saturating_mul(2).max(k_min)));
        }
    }
}
