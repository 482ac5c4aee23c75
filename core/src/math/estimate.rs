//! Online estimators for choosing how many gradients to wait for (dynamic backup workers,
//! [`crate::proto::dbw`]): an exponential moving average, the gradient-norm and
//! gradient-noise estimates from the `k` gradients of one iteration, the expected-decrease
//! model `D(k)`, and expected order statistics `E[T_(k:n)]` of round-trip times from a
//! fixed-size, possibly right-censored window of samples.
//!
//! Everything runs in fixed buffers in the caller's storage (no allocation with `Inline`) with `libm` for the transcendental
//! functions, so it works in the `no_std` core.
//!
//! # Order statistics from a censored window
//!
//! [`RttWindow`] keeps the last [`MAX_RTT_SAMPLES`] (or fewer) round-trip times, each either
//! *observed* or *right-censored* (the worker was told to abandon its computation when the
//! iteration closed, so all we know is that its round trip would have taken longer).
//! [`RttWindow::expected_order_statistics`] pools them (identical workers), builds the
//! Kaplan–Meier estimate of the distribution, and integrates
//! `E[T_(k:n)] = ∫₀^∞ P(Bin(n, F(x)) < k) dx` exactly over its steps, for every `k` at
//! once. The mass Kaplan–Meier cannot place (beyond the largest sample, when the largest
//! samples are censored) gets an exponential tail whose mean is the censored-data maximum
//! likelihood estimate `Σ (t_i − u)⁺ / #{observed t_i > u}` above a threshold `u` (the
//! Kaplan–Meier median, or the smallest sample when fewer than half were observed),
//! integrated in closed form (the draws that land in the tail are `Bin(n, mass)` many
//! i.i.d. exponentials past the last sample). That tail is exact for shifted-exponential
//! round trips (memorylessness) and an underestimate for heavier tails; this is this project's reconstruction (docs/PROTOCOLS.md
//! §3.3 leaves the censoring method open).

use crate::error::ConfigError;
use crate::storage::Storage;
use crate::time::Duration;

/// The largest `n` for which [`RttWindow::expected_order_statistics`] integrates the exact
/// order statistics (its binomial tables are this long); above it
/// [`RttWindow::quantile_order_statistics`] approximates them by quantiles.
pub const MAX_EXACT_ORDER: usize = 256;

/// The largest capacity of an [`RttWindow`] in samples (pooled over workers). With `n`
/// workers a window of `W` iterations holds `min(W·n, MAX_RTT_SAMPLES)` samples, and at
/// most [`RTT_CHUNK`] per entry of the caller's tables. Memory: two `u32` per sample;
/// samples have microsecond resolution and saturate at about 35 minutes.
pub const MAX_RTT_SAMPLES: usize = 2048;

/// An exponential moving average with start-up bias correction (as in Adam): after samples
/// `x_1..x_t` it is `Σ β^(t−i) x_i / Σ β^(t−i)`, the weighted mean of the samples so far.
/// Early on every sample counts about equally (no bias towards zero, and no outsized weight
/// on the first sample); later the weights decay with time constant `1/(1 − β)`.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct Ema {
    beta: f64,
    /// `1 − β`, computed once.
    rest: f64,
    /// `Σ β^(t−i) (1 − β) x_i`.
    sum: f64,
    /// `Σ β^(t−i) (1 − β) = 1 − β^t`.
    weight: f64,
}

impl Ema {
    /// An empty average with smoothing factor `beta` (clamped to `[0, 1)`; 0 keeps only the
    /// latest sample).
    pub fn new(beta: f64) -> Self {
        let beta = if beta.is_finite() { beta.clamp(0.0, 0.999_999) } else { 0.0 };
        Self { beta, rest: 1.0 - beta, sum: 0.0, weight: 0.0 }
    }

    /// Adds a sample; non-finite samples are ignored.
    #[inline]
    pub fn update(&mut self, x: f64) {
        if !x.is_finite() {
            return;
        }
        self.sum = self.beta * self.sum + self.rest * x;
        self.weight = self.beta * self.weight + self.rest;
    }

    /// The current average, if any sample arrived.
    pub fn get(&self) -> Option<f64> {
        (self.weight > 0.0).then(|| self.sum / self.weight)
    }
}

/// The squared gradient norm `G = ‖∇F‖²` and the per-gradient variance `S = E‖g − ∇F‖²`,
/// estimated from the `k` gradients of one iteration (all computed at the same model).
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct NoiseEstimate {
    /// `Ĝ = max(‖ḡ‖² − Ŝ/k, 0)` (unbiased before the clipping).
    pub g: f64,
    /// `Ŝ = (Σ‖g_i‖² − k‖ḡ‖²)/(k − 1)` (unbiased), clipped at zero.
    pub s: f64,
}

