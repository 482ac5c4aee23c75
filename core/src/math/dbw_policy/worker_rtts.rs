//! Per-worker round-trip windows and the expected order statistics of non-identical
//! workers (module docs of [`super`], "Per-worker round trips").

use crate::math::estimate::rtt_key;
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

/// Per-worker rings of round-trip times and their Poisson-binomial order statistics (module
/// docs). About 10 KiB.
///
/// An estimate does only the work its inputs require, and gives bit for bit what a fit of
/// every window from scratch gives (tests: `incremental_estimate_is_the_from_scratch_one`):
/// a worker is refitted only when its window changed (a push that evicts an equal sample
/// changes nothing) or the shared shift moved; when no live worker's window changed and the
/// live set is the same, the previous order statistics are returned as they are; the
/// integral reads each worker's CDF with a cursor that moves forward along its steps (the
/// evaluation points only increase) instead of scanning them from the start.
#[derive(Clone, Debug)]
pub struct WorkerRtts {
    /// Samples as `micros << 1 | censored`.
    ring: [[u32; RTT_PER_WORKER]; RTT_TRACKED_WORKERS],
    len: [u8; RTT_TRACKED_WORKERS],
    next: [u8; RTT_TRACKED_WORKERS],
    /// Per worker: Kaplan–Meier step times (µs) and the CDF after each step.
    km_t: [[u32; RTT_PER_WORKER]; RTT_TRACKED_WORKERS],
    km_f: [[f64; RTT_PER_WORKER]; RTT_TRACKED_WORKERS],
    km_len: [u8; RTT_TRACKED_WORKERS],
    /// Per worker: the time of its last sample (s), its unplaced mass and its tail mean (s).
    tail: [(f64, f64, f64); RTT_TRACKED_WORKERS],
    /// Per worker: the first Kaplan–Meier step not yet passed by the integral's sweep.
    cursor: [u8; RTT_TRACKED_WORKERS],
    grid: [u32; RTT_TRACKED_WORKERS * RTT_PER_WORKER],
    pmf: [f64; RTT_TRACKED_WORKERS + 1],
    f: [f64; RTT_TRACKED_WORKERS],
    fresh: usize,
    /// Workers whose window changed since their last fit (bit `i` = worker `i`).
    dirty: u64,
    /// The shift (µs) the current fits were made with.
    fitted_shift: u32,
    /// The last estimate: its `n`, its live set and `E[T_(k)]` (valid when `last_n > 0`).
    last_n: usize,
    last_live: u64,
    last_out: [f64; RTT_TRACKED_WORKERS],
}

impl Default for WorkerRtts {
    fn default() -> Self {
        Self::new()
    }
}

impl WorkerRtts {
    /// Empty rings.
    pub fn new() -> Self {
        Self {
            ring: [[0; RTT_PER_WORKER]; RTT_TRACKED_WORKERS],
            len: [0; RTT_TRACKED_WORKERS],
            next: [0; RTT_TRACKED_WORKERS],
            km_t: [[0; RTT_PER_WORKER]; RTT_TRACKED_WORKERS],
            km_f: [[0.0; RTT_PER_WORKER]; RTT_TRACKED_WORKERS],
            km_len: [0; RTT_TRACKED_WORKERS],
            tail: [(0.0, 0.0, 0.0); RTT_TRACKED_WORKERS],
            cursor: [0; RTT_TRACKED_WORKERS],
            grid: [0; RTT_TRACKED_WORKERS * RTT_PER_WORKER],
            pmf: [0.0; RTT_TRACKED_WORKERS + 1],
            f: [0.0; RTT_TRACKED_WORKERS],
            fresh: 0,
            dirty: u64::MAX,
            fitted_shift: u32::MAX,
            last_n: 0,
            last_live: 0,
            last_out: [0.0; RTT_TRACKED_WORKERS],
        }
    }

    /// Samples pushed since the last successful estimate.
    pub fn fresh(&self) -> usize {
        self.fresh
    }

