//! The backup-worker family's shared state (static `b` and DBW): a round that closes after
//! the first `k` gradients of the current version, what happens to the stragglers, and the
//! per-worker send times that round trips are measured from.

use super::Interrupt;
use crate::error::{ConfigError, Reject};
use crate::id::{Version, WorkerId};
use crate::math::Scalar;
use crate::proto::common::input::{Grad, Join};
use crate::proto::common::queue::BatchKind;
use crate::proto::common::roster::mark_of;
use crate::proto::common::round::Round;
use crate::proto::common::table::{Slot, flag};
use crate::proto::common::validate::zero_scratch;
use crate::proto::{Buffer, DropReason, GradientPolicy, Recipient, ServerCore, ServerEvent, Storage};
use crate::time::{Duration, Instant};
use core::marker::PhantomData;

/// A backup-family worker's part of its record: the clipping factor of its gradient in the
/// open round, and when the server last sent it a model and which version (while no
/// round-trip sample was taken for it).
#[derive(Clone, Copy, Debug)]
pub struct BackupSlot {
    factor: f32,
    /// The version last sent + 1, or 0 when no sample is pending.
    pending: u64,
    sent_at: Instant,
}

impl Slot for BackupSlot {
    const INIT: Self = Self { factor: 1.0, pending: 0, sent_at: Instant::ZERO };

    fn factor(&self) -> f32 {
        self.factor
    }

    fn set_factor(&mut self, factor: f32) {
        self.factor = factor;
    }
}

/// The record flag of a worker that joined and was not lost since.
const KNOWN: u8 = flag::PROTOCOL;

/// The core of a backup-family server.
pub(crate) type BackupCore<T, S, M> = ServerCore<T, S, M, BackupSlot>;

/// What [`Engine::admit`] did with an accepted gradient.
#[derive(Clone, Copy, Debug)]
pub(crate) struct Admitted {
    /// Added to the current round (otherwise dropped as stale).
    pub(crate) contributed: bool,
    /// The sender's round trip for this gradient (from the server sending it the model to
    /// now), if the model it was computed on was the last one sent to it and no sample was
    /// taken for it yet.
    pub(crate) rtt: Option<Duration>,
    /// The squared L2 norm of the gradient as added to the round: its norm as received,
    /// from admission, times the square of the clipping factor (`sq_norm · f · f`); 0 when
    /// the gradient was dropped. One field rather than the norm and the factor
    /// (docs/perf-log.md, "Hot-path shapes").
    pub(crate) sq_norm: f64,
    /// The round now holds `k` gradients: the caller closes it.
    pub(crate) full: bool,
}

/// The part of a backup-worker server shared by the static and the dynamic variant, over
/// the shared [`ServerCore`]: the round, the number of gradients it waits for, the
/// stragglers' fate, and per-worker send times (for round trips).
#[derive(Debug)]
pub(crate) struct Engine<T, S> {
    learning_rate: f64,
    policy: GradientPolicy,
    pub(crate) interrupt: Interrupt,
    scratch: S,
    /// Gradients to wait for in the current iteration.
    pub(crate) k: usize,
    pub(crate) round: Round,
    /// When the current version was produced (or the first join, for the initial one).
    pub(crate) iteration_start: Option<Instant>,
    _t: PhantomData<T>,
}

impl<T: Scalar, S: Buffer<T>> Engine<T, S> {
    /// The backup-family state for a server whose core is `core`: `scratch` must hold
    /// `scratch_len(dim)` elements (at least the model's length: the first `dim` are the
    /// accumulator); the first iteration waits for `k` gradients.
    pub(crate) fn new<M: Storage>(
        core: &BackupCore<T, S, M>,
        learning_rate: f64,
        policy: GradientPolicy,
        interrupt: Interrupt,
        k: usize,
        mut scratch: S,
        scratch_len: impl FnOnce(usize) -> usize,
    ) -> Result<Self, ConfigError> {
        let dim = core.dim();
        let needed = scratch_len(dim).max(dim);
        zero_scratch(scratch.as_mut(), needed)?;
        Ok(Self {
            learning_rate,
            policy,
            interrupt,
            scratch,
            k,
            round: Round::new(),
            iteration_start: None,
            _t: PhantomData,
        })
    }

