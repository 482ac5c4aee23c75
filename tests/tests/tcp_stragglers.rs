//! The straggler report over TCP: one worker burning several times the CPU of the others
//! in its gradient computation stands out by its median step time (its ratio to the median
//! worker), under every kind of protocol, and the per-worker counts of contributions
//! applied, dropped and held add up to the protocol's totals. Without step times the time
//! columns are empty and the counts are still there.

#[path = "tcp_common/mod.rs"]
mod common;

use common::*;
use core::time::Duration;
use std::sync::Arc;
use std::thread::{self, JoinHandle};
use syncopate_adapters::scenario::ProtocolKind;
use syncopate_adapters::tcp::{
    ProtocolSettings, ServerOptions, ServerReport, TcpError, WorkerJob, WorkerReport, run_worker,
};
use syncopate_adapters::workload::{BatchSampler, Scratch, Workload};

/// Real gradients, each computed `reps` times over fresh minibatches: a worker with more
/// repetitions burns more CPU per step (it does not sleep).
struct Burning {
    w: Arc<Workload>,
    sampler: BatchSampler,
    scratch: Scratch,
    batch: Vec<usize>,
    reps: u32,
}

impl WorkerJob for Burning {
    fn gradient(&mut self, params: &[f32], grad: &mut [f32]) -> Duration {
        for _ in 0..self.reps {
            self.sampler.next_batch(BATCH, &mut self.batch);
            self.w.model.gradient(params, &self.w.train, &self.batch, grad, &mut self.scratch);
        }
        Duration::ZERO
    }
}

fn spawn(addr: core::net::SocketAddr, id: u32, reps: u32) -> JoinHandle<Result<WorkerReport, TcpError>> {
    let w = workload();
    thread::spawn(move || {
        let mut job = Burning {
            sampler: BatchSampler::new(w.train.len(), SEED + u64::from(id)),
            scratch: w.model.scratch(),
            batch: Vec::new(),
            reps,
            w,
        };
        run_worker(&worker_options(addr, id), &mut job, &mut |_| {})
    })
}

/// A run of `protocol` over 3 workers, worker 2 burning `slow` times the CPU of the others
/// per step, until `gradients` are accepted.
fn run(protocol: ProtocolSettings, step_times: bool, slow: u32, gradients: u64) -> ServerReport {
    let mut settings = run_settings(protocol);
    settings.report_step_times = step_times;
    let server = start_server(ServerOptions::new(settings), &workload(), plan(gradients, 60));
    let workers: Vec<_> = (0..3).map(|i| spawn(server.addr, i, if i == 2 { 20 * slow } else { 20 })).collect();
    let report = server.finish();
    for w in workers {
        w.join().expect("worker thread").expect("worker");
    }
    report
}

/// The rows' counts add up to the protocol's totals.
#[track_caller]
fn check_counts(r: &ServerReport) {
    let rows = &r.stragglers;
    assert_eq!(rows.iter().map(|w| w.worker).collect::<Vec<_>>(), [0, 1, 2]);
    let sum = |f: fn(&syncopate_adapters::tcp::WorkerRow) -> u64| rows.iter().map(f).sum::<u64>();
    assert_eq!(sum(|w| w.applied), r.stats.applied, "{rows:?}");
    assert_eq!(sum(|w| w.dropped), r.stats.dropped_total(), "{rows:?}");
    assert_eq!(sum(|w| w.held), r.stats.accepted - r.stats.applied - r.stats.dropped_total(), "{rows:?}");
}

#[test]
fn a_worker_burning_more_cpu_per_step_stands_out_under_every_kind_of_protocol() {
    bounded(Duration::from_secs(240), || {
        let mut backup = ProtocolSettings::named(ProtocolKind::Backup, 3, 0.5);
        backup.backup_workers = Some(1);
        // The straggler runs its steps to completion (an aborted step reports no time), so
        // its late gradients arrive and are dropped.
        backup.run_to_completion = Some(true);
        let protocols = [
            ProtocolSettings::named(ProtocolKind::Bsp, 3, 0.5),
            ProtocolSettings::named(ProtocolKind::Asp, 3, 0.5),
            backup,
        ];
        for protocol in protocols {
            let name = protocol.name.clone();
            let report = run(protocol, true, 5, 90);
            let rows = &report.stragglers;
            let ratio = |i: usize| rows[i].ratio.unwrap_or_else(|| panic!("{name}: worker {i} has no ratio: {rows:?}"));
            assert!(ratio(2) > 1.5, "{name}: the slow worker's ratio: {rows:?}");
            assert!(ratio(0) < 1.5 && ratio(1) < 1.5, "{name}: the others': {rows:?}");
            assert!(rows.iter().all(|w| w.steps > 0 && w.median_step_s.is_some_and(|s| s > 0.0)), "{name}: {rows:?}");
            check_counts(&report);
            if name == "backup" {
                assert!(rows[2].dropped > 0, "backup: the straggler's late gradients are dropped: {rows:?}");
            }
        }
    });
}

#[test]
fn without_step_times_the_time_columns_are_empty_and_the_counts_remain() {
    bounded(Duration::from_secs(60), || {
        let report = run(ProtocolSettings::named(ProtocolKind::Bsp, 3, 0.5), false, 1, 30);
        let rows = &report.stragglers;
        assert!(rows.iter().all(|w| w.steps == 0 && w.median_step_s.is_none() && w.ratio.is_none()), "{rows:?}");
        assert!(rows.iter().all(|w| w.applied > 0), "{rows:?}");
        check_counts(&report);
        let table = syncopate_adapters::tcp::straggler_lines(rows);
        assert!(table[0].contains("step times none"), "{table:?}");
    });
}
