//! The server's update rule, for every protocol at once: plain SGD, heavy-ball momentum,
//! Nesterov momentum or AdamW, at a learning rate scheduled by update count.
//!
//! # Split of work
//!
//! Each protocol computes its update as today: a vector `u` and a coefficient `a` such that
//! its plain SGD step is `x ← x + a·u` at its learning rate `η` (a round's accumulated
//! gradients with `a = −η/k`, one stale gradient with `a = −η·w`, an SSP clock update or a
//! WBSP round's summed deltas with `a = 1`, a group's aggregate with `a = −η·w`). The rule
//! reads that update as the **direction** `d = −(a/η)·u`, in gradient units (the plain step
//! is `x ← x − η·d`), and turns it into the model change; it is called once per update of
//! the server's model, through `UpdateRule::apply`, with the update as an `Update`
//! value that also carries whatever the protocol fuses into the same pass (clearing its
//! accumulator, copying the new model out).
//!
//! # Rules
//!
//! With `η_t = η · s(t)`, `s` the schedule's factor for the server's `t`-th update through
//! the rule (`t` from 0):
//!
//! - [`Rule::Sgd`]: `x ← x − η_t·d`.
//! - [`Rule::Momentum`] (heavy ball, `β` in `[0, 1)`): PyTorch's `v ← βv + d`,
//!   `x ← x − ηv` at a constant rate, written over the iterates as
//!   `x ← x + β(x − x_prev) − η_t·d`: the state is `x_prev`, the model before the last
//!   update (no velocity at the start: a copy of the initial model). Under a schedule this
//!   is the form with the rate inside the velocity (`v ← βv + η_t·d`, `x ← x − v`): each
//!   direction keeps the rate of the update that brought it.
//! - [`Rule::Nesterov`] (`β` in `[0, 1)`): PyTorch's `SGD(momentum=β, nesterov=True)`:
//!   `b ← βb + d`, `x ← x − η_t·(d + βb)`; the state is `b` (zero at the start).
//! - [`Rule::AdamW`]: PyTorch's `AdamW` (no amsgrad): `x ← x·(1 − η_t·λ)`,
//!   `m ← m + (1 − β₁)(d − m)`, `v ← β₂v + (1 − β₂)d²`,
//!   `x ← x − (η_t/(1 − β₁^{t+1}))·m / (√v/√(1 − β₂^{t+1}) + ε)`; the state is `m` then `v`
//!   (zero at the start).
//!
//! The state lives in a caller-owned buffer of [`Optimizer::state_len`] elements: the
//! per-element state, then (except for momentum at a constant rate, whose buffer is the
//! previous model alone) a header with the settings and the update count. The buffer is the
//! rule's checkpoint ([`ProtocolServer::optimizer_state`]; the count is
//! [`ProtocolServer::optimizer_steps`]), restored with
//! [`ProtocolServer::with_optimizer_state`].
//!
//! A server with plain SGD at a constant rate (or momentum 0) keeps no rule at all: its
//! updates are each protocol's own fused step, bit for bit; heavy-ball momentum at a
//! constant rate is its extrapolation followed by that same step.
//!
//! [`ProtocolServer::optimizer_state`]: crate::proto::ProtocolServer::optimizer_state
//! [`ProtocolServer::optimizer_steps`]: crate::proto::ProtocolServer::optimizer_steps
//! [`ProtocolServer::with_optimizer_state`]: crate::proto::ProtocolServer::with_optimizer_state

// Without the `optimizers` feature only SGD and light momentum run: the rest is unused.
#[cfg_attr(not(feature = "optimizers"), allow(dead_code, unused_imports))]
mod header;
// Without the `optimizers` feature only SGD and light momentum run: the rest is unused.
#[cfg_attr(not(feature = "optimizers"), allow(dead_code, unused_imports))]
mod rule;
mod schedule;
#[cfg(all(test, feature = "optimizers"))]
mod tests;
#[cfg(all(test, feature = "optimizers"))]
mod tests_mean;
#[cfg(test)]
mod tests_momentum;
#[cfg(all(test, feature = "optimizers"))]
mod tests_protocols;
// Without the `optimizers` feature only SGD and light momentum run: the rest is unused.
#[cfg_attr(not(feature = "optimizers"), allow(dead_code, unused_imports))]
mod update;

pub(crate) use rule::UpdateRule;
pub use schedule::Schedule;
pub(crate) use update::{Cleared, FoldedLast, Scaled, UnitOrScaled, Update};

use crate::error::ConfigError;

/// Elements of the header at the end of a rule's state buffer (ten slots of four elements:
/// see the `header` module).
pub(crate) const HEADER_LEN: usize = 40;

/// The rule's settings for [`Rule::AdamW`] (PyTorch's `AdamW` names and defaults: betas
/// `(0.9, 0.999)`, `eps = 1e-8`, `weight_decay = 0.01`).
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct AdamW {
    /// Decay of the first moment, in `[0, 1)`.
    pub beta1: f64,
    /// Decay of the second moment, in `[0, 1)`.
    pub beta2: f64,
    /// Added to the denominator, finite and above 0.
    pub eps: f64,
    /// Decoupled weight decay `λ` (`x ← x·(1 − η_t·λ)` before each step), finite and at
    /// least 0.
    pub weight_decay: f64,
}

