//! Sizes and limits, and encoding errors.

use super::*;
use std::vec;
use std::vec::Vec;

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

// Encoding errors.

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
