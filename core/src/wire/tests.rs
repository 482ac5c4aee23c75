//! Golden bytes, round trips, refusals and never-panic properties of the codec.

use super::*;
use proptest::prelude::*;
use std::vec;
use std::vec::Vec;

/// Parses hex bytes; whitespace only groups them (`"0100 07"` is three bytes).
fn hex(s: &str) -> Vec<u8> {
    let digits: Vec<u8> = s.bytes().filter(|b| !b.is_ascii_whitespace()).collect();
    assert_eq!(digits.len() % 2, 0, "odd number of hex digits in {s:?}");
    digits.chunks(2).map(|d| u8::from_str_radix(core::str::from_utf8(d).unwrap(), 16).unwrap()).collect()
}

/// The payload of a message as little-endian bytes (bit-exact, so NaNs compare).
fn payload_bytes<T: Scalar>(values: &Values<'_, T>) -> Vec<u8> {
    let mut out = vec![0u8; values.len() * T::BYTES];
    for (i, chunk) in out.chunks_exact_mut(T::BYTES).enumerate() {
        assert!(values.get(i).unwrap().write_le(chunk));
    }
    out
}

/// Semantic equality of two `ToServer` messages (payloads compared bit for bit).
fn server_eq<T: Scalar>(a: &ToServer<'_, T>, b: &ToServer<'_, T>) -> bool {
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
fn worker_eq<T: Scalar>(a: &ToWorker<'_, T>, b: &ToWorker<'_, T>) -> bool {
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

fn enc_server<T: Scalar>(msg: &ToServer<'_, T>) -> Vec<u8> {
    let mut buf = vec![0u8; encoded_len_to_server(msg)];
    let n = encode_to_server(msg, &mut buf).unwrap();
    assert_eq!(n, buf.len());
    buf
}

fn enc_worker<T: Scalar>(msg: &ToWorker<'_, T>) -> Vec<u8> {
    let mut buf = vec![0u8; encoded_len_to_worker(msg)];
    let n = encode_to_worker(msg, &mut buf).unwrap();
    assert_eq!(n, buf.len());
    buf
}

/// Byte offsets of the header fields.
const OFF_KIND: usize = 3;
const OFF_TAG: usize = 4;
const OFF_CONTROL_LEN: usize = 5;
const OFF_PAYLOAD_LEN: usize = 7;

const LOOSE: Limits = Limits::for_model(1 << 20);

// ---------------------------------------------------------------------------------------
// Golden bytes: one per message kind, both directions, f32 and f64 tensors. These are the
// examples of core/WIRE.md; a change here is a wire format change (bump WIRE_VERSION).
// ---------------------------------------------------------------------------------------

/// Asserts `msg` encodes to exactly `golden`, and `golden` decodes back to `msg`.
fn golden_server<T: Scalar>(msg: ToServer<'_, T>, golden: &str) {
    let golden = hex(golden);
    assert_eq!(enc_server(&msg), golden, "{} encoding drifted", msg.kind_name());
    let back = decode_to_server::<T>(&golden, &LOOSE).unwrap();
    assert!(server_eq(&back, &msg), "{back:?} != {msg:?}");
    let h = peek_header(&golden).unwrap();
    assert_eq!((h.scalar_tag, h.message_len(), h.direction()), (T::WIRE_TAG, golden.len(), Direction::ToServer));
}

fn golden_worker<T: Scalar>(msg: ToWorker<'_, T>, golden: &str) {
    let golden = hex(golden);
    assert_eq!(enc_worker(&msg), golden, "{} encoding drifted", msg.kind_name());
    let back = decode_to_worker::<T>(&golden, &LOOSE).unwrap();
    assert!(worker_eq(&back, &msg), "{back:?} != {msg:?}");
    let h = peek_header(&golden).unwrap();
    assert_eq!((h.scalar_tag, h.message_len(), h.direction()), (T::WIRE_TAG, golden.len(), Direction::ToWorker));
}

#[test]
fn golden_join() {
    golden_server::<f32>(ToServer::Join { epoch: 7 }, "53 59 02 01 04 0100 00000000  07");
    golden_server::<f64>(ToServer::Join { epoch: u32::MAX }, "53 59 02 01 08 0500 00000000  ff ff ff ff 0f");
}

#[test]
fn golden_grad_f32_and_f64() {
    let g32 = [1.0f32, -2.0];
    golden_server(
        ToServer::Grad { base: Version(300), iteration: 5, seq: 1, values: Values::Slice(&g32), loss: None },
        "53 59 02 02 04 0500 08000000  ac 02 05 01 00  0000803f 000000c0",
    );
    let g64 = [1.0f64, -2.0];
    golden_server(
        ToServer::Grad { base: Version(300), iteration: 5, seq: 1, values: Values::Slice(&g64), loss: None },
        "53 59 02 02 08 0500 10000000  ac 02 05 01 00  000000000000f03f 00000000000000c0",
    );
    // A reported loss: `01` and its four little-endian bytes after the other fields.
    golden_server(
        ToServer::Grad { base: Version(300), iteration: 5, seq: 1, values: Values::Slice(&g32), loss: Some(0.5) },
        "53 59 02 02 04 0900 08000000  ac 02 05 01 01 0000003f  0000803f 000000c0",
    );
}

#[test]
fn golden_delta() {
    let d = [0.5f32];
    golden_server(
        ToServer::Delta { round: Version(2), local_steps: 128, seq: 9, values: Values::Slice(&d), loss: None },
        "53 59 02 03 04 0500 04000000  02 80 01 09 00  0000003f",
    );
}

#[test]
fn golden_pull() {
    golden_server::<f32>(ToServer::Pull { have: Version(4), min_clock: 0 }, "53 59 02 04 04 0200 00000000  04 00");
}

#[test]
fn golden_clock() {
    let u = [0.25f64];
    golden_server(
        ToServer::Clock { clock: 16384, seq: 3, values: Values::Slice(&u), loss: None },
        "53 59 02 05 08 0500 08000000  80 80 01 03 00  000000000000d03f",
    );
}

#[test]
fn golden_leave() {
    golden_server::<f32>(ToServer::Leave, "53 59 02 06 04 0000 00000000");
}

#[test]
fn golden_model_f32_and_f64() {
    golden_worker(
        ToWorker::Model { version: Version(1), clock: 1, values: Values::Slice(&[3.0f32]) },
        "53 59 02 81 04 0200 04000000  01 01  00004040",
    );
    golden_worker(
        ToWorker::Model { version: Version(1), clock: 1, values: Values::Slice(&[3.0f64]) },
        "53 59 02 81 08 0200 08000000  01 01  0000000000000840",
    );
}

#[test]
fn golden_not_newer() {
    golden_worker::<f32>(ToWorker::NotNewer { version: Version(127) }, "53 59 02 82 04 0100 00000000  7f");
}

#[test]
fn golden_push_ack() {
    golden_worker::<f32>(
        ToWorker::PushAck { round: Version(5), pull_now: true },
        "53 59 02 83 04 0200 00000000  05 01",
    );
    golden_worker::<f32>(
        ToWorker::PushAck { round: Version(0), pull_now: false },
        "53 59 02 83 04 0200 00000000  00 00",
    );
}

#[test]
fn golden_abort() {
    golden_worker::<f32>(ToWorker::Abort { iteration: 42 }, "53 59 02 84 04 0100 00000000  2a");
}

#[test]
fn golden_stop() {
    golden_worker::<f64>(ToWorker::Stop, "53 59 02 85 08 0000 00000000");
}

#[test]
fn golden_largest_control() {
    let max = "ff ff ff ff ff ff ff ff ff 01";
    golden_server::<f32>(
        ToServer::Grad {
            base: Version(u64::MAX),
            iteration: u64::MAX,
            seq: u64::MAX,
            values: Values::Slice(&[]),
            loss: Some(f32::MAX),
        },
        &std::format!("53 59 02 02 04 2300 00000000 {max} {max} {max} 01 ffff7f7f"),
    );
}

/// The worked example of core/WIRE.md, byte for byte.
#[test]
fn wire_md_worked_example() {
    let g = [1.5f32, -0.25, 4.0];
    let msg = ToServer::Grad { base: Version(1000), iteration: 12, seq: 130, values: Values::Slice(&g), loss: None };
    assert_eq!(
        enc_server(&msg),
        hex("53 59 02 02 04 06 00 0c 00 00 00 e8 07 0c 82 01 00 00 00 c0 3f 00 00 80 be 00 00 80 40")
    );
}

// ---------------------------------------------------------------------------------------
// Sizes and limits.
// ---------------------------------------------------------------------------------------

/// The control sections of every kind with every field at its type's maximum.
fn max_controls() -> [Control; 11] {
    let m = u64::MAX;
    [
        Control::Join(JoinCtl { epoch: u32::MAX }),
        Control::Grad(GradCtl { base: m, iteration: m, seq: m, loss: Some(f32::MAX) }),
        Control::Delta(DeltaCtl { round: m, local_steps: u32::MAX, seq: m, loss: Some(f32::MAX) }),
        Control::Pull(PullCtl { have: m, min_clock: m }),
        Control::Clock(ClockCtl { clock: m, seq: m, loss: Some(f32::MAX) }),
        Control::Leave,
        Control::Model(ModelCtl { version: m, clock: m }),
        Control::NotNewer(NotNewerCtl { version: m }),
        Control::PushAck(PushAckCtl { round: m, pull_now: true }),
        Control::Abort(AbortCtl { iteration: m }),
        Control::Stop,
    ]
}

#[test]
fn max_control_len_is_the_largest_encoding() {
    let controls = max_controls();
    // Every kind is covered, once.
    let kinds: Vec<MessageKind> = controls.iter().map(Control::kind).collect();
    assert_eq!(kinds, MessageKind::ALL);
    // The per-kind maxima of core/WIRE.md's table, in kind order.
    let maxima: Vec<usize> = controls.iter().map(Control::encoded_len).collect();
    assert_eq!(maxima, [5, 35, 30, 20, 25, 0, 20, 10, 11, 10, 0]);
    let mut largest = 0;
    for c in &controls {
        let enc = c.encode().expect("fits in MAX_CONTROL_LEN");
        assert_eq!(enc.as_bytes().len(), c.encoded_len(), "{:?}", c.kind());
        largest = largest.max(c.encoded_len());
    }
    assert_eq!(largest, MAX_CONTROL_LEN);
}

#[test]
fn max_message_len_is_the_largest_accepted_message() {
    let limits = Limits::for_model(5);
    let g = [1.0f64; 5];
    let m = u64::MAX;
    let msg = ToServer::Grad { base: Version(m), iteration: m, seq: m, values: Values::Slice(&g), loss: Some(1.0) };
    let bytes = enc_server(&msg);
    assert_eq!(bytes.len(), limits.max_message_len::<f64>());
    assert!(decode_to_server::<f64>(&bytes, &limits).is_ok());
    // One element more is refused.
    let g = [1.0f64; 6];
    let msg = ToServer::Grad { base: Version(m), iteration: m, seq: m, values: Values::Slice(&g), loss: None };
    assert_eq!(
        decode_to_server::<f64>(&enc_server(&msg), &limits).map(|_| ()),
        Err(DecodeError::TooLarge { len: 48, max: 40 })
    );
    assert_eq!(Limits::for_model(usize::MAX).max_message_len::<f32>(), usize::MAX);
}

#[test]
fn kind_bytes_round_trip_and_encode_direction() {
    for k in MessageKind::ALL {
        assert_eq!(MessageKind::from_byte(k.byte()), Some(k));
        assert_eq!(k.direction() == Direction::ToWorker, k.byte() >= 0x80);
    }
    let known = (0..=255u8).filter(|b| MessageKind::from_byte(*b).is_some()).count();
    assert_eq!(known, MessageKind::ALL.len());
}

// ---------------------------------------------------------------------------------------
// Encoding errors.
// ---------------------------------------------------------------------------------------

#[test]
fn too_small_leaves_the_buffer_untouched() {
    let g = [1.0f32, 2.0, 3.0];
    let msgs = [
        ToServer::Join { epoch: 1 },
        ToServer::Grad { base: Version(9), iteration: 1, seq: 2, values: Values::Slice(&g), loss: None },
        ToServer::Leave,
    ];
    for msg in &msgs {
        let required = encoded_len_to_server(msg);
        for len in 0..required {
            let mut buf = vec![0xa5u8; len];
            assert_eq!(encode_to_server(msg, &mut buf), Err(EncodeError::TooSmall { required }));
            assert!(buf.iter().all(|b| *b == 0xa5), "{} wrote into a short buffer", msg.kind_name());
        }
        // A longer buffer is fine; bytes past the message stay as they were.
        let mut buf = vec![0xa5u8; required + 3];
        assert_eq!(encode_to_server(msg, &mut buf), Ok(required));
        assert_eq!(&buf[required..], &[0xa5; 3]);
    }
    let model = ToWorker::Model { version: Version(2), clock: 2, values: Values::Slice(&g) };
    let required = encoded_len_to_worker(&model);
    let mut buf = vec![0x11u8; required - 1];
    assert_eq!(encode_to_worker(&model, &mut buf), Err(EncodeError::TooSmall { required }));
    assert!(buf.iter().all(|b| *b == 0x11));
}

#[test]
fn encode_refuses_partial_little_endian_payload() {
    let bytes = [0u8; 7];
    let msg: ToServer<'_, f32> = ToServer::Clock { clock: 1, seq: 1, values: Values::LittleEndian(&bytes), loss: None };
    let mut buf = [0x5au8; 64];
    assert_eq!(encode_to_server(&msg, &mut buf), Err(EncodeError::PayloadNotMultiple { len: 7 }));
    assert!(buf.iter().all(|b| *b == 0x5a));
}

#[test]
fn little_endian_and_slice_payloads_encode_identically() {
    let g = [1.5f64, f64::MIN_POSITIVE, -0.0, f64::NAN];
    let slice = ToWorker::Model { version: Version(3), clock: 9, values: Values::Slice(&g) };
    let bytes = enc_worker(&slice);
    let decoded = decode_to_worker::<f64>(&bytes, &LOOSE).unwrap();
    assert!(matches!(decoded, ToWorker::Model { values: Values::LittleEndian(_), .. }));
    assert_eq!(enc_worker(&decoded), bytes);
}

// ---------------------------------------------------------------------------------------
// Decoding refusals, one per check, and their order.
// ---------------------------------------------------------------------------------------

fn server_err(bytes: &[u8]) -> DecodeError {
    decode_to_server::<f32>(bytes, &Limits::for_model(4)).unwrap_err()
}

#[test]
fn decode_refusals() {
    use DecodeError as E;
    let ok = hex("53 59 02 01 04 0100 00000000 07");
    assert!(decode_to_server::<f32>(&ok, &Limits::for_model(0)).is_ok());
    assert_eq!(server_err(&[]), E::Truncated { needed: HEADER_LEN, got: 0 });
    assert_eq!(server_err(&ok[..10]), E::Truncated { needed: HEADER_LEN, got: 10 });
    assert_eq!(server_err(&ok[..11]), E::Truncated { needed: 12, got: 11 });
    assert_eq!(server_err(&hex("53 58 01 01 04 0100 00000000 07")), E::BadMagic);
    assert_eq!(server_err(&hex("53 59 01 01 04 0100 00000000 07")), E::UnsupportedVersion(1));
    assert_eq!(server_err(&hex("53 59 02 07 04 0100 00000000 07")), E::UnknownKind(7));
    assert_eq!(server_err(&hex("53 59 02 00 04 0100 00000000 07")), E::UnknownKind(0));
    assert_eq!(server_err(&hex("53 59 02 82 04 0100 00000000 07")), E::WrongDirection);
    assert_eq!(
        decode_to_worker::<f32>(&ok, &LOOSE).map(|_| ()),
        Err(E::WrongDirection),
        "a ToServer kind given to decode_to_worker"
    );
    assert_eq!(server_err(&hex("53 59 02 01 08 0100 00000000 07")), E::ScalarMismatch { expected: 4, got: 8 });
    assert_eq!(server_err(&hex("53 59 02 01 04 2400 00000000")), E::ControlTooLarge { len: 36 });
    assert_eq!(
        server_err(&hex("53 59 02 01 04 0100 04000000 07 00000000")),
        E::UnexpectedPayload { kind: MessageKind::Join }
    );
    assert_eq!(server_err(&hex("53 59 02 02 04 0300 14000000")), E::TooLarge { len: 20, max: 16 });
    assert_eq!(server_err(&hex("53 59 02 02 04 0300 03000000 01 01 01 000000")), E::PayloadNotMultiple);
    assert_eq!(server_err(&hex("53 59 02 02 04 0300 04000000 01 01 01 00000000 00")), E::TrailingBytes { extra: 1 });
    assert_eq!(server_err(&hex("53 59 02 02 04 0300 04000000 01 01 01 000000")), E::Truncated { needed: 18, got: 17 });
    // Control section errors.
    assert_eq!(server_err(&hex("53 59 02 02 04 0200 00000000 01 01")), E::Control(ControlError::UnexpectedEnd));
    assert_eq!(server_err(&hex("53 59 02 01 04 0500 00000000 ff ff ff ff 1f")), E::Control(ControlError::BadVarint));
    assert_eq!(
        server_err(&hex("53 59 02 04 04 0b00 00000000 ff ff ff ff ff ff ff ff ff 02 00")),
        E::Control(ControlError::BadVarint)
    );
    assert_eq!(server_err(&hex("53 59 02 01 04 0200 00000000 07 00")), E::ControlNotConsumed { extra: 1 });
    assert_eq!(server_err(&hex("53 59 02 06 04 0100 00000000 00")), E::ControlNotConsumed { extra: 1 });
    assert_eq!(server_err(&hex("53 59 02 01 04 0200 00000000 87 00")), E::NonCanonical);
    assert_eq!(server_err(&hex("53 59 02 01 04 0200 00000000 80 00")), E::NonCanonical);
    let bad_bool = hex("53 59 02 83 04 0200 00000000 05 02");
    assert_eq!(decode_to_worker::<f32>(&bad_bool, &LOOSE).map(|_| ()), Err(E::Control(ControlError::BadBool)));
}

#[test]
fn another_wire_version_is_refused_naming_both() {
    let err = server_err(&hex("53 59 01 06 04 0000 00000000"));
    assert_eq!(err, DecodeError::UnsupportedVersion(1));
    assert_eq!(std::format!("{err}"), "peer speaks wire version 1, this build speaks wire version 2");
}

#[test]
fn a_reported_loss_round_trips_bit_for_bit() {
    for loss in [0.0f32, -0.0, 1e-30, 3.5, f32::MAX, f32::NAN, f32::INFINITY] {
        let g = [1.0f32];
        let msgs = [
            ToServer::Grad { base: Version(1), iteration: 1, seq: 1, values: Values::Slice(&g), loss: Some(loss) },
            ToServer::Delta { round: Version(1), local_steps: 2, seq: 1, values: Values::Slice(&g), loss: Some(loss) },
            ToServer::Clock { clock: 1, seq: 1, values: Values::Slice(&g), loss: Some(loss) },
        ];
        for msg in msgs {
            let bytes = enc_server(&msg);
            let back = decode_to_server::<f32>(&bytes, &LOOSE).unwrap();
            assert_eq!(back.loss().map(f32::to_bits), Some(loss.to_bits()));
        }
    }
    // An option tag other than 0 or 1 is refused.
    let bad = hex("53 59 02 02 04 0400 04000000 01 01 01 02 0000803f");
    assert!(decode_to_server::<f32>(&bad, &LOOSE).is_err());
}

#[test]
fn decode_checks_in_order() {
    use DecodeError as E;
    // Every field wrong: the first check wins, and so on down the list.
    let mut b = hex("00 00 09 7f 05 ffff ffffffff");
    assert_eq!(server_err(&b[..5]), E::Truncated { needed: HEADER_LEN, got: 5 });
    assert_eq!(server_err(&b), E::BadMagic);
    b[..2].copy_from_slice(&MAGIC);
    assert_eq!(server_err(&b), E::UnsupportedVersion(9));
    b[2] = WIRE_VERSION;
    assert_eq!(server_err(&b), E::UnknownKind(0x7f));
    b[3] = 0x81;
    assert_eq!(server_err(&b), E::WrongDirection);
    b[3] = 0x02;
    assert_eq!(server_err(&b), E::ScalarMismatch { expected: 4, got: 5 });
    b[4] = 4;
    assert_eq!(server_err(&b), E::ControlTooLarge { len: 0xffff });
    b[5..7].copy_from_slice(&[3, 0]);
    assert_eq!(server_err(&b), E::TooLarge { len: 0xffff_ffff, max: 16 });
    b[7..11].copy_from_slice(&[5, 0, 0, 0]);
    assert_eq!(server_err(&b), E::PayloadNotMultiple);
    b[7] = 4;
    assert_eq!(server_err(&b), E::Truncated { needed: 18, got: 11 });
}

#[test]
fn peek_header_validates_without_a_scalar_type() {
    use DecodeError as E;
    let h = peek_header(&hex("53 59 02 81 08 0200 10000000")).unwrap();
    assert_eq!(h, Header { kind: MessageKind::Model, scalar_tag: 8, control_len: 2, payload_len: 16 });
    assert_eq!(h.message_len(), HEADER_LEN + 2 + 16);
    assert_eq!(peek_header(&hex("53 59 02 81 05 0200 10000000")), Err(E::UnknownScalarTag(5)));
    assert_eq!(peek_header(&hex("53 59 02 81 08 0200 0c000000")), Err(E::PayloadNotMultiple));
    assert_eq!(
        peek_header(&hex("53 59 02 85 08 0000 08000000")),
        Err(E::UnexpectedPayload { kind: MessageKind::Stop })
    );
    assert_eq!(peek_header(&hex("53 59 02 90 08 0000 00000000")), Err(E::UnknownKind(0x90)));
    assert_eq!(peek_header(&hex("53 59 02 81 08 2400 00000000")), Err(E::ControlTooLarge { len: 36 }));
    // No limit on the payload; lengths up to u32::MAX are reported as they are.
    let h = peek_header(&hex("53 59 02 02 04 0000 fcffffff")).unwrap();
    assert_eq!(h.payload_len, 0xffff_fffc);
}

#[test]
fn errors_display() {
    let errors = [
        DecodeError::Truncated { needed: 11, got: 3 },
        DecodeError::Control(ControlError::BadBool),
        DecodeError::UnexpectedPayload { kind: MessageKind::Leave },
        DecodeError::UnknownKind(0x42),
    ];
    for e in errors {
        assert!(!std::format!("{e}").is_empty());
    }
    assert_eq!(std::format!("{}", DecodeError::UnknownKind(0x42)), "unknown message kind 0x42");
    assert_eq!(std::format!("{}", EncodeError::TooSmall { required: 9 }), "output buffer too small: 9 bytes required");
}

// ---------------------------------------------------------------------------------------
// Properties.
// ---------------------------------------------------------------------------------------

/// The non-tensor fields of an arbitrary message.
#[derive(Clone, Debug)]
struct Spec {
    kind: u8,
    a: u64,
    b: u64,
    c: u64,
    small: u32,
    flag: bool,
}

fn field() -> impl Strategy<Value = u64> {
    prop_oneof![0..200u64, any::<u64>(), Just(u64::MAX), (0..64u32).prop_map(|s| 1u64 << s)]
}

fn spec() -> impl Strategy<Value = Spec> {
    (any::<u8>(), field(), field(), field(), prop_oneof![0..200u32, any::<u32>()], any::<bool>())
        .prop_map(|(kind, a, b, c, small, flag)| Spec { kind, a, b, c, small, flag })
}

fn server_msg<'a, T>(s: &Spec, values: Values<'a, T>) -> ToServer<'a, T> {
    match s.kind % 6 {
        0 => ToServer::Join { epoch: s.small },
        1 => ToServer::Grad { base: Version(s.a), iteration: s.b, seq: s.c, values, loss: None },
        2 => ToServer::Delta { round: Version(s.a), local_steps: s.small, seq: s.c, values, loss: None },
        3 => ToServer::Pull { have: Version(s.a), min_clock: s.b },
        4 => ToServer::Clock { clock: s.a, seq: s.c, values, loss: None },
        _ => ToServer::Leave,
    }
}

