//! How a subcommand fails, and so which exit code it ends with.

/// How a subcommand failed.
#[derive(Debug)]
pub enum Failure {
    /// Bad flags, values or input files (exit code 2).
    Usage(String),
    /// The run itself failed (exit code 1).
    Run(String),
}
