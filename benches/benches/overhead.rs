//! State-machine overhead: nanoseconds per inbound control message at every protocol's
//! server (decode, `handle`, drain `poll_output`, encode the replies), with d = 16 so the
//! tensor work is negligible. Workers run untimed between server phases.
//!
//! Ids: `overhead/<protocol>/n<workers>`.

use criterion::{BenchmarkId, Criterion, criterion_group, criterion_main};
use std::time::{Duration, Instant};
use syncopate_benches::drive::{Cluster, all_protocols};

const DIM: usize = 16;

fn overhead(c: &mut Criterion) {
    let mut group = c.benchmark_group("overhead");
    for n in [4u32] {
        for config in all_protocols(n) {
            let mut cluster = Cluster::new(&config, DIM);
            cluster.run(1000); // warm-up: joins, first models
            group.bench_function(BenchmarkId::new(config.name(), format!("n{n}")), |b| {
                b.iter_custom(|iters| {
                    let (mut spent, mut handled) = (Duration::ZERO, 0u64);
                    while handled < iters {
                        cluster.worker_phase();
                        let start = Instant::now();
                        handled += cluster.server_phase() as u64;
                        spent += start.elapsed();
                    }
                    // Scale to exactly `iters` messages.
                    spent.mul_f64(iters as f64 / handled as f64)
                })
            });
            assert_eq!(cluster.overflow, 0, "{}: mailbox overflow", config.name());
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
