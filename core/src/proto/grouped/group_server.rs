//! One group server on its own, for a group server in its own process.

use crate::error::{ConfigError, Reject};
use crate::id::{Version, WorkerId};
use crate::math::Scalar;
use crate::msg::{ToServer, ToWorker, Values};
use crate::proto::common::validate::zero_scratch;
use crate::proto::{Buffer, DEFAULT_INLINE_WORKERS, Inline, Server, ServerOutput, ServerStats, Storage};
use crate::time::Instant;
use core::marker::PhantomData;
use heapless::Deque;

use super::group::*;
use super::items::*;
use super::*;

/// An upstream message before its payload is attached.
#[derive(Clone, Copy, Debug)]
pub(super) enum Up {
    Join,
    Grad { base: Version, iteration: u64, seq: u64, loss: Option<f32> },
}

/// One group server on its own (for a group server in its own process): BSP toward its
/// members, an ASP worker of the central server upstream. See the [module docs](super) for
/// the driving contract. `S` is the caller's storage: `model` (the model's length; its
/// contents are replaced by the central server's first `Model`) and `scratch` of at least
/// [`GroupedConfig::group_scratch_len`] elements; `M` for the per-worker table.
///
/// Members keep their global worker ids; ids outside the group are refused as unknown.
/// [`Server::version`] and [`Server::params`] are the group model's.
#[derive(Debug)]
pub struct GroupServer<T, S, M: Storage = Inline<DEFAULT_INLINE_WORKERS>> {
    pub(super) group: Group,
    pub(super) shared: Shared<M>,
    pub(super) epoch: u32,
    pub(super) model: S,
    pub(super) scratch: S,
    pub(super) up: Deque<Up, 4>,
    pub(super) _t: PhantomData<T>,
}

impl<T: Scalar, S: Buffer<T>, M: Storage> GroupServer<T, S, M> {
    /// Group `group` of `config`, joining the central server with session `epoch` (increase
    /// it on every restart). Its first upstream output is `Join`.
    pub fn new(config: GroupedConfig, group: u32, epoch: u32, model: S, mut scratch: S) -> Result<Self, ConfigError> {
        let mut shared = Shared::new(config)?;
        if group >= config.groups {
            return Err(ConfigError::Knob("group"));
        }
        let dim = model.as_ref().len();
        if dim == 0 {
            return Err(ConfigError::EmptyModel);
        }
        let needed = config.group_scratch_len(dim);
        zero_scratch(scratch.as_mut(), needed)?;
        let mut up = Deque::new();
        // The first item of an empty queue: cannot fail, and is counted if it does.
        if up.push_back(Up::Join).is_err() {
            shared.stats.outputs_lost += 1;
        }
        let mut group = Group::new(group, &mut shared);
        group.seq = crate::id::first_seq(epoch);
        Ok(Self { group, shared, epoch, model, scratch, up, _t: PhantomData })
    }

    /// The settings.
    pub fn config(&self) -> &GroupedConfig {
        &self.shared.config
    }

    /// This group's index.
    pub fn group(&self) -> u32 {
        self.group.id
    }

    /// The central version the group model is based on.
    pub fn central_base(&self) -> Version {
        self.group.base
    }

    /// Whether an exchange (or a join) awaits the central server's reply.
    pub fn awaiting_central(&self) -> bool {
        self.group.phase != Phase::Collecting
    }
}

