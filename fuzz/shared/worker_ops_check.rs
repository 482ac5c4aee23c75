//! The checks of the `worker_ops` fuzz target, shared with `tests/tests/fuzz_targets_corpus.rs`
//! (included there with `#[path]`).
//!
//! The input picks a protocol and a list of operations into its worker: `Model`, `NotNewer`,
//! `PushAck`, `Abort`, `Stop` messages with fuzzer-chosen fields, `handle_gradient` (for the
//! computation the worker asked for, or a made-up id, with small integer values and the
//! occasional NaN/∞/wrong length), and timeouts. After every operation: no panic; an `Err`
//! produced no output; the outputs drain in a bounded number of polls; a `Compute` request
//! comes with a finite model of the right length.

use super::bytes::Bytes;
use syncopate::{
    AnyWorker, ComputeId, Duration, Instant, ToWorker, Values, Version, Worker, WorkerId, WorkerOutput, WorkerSetup,
};
use syncopate_tests::drive::DIM;
use syncopate_tests::fault::protocols;

/// Runs `data`; panics on a violation. Returns the number of operations executed.
pub(crate) fn check(data: &[u8]) -> usize {
    let mut b = Bytes(data);
    let all = protocols();
    let (name, config) = all[usize::from(b.u8()) % all.len()];
    let setup = WorkerSetup {
        id: WorkerId(u32::from(b.u8()) % config.workers()),
        epoch: u32::from(b.u8() % 3),
        rejoin_after: Some(Duration::from_millis(100)),
    };
    let scratch = vec![0.0; config.worker_scratch_len(DIM).max(DIM)];
    let mut w: AnyWorker<f64, Vec<f64>> =
        AnyWorker::new(&config, setup, vec![0.0; DIM], scratch).expect("valid worker configuration");
    let mut now = Instant::ZERO;
    let mut version = 0u64;
    let mut computes: Vec<u64> = Vec::new();
    let mut ops = 0;
    let drain = |w: &mut AnyWorker<f64, Vec<f64>>, computes: &mut Vec<u64>| {
        let mut polls = 0;
        while let Some(out) = w.poll_output() {
            polls += 1;
            assert!(polls < 10_000, "[{name}] outputs do not drain");
            if let WorkerOutput::Compute { id, params, .. } = out {
                assert_eq!(params.len(), DIM, "[{name}] compute on a model of the wrong length");
                assert!(params.iter().all(|x| x.is_finite()), "[{name}] compute on a non-finite model");
                computes.push(id.0);
            }
        }
    };
    drain(&mut w, &mut computes);
    while !b.is_empty() && ops < 512 {
        ops += 1;
        now = now + Duration::from_millis(u64::from(b.u8() % 64));
        let op = b.u8();
        let mut values = [0.0; DIM];
        let (what, result) = match op % 7 {
            0 => {
                version = b.version(version);
                let clock = match b.u8() {
                    255 => u64::MAX,
                    x => version.saturating_add(u64::from(x % 4)),
                };
                for x in &mut values {
                    // Models from the server are finite (the server screens what it applies).
                    *x = f64::from(b.u8() % 16) - 8.0;
                }
                let len = if b.u8() == 255 { DIM + 1 } else { DIM };
                let long = [values[0]; DIM + 1];
                let vals = if len == DIM { Values::Slice(&values[..]) } else { Values::Slice(&long[..]) };
                ("model", w.handle(now, ToWorker::Model { version: Version(version), clock, values: vals }))
            }
            1 => ("not_newer", w.handle(now, ToWorker::NotNewer { version: Version(b.version(version)) })),
            2 => {
                let round = Version(b.version(version));
                ("push_ack", w.handle(now, ToWorker::PushAck { round, pull_now: b.u8() % 2 == 0 }))
            }
            3 => ("abort", w.handle(now, ToWorker::Abort { iteration: b.version(version) })),
            4 => ("stop", if b.u8() % 8 == 0 { w.handle(now, ToWorker::Stop) } else { Ok(()) }),
            5 => {
                let id = match (b.u8(), computes.last()) {
                    (x, Some(&id)) if x < 200 => id,
                    (x, _) => u64::from(x),
                };
                for x in &mut values {
                    *x = b.value();
                }
                let len = if b.u8() == 255 { DIM - 1 } else { DIM };
                let loss = match b.u8() % 4 {
                    0 => None,
                    1 => Some(f32::from_bits(0x7f80_0000 | u32::from(b.u8()))),
                    _ => Some(f32::from(b.u8())),
                };
                ("gradient", w.handle_gradient_with_loss(now, ComputeId(id), &values[..len], loss))
            }
            _ => {
                if let Some(t) = w.poll_timeout() {
                    now = now.max(t);
                }
                w.handle_timeout(now);
                ("timeout", Ok(()))
            }
        };
        if let Err(e) = result {
            assert!(w.poll_output().is_none(), "[{name}] {what} refused with {e:?} but produced output");
        }
        drain(&mut w, &mut computes);
    }
    ops
}
