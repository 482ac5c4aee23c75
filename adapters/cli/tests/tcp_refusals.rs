//! Handshake refusals between `work` and `serve`: a worker that cannot run the server's
//! settings refuses them inside the handshake, exits 2 with one line naming why, and the
//! server logs the same reason.

mod procs;

use core::time::Duration;
use procs::{Proc, serve};

/// A `.npy` file of `n` float32 zeros in a fresh directory.
fn vector(name: &str, n: usize) -> String {
    let dir = std::env::temp_dir().join(format!("syncopate-refusals-{name}-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let mut header = format!("{{'descr': '<f4', 'fortran_order': False, 'shape': ({n},), }}");
    header.push('\n');
    let mut bytes = b"\x93NUMPY\x01\x00".to_vec();
    bytes.extend_from_slice(&(header.len() as u16).to_le_bytes());
    bytes.extend_from_slice(header.as_bytes());
    bytes.extend(core::iter::repeat_n(0u8, 4 * n));
    let path = dir.join("v.npy");
    std::fs::write(&path, bytes).unwrap();
    path.to_str().unwrap().to_owned()
}

#[test]
fn work_against_a_server_of_a_vector_exits_2_and_the_server_logs_why() {
    let init = vector("init", 10);
    let (server, addr) = serve(&["--init", &init, "--workers", "1", "--steps", "5"]);
    let mut worker = Proc::spawn(&["work", "--connect", &addr, "--id", "0"]);
    assert!(worker.wait_exit(Duration::from_secs(30)), "the worker gave up at once");
    let lines = worker.lines();
    let (code, _) = worker.finish(Duration::from_secs(5));
    assert_eq!(code, 2, "{lines:#?}");
    let last = lines.last().cloned().unwrap_or_default();
    assert!(last.contains("refusing the server's run") && last.contains("no built-in workload"), "{lines:#?}");
    assert_eq!(lines.iter().filter(|l| l.contains("no built-in workload")).count(), 1, "one line: {lines:#?}");
    server.wait_err("refused by peer: the server announced no built-in workload", Duration::from_secs(10));
}

#[test]
fn work_asking_for_another_wire_exits_2_naming_both_and_the_server_logs_it() {
    let (server, addr) = serve(&["--workers", "1", "--steps", "5", "--wire", "f32"]);
    let mut worker = Proc::spawn(&["work", "--connect", &addr, "--id", "0", "--wire", "bf16"]);
    assert!(worker.wait_exit(Duration::from_secs(30)), "the worker gave up at once");
    let lines = worker.lines();
    let (code, _) = worker.finish(Duration::from_secs(5));
    assert_eq!(code, 2, "{lines:#?}");
    let last = lines.last().cloned().unwrap_or_default();
    assert!(last.contains("worker asks for bf16, server speaks f32"), "{lines:#?}");
    server.wait_err("worker asks for bf16, server speaks f32 (worker 0)", Duration::from_secs(10));
}

#[test]
fn an_unknown_wire_is_a_usage_error() {
    for args in [&["serve", "--wire", "f16"][..], &["work", "--connect", "127.0.0.1:9", "--wire", "int8"]] {
        let mut p = Proc::spawn(args);
        assert!(p.wait_exit(Duration::from_secs(10)));
        let lines = p.lines();
        let (code, _) = p.finish(Duration::from_secs(5));
        assert_eq!(code, 2, "{args:?}: {lines:#?}");
        assert!(lines.iter().any(|l| l.contains("is not a wire encoding: give f32, bf16 or fp16")), "{lines:#?}");
    }
}

#[test]
fn work_in_bf16_trains_against_a_bf16_server() {
    let (server, addr) = serve(&["--workers", "1", "--steps", "20", "--wire", "bf16"]);
    let mut worker = Proc::spawn(&["work", "--connect", &addr, "--id", "0", "--wire", "bf16"]);
    assert!(worker.wait_exit(Duration::from_secs(60)), "the run ended");
    let lines = worker.lines();
    let (code, _) = worker.finish(Duration::from_secs(5));
    assert_eq!(code, 0, "{lines:#?}");
    let (code, _) = server.finish(Duration::from_secs(30));
    assert_eq!(code, 0, "the server ended its run");
}
