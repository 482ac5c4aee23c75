//! Server state grows by less than 64 bytes per worker, measured: every protocol's server is
//! built on the heap (`Storage = Heap`) for `n = 1,000` and `n = 10,000` workers with the
//! same model, and a counting global allocator records what the construction allocated
//! beyond the caller's model and scratch buffers. The slope between the two is the
//! per-worker cost; the intercept is the constant (the server's own struct: its output
//! queue, whose depth does not depend on `n`, and its protocol's fixed state). Both are
//! printed (`cargo test -p syncopate-tests --test server_memory -- --nocapture`).

use stats_alloc::{INSTRUMENTED_SYSTEM, Region, StatsAlloc};
use std::alloc::System;
use syncopate::proto::Heap;
use syncopate::{AnyServer, ProtocolConfig};
use syncopate_benches::drive::all_protocols;

#[global_allocator]
static GLOBAL: &StatsAlloc<System> = &INSTRUMENTED_SYSTEM;

const DIM: usize = 16;

/// Bytes allocated while building (and boxing) a server for `config` with `n` workers,
/// not counting the caller's buffers.
fn server_bytes(config: &ProtocolConfig) -> usize {
    let params = vec![0.0f32; DIM];
    let scratch = vec![0.0f32; config.server_scratch_len(DIM)];
    let region = Region::new(GLOBAL);
    let server = AnyServer::<f32, Vec<f32>, Heap>::new(config, params, scratch).map(Box::new);
    let stats = region.change();
    assert!(server.is_ok(), "{}: {:?}", config.name(), server.err());
    drop(server);
    stats.bytes_allocated - stats.bytes_deallocated.min(stats.bytes_allocated)
}

/// `config` with `n` workers.
fn with_workers(n: u32) -> Vec<ProtocolConfig> {
    all_protocols(n)
}

#[test]
fn server_state_is_below_64_bytes_per_worker_plus_a_constant() {
    let (small, large) = (1_000u32, 10_000u32);
    let configs = with_workers(small).into_iter().zip(with_workers(large));
    println!("{:<14} {:>14} {:>12} {:>18}", "protocol", "bytes/worker", "constant", "declared/worker");
    for (a, b) in configs {
        let (bytes_a, bytes_b) = (server_bytes(&a), server_bytes(&b));
        let per_worker = (bytes_b - bytes_a) as f64 / f64::from(large - small);
        let constant = bytes_a as f64 - per_worker * f64::from(small);
        println!("{:<14} {per_worker:>14.1} {constant:>12.0} {:>18}", a.name(), b.per_worker_bytes());
        assert!(per_worker < 64.0, "{}: {per_worker} bytes per worker", a.name());
        // Within a byte of the declared cost (allocator rounding of the per-n tables).
        assert!(per_worker <= b.per_worker_bytes() as f64 + 1.0, "{}: more than the declared record", a.name());
        // The constant is the server itself: no table grows with `n` outside the records.
        assert!(constant < 256.0 * 1024.0, "{}: constant {constant} bytes", a.name());
    }
}
