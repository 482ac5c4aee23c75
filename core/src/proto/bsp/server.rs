//! BSP's server: one [`Round`] per version, closed when all `n` gradients of that version are
//! in, over the shared [`ServerCore`].

use super::BspConfig;
use crate::error::{ConfigError, Reject};
use crate::id::Version;
use crate::math::Scalar;
use crate::proto::common::input::{Grad, Join};
use crate::proto::common::round::Round;
use crate::proto::common::table::RoundSlot;
use crate::proto::common::validate::zero_scratch;
use crate::proto::{
    Buffer, CoreOf, DEFAULT_INLINE_WORKERS, DropReason, HasSlot, Inline, ProtocolServer, Recipient, Rules, ServerCore,
    ServerEvent, Storage,
};
use crate::time::Instant;
use core::marker::PhantomData;

/// The BSP server. `S` is the caller's storage for the model and the accumulator, `M` for
/// the per-worker table.
pub type BspServer<T, S, M = Inline<DEFAULT_INLINE_WORKERS>> = ProtocolServer<T, S, BspRules<T, S>, M>;

/// BSP's own state over the shared server core: the accumulator and the open round.
#[derive(Debug)]
pub struct BspRules<T, S> {
    config: BspConfig,
    acc: S,
    /// Optional second accumulator for the fused admission (see
    /// [`BspServer::with_spare_accumulator`]).
    spare: Option<S>,
    round: Round,
    _t: PhantomData<T>,
}

impl<T, S> HasSlot for BspRules<T, S> {
    type Slot = RoundSlot;
}

impl<T: Scalar, S: Buffer<T>, M: Storage> BspServer<T, S, M> {
    /// A server starting from the model in `params` at version 0. `acc` is scratch space of
    /// the same length (its contents are overwritten).
    pub fn new(config: BspConfig, params: S, acc: S) -> Result<Self, ConfigError> {
        Self::resume(config, params, acc, Version::ZERO)
    }

    /// A server resuming from a checkpoint: `params` is the model at `version`.
    pub fn resume(config: BspConfig, params: S, mut acc: S, version: Version) -> Result<Self, ConfigError> {
        let core = ServerCore::new(config.workers, config.learning_rate, config.stall_report, params, version)?;
        let dim = core.dim();
        zero_scratch(acc.as_mut(), dim)?;
        Ok(Self::from_parts(core, BspRules { config, acc, spare: None, round: Round::new(), _t: PhantomData }))
    }

    /// Gives the server a second accumulator (at least the model's length; its contents
    /// are never read) so that each gradient costs one pass instead of two: admission
    /// (length, finiteness, norm) and accumulation run fused, writing `spare = acc + g`,
    /// and the two buffers swap when the gradient is accepted. A refused gradient still
    /// changes nothing (the accumulator is never written before the verdict) and the
    /// result has the same bits as without a spare. Costs `d` more elements of memory.
    pub fn with_spare_accumulator(mut self, spare: S) -> Result<Self, ConfigError> {
        let (dim, given) = (self.core.dim(), spare.as_ref().len());
        if given < dim {
            return Err(ConfigError::ScratchTooSmall { needed: dim, given });
        }
        self.rules.spare = Some(spare);
        Ok(self)
    }

    /// The settings.
    pub fn config(&self) -> &BspConfig {
        &self.rules().config
    }
}

impl<T: Scalar, S: Buffer<T>> BspRules<T, S> {
    /// Gradients that complete a round.
    fn needed<M: Storage>(core: &CoreOf<T, S, M, Self>) -> usize {
        #[allow(unused_mut)]
        let mut needed = core.n();
        // CANARY (planted bug, test builds only): the round closes one gradient short.
        #[cfg(feature = "_canary")]
        if crate::canary::is_on(crate::canary::Canary::RoundClosesEarly) {
            needed = needed.saturating_sub(1).max(1);
        }
        needed
    }

    /// After a gradient went into the round: closes it when complete.
    fn after_add<M: Storage>(
        &mut self,
        core: &mut CoreOf<T, S, M, Self>,
        now: Instant,
        dim: usize,
    ) -> Result<(), Reject> {
        if self.round.len() == Self::needed(core) {
            let acc = self.acc.as_mut().get_mut(..dim).ok_or(Reject::Capacity)?;
            self.round.close(core, acc, self.config.learning_rate);
            core.send_model(Recipient::AllWorkers);
        }
        core.stall.progress(now);
        Ok(())
    }
}

