use super::*;

fn close(a: f64, b: f64, tol: f64) -> bool {
    (a - b).abs() <= tol * (1.0 + b.abs())
}

#[test]
fn an_exact_line_is_fitted_exactly_at_any_beta() {
    for beta in [0.0, 0.5, 0.9, 0.98] {
        let mut t = LossTrend::new();
        for i in 0..50 {
            t.update(beta, 2.0 - 0.015 * f64::from(i));
        }
        let Some(fit) = t.fit(beta) else { panic!("no fit at beta {beta}") };
        let last = 2.0 - 0.015 * 49.0;
        if beta == 0.0 {
            // One effective sample: no slope, the level is the last report.
            assert!(close(fit.level, last, 1e-6) && fit.slope == 0.0, "{fit:?}");
            continue;
        }
        // The moments are `f32`: exact up to its rounding.
        assert!(close(fit.slope, -0.015, 1e-3), "beta {beta}: {fit:?}");
        assert!(close(fit.level, last, 1e-5), "beta {beta}: {fit:?}");
        assert!(fit.noise < 1e-5 && fit.level_error < 1e-2, "beta {beta}: {fit:?}");
    }
}

/// Reports alternating `c ± e` over four iterations with (nearly) equal weights: the
/// ordinary regression line of `x = −3, −2, −1, 0` has `x̄ = −1.5`, `var(x) = 1.25`,
/// `cov(x, y) = (−1.5 + 0.5 + 0.5 − 1.5)·e/4 = −e/2`, the level `ȳ − slope·x̄` and the
/// residual variance `e² − slope·cov`; the level's standard error is
/// `√(noise·(1/4 + x̄²/(4·var(x))))`.
#[test]
fn the_noise_is_the_scatter_about_the_line() {
    let (c, e) = (0.7, 0.2);
    let beta = 0.999_999;
    let mut t = LossTrend::new();
    for y in [c + e, c - e, c + e, c - e] {
        t.update(beta, y);
    }
    let fit = t.fit(beta).expect("a fit");
    let (mx, var_x, cov) = (-1.5, 1.25, -e / 2.0);
    let slope = cov / var_x;
    let noise = e * e - slope * cov;
    assert!(close(fit.slope, slope, 1e-3), "{fit:?} vs {slope}");
    assert!(close(fit.level, c - slope * mx, 1e-3), "{fit:?}");
    assert!(close(fit.noise, noise, 1e-3), "{fit:?} vs {noise}");
    let error = libm::sqrt(noise * (0.25 + mx * mx / (4.0 * var_x)));
    assert!(close(fit.level_error, error, 1e-3), "{fit:?} vs {error}");
    // A constant: level exact, no slope, no noise.
    let mut flat = LossTrend::new();
    (0..20).for_each(|_| flat.update(0.9, 0.25));
    let fit = flat.fit(0.9).expect("a fit");
    assert!(close(fit.level, 0.25, 1e-6) && fit.slope.abs() < 1e-6 && fit.noise < 1e-8, "{fit:?}");
}

#[test]
fn non_finite_reports_are_ignored() {
    let mut t = LossTrend::new();
    assert_eq!(t.fit(0.9), None);
    t.update(0.9, f64::NAN);
    t.update(0.9, f64::INFINITY);
    t.update(0.9, f64::NEG_INFINITY);
    assert_eq!(t.fit(0.9), None);
    t.update(0.9, 1.0);
    t.update(0.9, 0.5);
    let before = t;
    t.update(0.9, f64::NAN);
    // Reports whose moments overflow `f32` are ignored too.
    t.update(0.9, 1e30);
    t.update(0.9, -1e300);
    assert_eq!(t, before);
    assert!(t.fit(0.9).is_some_and(|f| f.slope < 0.0 && f.level.is_finite()));
    // A non-finite β counts as 0: the last report alone.
    let mut zero = LossTrend::new();
    zero.update(f64::NAN, 3.0);
    assert_eq!(zero.fit(0.0).map(|f| f.level), Some(3.0));
}

/// `(L − φ/k)/τ(k)` with `τ(k) = k`: the maximum over real `k` is at `k = 2φ/L`.
#[test]
fn the_loss_rate_choice_has_the_closed_form_optimum() {
    let tau: [f64; 16] = core::array::from_fn(|i| (i + 1) as f64);
    for (level, floor, want) in [(1.0, 2.0, 4), (0.5, 2.0, 8), (1.0, 0.5, 1), (0.25, 2.0, 16)] {
        assert_eq!(choose_k_loss_rate(level, floor, &tau, (1, 16)), Some(want), "L {level}, φ {floor}");
    }
    // Bounded by k_min and k_max; no k above its floor: none.
    assert_eq!(choose_k_loss_rate(1.0, 0.5, &tau, (3, 16)), Some(3));
    assert_eq!(choose_k_loss_rate(0.5, 2.0, &tau, (1, 5)), Some(5));
    assert_eq!(choose_k_loss_rate(0.1, 2.0, &tau, (1, 16)), None);
    // No noise: every k has the whole loss above its floor; the fastest k wins.
    assert_eq!(choose_k_loss_rate(1.0, 0.0, &tau, (1, 16)), Some(1));
    // Bad inputs: none, no panic.
    assert_eq!(choose_k_loss_rate(f64::NAN, 1.0, &tau, (1, 16)), None);
    assert_eq!(choose_k_loss_rate(1.0, -1.0, &tau, (1, 16)), None);
    assert_eq!(choose_k_loss_rate(1.0, 1.0, &[], (1, 16)), None);
    let holes = [f64::NAN, 0.0, -1.0, f64::INFINITY, 5.0];
    assert_eq!(choose_k_loss_rate(1.0, 1.0, &holes, (0, 9)), Some(5));
}
