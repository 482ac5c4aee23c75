//! Per-worker round-trip windows and the expected order statistics of non-identical
//! workers (module docs of [`super`], "Per-worker round trips").

use crate::error::ConfigError;
use crate::math::estimate::rtt_key;
use crate::storage::Storage;
use crate::time::Duration;

/// Workers tracked by a [`WorkerRtts`]; larger clusters use the pooled
/// [`crate::math::estimate::RttWindow`] (identical workers assumed).
pub const RTT_TRACKED_WORKERS: usize = 64;

/// Round trips kept per worker (the forgetting horizon in iterations).
pub const RTT_PER_WORKER: usize = 16;

// Ring slots are masked with `RTT_PER_WORKER − 1`; lengths and positions are `u8`.
const _: () = assert!(RTT_PER_WORKER.is_power_of_two() && RTT_PER_WORKER <= u8::MAX as usize);

/// Points of the geometric grid over the exponential tails.
const TAIL_POINTS: usize = 48;

/// How far past the last sample the tail grid reaches, in tail means.
const TAIL_SPAN: f64 = 12.0;

const CENSORED: u32 = 1;

/// Bit `i` of a worker mask (0 for `i` beyond the mask).
fn bit(i: usize) -> u64 {
    u32::try_from(i).ok().and_then(|i| 1u64.checked_shl(i)).unwrap_or(0)
}

/// One worker's window and its fit.
#[derive(Clone, Copy, Debug)]
pub struct WorkerWindow {
    /// Samples as `micros << 1 | censored`.
    ring: [u32; RTT_PER_WORKER],
    len: u8,
    next: u8,
    /// Kaplan–Meier step times (µs) and the CDF after each step.
    km_t: [u32; RTT_PER_WORKER],
    km_f: [f64; RTT_PER_WORKER],
    km_len: u8,
    /// The first Kaplan–Meier step not yet passed by the integral's sweep.
    cursor: u8,
    /// The time of the last sample (s), the unplaced mass and the tail mean (s).
    tail: (f64, f64, f64),
}

const EMPTY_WINDOW: WorkerWindow = WorkerWindow {
    ring: [0; RTT_PER_WORKER],
    len: 0,
    next: 0,
    km_t: [0; RTT_PER_WORKER],
    km_f: [0.0; RTT_PER_WORKER],
    km_len: 0,
    cursor: 0,
    tail: (0.0, 0.0, 0.0),
};

/// Per-worker rings of round-trip times and their Poisson-binomial order statistics
/// ([`crate::math::dbw_policy`]), in the caller's storage `M`: one [`WorkerWindow`] and a
/// few `f64` per worker, for up to [`RTT_TRACKED_WORKERS`] workers.
///
/// An estimate does only the work its inputs require, and gives bit for bit what a fit of
/// every window from scratch gives (tests: `incremental_estimate_is_the_from_scratch_one`):
/// a worker is refitted only when its window changed (a push that evicts an equal sample
/// changes nothing) or the shared shift moved; when no live worker's window changed and the
/// live set is the same, the previous order statistics are returned as they are; the
/// integral reads each worker's CDF with a cursor that moves forward along its steps (the
/// evaluation points only increase) instead of scanning them from the start, and walks the
/// merged step times of the live workers from those cursors (no merged copy is stored).
#[derive(Debug)]
pub struct WorkerRtts<M: Storage> {
    windows: M::Table<WorkerWindow>,
    /// `P(N = c)` for `c` in `0..=m`, in pairs (a table of `n` pairs holds `n + 1`).
    pmf: M::Table<[f64; 2]>,
    fresh: usize,
    /// Workers whose window changed since their last fit (bit `i` = worker `i`).
    dirty: u64,
    /// The shift (µs) the current fits were made with.
    fitted_shift: u32,
    /// The last estimate: its `n`, its live set and `E[T_(k)]` (valid when `last_n > 0`).
    last_n: usize,
    last_live: u64,
    last_out: M::Table<f64>,
}

impl<M: Storage> Clone for WorkerRtts<M>
where
    M::Table<WorkerWindow>: Clone,
    M::Table<[f64; 2]>: Clone,
    M::Table<f64>: Clone,
{
    fn clone(&self) -> Self {
        Self {
            windows: self.windows.clone(),
            pmf: self.pmf.clone(),
            fresh: self.fresh,
            dirty: self.dirty,
            fitted_shift: self.fitted_shift,
            last_n: self.last_n,
            last_live: self.last_live,
            last_out: self.last_out.clone(),
        }
    }
}

