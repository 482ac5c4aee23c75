//! DBW's server: the backup-family engine with `k` chosen before every broadcast from
//! online estimates, over the shared [`ServerCore`].

use super::{DbwConfig, LEta};
use crate::error::ConfigError;
use crate::id::{Version, WorkerId};
use crate::math::dbw_policy::{
    CurvatureSplit, LossTrend, RTT_TRACKED_WORKERS, WorkerRtts, choose_k_bounded, choose_k_loss_rate,
};
use crate::math::estimate::{Ema, MAX_EXACT_ORDER, MAX_RTT_SAMPLES, RttWindow, choose_k, noise_estimate};
use crate::math::{self, Scalar};
use crate::proto::backup::{Admitted, BackupCore, Engine};
use crate::proto::common::table::flag;
use crate::proto::{Buffer, DEFAULT_INLINE_WORKERS, Inline, ProtocolServer, ServerCore, ServerEvent, Storage};
use crate::time::Instant;

/// The DBW server. `S` is the caller's storage for the model and the scratch buffer
/// ([`DbwConfig::scratch_len`] elements), `M` for the per-worker table.
pub type DbwServer<T, S, M = Inline<DEFAULT_INLINE_WORKERS>> = ProtocolServer<T, S, DbwRules<T, S, M>, M>;

/// DBW's own state over the shared server core: the backup-family engine and the online
/// estimators that choose `k` before every broadcast.
#[derive(Debug)]
pub struct DbwRules<T, S, M: Storage> {
    config: DbwConfig,
    engine: Engine<T, S>,
    /// Pooled round trips (in the caller's storage `M`).
    window: RttWindow<M>,
    /// Per-worker round trips (used while `n ≤ RTT_TRACKED_WORKERS`; in `M`).
    rtts: WorkerRtts<M>,
    /// Signal and noise curvature ([`LEta::Split`]).
    split: CurvatureSplit,
    /// The reported losses of the closed iterations, against time.
    losses: LossTrend,

    /// `Ĝ` of the previous iteration ([`LEta::Split`]).
    previous_signal: f64,
    g: Ema,
    s: Ema,
    /// Numerator and denominator of the estimated `Lη`, averaged separately (a ratio of
    /// averages is far less noisy than an average of ratios).
    l_eta_num: Ema,
    l_eta_den: Ema,
    /// `Σ‖g_i‖²` (after clipping) of the current round.
    sum_sq: f64,
    /// `‖ḡ‖²` and `k` of the previous iteration (secant mode).
    previous: Option<(f64, u32)>,
    closed: u64,
    /// `τ̂(k)` for `k = 1..=tau_live`, from the window as it was at the last refresh (`n`
    /// entries, in the caller's storage).
    tau: M::Table<f64>,
    /// The live count `tau` was computed for; 0 when there is no estimate.
    tau_live: usize,
}

/// `τ̂` is re-estimated when at least `1/TAU_REFRESH` of the window's samples are new since
/// the last estimate (or the live count changed): every iteration while the window fills,
/// then every `W/TAU_REFRESH` iterations or so, which keeps the cost of the sort and the
/// Kaplan–Meier integral off most iterations while the estimate lags the window by at most
/// a sixteenth of its length.
const TAU_REFRESH: usize = 16;

impl<T, S, M: Storage> crate::proto::HasSlot for DbwRules<T, S, M> {
    type Slot = crate::proto::backup::BackupSlot;
}

impl<T: Scalar, S: Buffer<T>, M: Storage> DbwServer<T, S, M> {
    /// A server starting from the model in `params` at version 0; `scratch` holds at least
    /// [`DbwConfig::scratch_len`] elements.
    pub fn new(config: DbwConfig, params: S, scratch: S) -> Result<Self, ConfigError> {
        Self::resume(config, params, scratch, Version::ZERO)
    }