fn worker_msg<'a, T>(s: &Spec, values: Values<'a, T>) -> ToWorker<'a, T> {
    match s.kind % 5 {
        0 => ToWorker::Model { version: Version(s.a), clock: s.b, values },
        1 => ToWorker::NotNewer { version: Version(s.a) },
        2 => ToWorker::PushAck { round: Version(s.a), pull_now: s.flag },
        3 => ToWorker::Abort { iteration: s.a },
        _ => ToWorker::Stop,
    }
}

fn f32s() -> impl Strategy<Value = Vec<f32>> {
    proptest::collection::vec(any::<u32>().prop_map(f32::from_bits), 0..40)
}

fn f64s() -> impl Strategy<Value = Vec<f64>> {
    proptest::collection::vec(any::<u64>().prop_map(f64::from_bits), 0..40)
}

/// encode -> decode -> semantically equal -> re-encode gives the same bytes, for both
/// directions, from a `Slice` and from the same payload as `LittleEndian`.
fn round_trip<T: Scalar>(s: &Spec, xs: &[T]) {
    let le = payload_bytes(&Values::Slice(xs));
    let limits = Limits::for_model(xs.len());

    let msg = server_msg(s, Values::Slice(xs));
    let bytes = enc_server(&msg);
    assert_eq!(enc_server(&server_msg(s, Values::<T>::LittleEndian(&le))), bytes);
    let back = decode_to_server::<T>(&bytes, &limits).unwrap();
    assert!(server_eq(&back, &msg));
    assert_eq!(enc_server(&back), bytes);
    assert_eq!(peek_header(&bytes).unwrap().message_len(), bytes.len());

    let msg = worker_msg(s, Values::Slice(xs));
    let bytes = enc_worker(&msg);
    assert_eq!(enc_worker(&worker_msg(s, Values::<T>::LittleEndian(&le))), bytes);
    let back = decode_to_worker::<T>(&bytes, &limits).unwrap();
    assert!(worker_eq(&back, &msg));
    assert_eq!(enc_worker(&back), bytes);
}