    /// The most queue items one input can add: a close (the contributors' events as one
    /// batch, the update, the broadcast or under option B the contributors' models as one
    /// batch), a stale gradient's drop and reply, and a join's answer.
    pub(crate) const BURST: usize = 8;

    /// The accumulator and the rest of the scratch buffer.
    pub(crate) fn scratch_mut<M: Storage>(&mut self, core: &BackupCore<T, S, M>) -> (&mut [T], &mut [T]) {
        let dim = core.dim();
        let s = self.scratch.as_mut();
        if s.len() >= dim { s.split_at_mut(dim) } else { (&mut [], &mut []) }
    }

    fn mark_sent<M: Storage>(core: &mut BackupCore<T, S, M>, now: Instant, to: WorkerId) {
        let version = core.version;
        if let Some(x) = core.roster.ext_mut(to) {
            x.sent_at = now;
            x.pending = mark_of(version);
        }
    }

    pub(crate) fn on_join<M: Storage>(&mut self, core: &mut BackupCore<T, S, M>, join: Join) -> Result<(), Reject> {
        let Join { now, from, epoch } = join;
        let fresh = core.join(from, epoch)?;
        Self::set_known(core, from, true);
        if self.iteration_start.is_none() {
            self.iteration_start = Some(now);
            core.stall.progress(now);
        }
        if !core.join_waits_for_round(from, fresh) {
            core.send_model(Recipient::Worker(from));
            Self::mark_sent(core, now, from);
        }
        Ok(())
    }

    fn set_known<M: Storage>(core: &mut BackupCore<T, S, M>, worker: WorkerId, on: bool) {
        if let Some(r) = core.roster.record_mut(worker) {
            r.set(KNOWN, on);
        }
    }

    /// Screens and takes a gradient: adds it to the round or drops it as stale (with an
    /// event, and under option B a reply with the current model). An `Err` changes nothing.
    pub(crate) fn admit<M: Storage>(
        &mut self,
        core: &mut BackupCore<T, S, M>,
        grad: Grad<'_, '_, T>,
    ) -> Result<Admitted, Reject> {
        let Grad { now, from, base, seq, values, .. } = grad;
        core.roster.check_seq(from, seq)?;
        let (factor, sq_norm) = self.policy.admit_measured(values, core.dim())?;
        if base > core.version {
            return Err(Reject::FutureVersion { claimed: base, current: core.version });
        }
        if base == core.version && Round::contains(&core.roster, from, base) {
            return Err(Reject::Duplicate { worker: from, seq });
        }
        let dim = core.dim();
        if self.scratch.as_ref().len() < dim {
            return Err(Reject::Capacity);
        }
        // Accepted from here on.
        core.roster.commit_seq(from, seq);
        Self::set_known(core, from, true);
        core.stats.accepted += 1;
        let rtt = match core.roster.ext_mut(from) {
            Some(x) if x.pending == mark_of(base) => {
                x.pending = 0;
                Some(now - x.sent_at)
            }
            _ => None,
        };
        // CANARY (planted bug, test builds only): a late gradient joins the current round.
        #[cfg(feature = "_canary")]
        let base = if crate::canary::is_on(crate::canary::Canary::LateGradientAdded) { core.version } else { base };
        if base < core.version {
            core.stats.count_drop(DropReason::Stale);
            core.event(ServerEvent::Dropped { worker: from, base, reason: DropReason::Stale });
            if self.interrupt == Interrupt::RunToCompletion {
                core.send_model(Recipient::Worker(from));
                Self::mark_sent(core, now, from);
            }
            return Ok(Admitted { contributed: false, rtt, sq_norm: 0.0, full: false });
        }
        let acc = self.scratch.as_mut().get_mut(..dim).ok_or(Reject::Capacity)?;
        self.round.add(&mut core.roster, base, from, values, factor, acc, &mut core.loss)?;
        core.stall.progress(now);
        let full = self.round.len() >= self.k;
        let f = factor.to_f64();
        Ok(Admitted { contributed: true, rtt, sq_norm: sq_norm * f * f, full })
    }

