//! Swarm fault simulation: every protocol, many seeds, a random subset of faults per seed.
//! `SYNCOPATE_SEEDS` (default 200) and `SYNCOPATE_STEPS` (default 3000) size the run.

use syncopate_tests::fault::{Counts, Sim, SimSpec, protocols};

fn env(name: &str, default: u64) -> u64 {
    std::env::var(name).ok().and_then(|v| v.parse().ok()).unwrap_or(default)
}

fn swarm(crashes: bool) {
    let seeds = env("SYNCOPATE_SEEDS", 200);
    let steps = env("SYNCOPATE_STEPS", 3000);
    let first = env("SYNCOPATE_FIRST_SEED", 1);
    let mut failures = Vec::new();
    let only = std::env::var("SYNCOPATE_PROTOCOL").ok();
    for (name, p) in protocols() {
        if only.as_deref().is_some_and(|o| o != name) {
            continue;
        }
        let before = failures.len();
        let mut total = Counts::default();
        let t = std::time::Instant::now();
        for seed in first..first + seeds {
            let mut spec = SimSpec::swarm(p, seed, steps);
            if !crashes {
                spec.faults.crash = 0.0;
            }
            let r = Sim::new(spec).run();
            total.add(&r.counts);
            if let Some(v) = r.violation {
                failures.push(v);
            }
        }
        println!(
            "sim: protocol={name} seeds={seeds} steps={} sent={} lost={} duplicated={} delayed={} partitions={} crashes={} server_restarts={} applied={} dropped={} rejected={} updates={} checks={} max_quiet_ticks={} secs={:.2}",
            total.steps,
            total.sent,
            total.lost,
            total.duplicated,
            total.delayed,
            total.partitions,
            total.crashes,
            total.server_restarts,
            total.applied,
            total.dropped,
            total.rejected,
            total.updates,
            total.checks,
            total.quiet_ticks,
            t.elapsed().as_secs_f64()
        );
        if let Some(f) = failures.get(before) {
            println!("FAIL {name}: {} seeds failed, first: {f}", failures.len() - before);
        }
    }
    assert!(failures.is_empty(), "{} seeds failed", failures.len());
}

/// Fast tier: every fault kind except worker crashes. Safety and liveness violations fail.
#[test]
fn swarm_network_and_server_faults() {
    swarm(false);
}

/// Every fault kind including worker crash/restart.
#[test]
fn swarm_with_worker_crashes() {
    swarm(true);
}
