//! Models: the kind, the flat parameter layout, initialization, the minibatch gradient and
//! evaluation.

use core::fmt;
use core::str::FromStr;

use super::dataset::Dataset;
use super::numeric::{Pass, Scratch, argmax, log_sum_exp};
use super::{mlp, mlp2, nqm, softmax};
use syncopate::rng::Rng;

/// PRNG sub-stream used by [`Model::init`].
const INIT_STREAM: u64 = 0x494e_4954; // "INIT"

/// Which model to train.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum ModelKind {
    /// Multinomial logistic regression (a linear layer then softmax).
    Softmax,
    /// One hidden layer of `hidden` ReLU units, then a linear layer and softmax.
    Mlp {
        /// Number of hidden units (positive).
        hidden: usize,
    },
    /// Two hidden ReLU layers (`hidden1`, then `hidden2` units), then a linear layer and
    /// softmax.
    Mlp2 {
        /// Units of the first hidden layer (positive).
        hidden1: usize,
        /// Units of the second hidden layer (positive).
        hidden2: usize,
    },
    /// The noisy quadratic model over `dim` coordinates ([`super::nqm`]): trained on a
    /// noise data set from [`super::nqm::noise_dataset`] with `n_features = dim` and one
    /// class; evaluation reports the exact loss and accuracy 0.
    Nqm {
        /// Number of coordinates (positive).
        dim: usize,
    },
}

impl ModelKind {
    /// Hidden units of an MLP written as plain `mlp`.
    pub const DEFAULT_MLP_HIDDEN: usize = 32;
}

impl fmt::Display for ModelKind {
    /// `softmax` or `mlp:<hidden>`, which [`FromStr`] parses back.
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Self::Softmax => f.write_str("softmax"),
            Self::Mlp { hidden } => write!(f, "mlp:{hidden}"),
            Self::Mlp2 { hidden1, hidden2 } => write!(f, "mlp2:{hidden1}:{hidden2}"),
            Self::Nqm { dim } => write!(f, "nqm:{dim}"),
        }
    }
}

/// A string that is not a model kind; displays the bad value and the accepted forms.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ParseModelKindError {
    value: String,
    /// Set when the kind is known but a size is not a positive whole number.
    bad_size: bool,
}

impl fmt::Display for ParseModelKindError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        if self.bad_size {
            return write!(
                f,
                "invalid model '{}': every size must be a whole number of at least 1 (e.g. 'mlp:64', 'mlp2:64:32', \
                 'nqm:100')",
                self.value.escape_debug()
            );
        }
        write!(
            f,
            "unknown model '{}' (expected 'softmax', 'mlp', 'mlp:<hidden units>', 'mlp2:<units>:<units>' or \
             'nqm:<dim>', e.g. 'mlp:64')",
            self.value.escape_debug()
        )
    }
}

impl core::error::Error for ParseModelKindError {}

impl FromStr for ModelKind {
    type Err = ParseModelKindError;

    /// Parses `softmax`, `mlp` (with [`ModelKind::DEFAULT_MLP_HIDDEN`] units) or `mlp:<n>`
    /// with `n > 0`; case-insensitive, surrounding whitespace ignored.
    fn from_str(s: &str) -> Result<Self, Self::Err> {
        let lower = s.trim().to_ascii_lowercase();
        let kind = match lower.as_str() {
            "softmax" => Some(Self::Softmax),
            "mlp" => Some(Self::Mlp { hidden: Self::DEFAULT_MLP_HIDDEN }),
            other => {
                let positive = |n: &str| n.parse::<usize>().ok().filter(|&v| v > 0);
                if let Some(rest) = other.strip_prefix("mlp2:") {
                    rest.split_once(':')
                        .and_then(|(a, b)| Some(Self::Mlp2 { hidden1: positive(a)?, hidden2: positive(b)? }))
                } else if let Some(rest) = other.strip_prefix("nqm:") {
                    positive(rest).map(|dim| Self::Nqm { dim })
                } else {
                    other.strip_prefix("mlp:").and_then(positive).map(|hidden| Self::Mlp { hidden })
                }
            }
        };
        let known = ["mlp:", "mlp2:", "nqm:"].iter().any(|p| lower.starts_with(p));
        kind.ok_or_else(|| ParseModelKindError { value: s.to_owned(), bad_size: known })
    }
}

