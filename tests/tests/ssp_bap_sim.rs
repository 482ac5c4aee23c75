//! SSP and BAP in the simulator (8 workers, digits softmax, one worker 4x slower): both
//! reach 0.90 test accuracy in less virtual time than BSP; SSP keeps its invariants in a
//! real run (nothing dropped, staleness bounded); BAP with a time limit leaves a silent
//! worker behind and reports every gradient it drops.
//!
//! Figures: `cargo test -p syncopate-tests --test ssp_bap_sim -- --nocapture figures`.

use syncopate::proto::bap::BapConfig;
use syncopate::proto::bsp::BspConfig;
use syncopate::proto::ssp::SspConfig;
use syncopate::{Duration, ProtocolConfig};
use syncopate_adapters::sim::{self, ComputeModel, Crash, SimConfig, SimReport};
use syncopate_adapters::workload::{ModelKind, Workload};

const N: u32 = 8;
/// The BSP learning rate of the other simulator tests; SSP (averaged steps) and BAP (mean of
/// an iteration) use the same.
const LR: f64 = 0.5;
const SLOW: u32 = 3;

fn bsp() -> ProtocolConfig {
    ProtocolConfig::Bsp(BspConfig::new(N, LR))
}

fn ssp(s: u64) -> ProtocolConfig {
    ProtocolConfig::Ssp(SspConfig::new(N, LR, s))
}

/// BAP as used for the figure: `s_bap = 1`, `t_max = 15 ms` (1.5x the healthy 10 ms step:
/// above a healthy iteration, well below the straggler's 40 ms).
fn bap() -> ProtocolConfig {
    let mut c = BapConfig::new(N, LR, 1);
    c.iteration_timeout = Some(Duration::from_millis(15));
    ProtocolConfig::Bap(c)
}

fn to_target(protocol: ProtocolConfig, w: &Workload) -> SimReport {
    let c = SimConfig::new(protocol, ModelKind::Softmax)
        .with_compute(ComputeModel::one_straggler(N, SLOW, 4.0))
        .stop_at_target(0.90)
        .with_max_updates(40_000);
    let r = sim::run(&c, w);
    eprintln!(
        "{:>4}: time to 0.90 = {:?} s, updates {:?}, applied {}, dropped {:?}, staleness mean {:.2} max {}",
        r.protocol, r.time_to_target, r.updates_to_target, r.applied, r.dropped, r.staleness.mean, r.staleness.max
    );
    r
}

#[test]
fn figures_ssp_and_bap_beat_bsp_with_a_4x_straggler() {
    let w = Workload::digits(ModelKind::Softmax, 1);
    let b = to_target(bsp(), &w);
    let s = to_target(ssp(3), &w);
    let a = to_target(bap(), &w);
    let (tb, ts, ta) = (b.time_to_target.unwrap(), s.time_to_target.unwrap(), a.time_to_target.unwrap());
    eprintln!("time to 0.90 (virtual s): bsp {tb:.3}  ssp(s=3) {ts:.3}  bap(s=1, t_max=15ms) {ta:.3}");
    assert!(ts < tb, "ssp {ts} vs bsp {tb}");
    assert!(ta < tb, "bap {ta} vs bsp {tb}");
    // SSP never drops; its staleness (other workers' updates missed) stays bounded.
    assert_eq!(s.dropped.values().sum::<u64>(), 0);
    assert_eq!(s.applied, s.updates);
    assert_eq!(s.rejected + s.worker_rejects, 0);
    // BAP leaves the straggler out: every closed iteration has the 7 healthy gradients, the
    // straggler's computations are aborted (reported by its worker as abandoned jobs), a
    // gradient that crosses its abort is dropped and reported; all admitted ones add up.
    assert_eq!(a.applied, 7 * a.updates);
    let straggler = &a.per_worker[SLOW as usize];
    assert!(straggler.jobs_abandoned > 0, "{straggler:?}");
    assert!(
        a.accepted - a.applied - a.dropped.values().sum::<u64>() <= 2 * u64::from(N),
        "at most the open iterations"
    );
    assert!(a.staleness.max <= 1);
    assert_eq!(a.rejected + a.worker_rejects, 0);
}

#[test]
fn ssp_zero_matches_bsp_in_the_simulator() {
    let w = Workload::digits(ModelKind::Softmax, 1);
    let run = |p| sim::run(&SimConfig::new(p, ModelKind::Softmax).with_max_updates(8 * 20), &w);
    let s = run(ssp(0));
    let b = sim::run(&SimConfig::new(bsp(), ModelKind::Softmax).with_max_updates(20), &w);
    // Same virtual time per clock as a BSP round (within the per-update message overhead),
    // and the same accuracy after 20 rounds / clocks.
    assert_eq!(s.updates, 160);
    assert!((s.final_accuracy - b.final_accuracy).abs() < 0.02, "{} vs {}", s.final_accuracy, b.final_accuracy);
}

#[test]
fn a_dead_worker_stalls_ssp_at_the_bound_but_not_bap_with_a_time_limit() {
    let w = Workload::digits(ModelKind::Softmax, 1);
    let crash = Crash { worker: SLOW, at: Duration::from_millis(100), restart_after: None, notify_server: false };
    let mut c = SimConfig::new(ssp(2), ModelKind::Softmax).with_max_time(Duration::from_secs(2));
    c.crashes = vec![crash];
    let s = sim::run(&c, &w);
    let mut c = SimConfig::new(bap(), ModelKind::Softmax).with_max_time(Duration::from_secs(2));
    c.crashes = vec![crash];
    let a = sim::run(&c, &w);
    eprintln!(
        "dead worker: ssp updates {} ({:?}); bap updates {} ({:?})",
        s.updates, s.stop_reason, a.updates, a.stop_reason
    );
    // SSP: about 10 clocks before the crash, then s more, then everybody waits.
    assert!(s.updates <= u64::from(N) * 14, "{}", s.updates);
    // BAP keeps closing iterations every ~t_max without the dead worker.
    assert!(a.updates > 100, "{}", a.updates);
}
