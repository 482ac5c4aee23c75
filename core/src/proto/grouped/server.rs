//! The grouped protocol in one state machine: the central server and every group.

use crate::error::{ConfigError, Reject};
use crate::id::{Version, WorkerId};
use crate::math::{self, LengthMismatch, Scalar};
use crate::msg::{ToServer, ToWorker, Values};
use crate::proto::asp::AspServer;
use crate::proto::common::optim::Update;
use crate::proto::common::validate::zero_scratch;
use crate::proto::{
    Buffer, DEFAULT_INLINE_WORKERS, Inline, Optimizer, Recipient, Server, ServerEvent, ServerOutput, ServerStats,
    Storage,
};
use crate::time::Instant;
use core::marker::PhantomData;

use super::group::*;
use super::items::*;
use super::kernels::*;
use super::*;

/// The grouped protocol in one state machine: the central [`AspServer`] and the `G` group
/// servers, exchanging instantly and internally, with the [`Server`] verbs toward the `n`
/// workers. `S` is the caller's storage: `params` holds the central model; `scratch` at
/// least [`GroupedConfig::scratch_len`] elements (each group's model and accumulators); `M`
/// for the per-worker table.
///
/// [`Server::version`] and [`Server::params`] are the central model's; [`Server::stats`]
/// counts worker gradients (`updates` counts central updates).
#[derive(Debug)]
pub struct GroupedServer<T, S, M: Storage = Inline<DEFAULT_INLINE_WORKERS>> {
    pub(super) central: AspServer<T, S, Inline<MAX_GROUPS>>,
    pub(super) scratch: S,
    pub(super) groups: [Group; MAX_GROUPS],
    pub(super) shared: Shared<M>,
    pub(super) dim: usize,
    pub(super) per: usize,
    pub(super) _t: PhantomData<T>,
}

impl<T: Scalar, S: Buffer<T>, M: Storage> GroupedServer<T, S, M> {
    /// The update rule `optimizer` on the central model (see
    /// [`ProtocolServer::with_optimizer`](crate::proto::ProtocolServer::with_optimizer)): it
    /// acts on each group aggregate the central server applies, as an outer optimizer over
    /// the groups' steps (a group's own `H − 1` local steps stay plain SGD).
    pub fn with_optimizer(mut self, optimizer: Optimizer, state: S) -> Result<Self, ConfigError> {
        refuse_mean(&optimizer)?;
        self.central = self.central.with_optimizer(optimizer, state)?;
        Ok(self)
    }

    /// [`Self::with_optimizer`] from a checkpoint's state.
    pub fn with_optimizer_state(mut self, optimizer: Optimizer, state: S) -> Result<Self, ConfigError> {
        refuse_mean(&optimizer)?;
        self.central = self.central.with_optimizer_state(optimizer, state)?;
        Ok(self)
    }

    /// SGD with momentum on the central model (see
    /// [`ProtocolServer::with_momentum`](crate::proto::ProtocolServer::with_momentum)).
    pub fn with_momentum(self, beta: f64, prev: S) -> Result<Self, ConfigError> {
        self.with_optimizer(Optimizer::momentum(beta), prev)
    }

    /// [`Self::with_momentum`] from a checkpoint's buffer.
    pub fn with_momentum_state(self, beta: f64, prev: S) -> Result<Self, ConfigError> {
        self.with_optimizer_state(Optimizer::momentum(beta), prev)
    }
}

impl<T: Scalar, S: Buffer<T>, M: Storage> GroupedServer<T, S, M> {
    /// A server starting from the model in `params` at version 0.
    pub fn new(config: GroupedConfig, params: S, scratch: S) -> Result<Self, ConfigError> {
        Self::resume(config, params, scratch, Version::ZERO)
    }

