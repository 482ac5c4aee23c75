//! Golden bytes: one per message kind, both directions, f32 and f64 tensors. These are the
//! examples of core/WIRE.md; a change here is a wire format change (bump `WIRE_VERSION`).

use super::*;

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
