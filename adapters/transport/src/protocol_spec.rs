//! One protocol with its knobs, as a scenario file or the command line spells it, and its
//! translation into a core [`ProtocolConfig`]. The one place that knows every protocol's
//! knobs and the learning-rate normalisation between them.

use serde::Deserialize;
use syncopate::proto::asp::AspConfig;
use syncopate::proto::backup::{BackupConfig, Interrupt};
use syncopate::proto::bap::BapConfig;
use syncopate::proto::bsp::BspConfig;
use syncopate::proto::dbw::DbwConfig;
use syncopate::proto::grouped::{GroupedConfig, LrScaling};
use syncopate::proto::ssp::SspConfig;
use syncopate::proto::wbsp::WbspConfig;
pub use syncopate::proto::{Knob, ProtocolKind};
use syncopate::{Duration, ProtocolConfig};

/// How late backup workers are handled.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Deserialize)]
#[cfg_attr(feature = "clap", derive(clap::ValueEnum))]
#[serde(rename_all = "kebab-case")]
pub enum InterruptMode {
    /// Option A: stragglers abandon their work when the iteration closes.
    #[default]
    Abort,
    /// Option B: stragglers finish, their gradient is dropped.
    Complete,
}

/// How a group's learning rate scales with its size.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Deserialize)]
#[cfg_attr(feature = "clap", derive(clap::ValueEnum))]
#[serde(rename_all = "kebab-case")]
pub enum GroupLrScaling {
    /// `η · n_g / n`: every gradient carries weight `η / n`, as in BSP (this CLI's default,
    /// consistent with ASP's `η / n`).
    #[default]
    Linear,
    /// `η` for every central update (docs/PROTOCOLS.md, "Grouped").
    None,
    /// `η · √(n_g / n)`.
    Sqrt,
}

impl GroupLrScaling {
    /// The name as the CLI and scenario files spell it.
    pub fn as_str(self) -> &'static str {
        match self {
            Self::Linear => "linear",
            Self::None => "none",
            Self::Sqrt => "sqrt",
        }
    }

    /// The scaling named `name` (as [`Self::as_str`] spells it).
    pub fn from_name(name: &str) -> Option<Self> {
        [Self::Linear, Self::None, Self::Sqrt].into_iter().find(|s| s.as_str() == name)
    }
}

/// A knob as the command line and scenario files spell it, and the protocols that take it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct KnobSpelling {
    /// The knob.
    pub knob: Knob,
    /// The flag without `--`, e.g. `staleness`.
    pub flag: &'static str,
    /// The scenario-file key, e.g. `iteration_timeout_ms`.
    pub key: &'static str,
    /// The protocols that take it, as a phrase (`ssp and bap`).
    pub applies_to: String,
}

impl KnobSpelling {
    /// How `knob` is spelled, and the protocols of [`ProtocolKind::ALL`] that take it.
    pub fn of(knob: Knob) -> Self {
        let (flag, key) = match knob {
            Knob::Staleness => ("staleness", "staleness"),
            Knob::IterationTimeout => ("iteration-timeout", "iteration_timeout_ms"),
            Knob::BackupWorkers => ("backup-workers", "backup_workers"),
            Knob::Interrupt => ("interrupt", "interrupt"),
            Knob::KMin => ("k-min", "k_min"),
            Knob::Groups => ("groups", "groups"),
            Knob::GroupLrScaling => ("group-lr-scaling", "group_lr_scaling"),
            Knob::RoundDeadline => ("round-deadline", "round_deadline_ms"),
            Knob::StallReport => ("stall-report", "stall_report_ms"),
        };
        let takers: Vec<&str> =
            ProtocolKind::ALL.into_iter().filter(|p| p.takes(knob)).map(ProtocolKind::as_str).collect();
        let applies_to = match takers.split_last() {
            Some((last, rest)) if !rest.is_empty() => format!("{} and {last}", rest.join(", ")),
            _ => takers.concat(),
        };
        Self { knob, flag, key, applies_to }
    }
}

/// One protocol run: its name and every knob (unset knobs take their defaults).
#[derive(Clone, Debug, PartialEq)]
pub struct ProtocolSpec {
    /// The protocol.
    pub name: ProtocolKind,
    /// Learning rate of one synchronous (averaged) step; `None` takes the scenario's.
    pub lr: Option<f64>,
    /// SSP's clock bound `s`, BAP's version bound `s_bap` (default 3 for SSP, 1 for BAP).
    pub staleness: Option<u64>,
    /// BAP's per-iteration time limit in milliseconds.
    pub iteration_timeout_ms: Option<f64>,
    /// Static backup workers `b` (default 1).
    pub backup_workers: Option<u32>,
    /// Backup workers and DBW: abort stragglers or let them finish (`None`: abort).
    pub interrupt: Option<InterruptMode>,
    /// DBW: the smallest k it may choose (default 2).
    pub k_min: Option<u32>,
    /// Grouped: the number of groups `G` (default 2).
    pub groups: Option<u32>,
    /// Grouped: learning-rate scaling with group size (`None`: linear).
    pub group_lr_scaling: Option<GroupLrScaling>,
    /// WBSP: close a round without a silent worker after this many milliseconds.
    pub round_deadline_ms: Option<f64>,
    /// Report a stall after this many milliseconds without progress (synchronous protocols).
    pub stall_report_ms: Option<f64>,
}

