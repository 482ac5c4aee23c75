//! The output queues' capacity, proven at the largest worker count: every protocol runs
//! through joins, full rounds, stragglers, parked pulls and lost workers with more workers
//! than the old fixed tables held, and the synchronous ones with `n = MAX_WORKERS`, and no
//! output ever finds its queue (of a constant depth) full; a caller that does not drain is
//! refused with `Capacity` before anything changes, and still nothing is lost.

use super::testkit::prelude::*;
use crate::id::MAX_WORKERS;
use crate::proto::any::WorkerSetup;
use crate::proto::asp::AspConfig;
use crate::proto::backup::{BackupConfig, Interrupt};
use crate::proto::bap::BapConfig;
use crate::proto::bsp::BspConfig;
use crate::proto::dbw::DbwConfig;
use crate::proto::grouped::GroupedConfig;
use crate::proto::ssp::SspConfig;
use crate::proto::wbsp::WbspConfig;
use crate::proto::{AnyServer, AnyWorker, Heap, ProtocolConfig};
use std::collections::VecDeque;
use std::vec;
use std::vec::Vec;

const DIM: usize = 4;

/// More workers than the tables of the fixed-size design (256) held.
const SOME: u32 = 300;

type Srv = AnyServer<f64, Vec<f64>, Heap>;

fn configs(n: u32) -> Vec<ProtocolConfig> {
    let mut backup_b = BackupConfig::new(n, 0.1, 8);
    backup_b.interrupt = Interrupt::RunToCompletion;
    let mut bap = BapConfig::new(n, 0.1, 2);
    bap.iteration_timeout = Some(Duration::from_millis(5));
    let mut wbsp = WbspConfig::new(n, 0.1);
    wbsp.round_deadline = Some(Duration::from_millis(5));
    vec![
        ProtocolConfig::Bsp(BspConfig::new(n, 0.1)),
        ProtocolConfig::Asp(AspConfig::new(n, 0.1)),
        ProtocolConfig::Backup(BackupConfig::new(n, 0.1, 8)),
        ProtocolConfig::Backup(backup_b),
        ProtocolConfig::Dbw(DbwConfig::new(n, 0.1)),
        ProtocolConfig::Ssp(SspConfig::new(n, 0.1, 2)),
        ProtocolConfig::Bap(bap),
        ProtocolConfig::Wbsp(wbsp),
        ProtocolConfig::Grouped(GroupedConfig::new(n, 0.1, 1)),
        ProtocolConfig::Grouped(GroupedConfig::new(n, 0.1, 16)),
    ]
}

/// Runs every worker of `config` in lock step over a FIFO network for `inputs` server
/// inputs; worker `N - 1` dies after its third gradient, so full rounds close first, then
/// rounds wait, pulls park and deadlines fire. Returns the most outputs one drain produced
/// and the version reached.
fn run(config: &ProtocolConfig, inputs: usize) -> (usize, u64) {
    let dim = DIM;
    let n = config.workers();
    let mut server: Srv = AnyServer::new(config, vec![0.0; dim], vec![0.0; config.server_scratch_len(dim)]).unwrap();
    let mut workers: Vec<AnyWorker<f64, Vec<f64>>> = (0..n)
        .map(|i| {
            let setup = WorkerSetup { id: WorkerId(i), epoch: 1, rejoin_after: None };
            AnyWorker::new(config, setup, vec![0.0; dim], vec![0.0; config.worker_scratch_len(dim)]).unwrap()
        })
        .collect();
    let mut to_server: VecDeque<(u32, ToServerOwned)> = VecDeque::new();
    let mut to_workers: VecDeque<(u32, ToWorkerOwned)> = VecDeque::new();
    let mut computing: VecDeque<(u32, ComputeId)> = VecDeque::new();
    let mut now = Instant::ZERO;
    let mut widest = 0;
    let mut last_worker_computed = 0;
    let mut drain_worker = |i: u32,
                            w: &mut AnyWorker<f64, Vec<f64>>,
                            ts: &mut VecDeque<(u32, ToServerOwned)>,
                            c: &mut VecDeque<(u32, ComputeId)>| {
        while let Some(out) = w.poll_output() {
            match out {
                WorkerOutput::Send(msg) => ts.push_back((i, ToServerOwned::from(&msg))),
                WorkerOutput::Compute { id, .. } => {
                    if i == n - 1 {
                        last_worker_computed += 1;
                        if last_worker_computed > 3 {
                            continue;
                        }
                    }
                    c.push_back((i, id));
                }
                WorkerOutput::Event(_) => {}
            }
        }
        assert_eq!(w.outputs_lost(), 0, "worker {i} lost an output");
    };
    for (i, w) in workers.iter_mut().enumerate() {
        drain_worker(i as u32, w, &mut to_server, &mut computing);
    }
    let mut handled = 0;
    let mut declared_lost = false;
    while handled < inputs {
        now = now + Duration::from_micros(700);
        if let Some((i, msg)) = to_server.pop_front() {
            let mut buf = Vec::new();
            let _ = server.handle(now, WorkerId(i), msg.as_msg(&mut buf));
            handled += 1;
        } else if let Some((i, msg)) = to_workers.pop_front() {
            let w = &mut workers[i as usize];
            let mut buf = Vec::new();
            let _ = w.handle(now, msg.as_msg(&mut buf));
            drain_worker(i, w, &mut to_server, &mut computing);
            continue;
        } else if let Some((i, id)) = computing.pop_front() {
            let w = &mut workers[i as usize];
            let _ = w.handle_gradient(now, id, &[1.0, -1.0, 0.5, 0.25]);
            drain_worker(i, w, &mut to_server, &mut computing);
            continue;
        } else if !declared_lost {
            // Nothing in flight, the dead worker holds everyone up: the transport declares it
            // lost (parked pulls are answered, rounds close without it, all at once).
            declared_lost = true;
            let _ = server.handle_worker_lost(now, WorkerId(n - 1));
            handled += 1;
        } else {
            // Nothing in flight: let the deadlines fire.
            now = server.poll_timeout().map_or(now, |t| t.max(now));
            server.handle_timeout(now);
            handled += 1;
            for (i, w) in workers.iter_mut().enumerate() {
                w.handle_timeout(now);
                drain_worker(i as u32, w, &mut to_server, &mut computing);
            }
        }
        let mut outputs = 0;
        while let Some(out) = server.poll_output() {
            outputs += 1;
            if let ServerOutput::Send { to, msg } = out {
                let owned = ToWorkerOwned::from(&msg);
                match to {
                    Recipient::Worker(w) => to_workers.push_back((w.0, owned)),
                    Recipient::AllWorkers => to_workers.extend((0..n).map(|w| (w, owned.clone()))),
                }
            }
        }
        widest = widest.max(outputs);
        assert_eq!(server.stats().outputs_lost, 0, "{}: an output found the queue full", config.name());
    }
    (widest, server.version().0)
}

