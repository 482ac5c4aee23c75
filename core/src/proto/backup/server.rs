//! The static backup-worker server: the backup-family [`Engine`] with a fixed `k = n − b`,
//! over the shared [`ServerCore`].

use super::{Admitted, BackupConfig, BackupCore, Engine};
use crate::error::ConfigError;
use crate::id::{Version, WorkerId};
use crate::math::Scalar;
use crate::proto::{Buffer, DEFAULT_INLINE_WORKERS, Inline, ProtocolServer, ServerCore, Storage};
use crate::time::Instant;

/// The static backup-worker server. `S` is the caller's storage for the model and the
/// accumulator (scratch of the model's length), `M` for the per-worker table.
pub type BackupServer<T, S, M = Inline<DEFAULT_INLINE_WORKERS>> = ProtocolServer<T, S, BackupRules<T, S>, M>;

/// The static backup-worker protocol's own state over the shared server core.
#[derive(Debug)]
pub struct BackupRules<T, S> {
    config: BackupConfig,
    engine: Engine<T, S>,
}

impl<T: Scalar, S: Buffer<T>, M: Storage> BackupServer<T, S, M> {
    /// A server starting from the model in `params` at version 0. `scratch` holds at least
    /// the model's length (its contents are overwritten).
    pub fn new(config: BackupConfig, params: S, scratch: S) -> Result<Self, ConfigError> {
        Self::resume(config, params, scratch, Version::ZERO)
    }

    /// A server resuming from a checkpoint: `params` is the model at `version`.
    pub fn resume(config: BackupConfig, params: S, scratch: S, version: Version) -> Result<Self, ConfigError> {
        if config.backup_workers >= config.workers && config.workers > 0 {
            return Err(ConfigError::Knob("backup_workers"));
        }
        let core = ServerCore::new(config.workers, config.learning_rate, config.stall_report, params, version)?;
        let k = config.aggregate() as usize;
        let engine =
            Engine::new(&core, config.learning_rate, config.gradient_policy, config.interrupt, k, scratch, |dim| dim)?;
        Ok(Self::from_parts(core, BackupRules { config, engine }))
    }

    /// The settings.
    pub fn config(&self) -> &BackupConfig {
        &self.rules().config
    }
}

impl<T: Scalar, S: Buffer<T>> BackupRules<T, S> {
    /// A full round closes and its model goes out at once.
    fn after_grad<M: Storage>(
        &mut self,
        core: &mut BackupCore<T, S, M>,
        now: Instant,
        _: WorkerId,
        admitted: Admitted,
    ) {
        if admitted.full {
            let (contributors, _) = self.engine.close(core, now);
            self.engine.publish(core, now, contributors);
        }
    }
}

impl<T, S> BackupRules<T, S> {
    /// A loss leaves the round's `n − b` unchanged: with more than `b` workers lost, the
    /// round waits for them as BSP does (static `b` is the user's promise of how many may
    /// be missing).
    fn after_loss<M: Storage>(&mut self, _core: &mut BackupCore<T, S, M>, _now: Instant) {}
}

impl<T, S> crate::proto::HasSlot for BackupRules<T, S> {
    type Slot = super::BackupSlot;
}

crate::proto::backup::backup_family_rules!(
    BackupRules<T, S>,
    0,
    crate::proto::ProtocolKind::Backup,
    "backup with interrupt complete"
);

impl<T, S> crate::proto::common::round_server::HasRound for BackupRules<T, S> {
    fn round_len(&self) -> usize {
        self.engine.round.len()
    }
}