/// [`NoiseEstimate`] from the streaming sums of one iteration: `k` gradients whose squared
/// norms add up to `sum_sq_norms`, and whose mean `ḡ` has squared norm `mean_sq_norm`.
/// `None` when `k < 2` (the variance is undefined) or an input is not finite.
pub fn noise_estimate(k: u32, sum_sq_norms: f64, mean_sq_norm: f64) -> Option<NoiseEstimate> {
    if k < 2 || !sum_sq_norms.is_finite() || !mean_sq_norm.is_finite() {
        return None;
    }
    let kf = f64::from(k);
    let s = ((sum_sq_norms - kf * mean_sq_norm) / (kf - 1.0)).max(0.0);
    let g = (mean_sq_norm - s / kf).max(0.0);
    Some(NoiseEstimate { g, s })
}

/// The expected loss decrease of one step averaging `k` gradients, divided by the learning
/// rate `η` (docs/PROTOCOLS.md, "DBW", from the descent lemma for an `L`-smooth loss):
/// `D(k)/η = (1 − Lη/2)·G − Lη·S/(2k)`. It increases with `k` and saturates at
/// `(1 − Lη/2)·G`. `k = 0` gives `-∞`.
pub fn expected_decrease(g: f64, s: f64, l_eta: f64, k: u32) -> f64 {
    if k == 0 {
        return f64::NEG_INFINITY;
    }
    (1.0 - l_eta / 2.0) * g - l_eta * s / (2.0 * f64::from(k))
}

/// The `k` in `k_min..=k_max` that maximises `D(k)/τ(k)`, the expected loss decrease per
/// unit of wall-clock time, with `tau[k-1] = τ(k)` the expected iteration time when waiting
/// for `k` gradients. Ties go to the larger `k`. `None` when no `k` in range has
/// `D(k) > 0` and a positive finite `τ(k)` (then nothing is gained by cutting stragglers;
/// callers wait for all).
pub fn choose_k(g: f64, s: f64, l_eta: f64, tau: &[f64], k_min: u32, k_max: u32) -> Option<(u32, f64)> {
    let mut best: Option<(u32, f64)> = None;
    for k in k_min.max(1)..=k_max {
        let Some(&t) = tau.get(k as usize - 1) else { break };
        let d = expected_decrease(g, s, l_eta, k);
        if !(d > 0.0 && t > 0.0 && t.is_finite()) {
            continue;
        }
        let r = d / t;
        if best.is_none_or(|(_, b)| r >= b) {
            best = Some((k, r));
        }
    }
    best
}

/// `E[T_(k:n)]` for `n` i.i.d. shifted-exponential times `T = shift + Exp(rate)`:
/// `shift + (1/rate) Σ_{j=n−k+1}^{n} 1/j` (the closed form the tests check against).
pub fn shifted_exp_order_statistic(n: u32, k: u32, shift: f64, rate: f64) -> f64 {
    let k = k.min(n);
    let sum: f64 = (n - k + 1..=n).map(|j| 1.0 / f64::from(j)).sum();
    shift + sum / rate
}

/// Writes the probabilities of `Bin(n, p)` into `out[0..=n]` (the rest untouched). Computed
/// from the mode outwards, so no term underflows before the negligible ones. Returns
/// `false` (and writes nothing) if `out` is shorter than `n + 1` or `n` exceeds
/// [`MAX_EXACT_ORDER`].
pub fn binomial_pmf(n: usize, p: f64, out: &mut [f64]) -> bool {
    let mut table = [0.0; MAX_EXACT_ORDER + 1];
    log_binomials(n, &mut table) && pmf_with(n, p, &table, out)
}

/// Writes `ln C(n, m)` into `out[m]` for `m` in `0..=n` (one `ln` per entry, by the
/// multiplicative recurrence). `false` if `out` is too short.
fn log_binomials(n: usize, out: &mut [f64]) -> bool {
    let Some(out) = out.get_mut(..=n) else { return false };
    let mut x = 0.0;
    for (m, o) in out.iter_mut().enumerate() {
        if m > 0 {
            x += libm::log((n - m + 1) as f64 / m as f64);
        }
        *o = x;
    }
    true
}

