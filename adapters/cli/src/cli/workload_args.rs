//! The flags that choose a run's model, data and seed (`--model`, `--data`, `--batch-size`,
//! `--seed`), shared by `train`, `serve` and `work`.

use super::paths;
use crate::workload::limits::{MAX_BATCH_SIZE, check_hidden, check_params};
use clap::Args;
use std::path::PathBuf;

/// The model, the data and the randomness of a run.
#[derive(Clone, Debug, Args)]
pub struct WorkloadArgs {
    /// Model: softmax, mlp (32 hidden units), mlp:H (H from 1 to 4096), mlp2:H1:H2 (two
    /// hidden layers) or nqm:D (the noisy quadratic model over D coordinates, trained on its
    /// own noise; it has a loss but no accuracy).
    #[arg(long, default_value = "softmax", value_parser = parse_model)]
    pub model: crate::workload::ModelKind,
    /// Train on this file instead of the built-in digits data.
    #[arg(long, value_name = "FILE")]
    pub data: Option<PathBuf>,
    /// Format of --data: csv (label in the last column) or libsvm.
    #[arg(long, value_name = "FORMAT", default_value = "csv", requires = "data")]
    pub data_format: DataFormat,
    /// Minibatch size of one gradient (1 to 4096).
    #[arg(long, default_value_t = 32, value_parser = clap::value_parser!(u32).range(1..=i64::from(MAX_BATCH_SIZE)))]
    pub batch_size: u32,
    /// Seed of everything random (initial model, data split, minibatches, stragglers).
    #[arg(long, default_value_t = 1)]
    pub seed: u64,
}

/// A data file's format.
#[derive(Clone, Copy, Debug, PartialEq, Eq, clap::ValueEnum)]
pub enum DataFormat {
    /// Comma-separated numbers, the class label in the last column.
    Csv,
    /// `label index:value ...` lines, 1-based sparse indices.
    Libsvm,
}

impl WorkloadArgs {
    /// Loads the data and builds the workload (80/20 split with the seed).
    pub fn workload(&self) -> Result<crate::workload::Workload, String> {
        use crate::workload::{CsvOptions, Dataset, Workload};
        let data = match &self.data {
            None => return Ok(Workload::builtin(self.model, self.seed)),
            Some(_) if matches!(self.model, crate::workload::ModelKind::Nqm { .. }) => {
                return Err(format!(
                    "--model {} trains on its own noise data: --data does not apply to the noisy quadratic model",
                    self.model
                ));
            }
            Some(path) => {
                paths::input("--data", path)?;
                match self.data_format {
                    DataFormat::Csv => Dataset::from_csv_path(path, &CsvOptions::default()),
                    DataFormat::Libsvm => Dataset::from_libsvm_path(path),
                }
            }
        }
        .map_err(|e| e.to_string())?;
        let file = self.data.as_deref().unwrap_or_else(|| std::path::Path::new("?")).display();
        if data.len() < 2 || data.n_classes < 2 {
            return Err(format!("{file}: need at least 2 rows and 2 classes"));
        }
        check_params(self.model, data.n_features, data.n_classes).map_err(|e| format!("{file}: {e}"))?;
        let workload = Workload::new(data, self.model, TEST_FRACTION, self.seed);
        if workload.test.is_empty() || workload.train.is_empty() {
            return Err(format!(
                "{file}: {} rows leave no test rows (a fifth is held out to measure accuracy); need at least 5 rows",
                workload.test.len() + workload.train.len()
            ));
        }
        Ok(workload)
    }
}

/// The share of a data file's rows held out as the test set.
const TEST_FRACTION: f64 = 0.2;
/// Parses `--model`, refusing hidden layers beyond [`MAX_HIDDEN`](crate::workload::limits::MAX_HIDDEN).
pub fn parse_model(text: &str) -> Result<crate::workload::ModelKind, String> {
    let kind: crate::workload::ModelKind = text.parse().map_err(|e| format!("{e}"))?;
    check_hidden(kind)?;
    Ok(kind)
}