impl<M: Storage> WorkerRtts<M> {
    /// Empty rings for workers `0..workers` (at most [`RTT_TRACKED_WORKERS`] are tracked:
    /// the tables hold `min(workers, RTT_TRACKED_WORKERS)` entries), or why `M` cannot hold
    /// them.
    pub fn new(workers: usize) -> Result<Self, ConfigError> {
        let n = workers.min(RTT_TRACKED_WORKERS);
        Ok(Self {
            windows: M::table(n, EMPTY_WINDOW)?,
            pmf: M::table((n + 1).div_ceil(2), [0.0; 2])?,
            fresh: 0,
            dirty: u64::MAX,
            fitted_shift: u32::MAX,
            last_n: 0,
            last_live: 0,
            last_out: M::table(n, 0.0)?,
        })
    }

    /// Samples pushed since the last successful estimate.
    pub fn fresh(&self) -> usize {
        self.fresh
    }

    /// Adds worker `worker`'s round trip (evicting its oldest beyond [`RTT_PER_WORKER`]);
    /// ignored for workers beyond the tables.
    #[inline]
    pub fn push(&mut self, worker: usize, rtt: Duration, censored: bool) {
        let key = rtt_key(rtt, censored);
        let Some(w) = self.windows.as_mut().get_mut(worker) else { return };
        // `next < RTT_PER_WORKER`, a power of two: the mask changes nothing and leaves no
        // bounds check.
        let at = usize::from(w.next) & (RTT_PER_WORKER - 1);
        if let Some(slot) = w.ring.get_mut(at) {
            if usize::from(w.len) < RTT_PER_WORKER {
                w.len += 1;
                self.dirty |= bit(worker);
            } else if *slot != key {
                // A full ring that evicts an equal sample holds the same multiset: no refit.
                self.dirty |= bit(worker);
            }
            *slot = key;
        }
        w.next = ((at + 1) % RTT_PER_WORKER) as u8;
        self.fresh = self.fresh.saturating_add(1);
    }

    /// Forgets worker `worker`'s samples (a new incarnation).
    pub fn forget(&mut self, worker: usize) {
        if let Some(w) = self.windows.as_mut().get_mut(worker) {
            w.len = 0;
            w.next = 0;
            self.dirty |= bit(worker);
        }
    }

    /// Fits worker `i`: its Kaplan–Meier steps and tail. Returns `false` if it has no sample.
    fn fit(&mut self, i: usize, shift_micros: u32) -> bool {
        let Some(w) = self.windows.as_mut().get_mut(i) else { return false };
        let n = usize::from(w.len);
        let mut s = [0u32; RTT_PER_WORKER];
        let (Some(sorted), Some(held)) = (s.get_mut(..n), w.ring.get(..n)) else { return false };
        if n == 0 {
            return false;
        }
        sorted.copy_from_slice(held);
        sorted.sort_unstable();
        let (kt, kf) = (&mut w.km_t, &mut w.km_f);
        let (mut at_risk, mut survival, mut steps) = (n, 1.0f64, 0usize);
        let (mut excess, mut events) = (0u64, 0u32);
        let mut j = 0;
        while j < n {
            let key = sorted.get(j).copied().unwrap_or(0);
            let time = key >> 1;
            let (mut deaths, mut cens) = (0usize, 0usize);
            while let Some(k) = sorted.get(j) {
                if k >> 1 != time {
                    break;
                }
                if k & CENSORED == 0 {
                    deaths += 1;
                } else {
                    cens += 1;
                }
                excess += u64::from(time.saturating_sub(shift_micros));
                j += 1;
            }
            events += deaths as u32;
            if deaths > 0 && at_risk > 0 {
                survival -= survival * deaths as f64 / at_risk as f64;
                if let (Some(t), Some(f)) = (kt.get_mut(steps), kf.get_mut(steps)) {
                    *t = time;
                    *f = (1.0 - survival).clamp(0.0, 1.0);
                    steps += 1;
                }
            }
            at_risk = at_risk.saturating_sub(deaths + cens);
        }
        let last = f64::from(sorted.last().map_or(0, |k| k >> 1)) / 1e6;
        let mean = excess as f64 / 1e6 / f64::from(events.max(1));
        w.km_len = steps as u8;
        w.tail = (last, survival.max(0.0), mean.max(1e-6));
        true
    }