/// Every protocol, with more workers than the old fixed tables held.
#[test]
fn no_output_is_lost_with_hundreds_of_workers() {
    check_no_output_is_lost(configs(SOME), 12 * SOME as usize);
}

/// The synchronous protocols and ASP at the largest `n` (the others' per-input costs make
/// a run of this length too slow for a unit test; their queue depth does not depend on `n`).
#[test]
fn no_output_is_lost_at_the_largest_worker_count() {
    let n = MAX_WORKERS as u32;
    let configs = configs(n).into_iter().filter(|c| {
        matches!(
            c,
            ProtocolConfig::Bsp(_) | ProtocolConfig::Asp(_) | ProtocolConfig::Backup(_) | ProtocolConfig::Dbw(_)
        )
    });
    check_no_output_is_lost(configs.collect(), 3 * MAX_WORKERS);
}

fn check_no_output_is_lost(configs: Vec<ProtocolConfig>, inputs: usize) {
    for config in configs {
        let n = config.workers();
        let (widest, version) = run(&config, inputs);
        std::println!("{}: widest {widest}, version {version}", config.name());
        assert!(version >= 2, "{}: reached only version {version}", config.name());
        // Rounds of (nearly) all `n` workers closed: the per-contributor outputs of one
        // close. ASP and WBSP produce O(1) outputs per input (WBSP reports each delta on
        // arrival); DBW chooses how many gradients to wait for.
        let round_size = match config {
            ProtocolConfig::Asp(_) | ProtocolConfig::Wbsp(_) | ProtocolConfig::Dbw(_) => 1,
            ProtocolConfig::Backup(c) => c.aggregate(),
            ProtocolConfig::Grouped(c) => n / c.groups,
            _ => n - 1,
        };
        assert!(widest >= round_size as usize, "{}: widest drain {widest} < {round_size}", config.name());
    }
}

#[test]
fn a_caller_that_does_not_drain_is_refused_before_anything_is_lost() {
    for config in configs(SOME) {
        let n = config.workers();
        let dim = DIM;
        let mut server: Srv =
            AnyServer::new(&config, vec![0.0; dim], vec![0.0; config.server_scratch_len(dim)]).unwrap();
        let mut refused = false;
        // Joins answer with a model each; never drained, the queue fills.
        for round in 0..8u32 {
            for i in 0..n {
                let before = server.stats().rejected;
                match server.handle(Instant::ZERO, WorkerId(i), ToServer::Join { epoch: round + 1 }) {
                    Err(Reject::Capacity) => {
                        refused = true;
                        assert_eq!(server.stats().rejected, before + 1);
                    }
                    Err(other) => panic!("{}: unexpected refusal {other:?}", config.name()),
                    Ok(()) => {}
                }
            }
        }
        assert!(refused, "{}: a full queue refuses input", config.name());
        assert_eq!(server.stats().outputs_lost, 0, "{}: nothing lost", config.name());
        let mut drained = 0;
        while server.poll_output().is_some() {
            drained += 1;
        }
        assert!(drained > 0);
    }
}
