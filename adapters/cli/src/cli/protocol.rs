//! `--protocol` and its knobs, the flags `train`, `serve` and `work` share. They describe a
//! [`ProtocolSpec`], the same thing a scenario file's `[[protocols]]` entry does.

use crate::scenario::{GroupLrScaling, InterruptMode, ProtocolName, ProtocolSpec};
use clap::Args;
use syncopate::ProtocolConfig;

/// The protocol flags shared by `train`, `serve` and `work`.
#[derive(Clone, Debug, Args)]
pub struct ProtocolArgs {
    /// Synchronization protocol.
    #[arg(long, value_enum, default_value = "bsp")]
    pub protocol: ProtocolName,
    /// Number of workers.
    #[arg(long, default_value_t = 8, value_parser = clap::value_parser!(u32).range(1..=256))]
    pub workers: u32,
    /// Learning rate of one synchronous (averaged) step. Protocols that apply each gradient
    /// on its own use lr / workers (asp), or average per clock (ssp), so that every protocol
    /// moves the model as far per gradient as BSP (PROTOCOLS.md §5.1).
    #[arg(long, default_value_t = 0.5)]
    pub lr: f64,
    /// ssp: the clock bound s (default 3); bap: the version bound s_bap (default 1).
    #[arg(long, value_name = "S")]
    pub staleness: Option<u64>,
    /// bap: close an iteration after this many milliseconds with the gradients received.
    #[arg(long, value_name = "MS")]
    pub iteration_timeout: Option<f64>,
    /// backup: aggregate the fastest workers − B gradients (default 1).
    #[arg(long, value_name = "B")]
    pub backup_workers: Option<u32>,
    /// backup, dbw: abort stragglers when an iteration closes, or let them complete.
    #[arg(long, value_enum, default_value = "abort")]
    pub interrupt: InterruptMode,
    /// dbw: the smallest number of gradients it may aggregate (default 2).
    #[arg(long, value_name = "K")]
    pub k_min: Option<u32>,
    /// grouped: the number of groups G (default 2).
    #[arg(long, value_name = "G")]
    pub groups: Option<u32>,
    /// grouped: how a group's learning rate scales with its size.
    #[arg(long, value_enum, default_value = "linear")]
    pub group_lr_scaling: GroupLrScaling,
    /// wbsp: close a round without a silent worker after this many milliseconds.
    #[arg(long, value_name = "MS")]
    pub round_deadline: Option<f64>,
    /// Report a stall when a synchronous step waits longer than this many milliseconds.
    #[arg(long, value_name = "MS", default_value_t = 2000.0)]
    pub stall_report: f64,
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
            stall_report_ms: Some(self.stall_report),
        }
    }

    /// The core configuration these flags describe; the error names the bad flag's value.
    pub fn config(&self) -> Result<ProtocolConfig, String> {
        self.spec().config(self.workers, self.lr).map_err(|e| format!("--protocol {}: {e}", self.protocol.as_str()))
    }
}