    /// Worker `i`'s CDF at `x` seconds (after [`Self::fit`]), reading its steps from its
    /// cursor on: `x` must not decrease between calls after the cursors are reset.
    fn cdf_sweep(w: &mut WorkerWindow, x: f64) -> f64 {
        let steps = usize::from(w.km_len);
        let (last, mass, mean) = w.tail;
        let micros = x * 1e6;
        let mut c = usize::from(w.cursor);
        while c < steps && w.km_t.get(c).is_some_and(|t| f64::from(*t) <= micros) {
            c += 1;
        }
        w.cursor = c as u8;
        let mut f = if c > 0 { w.km_f.get(c - 1).copied().unwrap_or(0.0) } else { 0.0 };
        if x > last && mass > 0.0 {
            f = 1.0 - mass * libm::exp(-(x - last) / mean);
        }
        f.clamp(0.0, 1.0)
    }

    /// The smallest Kaplan–Meier step time (µs) of a worker in `live` that lies above
    /// `after` (any step when `after` is `None`), read from the workers' cursors on (every
    /// step before a cursor is at or below the current point of the sweep).
    fn next_step(&self, n: usize, live: u64, after: Option<u32>) -> Option<u32> {
        let mut next: Option<u32> = None;
        for (i, w) in self.windows.as_ref().iter().enumerate().take(n) {
            if live & bit(i) == 0 {
                continue;
            }
            let steps = w.km_t.get(usize::from(w.cursor)..usize::from(w.km_len)).unwrap_or(&[]);
            if let Some(&t) = steps.iter().find(|&&t| after.is_none_or(|a| t > a)) {
                next = Some(next.map_or(t, |x| x.min(t)));
            }
        }
        next
    }

    /// Writes `E[T_(k:m)]` in seconds into `out[k-1]` for `k` in `1..=m`, where the `m`
    /// workers are those with `live(i)` among `0..n` and each has at least one sample.
    /// Returns `false` (writing nothing) if `n` exceeds the tables, a live worker has no
    /// sample, no sample at all is observed, or `out` is too short.
    ///
    /// The check that nothing changed since the last estimate (then it is copied) is inlined
    /// into the caller; the estimate itself is not.
    #[inline]
    pub fn expected_order_statistics(&mut self, n: usize, live: impl Fn(usize) -> bool, out: &mut [f64]) -> bool {
        if n == 0 || n > self.windows.as_ref().len() {
            return false;
        }
        let mut mask = 0u64;
        let mut m = 0usize;
        for i in (0..n).filter(|&i| live(i)) {
            if self.windows.as_ref().get(i).is_none_or(|w| w.len == 0) {
                return false;
            }
            mask |= bit(i);
            m += 1;
        }
        if m == 0 || out.len() < m {
            return false;
        }
        let Some(out) = out.get_mut(..m) else { return false };
        // Nothing the estimate depends on changed: it is the last one.
        if self.last_n == n && self.last_live == mask && self.dirty & mask == 0 {
            if let Some(last) = self.last_out.as_ref().get(..m) {
                out.copy_from_slice(last);
                self.fresh = 0;
                return true;
            }
        }
        self.estimate(n, mask, out)
    }

