//! Bounds on every size a command line or scenario file can ask for, checked before
//! anything is allocated.

/// The largest minibatch (`--batch-size`, a scenario's `batch_size`).
pub const MAX_BATCH_SIZE: u32 = 4096;
/// The largest hidden layer of `mlp:H`.
pub const MAX_HIDDEN: usize = 4096;
/// The most parameters a model may have (16 M, 64 MB per copy; every worker holds copies).
pub const MAX_PARAMS: usize = 16 << 20;

/// Refuses hidden layers above [`MAX_HIDDEN`] and quadratic models above [`MAX_PARAMS`].
pub fn check_hidden(kind: super::ModelKind) -> Result<(), String> {
    match kind {
        super::ModelKind::Mlp { hidden } if hidden > MAX_HIDDEN => {
            Err(format!("mlp:{hidden} has too many hidden units: at most {MAX_HIDDEN}"))
        }
        super::ModelKind::Mlp2 { hidden1, hidden2 } if hidden1.max(hidden2) > MAX_HIDDEN => {
            Err(format!("mlp2:{hidden1}:{hidden2} has too many hidden units: at most {MAX_HIDDEN} per layer"))
        }
        super::ModelKind::Nqm { dim } if dim > MAX_PARAMS => {
            Err(format!("nqm:{dim} has too many dimensions: at most {MAX_PARAMS}"))
        }
        _ => Ok(()),
    }
}

/// Refuses a model that would have more than [`MAX_PARAMS`] parameters on this data.
pub fn check_params(kind: super::ModelKind, features: usize, classes: usize) -> Result<(), String> {
    check_hidden(kind)?;
    let params = super::Model::new(kind, features.max(1), classes.max(1)).dim();
    if params > MAX_PARAMS {
        return Err(format!("the model would have {params} parameters ({features} features): at most {MAX_PARAMS}"));
    }
    Ok(())
}