/// [`binomial_pmf`] with `ln C(n, m)` precomputed in `log_binom` (see [`log_binomials`]).
fn pmf_with(n: usize, p: f64, log_binom: &[f64], out: &mut [f64]) -> bool {
    let Some(out) = out.get_mut(..=n) else { return false };
    out.fill(0.0);
    let p = if p.is_nan() { 0.0 } else { p.clamp(0.0, 1.0) };
    if p <= 0.0 || p >= 1.0 {
        let at = if p <= 0.0 { 0 } else { n };
        if let Some(x) = out.get_mut(at) {
            *x = 1.0;
        }
        return true;
    }
    let nf = n as f64;
    let mode = (libm::floor((nf + 1.0) * p) as usize).min(n);
    let mf = mode as f64;
    let log_mode = log_binom.get(mode).copied().unwrap_or(0.0) + mf * libm::log(p) + (nf - mf) * libm::log1p(-p);
    let odds = p / (1.0 - p);
    let mut x = libm::exp(log_mode);
    if let Some(o) = out.get_mut(mode) {
        *o = x;
    }
    for j in mode..n {
        x *= (nf - j as f64) / (j as f64 + 1.0) * odds;
        if let Some(o) = out.get_mut(j + 1) {
            *o = x;
        }
    }
    x = libm::exp(log_mode);
    for j in (1..=mode).rev() {
        x *= j as f64 / (nf - j as f64 + 1.0) / odds;
        if let Some(o) = out.get_mut(j - 1) {
            *o = x;
        }
    }
    true
}

/// Adds `width · P(Bin(n, cdf) < k)` to `out[k-1]` for every `k` in `1..=n`: one step of
/// `E[T_(k:n)] = ∫ P(Bin(n, F(x)) < k) dx`.
fn add_step(n: usize, width: f64, cdf: f64, log_binom: &[f64], pmf: &mut [f64], out: &mut [f64]) {
    if width.is_nan() || width <= 0.0 || !pmf_with(n, cdf, log_binom, pmf) {
        return;
    }
    let mut below = 0.0;
    for (o, p) in out.iter_mut().take(n).zip(pmf.iter()) {
        below += *p;
        *o += width * below.min(1.0);
    }
}

const CENSORED: u32 = 1;

/// A round trip as the windows store it: `micros << 1 | censored` (microseconds, saturating
/// at `u32::MAX >> 1`), so that sorting puts an observation before a censoring at the same
/// time (the Kaplan–Meier convention).
#[inline(always)]
pub(crate) fn rtt_key(rtt: Duration, censored: bool) -> u32 {
    let micros = (rtt.as_nanos() / 1_000).min(u64::from(u32::MAX >> 1)) as u32;
    (micros << 1) | u32::from(censored)
}

/// Samples per entry of an [`RttWindow`]'s tables: a window in storage `M` holds
/// [`RTT_CHUNK`] samples per table entry, so `Inline<N>` holds at most `RTT_CHUNK · N`.
pub const RTT_CHUNK: usize = 4;

/// A ring of round-trip times, each observed or right-censored, pooled over workers, in the
/// caller's storage `M`. See the [module docs](self) for the estimator.
#[derive(Debug)]
pub struct RttWindow<M: Storage> {
    /// Samples as `micros << 1 | censored`, so that sorting puts an observation before a
    /// censoring at the same time (the Kaplan–Meier convention); [`RTT_CHUNK`] per entry.
    ring: M::Table<[u32; RTT_CHUNK]>,
    sorted: M::Table<[u32; RTT_CHUNK]>,
    capacity: usize,
    /// Where the next sample goes: `len` while the ring fills, then the oldest sample.
    next: usize,
    len: usize,
    /// Samples pushed since the last successful [`RttWindow::expected_order_statistics`].
    fresh: usize,
    /// `ln C(n, m)` for `m` in `0..=log_binom_n` (`log_binom_n == 0`: not computed yet), in
    /// pairs (a table of `n` pairs holds `n + 1`).
    log_binom: M::Table<[f64; 2]>,
    log_binom_n: usize,
    /// Work space for the binomial probabilities, in pairs.
    pmf: M::Table<[f64; 2]>,
}