    /// Applies the update from the full round. Returns the contributors' mark (their
    /// records keep it until they contribute again) and the time the iteration took (from
    /// its start to `now`). Does not send the new model: see [`Self::publish`].
    pub(crate) fn close<M: Storage>(&mut self, core: &mut BackupCore<T, S, M>, now: Instant) -> (u64, Duration) {
        let contributors = mark_of(core.version);
        let dim = core.dim();
        let acc = self.scratch.as_mut().get_mut(..dim).unwrap_or(&mut []);
        self.round.close(core, acc, self.learning_rate);
        let elapsed = self.iteration_start.map_or(Duration::ZERO, |s| now - s);
        (contributors, elapsed)
    }

    /// Under option A, calls `f(worker, elapsed)` for every live worker still computing on the
    /// version that just closed (its round trip is right-censored at `elapsed`) and forgets
    /// it. Under option B those workers will still deliver, so nothing is censored.
    pub(crate) fn censor_stragglers<M: Storage>(
        &mut self,
        core: &mut BackupCore<T, S, M>,
        now: Instant,
        closed: Version,
        mut f: impl FnMut(WorkerId, Duration),
    ) {
        if self.interrupt != Interrupt::Abort {
            return;
        }
        for (i, r) in core.roster.records_mut().iter_mut().enumerate() {
            if r.has(KNOWN) && r.ext.pending == mark_of(closed) {
                r.ext.pending = 0;
                f(WorkerId(i as u32), now - r.ext.sent_at);
            }
        }
    }

    /// Sends the new model: to every worker (option A) or to the contributors, whose mark
    /// is `contributors` (option B, one batch).
    pub(crate) fn publish<M: Storage>(&mut self, core: &mut BackupCore<T, S, M>, now: Instant, contributors: u64) {
        self.iteration_start = Some(now);
        core.stall.progress(now);
        let pending = mark_of(core.version);
        let sent = |r: &crate::proto::WorkerRecord<BackupSlot>| match self.interrupt {
            Interrupt::Abort => r.has(KNOWN),
            Interrupt::RunToCompletion => r.mark == contributors,
        };
        for r in core.roster.records_mut().iter_mut().filter(|r| sent(r)) {
            r.ext.sent_at = now;
            r.ext.pending = pending;
        }
        match self.interrupt {
            Interrupt::Abort => core.send_model(Recipient::AllWorkers),
            Interrupt::RunToCompletion => core.queue.push_batch(BatchKind::Models { mark: contributors }),
        }
    }

    /// How many gradients the open round can hold at most: those it holds plus one from
    /// each live worker not yet in it.
    pub(crate) fn reachable<M: Storage>(&self, core: &BackupCore<T, S, M>) -> usize {
        let version = core.version;
        let open = core.roster.live().filter(|(id, _)| !Round::contains(&core.roster, *id, version)).count();
        self.round.len() + open
    }

    /// Forgets a lost worker: it is no longer expected to deliver a round trip.
    pub(crate) fn forget<M: Storage>(core: &mut BackupCore<T, S, M>, worker: WorkerId) {
        if let Some(r) = core.roster.record_mut(worker) {
            r.set(KNOWN, false);
            r.ext.pending = 0;
        }
    }

