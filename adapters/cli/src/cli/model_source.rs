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

use super::serve::ServeArgs;
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
    /// The source the flags name. Flags that do not apply to it are refused by clap
    /// (`conflicts_with`); a bad file is refused here, naming the file and the reason.
    pub(super) fn from_args(args: &ServeArgs) -> Result<Self, String> {
        if let Some(path) = &args.init {
            let params = super::npy::read_vector(path)?;
            if params.len() as u64 > crate::tcp::settings::MAX_DIM {
                return Err(format!(
                    "{}: {} parameters, at most {} fit a frame",
                    path.display(),
                    params.len(),
                    crate::tcp::settings::MAX_DIM
                ));
            }
            return Ok(Self::File { path: path.clone(), params });
        }
        if args.init_from_worker {
            let dim =
                args.dim.ok_or("--init-from-worker needs --dim N (the number of parameters of worker 0's model)")?;
            let dim = usize::try_from(dim).map_err(|_| format!("--dim {dim} is too large for this machine"))?;
            return Ok(Self::Worker { dim });
        }
        Ok(Self::Builtin(Box::new(args.workload.workload()?)))
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

    /// The model's name in the summary: the built-in model's, or where the vector came from.
    pub(super) fn name(&self, builtin: String) -> String {
        match self {
            Self::Builtin(_) => builtin,
            Self::File { path, .. } => format!("vector from {}", path.display()),
            Self::Worker { .. } => "vector from worker 0".into(),
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
