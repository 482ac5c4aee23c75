//! `--protocol` and its knobs, turned into a core [`ProtocolConfig`].

use clap::{Args, ValueEnum};
use syncopate::proto::asp::AspConfig;
use syncopate::proto::bsp::BspConfig;
use syncopate::{Duration, ProtocolConfig};

/// The protocols the CLI can run.
#[derive(Clone, Copy, Debug, PartialEq, Eq, ValueEnum)]
pub enum ProtocolName {
    /// Bulk synchronous parallel: wait for all n workers every step.
    Bsp,
    /// Asynchronous parallel: apply every gradient on arrival.
    Asp,
}

/// The protocol flags shared by `train`, `serve` and `work`.
#[derive(Clone, Debug, Args)]
pub struct ProtocolArgs {
    /// Synchronization protocol.
    #[arg(long, value_enum, default_value = "bsp")]
    pub protocol: ProtocolName,
    /// Number of workers.
    #[arg(long, default_value_t = 8, value_parser = clap::value_parser!(u32).range(1..=256))]
    pub workers: u32,
    /// Learning rate of one synchronous (averaged) step. Protocols that apply each
    /// gradient on its own (asp) use lr / workers, so a full pass over the workers moves
    /// the model as far as one averaged step (PROTOCOLS.md §5.1).
    #[arg(long, default_value_t = 0.5)]
    pub lr: f64,
    /// Report a stall when a synchronous step waits longer than this many milliseconds.
    #[arg(long, value_name = "MS", default_value_t = 2000)]
    pub stall_report: u64,
}

impl ProtocolArgs {
    /// The core configuration these flags describe.
    pub fn config(&self) -> Result<ProtocolConfig, String> {
        if !(self.lr.is_finite() && self.lr > 0.0) {
            return Err(format!("invalid value '{}' for '--lr': must be a positive number", self.lr));
        }
        let n = self.workers;
        let per_gradient_lr = self.lr / f64::from(n);
        let stall = Some(Duration::from_millis(self.stall_report));
        Ok(match self.protocol {
            ProtocolName::Bsp => {
                let mut c = BspConfig::new(n, self.lr);
                c.stall_report = stall;
                ProtocolConfig::Bsp(c)
            }
            ProtocolName::Asp => ProtocolConfig::Asp(AspConfig::new(n, per_gradient_lr)),
        })
    }
}
