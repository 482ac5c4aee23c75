//! The backup-worker family's shared state (static `b` and DBW): a round that closes after
//! the first `k` gradients of the current version, what happens to the stragglers, and the
//! per-worker send times that round trips are measured from.

use super::Interrupt;
use crate::error::{ConfigError, Reject};
use crate::id::{MAX_WORKERS, Version, WorkerId, WorkerSet};
use crate::math::{self, Scalar};
use crate::msg::Values;
use crate::proto::common::round::Round;
use crate::proto::{Buffer, DropReason, GradientPolicy, Recipient, ServerCore, ServerEvent};
use crate::time::{Duration, Instant};
use core::marker::PhantomData;

/// What [`Engine::admit`] did with an accepted gradient.
#[derive(Clone, Copy, Debug)]
pub(crate) struct Admitted {
    /// Added to the current round (otherwise dropped as stale).
    pub(crate) contributed: bool,
    /// The sender's round trip for this gradient (from the server sending it the model to
    /// now), if the model it was computed on was the last one sent to it and no sample was
    /// taken for it yet.
    pub(crate) rtt: Option<Duration>,
    /// The clipping factor the gradient was multiplied by (1 if none).
    pub(crate) factor: f64,
    /// The squared L2 norm of the gradient as received (before clipping), from admission.
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
    /// Workers that joined and were not lost since.
    known: WorkerSet,
    /// When the server last sent each worker a model, and which version, while no round-trip
    /// sample has been taken for it.
    sent_at: [Instant; MAX_WORKERS],
    pending: [Option<Version>; MAX_WORKERS],
    _t: PhantomData<T>,
}

impl<T: Scalar, S: Buffer<T>> Engine<T, S> {
    /// The backup-family state for a server whose core is `core`: `scratch` must hold
    /// `scratch_len(dim)` elements (at least the model's length: the first `dim` are the
    /// accumulator); the first iteration waits for `k` gradients.
    pub(crate) fn new(
        core: &ServerCore<T, S>,
        learning_rate: f64,
        policy: GradientPolicy,
        interrupt: Interrupt,
        k: usize,
        mut scratch: S,
        scratch_len: impl FnOnce(usize) -> usize,
    ) -> Result<Self, ConfigError> {
        let dim = core.dim();
        let needed = scratch_len(dim).max(dim);
        let given = scratch.as_ref().len();
        let Some(s) = scratch.as_mut().get_mut(..needed) else {
            return Err(ConfigError::ScratchTooSmall { needed, given });
        };
        math::fill_zero(s);
        Ok(Self {
            learning_rate,
            policy,
            interrupt,
            scratch,
            k,
            round: Round::new(),
            iteration_start: None,
            known: WorkerSet::EMPTY,
            sent_at: [Instant::ZERO; MAX_WORKERS],
            pending: [None; MAX_WORKERS],
            _t: PhantomData,
        })
    }

    /// The most outputs one input can queue: a close (an event per contributor, the update,
    /// a model per contributor under option B) and a join's answer.
    pub(crate) fn burst(core: &ServerCore<T, S>) -> usize {
        2 * core.n() + 8
    }

    /// The accumulator and the rest of the scratch buffer.
    pub(crate) fn scratch_mut(&mut self, core: &ServerCore<T, S>) -> (&mut [T], &mut [T]) {
        let dim = core.dim();
        let s = self.scratch.as_mut();
        if s.len() >= dim { s.split_at_mut(dim) } else { (&mut [], &mut []) }
    }

    fn mark_sent(&mut self, core: &mut ServerCore<T, S>, now: Instant, to: WorkerId) {
        if let (Some(at), Some(p)) = (self.sent_at.get_mut(to.index()), self.pending.get_mut(to.index())) {
            *at = now;
            *p = Some(core.version);
        }
    }

    pub(crate) fn on_join(
        &mut self,
        core: &mut ServerCore<T, S>,
        now: Instant,
        from: WorkerId,
        epoch: u32,
    ) -> Result<(), Reject> {
        core.join(from, epoch)?;
        self.known.insert(from);
        if self.iteration_start.is_none() {
            self.iteration_start = Some(now);
            core.stall.progress(now);
        }
        core.send_model(Recipient::Worker(from));
        self.mark_sent(core, now, from);
        Ok(())
    }

    /// Screens and takes a gradient: adds it to the round or drops it as stale (with an
    /// event, and under option B a reply with the current model). An `Err` changes nothing.
    pub(crate) fn admit(
        &mut self,
        core: &mut ServerCore<T, S>,
        now: Instant,
        from: WorkerId,
        base: Version,
        seq: u64,
        values: &Values<'_, T>,
    ) -> Result<Admitted, Reject> {
        core.roster.check_seq(from, seq)?;
        let (factor, sq_norm) = self.policy.admit_measured(values, core.dim())?;
        if base > core.version {
            return Err(Reject::FutureVersion { claimed: base, current: core.version });
        }
        if base == core.version && self.round.got.contains(from) {
            return Err(Reject::Duplicate { worker: from, seq });
        }
        let dim = core.dim();
        if self.scratch.as_ref().len() < dim {
            return Err(Reject::Capacity);
        }
        // Accepted from here on.
        core.roster.commit_seq(from, seq);
        self.known.insert(from);
        core.stats.accepted += 1;
        let i = from.index();
        let rtt = match (self.pending.get_mut(i), self.sent_at.get(i)) {
            (Some(p), Some(at)) if *p == Some(base) => {
                *p = None;
                Some(now - *at)
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
                self.mark_sent(core, now, from);
            }
            return Ok(Admitted { contributed: false, rtt, factor: factor.to_f64(), sq_norm, full: false });
        }
        let acc = self.scratch.as_mut().get_mut(..dim).ok_or(Reject::Capacity)?;
        self.round.add(from, values, factor, acc)?;
        core.stall.progress(now);
        let full = self.round.got.len() >= self.k;
        Ok(Admitted { contributed: true, rtt, factor: factor.to_f64(), sq_norm, full })
    }

