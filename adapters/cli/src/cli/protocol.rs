//! `--protocol` and its knobs, the flags `train`, `serve` and `work` share. They describe a
//! [`ProtocolSpec`], the same thing a scenario file's `[[protocols]]` entry does.

use crate::scenario::{GroupLrScaling, InterruptMode, ProtocolKind, ProtocolSpec};
use clap::Args;
use clap::builder::{PossibleValue, PossibleValuesParser, TypedValueParser};
use syncopate::ProtocolConfig;

/// The protocol flags shared by `train`, `serve` and `work`.
#[derive(Clone, Debug, Args)]
pub struct ProtocolArgs {
    /// Synchronization protocol.
    #[arg(long, value_parser = protocol_parser(), default_value = "bsp")]
    pub protocol: ProtocolKind,
    /// Number of workers.
    #[arg(long, default_value_t = 8, value_parser = clap::value_parser!(u32).range(1..=syncopate::MAX_WORKERS as i64))]
    pub workers: u32,
    /// Learning rate of one synchronous (averaged) step. Protocols that apply each gradient
    /// on its own use lr / workers (asp), or average per clock (ssp), so that every protocol
    /// moves the model as far per gradient as BSP (docs/PROTOCOLS.md, "Learning rates").
    #[arg(long, default_value_t = 0.5, allow_negative_numbers = true)]
    pub lr: f64,
    /// ssp: the clock bound s (default 3); bap: the version bound s_bap (default 1).
    #[arg(long, value_name = "S")]
    pub staleness: Option<u64>,
    /// bap: close an iteration after this many milliseconds with the gradients received.
    #[arg(long, value_name = "MS", allow_negative_numbers = true)]
    pub iteration_timeout: Option<f64>,
    /// backup: aggregate the fastest workers − B gradients (default 1).
    #[arg(long, value_name = "B")]
    pub backup_workers: Option<u32>,
    /// backup, dbw: abort stragglers when an iteration closes, or let them complete
    /// (default abort).
    #[arg(long, value_enum)]
    pub interrupt: Option<InterruptMode>,
    /// dbw: the smallest number of gradients it may aggregate (default 2).
    #[arg(long, value_name = "K")]
    pub k_min: Option<u32>,
    /// grouped: the number of groups G (default 2).
    #[arg(long, value_name = "G")]
    pub groups: Option<u32>,
    /// grouped: how a group's learning rate scales with its size (default linear).
    #[arg(long, value_enum)]
    pub group_lr_scaling: Option<GroupLrScaling>,
    /// wbsp: close a round without a silent worker after this many milliseconds.
    #[arg(long, value_name = "MS", allow_negative_numbers = true)]
    pub round_deadline: Option<f64>,
    /// bsp, ssp, bap, backup, dbw, grouped: report a stall when a step waits longer than
    /// this many milliseconds (default 2000).
    #[arg(long, value_name = "MS", allow_negative_numbers = true)]
    pub stall_report: Option<f64>,
}

/// `--protocol`'s values: the names of [`ProtocolKind::ALL`], each with its summary.
fn protocol_parser() -> impl TypedValueParser<Value = ProtocolKind> {
    PossibleValuesParser::new(ProtocolKind::ALL.map(|kind| PossibleValue::new(kind.as_str()).help(kind.summary())))
        .try_map(|name| ProtocolKind::from_name(&name).ok_or("not a protocol name"))
}

impl ProtocolArgs {
    /// The protocol and knobs these flags describe.
    pub fn spec(&self) -> ProtocolSpec {
        ProtocolSpec {
            name: self.protocol,
            lr: Some(self.lr),
            staleness: self.staleness,
            iteration_timeout_ms: self.iteration_timeout,
            backup_workers: self.backup_workers,
            interrupt: self.interrupt,
            k_min: self.k_min,
            groups: self.groups,
            group_lr_scaling: self.group_lr_scaling,
            round_deadline_ms: self.round_deadline,
            stall_report_ms: self.stall_report,
        }
    }

    /// The core configuration these flags describe; the error names the bad flag, its value
    /// and what is allowed.
    pub fn config(&self) -> Result<ProtocolConfig, String> {
        if !(self.lr.is_finite() && self.lr > 0.0) {
            return Err(format!("invalid value '{}' for '--lr': must be a positive number", self.lr));
        }
        let spec = self.spec();
        if let Some(knob) = spec.knob_that_does_not_apply() {
            return Err(format!(
                "--{} does not apply to --protocol {}: it is a knob of {}",
                knob.flag,
                self.protocol.as_str(),
                knob.applies_to
            ));
        }
        spec.config(self.workers, self.lr).map_err(|e| format!("--protocol {}: {e}", self.protocol.as_str()))
    }
}
