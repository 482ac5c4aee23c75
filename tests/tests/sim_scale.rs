//! The simulator at scale: every protocol with 10,000 workers, and the simulator's cost per
//! event as the worker count grows (the engine's work per event must not grow with n beyond
//! the event queue's O(log n)).
//!
//! Both use the trivial workload ([`GradientSource::Constant`]) so that the figure is the
//! engine's and the protocols', not a model's. The default test checks that every protocol
//! runs 10,000 workers and accounts for every gradient; the figure, at two model sizes (the
//! digits softmax, d = 650, whose per-worker buffers outgrow the caches at n = 10,000, and a
//! d = 16 quadratic, whose do not), is printed by
//!
//! `cargo test --release -p syncopate-tests --test sim_scale -- --ignored --nocapture`

use std::time::Instant as WallClock;
use syncopate::ProtocolConfig;
use syncopate_adapters::sim::{self, GradientSource, SimConfig, SimReport};
use syncopate_adapters::workload::{ModelKind, Workload};
use syncopate_benches::drive::all_protocols;

/// A run of `protocol` on the trivial workload that stops after `gradients` accepted
/// contributions (the same compute budget for every protocol).
fn trivial(protocol: ProtocolConfig, gradients: u64) -> SimConfig {
    let mut c = SimConfig::new(protocol, ModelKind::Softmax).with_gradient(GradientSource::Constant(1e-3));
    c.stop.max_time = None;
    c.stop.max_gradients = Some(gradients);
    c.eval_interval = syncopate::Duration::ZERO;
    c.record_trace = false;
    c
}

/// What was accepted but neither applied nor dropped when the run stopped.
fn held(r: &SimReport) -> u64 {
    r.accepted.saturating_sub(r.applied + r.dropped.values().sum::<u64>())
}

#[test]
fn every_protocol_runs_ten_thousand_workers() {
    let n = 10_000u32;
    let w = Workload::digits(ModelKind::Softmax, 1);
    for config in all_protocols(n) {
        let name = config.name();
        // Three contributions per worker: every synchronous protocol closes rounds.
        let r = sim::run(&trivial(config, 3 * u64::from(n)), &w);
        eprintln!(
            "{name}: {} events, {} updates, accepted {} = applied {} + dropped {:?} + held {}",
            r.events,
            r.updates,
            r.accepted,
            r.applied,
            r.dropped,
            held(&r)
        );
        assert_eq!(r.workers, n, "{name}");
        assert_eq!(r.stop_reason, "max_gradients", "{name}");
        assert!(r.accepted >= 3 * u64::from(n), "{name}: accepted {}", r.accepted);
        assert!(r.updates >= 2, "{name}: {} updates", r.updates);
        // Nothing refused, nothing miscounted: every accepted gradient is applied, dropped
        // for a stated reason, or (at most one per worker) held at the stop.
        assert_eq!((r.rejected, r.worker_rejects, r.codec_errors), (0, 0, 0), "{name}");
        let accounted = r.applied + r.dropped.values().sum::<u64>();
        assert!(accounted <= r.accepted, "{name}: applied + dropped {accounted} > accepted {}", r.accepted);
        assert!(held(&r) <= u64::from(n), "{name}: {} held", held(&r));
        assert!(r.applied > 0, "{name}");
    }
}

#[test]
#[ignore = "throughput figure; run in release"]
fn events_per_second_as_workers_grow() {
    let workloads = [
        ("digits softmax, d = 650", Workload::digits(ModelKind::Softmax, 1)),
        ("quadratic, d = 16", Workload::nqm(16, 64, 1)),
    ];
    let sizes = [100u32, 1_000, 10_000];
    for (label, w) in &workloads {
        println!("\n{label}: simulated events per wall-clock second (best of three)\n");
        println!("| protocol | {} | 10,000 / 100 |", sizes.map(|n| format!("n = {n}")).join(" | "));
        println!("|---|---|---|---|---|");
        for (i, name) in all_protocols(8).iter().map(|c| c.name()).enumerate() {
            let rates: Vec<f64> = sizes
                .iter()
                .map(|&n| {
                    // The same 600,000 contributions at every n (60 per worker at n = 10,000);
                    // the best of three runs, as the machine is shared.
                    let config = trivial(all_protocols(n).swap_remove(i), 600_000);
                    (0..3)
                        .map(|_| {
                            let t = WallClock::now();
                            let r = sim::run(&config, w);
                            let s = t.elapsed().as_secs_f64();
                            assert_eq!((r.rejected, r.codec_errors), (0, 0), "{name} n = {n}");
                            r.events as f64 / s
                        })
                        .fold(0.0, f64::max)
                })
                .collect();
            let cells: Vec<String> = rates.iter().map(|r| format!("{:.2} M", r / 1e6)).collect();
            println!("| {name} | {} | {:.2} |", cells.join(" | "), rates[2] / rates[0]);
            assert!(rates.iter().all(|&r| r > 0.0));
        }
    }
}