    /// A server resuming from a checkpoint: `params` is the model at `version`. The
    /// estimators start empty (a new warm-up).
    pub fn resume(config: DbwConfig, params: S, scratch: S, version: Version) -> Result<Self, ConfigError> {
        config.check()?;
        let core = ServerCore::new(config.workers, config.learning_rate, config.stall_report, params, version)?;
        let engine = Engine::new(
            &core,
            config.learning_rate,
            config.gradient_policy,
            config.interrupt,
            config.warmup_k.map_or(config.workers, |k| k.clamp(config.k_min.max(1), config.workers.max(1))) as usize,
            scratch,
            |dim| config.scratch_len(dim),
        )?;
        let samples = (config.window as usize).saturating_mul(config.workers as usize).min(MAX_RTT_SAMPLES);
        let rules = DbwRules {
            config,
            engine,
            window: RttWindow::new(samples, (config.workers as usize).min(MAX_EXACT_ORDER))?,
            rtts: WorkerRtts::new(config.workers as usize)?,
            split: CurvatureSplit::new(config.ema_beta),
            losses: LossTrend::new(),
            previous_signal: 0.0,
            g: Ema::new(config.ema_beta),
            s: Ema::new(config.ema_beta),
            l_eta_num: Ema::new(config.ema_beta),
            l_eta_den: Ema::new(config.ema_beta),
            sum_sq: 0.0,
            previous: None,
            closed: 0,
            tau: M::table(config.workers as usize, 0.0)?,
            tau_live: 0,
        };
        Ok(Self::from_parts(core, rules))
    }

    /// The settings.
    pub fn config(&self) -> &DbwConfig {
        &self.rules().config
    }

    /// How many gradients the current iteration waits for.
    pub fn current_k(&self) -> u32 {
        self.rules().engine.k as u32
    }

    /// The `Lη` the next choice will use.
    pub fn l_eta_estimate(&self) -> f64 {
        self.rules().l_eta_estimate()
    }
}

impl<T: Scalar, S: Buffer<T>, M: Storage> DbwRules<T, S, M> {
    /// The `Lη` the next choice will use.
    fn l_eta_estimate(&self) -> f64 {
        match (self.config.l_eta, self.config.l_eta.estimated()) {
            (_, Some((initial, min, max))) => match (self.l_eta_num.get(), self.l_eta_den.get()) {
                (Some(num), Some(den)) if den > 0.0 => {
                    let ratio = (num / den).max(0.0);
                    let l_eta = if let LEta::Secant { .. } = self.config.l_eta { libm::sqrt(ratio) } else { ratio };
                    l_eta.clamp(min, max)
                }
                _ => initial,
            },
            (LEta::Fixed(x), None) => x,
            _ => 1.0,
        }
    }

    /// The choice with the workers' reported losses ([`crate::math::dbw_policy`], "The loss
    /// above the noise floor"): the smaller of `gradient_k` and the loss-rate `k` for the
    /// fitted loss level and the noise floor `η·Ŝ/(4k)`; `gradient_k` alone without reports,
    /// while the level is not measured (its standard error above the level itself), when no `k`
    /// has the loss above its floor, or with [`DbwConfig::use_reported_losses`] off.
    fn loss_choice(&self, gradient_k: u32, s: f64, tau: &[f64], k_range: (u32, u32)) -> u32 {
        let Some(fit) = self.losses.fit(self.config.ema_beta).filter(|_| self.config.use_reported_losses) else {
            return gradient_k;
        };
        if fit.level_error > fit.level {
            return gradient_k;
        }
        let floor = self.config.learning_rate * s / 4.0;
        choose_k_loss_rate(fit.level, floor, tau, k_range).map_or(gradient_k, |k| k.min(gradient_k))
    }

    /// An admitted gradient feeds the estimators (its round trip, its squared norm from
    /// admission, no second pass); a full round closes.
    fn after_grad(&mut self, core: &mut BackupCore<T, S, M>, now: Instant, from: WorkerId, admitted: Admitted) {
        if let Some(rtt) = admitted.rtt {
            self.window.push(rtt, false);
            self.rtts.push(from.index(), rtt, false);
        }
        if admitted.contributed {
            self.sum_sq += admitted.sq_norm;
        }
        if admitted.full {
            self.close(core, now);
        }
    }