/// Mean loss and accuracy of a model over a data set.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct Evaluation {
    /// Mean cross-entropy (natural log) over the rows; 0 for an empty data set.
    pub loss: f64,
    /// Fraction of rows whose highest logit is their label (ties go to the lower class);
    /// 0 for an empty data set.
    pub accuracy: f64,
}

/// A classifier of a given [`ModelKind`] and shape. Holds no parameters: those are a flat
/// `f32` slice owned by the caller (layout in the [module docs](super)).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Model {
    kind: ModelKind,
    n_features: usize,
    n_classes: usize,
}

impl Model {
    /// A model of `kind` for rows of `n_features` and labels `0..n_classes`.
    ///
    /// # Panics
    ///
    /// If `n_features`, `n_classes` or an MLP's `hidden` is 0.
    pub fn new(kind: ModelKind, n_features: usize, n_classes: usize) -> Self {
        assert!(n_features > 0, "a model needs at least one feature");
        assert!(n_classes > 0, "a model needs at least one class");
        if let ModelKind::Mlp { hidden } = kind {
            assert!(hidden > 0, "an MLP needs at least one hidden unit");
        }
        if let ModelKind::Mlp2 { hidden1, hidden2 } = kind {
            assert!(hidden1 > 0 && hidden2 > 0, "an MLP needs at least one hidden unit per layer");
        }
        if let ModelKind::Nqm { dim } = kind {
            assert_eq!(dim, n_features, "the NQM's noise data set must have dim features");
        }
        Self { kind, n_features, n_classes }
    }

    /// The kind of model.
    pub fn kind(&self) -> ModelKind {
        self.kind
    }

    /// Number of features per input row.
    pub fn n_features(&self) -> usize {
        self.n_features
    }

    /// Number of classes.
    pub fn n_classes(&self) -> usize {
        self.n_classes
    }

    /// Number of `f32` parameters.
    pub fn dim(&self) -> usize {
        let (f, c) = (self.n_features, self.n_classes);
        match self.kind {
            ModelKind::Softmax => c * f + c,
            ModelKind::Mlp { hidden: h } => h * f + h + c * h + c,
            ModelKind::Mlp2 { hidden1, hidden2 } => mlp2::dim(f, hidden1, hidden2, c),
            ModelKind::Nqm { dim } => dim,
        }
    }

    fn hidden(&self) -> (usize, usize) {
        match self.kind {
            ModelKind::Softmax | ModelKind::Nqm { .. } => (0, 0),
            ModelKind::Mlp { hidden } => (hidden, 0),
            ModelKind::Mlp2 { hidden1, hidden2 } => (hidden1, hidden2),
        }
    }

    /// Writes initial parameters: zeros for softmax; for the MLP, normal weights with He
    /// scaling for `W1` and LeCun scaling for `W2` drawn from `seed`, and zero biases.
    ///
    /// # Panics
    ///
    /// If `params.len() != self.dim()`.
    pub fn init(&self, seed: u64, params: &mut [f32]) {
        assert_eq!(params.len(), self.dim(), "parameter vector has the wrong length");
        params.fill(0.0);
        if let ModelKind::Mlp { hidden } = self.kind {
            let mut rng = Rng::derive(seed, INIT_STREAM);
            let (w1, rest) = params.split_at_mut(hidden * self.n_features);
            let (_b1, rest) = rest.split_at_mut(hidden);
            let (w2, _b2) = rest.split_at_mut(self.n_classes * hidden);
            let std1 = (2.0 / self.n_features as f64).sqrt();
            w1.iter_mut().for_each(|w| *w = (rng.normal() * std1) as f32);
            let std2 = (1.0 / hidden as f64).sqrt();
            w2.iter_mut().for_each(|w| *w = (rng.normal() * std2) as f32);
        }
        if let ModelKind::Mlp2 { hidden1: h1, hidden2: h2 } = self.kind {
            let mut rng = Rng::derive(seed, INIT_STREAM);
            let (w1, rest) = params.split_at_mut(h1 * self.n_features);
            let (_b1, rest) = rest.split_at_mut(h1);
            let (w2, rest) = rest.split_at_mut(h2 * h1);
            let (_b2, rest) = rest.split_at_mut(h2);
            let (w3, _b3) = rest.split_at_mut(self.n_classes * h2);
            for (w, fan_in, gain) in [(w1, self.n_features, 2.0), (w2, h1, 2.0), (w3, h2, 1.0)] {
                let std = (gain / fan_in as f64).sqrt();
                w.iter_mut().for_each(|w| *w = (rng.normal() * std) as f32);
            }
        }
        if let ModelKind::Nqm { .. } = self.kind {
            params.fill(1.0);
        }
    }

