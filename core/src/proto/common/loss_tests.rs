//! Losses reported back to back: a driver that finds several workers gone in one pass
//! reports each with `handle_worker_lost` before draining. No report is refused, each lost
//! worker is reported lost exactly once, no output is lost, and a protocol that goes on
//! without lost workers (SSP's clock, BAP's iteration, ASP) goes on.

use super::testkit::prelude::*;
use super::testkit::{Cluster, Entry, Job, NetConfig};
use crate::proto::WorkerSetup;
use crate::proto::asp::AspConfig;
use crate::proto::backup::BackupConfig;
use crate::proto::bap::BapConfig;
use crate::proto::bsp::BspConfig;
use crate::proto::dbw::DbwConfig;
use crate::proto::grouped::GroupedConfig;
use crate::proto::ssp::SspConfig;
use crate::proto::wbsp::WbspConfig;
use crate::proto::{AnyServer, AnyWorker, Heap, ProtocolConfig};
use proptest::prelude::*;
use std::vec;
use std::vec::Vec;

const DIM: usize = 4;

type Srv = AnyServer<f64, Vec<f64>, Heap>;
type Net = Cluster<Srv, AnyWorker<f64, Vec<f64>>>;

/// Every protocol with `n` workers; `which` picks one.
fn config(which: usize, n: u32) -> ProtocolConfig {
    let mut bap = BapConfig::new(n, 0.1, 2);
    bap.iteration_timeout = Some(Duration::from_millis(5));
    let mut wbsp = WbspConfig::new(n, 0.1);
    wbsp.round_deadline = Some(Duration::from_millis(5));
    let all = [
        ProtocolConfig::Bsp(BspConfig::new(n, 0.1)),
        ProtocolConfig::Asp(AspConfig::new(n, 0.1)),
        ProtocolConfig::Backup(BackupConfig::new(n, 0.1, 1)),
        ProtocolConfig::Dbw(DbwConfig::new(n, 0.1)),
        ProtocolConfig::Ssp(SspConfig::new(n, 0.1, 1)),
        ProtocolConfig::Bap(bap),
        ProtocolConfig::Wbsp(wbsp),
        ProtocolConfig::Grouped(GroupedConfig::new(n, 0.1, 2)),
    ];
    all[which % all.len()]
}

const PROTOCOLS: usize = 8;

fn cluster(config: &ProtocolConfig, seed: u64) -> Net {
    let n = config.workers();
    let server: Srv = AnyServer::new(config, vec![0.0; DIM], vec![0.0; config.server_scratch_len(DIM)]).unwrap();
    let workers = (0..n)
        .map(|i| {
            let setup = WorkerSetup { id: WorkerId(i), epoch: 1, rejoin_after: None };
            AnyWorker::new(config, setup, vec![0.0; DIM], vec![0.0; config.worker_scratch_len(DIM)]).unwrap()
        })
        .collect();
    let us = Duration::from_micros;
    let links = NetConfig { latency: (us(100), us(900)), compute: (us(500), us(900)), ..NetConfig::default() };
    let gradient = |_: &Job<'_>| vec![1.0, -1.0, 0.5, 0.25];
    Cluster::new(server, workers, seed, links, gradient).without_snapshots()
}

/// Runs `net` for at most `steps` steps; false if it went quiet.
fn run(net: &mut Net, steps: u64) -> bool {
    for _ in 0..steps {
        if !net.step() {
            return false;
        }
    }
    true
}

/// The workers reported lost since the log was last cleared, in report order.
fn lost_events(net: &Net) -> Vec<u32> {
    net.log
        .iter()
        .filter_map(|e| match e {
            Entry::Event(ServerEvent::WorkerLost { worker }) => Some(worker.0),
            _ => None,
        })
        .collect()
}

/// Whether any of `ws` got a message accepted since the log was last cleared (it is live
/// again: a late message proves it is there).
fn heard_from(net: &Net, ws: &[usize]) -> bool {
    net.log.iter().any(|e| matches!(e, Entry::ServerIn { worker, result: Ok(()), .. } if ws.contains(worker)))
}

/// Worker `ws[0]` straggles (stops computing) after `before` steps, so the others wait
/// for it where the protocol waits; after `wait` more steps every worker of `ws` is lost
/// at once.
fn check(which: usize, n: u32, ws: &[usize], seed: u64, before: u64, wait: u64) -> Result<(), TestCaseError> {
    let config = config(which, n);
    let name = config.name();
    let mut net = cluster(&config, seed);
    run(&mut net, before);
    net.speed[ws[0]] = 0.0;
    run(&mut net, wait);
    // Who is live before the losses: a worker declared lost (by the protocol itself, as WBSP
    // at a round deadline) is live again once a message of it is accepted.
    let mut live = vec![true; n as usize];
    for e in &net.log {
        match e {
            Entry::Event(ServerEvent::WorkerLost { worker }) => live[worker.index()] = false,
            Entry::ServerIn { worker, result: Ok(()), .. } => live[*worker] = true,
            _ => {}
        }
    }
    net.log.clear();
    let answers = net.lose_all(ws);
    for (w, a) in ws.iter().zip(&answers) {
        prop_assert_eq!(*a, Ok(()), "{}: the loss of worker {} was refused", name, w);
    }
    let mut lost = lost_events(&net);
    lost.sort_unstable();
    let mut want: Vec<u32> = ws.iter().filter(|w| live[**w]).map(|w| *w as u32).collect();
    want.sort_unstable();
    prop_assert_eq!(lost, want, "{}: every live worker lost is reported lost once", name);
    prop_assert_eq!(net.server.stats().outputs_lost, 0, "{}: no output lost", name);
    // The protocols that promise to go on without lost workers do.
    let goes_on = matches!(config, ProtocolConfig::Ssp(_) | ProtocolConfig::Bap(_) | ProtocolConfig::Asp(_));
    if goes_on && ws.len() < n as usize {
        let version = net.version().0;
        net.log.clear();
        run(&mut net, 4000);
        if !heard_from(&net, ws) {
            prop_assert!(net.version().0 > version, "{}: stuck at version {} after the losses", name, version);
        }
    }
    Ok(())
}

/// SSP and BAP queue a batch when a loss releases the workers waiting for the lost one: the
/// next loss of the same pass meets it.
#[test]
fn two_losses_in_one_pass_while_the_first_releases_waiting_workers() {
    for which in 0..PROTOCOLS {
        for ws in [[3usize, 1].as_slice(), &[3, 0, 2], &[3, 2, 1, 0]] {
            check(which, 5, ws, 7, 200, 2000).unwrap_or_else(|e| panic!("{e}"));
        }
    }
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(64))]

    #[test]
    fn losses_reported_back_to_back_are_each_applied_once(
        which in 0..PROTOCOLS,
        n in 3u32..8,
        picks in proptest::collection::vec(0usize..8, 2..6),
        seed in any::<u64>(),
        before in 0u64..600,
        wait in 0u64..2000,
    ) {
        let mut ws: Vec<usize> = Vec::new();
        for p in picks {
            let w = p % n as usize;
            if !ws.contains(&w) {
                ws.push(w);
            }
        }
        prop_assume!(ws.len() >= 2);
        check(which, n, &ws, seed, before, wait)?;
    }
}
