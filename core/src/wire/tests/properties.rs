//! Properties: round trips, and no input makes a decoder panic.

use super::*;
use proptest::prelude::*;
use std::vec::Vec;

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
