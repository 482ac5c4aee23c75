//! State-machine overhead: nanoseconds per inbound control message at every protocol's
//! server, with d = 16 so the tensor work is negligible, two ways:
//!
//! - `mem_n4`: `handle` of in-memory messages (`Values::Slice` payloads) and draining
//!   `poll_output`, copying each output once ([`syncopate_benches::inmem::MemCluster`]);
//!   the figure the state-machine target is stated for;
//! - `wire_n4`: the same plus decoding each inbound message from its wire bytes and
//!   encoding each reply for each recipient ([`syncopate_benches::drive::Cluster`]).
//!
//! Workers run untimed between server phases; the cost of the two clock reads around each
//! phase is measured and subtracted. Ids: `overhead/<protocol>/<mode>_n<workers>`.

use criterion::{BenchmarkId, Criterion, criterion_group, criterion_main};
use std::time::{Duration, Instant};
use syncopate_benches::drive::{Cluster, all_protocols};
use syncopate_benches::inmem::MemCluster;

const DIM: usize = 16;

/// The two halves of a lock-step cluster.
trait Phases {
    fn workers(&mut self);
    fn server(&mut self) -> usize;
}

impl Phases for MemCluster {
    fn workers(&mut self) {
        self.worker_phase();
    }
    fn server(&mut self) -> usize {
        self.server_phase()
    }
}

impl Phases for Cluster {
    fn workers(&mut self) {
        self.worker_phase();
    }
    fn server(&mut self) -> usize {
        self.server_phase()
    }
}

/// The cost of reading the clock around an empty region (the median of many), subtracted
/// from every timed server phase: a phase handles only about n messages, so the two clock
/// reads would otherwise add several ns to every message.
fn timer_overhead() -> Duration {
    let mut samples: Vec<Duration> = (0..2001)
        .map(|_| {
            let start = Instant::now();
            start.elapsed()
        })
        .collect();
    samples.sort();
    samples[samples.len() / 2]
}

/// Times the server phase alone over at least `iters` messages, scaled to exactly `iters`.
fn time_server(iters: u64, cluster: &mut impl Phases) -> Duration {
    let overhead = timer_overhead();
    let (mut spent, mut handled) = (Duration::ZERO, 0u64);
    while handled < iters {
        cluster.workers();
        let start = Instant::now();
        handled += cluster.server() as u64;
        spent += start.elapsed().saturating_sub(overhead);
    }
    spent.mul_f64(iters as f64 / handled as f64)
}

fn overhead(c: &mut Criterion) {
    let mut group = c.benchmark_group("overhead");
    for n in [4u32] {
        for config in all_protocols(n) {
            let mut mem = MemCluster::new(&config, DIM);
            mem.run(1000); // warm-up: joins, first models
            group.bench_function(BenchmarkId::new(config.name(), format!("mem_n{n}")), |b| {
                b.iter_custom(|iters| time_server(iters, &mut mem))
            });
            assert_eq!(mem.overflow, 0, "{}: queue overflow", config.name());

            let mut wire = Cluster::new(&config, DIM);
            wire.run(1000);
            group.bench_function(BenchmarkId::new(config.name(), format!("wire_n{n}")), |b| {
                b.iter_custom(|iters| time_server(iters, &mut wire))
            });
            assert_eq!(wire.overflow, 0, "{}: mailbox overflow", config.name());
        }
    }
    group.finish();
}

criterion_group! {
    name = benches;
    config = Criterion::default()
        .warm_up_time(Duration::from_millis(300))
        .measurement_time(Duration::from_secs(1))
        .without_plots();
    targets = overhead
}
criterion_main!(benches);
