//! [`run_worker`]: the adapters' TCP worker loop (`syncopate work`) with a Python callback
//! computing the gradient. The worker learns the protocol and the model's dimension from the
//! server's handshake. The callback `compute(params, grad)` fills `grad` and returns the
//! minibatch loss; one that raises or returns anything but a number ends the worker: its
//! connection is dropped (the server counts it as a lost worker) and `run_worker` raises a
//! `WorkerError` naming the worker and what went wrong.
//!
//! Worker 0 of a server that takes its initial model from it (`syncopate serve
//! --init-from-worker`) sends `initial=` (an array, or a function returning one) right after
//! each handshake; the server uses the first.
//!
//! `on_round(vector, version)`, if given, is called for every model the server sends, in
//! version order, before the next `compute` (a fresh float32 array each time): under the
//! server's rule `mean` each is one round's mean gradient, for the worker's own optimizer.
//! A round that never reached the worker (it joined late, or rejoined after rounds it did
//! not see) ends it with a `WorkerError` naming the versions.
//!
//! The arrays the callback sees are allocated once (or are the caller's own, `params=` and
//! `grad=`, so a framework's parameter and gradient storage is written and read in place):
//! the model is copied in before each call and the gradient copied out after it.

use crate::WorkerError;
use core::sync::atomic::{AtomicBool, Ordering};
use core::time::Duration;
use pyo3::buffer::PyBuffer;
use pyo3::exceptions::PyValueError;
use pyo3::prelude::*;
use pyo3::types::PyDict;
use std::path::Path;
use std::sync::Arc;
use syncopate::WorkerId;
use syncopate_transport::launcher::{self, FromEnv};
use syncopate_transport::tcp::{RunSettings, Secret, WorkerJob, WorkerOptions, run_worker as tcp_run_worker};

/// `wire` as a tensor encoding: `"f32"`, `"bf16"` or `"fp16"`.
pub(crate) fn wire(name: &str) -> PyResult<syncopate::wire::Encoding> {
    syncopate::wire::Encoding::from_name(name).ok_or_else(|| {
        PyValueError::new_err(format!("wire: {name:?} is not a wire encoding: give \"f32\", \"bf16\" or \"fp16\""))
    })
}

/// `lost_after_s` as a duration: how long a silent peer is waited on before its session counts
/// as lost (a positive number of seconds, at least the transport's shortest silence limit).
pub(crate) fn lost_after(lost_after_s: f64) -> PyResult<Duration> {
    let d = Duration::try_from_secs_f64(lost_after_s)
        .ok()
        .filter(|d| !d.is_zero())
        .ok_or_else(|| PyValueError::new_err(format!("lost_after_s must be positive, got {lost_after_s}")))?;
    syncopate_transport::tcp::check_lost_after(d).map_err(|e| PyValueError::new_err(format!("lost_after_s: {e}")))?;
    Ok(d)
}

/// The TCP worker's settings; the one place that knows how the Rust worker is configured.
fn options(connect: &str, id: u32, secret_file: Option<&str>, give_up_after_s: f64) -> PyResult<WorkerOptions> {
    if !(give_up_after_s.is_finite() && give_up_after_s > 0.0) {
        return Err(PyValueError::new_err(format!("give_up_after_s must be positive, got {give_up_after_s}")));
    }
    let mut o = WorkerOptions::new(connect, WorkerId(id));
    if let Some(path) = secret_file {
        let secret = Secret::from_file(Path::new(path)).map_err(|e| PyValueError::new_err(e.to_string()))?;
        o.key = Some(secret.worker_key(WorkerId(id)));
    }
    o.backoff.give_up_after = Duration::from_secs_f64(give_up_after_s);
    Ok(o)
}

/// A float32 array the callback sees, with the buffer export that reads and writes it.
struct Array {
    object: PyObject,
    buffer: PyBuffer<f32>,
}

impl Array {
    /// The caller's array, or `None` for a fresh zeroed one; either of `dim` elements.
    fn new(py: Python<'_>, given: Option<&PyObject>, dim: usize, what: &str) -> Result<Self, String> {
        let object = match given {
            Some(a) => a.clone_ref(py),
            None => {
                let np = py.import("numpy").map_err(|e| e.to_string())?;
                let f32_dtype = np.getattr("float32").map_err(|e| e.to_string())?;
                np.call_method1("zeros", (dim, f32_dtype)).map_err(|e| e.to_string())?.unbind()
            }
        };
        let buffer = PyBuffer::<f32>::get(object.bind(py))
            .map_err(|e| format!("{what} must be a float32 array (numpy.float32): {e}"))?;
        if buffer.readonly() {
            return Err(format!("{what} must be writable"));
        }
        if !buffer.is_c_contiguous() {
            return Err(format!("{what} must be C-contiguous"));
        }
        if buffer.item_count() != dim {
            return Err(format!(
                "this worker's model has {} parameters ({what}); the server's has {dim}",
                buffer.item_count()
            ));
        }
        Ok(Self { object, buffer })
    }
}

