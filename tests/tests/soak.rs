//! The soak tier's worker (`tests/soak.sh` runs it; ignored by plain `cargo test`): one
//! protocol of the swarm simulator over a range of seeds, every fault kind drawn per seed
//! (worker crashes included), the invariants and the conservation ledger checked after every
//! event. Unlike the fast tier it goes on after a failure and counts safety violations and
//! hangs (liveness, `L1`) apart. Prints one `soak:` line.
//!
//! `SOAK_PROTOCOL` (a name of `fault::protocols`), `SOAK_FIRST_SEED` (1), `SOAK_SEEDS` (100),
//! `SOAK_STEPS` (3000). The ignored test `protocols_list` prints those names on one
//! `soak-protocols:` line (the script's default list).

use syncopate_tests::fault::{Counts, Sim, SimSpec, protocols};

fn env(name: &str, default: u64) -> u64 {
    std::env::var(name).ok().and_then(|v| v.parse().ok()).unwrap_or(default)
}

#[test]
#[ignore = "soak tier: run by tests/soak.sh"]
fn protocols_list() {
    let names: Vec<&str> = protocols().into_iter().map(|(name, _)| name).collect();
    println!("soak-protocols: {}", names.join(" "));
}

#[test]
#[ignore = "soak tier: run by tests/soak.sh"]
fn soak() {
    let name = std::env::var("SOAK_PROTOCOL").unwrap_or_else(|_| "bsp".into());
    let first = env("SOAK_FIRST_SEED", 1);
    let seeds = env("SOAK_SEEDS", 100);
    let steps = env("SOAK_STEPS", 3000);
    let p = protocols().into_iter().find(|(n, _)| *n == name).unwrap_or_else(|| panic!("unknown protocol {name}")).1;
    let t = std::time::Instant::now();
    let mut total = Counts::default();
    let (mut violations, mut hangs) = (0u64, 0u64);
    let mut first_failure = String::new();
    for seed in first..first + seeds {
        let r = Sim::new(SimSpec::swarm(p, seed, steps)).run();
        total.add(&r.counts);
        if let Some(v) = r.violation {
            if v.contains("L1 ") || v.contains("(hang)") {
                hangs += 1
            } else {
                violations += 1
            }
            if first_failure.is_empty() {
                first_failure = v;
            }
        }
    }
    println!(
        "soak: protocol={name} first_seed={first} seeds={seeds} steps_per_seed={steps} events={} crashes={} server_restarts={} checks={} violations={violations} hangs={hangs} secs={:.1} first_failure={first_failure:?}",
        total.steps,
        total.crashes,
        total.server_restarts,
        total.checks,
        t.elapsed().as_secs_f64()
    );
}
