//! Runs the committed seed corpus of the `decode_msg` fuzz target through the target's own
//! checks (`fuzz/shared/decode_msg_check.rs`), so plain `cargo test` exercises it without
//! cargo-fuzz, and pins the seed files to the golden encodings.
//!
//! To rewrite the seed files after a deliberate wire change:
//! `SYNCOPATE_BLESS_CORPUS=1 cargo test -p syncopate-tests --test fuzz_corpus`.

#[path = "../../fuzz/shared/decode_msg_check.rs"]
mod decode_msg_check;

use std::fs;
use std::path::PathBuf;
use syncopate::wire::{self, Limits};
use syncopate::{Scalar, ToServer, ToWorker, Values, Version};

fn corpus_dir() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../fuzz/corpus/decode_msg")
}

fn enc_server<T: Scalar>(msg: ToServer<'_, T>) -> Vec<u8> {
    let mut buf = vec![0u8; wire::encoded_len_to_server(&msg)];
    let n = wire::encode_to_server(&msg, &mut buf).expect("encode");
    buf.truncate(n);
    buf
}

fn enc_worker<T: Scalar>(msg: ToWorker<'_, T>) -> Vec<u8> {
    let mut buf = vec![0u8; wire::encoded_len_to_worker(&msg)];
    let n = wire::encode_to_worker(&msg, &mut buf).expect("encode");
    buf.truncate(n);
    buf
}

/// The seed files: one or more per message kind, both scalar types.
fn seeds() -> Vec<(&'static str, Vec<u8>)> {
    let m = u64::MAX;
    vec![
        ("join_f32", enc_server::<f32>(ToServer::Join { epoch: 7 })),
        ("join_max_f64", enc_server::<f64>(ToServer::Join { epoch: u32::MAX })),
        (
            "grad_f32",
            enc_server(ToServer::Grad {
                base: Version(300),
                iteration: 5,
                seq: 1,
                values: Values::Slice(&[1.0f32, -2.0]),
                loss: Some(0.5),
            }),
        ),
        (
            "grad_f64",
            enc_server(ToServer::Grad {
                base: Version(300),
                iteration: 5,
                seq: 1,
                values: Values::Slice(&[1.0f64, -2.0]),
                loss: None,
            }),
        ),
        (
            "grad_max_fields_f32",
            enc_server(ToServer::Grad {
                base: Version(m),
                iteration: m,
                seq: m,
                values: Values::Slice(&[f32::NAN]),
                loss: Some(f32::NAN),
            }),
        ),
        (
            "delta_f32",
            enc_server(ToServer::Delta {
                round: Version(2),
                local_steps: 128,
                seq: 9,
                values: Values::Slice(&[0.5f32]),
                loss: None,
            }),
        ),
        ("pull_f32", enc_server::<f32>(ToServer::Pull { have: Version(4), min_clock: 0 })),
        (
            "clock_f64",
            enc_server(ToServer::Clock { clock: 16384, seq: 3, values: Values::Slice(&[0.25f64]), loss: None }),
        ),
        ("leave_f32", enc_server::<f32>(ToServer::Leave)),
        ("model_f32", enc_worker(ToWorker::Model { version: Version(1), clock: 1, values: Values::Slice(&[3.0f32]) })),
        (
            "model_f64",
            enc_worker(ToWorker::Model {
                version: Version(9),
                clock: 9,
                values: Values::Slice(&[3.0f64, -0.0, 1e300]),
            }),
        ),
        (
            "model_empty_f64",
            enc_worker(ToWorker::Model { version: Version(0), clock: 0, values: Values::<f64>::Slice(&[]) }),
        ),
        ("not_newer_f32", enc_worker::<f32>(ToWorker::NotNewer { version: Version(127) })),
        ("push_ack_f32", enc_worker::<f32>(ToWorker::PushAck { round: Version(5), pull_now: true })),
        ("abort_f64", enc_worker::<f64>(ToWorker::Abort { iteration: 42 })),
        ("stop_f64", enc_worker::<f64>(ToWorker::Stop)),
        (
            "grad_bf16",
            enc_server_as(
                ToServer::Grad {
                    base: Version(300),
                    iteration: 5,
                    seq: 1,
                    values: Values::Slice(&[1.0f32, -2.0, 0.1]),
                    loss: Some(0.5),
                },
                wire::Encoding::Bf16,
            ),
        ),
        (
            "model_fp16",
            enc_worker_as(
                ToWorker::Model { version: Version(9), clock: 9, values: Values::Slice(&[3.0f32, -0.0, 65_504.0]) },
                wire::Encoding::Fp16,
            ),
        ),
    ]
}

