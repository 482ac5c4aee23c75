//! ASP's server: every admitted gradient is applied on arrival and answered with the new
//! model, over the shared [`ServerCore`].

use super::AspConfig;
use crate::error::{ConfigError, Reject};
use crate::id::{Version, WorkerId};
use crate::math::Scalar;
use crate::msg::Values;
use crate::proto::common::input::{Grad, Join};
use crate::proto::common::optim::{Scaled, Update};
use crate::proto::{
    Buffer, CoreOf, DEFAULT_INLINE_WORKERS, GradientPolicy, HasSlot, Inline, ProtocolServer, Recipient, Rules,
    ServerCore, ServerEvent, Storage,
};
use core::marker::PhantomData;

/// The ASP server. `S` is the caller's storage for the model, `M` for the per-worker table.
pub type AspServer<T, S, M = Inline<DEFAULT_INLINE_WORKERS>> = ProtocolServer<T, S, AspRules<T>, M>;

/// ASP's own state over the shared server core: only its settings.
#[derive(Debug)]
pub struct AspRules<T> {
    config: AspConfig,
    _t: PhantomData<T>,
}

impl<T> HasSlot for AspRules<T> {
    type Slot = ();
}

impl<T: Scalar, S: Buffer<T>, M: Storage> AspServer<T, S, M> {
    /// A server starting from the model in `params` at version 0.
    pub fn new(config: AspConfig, params: S) -> Result<Self, ConfigError> {
        Self::resume(config, params, Version::ZERO)
    }

    /// A server resuming from a checkpoint: `params` is the model at `version`.
    pub fn resume(config: AspConfig, params: S, version: Version) -> Result<Self, ConfigError> {
        let core = ServerCore::new(config.workers, config.learning_rate, None, params, version)?;
        Ok(Self::from_parts(core, AspRules { config, _t: PhantomData }))
    }

    /// The settings.
    pub fn config(&self) -> &AspConfig {
        &self.rules().config
    }
}

impl<T: Scalar> AspRules<T> {
    /// The checks of a gradient from `from` (sequence, admission, version); returns its
    /// admission factor. Changes nothing.
    #[inline(always)]
    fn screen<S: Buffer<T>, M: Storage>(
        &self,
        core: &CoreOf<T, S, M, Self>,
        from: WorkerId,
        base: Version,
        seq: u64,
        values: &Values<'_, T>,
        quiet: bool,
    ) -> Result<T, Reject> {
        core.roster.check_seq(from, seq)?;
        let factor = if quiet && self.config.gradient_policy == GradientPolicy::default() {
            values.check_len(core.dim())?;
            T::one()
        } else {
            self.config.gradient_policy.admit(values, core.dim())?
        };
        if base > core.version {
            return Err(Reject::FutureVersion { claimed: base, current: core.version });
        }
        Ok(factor)
    }

    /// The step a gradient admitted with `factor` is applied with: `−η · factor`.
    #[inline(always)]
    fn scale(&self, factor: T) -> T {
        T::from_f64(-self.config.learning_rate) * factor
    }

    /// The bookkeeping once a gradient that passed [`Self::screen`] is in the model: the
    /// sequence, the version, the counters and (unless `quiet`) the outputs.
    #[inline(always)]
    fn applied<S: Buffer<T>, M: Storage>(
        &mut self,
        core: &mut CoreOf<T, S, M, Self>,
        from: WorkerId,
        base: Version,
        seq: u64,
        factor: T,
        quiet: bool,
    ) {
        core.roster.commit_seq(from, seq);
        core.stats.accepted += 1;
        let staleness = base.lag_behind(core.version);
        core.version = core.version.next();
        core.stats.applied += 1;
        core.stats.updates += 1;
        if quiet {
            return;
        }
        let version = core.version;
        core.event(ServerEvent::Applied { worker: from, base, version, staleness, weight: factor.to_f64() });
        core.loss.count();
        core.updated(version, 1);
        core.send_model(Recipient::Worker(from));
    }
}

impl<T: Scalar, S: Buffer<T>, M: Storage> AspServer<T, S, M> {
    /// What `handle(now, from, Grad{base, seq, values})` does to the model, version, roster
    /// and counters, and the same refusals, without its outputs (`Applied`, `ModelUpdated`,
    /// the model to `from`; the caller reads the new model from
    /// [`Server::params`](crate::proto::Server::params)), for a sender in the same state
    /// machine whose `values` passed `GradientPolicy::default().admit` (the grouped
    /// server's aggregates: not screened twice; a server with another policy screens them).
    ///
    /// The update itself is the [`Update`] the caller's `update(values, a, lr)` makes, called
    /// once and only when the gradient is accepted, and applied through the server's rule:
    /// its plain step must be `params += a · values` with the bits of
    /// [`math::scaled_add`](crate::math::scaled_add), and may fuse more work over the same
    /// elements into that pass (the grouped server copies the new model out and clears its
    /// aggregate, which is why `values` is lent mutably).
    pub(crate) fn apply_screened<'v, U: Update<T>>(
        &mut self,
        from: WorkerId,
        base: Version,
        seq: u64,
        values: &'v mut [T],
        update: impl FnOnce(&'v mut [T], T, f64) -> U,
    ) -> Result<(), Reject> {
        let result = self.core.queue.ensure_room(Rules::<T, S, M>::burst(&self.rules)).and_then(|()| {
            self.core.roster.check_member(from)?;
            let factor = self.rules.screen(&self.core, from, base, seq, &Values::Slice(values), true)?;
            self.core.apply(update(values, self.rules.scale(factor), self.rules.config.learning_rate))?;
            self.rules.applied(&mut self.core, from, base, seq, factor, true);
            Ok(())
        });
        if result.is_err() {
            self.core.stats.rejected += 1;
        }
        result
    }
}

impl<T: Scalar, S: Buffer<T>, M: Storage> Rules<T, S, M> for AspRules<T> {
    fn kind(&self) -> crate::proto::ProtocolKind {
        use crate::proto::ProtocolKind;
        ProtocolKind::Asp
    }

    fn burst(&self) -> usize {
        4
    }

    fn on_join(&mut self, core: &mut CoreOf<T, S, M, Self>, join: Join) -> Result<(), Reject> {
        core.join_and_send_model(join.from, join.epoch).map(|_| ())
    }

    fn on_grad(&mut self, core: &mut CoreOf<T, S, M, Self>, grad: Grad<'_, '_, T>) -> Result<(), Reject> {
        let Grad { from, base, seq, values, .. } = grad;
        let factor = self.screen(core, from, base, seq, values, false)?;
        // Admission checked the length: the update below cannot fail.
        core.apply(Scaled { values, a: self.scale(factor), lr: self.config.learning_rate })?;
        self.applied(core, from, base, seq, factor, false);
        Ok(())
    }
}
