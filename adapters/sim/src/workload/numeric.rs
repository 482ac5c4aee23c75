//! The small numeric kernels and the work buffers the model implementations share.

/// Work buffers for [`Model::gradient`](super::Model::gradient) and
/// [`Model::evaluate_with`](super::Model::evaluate_with), so that neither allocates. Get
/// one from [`Model::scratch`](super::Model::scratch); one per thread.
#[derive(Clone, Debug, Default)]
pub struct Scratch {
    /// Logits, then softmax probabilities minus the one-hot label (`n_classes`).
    pub(super) logits: Vec<f32>,
    /// Hidden activations (`hidden`, MLP only).
    pub(super) hidden: Vec<f32>,
    /// Gradient of the loss with respect to the hidden pre-activations (`hidden`, MLP only).
    pub(super) d_hidden: Vec<f32>,
    /// Indices of the non-zero inputs of the current row (`n_features`, MLP only).
    pub(super) nz_inputs: Vec<usize>,
    /// Second hidden layer's activations (two-layer MLP only).
    pub(super) hidden2: Vec<f32>,
    /// Gradient with respect to the second layer's pre-activations (two-layer MLP only).
    pub(super) d_hidden2: Vec<f32>,
}

/// One backpropagation pass over a minibatch: the model's parameters, the rows of `data`
/// it takes (`batch`), the buffer the summed gradient is added to, and the work buffers.
#[derive(Debug)]
pub(super) struct Pass<'a> {
    pub(super) params: &'a [f32],
    pub(super) data: &'a super::dataset::Dataset,
    pub(super) batch: &'a [usize],
    pub(super) grad: &'a mut [f32],
    pub(super) scratch: &'a mut Scratch,
}

impl Scratch {
    /// Makes the buffers the right size (allocates only when a size changes).
    pub(super) fn fit(&mut self, n_features: usize, n_classes: usize, (hidden, hidden2): (usize, usize)) {
        self.logits.resize(n_classes, 0.0);
        self.hidden.resize(hidden, 0.0);
        self.d_hidden.resize(hidden, 0.0);
        self.nz_inputs.resize(if hidden > 0 { n_features } else { 0 }, 0);
        self.hidden2.resize(hidden2, 0.0);
        self.d_hidden2.resize(hidden2, 0.0);
    }
}

/// `sum(a[i] * b[i])` over the common length, with eight independent accumulators so the
/// compiler can vectorize it.
#[inline]
pub(super) fn dot(a: &[f32], b: &[f32]) -> f32 {
    const LANES: usize = 8;
    let mut acc = [0.0f32; LANES];
    let (mut ca, mut cb) = (a.chunks_exact(LANES), b.chunks_exact(LANES));
    for (x, y) in (&mut ca).zip(&mut cb) {
        // chunks_exact yields slices of exactly LANES elements, so these conversions always
        // succeed; fixed-size arrays let the compiler drop bounds checks and vectorize.
        if let (Ok(x), Ok(y)) = (<&[f32; LANES]>::try_from(x), <&[f32; LANES]>::try_from(y)) {
            for k in 0..LANES {
                acc[k] += x[k] * y[k];
            }
        }
    }
    let tail: f32 = ca.remainder().iter().zip(cb.remainder()).map(|(x, y)| x * y).sum();
    let s: [f32; 4] = core::array::from_fn(|k| acc[k] + acc[k + 4]);
    (s[0] + s[2]) + (s[1] + s[3]) + tail
}

/// Writes the indices of the non-zero values of `x` to the front of `out` and returns how
/// many there are. Branch-free, so the data-dependent sparsity pattern costs no branch
/// mispredictions.
///
/// # Panics
///
/// If `out` is shorter than `x`.
#[inline]
pub(super) fn nonzeros(x: &[f32], out: &mut [usize]) -> usize {
    let out = &mut out[..x.len()];
    let mut n = 0;
    for (j, &v) in x.iter().enumerate() {
        out[n] = j;
        n += usize::from(v != 0.0);
    }
    n
}

