//! [`serve`]: the adapters' TCP parameter server (`syncopate serve`) on a model the caller
//! owns: a float32 NumPy array that the server updates in place, with an optional Python
//! `evaluate(params)` called on the server's thread every `every` model updates, given a
//! read-only view of the model.
//!
//! The server runs on a thread of its own with the GIL released; it takes the GIL only to
//! call `evaluate` and `log`. The calling thread wakes every few milliseconds
//! ([`watch::Ticker`]): Ctrl-C (or any signal handler that raises) stops the run cleanly
//! whatever the server is waiting for. Time spent in `evaluate` is kept out of the run's
//! clock: every time in the report is training time (wall time since every worker
//! connected, less the evaluations so far), and the time limit counts wall time since the
//! call, less every evaluation (so it also bounds the wait for workers).

use crate::buffer::ArrayBuffer;
use crate::protocol::Protocol;
use crate::watch::{self, Progress, Ticker, Watch};
use pyo3::exceptions::{PyKeyboardInterrupt, PyRuntimeError, PyValueError};
use pyo3::prelude::*;
use pyo3::types::{PyDict, PyList};
use std::path::Path;
use std::sync::{Mutex, mpsc};
use std::time::Instant;
use syncopate::proto::Heap;
use syncopate::{AnyServer, Version};
use syncopate_sim::trace::{self, served::ServedTrace};
use syncopate_transport::optimizer_spec::{self, OptimizerSpec, Rule};
use syncopate_transport::tcp::{RunPlan, RunSettings, Secret, ServerOptions, ServerReport, StopReason, TcpServer};

/// An [`ArrayBuffer`] the server's driving loop may hold while the GIL is released.
struct ServerBuffer(ArrayBuffer);

// SAFETY: while `serve` runs, the server's thread is the only one that reads or writes the
// memory through this buffer, and that thread ends before `serve` returns. The export it
// holds keeps the memory allocated and unresized until released, and the release takes the
// GIL itself on whichever thread drops it. The server writes with the GIL released, so Python
// may see the memory only while no write is in progress: `evaluate` gets a read-only view
// (it cannot be made writable) and runs on the server's thread while the server holds only
// shared references to the model; any other Python access to the array while `serve` runs
// races with the server's writes, and the documentation forbids it.
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

/// The reason's name in snake case ("TimeLimit" is "time_limit"): the variant's name, so a
/// reason the transport adds needs no change here.
fn reason_name(reason: StopReason) -> String {
    let mut name = String::new();
    for (i, c) in format!("{reason:?}").chars().take_while(char::is_ascii_alphanumeric).enumerate() {
        if c.is_ascii_uppercase() {
            if i > 0 {
                name.push('_');
            }
            name.push(c.to_ascii_lowercase());
        } else {
            name.push(c);
        }
    }
    name
}

/// What the run ended for, as the report says it: the target, the ticker's reason (a
/// signal, the time limit, every worker lost), the update budget, or the server's reason.
fn reason(report: &ServerReport, watch: &Watch<'_>, ticker: &Ticker<'_>) -> String {
    if watch.time_to_target_s.is_some() {
        return "target".into();
    }
    if let Some(r) = ticker.stopped {
        return r.into();
    }
    match watch.max_updates {
        Some(m) if report.version.0 >= m && report.reason == StopReason::Stopped => "updates".into(),
        _ => reason_name(report.reason),
    }
}

fn report_dict<'py>(
    py: Python<'py>,
    report: &ServerReport,
    watch: &Watch<'_>,
    ticker: &Ticker<'_>,
) -> PyResult<Bound<'py, PyDict>> {
    let d = PyDict::new(py);
    let eval_s = watch::lock(watch.progress).eval_s();
    d.set_item("reason", reason(report, watch, ticker))?;
    d.set_item("updates", report.version.0)?;
    d.set_item("wall_s", (report.wall_s - eval_s).max(0.0))?;
    d.set_item("eval_s", eval_s)?;
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
    // Per worker: median step time (none without step times), ratio to the median worker,
    // contributions applied, dropped and held.
    let stragglers = PyList::empty(py);
    for r in &report.stragglers {
        let row = PyDict::new(py);
        row.set_item("worker", r.worker)?;
        row.set_item("steps", r.steps)?;
        row.set_item("median_step_s", r.median_step_s)?;
        row.set_item("ratio", r.ratio)?;
        row.set_item("applied", r.applied)?;
        row.set_item("dropped", r.dropped)?;
        row.set_item("held", r.held)?;
        stragglers.append(row)?;
    }
    d.set_item("stragglers", stragglers)?;
    Ok(d)
}

/// A read-only NumPy view of `params` (its shape and memory): `numpy.asarray` of a read-only
/// `memoryview`, which no one can make writable again.
fn read_only_view(py: Python<'_>, params: &Bound<'_, PyAny>) -> PyResult<PyObject> {
    let view = py.import("builtins")?.getattr("memoryview")?.call1((params,))?.call_method0("toreadonly")?;
    Ok(py.import("numpy")?.call_method1("asarray", (view,))?.unbind())
}

/// Runs the parameter server of `protocol` on `params` until a bound says stop, every update
/// of the model through `optimizer` (plain SGD by default; `momentum` > 0 is the shorthand for
/// `Optimizer("momentum", momentum=...)`; giving both is an error).
#[pyfunction]
#[pyo3(signature = (params, protocol, *, listen = "127.0.0.1:0", secret_file = None, insecure = false,
    optimizer = None, momentum = 0.0, evaluate = None, every = 1, target = None, updates = None, gradients = None,
    time_limit_s = None, on_listen = None, log = None, record_trace = None, wait_for_rejoin = false,
    lost_after_s = 10.0, stop_when = None, wire = "f32", shared_memory = true))]