impl ProtocolSpec {
    /// `name` with every knob at its default.
    pub fn new(name: ProtocolKind) -> Self {
        Self {
            name,
            lr: None,
            staleness: None,
            iteration_timeout_ms: None,
            backup_workers: None,
            interrupt: None,
            k_min: None,
            groups: None,
            group_lr_scaling: None,
            round_deadline_ms: None,
            stall_report_ms: None,
        }
    }

    /// A short label with the knobs that differ from the defaults, e.g. `ssp s=3`.
    pub fn label(&self) -> String {
        let mut label = self.name.as_str().to_string();
        let mut add = |k: &str, v: String| {
            label.push(' ');
            label.push_str(k);
            label.push('=');
            label.push_str(&v);
        };
        if let Some(s) = self.staleness {
            add("s", s.to_string());
        }
        if let Some(t) = self.iteration_timeout_ms {
            add("tmax", format!("{t}ms"));
        }
        if let Some(b) = self.backup_workers {
            add("b", b.to_string());
        }
        if self.interrupt == Some(InterruptMode::Complete) {
            add("interrupt", "complete".into());
        }
        if let Some(k) = self.k_min {
            add("kmin", k.to_string());
        }
        if let Some(g) = self.groups {
            add("G", g.to_string());
        }
        if let Some(d) = self.round_deadline_ms {
            add("deadline", format!("{d}ms"));
        }
        if let Some(lr) = self.lr {
            add("lr", lr.to_string());
        }
        label
    }

    /// Whether this spec sets `knob`.
    pub fn sets(&self, knob: Knob) -> bool {
        match knob {
            Knob::Staleness => self.staleness.is_some(),
            Knob::IterationTimeout => self.iteration_timeout_ms.is_some(),
            Knob::BackupWorkers => self.backup_workers.is_some(),
            Knob::Interrupt => self.interrupt.is_some(),
            Knob::KMin => self.k_min.is_some(),
            Knob::Groups => self.groups.is_some(),
            Knob::GroupLrScaling => self.group_lr_scaling.is_some(),
            Knob::RoundDeadline => self.round_deadline_ms.is_some(),
            Knob::StallReport => self.stall_report_ms.is_some(),
        }
    }

    /// The first knob set on this spec that its protocol does not take (`lr` applies to all).
    pub fn knob_that_does_not_apply(&self) -> Option<KnobSpelling> {
        Knob::ALL.into_iter().find(|&knob| self.sets(knob) && !self.name.takes(knob)).map(KnobSpelling::of)
    }

