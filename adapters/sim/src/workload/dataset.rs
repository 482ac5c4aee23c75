//! Dense in-memory classification data sets, feature scaling and seeded train/test splits.

use syncopate::rng::Rng;

/// PRNG sub-stream used by [`Dataset::split`].
const SPLIT_STREAM: u64 = 0x0053_504c_4954; // "SPLIT"

/// A dense classification data set held in memory.
///
/// Invariants (kept by every constructor in this module; the fields are public, so code that
/// builds a `Dataset` by hand must keep them too): `features.len() == labels.len() *
/// n_features` and every label is `< n_classes`.
#[derive(Clone, Debug, PartialEq)]
pub struct Dataset {
    /// Feature values, row-major: row `i` is `features[i * n_features..(i + 1) * n_features]`.
    pub features: Vec<f32>,
    /// One class label per row, in `0..n_classes`.
    pub labels: Vec<u32>,
    /// Number of features per row.
    pub n_features: usize,
    /// Number of classes (labels are `0..n_classes`; a subset may lack some of them).
    pub n_classes: usize,
}

/// How to rescale feature values after loading.
#[derive(Clone, Copy, Debug, PartialEq, Default)]
pub enum Scaling {
    /// Leave values as they are.
    #[default]
    Raw,
    /// Divide every value by a constant (e.g. 16 for digits pixel counts, 255 for bytes).
    /// The divisor must be finite and non-zero.
    Divide(f32),
    /// Per feature, map `[min, max]` over all rows to `[0, 1]` (constant features become 0).
    MinMax,
    /// Per feature, subtract the mean and divide by the standard deviation over all rows
    /// (constant features become 0).
    Standardize,
}

impl Dataset {
    /// Number of rows.
    pub fn len(&self) -> usize {
        self.labels.len()
    }

    /// Whether there are no rows.
    pub fn is_empty(&self) -> bool {
        self.labels.is_empty()
    }

    /// The features of row `i`.
    ///
    /// # Panics
    ///
    /// If `i >= self.len()`.
    pub fn row(&self, i: usize) -> &[f32] {
        let start = i * self.n_features;
        &self.features[start..start + self.n_features]
    }

    /// Number of rows per class (length `n_classes`).
    pub fn class_counts(&self) -> Vec<usize> {
        let mut counts = vec![0; self.n_classes];
        for &y in &self.labels {
            if let Some(c) = counts.get_mut(y as usize) {
                *c += 1;
            }
        }
        counts
    }

    /// A new data set with the given rows, in the given order (rows may repeat). Keeps
    /// `n_features` and `n_classes`.
    ///
    /// # Panics
    ///
    /// If an index is out of range.
    pub fn subset(&self, rows: &[usize]) -> Self {
        let mut features = Vec::with_capacity(rows.len() * self.n_features);
        let mut labels = Vec::with_capacity(rows.len());
        for &i in rows {
            features.extend_from_slice(self.row(i));
            labels.push(self.labels[i]);
        }
        Self { features, labels, n_features: self.n_features, n_classes: self.n_classes }
    }

    /// Splits into `(train, test)` with `floor(len * test_fraction)` test rows.
    ///
    /// The split is seeded and stratified: rows are shuffled with `seed`, grouped by class and
    /// every `1 / test_fraction`-th row goes to the test set, so each class is represented in
    /// proportion (within one row). Both halves are then shuffled, so neither is ordered by
    /// class. `test_fraction` is clamped to `[0, 1]` (NaN counts as 0). The same data and seed
    /// always give the same split.
    pub fn split(&self, test_fraction: f64, seed: u64) -> (Self, Self) {
        let fraction = if test_fraction.is_nan() { 0.0 } else { test_fraction.clamp(0.0, 1.0) };
        let mut rng = Rng::derive(seed, SPLIT_STREAM);
        let mut order: Vec<usize> = (0..self.len()).collect();
        rng.shuffle(&mut order);
        order.sort_by_key(|&i| self.labels[i]); // stable: random order within each class
        let (mut train, mut test) = (Vec::new(), Vec::new());
        for (pos, &i) in order.iter().enumerate() {
            // Systematic sampling: the floors telescope to exactly floor(len * fraction).
            let before = (pos as f64 * fraction).floor();
            let after = ((pos + 1) as f64 * fraction).floor();
            if after > before { test.push(i) } else { train.push(i) }
        }
        rng.shuffle(&mut train);
        rng.shuffle(&mut test);
        (self.subset(&train), self.subset(&test))
    }

