//! [`Optimizer`]: the server's update rule (`syncopate serve --optimizer`), spelled as the
//! command line spells it, so a Python server and a CLI server run the same rule.

use pyo3::exceptions::PyValueError;
use pyo3::prelude::*;
use syncopate_transport::optimizer_spec::{self, ADAMW_DEFAULTS, OptimizerKnob, OptimizerSpec, Rule};

/// The server's update rule and its learning-rate schedule.
#[pyclass(module = "syncopate._native", frozen, eq)]
#[derive(Clone, PartialEq)]
pub(crate) struct Optimizer {
    pub(crate) optimizer: syncopate::proto::Optimizer,
}

/// The Python keyword that sets `knob`.
fn keyword(knob: OptimizerKnob) -> &'static str {
    match knob {
        OptimizerKnob::Rule => "rule",
        OptimizerKnob::Momentum => "momentum",
        OptimizerKnob::Beta1 => "betas[0]",
        OptimizerKnob::Beta2 => "betas[1]",
        OptimizerKnob::Eps => "eps",
        OptimizerKnob::WeightDecay => "weight_decay",
        OptimizerKnob::Schedule => "schedule",
    }
}

/// A setting given only if it differs from the keyword's default, so that a knob the rule
/// does not take is refused only when the caller set it.
fn given(value: f64, default: f64) -> Option<f64> {
    (value.to_bits() != default.to_bits()).then_some(value)
}

#[pymethods]
impl Optimizer {
    #[new]
    #[pyo3(signature = (rule = "sgd", *, momentum = 0.0, betas = (0.9, 0.999), eps = 1e-8, weight_decay = 0.0,
        schedule = None))]
    fn new(
        rule: &str,
        momentum: f64,
        betas: (f64, f64),
        eps: f64,
        weight_decay: f64,
        schedule: Option<&str>,
    ) -> PyResult<Self> {
        let d = ADAMW_DEFAULTS;
        let spec = OptimizerSpec {
            rule: Some(rule),
            momentum: given(momentum, 0.0),
            beta1: given(betas.0, d.beta1),
            beta2: given(betas.1, d.beta2),
            eps: given(eps, d.eps),
            weight_decay: given(weight_decay, d.weight_decay),
            schedule,
        };
        let optimizer =
            spec.build().map_err(|e| PyValueError::new_err(format!("{} {}", keyword(e.knob), e.message)))?;
        Ok(Self { optimizer })
    }

    /// The rule's name: "sgd", "momentum", "nesterov", "adamw" or "mean".
    #[getter]
    fn rule(&self) -> &'static str {
        self.optimizer.rule_name()
    }

    /// The momentum coefficient ("momentum", "nesterov"; 0.0 otherwise).
    #[getter]
    fn momentum(&self) -> f64 {
        match self.optimizer.rule {
            Rule::Momentum { beta } | Rule::Nesterov { beta } => beta,
            _ => 0.0,
        }
    }

    /// AdamW's betas (the defaults for the other rules).
    #[getter]
    fn betas(&self) -> (f64, f64) {
        let a = self.adamw();
        (a.beta1, a.beta2)
    }

    /// AdamW's eps (the default for the other rules).
    #[getter]
    fn eps(&self) -> f64 {
        self.adamw().eps
    }

    /// AdamW's decoupled weight decay (0.0 for the other rules).
    #[getter]
    fn weight_decay(&self) -> f64 {
        self.adamw().weight_decay
    }

    /// The schedule as the CLI spells it, or None for a constant rate.
    #[getter]
    fn schedule(&self) -> Option<String> {
        let s = self.optimizer.schedule;
        (s != syncopate::proto::Schedule::Constant).then(|| optimizer_spec::schedule_spec(&s))
    }

    /// Elements of state the server keeps for a model of `dim` parameters.
    fn state_len(&self, dim: usize) -> usize {
        self.optimizer.state_len(dim)
    }

    fn __repr__(&self) -> String {
        let mut s = format!("Optimizer({:?}", self.rule());
        match self.optimizer.rule {
            Rule::Momentum { beta } | Rule::Nesterov { beta } => s.push_str(&format!(", momentum={beta:?}")),
            Rule::AdamW(a) => s.push_str(&format!(
                ", betas=({:?}, {:?}), eps={:?}, weight_decay={:?}",
                a.beta1, a.beta2, a.eps, a.weight_decay
            )),
            Rule::Sgd | Rule::Mean => {}
        }
        if let Some(spec) = self.schedule() {
            s.push_str(&format!(", schedule={spec:?}"));
        }
        s.push(')');
        s
    }
}

impl Optimizer {
    fn adamw(&self) -> syncopate::proto::AdamW {
        match self.optimizer.rule {
            Rule::AdamW(a) => a,
            _ => ADAMW_DEFAULTS,
        }
    }
}
