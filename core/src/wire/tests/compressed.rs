//! Messages with their tensor in 16 bits: encoded, widened back to the `f32` message and
//! decoded; the refusals of values that do not survive narrowing and of malformed input.

use super::*;

fn grad(values: &[f32]) -> ToServer<'_, f32> {
    ToServer::Grad { base: Version(3), iteration: 3, seq: 7, values: Values::Slice(values), loss: Some(0.5) }
}

fn encoded(msg: &ToServer<'_, f32>, enc: Encoding) -> Vec<u8> {
    let mut out = vec![0u8; encoded_len_to_server_as(msg, enc)];
    let n = encode_to_server_as(msg, enc, &mut out).unwrap();
    assert_eq!(n, out.len());
    out
}

fn widened(bytes: &[u8], enc: Encoding, dim: usize) -> Result<Vec<u8>, DecodeError> {
    let limits = Limits::for_model(dim);
    let mut out = vec![0u8; widened_len(bytes, enc, &limits)?];
    let n = widen(bytes, enc, &limits, &mut out)?;
    assert_eq!(n, out.len());
    Ok(out)
}

#[test]
fn representable_values_round_trip_through_every_encoding() {
    let values = [0.0f32, -0.0, 1.0, -2.5, 0.375, 1024.0, -49_152.0, 2f32.powi(-24)];
    for enc in Encoding::ALL {
        let bytes = encoded(&grad(&values), enc);
        assert_eq!(bytes[4], enc.tag());
        let wide = widened(&bytes, enc, values.len()).unwrap();
        assert_eq!(wide, encoded(&grad(&values), Encoding::F32), "{enc}: the widened message is the f32 one");
        let back = decode_to_server::<f32>(&wide, &Limits::for_model(values.len())).unwrap();
        assert!(server_eq(&back, &grad(&values)), "{enc}");
    }
}

#[test]
fn values_are_rounded_to_nearest_even_and_messages_halve() {
    let values = [1.0f32 + 2f32.powi(-8), 1.0 + 3.0 * 2f32.powi(-8), 0.1];
    let bf = encoded(&grad(&values), Encoding::Bf16);
    let f32_len = encoded(&grad(&values), Encoding::F32).len();
    assert_eq!(f32_len - bf.len(), values.len() * 2);
    let payload = &bf[bf.len() - 6..];
    assert_eq!(payload, [0x80, 0x3F, 0x82, 0x3F, 0xCD, 0x3D], "1+2^-8 ties to 1.0, 1+3*2^-8 to 1+2^-6");
}

#[test]
fn a_value_not_finite_once_narrowed_is_refused_and_nothing_written() {
    for (enc, values, index) in [
        (Encoding::Fp16, vec![1.0f32, 70_000.0], 1),
        (Encoding::Fp16, vec![65_520.0], 0),
        (Encoding::Bf16, vec![0.0, 1.0, f32::MAX], 2),
        (Encoding::Bf16, vec![f32::NAN], 0),
        (Encoding::Fp16, vec![f32::NEG_INFINITY], 0),
    ] {
        let msg = grad(&values);
        let mut out = vec![0xAAu8; encoded_len_to_server_as(&msg, enc)];
        assert_eq!(encode_to_server_as(&msg, enc, &mut out), Err(EncodeError::NotFinite { index, encoding: enc }));
        assert!(out.iter().all(|b| *b == 0xAA), "{enc}: nothing written");
        // The same tensor as little-endian bytes is refused alike.
        let le: Vec<u8> = values.iter().flat_map(|v| v.to_le_bytes()).collect();
        let msg =
            ToServer::Grad { base: Version(0), iteration: 0, seq: 1, values: Values::LittleEndian(&le), loss: None };
        assert_eq!(encode_to_server_as(&msg, enc, &mut out), Err(EncodeError::NotFinite { index, encoding: enc }));
    }
    // fp16's largest finite value and bf16's (just under f32::MAX) travel.
    assert!(encode_to_server_as(&grad(&[65_519.0]), Encoding::Fp16, &mut [0u8; 64]).is_ok());
    assert!(encode_to_server_as(&grad(&[3.38e38]), Encoding::Bf16, &mut [0u8; 64]).is_ok());
}

#[test]
fn messages_without_a_tensor_carry_the_encodings_tag() {
    let stop = ToWorker::<f32>::Stop;
    for enc in Encoding::ALL {
        let mut out = vec![0u8; encoded_len_to_worker_as(&stop, enc)];
        encode_to_worker_as(&stop, enc, &mut out).unwrap();
        assert_eq!(out[4], enc.tag());
        let wide = widened(&out, enc, 4).unwrap();
        assert!(matches!(decode_to_worker::<f32>(&wide, &Limits::for_model(4)), Ok(ToWorker::Stop)));
    }
}

