//! The rule as a server keeps it: the settings, the caller's state buffer and the update
//! count, and the one `apply` every protocol's update goes through.

use super::{AdamW, Optimizer, Rule, Update, header};
use crate::error::ConfigError;
use crate::math::{self, LengthMismatch, Scalar};
use crate::proto::Buffer;

/// A server's update rule: `None` for plain SGD at a constant rate (each protocol's own
/// step, nothing else on the update path).
///
/// Kept small (a server's size is its footprint on a microcontroller): in the server only
/// the caller's buffer, momentum's coefficient and the rule's kind; every other setting and
/// the update count live in the buffer's header (`header`).
#[derive(Debug)]
pub(crate) struct UpdateRule<T, S>(Option<Active<T, S>>);

/// A rule other than plain SGD at a constant rate.
#[derive(Debug)]
struct Active<T, S> {
    /// At least `state_len(dim)` elements: the per-element state, then (unless `light`)
    /// the header.
    state: S,
    /// Heavy-ball momentum's coefficient (`light` only).
    beta: T,
    /// Heavy-ball momentum at a constant rate: the state is the model before the last
    /// update and nothing else; no update count.
    light: bool,
    /// Model-length tensors of per-element state before the header (0, 1 or 2).
    tensors: u8,
}

/// `x ← x + β(x − prev)`, `prev ← x` (before the extrapolation), element by element over
/// the shorter of the two.
pub(crate) fn extrapolate<T: Scalar>(params: &mut [T], prev: &mut [T], beta: T) {
    for (x, p) in params.iter_mut().zip(prev.iter_mut()) {
        let current = *x;
        *x = current + beta * (current - *p);
        *p = current;
    }
}

impl<T: Scalar, S: Buffer<T>> UpdateRule<T, S> {
    /// Plain SGD at a constant rate.
    pub(crate) const fn plain() -> Self {
        Self(None)
    }

    /// `optimizer` (checked) over the caller's `state`, for the model `params`. `init`: the
    /// state is set up fresh (momentum: a copy of `params`, no velocity; the others: zero;
    /// the header: the settings, update count 0); otherwise it is taken as it is (a
    /// checkpoint's) and refused unless finite (and, for AdamW, `v ≥ 0`) with a header
    /// holding these very settings.
    pub(crate) fn new(optimizer: Optimizer, mut state: S, params: &[T], init: bool) -> Result<Self, ConfigError> {
        optimizer.check()?;
        if optimizer.is_plain() {
            return Ok(Self(None));
        }
        let optimizer = optimizer.normalised();
        let (dim, needed, given) = (params.len(), optimizer.state_len(params.len()), state.as_ref().len());
        let Some(area) = state.as_mut().get_mut(..needed) else {
            return Err(ConfigError::ScratchTooSmall { needed, given });
        };
        let light = optimizer.is_light();
        let (elements, head) = area.split_at_mut(optimizer.element_state_len(dim).min(needed));
        if init {
            match optimizer.rule {
                Rule::Momentum { .. } => elements.copy_from_slice(params),
                _ => math::fill_zero(elements),
            }
            if !light {
                header::write(head, &optimizer, 0);
            }
        } else {
            let second_moment = if matches!(optimizer.rule, Rule::AdamW(_)) { elements.get(dim..) } else { None };
            let bad_elements =
                !math::all_finite(elements) || second_moment.is_some_and(|v| v.iter().any(|v| *v < T::zero()));
            let bad_header = !light && header::read(head).is_none_or(|(o, _)| o != optimizer);
            if bad_elements || bad_header {
                return Err(ConfigError::Knob("optimizer state"));
            }
        }
        let beta = match optimizer.rule {
            Rule::Momentum { beta } => T::from_f64(beta),
            _ => T::zero(),
        };
        let tensors = optimizer.element_state_len(dim).checked_div(dim).unwrap_or(0) as u8;
        Ok(Self(Some(Active { state, beta, light, tensors })))
    }