impl Default for AdamW {
    fn default() -> Self {
        Self { beta1: 0.9, beta2: 0.999, eps: 1e-8, weight_decay: 0.01 }
    }
}

/// How the server turns an update's direction into the change of its model (see the
/// [module documentation](self)).
#[derive(Clone, Copy, Debug, Default, PartialEq)]
pub enum Rule {
    /// Plain SGD.
    #[default]
    Sgd,
    /// Heavy-ball momentum with coefficient `beta` in `[0, 1)` (0: plain SGD).
    Momentum {
        /// The momentum coefficient.
        beta: f64,
    },
    /// Nesterov momentum with coefficient `beta` in `[0, 1)` (0: plain SGD).
    Nesterov {
        /// The momentum coefficient.
        beta: f64,
    },
    /// AdamW with decoupled weight decay.
    AdamW(AdamW),
    /// The relay for worker-side optimizers: after each update the model **is** the
    /// update's mean gradient `d` (`x ← d`, with `d = acc/k` divided exactly by the round's
    /// `k` contributions), the learning rate and schedule unused. Only for the protocols
    /// whose every update is one round's mean gradient and whose every live worker receives
    /// every round's model (BSP; static backup workers and DBW with `Interrupt::Abort`);
    /// every other protocol, and those two when stragglers run to completion (a straggler
    /// then gets only the newest model), refuses it ([`ConfigError::RuleUnsupported`]). The
    /// model at version 0 stays the initial model; each worker applies every round's mean
    /// with its own optimizer.
    Mean,
}

/// The server's update rule and its learning-rate schedule.
#[derive(Clone, Copy, Debug, Default, PartialEq)]
pub struct Optimizer {
    /// What each update does to the model.
    pub rule: Rule,
    /// The factor of the protocol's learning rate for each update.
    pub schedule: Schedule,
}

/// Checks a momentum coefficient: finite and in `[0, 1)`; `name` is the knob refused.
pub(crate) fn check_beta_named(beta: f64, name: &'static str) -> Result<(), ConfigError> {
    if beta.is_finite() && (0.0..1.0).contains(&beta) { Ok(()) } else { Err(ConfigError::Knob(name)) }
}

impl Optimizer {
    /// Plain SGD at the protocol's constant learning rate.
    pub const SGD: Self = Self { rule: Rule::Sgd, schedule: Schedule::Constant };

    /// Heavy-ball momentum `beta` at a constant rate.
    pub const fn momentum(beta: f64) -> Self {
        Self { rule: Rule::Momentum { beta }, schedule: Schedule::Constant }
    }

    /// Nesterov momentum `beta` at a constant rate.
    pub const fn nesterov(beta: f64) -> Self {
        Self { rule: Rule::Nesterov { beta }, schedule: Schedule::Constant }
    }

    /// AdamW with `settings` at a constant rate.
    pub const fn adamw(settings: AdamW) -> Self {
        Self { rule: Rule::AdamW(settings), schedule: Schedule::Constant }
    }

