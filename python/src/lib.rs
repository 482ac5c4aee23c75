//! The native module of the `syncopate` Python package (see `python/syncopate/__init__.py`
//! for the Python-facing documentation and `_native.pyi` for the types).
//!
//! Layering (no module imports one after it): `errors`, `buffer`, `launch`, `optimizer`,
//! `sim` and `watch` import nothing of this crate; `protocol` imports `launch`; `machines`
//! and `tcp` import those before them; `serve` imports `tcp` and the rest; this file only
//! registers what they define.

mod buffer;
mod errors;
mod launch;
mod machines;
mod optimizer;
mod protocol;
mod serve;
mod sim;
mod tcp;
mod watch;

use errors::{RejectedError, WorkerError};
use pyo3::prelude::*;

#[pymodule]
fn _native(m: &Bound<'_, PyModule>) -> PyResult<()> {
    m.add_class::<protocol::Protocol>()?;
    m.add_class::<optimizer::Optimizer>()?;
    m.add_class::<machines::Server>()?;
    m.add_class::<machines::Worker>()?;
    m.add_function(wrap_pyfunction!(tcp::run_worker, m)?)?;
    m.add_function(wrap_pyfunction!(serve::serve, m)?)?;
    m.add_function(wrap_pyfunction!(sim::compare, m)?)?;
    m.add_function(wrap_pyfunction!(sim::digits_split, m)?)?;
    m.add("PROTOCOLS", pyo3::types::PyTuple::new(m.py(), syncopate::ProtocolKind::NAMES)?)?;
    m.add_function(wrap_pyfunction!(sim::mnist5k_split, m)?)?;
    launch::register(m)?;
    // Timings are only meaningful from an optimised build; benchmarks check this first.
    m.add("BUILD", if cfg!(debug_assertions) { "debug" } else { "release" })?;
    m.add("RejectedError", m.py().get_type::<RejectedError>())?;
    m.add("WorkerError", m.py().get_type::<WorkerError>())?;
    Ok(())
}