/// `y += a * x` over the common length.
#[inline]
pub(super) fn axpy(a: f32, x: &[f32], y: &mut [f32]) {
    for (y, &x) in y.iter_mut().zip(x) {
        *y += a * x;
    }
}

/// `log(sum(exp(z)))`, computed stably by factoring out the max.
pub(super) fn log_sum_exp(z: &[f32]) -> f32 {
    let m = z.iter().copied().fold(f32::NEG_INFINITY, f32::max);
    m + z.iter().map(|&v| (v - m).exp()).sum::<f32>().ln()
}

/// Index of the first largest value.
pub(super) fn argmax(z: &[f32]) -> usize {
    let mut best = 0;
    for (i, &v) in z.iter().enumerate() {
        if v > z[best] {
            best = i;
        }
    }
    best
}

/// Turns `logits` into `softmax(logits) - onehot(y)` (the gradient of the cross-entropy with
/// respect to the logits) and returns the cross-entropy `logsumexp(logits) - logits[y]`.
/// Subtracts the max logit before exponentiating, so large logits cannot overflow.
///
/// # Panics
///
/// If `y >= logits.len()`.
#[inline]
pub(super) fn softmax_cross_entropy(logits: &mut [f32], y: usize) -> f32 {
    let m = logits.iter().copied().fold(f32::NEG_INFINITY, f32::max);
    let shifted_y = logits[y] - m;
    let mut sum = 0.0f32;
    for l in logits.iter_mut() {
        *l = (*l - m).exp();
        sum += *l;
    }
    let inv = 1.0 / sum;
    logits.iter_mut().for_each(|l| *l *= inv);
    logits[y] -= 1.0;
    sum.ln() - shifted_y
}

/// The input layer of the MLPs, over the non-zero inputs only: `a = relu(b + Σ_j x[j] W[j])`
/// with `W` input-major (row `j` holds the weights out of input `j`, `a.len()` long) and
/// `nz` the indices of the non-zero inputs.
#[inline]
pub(super) fn sparse_relu_layer(x: &[f32], nz: &[usize], w: &[f32], b: &[f32], a: &mut [f32]) {
    let width = a.len();
    a.copy_from_slice(b);
    for &j in nz {
        axpy(x[j], &w[j * width..(j + 1) * width], a);
    }
    a.iter_mut().for_each(|v| *v = v.max(0.0));
}

/// The input layer's gradient for one row: `gw[j] += x[j] d` for each non-zero input `j`
/// (`gw` input-major, rows `d.len()` long) and `gb += d`.
#[inline]
pub(super) fn sparse_layer_backward(x: &[f32], nz: &[usize], d: &[f32], gw: &mut [f32], gb: &mut [f32]) {
    let width = d.len();
    for &j in nz {
        axpy(x[j], d, &mut gw[j * width..(j + 1) * width]);
    }
    axpy(1.0, d, gb);
}

/// A dense layer's gradient for one row: with `w` row-major (row `k` holds the weights into
/// output `k`, `a.len()` long), adds `d_out[k] a` to row `k` of `gw` and `d_out` to `gb`, and
/// writes `d_in = Wᵀ d_out`. With `skip_zero`, an output whose `d_out[k]` is 0 adds nothing
/// to `gw` and `d_in`.
#[inline]
pub(super) fn dense_layer_backward(
    w: &[f32],
    a: &[f32],
    d_out: &[f32],
    skip_zero: bool,
    gw: &mut [f32],
    gb: &mut [f32],
    d_in: &mut [f32],
) {
    let width = a.len();
    d_in.fill(0.0);
    for ((gw_row, w_row), &d) in gw.chunks_exact_mut(width).zip(w.chunks_exact(width)).zip(d_out) {
        if !skip_zero || d != 0.0 {
            axpy(d, a, gw_row);
            axpy(d, w_row, d_in);
        }
    }
    axpy(1.0, d_out, gb);
}

/// Through a ReLU backwards: `d` where the unit's activation `a` is positive, else 0.
#[inline]
pub(super) fn relu_backward(d: &mut [f32], a: &[f32]) {
    for (d, &a) in d.iter_mut().zip(a) {
        *d = if a > 0.0 { *d } else { 0.0 };
    }
}
