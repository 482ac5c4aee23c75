//! What the user sets for `advise`, and the tie margins of the pick.

use super::noise_estimate::NoiseEstimate;
use crate::sim::NetworkConfig;
use serde::Serialize;

/// Candidates tied with the fastest are considered for the pick when within this of its mean.
pub const TIE_WITHIN: f64 = 0.05;
/// Means this close are a tie whatever the interval says.
pub const TIE_ALWAYS: f64 = 0.01;

/// The workload the candidates train.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize)]
#[serde(rename_all = "lowercase")]
pub enum WorkloadKind {
    /// The noisy quadratic model, target calibrated to the trace (default).
    Nqm,
    /// Softmax regression on the built-in digits, an accuracy target.
    Digits,
    /// The reproduction's MLP (784-32-10) on mnist5k, an accuracy target.
    Mnist5k,
}

impl std::str::FromStr for WorkloadKind {
    type Err = String;
    fn from_str(s: &str) -> Result<Self, String> {
        match s {
            "nqm" => Ok(Self::Nqm),
            "digits" => Ok(Self::Digits),
            "mnist5k" => Ok(Self::Mnist5k),
            other => Err(format!("unknown workload '{other}': one of nqm, digits, mnist5k")),
        }
    }
}

/// What the user may set.
#[derive(Clone, Debug)]
pub struct Options {
    /// The workload.
    pub workload: WorkloadKind,
    /// The target: a loss (NQM) or an accuracy; `None`: calibrated (NQM) or 0.90.
    pub target: Option<f64>,
    /// The budget of each run in seconds; `None`: [`BUDGET_FACTOR`](super::BUDGET_FACTOR) × BSP's replay time.
    pub budget_s: Option<f64>,
    /// Run seeds `seed..seed + repeats`.
    pub seed: u64,
    /// Data seeds `split_seed..split_seed + repeats` (paired with the run seeds).
    pub split_seed: u64,
    /// Seeds (and data splits) per candidate.
    pub repeats: u32,
    /// Sweep each phase on its own where the trace changes regime.
    pub phases: bool,
    /// The network between the server and each worker.
    pub network: NetworkConfig,
    /// The operator's model's critical batch (gradient noise scale) in examples; `None`: the
    /// built-in NQM's noise (see [`noise`](super::noise)).
    pub noise_scale: Option<f64>,
    /// Examples per worker gradient on the operator's cluster (converts the noise scale to
    /// gradients).
    pub worker_batch: u32,
    /// Extend a knob's sweep past its edge when its best value is at the edge.
    pub extend: bool,
    /// The critical batches (examples) to re-sweep the whole trace with, to show how the pick
    /// depends on it (NQM only; empty: none).
    pub sensitivity: Vec<f64>,
    /// The noise scale measured from the trace's gradient columns, if it has them: used as
    /// the critical batch (in gradients, × [`Options::worker_batch`]) when
    /// [`Options::noise_scale`] is not given.
    pub measured_noise: Option<MeasuredNoise>,
}

/// What a trace's gradient columns told about the model's noise scale.
#[derive(Clone, Debug, PartialEq, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum MeasuredNoise {
    /// An estimate ([`noise_estimate::estimate`](super::noise_estimate::estimate)).
    Estimated(NoiseEstimate),
    /// Why there is none.
    NotEstimated(String),
}

impl Default for Options {
    fn default() -> Self {
        Self {
            workload: WorkloadKind::Nqm,
            target: None,
            budget_s: None,
            seed: 1,
            split_seed: 1001,
            repeats: 5,
            phases: true,
            network: NetworkConfig::default(),
            noise_scale: None,
            worker_batch: 1,
            extend: true,
            sensitivity: Vec::new(),
            measured_noise: None,
        }
    }
}
