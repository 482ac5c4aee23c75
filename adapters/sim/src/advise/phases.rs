//! Change points of a trace: where the step-time distribution changes regime.
//!
//! Two series over the step index summarise the distribution across workers at each step:
//! the level `ln(median_w t)` and the spread `ln(max_w t / median_w t)`. Binary
//! segmentation splits a segment at the step that maximises the two-sample t statistic of
//! either series, and keeps the split when the statistic exceeds [`MIN_T`] and the means on
//! the two sides differ by at least [`MIN_EFFECT`] (in log units: about 22%), with every
//! phase at least an eighth of the trace (and [`MIN_PHASE`] steps) long; at most
//! [`MAX_PHASES`] phases.

/// The smallest t statistic of a change point.
pub const MIN_T: f64 = 10.0;
/// The smallest change in a series' mean, in log units (`ln 1.22`).
pub const MIN_EFFECT: f64 = 0.2;
/// The fewest steps of a phase.
pub const MIN_PHASE: usize = 10;
/// The most phases reported.
pub const MAX_PHASES: usize = 4;

/// Prefix sums of a series and of its squares.
struct Prefix {
    sum: Vec<f64>,
    sq: Vec<f64>,
}

impl Prefix {
    fn new(xs: &[f64]) -> Self {
        let mut sum = vec![0.0; xs.len() + 1];
        let mut sq = vec![0.0; xs.len() + 1];
        for (i, x) in xs.iter().enumerate() {
            sum[i + 1] = sum[i] + x;
            sq[i + 1] = sq[i] + x * x;
        }
        Self { sum, sq }
    }

    /// Mean and sum of squared deviations of `a..b`.
    fn moments(&self, a: usize, b: usize) -> (f64, f64) {
        let n = (b - a) as f64;
        let s = self.sum[b] - self.sum[a];
        let q = self.sq[b] - self.sq[a];
        let mean = s / n;
        (mean, (q - s * mean).max(0.0))
    }

    /// The t statistic and the change in mean of splitting `a..b` at `j`.
    fn split(&self, a: usize, j: usize, b: usize) -> (f64, f64) {
        let (ml, ssl) = self.moments(a, j);
        let (mr, ssr) = self.moments(j, b);
        let (nl, nr) = ((j - a) as f64, (b - j) as f64);
        let var = (ssl + ssr) / (nl + nr - 2.0).max(1.0);
        let se = (var * (1.0 / nl + 1.0 / nr)).sqrt().max(1e-12);
        let delta = mr - ml;
        (delta.abs() / se, delta)
    }
}

/// The phases of a trace with per-step `level` and `spread` series (the same length), as
/// step ranges `from..until` covering it in order (one phase when no change is found).
pub fn detect(level: &[f64], spread: &[f64]) -> Vec<(usize, usize)> {
    let n = level.len().min(spread.len());
    let series = [Prefix::new(&level[..n]), Prefix::new(&spread[..n])];
    let min_len = (n / 8).max(MIN_PHASE);
    let mut cuts: Vec<usize> = Vec::new();
    let mut pending = vec![(0, n)];
    while let Some((a, b)) = pending.pop() {
        if cuts.len() + 1 >= MAX_PHASES || b - a < 2 * min_len {
            continue;
        }
        let mut best: Option<(f64, usize)> = None;
        for j in a + min_len..=b - min_len {
            for p in &series {
                let (t, delta) = p.split(a, j, b);
                if delta.abs() >= MIN_EFFECT && t >= MIN_T && best.is_none_or(|(bt, _)| t > bt) {
                    best = Some((t, j));
                }
            }
        }
        if let Some((_, j)) = best {
            cuts.push(j);
            pending.push((a, j));
            pending.push((j, b));
        }
    }
    cuts.sort_unstable();
    let mut out = Vec::with_capacity(cuts.len() + 1);
    let mut from = 0;
    for c in cuts {
        out.push((from, c));
        from = c;
    }
    out.push((from, n));
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::rng::Rng;

    #[test]
    fn finds_a_shift_and_nothing_in_noise() {
        let mut rng = Rng::new(1);
        let flat: Vec<f64> = (0..400).map(|_| 0.1 * rng.normal()).collect();
        let spread: Vec<f64> = (0..400).map(|_| 0.3 + 0.1 * rng.normal()).collect();
        assert_eq!(detect(&flat, &spread), [(0, 400)]);
        let shifted: Vec<f64> = flat.iter().enumerate().map(|(i, x)| if i >= 250 { x + 0.5 } else { *x }).collect();
        let p = detect(&shifted, &spread);
        assert_eq!(p.len(), 2, "{p:?}");
        assert!((245..=255).contains(&p[0].1), "{p:?}");
        let wider: Vec<f64> = spread.iter().enumerate().map(|(i, x)| if i >= 100 { x + 0.6 } else { *x }).collect();
        let p = detect(&flat, &wider);
        assert!(p.len() == 2 && (95..=105).contains(&p[0].1), "{p:?}");
        assert_eq!(detect(&[], &[]), [(0, 0)]);
    }
}
