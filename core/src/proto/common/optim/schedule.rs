//! The learning-rate schedule: a factor of the protocol's learning rate for each update of
//! the server's model, by the number of updates the rule applied before it.

use crate::error::ConfigError;

/// The factor `s(t)` of the protocol's learning rate for the server's update `t` (counted
/// from 0 by the rule: see [`ProtocolServer::optimizer_steps`]). Every schedule stays in
/// `[0, 1]`; [`Schedule::WarmupCosine`] in `[floor, 1]`.
///
/// [`ProtocolServer::optimizer_steps`]: crate::proto::ProtocolServer::optimizer_steps
#[derive(Clone, Copy, Debug, Default, PartialEq)]
pub enum Schedule {
    /// `s(t) = 1`.
    #[default]
    Constant,
    /// PyTorch's `StepLR`: `s(t) = gamma^⌊t / every⌋`.
    Step {
        /// Updates between two decays, at least 1.
        every: u64,
        /// The decay, in `(0, 1]`.
        gamma: f64,
    },
    /// A linear warm-up from `floor` to 1 over the first `warmup` updates
    /// (`s(t) = floor + (1 − floor)·(t + 1)/warmup`, so the first update already moves),
    /// then a half cosine from 1 down to `floor` at update `total`
    /// (`s(t) = floor + (1 − floor)·(1 + cos(π·(t − warmup)/(total − warmup)))/2`), then
    /// `floor`.
    WarmupCosine {
        /// Updates of warm-up (0: none).
        warmup: u64,
        /// The update at which the cosine reaches the floor, at least `warmup`.
        total: u64,
        /// The lowest factor, in `[0, 1]`.
        floor: f64,
    },
}

impl Schedule {
    /// Refuses a knob out of range, naming it ([`ConfigError::Knob`]): `"every"`, `"gamma"`,
    /// `"floor"` or `"total"`.
    pub fn check(&self) -> Result<(), ConfigError> {
        match *self {
            Self::Constant => Ok(()),
            Self::Step { every, gamma } => {
                if every == 0 {
                    Err(ConfigError::Knob("every"))
                } else if !(gamma.is_finite() && gamma > 0.0 && gamma <= 1.0) {
                    Err(ConfigError::Knob("gamma"))
                } else {
                    Ok(())
                }
            }
            Self::WarmupCosine { warmup, total, floor } => {
                if !(floor.is_finite() && (0.0..=1.0).contains(&floor)) {
                    Err(ConfigError::Knob("floor"))
                } else if total < warmup {
                    Err(ConfigError::Knob("total"))
                } else {
                    Ok(())
                }
            }
        }
    }

    /// The factor for update `t` (a checked schedule; an unchecked one still gives a number,
    /// never a panic).
    pub fn factor(&self, t: u64) -> f64 {
        match *self {
            Self::Constant => 1.0,
            Self::Step { every, gamma } => libm::pow(gamma, (t / every.max(1)) as f64),
            Self::WarmupCosine { warmup, total, floor } => {
                // Written as the distance below 1, so the peak is exactly 1; kept within
                // `[floor, 1]` against rounding.
                let rise = 1.0 - floor;
                let below_peak = if t < warmup {
                    1.0 - (t + 1) as f64 / warmup as f64
                } else if t < total {
                    let progress = (t - warmup) as f64 / (total - warmup) as f64;
                    0.5 * (1.0 - libm::cos(core::f64::consts::PI * progress))
                } else {
                    return floor;
                };
                (1.0 - rise * below_peak).max(floor).min(1.0)
            }
        }
    }
}