    /// The core configuration for `workers` workers, with `default_lr` where the spec sets
    /// none. Learning rates are normalised so that every protocol moves the model as far per
    /// gradient as BSP does: protocols that apply each gradient alone (ASP) use `η / n`;
    /// SSP averages per clock itself; grouped scales with group size (`η · n_g / n`) unless
    /// told otherwise.
    pub fn config(&self, workers: u32, default_lr: f64) -> Result<ProtocolConfig, String> {
        let lr = self.lr.unwrap_or(default_lr);
        if !(lr.is_finite() && lr > 0.0) {
            return Err(format!("learning rate {lr} must be a positive number"));
        }
        let ms = |what: &str, v: Option<f64>| -> Result<Option<Duration>, String> {
            match v {
                None => Ok(None),
                Some(x) if x.is_finite() && x > 0.0 => Ok(Some(Duration::from_secs_f64(x / 1000.0))),
                Some(x) => Err(format!("{what} {x} must be a positive number of milliseconds")),
            }
        };
        let stall = ms("stall report", self.stall_report_ms)?.or(Some(Duration::from_secs(2)));
        if let Some(knob) = self.knob_that_does_not_apply() {
            return Err(format!(
                "{} does not apply to {}: it is a knob of {}",
                knob.key,
                self.name.as_str(),
                knob.applies_to
            ));
        }
        let interrupt = match self.interrupt.unwrap_or_default() {
            InterruptMode::Abort => Interrupt::Abort,
            InterruptMode::Complete => Interrupt::RunToCompletion,
        };
        let n = workers;
        Ok(match self.name {
            ProtocolKind::Bsp => {
                let mut c = BspConfig::new(n, lr);
                c.stall_report = stall;
                ProtocolConfig::Bsp(c)
            }
            ProtocolKind::Asp => ProtocolConfig::Asp(AspConfig::new(n, lr / f64::from(n.max(1)))),
            ProtocolKind::Ssp => {
                let mut c = SspConfig::new(n, lr, self.staleness.unwrap_or(3));
                c.stall_report = stall;
                ProtocolConfig::Ssp(c)
            }
            ProtocolKind::Bap => {
                let mut c = BapConfig::new(n, lr, self.staleness.unwrap_or(1));
                c.iteration_timeout = ms("iteration timeout", self.iteration_timeout_ms)?;
                c.stall_report = stall;
                ProtocolConfig::Bap(c)
            }
            ProtocolKind::Backup => {
                let b = self.backup_workers.unwrap_or(1);
                if b >= n {
                    return Err(format!("backup workers {b} must be fewer than the {n} workers"));
                }
                let mut c = BackupConfig::new(n, lr, b);
                c.interrupt = interrupt;
                c.stall_report = stall;
                ProtocolConfig::Backup(c)
            }
            ProtocolKind::Dbw => {
                let mut c = DbwConfig::new(n, lr);
                if let Some(k) = self.k_min {
                    if k == 0 || k > n {
                        return Err(format!("k-min {k} must be between 1 and the {n} workers"));
                    }
                    c.k_min = k;
                }
                c.interrupt = interrupt;
                c.stall_report = stall;
                ProtocolConfig::Dbw(c)
            }
            ProtocolKind::Wbsp | ProtocolKind::WbspOverlap => {
                let mut c = WbspConfig::new(n, lr);
                c.overlap = self.name == ProtocolKind::WbspOverlap;
                if let Some(d) = ms("round deadline", self.round_deadline_ms)? {
                    c.round_deadline = Some(d);
                }
                ProtocolConfig::Wbsp(c)
            }
            ProtocolKind::Grouped => {
                let g = self.groups.unwrap_or(2);
                if g == 0 || g > n {
                    return Err(format!("groups {g} must be between 1 and the {n} workers"));
                }
                let mut c = GroupedConfig::new(n, lr, g);
                c.lr_scaling = match self.group_lr_scaling.unwrap_or_default() {
                    GroupLrScaling::Linear => LrScaling::Linear,
                    GroupLrScaling::None => LrScaling::None,
                    GroupLrScaling::Sqrt => LrScaling::Sqrt,
                };
                c.stall_report = stall;
                ProtocolConfig::Grouped(c)
            }
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_protocol_builds_with_defaults() {
        for name in ProtocolKind::ALL {
            let config = ProtocolSpec::new(name).config(8, 0.5).unwrap();
            assert_eq!(config.kind(), name);
            assert_eq!(config.workers(), 8);
        }
    }

    #[test]
    fn bad_knobs_are_refused_with_a_reason() {
        let mut s = ProtocolSpec::new(ProtocolKind::Backup);
        s.backup_workers = Some(8);
        assert!(s.config(8, 0.5).unwrap_err().contains("fewer than the 8 workers"));
        let mut g = ProtocolSpec::new(ProtocolKind::Grouped);
        g.groups = Some(9);
        assert!(g.config(8, 0.5).unwrap_err().contains("groups 9"));
        assert!(ProtocolSpec::new(ProtocolKind::Bsp).config(8, -1.0).is_err());
        let mut b = ProtocolSpec::new(ProtocolKind::Bap);
        b.iteration_timeout_ms = Some(-3.0);
        assert!(b.config(8, 0.5).is_err());
    }

    #[test]
    fn knobs_name_the_protocols_that_take_them() {
        assert_eq!(KnobSpelling::of(Knob::StallReport).applies_to, "bsp, ssp, bap, backup, dbw and grouped");
        assert_eq!(KnobSpelling::of(Knob::Staleness).applies_to, "ssp and bap");
        assert_eq!(KnobSpelling::of(Knob::KMin).applies_to, "dbw");
        let mut s = ProtocolSpec::new(ProtocolKind::Asp);
        s.stall_report_ms = Some(5.0);
        s.lr = Some(0.1);
        let knob = s.knob_that_does_not_apply().unwrap();
        assert_eq!((knob.flag, knob.key), ("stall-report", "stall_report_ms"));
        assert!(ProtocolSpec::new(ProtocolKind::Asp).knob_that_does_not_apply().is_none());
        for kind in ProtocolKind::ALL {
            for knob in kind.knobs() {
                let spelling = KnobSpelling::of(knob);
                assert!(spelling.applies_to.split([' ', ',']).any(|name| name == kind.as_str()), "{kind}");
            }
        }
    }

    #[test]
    fn labels_show_the_knobs() {
        let mut s = ProtocolSpec::new(ProtocolKind::Ssp);
        s.staleness = Some(3);
        assert_eq!(s.label(), "ssp s=3");
        assert_eq!(ProtocolSpec::new(ProtocolKind::WbspOverlap).label(), "wbsp-overlap");
    }
}