/// Why the callback ended the worker.
enum Failure {
    /// `compute` raised.
    Raised(PyErr),
    /// `compute` returned this (a type name, or a loss that is not finite as an f32).
    NotANumber(String),
    /// `on_round` raised.
    RoundRaised(PyErr),
    /// A round `on_round` needed never came (the worker joined late or rejoined after
    /// rounds it did not see).
    MissedRounds(String),
}

/// The Python callback as the TCP worker's job.
struct PythonJob<'a> {
    id: u32,
    compute: &'a PyObject,
    /// The caller's own arrays, if given.
    given: (Option<&'a PyObject>, Option<&'a PyObject>),
    /// Allocated (or checked) once the server's settings are known.
    arrays: Option<(Array, Array)>,
    /// The run as the server described it.
    label: String,
    /// The loss `compute` returned for the latest gradient (NaN for none).
    loss: f64,
    /// `optional_loss=True`: `compute` may return `None`, and that gradient travels without
    /// a loss.
    optional_loss: bool,
    failure: Option<Failure>,
    kill: Arc<AtomicBool>,
    /// `initial=`: the initial parameters (a float32 array, or a function returning one)
    /// worker 0 sends to a server that asks for them (`syncopate serve --init-from-worker`).
    initial: Option<&'a PyObject>,
    /// The launcher's world size, when the id came from the launcher: the run's worker
    /// count must equal it.
    world: Option<FromEnv<u32>>,
    /// `on_round(vector, version)`: called for every model the server sends, in version order.
    on_round: Option<&'a PyObject>,
    /// The last version given to `on_round`.
    last_round: Option<u64>,
}

impl PythonJob<'_> {
    /// Calls `compute` once: the model in, the gradient out, the loss returned.
    fn step(&mut self, params: &[f32], grad: &mut [f32]) -> Result<f64, Failure> {
        let Some((p, g)) = &self.arrays else {
            return Err(Failure::NotANumber("no arrays (the settings were never prepared)".into()));
        };
        Python::with_gil(|py| {
            p.buffer.copy_from_slice(py, params).map_err(Failure::Raised)?;
            let result = self.compute.call1(py, (p.object.bind(py), g.object.bind(py))).map_err(Failure::Raised)?;
            let result = result.bind(py);
            if self.optional_loss && result.is_none() {
                g.buffer.copy_to_slice(py, grad).map_err(Failure::Raised)?;
                return Ok(f64::NAN);
            }
            // A Python number, a NumPy scalar or a one-element tensor (anything with
            // `__float__`), but not a bool, a string or None.
            let loss = if result.is_instance_of::<pyo3::types::PyBool>() { None } else { result.extract::<f64>().ok() };
            let Some(loss) = loss else {
                let kind = result.get_type().name().map(|n| n.to_string()).unwrap_or_else(|_| "an object".into());
                return Err(Failure::NotANumber(kind));
            };
            // The loss travels as an f32; one that is not finite there ends the worker (its
            // gradient would be refused, and the worker would wait for nothing).
            if !(loss as f32).is_finite() {
                return Err(Failure::NotANumber(format!("a loss of {loss}")));
            }
            g.buffer.copy_to_slice(py, grad).map_err(Failure::Raised)?;
            Ok(loss)
        })
    }
}

