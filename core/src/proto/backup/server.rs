//! The static backup-worker server: the backup-family [`Engine`] with a fixed `k = n − b`,
//! over the shared [`ServerCore`].

use super::{BackupConfig, Engine};
use crate::error::{ConfigError, Reject};
use crate::id::{Version, WorkerId, WorkerSet};
use crate::math::Scalar;
use crate::msg::Values;
use crate::proto::{Buffer, ProtocolServer, ServerCore};
use crate::time::Instant;

/// The static backup-worker server. `S` is the caller's storage for the model and the
/// accumulator (scratch of the model's length).
pub type BackupServer<T, S> = ProtocolServer<T, S, BackupRules<T, S>>;

/// The static backup-worker protocol's own state over the shared server core.
#[derive(Debug)]
pub struct BackupRules<T, S> {
    config: BackupConfig,
    engine: Engine<T, S>,
}

impl<T: Scalar, S: Buffer<T>> BackupServer<T, S> {
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

    /// Workers whose gradient for the current version is in.
    pub fn received(&self) -> &WorkerSet {
        &self.rules().engine.round.got
    }
}

impl<T: Scalar, S: Buffer<T>> BackupRules<T, S> {
    fn on_grad(
        &mut self,
        core: &mut ServerCore<T, S>,
        now: Instant,
        from: WorkerId,
        base: Version,
        seq: u64,
        values: &Values<'_, T>,
    ) -> Result<(), Reject> {
        let admitted = self.engine.admit(core, now, from, base, seq, values)?;
        if admitted.full {
            let (contributors, _) = self.engine.close(core, now);
            self.engine.publish(core, now, &contributors);
        }
        Ok(())
    }
}

crate::proto::backup::backup_family_rules!(BackupRules, 0);