    /// A server resuming from a checkpoint: `params` is the central model at `version`.
    pub fn resume(config: GroupedConfig, params: S, mut scratch: S, version: Version) -> Result<Self, ConfigError> {
        let mut shared = Shared::new(config)?;
        let dim = params.as_ref().len();
        let central = AspServer::resume(config.central_config(), params, version)?;
        let needed = config.scratch_len(dim);
        zero_scratch(scratch.as_mut(), needed)?;
        let mut groups = [Group::new(0, &mut shared); MAX_GROUPS];
        for (g, group) in groups.iter_mut().enumerate().take(config.groups as usize) {
            *group = Group::new(g as u32, &mut shared);
        }
        let mut server =
            Self { central, scratch, groups, shared, dim, per: config.group_buffers() + 1, _t: PhantomData };
        for g in 0..config.groups {
            server.exchange(Instant::ZERO, g as usize, Closed::Rejoin);
        }
        Ok(server)
    }

    /// The settings.
    pub fn config(&self) -> &GroupedConfig {
        &self.shared.config
    }

    /// The central server.
    pub fn central(&self) -> &AspServer<T, S, Inline<MAX_GROUPS>> {
        &self.central
    }

    /// Group `g`'s model version (as its members see it), if `g < G`.
    pub fn group_version(&self, g: u32) -> Option<Version> {
        self.groups.get(g as usize).filter(|_| g < self.shared.layout.groups).map(|gr| gr.version)
    }

    /// The central version group `g`'s model is based on, if `g < G`.
    pub fn group_base(&self, g: u32) -> Option<Version> {
        self.groups.get(g as usize).filter(|_| g < self.shared.layout.groups).map(|gr| gr.base)
    }

    /// Group `g`'s model, if `g < G`.
    pub fn group_model(&self, g: u32) -> Option<&[T]> {
        (g < self.shared.layout.groups).then(|| part(self.scratch.as_ref(), g as usize, self.dim, self.per))
    }

    /// Sends group `g`'s pending upstream message (`Grad` after [`Closed::Exchange`], `Join`
    /// after [`Closed::Rejoin`]) to the central server and delivers its reply.
    #[inline(always)]
    pub(super) fn exchange(&mut self, now: Instant, g: usize, closed: Closed) {
        let Self { central, scratch, groups, shared, dim, per, .. } = self;
        let (Some(group), Some((model, acc, total))) = (groups.get_mut(g), parts(scratch.as_mut(), g, *dim, *per))
        else {
            return;
        };
        let from = WorkerId(group.id);
        let sent = match closed {
            Closed::Local => return,
            Closed::Exchange => {
                // The aggregate is lent to the central server, which applies it without
                // queuing the outputs a remote group would get (its reply is read here) and
                // without screening it again: `Group::close` screened it with the central
                // server's policy.
                // The update, the group's copy of the new model and the clearing of the
                // aggregate are one pass (`apply_copy_clear`); what is left of the re-base
                // cannot fail after an accepted update (the new version exceeds the base).
                let (base, _, seq) = group.take_exchange();
                let aggregate: &mut [T] = if shared.config.local_steps > 1 { &mut *total } else { &mut *acc };
                let applied = central.apply_screened(from, base, seq, aggregate, |agg, a, lr| CopyOut {
                    agg,
                    model: &mut *model,
                    a,
                    lr,
                });
                match applied {
                    Ok(()) => {
                        let version = central.version();
                        if let Err(reason) = group.rebase_applied(shared, now, version) {
                            shared.event(ServerEvent::GroupRebaseFailed { group: group.id, version, reason });
                        }
                        return;
                    }
                    Err(reason) => Err(reason),
                }
            }
            Closed::Rejoin => central.handle(now, from, ToServer::Join { epoch: 0 }),
        };
        // The central server takes every aggregate that passed the same screening, and
        // answers a join of a known member with its model; a refusal is reported all the same.
        if let Err(reason) = sent {
            shared.event(ServerEvent::GroupExchangeRefused { group: group.id, base: group.base, reason });
        }
        while let Some(out) = central.poll_output() {
            if let ServerOutput::Send { to: Recipient::Worker(to), msg: ToWorker::Model { version, values, .. } } = out
            {
                if to == from {
                    if let Err(reason) = group.rebase(shared, now, version, &values, model, acc, total) {
                        shared.event(ServerEvent::GroupRebaseFailed { group: group.id, version, reason });
                    }
                }
            }
        }
    }

