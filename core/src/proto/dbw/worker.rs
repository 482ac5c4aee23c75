//! DBW's worker: the [`GradientWorker`], as for static backup workers.

use crate::proto::GradientWorker;

/// DBW's worker: a [`GradientWorker`].
pub type DbwWorker<T, S> = GradientWorker<T, S>;
