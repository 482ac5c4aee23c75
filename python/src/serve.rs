//! [`serve`]: the adapters' TCP parameter server (`syncopate serve`) on a model the caller
//! owns: a float32 NumPy array that the server updates in place, with an optional Python
//! `evaluate(params)` called on the server's thread every `every` model updates.
//!
//! The GIL is released while the server runs and taken only to call `evaluate` and `log`
//! and, at each model update, to let a signal handler (Ctrl-C) raise its exception.
//! Time spent in `evaluate` is kept out of the run's clock: every time in the report is
//! training time (wall time since every worker connected, less the evaluations so far).

use crate::buffer::ArrayBuffer;
use crate::protocol::Protocol;
use core::time::Duration;
use pyo3::exceptions::PyValueError;
use pyo3::prelude::*;
use pyo3::types::{PyDict, PyList};
use std::path::Path;
use std::time::Instant as StdInstant;
use syncopate::proto::Heap;
use syncopate::{AnyServer, ServerEvent, Version};
use syncopate_adapters::trace::{self, served::ServedTrace};
use syncopate_adapters::tcp::{
    Note, RunPlan, RunSettings, Secret, ServerHandle, ServerOptions, ServerReport, StopReason, TcpServer,
};

/// An [`ArrayBuffer`] the server's driving loop may hold while the GIL is released.
struct ServerBuffer(ArrayBuffer);

// SAFETY: `allow_threads` runs its closure on the calling thread, so the buffer never
// changes threads; the export it holds keeps the memory alive and unresized, and its release
// takes the GIL itself. Python code that touches the array while `serve` runs (from another
// thread) races with the server's writes: the documentation forbids it.
unsafe impl Send for ServerBuffer {}

impl AsRef<[f32]> for ServerBuffer {
    fn as_ref(&self) -> &[f32] {
        self.0.as_ref()
    }
}

impl AsMut<[f32]> for ServerBuffer {
    fn as_mut(&mut self) -> &mut [f32] {
        self.0.as_mut()
    }
}

/// A float32 array of `len` zeros, as server storage.
fn zeros(py: Python<'_>, len: usize, what: &str) -> PyResult<ServerBuffer> {
    let np = py.import("numpy")?;
    let array = np.call_method1("zeros", (len.max(1), np.getattr("float32")?))?;
    let buf = ArrayBuffer::new(&array, what, None)?;
    Ok(ServerBuffer(buf))
}

/// What the run's notes are turned into: evaluations, stop decisions, log lines.
struct Watch<'a> {
    evaluate: Option<&'a PyObject>,
    every: u64,
    /// The version of the last evaluation (or 0).
    evaluated: u64,
    target: Option<f64>,
    max_updates: Option<u64>,
    log: Option<&'a PyObject>,
    array: &'a PyObject,
    handle: ServerHandle,
    /// When every worker had connected (the clock's start).
    started: Option<StdInstant>,
    /// Seconds spent in `evaluate` since the clock started.
    eval_s: f64,
    /// `(version, seconds spent evaluating up to and including it)` per evaluation.
    eval_marks: Vec<(u64, f64)>,
    /// `(version, training seconds, result)` per evaluation.
    evaluations: Vec<(u64, f64, PyObject)>,
    time_to_target_s: Option<f64>,
    /// The first exception `evaluate` or `log` raised; the run stops at it.
    failure: Option<PyErr>,
    lost: Vec<u32>,
    /// The step-time trace being recorded (`record_trace`).
    trace: Option<ServedTrace>,
}

