//! A launcher's environment (`torchrun`, `mpirun`, `srun`) as the transport's `launcher`
//! reads it for `syncopate work`: the same variables, the same order, the same errors.

use pyo3::exceptions::PyValueError;
use pyo3::prelude::*;
use syncopate_transport::launcher::{self, FromEnv};

fn value_error(e: String) -> PyErr {
    PyValueError::new_err(e)
}

/// The launcher's rank, if a launcher set one.
pub(crate) fn rank() -> PyResult<Option<FromEnv<u32>>> {
    launcher::rank(&launcher::env).map_err(value_error)
}

/// The launcher's world size, if a launcher set one.
pub(crate) fn world_size() -> PyResult<Option<FromEnv<u32>>> {
    launcher::world_size(&launcher::env).map_err(value_error)
}

/// The worker id: `id` if given, else the launcher's rank, else an error naming the variables.
pub(crate) fn worker_id(id: Option<u32>) -> PyResult<u32> {
    if let Some(id) = id {
        return Ok(id);
    }
    rank()?.map(|r| r.value).ok_or_else(|| {
        PyValueError::new_err(format!("no worker id: pass id= or set one of ${}", launcher::RANK_VARIABLES.join(", $")))
    })
}

/// The server's address: `connect` if given, else `MASTER_ADDR:MASTER_PORT`.
pub(crate) fn server_address(connect: Option<&str>) -> PyResult<String> {
    if let Some(addr) = connect {
        return Ok(addr.to_owned());
    }
    launcher::server_address(&launcher::env).map_err(value_error)?.ok_or_else(|| {
        PyValueError::new_err("no server address: pass connect= ('HOST:PORT') or set $MASTER_ADDR and $MASTER_PORT")
    })
}

/// The worker count of a protocol: `workers` if given, else the launcher's world size.
pub(crate) fn workers(workers: Option<u32>) -> PyResult<u32> {
    if let Some(n) = workers {
        return Ok(n);
    }
    world_size()?.map(|w| w.value).ok_or_else(|| {
        PyValueError::new_err(format!(
            "no worker count: pass workers= or run under a launcher that sets one of ${}",
            launcher::WORLD_SIZE_VARIABLES.join(", $")
        ))
    })
}

/// `(rank, variable)` from the launcher's environment, or `None` outside a launcher.
#[pyfunction]
pub(crate) fn rank_from_env() -> PyResult<Option<(u32, &'static str)>> {
    Ok(rank()?.map(|r| (r.value, r.variable)))
}

/// `(world size, variable)` from the launcher's environment, or `None` outside a launcher.
#[pyfunction]
pub(crate) fn world_size_from_env() -> PyResult<Option<(u32, &'static str)>> {
    Ok(world_size()?.map(|w| (w.value, w.variable)))
}

/// `MASTER_ADDR:MASTER_PORT`, or `None` unless both are set.
#[pyfunction]
pub(crate) fn server_address_from_env() -> PyResult<Option<String>> {
    launcher::server_address(&launcher::env).map_err(value_error)
}

/// Adds the functions and the variable lists to the module.
pub(crate) fn register(m: &Bound<'_, PyModule>) -> PyResult<()> {
    m.add_function(wrap_pyfunction!(rank_from_env, m)?)?;
    m.add_function(wrap_pyfunction!(world_size_from_env, m)?)?;
    m.add_function(wrap_pyfunction!(server_address_from_env, m)?)?;
    m.add("RANK_VARIABLES", pyo3::types::PyTuple::new(m.py(), launcher::RANK_VARIABLES)?)?;
    m.add("WORLD_SIZE_VARIABLES", pyo3::types::PyTuple::new(m.py(), launcher::WORLD_SIZE_VARIABLES)?)?;
    Ok(())
}
