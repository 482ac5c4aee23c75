//! Why a simulation could not start.

use core::fmt;
use syncopate::ConfigError;

/// Why a simulation could not start.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub enum SimError {
    /// The protocol refused its configuration.
    Config(ConfigError),
    /// The batch size must be at least 1.
    BatchSize,
    /// A combination of settings the simulator does not support (named).
    Unsupported(&'static str),
}

impl fmt::Display for SimError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Self::Config(e) => write!(f, "invalid protocol configuration: {e}"),
            Self::BatchSize => f.write_str("batch size must be at least 1"),
            Self::Unsupported(what) => write!(f, "unsupported simulator setting: {what}"),
        }
    }
}

impl core::error::Error for SimError {}