    /// Adds worker `worker`'s round trip (evicting its oldest beyond [`RTT_PER_WORKER`]);
    /// ignored for workers at or above [`RTT_TRACKED_WORKERS`].
    #[inline]
    pub fn push(&mut self, worker: usize, rtt: Duration, censored: bool) {
        let key = rtt_key(rtt, censored);
        let (Some(ring), Some(len), Some(next)) =
            (self.ring.get_mut(worker), self.len.get_mut(worker), self.next.get_mut(worker))
        else {
            return;
        };
        // `next < RTT_PER_WORKER`, a power of two: the mask changes nothing and leaves no
        // bounds check.
        let at = usize::from(*next) & (RTT_PER_WORKER - 1);
        if let Some(slot) = ring.get_mut(at) {
            if usize::from(*len) < RTT_PER_WORKER {
                *len += 1;
                self.dirty |= bit(worker);
            } else if *slot != key {
                // A full ring that evicts an equal sample holds the same multiset: no refit.
                self.dirty |= bit(worker);
            }
            *slot = key;
        }
        *next = ((at + 1) % RTT_PER_WORKER) as u8;
        self.fresh = self.fresh.saturating_add(1);
    }

    /// Forgets worker `worker`'s samples (a new incarnation).
    pub fn forget(&mut self, worker: usize) {
        if let (Some(len), Some(next)) = (self.len.get_mut(worker), self.next.get_mut(worker)) {
            *len = 0;
            *next = 0;
            self.dirty |= bit(worker);
        }
    }
    /// Fits worker `i`: its Kaplan–Meier steps and tail. Returns `false` if it has no sample.
    fn fit(&mut self, i: usize, shift_micros: u32) -> bool {
        let n = self.len.get(i).map_or(0, |l| usize::from(*l));
        let mut s = [0u32; RTT_PER_WORKER];
        let (Some(ring), Some(sorted)) = (self.ring.get(i), s.get_mut(..n)) else { return false };
        let Some(held) = ring.get(..n) else { return false };
        if n == 0 {
            return false;
        }
        sorted.copy_from_slice(held);
        sorted.sort_unstable();
        let (Some(kt), Some(kf)) = (self.km_t.get_mut(i), self.km_f.get_mut(i)) else { return false };
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
        if let (Some(l), Some(t)) = (self.km_len.get_mut(i), self.tail.get_mut(i)) {
            *l = steps as u8;
            *t = (last, survival.max(0.0), mean.max(1e-6));
        }
        true
    }

    /// Worker `i`'s CDF at `x` seconds (after [`Self::fit`]), reading its steps from its
    /// cursor on: `x` must not decrease between calls after the cursors are reset.
    fn cdf_sweep(&mut self, i: usize, x: f64) -> f64 {
        let steps = self.km_len.get(i).map_or(0, |l| usize::from(*l));
        let (Some(kt), Some(kf), Some(&(last, mass, mean)), Some(cursor)) =
            (self.km_t.get(i), self.km_f.get(i), self.tail.get(i), self.cursor.get_mut(i))
        else {
            return 0.0;
        };
        let micros = x * 1e6;
        let mut c = usize::from(*cursor);
        while c < steps && kt.get(c).is_some_and(|t| f64::from(*t) <= micros) {
            c += 1;
        }
        *cursor = c as u8;
        let mut f = if c > 0 { kf.get(c - 1).copied().unwrap_or(0.0) } else { 0.0 };
        if x > last && mass > 0.0 {
            f = 1.0 - mass * libm::exp(-(x - last) / mean);
        }
        f.clamp(0.0, 1.0)
    }

