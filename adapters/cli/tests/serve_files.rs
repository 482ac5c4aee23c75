//! `syncopate serve` and the files it reads and writes: every output is checked before the
//! run (writable, no device or FIFO replaced, no two flags naming one file), every input is
//! a regular file read no further than its header announces, and the summary of a vector
//! of the user's own says only what it knows.

#![cfg(unix)]

mod procs;

use core::time::Duration;
use procs::{Proc, json, serve, work};
use std::os::unix::fs::{FileTypeExt as _, symlink};
use std::path::{Path, PathBuf};

fn scratch(name: &str) -> PathBuf {
    let dir = std::env::temp_dir().join(format!("syncopate-serve-files-{}-{name}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).expect("temp dir");
    dir
}

fn s(p: &Path) -> &str {
    p.to_str().expect("UTF-8 path")
}

fn mkfifo(path: &Path) {
    assert!(std::process::Command::new("mkfifo").arg(path).status().expect("mkfifo").success());
}

/// A `.npy` file of three float32 values.
fn vector(dir: &Path) -> PathBuf {
    let path = dir.join("v.npy");
    let header = "{'descr': '<f4', 'fortran_order': False, 'shape': (3,), }";
    let mut bytes = b"\x93NUMPY\x01\x00".to_vec();
    let padded = format!("{header}{}\n", " ".repeat((64 - (10 + header.len() + 1) % 64) % 64));
    bytes.extend_from_slice(&u16::try_from(padded.len()).unwrap().to_le_bytes());
    bytes.extend_from_slice(padded.as_bytes());
    for v in [1.0f32, 2.0, 3.0] {
        bytes.extend_from_slice(&v.to_le_bytes());
    }
    std::fs::write(&path, bytes).unwrap();
    path
}

/// Runs `serve` with `args` (bounded: a hang fails the test); asserts exit code 2 and one
/// line on stderr holding every needle.
fn refused(args: &[&str], needles: &[&str]) {
    let all = [&["serve", "--listen", "127.0.0.1:0", "--time-limit", "60"][..], args].concat();
    refused_command(&all, needles);
}

fn refused_command(all: &[&str], needles: &[&str]) {
    let mut p = Proc::spawn(all);
    assert!(p.wait_exit(Duration::from_secs(20)), "{all:?} still running after 20 s: {:#?}", p.lines());
    let lines = p.lines();
    let (code, out) = p.finish(Duration::from_secs(5));
    assert_eq!(code, 2, "{all:?}: {lines:#?}");
    assert_eq!(lines.len(), 1, "{all:?}: not one line: {lines:#?}");
    for needle in needles {
        assert!(lines[0].contains(needle), "{all:?}: '{needle}' missing from: {}", lines[0]);
    }
    assert!(out.is_empty(), "{all:?}: printed to stdout on a refusal: {out}");
}

#[test]
fn an_output_that_cannot_be_written_is_refused_before_training() {
    let dir = scratch("outputs");
    let missing = dir.join("no/such/f.npy");
    refused(&["--save", s(&missing)], &["--save", "no/such does not exist"]);
    refused(&["--save", s(&dir)], &["--save", "a directory, not a regular file"]);
    let fifo = dir.join("fifo");
    mkfifo(&fifo);
    refused(&["--checkpoint", s(&fifo)], &["--checkpoint", "a FIFO, not a regular file: refusing to replace it"]);
    assert!(std::fs::symlink_metadata(&fifo).unwrap().file_type().is_fifo(), "the FIFO is left as it was");
    refused(&["--record-trace", s(&fifo)], &["--record-trace", "not a regular file: refusing to write it"]);
    let to_null = dir.join("null.npy");
    symlink("/dev/null", &to_null).unwrap();
    refused(&["--save", s(&to_null)], &["a symbolic link to a character device (/dev/null)"]);
    assert!(std::fs::metadata("/dev/null").unwrap().file_type().is_char_device());
    // A device node of our own, where this test may make one (root): never replaced.
    let node = dir.join("node");
    let made = std::process::Command::new("mknod").arg(&node).args(["c", "1", "3"]).status();
    if made.is_ok_and(|st| st.success()) {
        refused(&["--save", s(&node)], &["a character device, not a regular file"]);
        assert!(std::fs::symlink_metadata(&node).unwrap().file_type().is_char_device(), "the node stays a device");
    }
    std::fs::remove_dir_all(&dir).unwrap();
}

#[test]
fn two_flags_naming_one_file_are_a_usage_error_naming_both() {
    let dir = scratch("collide");
    let ckpt = dir.join("c.ckpt");
    refused(&["--save", s(&ckpt), "--checkpoint", s(&ckpt)], &["--checkpoint and --save name the same file"]);
    let npy = dir.join("s.npy");
    let other = dir.join(".").join("s.npy");
    refused(&["--save", s(&npy), "--record-trace", s(&other)], &["--save and --record-trace name the same file"]);
    assert!(!npy.exists(), "nothing created");
    std::fs::remove_dir_all(&dir).unwrap();
}

#[test]
fn a_device_or_a_fifo_as_input_is_refused_without_reading_or_blocking() {
    let dir = scratch("inputs");
    let fifo = dir.join("f.npy");
    mkfifo(&fifo);
    refused(&["--init", "/dev/zero"], &["/dev/zero", "a character device, not a regular file"]);
    refused(&["--init", s(&fifo)], &["a FIFO, not a regular file"]);
    refused(&["--resume", "--checkpoint", "/dev/zero"], &["--checkpoint /dev/zero", "a character device"]);
    refused_command(&["advise", "--trace", "/dev/zero"], &["--trace /dev/zero", "a character device"]);
    refused_command(&["advise", "--trace", s(&fifo)], &["a FIFO, not a regular file"]);
    std::fs::remove_dir_all(&dir).unwrap();
}

#[test]
fn a_vector_s_size_comes_from_its_file_and_its_header_must_be_numpy_s() {
    let dir = scratch("npy");
    let v = vector(&dir);
    refused(&["--init", s(&v), "--dim", "10"], &["--dim 10 does not apply to --init", "3 parameters"]);
    let bad = dir.join("bad.npy");
    let header = "{'descr': '<f4', 'fortran_order': False, 'shape': (3), }\n";
    let mut bytes = b"\x93NUMPY\x01\x00".to_vec();
    bytes.extend_from_slice(&u16::try_from(header.len()).unwrap().to_le_bytes());
    bytes.extend_from_slice(header.as_bytes());
    bytes.extend_from_slice(&[0u8; 12]);
    std::fs::write(&bad, bytes).unwrap();
    refused(&["--init", s(&bad)], &["'shape' (3) is not a tuple"]);
    std::fs::remove_dir_all(&dir).unwrap();
}

#[test]
fn flag_errors_name_the_flag_that_was_given() {
    let mut p = Proc::spawn(&["serve", "--staleness", "3"]);
    assert!(p.wait_exit(Duration::from_secs(20)));
    let lines = p.lines();
    assert!(lines.len() == 1 && lines[0].contains("staleness"), "{lines:#?}");
    assert!(!lines[0].contains("--remote-groups"), "blames a flag not given: {}", lines[0]);
    refused(&["--shard", "-1/2"], &["'-1/2' for '--shard'"]);
    let mut p = Proc::spawn(&["serve", "--bogus"]);
    assert!(p.wait_exit(Duration::from_secs(20)));
    let lines = p.lines();
    assert!(lines.len() == 1 && lines[0].contains("'--bogus'"), "{lines:#?}");
    assert!(!lines[0].contains("--groups"), "suggests an unrelated flag: {}", lines[0]);
}

#[test]
fn a_vector_run_that_never_started_keeps_the_saved_file_and_reports_no_accuracy() {
    let dir = scratch("vector");
    let v = vector(&dir);
    let saved = dir.join("s.npy");
    std::fs::write(&saved, b"an earlier run's model").unwrap();
    let (p, _) = serve(&["--init", s(&v), "--workers", "1", "--save", s(&saved), "--time-limit", "0.3", "--json"]);
    let (code, out) = p.finish(Duration::from_secs(30));
    assert_eq!(code, 0, "{out}");
    assert_eq!(std::fs::read(&saved).unwrap(), b"an earlier run's model", "--save overwritten by an untrained run");
    let summary = json(&out);
    for key in ["final_accuracy", "final_loss", "target_accuracy", "seed"] {
        assert!(summary[key].is_null(), "{key} should be null without a test set: {summary}");
    }
    assert_eq!(summary["momentum"].as_f64(), Some(0.0), "{summary}");
    let (p, _) = serve(&["--init", s(&v), "--workers", "1", "--momentum", "0.5", "--time-limit", "0.3"]);
    let banner = p.wait_err("listening on", Duration::from_secs(10));
    assert!(banner.contains("with 1 worker,") && banner.contains("momentum 0.5"), "{banner}");
    let (_, out) = p.finish(Duration::from_secs(30));
    let head = out.lines().next().unwrap_or_default();
    assert!(head.contains(", 1 worker,") && head.contains("momentum 0.5") && !head.contains("seed"), "{out}");
    std::fs::remove_dir_all(&dir).unwrap();
}

#[test]
fn a_resumed_vector_is_named_by_its_checkpoint() {
    let dir = scratch("resume");
    let v = vector(&dir);
    let ckpt = dir.join("c.ckpt");
    let (p, _) = serve(&["--init", s(&v), "--workers", "1", "--checkpoint", s(&ckpt), "--time-limit", "0.3"]);
    p.finish(Duration::from_secs(30));
    assert!(ckpt.exists(), "the checkpoint was written");
    let (p, _) = serve(&[
        "--init-from-worker",
        "--dim",
        "3",
        "--workers",
        "1",
        "--checkpoint",
        s(&ckpt),
        "--resume",
        "--time-limit",
        "0.3",
    ]);
    let banner = p.wait_err("listening on", Duration::from_secs(10));
    assert!(banner.contains("vector from checkpoint") && !banner.contains("worker 0"), "{banner}");
    p.finish(Duration::from_secs(30));
    std::fs::remove_dir_all(&dir).unwrap();
}

#[test]
fn built_in_models_are_named_as_flags_take_them_and_nqm_progress_has_no_accuracy() {
    let (p, addr) = serve(&["--model", "nqm:10", "--workers", "1", "--steps", "200", "--lr", "0.05"]);
    let banner = p.wait_err("listening on", Duration::from_secs(10));
    assert!(banner.contains("nqm:10 (10 params)"), "{banner}");
    let w = work(&addr, 0, &[]);
    let line = p.wait_err("serve: version ", Duration::from_secs(60));
    assert!(line.contains("test loss") && !line.contains("accuracy"), "{line}");
    let (code, _) = p.finish(Duration::from_secs(60));
    assert_eq!(code, 0);
    drop(w);
    let (p, _) = serve(&["--model", "mlp", "--workers", "1", "--time-limit", "0.2"]);
    let banner = p.wait_err("listening on", Duration::from_secs(10));
    assert!(banner.contains(", mlp:32 (") && !banner.contains('{'), "{banner}");
}
