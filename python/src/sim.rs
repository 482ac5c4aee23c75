//! The simulator's `compare`, and the digits data set split as `syncopate serve` splits it.

use pyo3::exceptions::PyValueError;
use pyo3::prelude::*;
use pyo3::types::{PyBytes, PyDict};
use std::path::Path;
use syncopate_sim::compare as sim_compare;
use syncopate_sim::scenario::Scenario;
use syncopate_sim::workload::{ModelKind, Workload};

/// Runs `syncopate compare` on a scenario (a TOML file, TOML text, a preset name, or the
/// built-in default) and returns `{"scenario", "target_accuracy", "fastest", "rows"}`.
#[pyfunction]
#[pyo3(signature = (path = None, *, text = None, preset = None, jobs = 2))]
pub(crate) fn compare<'py>(
    py: Python<'py>,
    path: Option<&str>,
    text: Option<&str>,
    preset: Option<&str>,
    jobs: usize,
) -> PyResult<Bound<'py, PyDict>> {
    let scenario = match (path, text, preset) {
        (Some(p), None, None) => Scenario::load(Path::new(p)),
        (None, Some(t), None) => Scenario::parse(t, "<text>"),
        (None, None, Some(name)) => Scenario::preset(name)
            .unwrap_or_else(|| Err(format!("unknown preset '{name}': expected a file in adapters/scenarios"))),
        (None, None, None) => Ok(Scenario::default_scenario()),
        _ => Err("give at most one of path, text and preset".to_owned()),
    }
    .map_err(PyValueError::new_err)?;
    let result = py.allow_threads(|| sim_compare::run(&scenario, None, jobs.max(1), &|_| {}));
    let c = result.map_err(PyValueError::new_err)?;
    let rows = serde_json::to_string(&c.rows).map_err(|e| PyValueError::new_err(e.to_string()))?;
    let d = PyDict::new(py);
    d.set_item("scenario", &c.scenario)?;
    d.set_item("target_accuracy", c.target_accuracy)?;
    d.set_item("fastest", c.fastest().map(|r| r.label.clone()))?;
    d.set_item("rows", py.import("json")?.call_method1("loads", (rows,))?)?;
    Ok(d)
}

/// A data set's split: `(x_train_bytes, y_train, x_test_bytes, y_test, n_features, n_classes)`.
type Split<'py> = (Bound<'py, PyBytes>, Vec<u32>, Bound<'py, PyBytes>, Vec<u32>, usize, usize);

fn split<'py>(py: Python<'py>, w: &Workload) -> Split<'py> {
    let bytes = |xs: &[f32]| PyBytes::new(py, &xs.iter().flat_map(|x| x.to_le_bytes()).collect::<Vec<u8>>());
    (
        bytes(&w.train.features),
        w.train.labels.clone(),
        bytes(&w.test.features),
        w.test.labels.clone(),
        w.train.n_features,
        w.train.n_classes,
    )
}

/// The digits data set split 80/20 with `seed` exactly as `syncopate serve --seed SEED`
/// splits it: `(x_train_bytes, y_train, x_test_bytes, y_test, n_features, n_classes)`.
#[pyfunction]
#[pyo3(signature = (seed = 1))]
pub(crate) fn digits_split(py: Python<'_>, seed: u64) -> Split<'_> {
    split(py, &Workload::digits(ModelKind::Softmax, seed))
}

/// The built-in 5,000-image MNIST subset (grey levels scaled to 0..1) split 4,000/1,000 with
/// `seed` as the simulator's mnist5k workload splits it, in the layout of [`digits_split`].
#[pyfunction]
#[pyo3(signature = (seed = 1))]
pub(crate) fn mnist5k_split(py: Python<'_>, seed: u64) -> Split<'_> {
    split(py, &Workload::mnist5k(ModelKind::Softmax, seed))
}
