//! BSP's worker: the [`GradientWorker`], which computes one gradient per model it receives,
//! sends it and waits for the next model.

use crate::proto::GradientWorker;

/// BSP's worker: a [`GradientWorker`].
pub type BspWorker<T, S> = GradientWorker<T, S>;