fn enc_server_as(msg: ToServer<'_, f32>, enc: wire::Encoding) -> Vec<u8> {
    let mut buf = vec![0u8; wire::encoded_len_to_server_as(&msg, enc)];
    let n = wire::encode_to_server_as(&msg, enc, &mut buf).unwrap();
    buf.truncate(n);
    buf
}

fn enc_worker_as(msg: ToWorker<'_, f32>, enc: wire::Encoding) -> Vec<u8> {
    let mut buf = vec![0u8; wire::encoded_len_to_worker_as(&msg, enc)];
    let n = wire::encode_to_worker_as(&msg, enc, &mut buf).unwrap();
    buf.truncate(n);
    buf
}

#[test]
fn seed_corpus_is_the_golden_encodings() {
    let dir = corpus_dir();
    let bless = std::env::var_os("SYNCOPATE_BLESS_CORPUS").is_some();
    if bless {
        fs::create_dir_all(&dir).expect("create corpus dir");
    }
    for (name, bytes) in seeds() {
        let path = dir.join(name);
        if bless {
            fs::write(&path, &bytes).expect("write seed");
        }
        let on_disk = fs::read(&path).unwrap_or_else(|e| panic!("{}: {e} (bless to create it)", path.display()));
        assert_eq!(on_disk, bytes, "{name}: seed file differs from the current encoding");
        // Every seed is a valid message, accepted at least under the loose limits.
        assert!(decode_msg_check::check(&bytes) > 0, "{name}: seed not accepted");
    }
}

#[test]
fn every_corpus_file_passes_the_fuzz_checks() {
    let mut files: Vec<PathBuf> = fs::read_dir(corpus_dir())
        .expect("fuzz/corpus/decode_msg exists")
        .map(|e| e.expect("dir entry").path())
        .filter(|p| p.is_file())
        .collect();
    files.sort();
    assert!(files.len() >= seeds().len(), "corpus has {} files", files.len());
    let mut accepted = 0;
    for path in &files {
        let data = fs::read(path).expect("read corpus file");
        // Panics (with the file name in the report) on any violation.
        let result = std::panic::catch_unwind(|| decode_msg_check::check(&data));
        match result {
            Ok(n) => accepted += usize::from(n > 0),
            Err(_) => panic!("{}: fuzz check failed", path.display()),
        }
    }
    assert!(accepted >= seeds().len());
}

#[test]
fn check_refuses_nothing_it_should_accept_and_accepts_nothing_invalid() {
    // The shared check is not vacuous: a valid seed is accepted under the loose limits only
    // when its tensor is larger than the tight limit, and a corrupted one is accepted nowhere.
    let bytes = enc_server(ToServer::Grad {
        base: Version(1),
        iteration: 1,
        seq: 1,
        values: Values::Slice(&[1.0f32, 2.0, 3.0]),
        loss: None,
    });
    // f32 decoders with the two looser limits accept it; f64 and the 1-element limit do not.
    assert_eq!(decode_msg_check::check(&bytes), 2);
    assert!(wire::decode_to_server::<f32>(&bytes, &Limits::for_model(1)).is_err());
    let mut bad = bytes.clone();
    bad[0] = b'X';
    assert_eq!(decode_msg_check::check(&bad), 0);
    let mut long = bytes;
    long.push(0);
    assert_eq!(decode_msg_check::check(&long), 0);
}