    /// A freshly allocated parameter vector initialized with [`Model::init`].
    pub fn init_params(&self, seed: u64) -> Vec<f32> {
        let mut params = vec![0.0; self.dim()];
        self.init(seed, &mut params);
        params
    }

    /// Work buffers sized for this model.
    pub fn scratch(&self) -> Scratch {
        let mut s = Scratch::default();
        s.fit(self.n_features, self.n_classes, self.hidden());
        s
    }

    /// Overwrites `grad` with the gradient of the mean cross-entropy over the rows `batch` of
    /// `data` at `params`, and returns that mean loss. An empty batch gives a zero gradient and
    /// loss 0. Does not allocate when `scratch` came from [`Model::scratch`] of this model.
    ///
    /// # Panics
    ///
    /// If `params` or `grad` do not have length [`Model::dim`], `data` has a different number
    /// of features or classes than the model, or a batch index or label is out of range.
    pub fn gradient(
        &self,
        params: &[f32],
        data: &Dataset,
        batch: &[usize],
        grad: &mut [f32],
        scratch: &mut Scratch,
    ) -> f32 {
        self.check(params, data);
        assert_eq!(grad.len(), self.dim(), "gradient vector has the wrong length");
        scratch.fit(self.n_features, self.n_classes, self.hidden());
        grad.fill(0.0);
        if batch.is_empty() {
            return 0.0;
        }
        let pass = Pass { params, data, batch, grad: &mut *grad, scratch };
        let total = match self.kind {
            ModelKind::Softmax => softmax::accumulate(self.n_features, pass),
            ModelKind::Mlp { hidden } => mlp::accumulate(self.n_features, hidden, pass),
            ModelKind::Mlp2 { hidden1, hidden2 } => mlp2::accumulate(self.n_features, hidden1, hidden2, pass),
            // Already the batch mean.
            ModelKind::Nqm { .. } => return nqm::gradient(params, data, batch, grad),
        };
        let inv = 1.0 / batch.len() as f32;
        grad.iter_mut().for_each(|g| *g *= inv);
        total * inv
    }

    /// Mean loss and accuracy of `params` over every row of `data`. Allocates a [`Scratch`];
    /// see [`Model::evaluate_with`] to reuse one.
    ///
    /// # Panics
    ///
    /// As [`Model::evaluate_with`].
    pub fn evaluate(&self, params: &[f32], data: &Dataset) -> Evaluation {
        self.evaluate_with(params, data, &mut self.scratch())
    }

    /// [`Model::evaluate`] with caller-provided work buffers.
    ///
    /// # Panics
    ///
    /// If `params` does not have length [`Model::dim`], `data` has a different number of
    /// features or classes than the model, or a label is out of range.
    pub fn evaluate_with(&self, params: &[f32], data: &Dataset, scratch: &mut Scratch) -> Evaluation {
        self.check(params, data);
        scratch.fit(self.n_features, self.n_classes, self.hidden());
        if let ModelKind::Nqm { .. } = self.kind {
            return Evaluation { loss: nqm::loss(params), accuracy: 0.0 };
        }
        let mut loss = 0.0f64;
        let mut correct = 0usize;
        for (i, &y) in data.labels.iter().enumerate() {
            let x = data.row(i);
            match self.kind {
                ModelKind::Softmax => {
                    softmax::forward(self.n_features, params, x, scratch);
                }
                ModelKind::Mlp { hidden } => {
                    mlp::forward(self.n_features, hidden, params, x, scratch);
                }
                ModelKind::Mlp2 { hidden1, hidden2 } => {
                    mlp2::forward(self.n_features, hidden1, hidden2, params, x, scratch);
                }
                ModelKind::Nqm { .. } => {}
            }
            let logits = &scratch.logits;
            let y = y as usize;
            loss += f64::from(log_sum_exp(logits) - logits[y]);
            correct += usize::from(argmax(logits) == y);
        }
        let n = data.len().max(1) as f64;
        Evaluation { loss: loss / n, accuracy: correct as f64 / n }
    }

