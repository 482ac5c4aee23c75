//! [`Server`] and [`Worker`]: the core's state machines over NumPy arrays, messages as
//! wire-encoded `bytes` (the core's codec), times as integer nanoseconds.

use crate::RejectedError;
use crate::buffer::ArrayBuffer;
use crate::protocol::Protocol;
use pyo3::exceptions::PyValueError;
use pyo3::prelude::*;
use pyo3::types::{PyBytes, PyDict, PyTuple};
use syncopate::proto::Heap;
use syncopate::wire::{self, Limits};
use syncopate::{
    AnyServer, AnyWorker, ComputeId, Duration, Instant, Recipient, Reject, Server as _, ServerEvent, ServerOutput,
    Worker as _, WorkerEvent, WorkerId, WorkerOutput, WorkerSetup,
};

fn rejected(e: Reject) -> PyErr {
    RejectedError::new_err(e.to_string())
}

fn encoded(
    py: Python<'_>,
    len: usize,
    encode: impl FnOnce(&mut [u8]) -> Result<usize, wire::EncodeError>,
) -> PyResult<PyObject> {
    let mut buf = vec![0u8; len];
    let n = encode(&mut buf).map_err(|e| PyValueError::new_err(format!("cannot encode: {e}")))?;
    Ok(PyBytes::new(py, buf.get(..n).unwrap_or_default()).into_any().unbind())
}

fn server_event<'py>(py: Python<'py>, e: &ServerEvent) -> PyResult<Bound<'py, PyDict>> {
    let d = PyDict::new(py);
    match *e {
        ServerEvent::Applied { worker, base, version, staleness, weight } => {
            d.set_item("kind", "applied")?;
            d.set_item("worker", worker.0)?;
            d.set_item("base", base.0)?;
            d.set_item("version", version.0)?;
            d.set_item("staleness", staleness)?;
            d.set_item("weight", weight)?;
        }
        ServerEvent::Dropped { worker, base, reason } => {
            d.set_item("kind", "dropped")?;
            d.set_item("worker", worker.0)?;
            d.set_item("base", base.0)?;
            d.set_item("reason", reason.name())?;
        }
        ServerEvent::ModelUpdated { version, contributions } => {
            d.set_item("kind", "model_updated")?;
            d.set_item("version", version.0)?;
            d.set_item("contributions", contributions)?;
        }
        ServerEvent::WorkerJoined { worker, epoch } => {
            d.set_item("kind", "worker_joined")?;
            d.set_item("worker", worker.0)?;
            d.set_item("epoch", epoch)?;
        }
        ServerEvent::WorkerLost { worker } => {
            d.set_item("kind", "worker_lost")?;
            d.set_item("worker", worker.0)?;
        }
        ServerEvent::Stalled { waiting_for, missing, since } => {
            d.set_item("kind", "stalled")?;
            d.set_item("worker", waiting_for.0)?;
            d.set_item("missing", missing)?;
            d.set_item("since_ns", since.as_nanos())?;
        }
        ref other => {
            d.set_item("kind", "other")?;
            d.set_item("debug", format!("{other:?}"))?;
        }
    }
    Ok(d)
}

fn worker_event<'py>(py: Python<'py>, e: &WorkerEvent) -> PyResult<Bound<'py, PyDict>> {
    let d = PyDict::new(py);
    match *e {
        WorkerEvent::Blocked { have } => {
            d.set_item("kind", "blocked")?;
            d.set_item("version", have.0)?;
        }
        WorkerEvent::Abandoned { id } => {
            d.set_item("kind", "abandoned")?;
            d.set_item("compute_id", id.0)?;
        }
        WorkerEvent::Stopped => d.set_item("kind", "stopped")?,
        #[allow(unreachable_patterns)]
        ref other => {
            d.set_item("kind", "other")?;
            d.set_item("debug", format!("{other:?}"))?;
        }
    }
    Ok(d)
}