    /// Whether the open round lacks `worker`: a live worker not in it, or, when every live
    /// worker is in, any worker not in it (the workers its stall report names first).
    pub(crate) fn awaits<M: Storage>(core: &BackupCore<T, S, M>, worker: WorkerId) -> bool {
        let version = core.version;
        let missing = core.roster.record(worker).is_some() && !Round::contains(&core.roster, worker, version);
        missing && (core.roster.is_live(worker) || Round::first_missing(&core.roster, version).is_none())
    }

    pub(crate) fn timeout<M: Storage>(&mut self, core: &mut BackupCore<T, S, M>, now: Instant) {
        if !core.stall.due(now) {
            return;
        }
        let version = core.version;
        let waiting = Round::first_missing(&core.roster, version);
        if let Some(waiting_for) = waiting.or_else(|| Round::first_missing_any(&core.roster, version)) {
            let missing = self.k.saturating_sub(self.round.len()) as u32;
            let since = core.stall.since();
            core.event(ServerEvent::Stalled { waiting_for, missing, since });
        }
    }
}

/// The [`Rules`](crate::proto::Rules) of a backup-family protocol, written once for static `b`
/// and DBW: `$rules` (a type over `T`, `S` and possibly `M`, with `Slot = BackupSlot`) has an
/// `engine: Engine<T, S>` field, an `after_grad(core, now, from, admitted)` method (what a
/// gradient the engine admitted does beyond the round: its estimates, the close) and an
/// `after_loss(core, now)` method (what a loss does to the open round beyond forgetting the
/// worker); one input may queue `$extra` outputs beyond a close.
macro_rules! backup_family_rules {
    ($rules:ty, $extra:expr, $kind:expr, $complete:expr) => {
        impl<T: $crate::math::Scalar, S: $crate::proto::Buffer<T>, M: $crate::proto::Storage>
            $crate::proto::Rules<T, S, M> for $rules
        {
            fn burst(&self) -> usize {
                $crate::proto::backup::Engine::<T, S>::BURST + $extra
            }

            fn kind(&self) -> $crate::proto::ProtocolKind {
                $kind
            }

            // A straggler that runs to completion gets only the newest model after its late
            // gradient: it would miss the rounds in between.
            fn relays_means(&self) -> Result<(), &'static str> {
                match self.engine.interrupt {
                    $crate::proto::backup::Interrupt::Abort => Ok(()),
                    $crate::proto::backup::Interrupt::RunToCompletion => Err($complete),
                }
            }

            fn on_join(
                &mut self,
                core: &mut $crate::proto::backup::BackupCore<T, S, M>,
                join: $crate::proto::common::input::Join,
            ) -> Result<(), $crate::error::Reject> {
                self.engine.on_join(core, join)
            }

            fn on_grad(
                &mut self,
                core: &mut $crate::proto::backup::BackupCore<T, S, M>,
                grad: $crate::proto::common::input::Grad<'_, '_, T>,
            ) -> Result<(), $crate::error::Reject> {
                let admitted = self.engine.admit(core, grad)?;
                self.after_grad(core, grad.now, grad.from, admitted);
                Ok(())
            }

            fn on_lost(
                &mut self,
                core: &mut $crate::proto::backup::BackupCore<T, S, M>,
                now: $crate::time::Instant,
                worker: $crate::id::WorkerId,
                _was_live: bool,
            ) {
                $crate::proto::backup::Engine::<T, S>::forget(core, worker);
                self.after_loss(core, now);
            }

            fn on_timeout(
                &mut self,
                core: &mut $crate::proto::backup::BackupCore<T, S, M>,
                now: $crate::time::Instant,
            ) {
                self.engine.timeout(core, now);
            }

            fn awaits(&self, core: &$crate::proto::backup::BackupCore<T, S, M>, worker: $crate::id::WorkerId) -> bool {
                $crate::proto::backup::Engine::<T, S>::awaits(core, worker)
            }
        }
    };
}
pub(crate) use backup_family_rules;
