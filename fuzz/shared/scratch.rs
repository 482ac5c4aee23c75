//! A scratch folder for the checks of parsers that read a file by its path (journals, shard
//! records, traces): one per process and target, under the system's temporary folder, so
//! that parallel tests and fuzz jobs never share a file.

use std::path::PathBuf;

/// The scratch folder of `target` in this process (created if missing).
pub(crate) fn dir(target: &str) -> PathBuf {
    let d = std::env::temp_dir().join(format!("syncopate-fuzz-{}-{target}", std::process::id()));
    if let Err(e) = std::fs::create_dir_all(&d) {
        panic!("cannot create the scratch folder {}: {e}", d.display());
    }
    d
}

/// Writes `data` to `path`; a failure is the harness's, not the parser's.
pub(crate) fn write(path: &std::path::Path, data: &[u8]) {
    if let Err(e) = std::fs::write(path, data) {
        panic!("cannot write the scratch file {}: {e}", path.display());
    }
}
