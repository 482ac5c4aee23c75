//! A multilayer perceptron with two hidden ReLU layers: `a1 = relu(W1 x + b1)`,
//! `a2 = relu(W2 a1 + b2)`, logits `z = W3 a2 + b3`.
//!
//! Parameters: `W1` input-major (`n_features x h1`, row `j` = weights out of input `j`, as in
//! [`super::mlp`], so zero inputs are skipped), `b1` (`h1`), `W2` as `h2 x h1` (row `j` =
//! weights into unit `j` of the second layer), `b2` (`h2`), `W3` as `n_classes x h2`, `b3`.

use super::numeric::{
    Pass, Scratch, dense_layer_backward, dot, nonzeros, relu_backward, softmax_cross_entropy, sparse_layer_backward,
    sparse_relu_layer,
};

/// Lengths of the six parameter blocks.
fn sizes(n_features: usize, h1: usize, h2: usize, n_classes: usize) -> [usize; 6] {
    [n_features * h1, h1, h2 * h1, h2, n_classes * h2, n_classes]
}

/// Splits a flat slice into the six blocks `(W1, b1, W2, b2, W3, b3)`.
fn blocks(n_features: usize, h1: usize, h2: usize, n_classes: usize, params: &[f32]) -> [&[f32]; 6] {
    let s = sizes(n_features, h1, h2, n_classes);
    let (w1, rest) = params.split_at(s[0]);
    let (b1, rest) = rest.split_at(s[1]);
    let (w2, rest) = rest.split_at(s[2]);
    let (b2, rest) = rest.split_at(s[3]);
    let (w3, b3) = rest.split_at(s[4]);
    [w1, b1, w2, b2, w3, b3]
}

/// Number of parameters.
pub(super) fn dim(n_features: usize, h1: usize, h2: usize, n_classes: usize) -> usize {
    sizes(n_features, h1, h2, n_classes).iter().sum()
}

/// Forward pass of row `x`: fills `scratch.hidden` (`h1`), `scratch.hidden2` (`h2`), the
/// logits and the non-zero input indices; returns how many inputs are non-zero.
pub(super) fn forward(
    n_features: usize,
    h1: usize,
    h2: usize,
    params: &[f32],
    x: &[f32],
    scratch: &mut Scratch,
) -> usize {
    let n_classes = scratch.logits.len();
    let [w1, b1, w2, b2, w3, b3] = blocks(n_features, h1, h2, n_classes, params);
    let n_inputs = nonzeros(x, &mut scratch.nz_inputs);
    sparse_relu_layer(x, &scratch.nz_inputs[..n_inputs], w1, b1, &mut scratch.hidden);
    for ((a, w_row), &b) in scratch.hidden2.iter_mut().zip(w2.chunks_exact(h1)).zip(b2) {
        *a = (b + dot(w_row, &scratch.hidden)).max(0.0);
    }
    for ((z, w_row), &b) in scratch.logits.iter_mut().zip(w3.chunks_exact(h2)).zip(b3) {
        *z = b + dot(w_row, &scratch.hidden2);
    }
    n_inputs
}

/// Adds the cross-entropy gradient of every row in `batch` to `grad` (not divided by the batch
/// size) by backpropagation and returns the summed loss.
pub(super) fn accumulate(n_features: usize, h1: usize, h2: usize, pass: Pass<'_>) -> f32 {
    let Pass { params, data, batch, grad, scratch } = pass;
    let n_classes = scratch.logits.len();
    let [_, _, w2, _, w3, _] = blocks(n_features, h1, h2, n_classes, params);
    let s = sizes(n_features, h1, h2, n_classes);
    let (gw1, rest) = grad.split_at_mut(s[0]);
    let (gb1, rest) = rest.split_at_mut(s[1]);
    let (gw2, rest) = rest.split_at_mut(s[2]);
    let (gb2, rest) = rest.split_at_mut(s[3]);
    let (gw3, gb3) = rest.split_at_mut(s[4]);
    let mut total = 0.0;
    for &i in batch {
        let x = data.row(i);
        let n_inputs = forward(n_features, h1, h2, params, x, scratch);
        total += softmax_cross_entropy(&mut scratch.logits, data.labels[i] as usize);
        let Scratch { logits: d_logits, hidden: a1, d_hidden: d1, nz_inputs, hidden2: a2, d_hidden2: d2 } =
            &mut *scratch;
        // Output layer.
        dense_layer_backward(w3, a2, d_logits, false, gw3, gb3, d2);
        // Second hidden layer (through its ReLU; a unit that is off adds nothing).
        relu_backward(d2, a2);
        dense_layer_backward(w2, a1, d2, true, gw2, gb2, d1);
        // First hidden layer.
        relu_backward(d1, a1);
        sparse_layer_backward(x, &nz_inputs[..n_inputs], d1, gw1, gb1);
    }
    total
}