impl<M: Storage> RttWindow<M> {
    /// An empty window keeping the newest `capacity` samples (clamped to
    /// `1..=MAX_RTT_SAMPLES`, and to what `M` holds: [`RTT_CHUNK`] samples per table entry)
    /// whose exact order statistics reach `max_order` draws (at most [`MAX_EXACT_ORDER`]).
    /// An error when `M` cannot hold even one entry per table.
    pub fn new(capacity: usize, max_order: usize) -> Result<Self, ConfigError> {
        let wanted = capacity.clamp(1, MAX_RTT_SAMPLES).div_ceil(RTT_CHUNK);
        let ring = match M::table(wanted, [0; RTT_CHUNK]) {
            Err(ConfigError::TableTooSmall { capacity: held, .. }) if held > 0 && held < wanted => {
                M::table(held, [0; RTT_CHUNK])?
            }
            other => other?,
        };
        let entries = ring.as_ref().len();
        let pairs = (max_order.clamp(1, MAX_EXACT_ORDER) + 1).div_ceil(2);
        Ok(Self {
            sorted: M::table(entries, [0; RTT_CHUNK])?,
            ring,
            capacity: capacity.clamp(1, MAX_RTT_SAMPLES).min(entries * RTT_CHUNK),
            next: 0,
            len: 0,
            fresh: 0,
            log_binom: M::table(pairs, [0.0; 2])?,
            log_binom_n: 0,
            pmf: M::table(pairs, [0.0; 2])?,
        })
    }

    /// The number of samples held.
    pub fn len(&self) -> usize {
        self.len
    }

    /// Whether the window is empty.
    pub fn is_empty(&self) -> bool {
        self.len == 0
    }

    /// The capacity in samples.
    pub fn capacity(&self) -> usize {
        self.capacity
    }

    /// Adds a sample (evicting the oldest when full). `censored`: the true round trip is
    /// longer than `rtt`.
    #[inline]
    pub fn push(&mut self, rtt: Duration, censored: bool) {
        let key = rtt_key(rtt, censored);
        // `next < capacity ≤` the ring's length.
        if let Some(slot) = self.ring.as_mut().as_flattened_mut().get_mut(self.next) {
            *slot = key;
        }
        // One conditional reset wraps (no division on every round trip).
        let next = self.next + 1;
        self.next = if next >= self.capacity { 0 } else { next };
        if self.len < self.capacity {
            self.len += 1;
        }
        self.fresh = self.fresh.saturating_add(1);
    }

    /// Samples pushed since the last successful
    /// [`expected_order_statistics`](Self::expected_order_statistics) (or since creation).
    /// Callers use it to decide when the window changed enough to be worth re-estimating.
    pub fn fresh(&self) -> usize {
        self.fresh
    }

    /// Forgets every sample.
    pub fn clear(&mut self) {
        self.next = 0;
        self.len = 0;
        self.fresh = 0;
    }

    /// Writes an approximation of `E[T_(k:n)]` in seconds into `out[k-1]` for `k` in
    /// `1..=n`, for large `n`: the window's `k/(n+1)` quantile (the order statistics of `n`
    /// i.i.d. draws concentrate at the quantiles as `n` grows; censored samples count at
    /// their censoring time, which biases the slowest quantiles low). Returns `false`,
    /// writing nothing, if the window is empty or `out` is shorter than `n`. Cost: a sort of
    /// the window plus `O(n)`.
    pub fn quantile_order_statistics(&mut self, n: usize, out: &mut [f64]) -> bool {
        let (Some(ring), Some(sorted)) = (
            self.ring.as_ref().as_flattened().get(..self.len),
            self.sorted.as_mut().as_flattened_mut().get_mut(..self.len),
        ) else {
            return false;
        };
        let Some(out) = out.get_mut(..n) else { return false };
        if n == 0 || ring.is_empty() {
            return false;
        }
        sorted.copy_from_slice(ring);
        sorted.sort_unstable();
        let last = sorted.len() - 1;
        for (k, o) in out.iter_mut().enumerate() {
            let at = ((k + 1) as f64 / (n + 1) as f64 * sorted.len() as f64) as usize;
            *o = sorted.get(at.min(last)).map_or(0.0, |key| f64::from(key >> 1) / 1e6);
        }
        self.fresh = 0;
        true
    }