/// A parameter server for one protocol, updating `params` (a float32 NumPy array) in place.
#[pyclass(module = "syncopate._native", unsendable)]
pub(crate) struct Server {
    machine: AnyServer<f32, ArrayBuffer, Heap>,
    params: PyObject,
    dim: usize,
    limits: Limits,
}

#[pymethods]
impl Server {
    #[new]
    #[pyo3(signature = (protocol, params, version = 0))]
    fn new(py: Python<'_>, protocol: &Protocol, params: &Bound<'_, PyAny>, version: u64) -> PyResult<Self> {
        let buf = ArrayBuffer::new(params, "params", None)?;
        let dim = buf.as_ref().len();
        let np = py.import("numpy")?;
        let scratch_array =
            np.call_method1("zeros", (protocol.config.server_scratch_len(dim), np.getattr("float32")?))?;
        let scratch = ArrayBuffer::new(&scratch_array, "scratch", None)?;
        let machine = AnyServer::resume(&protocol.config, buf, scratch, syncopate::Version(version))
            .map_err(|e| PyValueError::new_err(format!("invalid server settings: {e}")))?;
        Ok(Self { machine, params: params.clone().unbind(), dim, limits: Limits::for_model(dim) })
    }

    /// Feeds `message` (wire bytes) from worker `worker` at `now_ns`.
    fn handle(&mut self, now_ns: u64, worker: u32, message: &[u8]) -> PyResult<()> {
        let msg = wire::decode_to_server::<f32>(message, &self.limits)
            .map_err(|e| PyValueError::new_err(format!("malformed message: {e}")))?;
        self.machine.handle(Instant::from_nanos(now_ns), WorkerId(worker), msg).map_err(rejected)
    }

    /// The transport lost worker `worker` at `now_ns`.
    fn handle_worker_lost(&mut self, now_ns: u64, worker: u32) -> PyResult<()> {
        self.machine.handle_worker_lost(Instant::from_nanos(now_ns), WorkerId(worker)).map_err(rejected)
    }

    /// The deadline from `poll_timeout` has passed.
    fn handle_timeout(&mut self, now_ns: u64) {
        self.machine.handle_timeout(Instant::from_nanos(now_ns));
    }

    /// The next output: `None`, `("send", worker_or_None, bytes)`, `("event", dict)` or, for
    /// a server with an upstream (none made here has one), `("upstream", bytes)`.
    fn poll_output(&mut self, py: Python<'_>) -> PyResult<Option<PyObject>> {
        let max = Limits::for_model(self.dim).max_message_len::<f32>();
        let out = match self.machine.poll_output() {
            None => return Ok(None),
            Some(ServerOutput::Event(e)) => ("event", server_event(py, &e)?).into_pyobject(py)?.into_any(),
            Some(ServerOutput::Send { to, msg }) => {
                let to = match to {
                    Recipient::Worker(w) => Some(w.0),
                    Recipient::AllWorkers => None,
                };
                let bytes = encoded(py, max, |b| wire::encode_to_worker(&msg, b))?;
                PyTuple::new(
                    py,
                    ["send".into_pyobject(py)?.into_any(), to.into_pyobject(py)?.into_any(), bytes.into_bound(py)],
                )?
                .into_any()
            }
            Some(ServerOutput::Upstream(msg)) => {
                ("upstream", encoded(py, max, |b| wire::encode_to_server(&msg, b))?).into_pyobject(py)?.into_any()
            }
        };
        Ok(Some(out.unbind()))
    }

    /// The next deadline (ns), or `None`.
    fn poll_timeout(&self) -> Option<u64> {
        self.machine.poll_timeout().map(Instant::as_nanos)
    }

    /// Ends training: every worker is told to stop.
    fn stop(&mut self) {
        self.machine.stop();
    }

    /// The model version.
    #[getter]
    fn version(&self) -> u64 {
        self.machine.version().0
    }

    /// The model: the very array passed in, updated in place.
    #[getter]
    fn params(&self, py: Python<'_>) -> PyObject {
        self.params.clone_ref(py)
    }