    /// A loss that leaves the open iteration waiting for more gradients than it holds plus
    /// one from each live worker not yet in it lowers that iteration's `k` to this count,
    /// and closes it if it already holds them: an iteration never waits for a lost worker.
    /// With no live worker left and nothing received, it waits for a rejoin.
    fn after_loss(&mut self, core: &mut BackupCore<T, S, M>, now: Instant) {
        let reachable = self.engine.reachable(core);
        if reachable == 0 || reachable >= self.engine.k {
            return;
        }
        self.engine.k = reachable;
        if self.engine.round.len() >= reachable {
            self.close(core, now);
        }
    }

    /// Updates the estimators from the full round, applies the update, chooses the next
    /// `k`, reports it and publishes the model.
    fn close(&mut self, core: &mut BackupCore<T, S, M>, now: Instant) {
        let k = self.engine.round.len().max(1) as u32;
        let kf = f64::from(k);
        let estimated = self.config.l_eta.estimated();
        let has_previous = self.previous.is_some();
        let dim = core.dim();
        let (acc, extra) = self.engine.scratch_mut(core);
        let mean_sq = math::squared_norm(acc).to_f64() / (kf * kf);
        // Estimated Lη: ⟨ḡ_t, ḡ_{t−1}⟩ (and ‖ḡ_t − ḡ_{t−1}‖², which only the secant mode
        // reads) and ḡ_{t−1} ← ḡ_t, in one pass.
        let (mut diff_sq, mut dot) = (0.0, 0.0);
        if estimated.is_some() {
            let inv_k = T::from_f64(1.0 / kf);
            if let Some(prev) = extra.get_mut(..dim) {
                if let LEta::Secant { .. } = self.config.l_eta {
                    (diff_sq, dot) = secant_pass(prev, acc, inv_k);
                } else {
                    dot = rayleigh_pass(prev, acc, inv_k);
                }
            }
        }
        if let Some(e) = noise_estimate(k, self.sum_sq, mean_sq) {
            self.s.update(e.s);
            // Averaged before clipping at zero ([LEta::Split] plans with it): the clipped
            // per-iteration Ĝ is biased upwards where noise dominates.
            self.g.update(if let LEta::Split { .. } = self.config.l_eta { mean_sq - e.s / kf } else { e.g });
        } else if let Some(s) = self.s.get() {
            self.g.update((mean_sq - s / kf).max(0.0));
        }
        // Ĝ and Ŝ as the choice below reads them (each `get` is a division; nothing updates
        // them again in this close).
        let (g_now, s_now) = (self.g.get(), self.s.get());
        if let (true, Some((prev_mean_sq, prev_k)), Some(_)) = (has_previous, self.previous, estimated) {
            // Subtract the noise each side contributes in expectation.
            let s = s_now.unwrap_or(0.0);
            let prev_noise = s / f64::from(prev_k.max(1));
            let num = if let LEta::Rayleigh { .. } | LEta::Split { .. } = self.config.l_eta {
                prev_mean_sq - prev_noise - dot
            } else {
                diff_sq - s / kf - prev_noise
            };
            self.split.update(self.previous_signal, prev_noise, num);
            if self.l_eta_den.get().is_none() {
                // The first secant pair is one noisy sample: start both averages from a prior
                // sample at `initial`, so early choices stay close to the configured guess.
                if let Some((initial, _, _)) = estimated {
                    let prior = if let LEta::Secant { .. } = self.config.l_eta { initial * initial } else { initial };
                    self.l_eta_num.update(prior * prev_mean_sq);
                    self.l_eta_den.update(prev_mean_sq);
                }
            }
            self.l_eta_num.update(num);
            self.l_eta_den.update(prev_mean_sq);
        }
        self.previous = Some((mean_sq, k));
        self.previous_signal = g_now.unwrap_or(0.0);
        self.sum_sq = 0.0;
        // The mean of the losses the round's contributions reported (finite: the core refuses
        // others), read before the update takes it.
        if let Some(loss) = core.loss.mean() {
            self.losses.update(self.config.ema_beta, f64::from(loss));
        }

        let (contributors, elapsed) = self.engine.close(core, now);
        let closed_version = Version(core.version.0.saturating_sub(1));
        let (window, rtts) = (&mut self.window, &mut self.rtts);
        self.engine.censor_stragglers(core, now, closed_version, |worker, rtt| {
            window.push(rtt, true);
            rtts.push(worker.index(), rtt, true);
        });
        self.closed += 1;

        let n = core.roster.n();
        let live = core.roster.live_count().clamp(1, n);
        let k_max = live as u32;
        let k_lo = self.config.k_min.min(k_max).max(1);
        // Per-worker windows (non-identical workers) while they fit, else the pooled one
        // (exact order statistics up to MAX_EXACT_ORDER live workers, quantiles above).
        let records = core.roster.records();
        let is_live = |i: usize| records.get(i).is_some_and(|r| r.has(flag::LIVE));
        let tau = self.tau.as_mut();
        let per_worker = n <= RTT_TRACKED_WORKERS && self.rtts.expected_order_statistics(n, is_live, tau);
        if per_worker {
            self.tau_live = live;
        } else if self.tau_live != live || self.window.fresh().saturating_mul(TAU_REFRESH) >= self.window.len() {
            let ok = if live <= MAX_EXACT_ORDER {
                self.window.expected_order_statistics(live, tau)
            } else {
                self.window.quantile_order_statistics(live, tau)
            };
            self.tau_live = if ok { live } else { 0 };
        }
        let have_tau = self.tau_live == live;
        let l_eta = self.l_eta_estimate();
        let (g, s) = (g_now.map(|g| g.max(0.0)), s_now);
        // Nothing to choose from (a single-curvature mode with no k predicting a decrease, or
        // no finite τ): hold the current k (clamped), never jump to n
        // (crate::math::dbw_policy, "Never collapse to k = n").
        let hold = (self.engine.k as u32).clamp(k_lo, k_max);
        let warmup = self.config.warmup_k.map_or(k_max, |w| w.clamp(k_lo, k_max));
        let tau = self.tau.as_ref().get(..live).unwrap_or(&[]);
        let next_k = match (self.closed >= u64::from(self.config.warmup_iterations), have_tau, g, s) {
            (true, true, Some(g), Some(s)) => match self.config.l_eta {
                // Before the first secant pair both curvatures are the configured initial Lη.
                LEta::Split { min, max, .. } => {
                    let (a, b) = self.split.get(min, max).unwrap_or((l_eta, l_eta));
                    choose_k_bounded(g, s, (a, b), tau, (k_lo, k_max), hold, self.config.flat_tolerance).unwrap_or(hold)
                }
                _ => choose_k(g, s, l_eta, tau, k_lo, k_max).map_or(hold, |c| c.0),
            },
            _ => warmup,
        };
        let next_k = match (self.closed >= u64::from(self.config.warmup_iterations), have_tau, s) {
            (true, true, Some(s)) => self.loss_choice(next_k, s, tau, (k_lo, k_max)),
            _ => next_k,
        };
        self.engine.k = next_k as usize;
        let tau_estimate =
            if have_tau { self.tau.as_ref().get(next_k as usize - 1).copied().unwrap_or(0.0) } else { 0.0 };
        core.event(ServerEvent::BackupChosen {
            version: core.version,
            k: next_k,
            g_estimate: g.unwrap_or(0.0) as f32,
            s_estimate: s.unwrap_or(0.0) as f32,
            l_eta_estimate: l_eta as f32,
            tau_estimate: tau_estimate as f32,
            observed_iteration_time: elapsed.as_secs_f64() as f32,
        });
        self.engine.publish(core, now, contributors);
    }
}

