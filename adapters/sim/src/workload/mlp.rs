//! A multilayer perceptron with one hidden ReLU layer: `a = relu(W1 x + b1)`, logits
//! `z = W2 a + b2`.
//!
//! Parameters: `W1` stored input-major as an `n_features x hidden` row-major matrix (row `j`
//! holds the weights out of input `j`, i.e. `W1` transposed), `b1` (`hidden`), `W2` as an
//! `n_classes x hidden` row-major matrix (row `k` holds the weights into class `k`), `b2`
//! (`n_classes`). Input-major `W1` makes the hidden layer's forward pass and weight gradient
//! `axpy`s of length `hidden` that skip zero inputs (about half of the digits pixels);
//! row-major `W2` makes the output layer `n_classes` dot products and `axpy`s of length
//! `hidden` rather than many short ones.

use super::numeric::{
    Pass, Scratch, dense_layer_backward, dot, nonzeros, relu_backward, softmax_cross_entropy, sparse_layer_backward,
    sparse_relu_layer,
};

/// The four parameter blocks `(W1, b1, W2, b2)` of a flat parameter slice.
fn blocks(n_features: usize, hidden: usize, n_classes: usize, params: &[f32]) -> (&[f32], &[f32], &[f32], &[f32]) {
    let (w1, rest) = params.split_at(n_features * hidden);
    let (b1, rest) = rest.split_at(hidden);
    let (w2, b2) = rest.split_at(n_classes * hidden);
    (w1, b1, w2, b2)
}

/// Writes the hidden activations of row `x` into `scratch.hidden` and its logits into
/// `scratch.logits` (both already sized), and the indices of the non-zero inputs into
/// `scratch.nz_inputs`; returns how many non-zero inputs there are.
pub(super) fn forward(n_features: usize, hidden: usize, params: &[f32], x: &[f32], scratch: &mut Scratch) -> usize {
    let n_classes = scratch.logits.len();
    let (w1, b1, w2, b2) = blocks(n_features, hidden, n_classes, params);
    let n_inputs = nonzeros(x, &mut scratch.nz_inputs);
    let a = &mut scratch.hidden;
    sparse_relu_layer(x, &scratch.nz_inputs[..n_inputs], w1, b1, a);
    for ((z, w_row), &b) in scratch.logits.iter_mut().zip(w2.chunks_exact(hidden)).zip(b2) {
        *z = b + dot(w_row, a);
    }
    n_inputs
}

/// Adds the cross-entropy gradient of every row in `batch` to `grad` (not divided by the batch
/// size) by backpropagation and returns the summed loss.
pub(super) fn accumulate(n_features: usize, hidden: usize, pass: Pass<'_>) -> f32 {
    let Pass { params, data, batch, grad, scratch } = pass;
    let n_classes = scratch.logits.len();
    let (_, _, w2, _) = blocks(n_features, hidden, n_classes, params);
    let (gw1, rest) = grad.split_at_mut(n_features * hidden);
    let (gb1, rest) = rest.split_at_mut(hidden);
    let (gw2, gb2) = rest.split_at_mut(n_classes * hidden);
    let mut total = 0.0;
    for &i in batch {
        let x = data.row(i);
        let n_inputs = forward(n_features, hidden, params, x, scratch);
        total += softmax_cross_entropy(&mut scratch.logits, data.labels[i] as usize);
        let Scratch { logits: d_logits, hidden: a, d_hidden, nz_inputs, .. } = &mut *scratch;
        // Output layer: dW2[k] = dL/dz[k] a, db2 = dL/dz, dL/da = W2^T dL/dz.
        dense_layer_backward(w2, a, d_logits, false, gw2, gb2, d_hidden);
        // Through the ReLU (derivative 1 where the unit is active, else 0), then the hidden
        // layer: dW1[j] = x[j] dL/d(pre-activation), db1 = dL/d(pre-activation).
        relu_backward(d_hidden, a);
        sparse_layer_backward(x, &nz_inputs[..n_inputs], d_hidden, gw1, gb1);
    }
    total
}
