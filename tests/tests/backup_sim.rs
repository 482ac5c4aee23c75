//! Static backup workers in the simulator: `b = 0` replays BSP's run exactly; with `b > 0`
//! every update averages exactly `n − b` gradients, the late ones are dropped and reported,
//! under both interrupt options; a dead worker does not stop the run while `n − b` live.

use syncopate::proto::backup::{BackupConfig, Interrupt};
use syncopate::proto::bsp::BspConfig;
use syncopate::{Duration, ProtocolConfig, ServerEvent};
use syncopate_adapters::sim::{self, ComputeModel, Crash, Observation, SimConfig};
use syncopate_adapters::workload::{ModelKind, Workload};

const N: u32 = 8;

fn compute() -> Vec<ComputeModel> {
    ComputeModel::all(N, &ComputeModel::ShiftedExp { shift: 1.0, rate: 1.0 })
}

fn config(protocol: ProtocolConfig) -> SimConfig {
    SimConfig::new(protocol, ModelKind::Softmax).with_seed(3).with_compute(compute()).with_max_updates(60)
}

#[test]
fn zero_backups_replays_bsp() {
    let w = Workload::digits(ModelKind::Softmax, 1);
    let bsp = sim::run(&config(ProtocolConfig::Bsp(BspConfig::new(N, 0.5))), &w);
    let backup = sim::run(&config(ProtocolConfig::Backup(BackupConfig::new(N, 0.5, 0))), &w);
    assert_eq!(backup.protocol, "backup");
    assert_eq!(backup.final_params_hash, bsp.final_params_hash);
    assert_eq!(backup.trace_hash, bsp.trace_hash);
    assert_eq!(backup.virtual_time_s, bsp.virtual_time_s);
    assert_eq!(backup.applied, u64::from(N) * backup.updates);
}

#[test]
fn each_update_averages_exactly_n_minus_b_and_late_ones_are_dropped() {
    let w = Workload::digits(ModelKind::Softmax, 1);
    for interrupt in [Interrupt::Abort, Interrupt::RunToCompletion] {
        let b = 3;
        let mut c = BackupConfig::new(N, 0.5, b);
        c.interrupt = interrupt;
        let mut updates = Vec::new();
        let mut dropped = 0u64;
        let mut abandoned = 0u64;
        let r = sim::run_observed(&config(ProtocolConfig::Backup(c)), &w, &mut |o| match o {
            Observation::Server { event: ServerEvent::ModelUpdated { contributions, .. }, .. } => {
                updates.push(*contributions)
            }
            Observation::Server { event: ServerEvent::Dropped { .. }, .. } => dropped += 1,
            Observation::Worker { event: syncopate::WorkerEvent::Abandoned { .. }, .. } => abandoned += 1,
            _ => {}
        });
        assert_eq!(r.updates, 60);
        assert!(updates.iter().all(|k| *k == N - b), "{updates:?}");
        assert_eq!(r.applied, u64::from(N - b) * r.updates);
        assert_eq!(r.dropped.values().sum::<u64>(), dropped);
        match interrupt {
            // Stragglers abandon: (almost) nothing arrives late, much work is cut short.
            Interrupt::Abort => assert!(abandoned > 50 && dropped < abandoned / 4, "{abandoned} {dropped}"),
            // Stragglers finish: every late gradient is dropped, nothing is abandoned.
            Interrupt::RunToCompletion => assert!(abandoned == 0 && dropped > 50, "{abandoned} {dropped}"),
        }
        // Every accepted gradient is applied or dropped, except in the round left open.
        let open = r.accepted - r.applied - dropped;
        assert!(open < u64::from(N), "{open}");
        eprintln!(
            "{:?}: {} updates in {:.3} s, {} dropped, {} abandoned, accuracy {:.3}",
            interrupt, r.updates, r.virtual_time_s, dropped, abandoned, r.final_accuracy
        );
    }
}

#[test]
fn a_dead_worker_does_not_stop_backups() {
    let w = Workload::digits(ModelKind::Softmax, 1);
    let crash = Crash { worker: 2, at: Duration::from_millis(50), restart_after: None, notify_server: false };
    let mut c = config(ProtocolConfig::Backup(BackupConfig::new(N, 0.5, 1)));
    c.crashes = vec![crash];
    let r = sim::run(&c, &w);
    assert_eq!(r.updates, 60, "{}", r.stop_reason);
    let mut c = config(ProtocolConfig::Bsp(BspConfig::new(N, 0.5)));
    c.crashes = vec![crash];
    c.stop.max_time = Some(Duration::from_secs(2));
    assert!(sim::run(&c, &w).updates < 60, "BSP waits for the dead worker");
}
