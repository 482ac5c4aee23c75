//! Decoding refusals, one per check, and their order.

use super::*;

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
