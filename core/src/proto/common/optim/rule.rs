//! The rule as a server keeps it: the settings, the caller's state buffer and the update
//! count, and the one `apply` every protocol's update goes through.

use super::{AdamW, Optimizer, Rule, Schedule, Update};
use crate::error::ConfigError;
use crate::math::{self, LengthMismatch, Scalar};
use crate::proto::Buffer;
use core::marker::PhantomData;

/// A server's update rule: `None` for plain SGD at a constant rate (each protocol's own
/// step, nothing else on the update path).
#[derive(Debug)]
pub(crate) struct UpdateRule<T, S>(Option<Active<T, S>>);

/// A rule other than plain SGD at a constant rate.
#[derive(Debug)]
struct Active<T, S> {
    /// The settings (plain-SGD forms normalised: a momentum of 0 is [`Rule::Sgd`]).
    optimizer: Optimizer,
    /// At least `optimizer.state_len(dim)` elements.
    state: S,
    /// Updates applied through the rule.
    steps: u64,
    _t: PhantomData<T>,
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

    /// `optimizer` (checked) over the caller's `state` with its update count at `steps`, for a
    /// model of `dim` elements. `init`: the state is set up fresh (momentum: a copy of
    /// `params`, no velocity; the others: zero); otherwise it is taken as it is (a
    /// checkpoint's) and refused unless finite (and, for AdamW, `v ≥ 0`).
    pub(crate) fn new(
        optimizer: Optimizer,
        mut state: S,
        steps: u64,
        params: &[T],
        init: bool,
    ) -> Result<Self, ConfigError> {
        optimizer.check()?;
        if optimizer.is_plain() {
            return Ok(Self(None));
        }
        let optimizer = match optimizer.rule {
            Rule::Momentum { beta } | Rule::Nesterov { beta } if beta == 0.0 => {
                Optimizer { rule: Rule::Sgd, ..optimizer }
            }
            _ => optimizer,
        };
        let (dim, needed, given) = (params.len(), optimizer.state_len(params.len()), state.as_ref().len());
        let Some(area) = state.as_mut().get_mut(..needed) else {
            return Err(ConfigError::ScratchTooSmall { needed, given });
        };
        if init {
            match optimizer.rule {
                Rule::Momentum { .. } => area.copy_from_slice(params),
                _ => math::fill_zero(area),
            }
        } else {
            let second_moment = if matches!(optimizer.rule, Rule::AdamW(_)) { area.get(dim..) } else { None };
            if !math::all_finite(area) || second_moment.is_some_and(|v| v.iter().any(|v| *v < T::zero())) {
                return Err(ConfigError::Knob("optimizer state"));
            }
        }
        Ok(Self(Some(Active { optimizer, state, steps, _t: PhantomData })))
    }

    /// The settings (plain SGD for a server without a rule).
    pub(crate) fn optimizer(&self) -> Optimizer {
        self.0.as_ref().map_or(Optimizer::SGD, |a| a.optimizer)
    }

    /// The rule's state for a model of `dim` elements, if it keeps any.
    pub(crate) fn state(&self, dim: usize) -> Option<&[T]> {
        let active = self.0.as_ref()?;
        let len = active.optimizer.state_len(dim);
        active.state.as_ref().get(..len).filter(|s| !s.is_empty())
    }

    /// Updates applied through the rule (0 without one).
    pub(crate) fn steps(&self) -> u64 {
        self.0.as_ref().map_or(0, |a| a.steps)
    }

    /// Heavy-ball momentum's state (the model before the last update), if that is the rule.
    pub(crate) fn momentum_buffer(&self, dim: usize) -> Option<&[T]> {
        let active = self.0.as_ref()?;
        matches!(active.optimizer.rule, Rule::Momentum { .. }).then(|| self.state(dim)).flatten()
    }

    /// Applies `update` to `params` by the rule: the protocol's plain step without a rule;
    /// otherwise the rule's step on the update's direction (see the module documentation).
    /// On `Err` (a length mismatch) nothing changed.
    #[inline(always)]
    pub(crate) fn apply<U: Update<T>>(&mut self, params: &mut [T], update: U) -> Result<(), LengthMismatch> {
        match self.0.as_mut() {
            None => update.plain(params),
            Some(active) => active.apply(params, update),
        }
    }
}

impl<T: Scalar, S: Buffer<T>> Active<T, S> {
    #[inline(never)]
    fn apply<U: Update<T>>(&mut self, params: &mut [T], update: U) -> Result<(), LengthMismatch> {
        let dim = params.len();
        update.check(dim)?;
        let needed = self.optimizer.state_len(dim);
        let given = self.state.as_ref().len();
        let state = self.state.as_mut().get_mut(..needed).ok_or(LengthMismatch { expected: needed, actual: given })?;
        let t = self.steps;
        let factor = self.optimizer.schedule.factor(t);
        let lr = update.lr() * factor;
        // The plain step's coefficient under the schedule, and the direction's scale:
        // `d = c·u` with `c = −a/η`.
        let scaled = update.coefficient() * T::from_f64(factor);
        let c = T::from_f64(-update.coefficient().to_f64() / update.lr());
        match self.optimizer.rule {
            Rule::Sgd => update.each(params, |x, u| *x = *x + scaled * u),
            Rule::Momentum { beta } => {
                extrapolate(params, state, T::from_f64(beta));
                if self.optimizer.schedule == Schedule::Constant {
                    update.plain(params)?;
                } else {
                    update.each(params, |x, u| *x = *x + scaled * u);
                }
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
        }
        self.steps = t.saturating_add(1);
        Ok(())
    }
}

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