/// Decodes `bytes` every way; must not panic, and what is accepted must be canonical.
fn decode_all_ways(bytes: &[u8]) -> usize {
    fn check<T: Scalar>(bytes: &[u8], limits: &Limits) -> usize {
        let mut accepted = 0;
        if let Ok(m) = decode_to_server::<T>(bytes, limits) {
            assert_eq!(enc_server(&m), bytes, "accepted a non-canonical encoding");
            accepted += 1;
        }
        if let Ok(m) = decode_to_worker::<T>(bytes, limits) {
            assert_eq!(enc_worker(&m), bytes, "accepted a non-canonical encoding");
            accepted += 1;
        }
        accepted
    }
    let _ = peek_header(bytes);
    [Limits::for_model(0), Limits::for_model(3), LOOSE, Limits::for_model(usize::MAX)]
        .iter()
        .map(|l| check::<f32>(bytes, l) + check::<f64>(bytes, l))
        .sum()
}

/// A valid encoding of an arbitrary message, either direction, either scalar type.
fn valid_encoding() -> impl Strategy<Value = Vec<u8>> {
    (spec(), any::<bool>(), any::<bool>(), f32s(), f64s()).prop_map(|(s, to_server, wide, x32, x64)| {
        match (to_server, wide) {
            (true, false) => enc_server(&server_msg(&s, Values::Slice(&x32))),
            (true, true) => enc_server(&server_msg(&s, Values::Slice(&x64))),
            (false, false) => enc_worker(&worker_msg(&s, Values::Slice(&x32))),
            (false, true) => enc_worker(&worker_msg(&s, Values::Slice(&x64))),
        }
    })
}

