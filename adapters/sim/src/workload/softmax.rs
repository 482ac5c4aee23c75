//! Softmax regression (multinomial logistic regression): logits `z = W x + b`.
//!
//! Parameters: `W` as an `n_classes x n_features` row-major matrix (row `k` holds the weights
//! into class `k`), then `b` (`n_classes`). With few classes, each row's forward pass is
//! `n_classes` dot products and its weight gradient `n_classes` `axpy`s, all over contiguous
//! rows of length `n_features`.

use super::numeric::{Pass, Scratch, axpy, dot, softmax_cross_entropy};

/// Writes the logits of row `x` into `scratch.logits` (already sized `n_classes`).
pub(super) fn forward(n_features: usize, params: &[f32], x: &[f32], scratch: &mut Scratch) {
    let n_classes = scratch.logits.len();
    let (w, b) = params.split_at(n_classes * n_features);
    for ((z, w_row), &b) in scratch.logits.iter_mut().zip(w.chunks_exact(n_features)).zip(b) {
        *z = b + dot(w_row, x);
    }
}

/// Adds the cross-entropy gradient of every row in `batch` to `grad` (not divided by the batch
/// size) and returns the summed loss.
pub(super) fn accumulate(n_features: usize, pass: Pass<'_>) -> f32 {
    let Pass { params, data, batch, grad, scratch } = pass;
    let n_classes = scratch.logits.len();
    let (gw, gb) = grad.split_at_mut(n_classes * n_features);
    let mut total = 0.0;
    for &i in batch {
        let x = data.row(i);
        forward(n_features, params, x, scratch);
        total += softmax_cross_entropy(&mut scratch.logits, data.labels[i] as usize);
        // scratch.logits now holds dL/dz = softmax(z) - onehot(y); dL/dW[k] = dL/dz[k] x.
        let d_logits = &scratch.logits;
        for (gw_row, &d) in gw.chunks_exact_mut(n_features).zip(d_logits) {
            axpy(d, x, gw_row);
        }
        axpy(1.0, d_logits, gb);
    }
    total
}