impl Watch<'_> {
    /// Training seconds so far: since every worker connected, less the evaluations.
    fn training_s(&self) -> f64 {
        self.started.map_or(0.0, |t| t.elapsed().as_secs_f64() - self.eval_s)
    }

    fn note(&mut self, note: Note<'_>) {
        match note {
            Note::Log(line) => self.log_line(line),
            Note::Started => self.started = Some(StdInstant::now()),
            Note::Event(ServerEvent::WorkerLost { worker }) => self.lost.push(worker.0),
            Note::Event(_) => {}
            Note::Model { version, .. } => self.model(version),
            Note::Contribution { worker, msg, step_seconds } => {
                if let Some(t) = self.trace.as_mut() {
                    t.record(worker, msg, step_seconds);
                }
            }
        }
    }

    fn log_line(&mut self, line: &str) {
        Python::with_gil(|py| match self.log {
            Some(f) => {
                if let Err(e) = f.call1(py, (line,)) {
                    self.fail(e);
                }
            }
            None => eprintln!("syncopate serve: {line}"),
        });
    }

    fn fail(&mut self, e: PyErr) {
        if self.failure.is_none() {
            self.failure = Some(e);
        }
        self.handle.stop();
    }

    fn model(&mut self, version: Version) {
        if self.failure.is_some() {
            return;
        }
        // A signal (Ctrl-C) raises its exception here, at the next model update.
        if let Err(e) = Python::with_gil(|py| py.check_signals()) {
            self.fail(e);
            return;
        }
        if let Some(evaluate) = self.evaluate {
            // Every `every`-th version, even when one step of the server made several.
            if version.0 / self.every > self.evaluated / self.every {
                self.evaluated = version.0;
                self.evaluate(evaluate, version.0);
            }
        }
        if self.max_updates.is_some_and(|m| version.0 >= m) {
            self.handle.stop();
        }
    }

    fn evaluate(&mut self, evaluate: &PyObject, version: u64) {
        let at = self.training_s();
        let began = StdInstant::now();
        let outcome = Python::with_gil(|py| -> PyResult<(PyObject, Option<f64>)> {
            let result = evaluate.call1(py, (self.array.bind(py),))?;
            let score = match self.target {
                Some(_) => Some(result.extract::<f64>(py).map_err(|_| {
                    PyValueError::new_err(format!(
                        "evaluate returned {}, not a number to compare with the target",
                        result.bind(py).get_type().name().map(|n| n.to_string()).unwrap_or_default()
                    ))
                })?),
                None => None,
            };
            Ok((result, score))
        });
        if self.started.is_some() {
            self.eval_s += began.elapsed().as_secs_f64();
        }
        self.eval_marks.push((version, self.eval_s));
        match outcome {
            Ok((result, score)) => {
                self.evaluations.push((version, at, result));
                if let (Some(target), Some(score)) = (self.target, score) {
                    if score >= target && self.time_to_target_s.is_none() {
                        self.time_to_target_s = Some(at);
                        self.handle.stop();
                    }
                }
            }
            Err(e) => self.fail(e),
        }
    }
}

fn reason_name(reason: StopReason) -> &'static str {
    match reason {
        StopReason::Budget => "budget",
        StopReason::TimeLimit => "time_limit",
        StopReason::Stopped => "stopped",
        StopReason::Crashed => "crashed",
        StopReason::UpstreamStopped => "upstream_stopped",
        StopReason::UpstreamLost => "upstream_lost",
    }
}

fn report_dict<'py>(py: Python<'py>, report: &ServerReport, watch: &Watch<'_>) -> PyResult<Bound<'py, PyDict>> {
    let d = PyDict::new(py);
    let reason = match (watch.time_to_target_s, watch.max_updates) {
        (Some(_), _) => "target",
        (None, Some(m)) if report.version.0 >= m && report.reason == StopReason::Stopped => "updates",
        _ => reason_name(report.reason),
    };
    d.set_item("reason", reason)?;
    d.set_item("updates", report.version.0)?;
    d.set_item("wall_s", (report.wall_s - watch.eval_s).max(0.0))?;
    d.set_item("eval_s", watch.eval_s)?;
    d.set_item("connect_wait_s", report.connect_wait_s)?;
    d.set_item("time_to_target_s", watch.time_to_target_s)?;
    let evaluations = PyList::empty(py);
    for (version, at, result) in &watch.evaluations {
        evaluations.append((version, at, result.bind(py)))?;
    }
    d.set_item("evaluations", evaluations)?;
    d.set_item("evaluation", watch.evaluations.last().map(|(_, _, r)| r.clone_ref(py)))?;
    let s = &report.stats;
    let gradients = PyDict::new(py);
    gradients.set_item("accepted", s.accepted)?;
    gradients.set_item("applied", s.applied)?;
    gradients.set_item("rejected", s.rejected)?;
    gradients.set_item("refused", report.refused)?;
    let dropped = PyDict::new(py);
    for r in syncopate::DropReason::ALL {
        dropped.set_item(r.name(), s.dropped_for(r))?;
    }
    gradients.set_item("dropped", dropped)?;
    d.set_item("gradients", gradients)?;
    d.set_item("per_worker", report.per_worker.clone())?;
    d.set_item("busy_s", report.busy_s.clone())?;
    d.set_item("sessions", report.sessions)?;
    d.set_item("lost", report.lost)?;
    d.set_item("lost_workers", watch.lost.clone())?;
    // The loss curve: per update whose contributions reported losses, (version, training
    // seconds, mean loss); the server's seconds less the evaluations made by then.
    let curve = PyList::empty(py);
    let mut evals = watch.eval_marks.iter().peekable();
    let mut excluded = 0.0;
    for point in &report.loss_curve {
        while let Some((version, spent)) = evals.peek() {
            if *version >= point.version {
                break;
            }
            excluded = *spent;
            evals.next();
        }
        curve.append((point.version, (point.t_s - excluded).max(0.0), point.loss))?;
    }
    d.set_item("losses", curve)?;
    d.set_item("stalls", report.stalls)?;
    d.set_item("handshake_failures", report.handshake_failures)?;
    let (sum, count, max) = report.staleness;
    d.set_item("staleness_mean", if count > 0 { sum as f64 / count as f64 } else { 0.0 })?;
    d.set_item("staleness_max", max)?;
    Ok(d)
}