#[allow(clippy::too_many_arguments)]
pub(crate) fn serve<'py>(
    py: Python<'py>,
    params: &Bound<'py, PyAny>,
    protocol: &Protocol,
    listen: &str,
    secret_file: Option<&str>,
    insecure: bool,
    optimizer: Option<crate::optimizer::Optimizer>,
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
    wait_for_rejoin: bool,
    lost_after_s: f64,
    stop_when: Option<PyObject>,
    wire: &str,
    shared_memory: bool,
) -> PyResult<Bound<'py, PyDict>> {
    let lost_after = crate::tcp::lost_after(lost_after_s)?;
    let wire = crate::tcp::wire(wire)?;
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
    let optimizer = match optimizer {
        Some(_) if momentum != 0.0 => {
            return Err(PyValueError::new_err("momentum: give either optimizer= or the momentum= shorthand, not both"));
        }
        Some(o) => o.optimizer,
        None => OptimizerSpec { momentum: Some(momentum), ..OptimizerSpec::default() }
            .build()
            .map_err(|e| PyValueError::new_err(format!("momentum {momentum}: {}", e.message)))?,
    };
    if optimizer.rule == Rule::Mean && evaluate.is_some() {
        return Err(PyValueError::new_err(
            "evaluate: under optimizer rule 'mean' the server holds each round's mean gradient, not a model",
        ));
    }
    if !optimizer.is_plain() {
        let state = zeros(py, optimizer.state_len(dim), "optimizer state")?;
        server = server
            .with_optimizer(optimizer, state)
            .map_err(|e| PyValueError::new_err(format!("optimizer {}: {e}", optimizer_spec::describe(&optimizer))))?;
    }
    let trace_file = record_trace.as_deref().map(trace::create).transpose().map_err(PyValueError::new_err)?;
    let mut settings = RunSettings::new(protocol.settings.clone(), dim);
    // The workers report their step times for the straggler report (and a trace).
    settings.report_step_times = true;
    // The workers learn the rule (under `mean` they apply each round themselves).
    settings.optimizer = optimizer;
    let mut options = ServerOptions::new(settings);
    options.insecure = insecure;
    options.lost_after = lost_after;
    options.wire = wire;
    options.shared_memory = shared_memory;
    if let Some(path) = secret_file {
        options.secret = Some(Secret::from_file(Path::new(path)).map_err(|e| PyValueError::new_err(e.to_string()))?);
    }
    let tcp = TcpServer::bind(listen, options).map_err(|e| PyValueError::new_err(e.0))?;
    let addr = tcp.local_addr().map_err(|e| PyValueError::new_err(e.0))?;
    if let Some(f) = &on_listen {
        f.call1(py, (addr.to_string(),))?;
    }
    // The time limit leaves evaluations out, so the calling thread's ticker applies it.
    let plan = RunPlan { max_gradients: gradients.unwrap_or(u64::MAX), time_limit: None };
    let view = read_only_view(py, params)?;
    let progress = Mutex::new(Progress::new(config.workers()));
    let mut watch = Watch {
        evaluate: evaluate.as_ref(),
        every,
        evaluated: 0,
        target,
        max_updates: updates,
        log: log.as_ref(),
        view: &view,
        handle: tcp.handle(),
        progress: &progress,
        eval_marks: Vec::new(),
        evaluations: Vec::new(),
        time_to_target_s: None,
        failure: None,
        lost: Vec::new(),
        trace: trace_file.as_ref().map(|_| ServedTrace::new(config.workers(), dim)),
    };
    let mut ticker = Ticker {
        progress: &progress,
        handle: tcp.handle(),
        log: log.as_ref(),
        report_every: protocol.report_every,
        lost_after: tcp.options().lost_after,
        wait_for_rejoin,
        time_limit_s,
        last_report: Instant::now(),
        announced_all_lost: false,
        stopped: None,
        interrupt: None,
        failure: None,
        stop_when: stop_when.as_ref(),
    };
    let outcome = py.allow_threads(|| {
        std::thread::scope(|scope| {
            let (done_tx, done_rx) = mpsc::channel::<()>();
            let watch = &mut watch;
            let plan = &plan;
            let server_thread =
                std::thread::Builder::new().name("syncopate-serve".into()).spawn_scoped(scope, move || {
                    let result = tcp.drive(server, None, plan, &mut |n| watch.note(n));
                    let _ = done_tx.send(());
                    result
                });
            let Ok(server_thread) = server_thread else {
                return Err("cannot start the server's thread".to_owned());
            };
            while let Err(mpsc::RecvTimeoutError::Timeout) = done_rx.recv_timeout(watch::TICK) {
                ticker.tick();
            }
            server_thread.join().map_err(|_| "the server's thread panicked".to_owned())
        })
    });
    let result = outcome.map_err(PyRuntimeError::new_err)?;
    if let Some(e) = watch.failure.take().or(ticker.failure.take()) {
        return Err(e);
    }
    // A signal handler's exception other than KeyboardInterrupt is raised once the run has
    // stopped cleanly; Ctrl-C returns the report (reason "interrupted").
    if let Some(e) = ticker.interrupt.take() {
        if !e.is_instance_of::<PyKeyboardInterrupt>(py) {
            return Err(e);
        }
    }
    let report = result.map_err(|e| PyValueError::new_err(e.0))?;
    let d = report_dict(py, &report, &watch, &ticker)?;
    if let (Some(path), Some(file), Some(t)) = (record_trace.as_deref(), trace_file, watch.trace.take()) {
        d.set_item("trace_steps", t.len())?;
        t.write_to(file, path).map_err(PyValueError::new_err)?;
    }
    Ok(d)
}
