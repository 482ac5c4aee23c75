//! The server's update rule as the command line and Python spell it: a rule name
//! (`sgd`, `momentum`, `nesterov`, `adamw`, `mean`), its knobs, and a schedule written
//! `constant`, `step:EVERY:GAMMA` or `warmup-cosine:WARMUP:TOTAL[:FLOOR]`. The one place
//! that turns those spellings into a core [`Optimizer`] and back, so every edge refuses the
//! same settings with the same reasons.

pub use syncopate::proto::{AdamW, Optimizer, Rule, Schedule};

/// The rule names, as [`Optimizer::rule_name`] spells them.
pub const RULE_NAMES: [&str; 5] = ["sgd", "momentum", "nesterov", "adamw", "mean"];

/// A knob of the update rule, for errors: each edge names it its own way (`--beta1` on the
/// command line, `betas` in Python).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum OptimizerKnob {
    /// The rule's name.
    Rule,
    /// The momentum coefficient of `momentum` and `nesterov`.
    Momentum,
    /// AdamW's first-moment decay.
    Beta1,
    /// AdamW's second-moment decay.
    Beta2,
    /// AdamW's denominator term.
    Eps,
    /// AdamW's decoupled weight decay.
    WeightDecay,
    /// The learning-rate schedule.
    Schedule,
}

/// A refused setting: the knob, and why (one line, without the knob's own spelling).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct OptimizerError {
    /// The knob refused.
    pub knob: OptimizerKnob,
    /// What is wrong with it.
    pub message: String,
}

impl OptimizerError {
    fn new(knob: OptimizerKnob, message: impl Into<String>) -> Self {
        Self { knob, message: message.into() }
    }
}

/// An update rule as given: every knob optional, so a knob given to a rule that does not
/// take it is refused rather than ignored.
#[derive(Clone, Copy, Debug, Default, PartialEq)]
pub struct OptimizerSpec<'a> {
    /// The rule's name; `None`: `momentum` if a non-zero momentum is given, else `sgd`.
    pub rule: Option<&'a str>,
    /// The momentum coefficient, in `[0, 1)` (`momentum`: 0 is plain SGD; `nesterov`:
    /// above 0).
    pub momentum: Option<f64>,
    /// AdamW's `β₁` in `[0, 1)` (default 0.9).
    pub beta1: Option<f64>,
    /// AdamW's `β₂` in `[0, 1)` (default 0.999).
    pub beta2: Option<f64>,
    /// AdamW's `ε`, finite and above 0 (default `1e-8`).
    pub eps: Option<f64>,
    /// AdamW's decoupled weight decay, finite and at least 0 (default 0).
    pub weight_decay: Option<f64>,
    /// The schedule's spelling (default `constant`).
    pub schedule: Option<&'a str>,
}

/// AdamW's settings when not given: PyTorch's betas and `ε`, and no weight decay.
pub const ADAMW_DEFAULTS: AdamW = AdamW { beta1: 0.9, beta2: 0.999, eps: 1e-8, weight_decay: 0.0 };

impl OptimizerSpec<'_> {
    /// The core rule these settings name, or the first knob refused.
    pub fn build(&self) -> Result<Optimizer, OptimizerError> {
        use OptimizerKnob as K;
        let momentum = self.momentum.unwrap_or(0.0);
        let rule_name = match self.rule {
            Some(name) => name,
            None if momentum != 0.0 => "momentum",
            None => "sgd",
        };
        let adamw_knobs = [
            (K::Beta1, self.beta1.is_some()),
            (K::Beta2, self.beta2.is_some()),
            (K::Eps, self.eps.is_some()),
            (K::WeightDecay, self.weight_decay.is_some()),
        ];
        if rule_name != "adamw" {
            if let Some((knob, _)) = adamw_knobs.iter().find(|(_, given)| *given) {
                return Err(OptimizerError::new(*knob, format!("applies to rule 'adamw' only, not '{rule_name}'")));
            }
        }
        if !matches!(rule_name, "momentum" | "nesterov") && momentum != 0.0 {
            return Err(OptimizerError::new(
                K::Momentum,
                format!("applies to rules 'momentum' and 'nesterov' only, not '{rule_name}'"),
            ));
        }
        let beta = |value: f64, knob: OptimizerKnob| {
            if value.is_finite() && (0.0..1.0).contains(&value) {
                Ok(value)
            } else {
                Err(OptimizerError::new(knob, format!("must be a number in [0, 1), got {value}")))
            }
        };
        let rule = match rule_name {
            "sgd" => Rule::Sgd,
            "momentum" => Rule::Momentum { beta: beta(momentum, K::Momentum)? },
            "nesterov" => {
                let b = beta(momentum, K::Momentum)?;
                if b == 0.0 {
                    return Err(OptimizerError::new(K::Momentum, "must be in (0, 1) for rule 'nesterov'"));
                }
                Rule::Nesterov { beta: b }
            }
            "adamw" => {
                let d = ADAMW_DEFAULTS;
                let eps = self.eps.unwrap_or(d.eps);
                if !(eps.is_finite() && eps > 0.0) {
                    return Err(OptimizerError::new(K::Eps, format!("must be a finite number above 0, got {eps}")));
                }
                let weight_decay = self.weight_decay.unwrap_or(d.weight_decay);
                if !(weight_decay.is_finite() && weight_decay >= 0.0) {
                    return Err(OptimizerError::new(
                        K::WeightDecay,
                        format!("must be a finite number at least 0, got {weight_decay}"),
                    ));
                }
                Rule::AdamW(AdamW {
                    beta1: beta(self.beta1.unwrap_or(d.beta1), K::Beta1)?,
                    beta2: beta(self.beta2.unwrap_or(d.beta2), K::Beta2)?,
                    eps,
                    weight_decay,
                })
            }
            "mean" => Rule::Mean,
            other => {
                return Err(OptimizerError::new(
                    K::Rule,
                    format!("'{other}': expected one of {}", RULE_NAMES.join(", ")),
                ));
            }
        };
        let schedule = match self.schedule {
            None => Schedule::Constant,
            Some(spec) => parse_schedule(spec).map_err(|m| OptimizerError::new(K::Schedule, m))?,
        };
        if rule == Rule::Mean && schedule != Schedule::Constant {
            return Err(OptimizerError::new(
                K::Schedule,
                "is unused by rule 'mean' (it has no learning rate: the workers' optimizers schedule their own)",
            ));
        }
        let optimizer = Optimizer { rule, schedule };
        // Every knob was checked above; the core's check is the same one, kept as the last word.
        optimizer.check().map_err(|e| OptimizerError::new(K::Rule, e.to_string()))?;
        Ok(optimizer)
    }
}

