//! The output queues' capacity, proven at the largest worker count: every protocol runs
//! through joins, full rounds, stragglers, parked pulls and lost workers with hundreds of
//! workers (more than the default inline table holds), and the synchronous ones with `n = MAX_WORKERS`, and no
//! output ever finds its queue (of a constant depth) full; a caller that does not drain is
//! refused with `Capacity` before anything changes, and still nothing is lost.

use super::testkit::prelude::*;
use super::testkit::{Cluster, Entry, Job, NetConfig};
use crate::id::MAX_WORKERS;
use crate::proto::asp::AspConfig;
use crate::proto::backup::{BackupConfig, Interrupt};
use crate::proto::bap::BapConfig;
use crate::proto::bsp::BspConfig;
use crate::proto::dbw::DbwConfig;
use crate::proto::grouped::GroupedConfig;
use crate::proto::ssp::SspConfig;
use crate::proto::wbsp::WbspConfig;
use crate::proto::{AnyServer, Heap, ProtocolConfig};
use std::vec;
use std::vec::Vec;

const DIM: usize = 4;

/// More workers than the default inline table (`DEFAULT_INLINE_WORKERS`, 256) holds.
const SOME: u32 = 300;

type Srv = AnyServer<f64, Vec<f64>, Heap>;

pub(crate) fn configs(n: u32) -> Vec<ProtocolConfig> {
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

/// Runs every worker of `config` on the test network ([`Cluster`]: FIFO links, fixed
/// latency and compute time, so the workers go in lock step) until the server handled
/// `inputs` messages; worker `n - 1` stops computing after its third computation, so full
/// rounds close first, then rounds wait, pulls park and deadlines fire, and once the network
/// is quiet the transport declares it lost (parked pulls are answered, rounds close without
/// it, all at once). Returns the most outputs one drain of the server produced and the
/// version reached.
fn run(config: &ProtocolConfig, inputs: usize) -> (usize, u64) {
    let dim = DIM;
    let n = config.workers();
    let server: Srv = AnyServer::new(config, vec![0.0; dim], vec![0.0; config.server_scratch_len(dim)]).unwrap();
    let workers = any_workers(config, dim);
    let us = Duration::from_micros;
    let links =
        NetConfig { latency: (us(100), us(1300)), compute: (us(700), us(700)), fifo: true, ..NetConfig::default() };
    let gradient = |_: &Job<'_>| vec![1.0, -1.0, 0.5, 0.25];
    let mut net = Cluster::new(server, workers, 0, links, gradient).without_snapshots();
    let last = n as usize - 1;
    let (mut widest, mut handled, mut issued, mut declared_lost) = (0, 0, 0, false);
    // The step bound only stops a run that fires timers and nothing else.
    while handled < inputs && net.counts.steps < 64 * inputs as u64 {
        if !net.step() {
            if declared_lost {
                break;
            }
            // Nothing in flight, the dead worker holds everyone up.
            declared_lost = true;
            net.lose(last);
        }
        let mut outputs = 0;
        for e in net.log.drain(..) {
            match e {
                Entry::ServerIn { .. } | Entry::Lost { .. } => handled += 1,
                Entry::Event(_) | Entry::Sent { .. } => outputs += 1,
                Entry::Compute { worker, .. } if worker == last => issued += 1,
                _ => {}
            }
        }
        if issued >= 3 {
            net.speed[last] = 0.0;
        }
        widest = widest.max(outputs);
    }
    assert_eq!(net.server.stats().outputs_lost, 0, "{}: an output found the queue full", config.name());
    for w in 0..n as usize {
        assert_eq!(net.worker(w).map_or(0, |w| w.outputs_lost()), 0, "worker {w} lost an output");
    }
    (widest, net.version().0)
}

/// Every protocol, with more workers than the default inline table holds.
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