    /// The rule's name as the adapters spell it: `sgd`, `momentum`, `nesterov`, `adamw` or
    /// `mean`.
    pub const fn rule_name(&self) -> &'static str {
        match self.rule {
            Rule::Sgd => "sgd",
            Rule::Momentum { .. } => "momentum",
            Rule::Nesterov { .. } => "nesterov",
            Rule::AdamW(_) => "adamw",
            Rule::Mean => "mean",
        }
    }

    /// The same rule under `schedule`.
    pub const fn with_schedule(self, schedule: Schedule) -> Self {
        Self { schedule, ..self }
    }

    /// The relay of each round's mean gradient ([`Rule::Mean`]).
    pub const MEAN: Self = Self { rule: Rule::Mean, schedule: Schedule::Constant };

    /// Refuses a knob out of range (NaN and infinities included), naming it:
    /// [`ConfigError::Knob`] with `"momentum"`, `"nesterov"`, `"beta1"`, `"beta2"`, `"eps"`,
    /// `"weight_decay"`, `"schedule"` (a schedule other than constant under [`Rule::Mean`],
    /// which has no learning rate), or the schedule's (see [`Schedule::check`]).
    pub fn check(&self) -> Result<(), ConfigError> {
        #[cfg(not(feature = "optimizers"))]
        if matches!(self.rule, Rule::Nesterov { .. } | Rule::AdamW(_) | Rule::Mean)
            || self.schedule != Schedule::Constant
        {
            return Err(ConfigError::Knob(
                "optimizer (Nesterov, AdamW, mean and schedules need the `optimizers` feature)",
            ));
        }
        match self.rule {
            Rule::Sgd => {}
            Rule::Mean if self.schedule != Schedule::Constant => return Err(ConfigError::Knob("schedule")),
            Rule::Mean => {}
            Rule::Momentum { beta } => check_beta_named(beta, "momentum")?,
            Rule::Nesterov { beta } => check_beta_named(beta, "nesterov")?,
            Rule::AdamW(a) => {
                check_beta_named(a.beta1, "beta1")?;
                check_beta_named(a.beta2, "beta2")?;
                if !(a.eps.is_finite() && a.eps > 0.0) {
                    return Err(ConfigError::Knob("eps"));
                }
                if !(a.weight_decay.is_finite() && a.weight_decay >= 0.0) {
                    return Err(ConfigError::Knob("weight_decay"));
                }
            }
        }
        self.schedule.check()
    }

    /// Elements of state the rule keeps for a model of `dim` elements (saturating): none for
    /// plain SGD at a constant rate; `dim` for heavy-ball momentum at a constant rate (the
    /// model before the last update); otherwise the per-element state (momentum's previous
    /// model or Nesterov's velocity: `dim`; AdamW's `m` then `v`: `2·dim`; SGD: none)
    /// followed by a header of 40 elements holding the settings and the update count (so the
    /// buffer alone is a checkpoint of the rule). [`Rule::Mean`] keeps the header alone.
    pub fn state_len(&self, dim: usize) -> usize {
        if self.is_plain() {
            0
        } else if self.is_light() {
            dim
        } else {
            self.normalised().element_state_len(dim).saturating_add(HEADER_LEN)
        }
    }

    /// The per-element part of [`Self::state_len`].
    pub(crate) fn element_state_len(&self, dim: usize) -> usize {
        match self.rule {
            Rule::Sgd | Rule::Mean => 0,
            Rule::Momentum { .. } | Rule::Nesterov { .. } => dim,
            Rule::AdamW(_) => dim.saturating_mul(2),
        }
    }

    /// Heavy-ball momentum (above 0) at a constant rate: its state is the previous model
    /// alone.
    pub(crate) fn is_light(&self) -> bool {
        matches!(self.rule, Rule::Momentum { beta } if beta != 0.0) && self.schedule == Schedule::Constant
    }

    /// The same rule with a momentum of 0 written as SGD.
    pub(crate) fn normalised(self) -> Self {
        match self.rule {
            Rule::Momentum { beta } | Rule::Nesterov { beta } if beta == 0.0 => Self { rule: Rule::Sgd, ..self },
            _ => self,
        }
    }

    /// The rule as numbers, as checkpoints store it: the rule's kind (0 SGD, 1 momentum,
    /// 2 Nesterov, 3 AdamW, 4 mean) and its knobs, the schedule's kind (0 constant, 1 step,
    /// 2 warm-up and cosine) and its knobs as bits; unused knobs are 0.
    pub fn fields(&self) -> (u8, [f64; 4], u8, [u64; 3]) {
        let (kind, knobs) = match self.rule {
            Rule::Sgd => (0, [0.0; 4]),
            Rule::Momentum { beta } => (1, [beta, 0.0, 0.0, 0.0]),
            Rule::Nesterov { beta } => (2, [beta, 0.0, 0.0, 0.0]),
            Rule::AdamW(a) => (3, [a.beta1, a.beta2, a.eps, a.weight_decay]),
            Rule::Mean => (4, [0.0; 4]),
        };
        let (schedule, s) = match self.schedule {
            Schedule::Constant => (0, [0; 3]),
            Schedule::Step { every, gamma } => (1, [every, gamma.to_bits(), 0]),
            Schedule::WarmupCosine { warmup, total, floor } => (2, [warmup, total, floor.to_bits()]),
        };
        (kind, knobs, schedule, s)
    }

    /// The rule whose [`Self::fields`] these are; `None` for a kind out of range. Knobs are
    /// taken as given (neither range-checked nor required to be 0 where unused).
    pub fn from_fields(kind: u8, knobs: [f64; 4], schedule: u8, s: [u64; 3]) -> Option<Self> {
        let [k0, k1, k2, k3] = knobs;
        let rule = match kind {
            0 => Rule::Sgd,
            1 => Rule::Momentum { beta: k0 },
            2 => Rule::Nesterov { beta: k0 },
            3 => Rule::AdamW(AdamW { beta1: k0, beta2: k1, eps: k2, weight_decay: k3 }),
            4 => Rule::Mean,
            _ => return None,
        };
        let [s0, s1, s2] = s;
        let schedule = match schedule {
            0 => Schedule::Constant,
            1 => Schedule::Step { every: s0, gamma: f64::from_bits(s1) },
            2 => Schedule::WarmupCosine { warmup: s0, total: s1, floor: f64::from_bits(s2) },
            _ => return None,
        };
        Some(Self { rule, schedule })
    }

    /// Whether the rule is plain SGD at a constant rate (momentum 0 included): each
    /// protocol's own step, with no rule in the update path.
    pub fn is_plain(&self) -> bool {
        let sgd = match self.rule {
            Rule::Sgd => true,
            Rule::Momentum { beta } | Rule::Nesterov { beta } => beta == 0.0,
            Rule::AdamW(_) | Rule::Mean => false,
        };
        sgd && self.schedule == Schedule::Constant
    }
}