impl<T: Scalar, S: Buffer<T>, M: Storage> Rules<T, S, M> for BspRules<T, S> {
    fn kind(&self) -> crate::proto::ProtocolKind {
        crate::proto::ProtocolKind::Bsp
    }

    fn relays_means(&self) -> Result<(), &'static str> {
        Ok(())
    }

    fn burst(&self) -> usize {
        // A close: the contributors' events (one batch), the update event and the broadcast.
        4
    }

    fn on_join(&mut self, core: &mut CoreOf<T, S, M, Self>, join: Join) -> Result<(), Reject> {
        let fresh = core.join(join.from, join.epoch)?;
        if !core.join_waits_for_round(join.from, fresh) {
            core.send_model(Recipient::Worker(join.from));
        }
        Ok(())
    }

    fn on_grad(&mut self, core: &mut CoreOf<T, S, M, Self>, grad: Grad<'_, '_, T>) -> Result<(), Reject> {
        let Grad { now, from, base, seq, values, .. } = grad;
        core.roster.check_seq(from, seq)?;
        let dim = core.dim();
        let current = base == core.version && !Round::contains(&core.roster, from, base);
        if current && self.round.len() + 1 == Self::needed(core) {
            // The round's last gradient: admission (the verdict of either path below), then
            // the accumulation folded into the update, one pass over the accumulator fewer.
            let factor = self.config.gradient_policy.admit(values, dim)?;
            let acc = self.acc.as_mut().get_mut(..dim).ok_or(Reject::Capacity)?;
            // The lengths passed admission: the update below cannot fail.
            self.round.add_and_close(core, from, values, factor, acc, self.config.learning_rate)?;
            core.roster.commit_seq(from, seq);
            core.stats.accepted += 1;
            core.send_model(Recipient::AllWorkers);
            core.stall.progress(now);
            return Ok(());
        }
        if let Some(spare) = self.spare.as_mut().filter(|_| current) {
            // Fused: the only checks left after admission pass here, so the verdict (and any
            // refusal) is the one of the two-pass path below.
            let (acc, out) = (self.acc.as_ref().get(..dim), spare.as_mut().get_mut(..dim));
            let (Some(acc), Some(out)) = (acc, out) else { return Err(Reject::Capacity) };
            let (factor, _) = self.config.gradient_policy.admit_add_to(values, acc, out)?;
            core::mem::swap(&mut self.acc, spare);
            core.roster.commit_seq(from, seq);
            core.stats.accepted += 1;
            self.round.record(&mut core.roster, base, from, factor, &mut core.loss);
            return self.after_add(core, now, dim);
        }
        let factor = self.config.gradient_policy.admit(values, dim)?;
        if base > core.version {
            return Err(Reject::FutureVersion { claimed: base, current: core.version });
        }
        if base == core.version && Round::contains(&core.roster, from, base) {
            return Err(Reject::Duplicate { worker: from, seq });
        }
        core.roster.commit_seq(from, seq);
        core.stats.accepted += 1;
        if base < core.version {
            core.stats.count_drop(DropReason::Stale);
            core.event(ServerEvent::Dropped { worker: from, base, reason: DropReason::Stale });
            return Ok(());
        }
        let acc = self.acc.as_mut().get_mut(..dim).ok_or(Reject::Capacity)?;
        self.round.add(&mut core.roster, base, from, values, factor, acc, &mut core.loss)?;
        self.after_add(core, now, dim)
    }

    /// Every worker, live or not, whose gradient the open round lacks.
    fn awaits(&self, core: &CoreOf<T, S, M, Self>, worker: crate::id::WorkerId) -> bool {
        core.roster.record(worker).is_some() && !Round::contains(&core.roster, worker, core.version)
    }

    fn on_timeout(&mut self, core: &mut CoreOf<T, S, M, Self>, now: Instant) {
        if core.stall.due(now) {
            if let Some(waiting_for) = Round::first_missing_any(&core.roster, core.version) {
                let missing = (core.n() - self.round.len()) as u32;
                let since = core.stall.since();
                core.event(ServerEvent::Stalled { waiting_for, missing, since });
            }
        }
    }
}

impl<T, S> crate::proto::common::round_server::HasRound for BspRules<T, S> {
    fn round_len(&self) -> usize {
        self.round.len()
    }
}