    #[track_caller]
    fn check(&self, params: &[f32], data: &Dataset) {
        assert_eq!(params.len(), self.dim(), "parameter vector has the wrong length");
        assert_eq!(data.n_features, self.n_features, "data set and model differ in the number of features");
        assert_eq!(data.n_classes, self.n_classes, "data set and model differ in the number of classes");
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::workload::BatchSampler;
    use crate::workload::numeric::{axpy, dot, softmax_cross_entropy};

    #[test]
    fn model_kind_parses_and_displays() {
        assert_eq!("softmax".parse(), Ok(ModelKind::Softmax));
        assert_eq!(" MLP ".parse(), Ok(ModelKind::Mlp { hidden: 32 }));
        assert_eq!("mlp:64".parse(), Ok(ModelKind::Mlp { hidden: 64 }));
        assert_eq!("mlp2:64:32".parse(), Ok(ModelKind::Mlp2 { hidden1: 64, hidden2: 32 }));
        assert_eq!("nqm:100".parse(), Ok(ModelKind::Nqm { dim: 100 }));
        for kind in [
            ModelKind::Softmax,
            ModelKind::Mlp { hidden: 7 },
            ModelKind::Mlp2 { hidden1: 3, hidden2: 4 },
            ModelKind::Nqm { dim: 9 },
        ] {
            assert_eq!(kind.to_string().parse(), Ok(kind));
        }
        for bad in ["", "cnn", "softmax:3", "nqm"] {
            let e = bad.parse::<ModelKind>().unwrap_err().to_string();
            assert!(e.starts_with(&format!("unknown model '{bad}'")), "{e}");
        }
        for bad in ["mlp:", "mlp:0", "mlp:-3", "mlp:x", "mlp2:3", "mlp2:0:3", "nqm:0"] {
            let e = bad.parse::<ModelKind>().unwrap_err().to_string();
            assert!(e.starts_with(&format!("invalid model '{bad}': every size must be a whole number")), "{e}");
        }
    }

    #[test]
    fn dims_and_init() {
        let s = Model::new(ModelKind::Softmax, 64, 10);
        assert_eq!(s.dim(), 650);
        assert!(s.init_params(1).iter().all(|&p| p == 0.0));
        let m = Model::new(ModelKind::Mlp { hidden: 32 }, 64, 10);
        assert_eq!(m.dim(), 32 * 64 + 32 + 10 * 32 + 10);
        let p = m.init_params(1);
        assert_eq!(p, m.init_params(1));
        assert_ne!(p, m.init_params(2));
        let (w1, rest) = p.split_at(32 * 64);
        let (b1, rest) = rest.split_at(32);
        let (w2, b2) = rest.split_at(320);
        assert!(b1.iter().chain(b2).all(|&v| v == 0.0));
        let std = |w: &[f32]| (w.iter().map(|&v| f64::from(v).powi(2)).sum::<f64>() / w.len() as f64).sqrt();
        assert!((std(w1) - (2.0f64 / 64.0).sqrt()).abs() < 0.02, "{}", std(w1));
        assert!((std(w2) - (1.0f64 / 32.0).sqrt()).abs() < 0.03, "{}", std(w2));
    }

    #[test]
    fn kernels() {
        let a: Vec<f32> = (0..19).map(|i| i as f32).collect();
        let b: Vec<f32> = (0..19).map(|i| (i % 3) as f32 - 1.0).collect();
        let want: f32 = a.iter().zip(&b).map(|(x, y)| x * y).sum();
        assert_eq!(dot(&a, &b), want);
        let mut y = vec![1.0; 3];
        axpy(2.0, &[1.0, 2.0, 3.0], &mut y);
        assert_eq!(y, vec![3.0, 5.0, 7.0]);
        // Huge logits do not overflow; the gradient row sums to 0.
        let mut z = vec![1000.0, 1001.0, 999.0];
        let loss = softmax_cross_entropy(&mut z, 0);
        let exact = (1.0 + 1f64.exp() + (-1f64).exp()).ln(); // logits relative to z[0]
        assert!((f64::from(loss) - exact).abs() < 1e-5, "{loss} vs {exact}");
        assert!(z.iter().sum::<f32>().abs() < 1e-6);
        assert!(z[0] < 0.0 && z[1] > 0.0 && z[2] > 0.0);
        assert!((log_sum_exp(&[1000.0, 1000.0]) - (1000.0 + 2f32.ln())).abs() < 1e-3);
        assert_eq!(argmax(&[1.0, 3.0, 3.0, 2.0]), 1);
    }

    /// Independent f64 reference: mean cross-entropy of the batch, written from the formulas.
    fn reference_loss(model: &Model, params: &[f64], data: &Dataset, batch: &[usize]) -> f64 {
        let (f, c) = (model.n_features, model.n_classes);
        let mut total = 0.0;
        for &i in batch {
            let x: Vec<f64> = data.row(i).iter().map(|&v| f64::from(v)).collect();
            // Layout: softmax W is n_classes x n_features; MLP W1 is n_features x hidden
            // (input-major) and W2 is n_classes x hidden.
            let (input, w, b): (Vec<f64>, &[f64], &[f64]) = match model.kind {
                ModelKind::Softmax => (x, &params[..c * f], &params[c * f..]),
                ModelKind::Mlp { hidden: h } => {
                    let (w1, b1) = (&params[..f * h], &params[f * h..f * h + h]);
                    let a =
                        (0..h).map(|j| (b1[j] + (0..f).map(|k| w1[k * h + j] * x[k]).sum::<f64>()).max(0.0)).collect();
                    let off = f * h + h;
                    (a, &params[off..off + c * h], &params[off + c * h..])
                }
                ModelKind::Mlp2 { hidden1: h1, hidden2: h2 } => {
                    let (w1, b1) = (&params[..f * h1], &params[f * h1..f * h1 + h1]);
                    let a1: Vec<f64> = (0..h1)
                        .map(|j| (b1[j] + (0..f).map(|k| w1[k * h1 + j] * x[k]).sum::<f64>()).max(0.0))
                        .collect();
                    let off = f * h1 + h1;
                    let (w2, b2) = (&params[off..off + h2 * h1], &params[off + h2 * h1..off + h2 * h1 + h2]);
                    let a2 = (0..h2)
                        .map(|j| (b2[j] + (0..h1).map(|k| w2[j * h1 + k] * a1[k]).sum::<f64>()).max(0.0))
                        .collect();
                    let off = off + h2 * h1 + h2;
                    (a2, &params[off..off + c * h2], &params[off + c * h2..])
                }
                ModelKind::Nqm { .. } => unreachable!("not a classifier"),
            };
            let n = input.len();
            let z: Vec<f64> = (0..c).map(|k| b[k] + (0..n).map(|j| w[k * n + j] * input[j]).sum::<f64>()).collect();
            let lse = z.iter().map(|v| v.exp()).sum::<f64>().ln();
            total += lse - z[data.labels[i] as usize];
        }
        total / batch.len() as f64
    }

    fn check_gradient(kind: ModelKind, seed: u64) {
        let (train, _) = Dataset::digits().split(0.5, seed);
        let model = Model::new(kind, 64, 10);
        let mut params = model.init_params(seed);
        // Move away from the all-zero softmax start so every coordinate matters.
        let mut rng = Rng::new(seed);
        params.iter_mut().for_each(|p| *p += (rng.normal() * 0.1) as f32);
        let mut batch = Vec::new();
        BatchSampler::new(train.len(), seed).next_batch(16, &mut batch);
        let mut grad = vec![f32::NAN; model.dim()];
        let mut scratch = model.scratch();
        let loss = model.gradient(&params, &train, &batch, &mut grad, &mut scratch);
        let mut p64: Vec<f64> = params.iter().map(|&v| f64::from(v)).collect();
        let ref_loss = reference_loss(&model, &p64, &train, &batch);
        assert!((f64::from(loss) - ref_loss).abs() < 1e-4 * ref_loss.max(1.0), "loss {loss} vs {ref_loss}");
        // Coordinates: random ones plus the largest-gradient ones, across every block.
        let mut coords: Vec<usize> = (0..40).map(|_| rng.below(model.dim() as u64) as usize).collect();
        let mut by_size: Vec<usize> = (0..model.dim()).collect();
        by_size.sort_by(|&a, &b| grad[b].abs().total_cmp(&grad[a].abs()));
        coords.extend(&by_size[..10]);
        coords.push(model.dim() - 1);
        let eps = 1e-5;
        for &j in &coords {
            let orig = p64[j];
            p64[j] = orig + eps;
            let up = reference_loss(&model, &p64, &train, &batch);
            p64[j] = orig - eps;
            let down = reference_loss(&model, &p64, &train, &batch);
            p64[j] = orig;
            let numeric = (up - down) / (2.0 * eps);
            let analytic = f64::from(grad[j]);
            assert!(
                (analytic - numeric).abs() <= 1e-4 + 1e-3 * numeric.abs(),
                "{kind}: coordinate {j}: analytic {analytic} vs numeric {numeric}"
            );
        }
        assert!(by_size.first().is_some_and(|&j| grad[j].abs() > 1e-2), "gradient is suspiciously small");
    }

    #[test]
    fn softmax_gradient_matches_finite_differences() {
        check_gradient(ModelKind::Softmax, 11);
        check_gradient(ModelKind::Softmax, 12);
    }

    #[test]
    fn mlp_gradient_matches_finite_differences() {
        check_gradient(ModelKind::Mlp { hidden: 16 }, 21);
        check_gradient(ModelKind::Mlp { hidden: 5 }, 22);
        check_gradient(ModelKind::Mlp2 { hidden1: 12, hidden2: 7 }, 23);
    }

    #[test]
    fn gradient_overwrites_and_handles_empty_batches() {
        let data = Dataset::digits();
        let model = Model::new(ModelKind::Mlp { hidden: 8 }, 64, 10);
        let params = model.init_params(3);
        let mut scratch = model.scratch();
        let mut g1 = vec![0.0; model.dim()];
        let mut g2 = vec![123.0; model.dim()];
        let l1 = model.gradient(&params, &data, &[5, 9, 100], &mut g1, &mut scratch);
        let l2 = model.gradient(&params, &data, &[5, 9, 100], &mut g2, &mut scratch);
        assert_eq!((l1, &g1), (l2, &g2));
        assert_eq!(model.gradient(&params, &data, &[], &mut g2, &mut scratch), 0.0);
        assert!(g2.iter().all(|&g| g == 0.0));
        // A scratch from another model is resized, not trusted.
        let mut other = Model::new(ModelKind::Softmax, 64, 10).scratch();
        let l3 = model.gradient(&params, &data, &[5, 9, 100], &mut g2, &mut other);
        assert_eq!((l3, &g2), (l1, &g1));
    }

    #[test]
    fn evaluate_matches_gradient_loss() {
        let data = Dataset::digits().subset(&(0..50).collect::<Vec<_>>());
        for kind in [ModelKind::Softmax, ModelKind::Mlp { hidden: 8 }] {
            let model = Model::new(kind, 64, 10);
            let mut params = model.init_params(4);
            let mut rng = Rng::new(4);
            params.iter_mut().for_each(|p| *p += (rng.normal() * 0.1) as f32);
            let all: Vec<usize> = (0..data.len()).collect();
            let mut grad = vec![0.0; model.dim()];
            let loss = model.gradient(&params, &data, &all, &mut grad, &mut model.scratch());
            let eval = model.evaluate(&params, &data);
            assert!((eval.loss - f64::from(loss)).abs() < 1e-4, "{kind}: {} vs {loss}", eval.loss);
            assert!((0.0..=1.0).contains(&eval.accuracy));
        }
        // Zero softmax parameters: uniform prediction, loss ln 10, ties go to class 0.
        let model = Model::new(ModelKind::Softmax, 64, 10);
        let eval = model.evaluate(&model.init_params(0), &data);
        assert!((eval.loss - 10f64.ln()).abs() < 1e-6);
        let zeros = data.labels.iter().filter(|&&y| y == 0).count();
        assert_eq!(eval.accuracy, zeros as f64 / 50.0);
        let empty = data.subset(&[]);
        assert_eq!(model.evaluate(&model.init_params(0), &empty), Evaluation { loss: 0.0, accuracy: 0.0 });
    }

    /// Plain sequential minibatch SGD; returns the loss after each 100 steps and the final
    /// test evaluation.
    fn sgd(kind: ModelKind, lr: f32, batch_size: usize, steps: usize, seed: u64) -> (Vec<f32>, Evaluation) {
        let w = crate::workload::Workload::digits(kind, seed);
        let mut params = w.model.init_params(seed);
        let mut grad = vec![0.0; w.model.dim()];
        let mut scratch = w.model.scratch();
        let mut sampler = BatchSampler::new(w.train.len(), seed);
        let mut batch = Vec::with_capacity(batch_size);
        let mut losses = Vec::new();
        let mut window = 0.0;
        for step in 1..=steps {
            sampler.next_batch(batch_size, &mut batch);
            window += w.model.gradient(&params, &w.train, &batch, &mut grad, &mut scratch);
            axpy(-lr, &grad, &mut params);
            if step % 100 == 0 {
                losses.push(window / 100.0);
                window = 0.0;
            }
        }
        (losses, w.model.evaluate(&params, &w.test))
    }

    #[test]
    fn sgd_softmax_reaches_093() {
        let (losses, eval) = sgd(ModelKind::Softmax, 0.5, 32, 3000, 1);
        eprintln!("softmax, lr 0.5, batch 32, 3000 steps, seed 1: {eval:?}");
        assert!(losses[0] > 2.0 * losses[losses.len() - 1], "{losses:?}");
        assert!(eval.accuracy >= 0.93, "{eval:?}");
    }

    #[test]
    fn sgd_mlp_reaches_094() {
        let (losses, eval) = sgd(ModelKind::Mlp { hidden: 32 }, 0.2, 32, 3000, 1);
        eprintln!("mlp:32, lr 0.2, batch 32, 3000 steps, seed 1: {eval:?}");
        assert!(losses[0] > 2.0 * losses[losses.len() - 1], "{losses:?}");
        assert!(eval.accuracy >= 0.94, "{eval:?}");
    }

    /// The table in the module docs (slow in debug builds). Run with
    /// `cargo test --release -p syncopate-adapters sgd_learning_rate_grid -- --ignored --nocapture`.
    #[test]
    #[ignore = "slow: the learning-rate table in the module docs"]
    fn sgd_learning_rate_grid() {
        let grid: [(ModelKind, &[f32]); 3] = [
            (ModelKind::Softmax, &[0.2, 0.5, 1.0]),
            (ModelKind::Mlp { hidden: 32 }, &[0.1, 0.2, 0.5]),
            (ModelKind::Mlp { hidden: 64 }, &[0.5]),
        ];
        for (kind, rates) in grid {
            for &lr in rates {
                for steps in [1000, 3000] {
                    let accuracies: Vec<f64> = (1..=5).map(|seed| sgd(kind, lr, 32, steps, seed).1.accuracy).collect();
                    let mean = accuracies.iter().sum::<f64>() / 5.0;
                    let min = accuracies.iter().copied().fold(1.0, f64::min);
                    eprintln!("{kind} lr {lr} batch 32 steps {steps}: test accuracy mean {mean:.3} min {min:.3}");
                    assert!(min >= 0.93, "{kind} lr {lr} steps {steps}: {accuracies:?}");
                }
            }
        }
    }

    #[test]
    fn sgd_loss_decreases_monotonically_on_average() {
        for kind in [ModelKind::Softmax, ModelKind::Mlp { hidden: 16 }] {
            let (losses, _) = sgd(kind, 0.2, 32, 600, 5);
            assert!(losses.windows(2).all(|w| w[1] < w[0]), "{kind}: {losses:?}");
        }
    }
}
