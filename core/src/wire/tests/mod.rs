//! Golden bytes, round trips, refusals and never-panic properties of the codec, one file per
//! behaviour; the helpers they share are here.

use super::*;
use std::vec;
use std::vec::Vec;

mod compressed;
mod golden;
mod half;
mod limits;
mod properties;
mod refusals;

/// Parses hex bytes; whitespace only groups them (`"0100 07"` is three bytes).
pub(super) fn hex(s: &str) -> Vec<u8> {
    let digits: Vec<u8> = s.bytes().filter(|b| !b.is_ascii_whitespace()).collect();
    assert_eq!(digits.len() % 2, 0, "odd number of hex digits in {s:?}");
    digits.chunks(2).map(|d| u8::from_str_radix(core::str::from_utf8(d).unwrap(), 16).unwrap()).collect()
}

/// The payload of a message as little-endian bytes (bit-exact, so NaNs compare).
pub(super) fn payload_bytes<T: Scalar>(values: &Values<'_, T>) -> Vec<u8> {
    let mut out = vec![0u8; values.len() * T::BYTES];
    for (i, chunk) in out.chunks_exact_mut(T::BYTES).enumerate() {
        assert!(values.get(i).unwrap().write_le(chunk));
    }
    out
}

/// Semantic equality of two `ToServer` messages (payloads compared bit for bit).
pub(super) fn server_eq<T: Scalar>(a: &ToServer<'_, T>, b: &ToServer<'_, T>) -> bool {
    match (a, b) {
        (ToServer::Join { epoch: x }, ToServer::Join { epoch: y }) => x == y,
        (
            ToServer::Grad { base: b1, iteration: i1, seq: s1, values: v1, .. },
            ToServer::Grad { base: b2, iteration: i2, seq: s2, values: v2, .. },
        ) => (b1, i1, s1) == (b2, i2, s2) && payload_bytes(v1) == payload_bytes(v2),
        (
            ToServer::Delta { round: r1, local_steps: l1, seq: s1, values: v1, .. },
            ToServer::Delta { round: r2, local_steps: l2, seq: s2, values: v2, .. },
        ) => (r1, l1, s1) == (r2, l2, s2) && payload_bytes(v1) == payload_bytes(v2),
        (ToServer::Pull { have: h1, min_clock: m1 }, ToServer::Pull { have: h2, min_clock: m2 }) => {
            (h1, m1) == (h2, m2)
        }
        (
            ToServer::Clock { clock: c1, seq: s1, values: v1, .. },
            ToServer::Clock { clock: c2, seq: s2, values: v2, .. },
        ) => (c1, s1) == (c2, s2) && payload_bytes(v1) == payload_bytes(v2),
        (ToServer::Leave, ToServer::Leave) => true,
        _ => false,
    }
}

/// Semantic equality of two `ToWorker` messages (payloads compared bit for bit).
pub(super) fn worker_eq<T: Scalar>(a: &ToWorker<'_, T>, b: &ToWorker<'_, T>) -> bool {
    match (a, b) {
        (
            ToWorker::Model { version: v1, clock: c1, values: x1 },
            ToWorker::Model { version: v2, clock: c2, values: x2 },
        ) => (v1, c1) == (v2, c2) && payload_bytes(x1) == payload_bytes(x2),
        (ToWorker::NotNewer { version: x }, ToWorker::NotNewer { version: y }) => x == y,
        (ToWorker::PushAck { round: r1, pull_now: p1 }, ToWorker::PushAck { round: r2, pull_now: p2 }) => {
            (r1, p1) == (r2, p2)
        }
        (ToWorker::Abort { iteration: x }, ToWorker::Abort { iteration: y }) => x == y,
        (ToWorker::Stop, ToWorker::Stop) => true,
        _ => false,
    }
}

pub(super) fn enc_server<T: Scalar>(msg: &ToServer<'_, T>) -> Vec<u8> {
    let mut buf = vec![0u8; encoded_len_to_server(msg)];
    let n = encode_to_server(msg, &mut buf).unwrap();
    assert_eq!(n, buf.len());
    buf
}

pub(super) fn enc_worker<T: Scalar>(msg: &ToWorker<'_, T>) -> Vec<u8> {
    let mut buf = vec![0u8; encoded_len_to_worker(msg)];
    let n = encode_to_worker(msg, &mut buf).unwrap();
    assert_eq!(n, buf.len());
    buf
}

/// Byte offsets of the header fields.
pub(super) const OFF_KIND: usize = 3;
pub(super) const OFF_TAG: usize = 4;
pub(super) const OFF_CONTROL_LEN: usize = 5;
pub(super) const OFF_PAYLOAD_LEN: usize = 7;

pub(super) const LOOSE: Limits = Limits::for_model(1 << 20);

/// The refusal of `bytes` as a message to the server.
pub(super) fn server_err(bytes: &[u8]) -> DecodeError {
    decode_to_server::<f32>(bytes, &Limits::for_model(4)).unwrap_err()
}
