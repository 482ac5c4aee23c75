//! What the command-line tests share: run the `syncopate` binary, read its stdout, and a
//! scratch directory per test.

use std::path::PathBuf;
use std::process::{Command, Output};

/// Runs `syncopate` with `args`.
pub(crate) fn syncopate(args: &[&str]) -> Output {
    Command::new(env!("CARGO_BIN_EXE_syncopate")).args(args).output().expect("run syncopate")
}

/// The stdout of a run that must have succeeded.
pub(crate) fn stdout(out: &Output) -> String {
    assert!(out.status.success(), "exit {:?}: {}", out.status, String::from_utf8_lossy(&out.stderr));
    String::from_utf8_lossy(&out.stdout).into_owned()
}

/// A fresh directory named after the process, `group` and `name` (not every test binary
/// that shares this module needs one).
#[allow(dead_code, reason = "train_scale has no files")]
pub(crate) fn scratch(group: &str, name: &str) -> PathBuf {
    let dir = std::env::temp_dir().join(format!("syncopate-{group}-{}-{name}", std::process::id()));
    std::fs::create_dir_all(&dir).expect("temp dir");
    dir
}
