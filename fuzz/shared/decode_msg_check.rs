//! The checks of the `decode_msg` fuzz target, shared with `tests/tests/fuzz_corpus.rs`
//! (which includes this file with `#[path]`) so that plain `cargo test` runs the committed
//! corpus through exactly what the fuzzer checks.
//!
//! For every input: decoding as `ToServer` and `ToWorker`, `f32` and `f64`, under tight and
//! loose limits, and peeking at the header, must not panic. Whatever is accepted must be
//! canonical: re-encoding gives back the input byte for byte, and decoding that again gives
//! the same message. Widening as each 16-bit encoding (`bf16`, `fp16`) must not panic either;
//! what widens is an `f32` message of the same kind with as many elements, and when it
//! decodes and holds only values finite in the encoding, narrowing it again gives back the
//! input byte for byte.

use syncopate::wire::{self, Encoding, Limits};
use syncopate::{Scalar, ToServer, ToWorker, Values};

/// Tight limits (smaller than most seeds' tensors) and loose ones.
const LIMITS: [Limits; 3] = [Limits::for_model(1), Limits::for_model(4096), Limits::for_model(usize::MAX)];

/// Runs every check on `data`; panics on a violation. Returns how many decodings
/// (direction x scalar x limits) accepted the input.
pub(crate) fn check(data: &[u8]) -> usize {
    let header = wire::peek_header(data);
    let mut accepted = 0;
    for limits in &LIMITS {
        accepted += check_scalar::<f32>(data, limits) + check_scalar::<f64>(data, limits);
        for enc in [Encoding::Bf16, Encoding::Fp16] {
            accepted += check_widened(data, enc, limits);
        }
    }
    if accepted > 0 {
        // An accepted message has a valid header that announces exactly its length.
        let h = header.expect("accepted a message whose header peek_header refuses");
        assert_eq!(h.message_len(), data.len());
    }
    accepted
}

fn check_scalar<T: Scalar>(data: &[u8], limits: &Limits) -> usize {
    let mut accepted = 0;
    if let Ok(msg) = wire::decode_to_server::<T>(data, limits) {
        accepted += 1;
        assert_eq!(wire::encoded_len_to_server(&msg), data.len());
        let mut buf = vec![0u8; data.len()];
        assert_eq!(wire::encode_to_server(&msg, &mut buf), Ok(data.len()));
        assert_eq!(buf, data, "re-encoding a decoded message changed its bytes");
        let again = wire::decode_to_server::<T>(&buf, limits).expect("re-encoded message refused");
        assert_eq!(server_fields(&again), server_fields(&msg));
        assert!(matches!(wire::decode_to_worker::<T>(data, limits), Err(wire::DecodeError::WrongDirection)));
    }
    if let Ok(msg) = wire::decode_to_worker::<T>(data, limits) {
        accepted += 1;
        assert_eq!(wire::encoded_len_to_worker(&msg), data.len());
        let mut buf = vec![0u8; data.len()];
        assert_eq!(wire::encode_to_worker(&msg, &mut buf), Ok(data.len()));
        assert_eq!(buf, data, "re-encoding a decoded message changed its bytes");
        let again = wire::decode_to_worker::<T>(&buf, limits).expect("re-encoded message refused");
        assert_eq!(worker_fields(&again), worker_fields(&msg));
        assert!(matches!(wire::decode_to_server::<T>(data, limits), Err(wire::DecodeError::WrongDirection)));
    }
    accepted
}

/// Widens `data` as `enc`; an accepted message becomes an `f32` message of the same kind,
/// and narrowing what decodes gives back `data` (unless a value is not finite in `enc`).
fn check_widened(data: &[u8], enc: Encoding, limits: &Limits) -> usize {
    let Ok(len) = wire::widened_len(data, enc, limits) else {
        let mut out = vec![0u8; 64];
        assert!(wire::widen(data, enc, limits, &mut out).is_err(), "widen accepted what widened_len refused");
        return 0;
    };
    let mut out = vec![0u8; len];
    assert_eq!(wire::widen(data, enc, limits, &mut out), Ok(len));
    let h = wire::peek_header(&out).expect("a widened message has a valid header");
    assert_eq!((h.scalar_tag, h.message_len()), (4, len));
    assert_eq!(out.get(..4), data.get(..4), "magic, version and kind kept");
    let narrowed = |n: Result<usize, wire::EncodeError>, buf: &[u8]| match n {
        Ok(n) => assert_eq!(&buf[..n], data, "narrowing a widened message changed its bytes"),
        Err(wire::EncodeError::NotFinite { encoding, .. }) => assert_eq!(encoding, enc),
        Err(e) => panic!("narrowing a widened message failed: {e}"),
    };
    let mut buf = vec![0u8; data.len()];
    if let Ok(msg) = wire::decode_to_server::<f32>(&out, limits) {
        narrowed(wire::encode_to_server_as(&msg, enc, &mut buf), &buf);
    }
    if let Ok(msg) = wire::decode_to_worker::<f32>(&out, limits) {
        narrowed(wire::encode_to_worker_as(&msg, enc, &mut buf), &buf);
    }
    1
}

/// A message's kind, integer fields and payload bytes, for comparison.
type Fields<'a> = (&'static str, [u64; 3], &'a [u8]);

fn payload<'a, T>(values: &Values<'a, T>) -> &'a [u8] {
    match values {
        Values::LittleEndian(b) => b,
        Values::Slice(_) => panic!("decoded a Slice payload"),
    }
}

fn server_fields<'a, T: Scalar>(msg: &ToServer<'a, T>) -> Fields<'a> {
    let kind = msg.kind_name();
    match msg {
        ToServer::Join { epoch } => (kind, [u64::from(*epoch), 0, 0], &[]),
        ToServer::Grad { base, iteration, seq, values, .. } => (kind, [base.0, *iteration, *seq], payload(values)),
        ToServer::Delta { round, local_steps, seq, values, .. } => {
            (kind, [round.0, u64::from(*local_steps), *seq], payload(values))
        }
        ToServer::Pull { have, min_clock } => (kind, [have.0, *min_clock, 0], &[]),
        ToServer::Clock { clock, seq, values, .. } => (kind, [*clock, *seq, 0], payload(values)),
        ToServer::Leave => (kind, [0; 3], &[]),
    }
}

fn worker_fields<'a, T: Scalar>(msg: &ToWorker<'a, T>) -> Fields<'a> {
    let kind = msg.kind_name();
    match msg {
        ToWorker::Model { version, clock, values } => (kind, [version.0, *clock, 0], payload(values)),
        ToWorker::NotNewer { version } => (kind, [version.0, 0, 0], &[]),
        ToWorker::PushAck { round, pull_now } => (kind, [round.0, u64::from(*pull_now), 0], &[]),
        ToWorker::Abort { iteration } => (kind, [*iteration, 0, 0], &[]),
        ToWorker::Stop => (kind, [0; 3], &[]),
    }
}
