//! [`Protocol`]: a protocol and its knobs, spelled as `syncopate serve` / `work` spell them
//! (the adapters' [`ProtocolSpec`]), so a Python worker and a CLI server agree exactly.

use core::time::Duration;
use pyo3::exceptions::PyValueError;
use pyo3::prelude::*;
use syncopate::ProtocolConfig;
use syncopate_sim::scenario::{GroupLrScaling, InterruptMode, ProtocolKind, ProtocolSpec};
use syncopate_transport::tcp::ProtocolSettings;

/// A synchronization protocol and its settings (the `--protocol` flags of the CLI).
#[pyclass(module = "syncopate._native", frozen)]
#[derive(Clone)]
pub(crate) struct Protocol {
    pub(crate) config: ProtocolConfig,
    /// The same protocol as a server announces it to its workers.
    pub(crate) settings: ProtocolSettings,
    /// How often a server with no progress says what it waits for: the stall report
    /// interval (`stall_report_ms`, 2 s by default).
    pub(crate) report_every: Duration,
    name: String,
}

fn parse_name(name: &str) -> PyResult<ProtocolKind> {
    ProtocolKind::from_name(name).ok_or_else(|| {
        PyValueError::new_err(format!("unknown protocol '{name}': expected one of {}", ProtocolKind::NAMES.join(", ")))
    })
}

#[pymethods]
impl Protocol {
    #[new]
    #[pyo3(signature = (name = "bsp", workers = None, lr = 0.5, *, staleness = None, iteration_timeout_ms = None,
        backup_workers = None, interrupt = None, k_min = None, groups = None, group_lr_scaling = None,
        round_deadline_ms = None, stall_report_ms = None))]
    #[allow(clippy::too_many_arguments)]
    fn new(
        name: &str,
        workers: Option<u32>,
        lr: f64,
        staleness: Option<u64>,
        iteration_timeout_ms: Option<f64>,
        backup_workers: Option<u32>,
        interrupt: Option<&str>,
        k_min: Option<u32>,
        groups: Option<u32>,
        group_lr_scaling: Option<&str>,
        round_deadline_ms: Option<f64>,
        stall_report_ms: Option<f64>,
    ) -> PyResult<Self> {
        // Unset knobs take the protocol's defaults (`abort`, `linear`), as on the command line.
        let interrupt = match interrupt {
            None => None,
            Some("abort") => Some(InterruptMode::Abort),
            Some("complete") => Some(InterruptMode::Complete),
            Some(other) => {
                return Err(PyValueError::new_err(format!("interrupt '{other}': expected 'abort' or 'complete'")));
            }
        };
        let group_lr_scaling = match group_lr_scaling {
            None => None,
            Some(name) => Some(GroupLrScaling::from_name(name).ok_or_else(|| {
                PyValueError::new_err(format!("group_lr_scaling '{name}': expected 'linear', 'none' or 'sqrt'"))
            })?),
        };
        let kind = parse_name(name)?;
        // Without `workers=`, a launcher's world size (one process per worker), else an error.
        let workers = crate::launch::workers(workers)?;
        let spec = ProtocolSpec {
            lr: Some(lr),
            staleness,
            iteration_timeout_ms,
            backup_workers,
            interrupt,
            k_min,
            groups,
            group_lr_scaling,
            round_deadline_ms,
            stall_report_ms,
            ..ProtocolSpec::new(kind)
        };
        let config = spec.config(workers, lr).map_err(|e| PyValueError::new_err(format!("protocol {name}: {e}")))?;
        let settings = ProtocolSettings::new(&spec, workers, lr);
        // Checked finite and positive by `config` when given.
        let report_every =
            Duration::try_from_secs_f64(stall_report_ms.unwrap_or(2000.0) / 1000.0).unwrap_or(Duration::MAX);
        Ok(Self { config, settings, report_every, name: name.to_owned() })
    }

    /// The protocol's name, as the CLI spells it.
    #[getter]
    fn name(&self) -> &str {
        &self.name
    }

    /// The number of workers.
    #[getter]
    fn workers(&self) -> u32 {
        self.config.workers()
    }

    /// Elements of server scratch storage for a model of `dim` parameters.
    fn server_scratch_len(&self, dim: usize) -> usize {
        self.config.server_scratch_len(dim)
    }

    /// Elements of worker scratch storage for a model of `dim` parameters.
    fn worker_scratch_len(&self, dim: usize) -> usize {
        self.config.worker_scratch_len(dim)
    }

    fn __repr__(&self) -> String {
        format!("Protocol({:?})", self.config)
    }
}
