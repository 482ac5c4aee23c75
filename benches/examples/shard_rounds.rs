//! Simulated BSP round time against the number of server shards, beside a ring allreduce
//! over the same links.
//!
//! Every node has a 10 Gb/s network card (1.25 GB/s each way) and every message 50 µs of
//! latency; computing a gradient takes no time, so a round is communication and the
//! servers' arithmetic only (see the simulator's `shards` module for the network model).
//! For each model size `d` and worker count `n` it runs BSP for three updates on one server
//! with a card of its own (S = 1), on S = 2, 4, … dedicated shard machines, and on S = n
//! shards co-located with the workers, and prints the mean of the last two rounds of the
//! slowest shard against the ring-allreduce model `2(n−1)/n · 4d / bandwidth + 2(n−1) ·
//! latency`.
//!
//! ```text
//! cargo run --release -p syncopate-benches --example shard_rounds [d ...]
//! ```
//!
//! Arguments: model sizes (default `1000000 25000000`). A run needs about `2·n·d·4` bytes
//! of worker buffers; runs above [`MEMORY_LIMIT`] bytes are listed as skipped.

use syncopate::proto::bsp::BspConfig;
use syncopate::{Duration, ProtocolConfig};
use syncopate_adapters::sim::{self, GradientSource, SimConfig, SimReport};
use syncopate_adapters::workload::{ModelKind, Workload};

const BANDWIDTH: f64 = 1.25e9;
const LATENCY_US: u64 = 50;
/// The largest estimated footprint of one run (worker buffers, servers, messages in flight).
const MEMORY_LIMIT: f64 = 8e9;

fn ring_allreduce(n: u32, d: usize) -> f64 {
    let n = f64::from(n);
    2.0 * (n - 1.0) / n * d as f64 * 4.0 / BANDWIDTH + 2.0 * (n - 1.0) * LATENCY_US as f64 * 1e-6
}

/// The mean of the last two rounds of the slowest shard, seconds.
fn round_time(r: &SimReport) -> f64 {
    r.shards
        .iter()
        .filter_map(|s| Some((s.update_times_s.get(2)? - s.update_times_s.first()?) / 2.0))
        .fold(0.0, f64::max)
}

fn main() {
    let dims: Vec<usize> = std::env::args().skip(1).filter_map(|a| a.parse().ok()).collect();
    let dims = if dims.is_empty() { vec![1_000_000, 25_000_000] } else { dims };
    println!("| d | n | servers | BSP round (ms) | ring allreduce (ms) | ratio |");
    println!("|---|---|---|---|---|---|");
    for &d in &dims {
        let workload = Workload::nqm(d, 1, 1);
        for n in [8u32, 16, 64] {
            let ring = ring_allreduce(n, d);
            let footprint = 2.0 * f64::from(n) * d as f64 * 4.0 * 1.5;
            let mut layouts: Vec<(u32, bool)> = vec![(1, false)];
            layouts.extend([2u32, 4, 8, 16].into_iter().filter(|&s| s < n).map(|s| (s, false)));
            layouts.push((n, true));
            for (shards, colocate) in layouts {
                let label = match (shards, colocate) {
                    (1, _) => "1 server".to_string(),
                    (s, false) => format!("{s} dedicated shards"),
                    (s, true) => format!("{s} co-located shards"),
                };
                if footprint > MEMORY_LIMIT {
                    println!(
                        "| {d} | {n} | {label} | skipped (about {:.0} GB) | {:.2} | |",
                        footprint / 1e9,
                        ring * 1e3
                    );
                    continue;
                }
                let mut c = SimConfig::new(ProtocolConfig::Bsp(BspConfig::new(n, 0.1)), ModelKind::Nqm { dim: d })
                    .with_gradient(GradientSource::Constant(0.0))
                    .with_max_updates(3)
                    .with_shards(shards, colocate);
                c.base_step = Duration::ZERO;
                c.eval_interval = Duration::ZERO;
                c.record_trace = false;
                c.network.bandwidth = BANDWIDTH;
                c.network.latency = Duration::from_micros(LATENCY_US);
                let r = match sim::try_run_sharded(&c, &workload) {
                    Ok(r) => r,
                    Err(e) => {
                        println!("| {d} | {n} | {label} | not run: {e} | | |");
                        continue;
                    }
                };
                let t = round_time(&r);
                println!("| {d} | {n} | {label} | {:.2} | {:.2} | {:.2} |", t * 1e3, ring * 1e3, t / ring);
            }
        }
    }
}
