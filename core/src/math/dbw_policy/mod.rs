//! The adaptive part of DBW's choice of `k` ([`crate::proto::dbw`]): a decrease model with
//! separate curvatures for the signal and the noise ([`CurvatureSplit`]), a choice bounded
//! by that model and by the gradient noise scale ([`choose_k_bounded`]), and expected order
//! statistics of *non-identical* workers from per-worker round-trip windows
//! ([`WorkerRtts`], Poisson-binomial), bounded by the workers' reported losses when they
//! report them ([`LossTrend`], [`choose_k_loss_rate`]). Fixed buffers, no allocation, no
//! panics.
//!
//! Everything here is this project's reconstruction \[RECON\]: the paper's estimator
//! equations were not available (only its abstract). What each rule replaced, the
//! parameter sweeps behind each default and the measured ratios to the best static `b` are
//! in docs/DBW.md; this page states the rules.
//!
//! # Signal and noise curvature ([`CurvatureSplit`])
//!
//! For a loss that is quadratic near the current model (Hessian `H`), one step
//! `w ← w − η ḡ` with `ḡ = ∇F + ξ̄` (mean of `k` gradients, noise covariance `Σ/k`) changes
//! the loss in expectation by exactly
//! `E[ΔF] = −η G + (η²/2) E[ḡᵀHḡ] = −η G + (η/2)(a G + b S/k)` with `G = ‖∇F‖²`,
//! `S = tr Σ`, `a = η ∇FᵀH∇F / G` (the curvature along the gradient, times `η`) and
//! `b = η tr(HΣ)/tr Σ` (the curvature along the noise, times `η`). The descent lemma
//! charges both terms at the largest curvature `L`; on ill-conditioned problems the noise
//! lives mostly in low-curvature directions, `b ≪ ηL`, and the bound becomes negative for
//! every `k` long before progress actually stops. So `D(k)/η = (1 − a/2) G − b S/(2k)`
//! with `a` and `b` measured separately.
//!
//! Both come from the same secant pair the Rayleigh estimate uses: with
//! `y_t = ‖ḡ_{t−1}‖² − ⟨ḡ_t, ḡ_{t−1}⟩ − Ŝ/k_{t−1}` (the gradient change along the last step,
//! minus the noise term whose expectation is `Ŝ/k_{t−1}`), `E[y_t] = η ḡᵀHḡ =
//! a Ĝ_{t−1} + b Ŝ/k_{t−1}`. Over training `G` shrinks while `S/k` does not, so the two
//! regressors vary independently and `(a, b)` follow from exponentially weighted least
//! squares (forgetting factor `β`, [`CurvatureSplit::update`]), regularised towards the
//! pooled ratio `Σy/Σ(Ĝ + Ŝ/k)` (the plain Rayleigh quotient) so that the estimate is
//! defined from the first sample and degrades to the single-curvature model when the data
//! cannot tell the two apart.
//!
//! # Two bounds on `k` ([`choose_k_bounded`], the default)
//!
//! The greedy rule `argmax_k D(k)/τ(k)` ([`choose_k_split`]) maximises the *next*
//! iteration's expected decrease per second. It is right while the gradient is mostly
//! signal and myopic later: once the high-curvature directions sit at the noise
//! equilibrium of the current `k`, `D(k_current) ≈ 0` and every larger `k` predicts a small
//! positive decrease (lowering that equilibrium), a one-off gain rather than a rate, so the
//! rule alone ratchets towards `k = n`.
//!
//! The second bound is the **gradient noise scale** model of McCandlish, Kaplan, Amodei et
//! al. ("An Empirical Model of Large-Batch Training", arXiv 1812.06162, 2018, eqs. 2.7–2.11
//! and §2.3): the steps needed for a given progress scale as `1 + B/k` with
//! `B = tr Σ / ‖∇F‖² = S/G` (their `B_simple`, in units of one worker's gradient). Time per
//! unit of progress is then `τ(k)·(1 + B/k) ∝ τ(k)·(G + S/k)`, minimised by
//! [`choose_k_noise_scale`]. It never predicts a loss increase, so it never needs a
//! fallback; as `G → 0` it tends to the `k` with the most gradients per second, `argmin
//! τ(k)/k`. Their model assumes a step size tuned to the noise; with a constant step it
//! charges the noise more than one step costs, so alone it waits for too many gradients
//! early.
//!
//! Each rule errs towards larger `k` where the other is right, so the default takes the
//! **smaller of the two**. When no `k` has `D(k) > 0` the noise-scale `k` alone is used.
//!
//! # Flat valleys ([`choose_k_noise_scale_within`])
//!
//! The noise-scale cost `τ(k)·(Ĝ + Ŝ/k)` counts steps, not where they lead: with a
//! constant step size the loss settles at a noise floor `≈ ηS/(4k)` that the cost does not
//! see. Where the gradient is mostly noise the cost tends to `τ(k)/k`, which is flat around
//! its minimum; inside such a valley the model's choice is decided by noise in `τ̂`, while
//! the larger `k` has a lower floor at almost the same speed. So the noise-scale bound
//! takes the **largest `k` whose predicted cost is within `1 + δ` of the smallest**
//! ([`crate::proto::dbw::DbwConfig::flat_tolerance`]). `δ = 0` is the plain rule.
//!
//! # Smoothing (`β`, [`crate::proto::dbw::DbwConfig::ema_beta`])
//!
//! Both bounds plan with the averaged `Ĝ` and `Ŝ` (exponential moving averages, factor
//! `β`, bias-corrected at start-up). One iteration's `Ĝ = ‖ḡ‖² − Ŝ/k` is a poor sample
//! once noise dominates: `‖ḡ‖²` scatters by about `Ŝ/k·√(2/d_eff)` (`d_eff = (tr Σ)²/tr Σ²`),
//! which can be several times `Ĝ` itself. An EMA keeps a fraction `(1 − β)/(1 + β)` of one
//! sample's variance, so `β` must be close enough to 1 that the scatter of the average is
//! well below `Ĝ`, or `k` follows the scatter. The price is lag: a gradient distribution
//! that changes within `1/(1 − β)` iterations is followed with that delay (the round trips
//! are not smoothed this way: [`WorkerRtts`] forgets within [`RTT_PER_WORKER`] iterations).
//!
//! # What the gradient statistics cannot see
//!
//! Once the high-curvature directions sit at the noise equilibrium of the current `k`,
//! every gradient statistic the server has (`Ĝ`, `Ŝ`, the curvatures, the secant pair) is
//! stationary, while the loss keeps falling in the low-curvature directions, which weigh
//! `h²` in `Ĝ` but `h` in the loss. The loss above the optimum is then not identifiable from
//! the gradients: summing the unbiased per-step decrease `−(η/2)(‖ḡ_t‖² − Ŝ/k_t +
//! ⟨ḡ_t, ḡ_{t+1}⟩)` is a random walk whose spread grows as the square root of the
//! iterations, and the excess `D̂` over the equilibrium, used as a loss proxy, is the greedy
//! rule again. A rule on these statistics therefore settles at a fixed `k` and a fixed
//! floor `≈ ηS/(4k)`, while each lower target needs a lower floor, hence a larger `k`.
//!
//! # The loss above the noise floor ([`LossTrend`], [`choose_k_loss_rate`])
//!
//! Workers may report their minibatch loss with each gradient. The server averages the
//! reports of each closed iteration and fits a straight line to them, exponentially
//! weighted with the same `β` as `Ĝ` and `Ŝ` ([`LossTrend`]: the level at the latest
//! iteration, the slope, the scatter of the reports about the line and the level's
//! standard error). The line's level rather than an average of the reports: an average of
//! a falling loss lags it by about `β/(1 − β)` iterations.
//!
//! With a constant step `η` and `k` gradients per step, SGD on a locally quadratic loss
//! settles at a noise floor `≈ η·S/(4k)` above the optimum, whatever the curvature (each
//! direction's stationary excess is `η σ_i²/(2k(2 − η h_i)) ≈ η σ_i²/(4k)`). Taking each
//! iteration's expected decrease as proportional to the loss above the floor of its `k`
//! (linear convergence towards the floor, at a rate per iteration that does not depend on
//! `k`), the decrease per second is `(L − η·S/(4k))/τ(k)`, maximised by
//! [`choose_k_loss_rate`]. Far above every floor it picks the fastest `k`; as the loss
//! approaches the floor of small `k`, larger `k` win. The loss is taken as the excess over
//! the optimum, that is the optimum as 0 (true of the NQM, a lower bound for
//! cross-entropy): where the optimum is above 0 the rule sees more loss above the floor than
//! there is and errs towards smaller `k`.
//!
//! The default takes the **smaller** of this `k` and the gradient-statistics choice (the two
//! bounds above). Larger `k` from the loss rule were measured and dropped (docs/DBW.md): its
//! model over-values a lower floor at the deep targets, while early, where the gradient rule
//! waits for more gradients than the signal-dominated steps need, it is right. A worker
//! that reports no loss, a level whose standard error exceeds the level itself, or a loss
//! at or below every floor leave the gradient-statistics choice unchanged. This is a
//! reconstruction \[RECON\]: the paper's abstract says `b_t` is chosen to maximise the
//! convergence speed per iteration; the floor model and the rule are this project's.
//!
//! # Growth
//!
//! `k` at most doubles from one iteration to the next. `τ(k)` above the current `k` rests
//! on censored round trips (the workers cut at the close), so right after the warm-up it is
//! an extrapolation, and an optimistic one. Doubling reaches any `k` within `log₂ n`
//! iterations, and every step up adds observed round trips where the estimate was
//! extrapolated.
//!
//! # Never collapse to `k = n`
//!
//! Under the single-curvature modes ([`super::estimate::choose_k`]) and in
//! [`choose_k_split`], `argmax_k D(k)/τ(k)` is taken over the `k` with `D(k) > 0`. When no
//! `k` has `D(k) > 0` the model sees no expected decrease for any `k` (a noise floor, or an
//! estimate still settling); it then says nothing about which `k` is better, so the caller
//! *keeps its current `k`* (single-curvature modes) or takes the noise-scale `k` (the
//! default) rather than paying the slowest round trip of all for no predicted gain.
//!
//! # Per-worker round trips ([`WorkerRtts`])
//!
//! Each worker keeps its last [`RTT_PER_WORKER`] round trips (observed, or right-censored
//! when the iteration closed without it). A short per-worker ring *is* the forgetting: after
//! a regime change a worker's distribution is entirely new after [`RTT_PER_WORKER`]
//! iterations (half of it after half as many), while the pooled estimate across `n`
//! workers still rests on up to `n·RTT_PER_WORKER` samples. Worker `i`'s distribution
//! `F_i` is the Kaplan–Meier estimate of its own samples; the mass it cannot place (its
//! newest samples censored) gets an exponential tail beyond its last sample with the
//! censored maximum-likelihood mean `Σ_j (t_j − t_min) / max(events_i, 1)` (`t_min` the
//! smallest observed round trip of any worker: a shared shift). A worker that has only been
//! censored is thereby taken to need at least as long again as all its censored waits
//! together: stragglers that are always cut are assumed slow until they are seen to be
//! fast, which keeps a slow part of the cluster out of `k`.
//! With `N(x)` the number of workers done by `x` (Poisson-binomial with the `F_i(x)`),
//! `E[T_(k)] = ∫₀^∞ P(N(x) < k) dx`, integrated over the merged Kaplan–Meier steps plus a
//! geometric grid over the tails (midpoint rule there), `O(n²)` per grid point.
//!
//! # Warm-up
//!
//! The first iteration has no estimate; waiting for all `n` costs the slowest round trip
//! of all, the most expensive order statistic. The proto module starts with `⌈n/4⌉` (at
//! least 2) instead: two or more gradients define `Ŝ`, and every worker then has one round
//! trip, observed or censored, which is all the per-worker windows need to start.

mod choice;
mod curvature;
mod loss_trend;
mod worker_rtts;

pub use choice::{
    choose_k_bounded, choose_k_noise_scale, choose_k_noise_scale_within, choose_k_split, expected_decrease_split,
};
pub use curvature::CurvatureSplit;
pub use loss_trend::{LossFit, LossTrend, choose_k_loss_rate};
pub use worker_rtts::{RTT_PER_WORKER, RTT_TRACKED_WORKERS, WorkerRtts, WorkerWindow, poisson_binomial};

#[cfg(test)]
mod tests;