/// Parses a schedule: `constant`, `step:EVERY:GAMMA` (every at least 1, gamma in `(0, 1]`)
/// or `warmup-cosine:WARMUP:TOTAL[:FLOOR]` (total at least warmup, floor in `[0, 1]`,
/// default 0). The error says what is wrong, without naming the knob.
pub fn parse_schedule(spec: &str) -> Result<Schedule, String> {
    let parts: Vec<&str> = spec.split(':').collect();
    let whole = |s: &str, what: &str| {
        s.parse::<u64>().map_err(|_| format!("{what} must be a whole number, got '{s}' in '{spec}'"))
    };
    let number = |s: &str, what: &str| {
        s.parse::<f64>()
            .ok()
            .filter(|v| v.is_finite())
            .ok_or_else(|| format!("{what} must be a number, got '{s}' in '{spec}'"))
    };
    let schedule = match parts.as_slice() {
        ["constant"] => Schedule::Constant,
        ["step", every, gamma] => Schedule::Step { every: whole(every, "EVERY")?, gamma: number(gamma, "GAMMA")? },
        ["warmup-cosine", warmup, total] => {
            Schedule::WarmupCosine { warmup: whole(warmup, "WARMUP")?, total: whole(total, "TOTAL")?, floor: 0.0 }
        }
        ["warmup-cosine", warmup, total, floor] => Schedule::WarmupCosine {
            warmup: whole(warmup, "WARMUP")?,
            total: whole(total, "TOTAL")?,
            floor: number(floor, "FLOOR")?,
        },
        _ => {
            return Err(format!("'{spec}': expected constant, step:EVERY:GAMMA or warmup-cosine:WARMUP:TOTAL[:FLOOR]"));
        }
    };
    schedule.check().map_err(|e| match e {
        syncopate::ConfigError::Knob("every") => format!("EVERY must be at least 1 in '{spec}'"),
        syncopate::ConfigError::Knob("gamma") => format!("GAMMA must be in (0, 1] in '{spec}'"),
        syncopate::ConfigError::Knob("floor") => format!("FLOOR must be in [0, 1] in '{spec}'"),
        syncopate::ConfigError::Knob("total") => format!("TOTAL must be at least WARMUP in '{spec}'"),
        other => format!("'{spec}': {other}"),
    })?;
    Ok(schedule)
}

/// The schedule as [`parse_schedule`] reads it back.
pub fn schedule_spec(schedule: &Schedule) -> String {
    match *schedule {
        Schedule::Constant => "constant".into(),
        Schedule::Step { every, gamma } => format!("step:{every}:{gamma}"),
        Schedule::WarmupCosine { warmup, total, floor } => format!("warmup-cosine:{warmup}:{total}:{floor}"),
    }
}