    /// Rescales the features in place.
    ///
    /// # Panics
    ///
    /// On [`Scaling::Divide`] with a zero or non-finite divisor.
    pub fn scale(&mut self, scaling: Scaling) {
        let nf = self.n_features;
        if nf == 0 || self.features.is_empty() {
            return;
        }
        match scaling {
            Scaling::Raw => {}
            Scaling::Divide(d) => {
                assert!(d.is_finite() && d != 0.0, "scaling divisor must be finite and non-zero, got {d}");
                let inv = 1.0 / d;
                self.features.iter_mut().for_each(|v| *v *= inv);
            }
            Scaling::MinMax => {
                let mut lo = vec![f32::INFINITY; nf];
                let mut hi = vec![f32::NEG_INFINITY; nf];
                for row in self.features.chunks_exact(nf) {
                    for ((l, h), &v) in lo.iter_mut().zip(&mut hi).zip(row) {
                        *l = l.min(v);
                        *h = h.max(v);
                    }
                }
                for row in self.features.chunks_exact_mut(nf) {
                    for ((v, &l), &h) in row.iter_mut().zip(&lo).zip(&hi) {
                        *v = if h > l { (*v - l) / (h - l) } else { 0.0 };
                    }
                }
            }
            Scaling::Standardize => {
                let n = self.len() as f64;
                let mut mean = vec![0.0f64; nf];
                let mut sq = vec![0.0f64; nf];
                for row in self.features.chunks_exact(nf) {
                    for ((m, s), &v) in mean.iter_mut().zip(&mut sq).zip(row) {
                        *m += f64::from(v);
                        *s += f64::from(v) * f64::from(v);
                    }
                }
                let mut inv_std = vec![0.0f64; nf];
                for ((m, s), inv) in mean.iter_mut().zip(&sq).zip(&mut inv_std) {
                    *m /= n;
                    let var = (*s / n - *m * *m).max(0.0);
                    *inv = if var > 1e-24 { 1.0 / var.sqrt() } else { 0.0 };
                }
                for row in self.features.chunks_exact_mut(nf) {
                    for ((v, &m), &inv) in row.iter_mut().zip(&mean).zip(&inv_std) {
                        *v = ((f64::from(*v) - m) * inv) as f32;
                    }
                }
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn toy() -> Dataset {
        // 10 rows, 2 features, 3 classes (4, 4, 2 rows).
        let labels = vec![0, 1, 2, 0, 1, 0, 1, 2, 0, 1];
        let features = (0..20).map(|v| v as f32).collect();
        Dataset { features, labels, n_features: 2, n_classes: 3 }
    }

    #[test]
    fn mnist5k_loads_with_the_documented_shape() {
        let d = Dataset::mnist5k();
        assert_eq!((d.len(), d.n_features, d.n_classes), (5000, 784, 10));
        assert!(d.features.iter().all(|&v| (0.0..=1.0).contains(&v)));
        assert!(d.class_counts().iter().all(|&c| c == 500), "{:?}", d.class_counts());
    }

    #[test]
    fn digits_loads_with_the_documented_shape() {
        let d = Dataset::digits();
        assert_eq!((d.len(), d.n_features, d.n_classes), (1797, 64, 10));
        assert_eq!(d.features.len(), 1797 * 64);
        assert!(d.features.iter().all(|&v| (0.0..=1.0).contains(&v)));
        assert!(d.features.contains(&1.0));
        assert!(d.labels.iter().all(|&y| y < 10));
        // Every class is well represented (the set is roughly balanced, ~180 per class).
        assert!(d.class_counts().iter().all(|&c| (170..=190).contains(&c)), "{:?}", d.class_counts());
        // First rows of the file: a 0 then a 1; pixel (0,2) of row 0 is 5/16.
        assert_eq!(&d.labels[..2], &[0, 1]);
        assert_eq!(d.row(0)[2], 5.0 / 16.0);
        assert_eq!(d.row(1)[3], 12.0 / 16.0);
    }

    #[test]
    fn split_has_exact_sizes_and_keeps_every_row_once() {
        let d = Dataset::digits();
        let (train, test) = d.split(0.2, 1);
        assert_eq!((train.len(), test.len()), (1438, 359));
        assert_eq!((test.n_features, test.n_classes), (64, 10));
        // Multiset of rows is preserved: compare sorted (label, row bits).
        let key = |ds: &Dataset| {
            (0..ds.len())
                .map(|i| (ds.labels[i], ds.row(i).iter().map(|v| v.to_bits()).collect::<Vec<_>>()))
                .collect::<Vec<_>>()
        };
        let mut all = key(&train);
        all.extend(key(&test));
        all.sort();
        let mut orig = key(&d);
        orig.sort();
        assert_eq!(all, orig);
        // Stratified: each class's share of the test set is within one row of 20%.
        for (c, (&n_all, &n_test)) in d.class_counts().iter().zip(&test.class_counts()).enumerate() {
            let want = n_all as f64 * 0.2;
            assert!((n_test as f64 - want).abs() <= 1.0, "class {c}: {n_test} of {n_all}");
        }
        // Not ordered by class.
        assert!(test.labels.windows(2).any(|w| w[0] > w[1]));
    }

    #[test]
    fn split_is_deterministic_per_seed() {
        let d = toy();
        let a = d.split(0.3, 42);
        assert_eq!(a, d.split(0.3, 42));
        assert_eq!(a.1.len(), 3);
        let digits = Dataset::digits();
        let (x, y) = (digits.split(0.2, 1), digits.split(0.2, 2));
        assert_ne!(x.1, y.1);
        assert_eq!(x, digits.split(0.2, 1));
    }

    #[test]
    fn split_extremes() {
        let d = toy();
        let (train, test) = d.split(0.0, 0);
        assert_eq!((train.len(), test.len()), (10, 0));
        let (train, test) = d.split(1.0, 0);
        assert_eq!((train.len(), test.len()), (0, 10));
        let (train, test) = d.split(f64::NAN, 0);
        assert_eq!((train.len(), test.len()), (10, 0));
        let (train, test) = Dataset { features: vec![], labels: vec![], n_features: 2, n_classes: 3 }.split(0.5, 0);
        assert!(train.is_empty() && test.is_empty());
    }

    #[test]
    fn scaling_modes() {
        let mut d = toy();
        d.scale(Scaling::MinMax);
        assert_eq!(d.row(0), &[0.0, 0.0]);
        assert_eq!(d.row(9), &[1.0, 1.0]);
        let mut d = toy();
        d.scale(Scaling::Standardize);
        for j in 0..2 {
            let col: Vec<f64> = (0..d.len()).map(|i| f64::from(d.row(i)[j])).collect();
            let mean = col.iter().sum::<f64>() / col.len() as f64;
            let var = col.iter().map(|v| (v - mean).powi(2)).sum::<f64>() / col.len() as f64;
            assert!(mean.abs() < 1e-6 && (var - 1.0).abs() < 1e-5, "{mean} {var}");
        }
        let mut d = toy();
        d.scale(Scaling::Divide(2.0));
        assert_eq!(d.row(1), &[1.0, 1.5]);
        let mut c = Dataset { features: vec![3.0, 3.0], labels: vec![0, 1], n_features: 1, n_classes: 2 };
        c.scale(Scaling::MinMax);
        assert_eq!(c.features, vec![0.0, 0.0]);
    }
}
