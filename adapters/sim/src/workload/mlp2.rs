//! A multilayer perceptron with two hidden ReLU layers: `a1 = relu(W1 x + b1)`,
//! `a2 = relu(W2 a1 + b2)`, logits `z = W3 a2 + b3`.
//!
//! Parameters: `W1` input-major (`n_features x h1`, row `j` = weights out of input `j`, as in
//! [`super::mlp`], so zero inputs are skipped), `b1` (`h1`), `W2` as `h2 x h1` (row `j` =
//! weights into unit `j` of the second layer), `b2` (`h2`), `W3` as `n_classes x h2`, `b3`.

use super::dataset::Dataset;
use super::numeric::{Scratch, axpy, dot, nonzeros, softmax_cross_entropy};

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
    let a1 = &mut scratch.hidden;
    a1.copy_from_slice(b1);
    for &j in &scratch.nz_inputs[..n_inputs] {
        axpy(x[j], &w1[j * h1..(j + 1) * h1], a1);
    }
    a1.iter_mut().for_each(|v| *v = v.max(0.0));
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
#[allow(clippy::too_many_arguments)]
pub(super) fn accumulate(
    n_features: usize,
    h1: usize,
    h2: usize,
    params: &[f32],
    data: &Dataset,
    batch: &[usize],
    grad: &mut [f32],
    scratch: &mut Scratch,
) -> f32 {
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
        d2.fill(0.0);
        for ((gw_row, w_row), &d) in gw3.chunks_exact_mut(h2).zip(w3.chunks_exact(h2)).zip(d_logits.iter()) {
            axpy(d, a2, gw_row);
            axpy(d, w_row, d2);
        }
        axpy(1.0, d_logits, gb3);
        // Second hidden layer (through its ReLU).
        for (d, &a) in d2.iter_mut().zip(a2.iter()) {
            *d = if a > 0.0 { *d } else { 0.0 };
        }
        d1.fill(0.0);
        for ((gw_row, w_row), &d) in gw2.chunks_exact_mut(h1).zip(w2.chunks_exact(h1)).zip(d2.iter()) {
            if d != 0.0 {
                axpy(d, a1, gw_row);
                axpy(d, w_row, d1);
            }
        }
        axpy(1.0, d2, gb2);
        // First hidden layer.
        for (d, &a) in d1.iter_mut().zip(a1.iter()) {
            *d = if a > 0.0 { *d } else { 0.0 };
        }
        for &j in &nz_inputs[..n_inputs] {
            axpy(x[j], d1, &mut gw1[j * h1..(j + 1) * h1]);
        }
        axpy(1.0, d1, gb1);
    }
    total
}