    /// The settings (plain SGD for a server without a rule).
    pub(crate) fn optimizer(&self, dim: usize) -> Optimizer {
        match self.0.as_ref() {
            None => Optimizer::SGD,
            Some(a) if a.light => Optimizer::momentum(a.beta.to_f64()),
            Some(a) => a.decoded(dim).map_or(Optimizer::SGD, |(o, _)| o),
        }
    }

    /// The rule's state for a model of `dim` elements, if it keeps any.
    pub(crate) fn state(&self, dim: usize) -> Option<&[T]> {
        let active = self.0.as_ref()?;
        let len = self.optimizer(dim).state_len(dim);
        active.state.as_ref().get(..len).filter(|s| !s.is_empty())
    }

    /// Updates applied through the rule (0 without one, and for momentum at a constant
    /// rate, which keeps no count).
    pub(crate) fn steps(&self, dim: usize) -> u64 {
        self.0.as_ref().and_then(|a| a.decoded(dim)).map_or(0, |(_, t)| t)
    }

    /// Heavy-ball momentum's model before the last update, if that is the rule.
    pub(crate) fn momentum_buffer(&self, dim: usize) -> Option<&[T]> {
        let active = self.0.as_ref()?;
        matches!(self.optimizer(dim).rule, Rule::Momentum { .. }).then(|| active.state.as_ref().get(..dim)).flatten()
    }

    /// Applies `update` to `params` by the rule: the protocol's plain step without a rule;
    /// otherwise the rule's step on the update's direction (see the module documentation).
    /// On `Err` (a length mismatch) nothing changed.
    #[inline(always)]
    pub(crate) fn apply<U: Update<T>>(&mut self, params: &mut [T], update: U) -> Result<(), LengthMismatch> {
        match self.0.as_mut() {
            None => update.plain(params),
            Some(active) => active.apply(params, update, None),
        }
    }

    /// [`Self::apply`] for an update that is one round's accumulated gradients over `k`
    /// contributions (its direction `acc/k`): [`Rule::Mean`] sets the model to `acc/k`,
    /// dividing by `k` exactly; every other rule steps as [`Self::apply`] does.
    #[inline(always)]
    pub(crate) fn apply_round<U: Update<T>>(
        &mut self,
        params: &mut [T],
        update: U,
        k: usize,
    ) -> Result<(), LengthMismatch> {
        match self.0.as_mut() {
            None => update.plain(params),
            Some(active) => active.apply(params, update, Some(k)),
        }
    }
}

impl<T: Scalar, S: Buffer<T>> Active<T, S> {
    /// The settings and update count in the header (not for `light`).
    fn decoded(&self, dim: usize) -> Option<(Optimizer, u64)> {
        if self.light {
            return None;
        }
        let at = usize::from(self.tensors).saturating_mul(dim);
        header::read(self.state.as_ref().get(at..at.checked_add(header::LEN)?)?)
    }

    /// Out of line and cold: a rule's settings and rate are read only here, never on the
    /// plain step's path of a protocol (docs/perf-log.md, "Hot-path shapes").
    #[cold]
    #[inline(never)]
    fn apply<U: Update<T>>(&mut self, params: &mut [T], update: U, k: Option<usize>) -> Result<(), LengthMismatch> {
        let dim = params.len();
        update.check(dim)?;
        if self.light {
            let prev = self.state.as_mut().get_mut(..dim).ok_or(LengthMismatch { expected: dim, actual: 0 })?;
            extrapolate(params, prev, self.beta);
            return update.plain(params);
        }
        self.apply_full(params, update, k)
    }

    /// Without the `optimizers` feature every rule is light (a configuration that needs more
    /// is refused when it is checked): the plain step.
    #[cfg(not(feature = "optimizers"))]
    fn apply_full<U: Update<T>>(
        &mut self,
        params: &mut [T],
        update: U,
        _k: Option<usize>,
    ) -> Result<(), LengthMismatch> {
        update.plain(params)
    }