    /// Applies the update from the full round. Returns the contributors and the time the
    /// iteration took (from its start to `now`). Does not send the new model: see
    /// [`Self::publish`].
    pub(crate) fn close(&mut self, core: &mut ServerCore<T, S>, now: Instant) -> (WorkerSet, Duration) {
        let contributors = self.round.got;
        let dim = core.dim();
        let (params, scratch) = (core.params.as_mut(), self.scratch.as_mut());
        let acc = scratch.get_mut(..dim).unwrap_or(&mut []);
        core.version =
            self.round.close(params, acc, self.learning_rate, core.version, &mut core.queue, &mut core.stats);
        let elapsed = self.iteration_start.map_or(Duration::ZERO, |s| now - s);
        (contributors, elapsed)
    }

    /// Under option A, calls `f(worker, elapsed)` for every live worker still computing on the
    /// version that just closed (its round trip is right-censored at `elapsed`) and forgets
    /// it. Under option B those workers will still deliver, so nothing is censored.
    pub(crate) fn censor_stragglers(&mut self, now: Instant, closed: Version, mut f: impl FnMut(WorkerId, Duration)) {
        if self.interrupt != Interrupt::Abort {
            return;
        }
        for w in self.known.iter() {
            let i = w.index();
            if let (Some(p), Some(at)) = (self.pending.get_mut(i), self.sent_at.get(i)) {
                if *p == Some(closed) {
                    *p = None;
                    f(w, now - *at);
                }
            }
        }
    }

    /// Sends the new model: to every worker (option A) or to the contributors (option B).
    pub(crate) fn publish(&mut self, core: &mut ServerCore<T, S>, now: Instant, contributors: &WorkerSet) {
        self.iteration_start = Some(now);
        core.stall.progress(now);
        match self.interrupt {
            Interrupt::Abort => {
                core.send_model(Recipient::AllWorkers);
                let known = self.known;
                for w in known.iter() {
                    self.mark_sent(core, now, w);
                }
            }
            Interrupt::RunToCompletion => {
                for w in contributors.iter() {
                    core.send_model(Recipient::Worker(w));
                    self.mark_sent(core, now, w);
                }
            }
        }
    }

    /// Forgets a lost worker: it is no longer expected to deliver a round trip.
    pub(crate) fn forget(&mut self, worker: WorkerId) {
        self.known.remove(worker);
        if let Some(p) = self.pending.get_mut(worker.index()) {
            *p = None;
        }
    }

    pub(crate) fn timeout(&mut self, core: &mut ServerCore<T, S>, now: Instant) {
        if !core.stall.due(now) {
            return;
        }
        let got = &self.round.got;
        let n = core.roster.n();
        let live = core.roster.live();
        let waiting = (0..n as u32).map(WorkerId).find(|w| !got.contains(*w) && live.contains(*w));
        if let Some(waiting_for) = waiting.or_else(|| got.first_missing(n)) {
            let missing = self.k.saturating_sub(got.len()) as u32;
            let since = core.stall.since();
            core.event(ServerEvent::Stalled { waiting_for, missing, since });
        }
    }
}

/// The [`Rules`](crate::proto::Rules) of a backup-family protocol, written once for static `b`
/// and DBW: `$rules` has an `engine: Engine<T, S>` field and an
/// `on_grad(core, now, from, base, seq, &values)` method; one input may queue `$extra` outputs
/// beyond a close.
macro_rules! backup_family_rules {
    ($rules:ident, $extra:expr) => {
        impl<T: $crate::math::Scalar, S: $crate::proto::Buffer<T>> $crate::proto::Rules<T, S> for $rules<T, S> {
            fn burst(&self, core: &$crate::proto::ServerCore<T, S>) -> usize {
                $crate::proto::backup::Engine::<T, S>::burst(core) + $extra
            }

            fn on_message(
                &mut self,
                core: &mut $crate::proto::ServerCore<T, S>,
                now: $crate::time::Instant,
                from: $crate::id::WorkerId,
                msg: $crate::msg::ToServer<'_, T>,
            ) -> Result<(), $crate::error::Reject> {
                use $crate::msg::ToServer;
                match msg {
                    ToServer::Join { epoch } => self.engine.on_join(core, now, from, epoch),
                    ToServer::Grad { base, seq, values, .. } => self.on_grad(core, now, from, base, seq, &values),
                    other => Err($crate::error::Reject::Unexpected { kind: other.kind_name() }),
                }
            }

            fn on_lost(
                &mut self,
                _core: &mut $crate::proto::ServerCore<T, S>,
                _now: $crate::time::Instant,
                worker: $crate::id::WorkerId,
                _was_live: bool,
            ) {
                self.engine.forget(worker);
            }

            fn on_timeout(&mut self, core: &mut $crate::proto::ServerCore<T, S>, now: $crate::time::Instant) {
                self.engine.timeout(core, now);
            }
        }
    };
}
pub(crate) use backup_family_rules;