impl<T: Scalar, S: Buffer<T>, M: Storage> Server<T> for GroupServer<T, S, M> {
    fn handle(&mut self, now: Instant, from: WorkerId, msg: ToServer<'_, T>) -> Result<(), Reject> {
        if self.shared.roster.pending_losses() != 0 {
            self.shared.apply_pending_losses();
        }
        let result = self.shared.ensure_room().and_then(|()| {
            if self.shared.group_of(from) != Some(self.group.id as usize) {
                return Err(Reject::UnknownWorker(from));
            }
            match msg {
                ToServer::Join { epoch } => {
                    self.shared.roster.check_join(from, epoch)?;
                    let g = &mut self.group;
                    if g.size == 1 && g.step == 0 && g.count == 0 && g.phase == Phase::Collecting {
                        // A group of one with no step in progress refreshes from the central
                        // server first (as an ASP server answers a join); see `GroupedServer`.
                        if self.up.is_full() {
                            return Err(Reject::Capacity);
                        }
                        g.phase = Phase::Joining;
                        if self.up.push_back(Up::Join).is_err() {
                            self.shared.stats.outputs_lost += 1;
                        }
                    }
                    self.shared.on_join(&mut self.group, from, epoch)
                }
                ToServer::Grad { base, seq, ref values, loss, .. } => {
                    if self.up.len() + 1 > self.up.capacity() {
                        return Err(Reject::Capacity);
                    }
                    let shared = &mut self.shared;
                    let group = &mut self.group;
                    let dim = self.model.as_ref().len();
                    let total_len = if shared.config.local_steps > 1 { dim } else { 0 };
                    let (acc, total) = self.scratch.as_mut().split_at_mut_checked(dim).ok_or(Reject::Capacity)?;
                    let total = total.get_mut(..total_len).ok_or(Reject::Capacity)?;
                    let added = group.on_grad(shared, now, from, base, seq, values, loss, acc)?;
                    if added.complete() {
                        let up = match group.close(shared, now, self.model.as_mut(), acc, total, added) {
                            Closed::Local => None,
                            Closed::Exchange => {
                                let (base, iteration, seq) = group.take_exchange();
                                Some(Up::Grad { base, iteration, seq, loss: group.loss.mean() })
                            }
                            Closed::Rejoin => Some(Up::Join),
                        };
                        // Room was checked above: this cannot fail, and is counted if it does.
                        if up.is_some_and(|item| self.up.push_back(item).is_err()) {
                            shared.stats.outputs_lost += 1;
                        }
                    }
                    Ok(())
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
        if self.shared.group_of(worker) != Some(self.group.id as usize) {
            return Err(Reject::UnknownWorker(worker));
        }
        self.shared.report_lost(now, worker)
    }

    fn handle_timeout(&mut self, now: Instant) {
        if self.shared.roster.pending_losses() != 0 {
            self.shared.apply_pending_losses();
        }
        if self.shared.ensure_room().is_ok() {
            self.group.check_stall(&mut self.shared, now);
        }
    }

    /// The members' outputs first, then the messages for the central server (payloads borrow
    /// the group's buffers).
    fn poll_output(&mut self) -> Option<ServerOutput<'_, T>> {
        let version = self.group.version;
        let model = self.model.as_ref();
        if let Some(out) = self.shared.poll(|_| version, |_| model) {
            return Some(out);
        }

        let item = self.up.pop_front()?;
        Some(ServerOutput::Upstream(match item {
            Up::Join => ToServer::Join { epoch: self.epoch },
            Up::Grad { base, iteration, seq, loss } => {
                let dim = model.len();
                let scratch = self.scratch.as_ref();
                let aggregate =
                    if self.shared.config.local_steps > 1 { scratch.get(dim..2 * dim) } else { scratch.get(..dim) };
                ToServer::Grad { base, iteration, seq, values: Values::Slice(aggregate.unwrap_or(&[])), loss }
            }
        }))
    }

    fn poll_timeout(&self) -> Option<Instant> {
        self.group.stall.deadline()
    }

    fn stop(&mut self) {
        self.group.stall.idle();
        self.shared.push(Item::Stop);
    }

    fn version(&self) -> Version {
        self.group.version
    }

    fn params(&self) -> &[T] {
        self.model.as_ref()
    }

    fn stats(&self) -> &ServerStats {
        &self.shared.stats
    }

    /// Always: the group server is an ASP worker of the central server.
    fn has_upstream(&self) -> bool {
        true
    }

    /// A message from the central server: `Model` (the reply to a `Join` or to an exchange)
    /// or `Stop` (passed on to the members).
    fn handle_upstream(&mut self, now: Instant, msg: ToWorker<'_, T>) -> Result<(), Reject> {
        self.shared.ensure_room()?;
        match msg {
            ToWorker::Model { version, values, .. } => {
                let (model, acc, total) = {
                    let dim = self.model.as_ref().len();
                    let total_len = if self.shared.config.local_steps > 1 { dim } else { 0 };
                    let (acc, total) = self.scratch.as_mut().split_at_mut_checked(dim).ok_or(Reject::Capacity)?;
                    (self.model.as_mut(), acc, total.get_mut(..total_len).ok_or(Reject::Capacity)?)
                };
                self.group.rebase(&mut self.shared, now, version, &values, model, acc, total)
            }
            ToWorker::Stop => {
                self.stop();
                Ok(())
            }
            other => Err(Reject::Unexpected { kind: other.kind_name() }),
        }
    }
}