    /// Counters: accepted, applied, dropped (by reason), rejected, updates, and
    /// outputs_lost (outputs that found the queue full: zero unless there is a bug).
    fn stats<'py>(&self, py: Python<'py>) -> PyResult<Bound<'py, PyDict>> {
        let s = self.machine.stats();
        let d = PyDict::new(py);
        d.set_item("outputs_lost", s.outputs_lost)?;
        d.set_item("accepted", s.accepted)?;
        d.set_item("applied", s.applied)?;
        d.set_item("rejected", s.rejected)?;
        d.set_item("updates", s.updates)?;
        let dropped = PyDict::new(py);
        for r in syncopate::DropReason::ALL {
            dropped.set_item(r.name(), s.dropped_for(r))?;
        }
        d.set_item("dropped", dropped)?;
        Ok(d)
    }
}

/// A worker of one protocol holding its copy of the model in `params` (a float32 array).
#[pyclass(module = "syncopate._native", unsendable)]
pub(crate) struct Worker {
    machine: AnyWorker<f32, ArrayBuffer>,
    params: PyObject,
    params_addr: *const f32,
    scratch: PyObject,
    scratch_addr: *const f32,
    scratch_len: usize,
    dim: usize,
    limits: Limits,
}

#[pymethods]
impl Worker {
    #[new]
    #[pyo3(signature = (protocol, id, params, epoch = 0, rejoin_after_ns = None))]
    fn new(
        py: Python<'_>,
        protocol: &Protocol,
        id: u32,
        params: &Bound<'_, PyAny>,
        epoch: u32,
        rejoin_after_ns: Option<u64>,
    ) -> PyResult<Self> {
        let buf = ArrayBuffer::new(params, "params", None)?;
        let dim = buf.as_ref().len();
        let params_addr = buf.addr();
        let np = py.import("numpy")?;
        let scratch_array =
            np.call_method1("zeros", (protocol.config.worker_scratch_len(dim), np.getattr("float32")?))?;
        let scratch = ArrayBuffer::new(&scratch_array, "scratch", None)?;
        let scratch_addr = scratch.addr();
        let scratch_len = scratch.as_ref().len();
        let setup = WorkerSetup { id: WorkerId(id), epoch, rejoin_after: rejoin_after_ns.map(Duration::from_nanos) };
        let machine = AnyWorker::new(&protocol.config, setup, buf, scratch)
            .map_err(|e| PyValueError::new_err(format!("invalid worker settings: {e}")))?;
        Ok(Self {
            machine,
            params: params.clone().unbind(),
            params_addr,
            scratch: scratch_array.unbind(),
            scratch_addr,
            scratch_len,
            dim,
            limits: Limits::for_model(dim),
        })
    }

    /// Feeds `message` (wire bytes) from the server at `now_ns`.
    fn handle(&mut self, now_ns: u64, message: &[u8]) -> PyResult<()> {
        let msg = wire::decode_to_worker::<f32>(message, &self.limits)
            .map_err(|e| PyValueError::new_err(format!("malformed message: {e}")))?;
        self.machine.handle(Instant::from_nanos(now_ns), msg).map_err(rejected)
    }

    /// Hands in the gradient (a float32 array of the model's length) of job `compute_id`.
    fn handle_gradient(&mut self, now_ns: u64, compute_id: u64, grad: &Bound<'_, PyAny>) -> PyResult<()> {
        let g = pyo3::buffer::PyBuffer::<f32>::get(grad)
            .map_err(|e| PyValueError::new_err(format!("grad must be a float32 NumPy array: {e}")))?;
        if g.item_count() != self.dim {
            return Err(PyValueError::new_err(format!("grad has {} elements, expected {}", g.item_count(), self.dim)));
        }
        // Every byte the view spans, not just its start: a view that shares any byte with the
        // worker's own arrays (which the state machine writes during this call) is refused.
        let (lo, hi) = byte_span(&g);
        let owned = [(self.params_addr, self.dim), (self.scratch_addr, self.scratch_len)];
        if owned.iter().any(|&(p, n)| lo < (p as usize).saturating_add(n * 4) && (p as usize) < hi) {
            return Err(PyValueError::new_err(
                "grad overlaps the worker's params or scratch (the array compute was given): pass a separate array",
            ));
        }
        let start = g.buf_ptr().cast::<f32>().cast_const();
        let copy;
        let values: &[f32] = if g.is_c_contiguous() {
            // SAFETY: a C-contiguous export of `item_count` f32s, held (so kept alive and
            // unresized) for this call, which holds the GIL; only read, and not the worker's
            // own buffers (checked above), which the state machine writes.
            unsafe { core::slice::from_raw_parts(start, g.item_count()) }
        } else {
            copy = g.to_vec(grad.py())?;
            &copy
        };
        self.machine.handle_gradient(Instant::from_nanos(now_ns), ComputeId(compute_id), values).map_err(rejected)
    }

