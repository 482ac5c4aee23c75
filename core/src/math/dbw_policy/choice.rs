//! The choice of `k` from the decrease model and the noise-scale model (module docs of
//! [`super`], "Two bounds on `k`", "Flat valleys", "Growth", "Never collapse to `k = n`").

/// `D(k)/η = (1 − a/2)·G − b·S/(2k)`: the expected loss decrease of a step averaging `k`
/// gradients, divided by `η`, with `a` and `b` the signal and noise curvatures times `η`
/// ([`crate::math::dbw_policy`]). `k = 0` gives `-∞`.
pub fn expected_decrease_split(g: f64, s: f64, a: f64, b: f64, k: u32) -> f64 {
    if k == 0 {
        return f64::NEG_INFINITY;
    }
    (1.0 - a / 2.0) * g - b * s / (2.0 * f64::from(k))
}

/// The `k` in `k_min..=k_max` maximising `D(k)/τ(k)` ([`expected_decrease_split`]) with
/// `tau[k-1] = τ(k)`, among those with `D(k) > 0` and a positive finite `τ(k)`; ties go to
/// the larger `k`. `None` when there is none: the caller keeps its current `k` (module
/// docs), it does not wait for all.
pub fn choose_k_split(g: f64, s: f64, a: f64, b: f64, tau: &[f64], k_min: u32, k_max: u32) -> Option<(u32, f64)> {
    let mut best: Option<(u32, f64)> = None;
    for k in k_min.max(1)..=k_max {
        let Some(&t) = tau.get(k as usize - 1) else { break };
        let d = expected_decrease_split(g, s, a, b, k);
        if !(d > 0.0 && usable(t)) {
            continue;
        }
        let r = d / t;
        if best.is_none_or(|(_, x)| r >= x) {
            best = Some((k, r));
        }
    }
    best
}

/// The `k` in `k_min..=k_max` minimising the predicted time per unit of progress
/// `τ(k)·(1 + B/k)` with `B = S/G` the gradient noise scale ([`crate::math::dbw_policy`], "Two bounds on
/// `k`"), computed as `τ(k)·(G⁺ + S/k)` so that `G ≤ 0` (no measurable signal) is the
/// limit `B → ∞`: the `k` with the most gradients per second. `tau[k-1] = τ(k)`; `k` with a
/// non-positive or non-finite `τ(k)` are skipped; ties go to the larger `k`. `None` when no
/// `k` qualifies or `S` is not finite and non-negative.
pub fn choose_k_noise_scale(g: f64, s: f64, tau: &[f64], k_min: u32, k_max: u32) -> Option<(u32, f64)> {
    if !finite_non_negative(s) {
        return None;
    }
    let g = if g.is_finite() { g.max(0.0) } else { 0.0 };
    let mut best: Option<(u32, f64)> = None;
    for k in k_min.max(1)..=k_max {
        let Some(&t) = tau.get(k as usize - 1) else { break };
        if !usable(t) {
            continue;
        }
        let cost = t * (g + s / f64::from(k));
        if best.is_none_or(|(_, c)| cost <= c) {
            best = Some((k, cost));
        }
    }
    best
}

/// The largest `k` in `k_min..=k_max` whose noise-scale cost `τ(k)·(G⁺ + S/k)`
/// ([`choose_k_noise_scale`]) is within a factor `1 + tolerance` of the smallest (module
/// docs, "Flat valleys"). `tolerance = 0` is [`choose_k_noise_scale`]'s `k`; a negative or
/// non-finite tolerance counts as 0. `None` as for [`choose_k_noise_scale`].
pub fn choose_k_noise_scale_within(
    g: f64,
    s: f64,
    tau: &[f64],
    (k_min, k_max): (u32, u32),
    tolerance: f64,
) -> Option<u32> {
    let (best, cost) = choose_k_noise_scale(g, s, tau, k_min, k_max)?;
    let tolerance = if tolerance.is_finite() { tolerance.max(0.0) } else { 0.0 };
    let limit = cost * (1.0 + tolerance);
    let g = if g.is_finite() { g.max(0.0) } else { 0.0 };
    let mut k = best;
    for j in best.saturating_add(1)..=k_max {
        let Some(&t) = tau.get(j as usize - 1) else { break };
        if usable(t) && t * (g + s / f64::from(j)) <= limit {
            k = j;
        }
    }
    Some(k)
}