    /// A group of one member that is (re)joining, with no step in progress, takes the newest
    /// central model first (no other member can be computing on the old one), as an ASP
    /// worker would.
    pub(super) fn refresh_single(&mut self, g: usize) {
        let Self { central, scratch, groups, dim, per, .. } = self;
        let Some(group) = groups.get_mut(g) else { return };
        let current = central.version();
        if group.size != 1
            || group.step != 0
            || group.count != 0
            || group.phase != Phase::Collecting
            || current <= group.base
        {
            return;
        }
        if let Some((model, _, _)) = parts(scratch.as_mut(), g, *dim, *per) {
            if math::copy(model, central.params()).is_ok() {
                group.base = current;
                group.version = group.version.next().max(current);
            }
        }
    }

    /// [`Server::poll_output`] past its fast path: models, batches, the stop.
    #[inline(never)]
    fn poll_items(&mut self) -> Option<ServerOutput<'_, T>> {
        let Self { scratch, groups, shared, dim, per, .. } = self;
        let (scratch, groups, dim, per) = (&*scratch, &*groups, &*dim, &*per);
        // The payload is looked up out of line, so the common output (an event) pays
        // nothing for it.
        shared
            .poll(|g| groups.get(g as usize).map_or(Version::ZERO, |gr| gr.version), |g| model_of(scratch, g, dim, per))
    }

    #[allow(clippy::too_many_arguments)]
    pub(super) fn on_grad(
        &mut self,
        now: Instant,
        g: usize,
        from: WorkerId,
        base: Version,
        seq: u64,
        values: &Values<'_, T>,
        loss: Option<f32>,
    ) -> Result<(), Reject> {
        let Self { scratch, groups, shared, dim, per, .. } = self;
        let group = groups.get_mut(g).ok_or(Reject::UnknownWorker(from))?;
        let (model, acc, total) = parts(scratch.as_mut(), g, *dim, *per).ok_or(Reject::Capacity)?;
        let added = group.on_grad(shared, now, from, base, seq, values, loss, acc)?;
        if added.complete() {
            let closed = group.close(shared, now, model, acc, total, added);
            self.exchange(now, g, closed);
        }
        Ok(())
    }
}

/// Group `g`'s model in a [`GroupedServer`]'s scratch.
#[inline(never)]
fn model_of<'a, T, S: Buffer<T>>(scratch: &'a S, g: u32, dim: &usize, per: &usize) -> &'a [T] {
    part(scratch.as_ref(), g as usize, *dim, *per)
}

impl<T: Scalar, S: Buffer<T>, M: Storage> Server<T> for GroupedServer<T, S, M> {
    fn handle(&mut self, now: Instant, from: WorkerId, msg: ToServer<'_, T>) -> Result<(), Reject> {
        if self.shared.roster.pending_losses() != 0 {
            self.shared.apply_pending_losses();
        }
        let result = self.shared.ensure_room().and_then(|()| {
            // Membership: only a worker of the roster has a group.
            let g = self.shared.group_of(from).ok_or(Reject::UnknownWorker(from))?;
            match msg {
                ToServer::Join { epoch } => {
                    self.shared.roster.check_join(from, epoch)?;
                    self.refresh_single(g);
                    let group = self.groups.get_mut(g).ok_or(Reject::UnknownWorker(from))?;
                    self.shared.on_join(group, from, epoch)
                }
                // By reference: `values` is read where the caller put it, never copied.
                ToServer::Grad { base, seq, ref values, loss, .. } => {
                    self.on_grad(now, g, from, base, seq, values, loss)
                }
                ToServer::Leave => self.shared.on_lost(from),
                other => Err(Reject::Unexpected { kind: other.kind_name() }),
            }
        });
        if result.is_err() {
            self.shared.stats.rejected += 1;
        }
        result
    }