    /// The rule's step with its settings and update count from the state's header; `k`: the
    /// round's contributions when the update is one round's accumulated gradients.
    #[cfg(feature = "optimizers")]
    fn apply_full<U: Update<T>>(
        &mut self,
        params: &mut [T],
        update: U,
        k: Option<usize>,
    ) -> Result<(), LengthMismatch> {
        let dim = params.len();
        let given = self.state.as_ref().len();
        let (optimizer, t) = self.decoded(dim).ok_or(LengthMismatch { expected: dim, actual: given })?;
        let at = optimizer.element_state_len(dim);
        let (state, head) = self.state.as_mut().split_at_mut(at.min(given));
        let factor = optimizer.schedule.factor(t);
        let lr = update.lr() * factor;
        // The plain step's coefficient under the schedule, and the direction's scale:
        // `d = c·u` with `c = −a/η`.
        let scaled = update.coefficient() * T::from_f64(factor);
        let c = T::from_f64(-update.coefficient().to_f64() / update.lr());
        match optimizer.rule {
            Rule::Sgd => update.each(params, |x, u| *x = *x + scaled * u),
            Rule::Momentum { beta } => {
                extrapolate(params, state, T::from_f64(beta));
                update.each(params, |x, u| *x = *x + scaled * u);
            }
            Rule::Nesterov { beta } => {
                let (beta, a) = (T::from_f64(beta), T::from_f64(-lr));
                let mut velocity = state.iter_mut();
                update.each(params, |x, u| {
                    if let Some(b) = velocity.next() {
                        let d = c * u;
                        *b = *b * beta + d;
                        *x = *x + a * (d + beta * *b);
                    }
                });
            }
            Rule::AdamW(settings) => adamw(params, state, update, settings, lr, t, c),
            // The round's mean, divided exactly by its count; an update that is not a round's
            // (refused with the rule when the server was set up) publishes its direction.
            Rule::Mean => match k {
                Some(k) => {
                    let k = T::from_f64(k.max(1) as f64);
                    update.each(params, |x, u| *x = u / k);
                }
                None => update.each(params, |x, u| *x = c * u),
            },
        }
        header::write_steps(head, t.saturating_add(1));
        Ok(())
    }
}

#[cfg(feature = "optimizers")]
/// AdamW's step `t` (from 0) at rate `lr` on the direction `c·u`, with PyTorch's operations
/// in its order: `x·(1 − lr·λ)`; `m.lerp(d, 1 − β₁)`; `v·β₂ + (1 − β₂)·d·d`;
/// `x + (−lr/bc₁)·m / (√v/√bc₂ + ε)`.
fn adamw<T: Scalar, U: Update<T>>(params: &mut [T], state: &mut [T], update: U, s: AdamW, lr: f64, t: u64, c: T) {
    let (m, v) = state.split_at_mut(params.len().min(state.len()));
    let steps = t.saturating_add(1) as f64;
    let bc1 = 1.0 - libm::pow(s.beta1, steps);
    let bc2 = 1.0 - libm::pow(s.beta2, steps);
    let decay = T::from_f64(1.0 - lr * s.weight_decay);
    let neg_step = T::from_f64(-lr / bc1);
    let bc2_sqrt = T::from_f64(libm::sqrt(bc2));
    let (w1, b2, w2, eps) =
        (T::from_f64(1.0 - s.beta1), T::from_f64(s.beta2), T::from_f64(1.0 - s.beta2), T::from_f64(s.eps));
    let low = 1.0 - s.beta1 < 0.5;
    let one_minus_w1 = T::one() - w1;
    let mut moments = m.iter_mut().zip(v.iter_mut());
    update.each(params, |x, u| {
        if let Some((m, v)) = moments.next() {
            let d = c * u;
            let decayed = *x * decay;
            // `torch.lerp(m, d, w)`, as its kernel computes it on either side of 0.5.
            *m = if low { *m + w1 * (d - *m) } else { d - (d - *m) * one_minus_w1 };
            *v = *v * b2 + w2 * d * d;
            let denom = v.sqrt() / bc2_sqrt + eps;
            *x = decayed + neg_step * *m / denom;
        }
    });
}