    /// Writes `E[T_(k:m)]` in seconds into `out[k-1]` for `k` in `1..=m`, where the `m`
    /// workers are those with `live(i)` among `0..n` and each has at least one sample.
    /// Returns `false` (writing nothing) if `n` exceeds [`RTT_TRACKED_WORKERS`], a live
    /// worker has no sample, no sample at all is observed, or `out` is too short.
    ///
    /// The check that nothing changed since the last estimate (then it is copied) is inlined
    /// into the caller; the estimate itself is not.
    #[inline]
    pub fn expected_order_statistics(&mut self, n: usize, live: impl Fn(usize) -> bool, out: &mut [f64]) -> bool {
        if n == 0 || n > RTT_TRACKED_WORKERS {
            return false;
        }
        let mut mask = 0u64;
        let mut m = 0usize;
        for i in (0..n).filter(|&i| live(i)) {
            if self.len.get(i).is_none_or(|l| *l == 0) {
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
            if let Some(last) = self.last_out.get(..m) {
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
        for i in (0..n).filter(|&i| live(i)) {
            let len = self.len.get(i).map_or(0, |l| usize::from(*l));
            let held = self.ring.get(i).and_then(|r| r.get(..len)).unwrap_or(&[]);
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
        let mut g = 0usize;
        let mut tail_start = 0.0f64;
        let mut tail_mean = 0.0f64;
        for i in (0..n).filter(|&i| live(i)) {
            if self.dirty & bit(i) != 0 {
                if !self.fit(i, shift) {
                    return false;
                }
                self.dirty &= !bit(i);
            }
            let steps = self.km_len.get(i).map_or(0, |l| usize::from(*l));
            let fitted = self.km_t.get(i).and_then(|r| r.get(..steps)).unwrap_or(&[]);
            if let Some(slots) = self.grid.get_mut(g..g + fitted.len()) {
                slots.copy_from_slice(fitted);
                g += fitted.len();
            }
            if let Some(c) = self.cursor.get_mut(i) {
                *c = 0;
            }
            if let Some(&(last, mass, mean)) = self.tail.get(i) {
                tail_start = tail_start.max(last);
                if mass > 0.0 {
                    tail_mean = tail_mean.max(mean);
                }
            }
        }
        let Some(grid) = self.grid.get_mut(..g) else { return false };
        grid.sort_unstable();
        out.fill(0.0);
        let mut x = 0.0f64;
        // Kaplan–Meier part: the CDFs are constant between merged steps.
        let mut idx = 0;
        while idx < g {
            let t = f64::from(self.grid.get(idx).copied().unwrap_or(0)) / 1e6;
            self.add_segment(n, mask, x, t, out);
            x = t;
            idx += 1;
            while idx < g && f64::from(self.grid.get(idx).copied().unwrap_or(0)) / 1e6 <= x {
                idx += 1;
            }
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
        if let Some(last) = self.last_out.get_mut(..m) {
            last.copy_from_slice(out);
            (self.last_n, self.last_live) = (n, mask);
        }
        self.fresh = 0;
        true
    }

    /// Adds `(b − a)·P(N(mid) < k)` to `out[k−1]`, `N` Poisson-binomial over the CDFs at the
    /// midpoint of `[a, b)` of the workers in `live` (a mask), read by [`Self::cdf_sweep`].
    fn add_segment(&mut self, n: usize, live: u64, a: f64, b: f64, out: &mut [f64]) {
        let width = b - a;
        if width.is_nan() || width <= 0.0 {
            return;
        }
        let mid = (a + b) / 2.0;
        let mut m = 0usize;
        for i in (0..n).filter(|&i| live & bit(i) != 0) {
            let p = self.cdf_sweep(i, mid);
            if let Some(f) = self.f.get_mut(m) {
                *f = p;
                m += 1;
            }
        }
        if !poisson_binomial(self.f.get(..m).unwrap_or(&[]), &mut self.pmf) {
            return;
        }
        let mut below = 0.0;
        for (o, p) in out.iter_mut().take(m).zip(self.pmf.iter()) {
            below += *p;
            *o += width * below.min(1.0);
        }
    }
}

/// Writes the distribution of the number of successes of independent trials with success
/// probabilities `p` into `out[0..=p.len()]` (the Poisson-binomial, by the `O(m²)` dynamic
/// program). `false` if `out` is too short.
pub fn poisson_binomial(p: &[f64], out: &mut [f64]) -> bool {
    let m = p.len();
    let Some(out) = out.get_mut(..=m) else { return false };
    out.fill(0.0);
    if let Some(o) = out.first_mut() {
        *o = 1.0;
    }
    for (j, &q) in p.iter().enumerate() {
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
    true
}

#[cfg(test)]
mod tests;