impl WorkerJob for PythonJob<'_> {
    fn prepare(&mut self, settings: &RunSettings) -> Result<(), String> {
        launcher::check_world_size(self.world.as_ref(), settings.protocol.workers)?;
        if settings.optimizer.rule == syncopate::proto::Rule::Mean && self.on_round.is_none() {
            return Err("the server runs update rule mean: each model it sends from version 1 on is one round's \
                        mean gradient, not a model; pass on_round= to apply every round with your own optimizer"
                .into());
        }
        let dim = settings.dim()?;
        settings.worker_config()?;
        let (params, grad) = self.given;
        let arrays = Python::with_gil(|py| -> Result<_, String> {
            Ok((Array::new(py, params, dim, "params")?, Array::new(py, grad, dim, "grad")?))
        })?;
        self.arrays = Some(arrays);
        self.label = settings.label();
        Ok(())
    }

    fn initial_params(&mut self, out: &mut [f32]) -> Result<(), String> {
        let Some(initial) = self.initial else {
            return Err("the server takes its initial model from worker 0 (serve --init-from-worker): pass \
                        initial= (the model's parameters, e.g. syncopate.torch.parameters_vector(model))"
                .into());
        };
        Python::with_gil(|py| {
            let given = initial.bind(py);
            let array = if given.is_callable() {
                given.call0().map_err(|e| format!("initial() raised {e}"))?
            } else {
                given.clone()
            };
            let buffer = PyBuffer::<f32>::get(&array)
                .map_err(|e| format!("initial must be a float32 array (numpy.float32): {e}"))?;
            if buffer.item_count() != out.len() {
                return Err(format!(
                    "initial has {} elements; the server's model has {} parameters",
                    buffer.item_count(),
                    out.len()
                ));
            }
            buffer.copy_to_slice(py, out).map_err(|e| format!("initial: {e}"))
        })
    }

    fn wants_rounds(&self) -> bool {
        self.on_round.is_some()
    }

    fn round(&mut self, version: syncopate::Version, params: &[f32]) {
        let Some(on_round) = self.on_round else { return };
        if self.failure.is_some() {
            return;
        }
        let v = version.0;
        let expected = self.last_round.map_or(0, |l| l.saturating_add(1));
        if self.last_round.is_some_and(|l| v <= l) {
            // The model of a round already given (a rejoin on the same version).
            return;
        }
        if v != expected {
            // The server keeps no model to hand a late worker under the rule mean (each version
            // after 0 is a round's mean gradient), so the worker cannot catch up.
            let cause = if self.last_round.is_none() {
                "it joined after round 0 (each model the server sends after version 0 is a round's mean \
                 gradient, not the model, so a worker cannot start from it): start every rank before training \
                 begins"
            } else {
                "it rejoined after them"
            };
            self.failure = Some(Failure::MissedRounds(format!(
                "on_round needs every round in order, but the server's next model is version {v} and rounds \
                 {expected}..{v} never reached this worker: {cause}"
            )));
            self.kill.store(true, Ordering::SeqCst);
            return;
        }
        self.last_round = Some(v);
        let called = Python::with_gil(|py| -> PyResult<()> {
            // A fresh array filled by one copy of the floats (never a list of Python floats:
            // a model of millions of parameters would cost a Python object per parameter).
            let np = py.import("numpy")?;
            let vector = np.call_method1("empty", (params.len(), np.getattr("float32")?))?;
            let buffer = PyBuffer::<f32>::get(&vector)?;
            buffer.copy_from_slice(py, params)?;
            buffer.release(py);
            on_round.call1(py, (vector, v))?;
            Ok(())
        });
        if let Err(e) = called {
            self.failure = Some(Failure::RoundRaised(e));
            self.kill.store(true, Ordering::SeqCst);
        }
    }

    fn loss(&mut self) -> Option<f32> {
        // Set by the `gradient` call just made; NaN after a failure, whose NaN gradient is
        // refused anyway, or for a gradient without a loss (`optional_loss`).
        if self.optional_loss && self.loss.is_nan() { None } else { Some(self.loss as f32) }
    }

    fn gradient(&mut self, params: &[f32], grad: &mut [f32]) -> Duration {
        if self.failure.is_some() {
            grad.fill(f32::NAN);
            return Duration::ZERO;
        }
        match self.step(params, grad) {
            Ok(loss) => self.loss = loss,
            Err(failure) => {
                // End the worker: a NaN gradient is refused (by the worker or the server),
                // and the kill flag drops the connection before anything else is sent.
                grad.fill(f32::NAN);
                self.kill.store(true, Ordering::SeqCst);
                self.failure = Some(failure);
            }
        }
        Duration::ZERO
    }
}