/// Runs the parameter server of `protocol` on `params` until a bound says stop; with
/// `momentum` > 0, SGD with (heavy-ball) momentum on every update.
#[pyfunction]
#[pyo3(signature = (params, protocol, *, listen = "127.0.0.1:0", secret_file = None, insecure = false,
    momentum = 0.0, evaluate = None, every = 1, target = None, updates = None, gradients = None,
    time_limit_s = None, on_listen = None, log = None, record_trace = None, lost_after_s = 10.0))]
#[allow(clippy::too_many_arguments)]
pub(crate) fn serve<'py>(
    py: Python<'py>,
    params: &Bound<'py, PyAny>,
    protocol: &Protocol,
    listen: &str,
    secret_file: Option<&str>,
    insecure: bool,
    momentum: f64,
    evaluate: Option<PyObject>,
    every: u64,
    target: Option<f64>,
    updates: Option<u64>,
    gradients: Option<u64>,
    time_limit_s: Option<f64>,
    on_listen: Option<PyObject>,
    log: Option<PyObject>,
    record_trace: Option<std::path::PathBuf>,
    lost_after_s: f64,
) -> PyResult<Bound<'py, PyDict>> {
    let lost_after = crate::tcp::lost_after(lost_after_s)?;
    if every == 0 {
        return Err(PyValueError::new_err("every must be at least 1"));
    }
    if target.is_some() && evaluate.is_none() {
        return Err(PyValueError::new_err("a target needs an evaluate function"));
    }
    if let Some(t) = time_limit_s {
        if !(t.is_finite() && t > 0.0) {
            return Err(PyValueError::new_err(format!("time_limit_s must be positive, got {t}")));
        }
    }
    if updates.is_none() && gradients.is_none() && time_limit_s.is_none() && target.is_none() {
        return Err(PyValueError::new_err("give a bound: updates, gradients, time_limit_s or target"));
    }
    let model = ServerBuffer(ArrayBuffer::new(params, "params", None)?);
    let dim = model.as_ref().len();
    if let Some(bad) = model.as_ref().iter().position(|v| !v.is_finite()) {
        return Err(PyValueError::new_err(format!("params[{bad}] is not finite: the initial model must be")));
    }
    let config = protocol.config;
    let scratch = zeros(py, config.server_scratch_len(dim), "scratch")?;
    let spare = zeros(py, config.spare_accumulator_len(dim), "spare")?;
    let mut server = AnyServer::<f32, ServerBuffer, Heap>::resume(&config, model, scratch, Version(0))
        .and_then(|s| s.with_spare_accumulator(spare))
        .map_err(|e| PyValueError::new_err(format!("invalid protocol settings: {e}")))?;
    if momentum != 0.0 {
        let previous = zeros(py, dim, "momentum")?;
        server = server
            .with_momentum(momentum, previous)
            .map_err(|e| PyValueError::new_err(format!("momentum {momentum}: {e}")))?;
    }
    let trace_file = record_trace.as_deref().map(trace::create).transpose().map_err(PyValueError::new_err)?;
    let mut settings = RunSettings::new(protocol.settings.clone(), dim);
    settings.report_step_times = record_trace.is_some();
    let mut options = ServerOptions::new(settings);
    options.insecure = insecure;
    options.lost_after = lost_after;
    if let Some(path) = secret_file {
        options.secret = Some(Secret::from_file(Path::new(path)).map_err(|e| PyValueError::new_err(e.to_string()))?);
    }
    let tcp = TcpServer::bind(listen, options).map_err(|e| PyValueError::new_err(e.0))?;
    let addr = tcp.local_addr().map_err(|e| PyValueError::new_err(e.0))?;
    if let Some(f) = &on_listen {
        f.call1(py, (addr.to_string(),))?;
    }
    let plan =
        RunPlan { max_gradients: gradients.unwrap_or(u64::MAX), time_limit: time_limit_s.map(Duration::from_secs_f64) };
    let array = params.clone().unbind();
    let mut watch = Watch {
        evaluate: evaluate.as_ref(),
        every,
        evaluated: 0,
        target,
        max_updates: updates,
        log: log.as_ref(),
        array: &array,
        handle: tcp.handle(),
        started: None,
        eval_s: 0.0,
        eval_marks: Vec::new(),
        evaluations: Vec::new(),
        time_to_target_s: None,
        failure: None,
        lost: Vec::new(),
        trace: trace_file.as_ref().map(|_| ServedTrace::new(config.workers(), dim)),
    };
    let result = py.allow_threads(|| tcp.drive(server, None, &plan, &mut |n| watch.note(n)));
    if let Some(e) = watch.failure.take() {
        return Err(e);
    }
    let report = result.map_err(|e| PyValueError::new_err(e.0))?;
    let d = report_dict(py, &report, &watch)?;
    if let (Some(path), Some(file), Some(t)) = (record_trace.as_deref(), trace_file, watch.trace.take()) {
        d.set_item("trace_steps", t.len())?;
        t.write_to(file, path).map_err(PyValueError::new_err)?;
    }
    Ok(d)
}