/// Elements per block of the secant passes: the products of a block are formed together
/// (independent, so they vectorise), then added to the running sums one by one, in element
/// order.
const PASS_BLOCK: usize = 8;

/// `ḡ_{t−1} ← ḡ_t = acc·inv_k` over `prev` (`T` arithmetic, as stored) and returns
/// `Σ_i ḡ_t[i]·ḡ_{t−1}[i]` in `f64`, summed from `0.0` in element order (over the common
/// length of `prev` and `acc`).
///
/// The sum is the plain loop's bit for bit: each product is the same `f64` product, and
/// the products are added to one accumulator in the same order; only the products of a
/// block are formed before the additions (test: `secant_passes_are_the_plain_loops`).
pub(super) fn rayleigh_pass<T: Scalar>(prev: &mut [T], acc: &[T], inv_k: T) -> f64 {
    mean_pass::<T, false>(prev, acc, inv_k).1
}

/// [`rayleigh_pass`] that also returns `‖ḡ_t − ḡ_{t−1}‖²` (first), summed in element order
/// in `f64`: `(Σ (m − q)², Σ m·q)`.
pub(super) fn secant_pass<T: Scalar>(prev: &mut [T], acc: &[T], inv_k: T) -> (f64, f64) {
    mean_pass::<T, true>(prev, acc, inv_k)
}