    fn handle_worker_lost(&mut self, now: Instant, worker: WorkerId) -> Result<(), Reject> {
        self.shared.report_lost(now, worker)
    }

    fn handle_timeout(&mut self, now: Instant) {
        if self.shared.roster.pending_losses() != 0 {
            self.shared.apply_pending_losses();
        }
        if self.shared.ensure_room().is_err() {
            return;
        }
        let g = self.shared.layout.groups as usize;
        for group in self.groups.iter_mut().take(g) {
            group.check_stall(&mut self.shared, now);
        }
    }

    fn poll_output(&mut self) -> Option<ServerOutput<'_, T>> {
        // Drained after every input: most calls find the queue empty or an event in front,
        // answered here; everything else goes to the out-of-line general case.
        match self.shared.queue.front_mut() {
            Some(Item::Event(e)) => {
                let out = Some(ServerOutput::Event(*e));
                self.shared.queue.advance();
                return out;
            }
            None if self.shared.roster.pending_losses() == 0 => return None,
            // A batch, or the queue is empty with losses that waited for the drain (applied
            // by the general case).
            _ => {}
        }
        self.poll_items()
    }

    fn poll_timeout(&self) -> Option<Instant> {
        // Without stall reports no group has a deadline: no need to look at each.
        self.shared.config.stall_report?;
        let g = self.shared.layout.groups as usize;
        self.groups.iter().take(g).filter_map(|gr| gr.stall.deadline()).min()
    }

    fn stop(&mut self) {
        for group in self.groups.iter_mut() {
            group.stall.idle();
        }
        self.shared.push(Item::Stop);
    }

    fn version(&self) -> Version {
        self.central.version()
    }

    fn params(&self) -> &[T] {
        self.central.params()
    }

    fn stats(&self) -> &ServerStats {
        &self.shared.stats
    }
}

/// A group aggregate applied to the central model and the group re-based on the result:
/// `params += a·agg` by the central server's rule, `model = params`, `agg = 0`
/// ([`apply_copy_clear`] without a rule).
struct CopyOut<'a, T> {
    /// The aggregate, the model's length.
    agg: &'a mut [T],
    /// The group's model, the model's length.
    model: &'a mut [T],
    /// The central step's coefficient `−η·w`.
    a: T,
    /// The central learning rate.
    lr: f64,
}

impl<T: Scalar> Update<T> for CopyOut<'_, T> {
    fn lr(&self) -> f64 {
        self.lr
    }
    fn coefficient(&self) -> T {
        self.a
    }
    fn check(&self, dim: usize) -> Result<(), LengthMismatch> {
        let short = self.agg.len().min(self.model.len());
        if short == dim { Ok(()) } else { Err(LengthMismatch { expected: dim, actual: short }) }
    }
    #[inline(always)]
    fn plain(self, params: &mut [T]) -> Result<(), LengthMismatch> {
        apply_copy_clear(params, self.a, self.agg, self.model);
        Ok(())
    }
    fn each(self, params: &mut [T], mut f: impl FnMut(&mut T, T)) {
        for ((x, a), m) in params.iter_mut().zip(self.agg.iter_mut()).zip(self.model.iter_mut()) {
            f(x, *a);
            *m = *x;
            *a = T::zero();
        }
    }
}

/// Refuses the [`Rule::Mean`](crate::proto::Rule::Mean) relay: a central update is one
/// group's aggregate, made on a stale central model.
pub(crate) fn refuse_mean(optimizer: &Optimizer) -> Result<(), ConfigError> {
    if optimizer.rule == crate::proto::Rule::Mean {
        return Err(ConfigError::RuleUnsupported {
            rule: optimizer.rule_name(),
            protocol: crate::proto::ProtocolKind::Grouped.as_str(),
        });
    }
    Ok(())
}
