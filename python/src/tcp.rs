//! [`run_worker`]: the adapters' TCP worker loop (`syncopate work`) with a Python callback
//! computing the gradient. A Python exception in the callback ends the worker: its
//! connection is dropped (the server counts it as a lost worker) and the exception is raised
//! again from `run_worker`, wrapped in a `WorkerError` that names the worker.

use crate::WorkerError;
use crate::protocol::Protocol;
use core::sync::atomic::{AtomicBool, Ordering};
use core::time::Duration;
use pyo3::buffer::PyBuffer;
use pyo3::exceptions::PyValueError;
use pyo3::prelude::*;
use pyo3::types::PyDict;
use std::path::Path;
use std::sync::Arc;
use syncopate::WorkerId;
use syncopate_adapters::tcp::{RunSettings, Secret, WorkerJob, WorkerOptions, run_worker as tcp_run_worker};

/// The TCP worker's settings; the one place that knows how the Rust worker is configured.
fn options(
    connect: &str,
    id: u32,
    protocol: &Protocol,
    secret_file: Option<&str>,
    give_up_after_s: f64,
) -> PyResult<WorkerOptions> {
    if id >= protocol.config.workers() {
        return Err(PyValueError::new_err(format!(
            "id {id} is out of range: the protocol has {} workers",
            protocol.config.workers()
        )));
    }
    if !(give_up_after_s.is_finite() && give_up_after_s > 0.0) {
        return Err(PyValueError::new_err(format!("give_up_after_s must be positive, got {give_up_after_s}")));
    }
    // The server announces the run's settings in the handshake; `WorkerGradients::prepare`
    // checks them against what this worker was given.
    let mut o = WorkerOptions::new(connect, WorkerId(id));
    if let Some(path) = secret_file {
        let secret = Secret::from_file(Path::new(path)).map_err(|e| PyValueError::new_err(e.to_string()))?;
        o.key = Some(secret.worker_key(WorkerId(id)));
    }
    o.backoff.give_up_after = Duration::from_secs_f64(give_up_after_s);
    Ok(o)
}

/// The Python callback as the TCP worker's job, after a check of the server's settings.
struct WorkerGradients<'a, F> {
    /// The model length this worker's arrays have.
    dim: usize,
    /// The protocol this worker was given.
    protocol: &'static str,
    step: &'a mut F,
}

impl<F: FnMut(&[f32], &mut [f32])> WorkerJob for WorkerGradients<'_, F> {
    fn prepare(&mut self, settings: &RunSettings) -> Result<(), String> {
        let dim = settings.dim()?;
        if dim != self.dim {
            return Err(format!("the server's model has {dim} parameters; this worker was given dim = {}", self.dim));
        }
        let runs = settings.worker_config()?.name();
        if runs != self.protocol {
            return Err(format!("the server runs {runs}; this worker was given {}", self.protocol));
        }
        Ok(())
    }

    fn gradient(&mut self, params: &[f32], grad: &mut [f32]) -> Duration {
        (self.step)(params, grad);
        Duration::ZERO
    }
}

/// Runs one worker of `syncopate serve` until the server says stop.
#[pyfunction]
#[pyo3(signature = (connect, id, protocol, dim, compute, *, secret_file = None, give_up_after_s = 30.0, log = None))]
#[allow(clippy::too_many_arguments)]
pub(crate) fn run_worker<'py>(
    py: Python<'py>,
    connect: &str,
    id: u32,
    protocol: &Protocol,
    dim: usize,
    compute: PyObject,
    secret_file: Option<&str>,
    give_up_after_s: f64,
    log: Option<PyObject>,
) -> PyResult<Bound<'py, PyDict>> {
    let mut options = options(connect, id, protocol, secret_file, give_up_after_s)?;
    let kill = Arc::new(AtomicBool::new(false));
    options.kill = Some(Arc::clone(&kill));
    // Arrays the callback sees, allocated once: `params` is refreshed before each call and
    // `grad` read back after it.
    let np = py.import("numpy")?;
    let f32_dtype = np.getattr("float32")?;
    let params_array = np.call_method1("zeros", (dim, &f32_dtype))?;
    let grad_array = np.call_method1("zeros", (dim, &f32_dtype))?;
    let params_buf = PyBuffer::<f32>::get(&params_array)?;
    let grad_buf = PyBuffer::<f32>::get(&grad_array)?;
    let (params_obj, grad_obj) = (params_array.unbind(), grad_array.unbind());
    let mut failure: Option<PyErr> = None;
    let mut log_failure: Option<PyErr> = None;
    let result = py.allow_threads(|| {
        let mut step = |params: &[f32], grad: &mut [f32]| {
            if failure.is_some() {
                grad.fill(f32::NAN);
                return;
            }
            let outcome = Python::with_gil(|py| -> PyResult<()> {
                params_buf.copy_from_slice(py, params)?;
                compute.call1(py, (params_obj.bind(py), grad_obj.bind(py)))?;
                grad_buf.copy_to_slice(py, grad)
            });
            if let Err(e) = outcome {
                // End the worker: a NaN gradient is refused (by the worker or the server), and
                // the kill flag drops the connection before anything else is sent.
                grad.fill(f32::NAN);
                kill.store(true, Ordering::SeqCst);
                failure = Some(e);
            }
        };
        let mut log_line = |line: &str| {
            Python::with_gil(|py| match &log {
                Some(f) => {
                    // A raising `log` ends the worker as a raising `compute` does: the first
                    // exception is kept and raised from `run_worker`.
                    if let Err(e) = f.call1(py, (line,)) {
                        kill.store(true, Ordering::SeqCst);
                        log_failure.get_or_insert(e);
                    }
                }
                None => eprintln!("syncopate worker: {line}"),
            });
        };
        let mut job = WorkerGradients { dim, protocol: protocol.config.name(), step: &mut step };
        tcp_run_worker(&options, &mut job, &mut log_line)
    });
    if let Some(cause) = failure {
        let err = WorkerError::new_err(format!(
            "worker {id}: the gradient callback raised {}; the worker left the server (counted as lost)",
            cause.get_type(py).name().map(|n| n.to_string()).unwrap_or_else(|_| "an exception".into())
        ));
        err.set_cause(py, Some(cause));
        return Err(err);
    }
    if let Some(cause) = log_failure {
        let err = WorkerError::new_err(format!(
            "worker {id}: the log callback raised {}; the worker left the server",
            cause.get_type(py).name().map(|n| n.to_string()).unwrap_or_else(|_| "an exception".into())
        ));
        err.set_cause(py, Some(cause));
        return Err(err);
    }
    let report = result.map_err(|e| WorkerError::new_err(e.0))?;
    let d = PyDict::new(py);
    d.set_item("steps", report.steps)?;
    d.set_item("sessions", report.sessions)?;
    d.set_item("last_version", report.last_version)?;
    d.set_item("stopped", report.stopped)?;
    d.set_item("busy_s", report.busy_s)?;
    d.set_item("wall_s", report.wall_s)?;
    d.set_item("refused", report.refused)?;
    Ok(d)
}