/// The rule in one line, as reports print it: `sgd`, `momentum 0.9`, `nesterov 0.9`,
/// `adamw (betas 0.9, 0.999, eps 1e-8, weight decay 0.01)` or `mean`, then `, schedule SPEC`
/// unless constant.
pub fn describe(optimizer: &Optimizer) -> String {
    let rule = match optimizer.rule {
        Rule::Sgd => "sgd".to_owned(),
        Rule::Momentum { beta } => format!("momentum {beta}"),
        Rule::Nesterov { beta } => format!("nesterov {beta}"),
        Rule::AdamW(a) => {
            format!("adamw (betas {}, {}, eps {}, weight decay {})", a.beta1, a.beta2, a.eps, a.weight_decay)
        }
        Rule::Mean => "mean".to_owned(),
    };
    match optimizer.schedule {
        Schedule::Constant => rule,
        s => format!("{rule}, schedule {}", schedule_spec(&s)),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn spec(rule: &str) -> OptimizerSpec<'_> {
        OptimizerSpec { rule: Some(rule), ..OptimizerSpec::default() }
    }

    #[test]
    fn every_rule_builds_from_its_name() {
        assert_eq!(spec("sgd").build(), Ok(Optimizer::SGD));
        assert_eq!(spec("mean").build(), Ok(Optimizer::MEAN));
        let m = OptimizerSpec { momentum: Some(0.9), ..spec("momentum") };
        assert_eq!(m.build(), Ok(Optimizer::momentum(0.9)));
        let n = OptimizerSpec { momentum: Some(0.5), ..spec("nesterov") };
        assert_eq!(n.build(), Ok(Optimizer::nesterov(0.5)));
        let a = OptimizerSpec { weight_decay: Some(0.01), schedule: Some("warmup-cosine:10:100"), ..spec("adamw") };
        let expected = Optimizer::adamw(AdamW { weight_decay: 0.01, ..ADAMW_DEFAULTS })
            .with_schedule(Schedule::WarmupCosine { warmup: 10, total: 100, floor: 0.0 });
        assert_eq!(a.build(), Ok(expected));
        for name in RULE_NAMES {
            let given = OptimizerSpec { momentum: Some(0.5), ..spec(name) };
            let built = if matches!(name, "momentum" | "nesterov") { given.build() } else { spec(name).build() };
            assert_eq!(built.map(|o| o.rule_name()), Ok(name));
        }
    }

    #[test]
    fn momentum_alone_means_heavy_ball() {
        let s = OptimizerSpec { momentum: Some(0.9), ..OptimizerSpec::default() };
        assert_eq!(s.build(), Ok(Optimizer::momentum(0.9)));
        assert_eq!(OptimizerSpec::default().build(), Ok(Optimizer::SGD));
    }

    #[test]
    fn bad_knobs_are_named() {
        use OptimizerKnob as K;
        let cases: [(OptimizerSpec<'_>, OptimizerKnob); 12] = [
            (spec("lamb"), K::Rule),
            (OptimizerSpec { momentum: Some(1.0), ..spec("momentum") }, K::Momentum),
            (OptimizerSpec { momentum: Some(f64::NAN), ..spec("momentum") }, K::Momentum),
            (spec("nesterov"), K::Momentum),
            (OptimizerSpec { momentum: Some(0.9), ..spec("adamw") }, K::Momentum),
            (OptimizerSpec { beta1: Some(0.9), ..spec("sgd") }, K::Beta1),
            (OptimizerSpec { beta2: Some(1.5), ..spec("adamw") }, K::Beta2),
            (OptimizerSpec { eps: Some(0.0), ..spec("adamw") }, K::Eps),
            (OptimizerSpec { weight_decay: Some(-1.0), ..spec("adamw") }, K::WeightDecay),
            (OptimizerSpec { weight_decay: Some(0.1), ..spec("mean") }, K::WeightDecay),
            (OptimizerSpec { schedule: Some("step:0:0.5"), ..spec("sgd") }, K::Schedule),
            (OptimizerSpec { schedule: Some("step:10:0.5"), ..spec("mean") }, K::Schedule),
        ];
        for (given, knob) in cases {
            let e = given.build().unwrap_err();
            assert_eq!(e.knob, knob, "{given:?}: {}", e.message);
            assert!(!e.message.contains('\n'));
        }
    }

    #[test]
    fn schedules_parse_and_spell_back() {
        for s in ["constant", "step:100:0.5", "warmup-cosine:10:1000:0.1", "warmup-cosine:0:0:0"] {
            let parsed = parse_schedule(s).unwrap();
            assert_eq!(parse_schedule(&schedule_spec(&parsed)), Ok(parsed));
        }
        assert_eq!(
            parse_schedule("warmup-cosine:5:50"),
            Ok(Schedule::WarmupCosine { warmup: 5, total: 50, floor: 0.0 })
        );
        for bad in [
            "",
            "cosine",
            "step:10",
            "step:x:0.5",
            "step:10:1.5",
            "step:10:0",
            "warmup-cosine:10:5",
            "warmup-cosine:1:2:2",
            "warmup-cosine:1:2:nan",
            "constant:1",
            "step:-1:0.5",
        ] {
            assert!(parse_schedule(bad).is_err(), "{bad}");
        }
    }

    #[test]
    fn descriptions_name_the_rule() {
        assert_eq!(describe(&Optimizer::SGD), "sgd");
        assert_eq!(describe(&Optimizer::momentum(0.9)), "momentum 0.9");
        let o = Optimizer::MEAN;
        assert_eq!(describe(&o), "mean");
        let s = Optimizer::nesterov(0.5).with_schedule(Schedule::Step { every: 10, gamma: 0.5 });
        assert_eq!(describe(&s), "nesterov 0.5, schedule step:10:0.5");
    }
}