#[test]
fn the_model_widens_to_the_f32_model() {
    let values = [0.5f32, -3.0, 8.0];
    let msg = ToWorker::Model { version: Version(9), clock: 2, values: Values::Slice(&values[..]) };
    let mut out = vec![0u8; encoded_len_to_worker_as(&msg, Encoding::Fp16)];
    encode_to_worker_as(&msg, Encoding::Fp16, &mut out).unwrap();
    let wide = widened(&out, Encoding::Fp16, 3).unwrap();
    match decode_to_worker::<f32>(&wide, &Limits::for_model(3)).unwrap() {
        ToWorker::Model { version, clock, values: v } => {
            assert_eq!((version, clock), (Version(9), 2));
            assert_eq!(payload_bytes(&v), payload_bytes(&Values::Slice(&values[..])));
        }
        other => panic!("{}", other.kind_name()),
    }
}

#[test]
fn widening_refuses_what_the_decoder_refuses() {
    let bytes = encoded(&grad(&[1.0, 2.0]), Encoding::Bf16);
    // Another encoding's tag, including plain f32 at a bf16 session.
    assert_eq!(widened(&bytes, Encoding::Fp16, 2), Err(DecodeError::ScalarMismatch { expected: 2, got: 0x82 }));
    let plain = encoded(&grad(&[1.0, 2.0]), Encoding::F32);
    assert_eq!(widened(&plain, Encoding::Bf16, 2), Err(DecodeError::ScalarMismatch { expected: 0x82, got: 4 }));
    // More elements than the limits allow (counted in elements, not bytes).
    assert_eq!(widened(&bytes, Encoding::Bf16, 1), Err(DecodeError::TooLarge { len: 4, max: 2 }));
    // Truncated, trailing, an odd payload.
    assert!(matches!(widened(&bytes[..bytes.len() - 1], Encoding::Bf16, 2), Err(DecodeError::Truncated { .. })));
    let mut long = bytes.clone();
    long.push(0);
    assert_eq!(widened(&long, Encoding::Bf16, 2), Err(DecodeError::TrailingBytes { extra: 1 }));
    let mut odd = bytes.clone();
    odd[7] = 3;
    odd.pop();
    assert_eq!(widened(&odd, Encoding::Bf16, 2), Err(DecodeError::PayloadNotMultiple));
    // A short output buffer: refused, nothing written.
    let limits = Limits::for_model(2);
    let mut out = vec![0xAAu8; 10];
    let need = widened_len(&bytes, Encoding::Bf16, &limits).unwrap();
    assert_eq!(widen(&bytes, Encoding::Bf16, &limits, &mut out), Err(DecodeError::OutputTooSmall { required: need }));
    assert!(out.iter().all(|b| *b == 0xAA));
    // The 16-bit tags are known to the header reader.
    assert_eq!(peek_header(&bytes).unwrap().scalar_tag, 0x82);
}

proptest::proptest! {
    /// Widening never panics and, when it accepts, yields a message with tag 4 whose
    /// payload holds exactly as many elements.
    #[test]
    fn widening_arbitrary_bytes_never_panics(bytes in proptest::collection::vec(proptest::num::u8::ANY, 0..64), dim in 0usize..8) {
        for enc in Encoding::ALL {
            if let Ok(wide) = widened(&bytes, enc, dim) {
                let h = peek_header(&wide).unwrap();
                proptest::prop_assert_eq!(h.scalar_tag, 4);
                proptest::prop_assert_eq!(h.payload_len / 4, (bytes.len() - HEADER_LEN - h.control_len) / enc.element_bytes());
            }
        }
    }

    /// A narrowed tensor widens to each value rounded to nearest even.
    #[test]
    fn narrowed_tensors_widen_to_the_rounded_values(xs in proptest::collection::vec(-60_000.0f32..60_000.0, 0..16)) {
        for enc in Encoding::ALL {
            let bytes = encoded(&grad(&xs), enc);
            let wide = widened(&bytes, enc, xs.len()).unwrap();
            let want: Vec<f32> = xs.iter().map(|x| enc.round_trip(*x)).collect();
            proptest::prop_assert_eq!(wide, encoded(&grad(&want), Encoding::F32));
        }
    }
}
