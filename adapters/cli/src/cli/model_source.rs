//! Where `syncopate serve`'s model comes from, and where the final one goes.
//!
//! - A built-in workload (`--model`, `--data`): the server knows the model, initialises it
//!   from the seed and measures its test accuracy; `syncopate work` computes its gradients.
//! - A NumPy file (`--init FILE.npy`): any flat float32 vector; the workers are the
//!   application's own (Python `run_worker`, `syncopate.torch.train_worker`, the Rust
//!   `WorkerJob`). There is no test set: progress is the training-loss curve the workers
//!   report (`--target-loss`).
//! - Worker 0 (`--init-from-worker --dim N`): the same, with the initial vector sent by
//!   worker 0 right after its handshake.
//!
//! `--save FILE.npy` writes the final parameters, atomically, whatever the source.

use super::workload_args::WorkloadArgs;
use crate::workload::Workload;
use std::path::{Path, PathBuf};

/// The model a server trains.
pub(super) enum ModelSource {
    /// A built-in model and data.
    Builtin(Box<Workload>),
    /// A vector from a `.npy` file.
    File {
        /// The file.
        path: PathBuf,
        /// Its parameters.
        params: Vec<f32>,
    },
    /// Worker 0 sends the vector.
    Worker {
        /// The model's size.
        dim: usize,
    },
}

impl ModelSource {
    /// The source the flags name: `--init FILE`, `--init-from-worker` with `--dim N`, or the
    /// built-in `workload`. Flags that do not apply to it are refused by clap
    /// (`conflicts_with`); a bad file, a `--dim` beside `--init` and a size the memory
    /// cannot hold are refused here, naming the flag or file and the reason.
    pub(super) fn from_flags(
        init: Option<&Path>,
        init_from_worker: bool,
        dim: Option<u64>,
        workload: &WorkloadArgs,
    ) -> Result<Self, String> {
        if let Some(path) = init {
            let params = super::npy::read_vector(path)?;
            if let Some(dim) = dim {
                return Err(format!(
                    "--dim {dim} does not apply to --init {}: the file gives the size ({} parameters)",
                    path.display(),
                    params.len()
                ));
            }
            if params.len() as u64 > crate::tcp::settings::MAX_DIM {
                return Err(format!(
                    "{}: {} parameters, at most {} fit a frame",
                    path.display(),
                    params.len(),
                    crate::tcp::settings::MAX_DIM
                ));
            }
            return Ok(Self::File { path: path.to_owned(), params });
        }
        if init_from_worker {
            let dim = dim.ok_or("--init-from-worker needs --dim N (the number of parameters of worker 0's model)")?;
            let dim = usize::try_from(dim).map_err(|_| format!("--dim {dim} is too large for this machine"))?;
            super::values::check_server_memory(dim, super::values::mem_available())?;
            return Ok(Self::Worker { dim });
        }
        Ok(Self::Builtin(Box::new(workload.workload()?)))
    }

    /// The number of parameters.
    pub(super) fn dim(&self) -> usize {
        match self {
            Self::Builtin(w) => w.model.dim(),
            Self::File { params, .. } => params.len(),
            Self::Worker { dim } => *dim,
        }
    }

    /// The built-in workload, if the model is one (it has a test set).
    pub(super) fn workload(&self) -> Option<&Workload> {
        match self {
            Self::Builtin(w) => Some(w),
            _ => None,
        }
    }

    /// The model's name in the summary: the built-in model's, or where the vector came from
    /// (`resumed`: the checkpoint it was read from, which replaces the file's or worker 0's).
    pub(super) fn name(&self, builtin: String, resumed: Option<&Path>) -> String {
        match (self, resumed) {
            (Self::Builtin(_), _) => builtin,
            (_, Some(checkpoint)) => format!("vector from checkpoint {}", checkpoint.display()),
            (Self::File { path, .. }, None) => format!("vector from {}", path.display()),
            (Self::Worker { .. }, None) => "vector from worker 0".into(),
        }
    }

    /// The initial parameters of a fresh run, or `None` when worker 0 sends them.
    pub(super) fn initial_params(&self, seed: u64) -> Option<Vec<f32>> {
        match self {
            Self::Builtin(w) => {
                let mut p = vec![0.0f32; w.model.dim()];
                w.model.init(seed, &mut p);
                Some(p)
            }
            Self::File { params, .. } => Some(params.clone()),
            Self::Worker { .. } => None,
        }
    }
}

/// Writes the final parameters to `path` (`--save`), atomically. A run that never had a
/// model (worker 0 never sent it) writes nothing and says so.
pub(super) fn save(path: &Path, params: &[f32], known: bool) -> Result<(), String> {
    if !known {
        return Err(format!(
            "--save {}: nothing written: worker 0 never sent the initial parameters, so there is no model",
            path.display()
        ));
    }
    super::npy::write_vector(path, params)?;
    eprintln!("serve: saved the final parameters ({}) to {}", params.len(), path.display());
    Ok(())
}