    /// Writes `E[T_(k:n)]` in seconds into `out[k-1]` for `k` in `1..=n`, for `n` i.i.d.
    /// draws from the window's (Kaplan–Meier) distribution. Returns `false`, writing
    /// nothing, if there is no observed sample, `n` is 0 or above the `max_order` the window
    /// was made for ([`RttWindow::new`]), or
    /// `out` is shorter than `n`. Cost: a sort of the window plus `O(n)` per distinct
    /// observed time.
    pub fn expected_order_statistics(&mut self, n: usize, out: &mut [f64]) -> bool {
        let order = (self.log_binom.as_ref().len() * 2).saturating_sub(1);
        if n == 0 || n > order || out.len() < n || self.len == 0 {
            return false;
        }
        // The samples held are `ring[..len]` as a set (the write position wraps only once the ring is
        // full), and they are sorted next, so their order does not matter.
        let (Some(ring), Some(sorted)) = (
            self.ring.as_ref().as_flattened().get(..self.len),
            self.sorted.as_mut().as_flattened_mut().get_mut(..self.len),
        ) else {
            return false;
        };
        sorted.copy_from_slice(ring);
        sorted.sort_unstable();
        let sorted: &[u32] = sorted;
        let secs = |key: u32| f64::from(key >> 1) / 1e6;
        let observed = |key: u32| key & CENSORED == 0;
        if !sorted.iter().any(|k| observed(*k)) {
            return false;
        }

        let Some(out) = out.get_mut(..n) else { return false };
        // `ln C(n, ·)` changes only with `n`: computed once per live count.
        if self.log_binom_n != n {
            if !log_binomials(n, self.log_binom.as_mut().as_flattened_mut()) {
                return false;
            }
            self.log_binom_n = n;
        }
        let (log_binom, pmf) = (self.log_binom.as_ref().as_flattened(), self.pmf.as_mut().as_flattened_mut());
        out.fill(0.0);
        // One pass over the Kaplan–Meier steps: integrate, and find the median (the tail
        // threshold; the smallest sample when the observed mass never reaches one half).
        let first = sorted.first().map_or(0, |k| k >> 1);
        let mut threshold = first;
        let (mut x, mut cdf) = (0.0f64, 0.0f64);
        for_each_km_step(sorted, |micros, mass| {
            let t = f64::from(micros) / 1e6;
            add_step(n, t - x, cdf, log_binom, pmf, out);
            x = t;
            let before = cdf;
            cdf = (cdf + mass).min(1.0);
            if before < 0.5 && cdf >= 0.5 {
                threshold = micros;
            }
        });
        if cdf < 0.5 {
            threshold = first;
        }
        // Censored exponential MLE of the mean excess above the threshold (in integer
        // microseconds, over the sorted samples above it).
        let above = sorted.get(sorted.partition_point(|k| k >> 1 <= threshold)..).unwrap_or(&[]);
        let (mut excess, mut events) = (0u64, 0u32);
        for key in above {
            excess += u64::from((key >> 1).saturating_sub(threshold));
            events += u32::from(observed(*key));
        }
        let tail_mean = if events > 0 { excess as f64 / 1e6 / f64::from(events) } else { 0.0 };
        let last = sorted.last().map_or(0.0, |k| secs(*k));
        let tail_mass = (1.0 - cdf).max(0.0);
        if tail_mass > 1e-12 {
            add_step(n, last - x, cdf, log_binom, pmf, out);
            // Beyond `last` each draw lies with probability `tail_mass`, then at `last` plus
            // an Exp(mean θ) excess. With J ~ Bin(n, tail_mass) draws there, T_(k:n) is
            // the (k − n + J)-th smallest of J exponentials (memorylessness), so
            // E[(T_(k:n) − last)⁺] = θ Σ_{J > n−k} P(J) Σ_{i=n−k+1}^{J} 1/i
            //                      = θ Σ_{i=n−k+1}^{n} P(J ≥ i)/i,
            // exact, with one binomial and a suffix sum for every k at once.
            if tail_mean > 0.0 && pmf_with(n, tail_mass, log_binom, pmf) {
                let (mut at_least, mut sum) = (0.0, 0.0);
                for i in (1..=n).rev() {
                    at_least += pmf.get(i).copied().unwrap_or(0.0);
                    sum += at_least.min(1.0) / i as f64;
                    if let Some(o) = out.get_mut(n - i) {
                        *o += tail_mean * sum;
                    }
                }
            }
        }
        self.fresh = 0;
        true
    }
}

/// Calls `f(time_micros, mass)` for each distinct observed time of the sorted samples, with
/// its Kaplan–Meier probability mass.
fn for_each_km_step(sorted: &[u32], mut f: impl FnMut(u32, f64)) {
    let mut at_risk = sorted.len();
    let mut survival = 1.0f64;
    let mut i = 0;
    while i < sorted.len() {
        let time = sorted.get(i).map_or(0, |k| k >> 1);
        let (mut deaths, mut censored) = (0usize, 0usize);
        while let Some(key) = sorted.get(i) {
            if key >> 1 != time {
                break;
            }
            if key & CENSORED == 0 {
                deaths += 1;
            } else {
                censored += 1;
            }
            i += 1;
        }
        if deaths > 0 && at_risk > 0 {
            let mass = survival * deaths as f64 / at_risk as f64;
            survival -= mass;
            f(time, mass);
        }
        at_risk = at_risk.saturating_sub(deaths + censored);
    }
}

#[cfg(test)]
mod tests;
