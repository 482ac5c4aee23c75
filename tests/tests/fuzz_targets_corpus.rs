//! Replays the committed seed corpora of the `server_ops`, `worker_ops` and `sim_schedule`
//! fuzz targets through the targets' own checks (`fuzz/shared/*_check.rs`), so plain
//! `cargo test` exercises them without cargo-fuzz.

#[path = "../../fuzz/shared/bytes.rs"]
mod bytes;
#[path = "../../fuzz/shared/server_ops_check.rs"]
mod server_ops_check;
#[path = "../../fuzz/shared/sim_schedule_check.rs"]
mod sim_schedule_check;
#[path = "../../fuzz/shared/worker_ops_check.rs"]
mod worker_ops_check;

use std::fs;
use std::path::PathBuf;

/// The corpus files of `target`, sorted by name; at least one.
fn corpus(target: &str) -> Vec<(String, Vec<u8>)> {
    let dir = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../fuzz/corpus").join(target);
    let mut files: Vec<_> = fs::read_dir(&dir)
        .unwrap_or_else(|e| panic!("{}: {e}", dir.display()))
        .map(|e| e.expect("dir entry").path())
        .filter(|p| p.is_file())
        .map(|p| (p.file_name().unwrap_or_default().to_string_lossy().into_owned(), fs::read(&p).expect("read")))
        .collect();
    files.sort();
    assert!(!files.is_empty(), "no corpus for {target}");
    files
}

#[test]
fn server_ops_corpus() {
    let files = corpus("server_ops");
    let ops: usize = files.iter().map(|(_, data)| server_ops_check::check(data)).sum();
    println!("server_ops: {} files, {ops} operations", files.len());
    assert!(ops > 0);
}

#[test]
fn worker_ops_corpus() {
    let files = corpus("worker_ops");
    let ops: usize = files.iter().map(|(_, data)| worker_ops_check::check(data)).sum();
    println!("worker_ops: {} files, {ops} operations", files.len());
    assert!(ops > 0);
}

#[test]
fn sim_schedule_corpus() {
    let files = corpus("sim_schedule");
    let steps: u64 = files.iter().map(|(_, data)| sim_schedule_check::check(data)).sum();
    println!("sim_schedule: {} files, {steps} simulated events", files.len());
    assert!(steps > 0);
}