/// The `WorkerError` for a callback that ended worker `id`.
fn failure_error(py: Python<'_>, id: u32, failure: Failure) -> PyErr {
    const LEFT: &str = "the worker left the server (counted as lost)";
    match failure {
        Failure::Raised(cause) => {
            let kind = cause.get_type(py).name().map(|n| n.to_string()).unwrap_or_else(|_| "an exception".into());
            let err = WorkerError::new_err(format!("worker {id}: compute raised {kind}: {}; {LEFT}", cause.value(py)));
            err.set_cause(py, Some(cause));
            err
        }
        Failure::NotANumber(kind) => WorkerError::new_err(format!(
            "worker {id}: compute returned {kind}, not a finite number (it must return the minibatch loss); {LEFT}"
        )),
        Failure::RoundRaised(cause) => {
            let kind = cause.get_type(py).name().map(|n| n.to_string()).unwrap_or_else(|_| "an exception".into());
            let err = WorkerError::new_err(format!("worker {id}: on_round raised {kind}: {}; {LEFT}", cause.value(py)));
            err.set_cause(py, Some(cause));
            err
        }
        Failure::MissedRounds(why) => WorkerError::new_err(format!("worker {id}: {why}; {LEFT}")),
    }
}

/// Runs worker `id` of the server at `connect` until the server says stop. Without `id`, the
/// launcher's rank (and then the run's worker count must be the launcher's world size);
/// without `connect`, `MASTER_ADDR:MASTER_PORT`.
#[pyfunction]
#[pyo3(signature = (connect, compute, *, id = None, secret_file = None, params = None, grad = None,
    give_up_after_s = 30.0, log = None, initial = None, lost_after_s = 10.0, on_round = None,
    optional_loss = false, wire = None))]
#[allow(clippy::too_many_arguments)]
pub(crate) fn run_worker<'py>(
    py: Python<'py>,
    connect: Option<&str>,
    compute: PyObject,
    id: Option<u32>,
    secret_file: Option<&str>,
    params: Option<PyObject>,
    grad: Option<PyObject>,
    give_up_after_s: f64,
    log: Option<PyObject>,
    initial: Option<PyObject>,
    lost_after_s: f64,
    on_round: Option<PyObject>,
    optional_loss: bool,
    wire: Option<&str>,
) -> PyResult<Bound<'py, PyDict>> {
    let wire = wire.map(self::wire).transpose()?;
    if on_round.as_ref().is_some_and(|f| !f.bind(py).is_callable()) {
        return Err(PyValueError::new_err("on_round must be callable: on_round(vector, version)"));
    }
    let world = match id {
        Some(_) => None,
        None => crate::launch::world_size()?,
    };
    let id = crate::launch::worker_id(id)?;
    let connect = crate::launch::server_address(connect)?;
    let mut options = options(&connect, id, secret_file, give_up_after_s)?;
    options.lost_after = lost_after(lost_after_s)?;
    options.wire = wire;
    // The size of the caller's own arrays travels in the hello: the server refuses another
    // size at the handshake, naming both.
    let sizes: Vec<usize> = [&params, &grad]
        .into_iter()
        .flatten()
        .filter_map(|a| PyBuffer::<f32>::get(a.bind(py)).ok().map(|b| b.item_count()))
        .collect();
    if let [p, g] = sizes[..] {
        if p != g {
            return Err(PyValueError::new_err(format!("params has {p} elements and grad {g}: they must be equal")));
        }
    }
    // Initial parameters given as an array also say the model's size.
    let initial_size = initial
        .as_ref()
        .filter(|a| !a.bind(py).is_callable())
        .and_then(|a| PyBuffer::<f32>::get(a.bind(py)).ok().map(|b| b.item_count()));
    if let (Some(p), Some(i)) = (sizes.first(), initial_size) {
        if *p != i {
            return Err(PyValueError::new_err(format!("params has {p} elements and initial {i}: they must be equal")));
        }
    }
    options.dim = sizes.first().copied().or(initial_size);
    let kill = Arc::new(AtomicBool::new(false));
    options.kill = Some(Arc::clone(&kill));
    let mut job = PythonJob {
        id,
        compute: &compute,
        given: (params.as_ref(), grad.as_ref()),
        arrays: None,
        label: String::new(),
        loss: f64::NAN,
        optional_loss,
        failure: None,
        kill: Arc::clone(&kill),
        initial: initial.as_ref(),
        world,
        on_round: on_round.as_ref(),
        last_round: None,
    };
    let mut log_failure: Option<PyErr> = None;
    let result = py.allow_threads(|| {
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
        tcp_run_worker(&options, &mut job, &mut log_line)
    });
    if let Some(failure) = job.failure.take() {
        return Err(failure_error(py, job.id, failure));
    }
    if let Some(cause) = log_failure {
        let err = WorkerError::new_err(format!(
            "worker {}: the log callback raised {}; the worker left the server",
            job.id,
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
    d.set_item("superseded", report.superseded)?;
    d.set_item("run", job.label)?;
    d.set_item("last_loss", job.loss)?;
    Ok(d)
}