    /// [`Self::expected_order_statistics`] of the `out.len()` workers in `mask` (each with at
    /// least one sample) among `0..n`, computed.
    #[inline(never)]
    fn estimate(&mut self, n: usize, mask: u64, out: &mut [f64]) -> bool {
        let m = out.len();
        let live = |i: usize| mask & bit(i) != 0;
        self.last_n = 0;
        // The shared shift: the smallest observed round trip of any live worker.
        let mut shift = u32::MAX;
        for (i, w) in self.windows.as_ref().iter().enumerate().take(n) {
            if !live(i) {
                continue;
            }
            let held = w.ring.get(..usize::from(w.len)).unwrap_or(&[]);
            for k in held.iter().filter(|k| *k & CENSORED == 0) {
                shift = shift.min(k >> 1);
            }
        }
        if shift == u32::MAX {
            return false;
        }
        if shift != self.fitted_shift {
            // Every fit's tail mean depends on the shift.
            self.dirty = u64::MAX;
            self.fitted_shift = shift;
        }
        let mut tail_start = 0.0f64;
        let mut tail_mean = 0.0f64;
        for i in (0..n).filter(|&i| live(i)) {
            if self.dirty & bit(i) != 0 {
                if !self.fit(i, shift) {
                    return false;
                }
                self.dirty &= !bit(i);
            }
            if let Some(w) = self.windows.as_mut().get_mut(i) {
                w.cursor = 0;
                let (last, mass, mean) = w.tail;
                tail_start = tail_start.max(last);
                if mass > 0.0 {
                    tail_mean = tail_mean.max(mean);
                }
            }
        }
        out.fill(0.0);
        let mut x = 0.0f64;
        // Kaplan–Meier part: the CDFs are constant between merged steps, visited in
        // increasing order of their distinct times.
        let mut at = None;
        while let Some(step) = self.next_step(n, mask, at) {
            let t = f64::from(step) / 1e6;
            self.add_segment(n, mask, x, t, out);
            x = t;
            at = Some(step);
        }
        // Up to the last sample of any worker (exponential tails of earlier-ending workers
        // are evaluated at the midpoint), then a geometric grid over the tails.
        if tail_start > x {
            self.add_segment(n, mask, x, tail_start, out);
            x = tail_start;
        }
        if tail_mean > 0.0 {
            let end = x + TAIL_SPAN * tail_mean;
            let first = tail_mean / 64.0;
            let ratio = libm::pow((end - x) / first, 1.0 / (TAIL_POINTS as f64 - 1.0));
            let (mut width, start) = (first, x);
            for _ in 0..TAIL_POINTS {
                let next = (x + width).min(end.max(start));
                self.add_segment(n, mask, x, next, out);
                x = next;
                width *= ratio;
            }
        }
        if let Some(last) = self.last_out.as_mut().get_mut(..m) {
            last.copy_from_slice(out);
            (self.last_n, self.last_live) = (n, mask);
        }
        self.fresh = 0;
        true
    }

    /// Adds `(b − a)·P(N(mid) < k)` to `out[k−1]`, `N` Poisson-binomial over the CDFs at the
    /// midpoint of `[a, b)` of the `out.len()` workers in `live` (a mask), read by
    /// [`Self::cdf_sweep`] and folded into the distribution one by one.
    fn add_segment(&mut self, n: usize, live: u64, a: f64, b: f64, out: &mut [f64]) {
        let width = b - a;
        if width.is_nan() || width <= 0.0 {
            return;
        }
        let mid = (a + b) / 2.0;
        let Some(pmf) = self.pmf.as_mut().as_flattened_mut().get_mut(..=out.len()) else { return };
        poisson_binomial_start(pmf);
        let mut m = 0usize;
        for (i, w) in self.windows.as_mut().iter_mut().enumerate().take(n) {
            if live & bit(i) != 0 && m < out.len() {
                poisson_binomial_trial(pmf, m, Self::cdf_sweep(w, mid));
                m += 1;
            }
        }
        let mut below = 0.0;
        for (o, p) in out.iter_mut().take(m).zip(pmf.iter()) {
            below += *p;
            *o += width * below.min(1.0);
        }
    }
}

/// Starts a Poisson-binomial distribution over `out`: no trial yet, all mass at count 0.
fn poisson_binomial_start(out: &mut [f64]) {
    out.fill(0.0);
    if let Some(o) = out.first_mut() {
        *o = 1.0;
    }
}

/// Folds trial `j` (0-based), with success probability `q`, into the distribution `out`
/// of the trials before it.
#[inline]
fn poisson_binomial_trial(out: &mut [f64], j: usize, q: f64) {
    let q = if q.is_nan() { 0.0 } else { q.clamp(0.0, 1.0) };
    let stay = 1.0 - q;
    // After trial j, counts 0..=j+1 are possible: count c keeps its mass with
    // probability 1 − q and takes count c − 1's with q (none below count 0).
    let mut below = 0.0;
    for o in out.iter_mut().take(j + 2) {
        let here = *o;
        *o = here * stay + below * q;
        below = here;
    }
}

/// Writes the distribution of the number of successes of independent trials with success
/// probabilities `p` into `out[0..=p.len()]` (the Poisson-binomial, by the `O(m²)` dynamic
/// program). `false` if `out` is too short.
pub fn poisson_binomial(p: &[f64], out: &mut [f64]) -> bool {
    let Some(out) = out.get_mut(..=p.len()) else { return false };
    poisson_binomial_start(out);
    for (j, &q) in p.iter().enumerate() {
        poisson_binomial_trial(out, j, q);
    }
    true
}

#[cfg(test)]
mod tests;
