//! Throughput of the simulator itself with a trivial workload ([`GradientSource::Constant`]):
//! simulated protocol events per wall-clock second. The figure (target: at least 1 million
//! events/s for BSP with 8 workers and the 650-parameter digits softmax model) is printed by
//!
//! `cargo test --release -p syncopate-tests --test sim_throughput -- --ignored --nocapture`
//!
//! The default (dev-profile) test only checks that the trivial mode really skips the
//! workload: it runs and is deterministic.

use std::time::Instant as WallClock;
use syncopate::proto::asp::AspConfig;
use syncopate::proto::bsp::BspConfig;
use syncopate::{Duration, ProtocolConfig};
use syncopate_adapters::sim::{self, GradientSource, SimConfig, SimReport};
use syncopate_adapters::workload::{ModelKind, Workload};

fn trivial(protocol: ProtocolConfig, updates: u64) -> SimConfig {
    let mut c = SimConfig::new(protocol, ModelKind::Softmax)
        .with_gradient(GradientSource::Constant(1e-3))
        .with_max_updates(updates);
    c.stop.max_time = None;
    c.eval_interval = Duration::ZERO;
    c.record_trace = false;
    c
}

fn measure(name: &str, c: &SimConfig, w: &Workload) -> (SimReport, f64) {
    let t = WallClock::now();
    let r = sim::run(c, w);
    let s = t.elapsed().as_secs_f64();
    let rate = r.events as f64 / s;
    eprintln!("{name}: {} events in {s:.3} s = {:.0} events/s ({} updates)", r.events, rate, r.updates);
    (r, rate)
}

#[test]
fn trivial_mode_skips_the_workload_and_is_deterministic() {
    let w = Workload::digits(ModelKind::Softmax, 1);
    let c = trivial(ProtocolConfig::Bsp(BspConfig::new(8, 0.5)), 200);
    let a = sim::run(&c, &w);
    let b = sim::run(&c, &w);
    assert_eq!(a, b);
    assert_eq!(a.updates, 200);
    assert_eq!(a.applied, 8 * 200);
    // Every update moved each parameter by exactly lr × the constant gradient (the mean of
    // eight equal gradients is that gradient), so the model is the initial one shifted.
    let init = w.model.init_params(c.seed);
    for (p, q) in a.final_params.iter().zip(&init) {
        let want = q - 200.0 * 0.5 * 1e-3;
        assert!((p - want).abs() < 1e-3, "{p} vs {want}");
    }
}

#[test]
#[ignore = "throughput figure; run in release"]
fn events_per_second() {
    let w = Workload::digits(ModelKind::Softmax, 1);
    let (r, bsp) =
        measure("bsp, 8 workers, dim 650", &trivial(ProtocolConfig::Bsp(BspConfig::new(8, 0.5)), 50_000), &w);
    assert_eq!(r.codec_errors, 0);
    measure("asp, 8 workers, dim 650", &trivial(ProtocolConfig::Asp(AspConfig::new(8, 0.01)), 400_000), &w);
    assert!(bsp > 0.0);
}