/// The default choice ([`crate::math::dbw_policy`], "Two bounds on `k`"): the smaller of the greedy
/// decrease-rate choice [`choose_k_split`] and the noise-scale choice
/// [`choose_k_noise_scale_within`] `tolerance` (the noise-scale one alone when no `k`
/// predicts a decrease), at most twice `current` ([`crate::math::dbw_policy`], "Growth"). `None` only when
/// no `k` has a usable `τ(k)` (or `S` is not finite): the caller holds its `k`.
///
/// One pass over the candidates serves all three (the noise-scale minimum, the flat valley
/// above it and the greedy maximum); every quantity is the same expression as in the three
/// functions it combines, so the choice is theirs bit for bit (test:
/// `fused_choice_is_the_composition`).
///
/// The flat valley in the same pass: the valley's limit is `1 + tolerance` times the final
/// minimum, which is the running minimum from the candidate that sets it on (ties go to the
/// larger `k`, so nothing after it lowers it). So each new minimum restarts the valley at
/// itself, and a later candidate whose cost is within the running limit extends it; the
/// valley's top is then the largest `k` above the final minimum within the final limit,
/// the scan [`choose_k_noise_scale_within`] makes, without a second pass.
#[inline]
pub fn choose_k_bounded(
    g: f64,
    s: f64,
    (a, b): (f64, f64),
    tau: &[f64],
    (k_min, k_max): (u32, u32),
    current: u32,
    tolerance: f64,
) -> Option<u32> {
    if !finite_non_negative(s) {
        return None;
    }
    let g_plus = if g.is_finite() { g.max(0.0) } else { 0.0 };
    let tolerance = if tolerance.is_finite() { tolerance.max(0.0) } else { 0.0 };
    // `D(k)/η = (1 − a/2)·G − (b·S)/(2k)` ([`expected_decrease_split`]), its invariant parts.
    let (signal, noise) = ((1.0 - a / 2.0) * g, b * s);
    // The minimum so far as (k, cost) with k = 0 for none, its limit and the valley's top:
    // the first usable candidate always replaces the sentinels, as `None` would be (a cost
    // is never NaN here: `τ` is positive and finite, `G⁺` and `S/k` finite and
    // non-negative; a rate `d/τ` with `d > 0` neither).
    let (mut scale, mut scale_cost, mut limit, mut within) = (0u32, f64::INFINITY, f64::INFINITY, 0u32);
    let (mut greedy, mut greedy_rate) = (0u32, f64::NEG_INFINITY);
    // `k` from `max(k_min, 1)` up to `k_max` or the end of `tau`, whichever comes first.
    let lo = k_min.max(1);
    let candidates = tau.get(lo as usize - 1..(k_max as usize).min(tau.len())).unwrap_or(&[]);
    for (i, &t) in candidates.iter().enumerate() {
        // `lo + i ≤ k_max`: no overflow.
        let k = lo.wrapping_add(i as u32);
        if !usable(t) {
            continue;
        }
        let kf = f64::from(k);
        let cost = t * (g_plus + s / kf);
        if cost <= scale_cost {
            (scale, scale_cost, limit, within) = (k, cost, cost * (1.0 + tolerance), k);
        } else if cost <= limit {
            within = k;
        }
        let d = signal - noise / (2.0 * kf);
        if d > 0.0 {
            let r = d / t;
            if r >= greedy_rate {
                (greedy, greedy_rate) = (k, r);
            }
        }
    }
    if scale == 0 {
        return None;
    }
    let k = if greedy == 0 { within } else { greedy.min(within) };
    Some(k.min(current.saturating_mul(2).max(k_min)))
}

/// `0 < t < ∞` (NaN is not): a usable `τ(k)`. The verdict of `t > 0.0 && t.is_finite()`
/// from the bits: the positive finite doubles are exactly those whose bits lie in
/// `1..=f64::MAX.to_bits()` (the sign bit clear, the exponent not all ones, not `+0`).
/// Written as comparisons, the test compiles to a chain of floating-point class tests;
/// this is one subtraction and one comparison.
#[inline(always)]
pub(super) fn usable(t: f64) -> bool {
    t.to_bits().wrapping_sub(1) < f64::MAX.to_bits()
}

/// `0 ≤ s < ∞` (`-0` included, NaN not): the verdict of `s >= 0.0 && s.is_finite()`, from
/// the bits as in [`usable`].
#[inline(always)]
pub(super) fn finite_non_negative(s: f64) -> bool {
    let bits = s.to_bits();
    bits <= f64::MAX.to_bits() || bits == (-0.0f64).to_bits()
}