/// The one blocked pass behind [`rayleigh_pass`] and [`secant_pass`]: `(Σ (m − q)², Σ m·q)`,
/// the first only when `DIFF` (otherwise `0.0`, and not computed).
#[inline(always)]
fn mean_pass<T: Scalar, const DIFF: bool>(prev: &mut [T], acc: &[T], inv_k: T) -> (f64, f64) {
    let len = prev.len().min(acc.len());
    let (Some(prev), Some(acc)) = (prev.get_mut(..len), acc.get(..len)) else { return (0.0, 0.0) };
    let (mut diff_sq, mut dot) = (0.0, 0.0);
    let (mut squares, mut products) = ([0.0f64; PASS_BLOCK], [0.0f64; PASS_BLOCK]);
    let (mut ps, mut accs) = (prev.chunks_exact_mut(PASS_BLOCK), acc.chunks_exact(PASS_BLOCK));
    for (p, a) in (&mut ps).zip(&mut accs) {
        // As fixed-size arrays the block loops have constant trip counts and vectorise.
        let (Ok(p), Ok(a)) = (<&mut [T; PASS_BLOCK]>::try_from(p), <&[T; PASS_BLOCK]>::try_from(a)) else { continue };
        let means = a.map(|a| a * inv_k);
        for (((d, x), p), m) in squares.iter_mut().zip(products.iter_mut()).zip(p.iter()).zip(&means) {
            let (m, q) = (Scalar::to_f64(*m), Scalar::to_f64(*p));
            if DIFF {
                *d = (m - q) * (m - q);
            }
            *x = m * q;
        }
        *p = means;
        for (d, x) in squares.into_iter().zip(products) {
            if DIFF {
                diff_sq += d;
            }
            dot += x;
        }
    }
    for (p, a) in ps.into_remainder().iter_mut().zip(accs.remainder()) {
        let mean = *a * inv_k;
        let (m, q) = (mean.to_f64(), p.to_f64());
        if DIFF {
            diff_sq += (m - q) * (m - q);
        }
        dot += m * q;
        *p = mean;
    }
    (diff_sq, dot)
}

// A close, plus the `BackupChosen` report.
crate::proto::backup::backup_family_rules!(
    DbwRules<T, S, M>,
    1,
    crate::proto::ProtocolKind::Dbw,
    "dbw with interrupt complete"
);

impl<T, S, M: Storage> crate::proto::common::round_server::HasRound for DbwRules<T, S, M> {
    fn round_len(&self) -> usize {
        self.engine.round.len()
    }
}
