//! ASP's worker: the [`GradientWorker`], which computes one gradient per model it receives,
//! sends it and waits for the server's reply.

use crate::proto::GradientWorker;

/// ASP's worker: a [`GradientWorker`].
pub type AspWorker<T, S> = GradientWorker<T, S>;
