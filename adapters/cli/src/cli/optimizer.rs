//! The server's update rule on the command line (`syncopate serve --optimizer ...`): the
//! flags, and their translation through the transport's one parser of the rule's spelling.

use clap::Args;
use syncopate::proto::Optimizer;
use syncopate_transport::optimizer_spec::{OptimizerKnob, OptimizerSpec};

/// The update-rule flags of `syncopate serve`.
#[derive(Clone, Debug, Default, Args)]
pub struct OptimizerArgs {
    /// The server's update rule on every update of its model: sgd, momentum (heavy ball,
    /// --momentum), nesterov (--momentum above 0), adamw (--beta1, --beta2, --eps,
    /// --weight-decay) or mean (each round's published vector is the round's mean gradient,
    /// for workers that apply it with their own optimizer: bsp, backup and dbw with interrupt
    /// abort; workers of your own only; no checkpoints). Default: sgd, or momentum when
    /// --momentum is above 0. Checkpoints keep the rule's state; --resume needs the same rule.
    #[arg(long, value_name = "RULE")]
    pub optimizer: Option<String>,
    /// The momentum coefficient BETA of --optimizer momentum or nesterov, in [0, 1); alone,
    /// heavy-ball momentum (0: plain SGD).
    #[arg(long, value_name = "BETA", default_value_t = 0.0, value_parser = super::values::parse_momentum)]
    pub momentum: f64,
    /// AdamW's first-moment decay, in [0, 1) (default 0.9).
    #[arg(long, value_name = "B", value_parser = number("--beta1"))]
    pub beta1: Option<f64>,
    /// AdamW's second-moment decay, in [0, 1) (default 0.999).
    #[arg(long, value_name = "B", value_parser = number("--beta2"))]
    pub beta2: Option<f64>,
    /// AdamW's term added to the denominator, above 0 (default 1e-8).
    #[arg(long, value_name = "E", value_parser = number("--eps"))]
    pub eps: Option<f64>,
    /// AdamW's decoupled weight decay, at least 0 (default 0; PyTorch's AdamW defaults to
    /// 0.01).
    #[arg(long, value_name = "L", value_parser = number("--weight-decay"))]
    pub weight_decay: Option<f64>,
    /// The learning-rate schedule by update count: constant, step:EVERY:GAMMA (the rate times
    /// GAMMA every EVERY updates) or warmup-cosine:WARMUP:TOTAL[:FLOOR] (a linear warm-up
    /// over WARMUP updates, then a half cosine down to FLOOR times the rate at update TOTAL).
    #[arg(long, value_name = "SPEC")]
    pub schedule: Option<String>,
}

/// A parser of a number for `flag`, whose error names the flag and the value.
fn number(flag: &'static str) -> impl Fn(&str) -> Result<f64, String> + Clone {
    move |s: &str| match s.parse::<f64>() {
        Ok(v) => Ok(v),
        Err(_) => Err(format!("{flag} must be a number, got '{s}'")),
    }
}

/// The flag that sets `knob`.
fn flag(knob: OptimizerKnob) -> &'static str {
    match knob {
        OptimizerKnob::Rule => "--optimizer",
        OptimizerKnob::Momentum => "--momentum",
        OptimizerKnob::Beta1 => "--beta1",
        OptimizerKnob::Beta2 => "--beta2",
        OptimizerKnob::Eps => "--eps",
        OptimizerKnob::WeightDecay => "--weight-decay",
        OptimizerKnob::Schedule => "--schedule",
    }
}

impl OptimizerArgs {
    /// The rule the flags name; the error names the flag refused.
    pub fn optimizer(&self) -> Result<Optimizer, String> {
        let spec = OptimizerSpec {
            rule: self.optimizer.as_deref(),
            momentum: (self.momentum != 0.0).then_some(self.momentum),
            beta1: self.beta1,
            beta2: self.beta2,
            eps: self.eps,
            weight_decay: self.weight_decay,
            schedule: self.schedule.as_deref(),
        };
        spec.build().map_err(|e| format!("{} {}", flag(e.knob), e.message))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use syncopate::proto::{AdamW, Schedule};

    #[test]
    fn flags_name_the_rule_and_the_refused_flag() {
        let adamw = OptimizerArgs {
            optimizer: Some("adamw".into()),
            weight_decay: Some(0.01),
            schedule: Some("warmup-cosine:5:50".into()),
            ..OptimizerArgs::default()
        };
        let want = Optimizer::adamw(AdamW { beta1: 0.9, beta2: 0.999, eps: 1e-8, weight_decay: 0.01 })
            .with_schedule(Schedule::WarmupCosine { warmup: 5, total: 50, floor: 0.0 });
        assert_eq!(adamw.optimizer(), Ok(want));
        let momentum = OptimizerArgs { momentum: 0.9, ..OptimizerArgs::default() };
        assert_eq!(momentum.optimizer(), Ok(Optimizer::momentum(0.9)));
        let bad = OptimizerArgs { optimizer: Some("sgd".into()), beta2: Some(0.9), ..OptimizerArgs::default() };
        assert_eq!(bad.optimizer().unwrap_err(), "--beta2 applies to rule 'adamw' only, not 'sgd'");
        assert_eq!(number("--eps")("x").unwrap_err(), "--eps must be a number, got 'x'");
    }
}