/// Bytes that start with a plausible header, so the fuzzing reaches the control decoder.
fn plausible_bytes() -> impl Strategy<Value = Vec<u8>> {
    (
        proptest::sample::select(MessageKind::ALL.to_vec()),
        prop_oneof![Just(4u8), Just(8u8)],
        0..=33u16,
        prop_oneof![0..40u32, Just(u32::MAX)],
        proptest::collection::vec(prop_oneof![any::<u8>(), Just(0x80u8), Just(0xffu8), Just(0u8)], 0..80),
    )
        .prop_map(|(kind, tag, clen, plen, body)| {
            let mut b = Vec::from(MAGIC);
            b.push(WIRE_VERSION);
            b.push(kind.byte());
            b.push(tag);
            b.extend_from_slice(&clen.to_le_bytes());
            b.extend_from_slice(&plen.to_le_bytes());
            b.extend_from_slice(&body);
            b
        })
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 512, rng_seed: proptest::test_runner::RngSeed::Fixed(0x5359_0001), failure_persistence: None, ..ProptestConfig::default() })]

    #[test]
    fn round_trip_f32(s in spec(), xs in f32s()) {
        round_trip(&s, &xs);
    }

    #[test]
    fn round_trip_f64(s in spec(), xs in f64s()) {
        round_trip(&s, &xs);
    }

    #[test]
    fn arbitrary_bytes_never_panic(bytes in proptest::collection::vec(any::<u8>(), 0..120)) {
        decode_all_ways(&bytes);
    }

    #[test]
    fn plausible_bytes_never_panic(bytes in plausible_bytes()) {
        decode_all_ways(&bytes);
    }

    #[test]
    fn bit_flips_are_refused_or_canonical(bytes in valid_encoding(), at in any::<usize>(), bit in 0..8u8) {
        prop_assert!(decode_all_ways(&bytes) > 0);
        let mut m = bytes.clone();
        let i = at % m.len();
        m[i] ^= 1 << bit;
        decode_all_ways(&m);
        if i < 2 {
            prop_assert_eq!(server_err(&m), DecodeError::BadMagic);
        } else if i == 2 {
            prop_assert_eq!(server_err(&m), DecodeError::UnsupportedVersion(WIRE_VERSION ^ (1 << bit)));
        }
    }

    #[test]
    fn truncation_is_refused(bytes in valid_encoding(), cut in any::<usize>()) {
        let cut = cut % bytes.len();
        prop_assert_eq!(decode_all_ways(&bytes[..cut]), 0);
        let h = peek_header(&bytes).unwrap();
        let refused = match h.direction() {
            Direction::ToServer if h.scalar_tag == 4 => decode_to_server::<f32>(&bytes[..cut], &LOOSE).map(|_| ()),
            Direction::ToServer => decode_to_server::<f64>(&bytes[..cut], &LOOSE).map(|_| ()),
            Direction::ToWorker if h.scalar_tag == 4 => decode_to_worker::<f32>(&bytes[..cut], &LOOSE).map(|_| ()),
            Direction::ToWorker => decode_to_worker::<f64>(&bytes[..cut], &LOOSE).map(|_| ()),
        };
        let needed = if cut < HEADER_LEN { HEADER_LEN } else { bytes.len() };
        prop_assert_eq!(refused, Err(DecodeError::Truncated { needed, got: cut }));
    }

    #[test]
    fn appended_bytes_are_refused(bytes in valid_encoding(), extra in proptest::collection::vec(any::<u8>(), 1..16)) {
        let mut m = bytes.clone();
        m.extend_from_slice(&extra);
        prop_assert_eq!(decode_all_ways(&m), 0);
        let h = peek_header(&m).unwrap();
        let res = match (h.direction(), h.scalar_tag) {
            (Direction::ToServer, 4) => decode_to_server::<f32>(&m, &LOOSE).map(|_| ()),
            (Direction::ToServer, _) => decode_to_server::<f64>(&m, &LOOSE).map(|_| ()),
            (Direction::ToWorker, 4) => decode_to_worker::<f32>(&m, &LOOSE).map(|_| ()),
            (Direction::ToWorker, _) => decode_to_worker::<f64>(&m, &LOOSE).map(|_| ()),
        };
        prop_assert_eq!(res, Err(DecodeError::TrailingBytes { extra: extra.len() }));
    }

    #[test]
    fn huge_header_lengths_are_refused(bytes in valid_encoding(), clen in (MAX_CONTROL_LEN as u16 + 1)..=u16::MAX, plen in 0x1000_0000u32..=u32::MAX) {
        let mut m = bytes.clone();
        m[OFF_CONTROL_LEN..OFF_CONTROL_LEN + 2].copy_from_slice(&clen.to_le_bytes());
        prop_assert_eq!(decode_all_ways(&m), 0);
        prop_assert_eq!(peek_header(&m), Err(DecodeError::ControlTooLarge { len: usize::from(clen) }));

        let mut m = bytes.clone();
        m[OFF_PAYLOAD_LEN..OFF_PAYLOAD_LEN + 4].copy_from_slice(&plen.to_le_bytes());
        prop_assert_eq!(decode_all_ways(&m), 0);
        let kind = MessageKind::from_byte(m[OFF_KIND]).unwrap();
        let tag = m[OFF_TAG];
        let res = match (kind.direction(), tag) {
            (Direction::ToServer, 4) => decode_to_server::<f32>(&m, &LOOSE).map(|_| ()),
            (Direction::ToServer, _) => decode_to_server::<f64>(&m, &LOOSE).map(|_| ()),
            (Direction::ToWorker, 4) => decode_to_worker::<f32>(&m, &LOOSE).map(|_| ()),
            (Direction::ToWorker, _) => decode_to_worker::<f64>(&m, &LOOSE).map(|_| ()),
        };
        let expected = if kind.has_payload() {
            DecodeError::TooLarge { len: plen as usize, max: LOOSE.max_payload_len::<f32>() * usize::from(tag) / 4 }
        } else {
            DecodeError::UnexpectedPayload { kind }
        };
        prop_assert_eq!(res, Err(expected));
    }
}