    /// The deadline from `poll_timeout` has passed.
    fn handle_timeout(&mut self, now_ns: u64) {
        self.machine.handle_timeout(Instant::from_nanos(now_ns));
    }

    /// Counters: outputs_lost (outputs that found the queue full: zero unless there is a bug).
    fn stats<'py>(&self, py: Python<'py>) -> PyResult<Bound<'py, PyDict>> {
        let d = PyDict::new(py);
        d.set_item("outputs_lost", self.machine.outputs_lost())?;
        Ok(d)
    }

    /// The next output: `None`, `("send", bytes)`, `("compute", compute_id, version, params)`
    /// or `("event", dict)`. `params` is the worker's own array (no copy): compute the gradient
    /// before the next call.
    fn poll_output(&mut self, py: Python<'_>) -> PyResult<Option<PyObject>> {
        let max = Limits::for_model(self.dim).max_message_len::<f32>();
        let out = match self.machine.poll_output() {
            None => return Ok(None),
            Some(WorkerOutput::Event(e)) => ("event", worker_event(py, &e)?).into_pyobject(py)?.into_any(),
            Some(WorkerOutput::Send(msg)) => {
                ("send", encoded(py, max, |b| wire::encode_to_server(&msg, b))?).into_pyobject(py)?.into_any()
            }
            Some(WorkerOutput::Compute { id, version, params }) => {
                let array = if params.as_ptr() == self.params_addr && params.len() == self.dim {
                    self.params.clone_ref(py)
                } else if params.as_ptr() == self.scratch_addr && params.len() == self.dim {
                    self.scratch.clone_ref(py)
                } else {
                    let np = py.import("numpy")?;
                    np.call_method1("array", (params.to_vec(), np.getattr("float32")?))?.unbind()
                };
                ("compute", id.0, version.0, array).into_pyobject(py)?.into_any()
            }
        };
        Ok(Some(out.unbind()))
    }

    /// The next deadline (ns), or `None`.
    fn poll_timeout(&self) -> Option<u64> {
        self.machine.poll_timeout().map(Instant::as_nanos)
    }

    /// Whether the server said training is over.
    #[getter]
    fn is_stopped(&self) -> bool {
        self.machine.is_stopped()
    }

    /// The worker's id.
    #[getter]
    fn id(&self) -> u32 {
        self.machine.id().0
    }
}

/// The byte addresses `[lo, hi)` a buffer view spans: its extent for a contiguous view, the
/// smallest range holding every element (whatever the strides' signs) otherwise.
fn byte_span(g: &pyo3::buffer::PyBuffer<f32>) -> (usize, usize) {
    let start = g.buf_ptr() as usize;
    if g.is_c_contiguous() {
        return (start, start.saturating_add(g.len_bytes()));
    }
    let (mut lo, mut hi) = (start, start.saturating_add(g.item_size()));
    for (&n, &stride) in g.shape().iter().zip(g.strides()) {
        if n == 0 {
            return (start, start);
        }
        let reach = (n as isize - 1).saturating_mul(stride);
        if reach < 0 {
            lo = lo.saturating_sub(reach.unsigned_abs());
        } else {
            hi = hi.saturating_add(reach.unsigned_abs());
        }
    }
    (lo, hi)
}
