//! The backup-worker protocols' worker (static `b` and DBW): the [`GradientWorker`], which
//! abandons a computation when a newer model arrives (option A) or runs it to completion
//! (option B: the server then sends it no model until its late gradient arrives).

use crate::proto::GradientWorker;

/// The backup-worker protocols' worker: a [`GradientWorker`].
pub type BackupWorker<T, S> = GradientWorker<T, S>;
