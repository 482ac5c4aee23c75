//! Zero allocation in steady state, proved with a counting global allocator.
//!
//! 1. The core: every protocol's server and `n` workers (`AnyServer`/`AnyWorker` on `Vec`
//!    buffers made up front), exchanging wire-encoded messages through preallocated
//!    mailboxes, run many rounds after a warm-up with not one allocation.
//! 2. The channel adapter: a BSP server and workers over `channel::star`, encoding into
//!    reused buffers and recycling every packet, allocate nothing per message after warm-up.
//!
//! Both run in sequence from this file's own `main` (`harness = false`): under libtest a
//! second thread (the harness's, waiting for the test's result) allocated now and then while
//! the first region was open (2 to 4 allocations in the BSP run: 1 of 10 runs failed, 9 of 14
//! once BSP's warm-up got faster; with a 100 ms sleep first, none of 12), and only this
//! process's one thread must be counted.

use stats_alloc::{INSTRUMENTED_SYSTEM, Region, StatsAlloc};
use std::alloc::System;
use std::time::Duration;
use syncopate::proto::bsp::BspConfig;
use syncopate::wire::{self, Limits};
use syncopate::{
    AnyServer, AnyWorker, Instant, ProtocolConfig, Server, ServerOutput, Worker, WorkerId, WorkerOutput, WorkerSetup,
};
use syncopate_adapters::channel;
use syncopate_benches::drive::{Cluster, all_protocols};

#[global_allocator]
static GLOBAL: &StatsAlloc<System> = &INSTRUMENTED_SYSTEM;

const DIM: usize = 64;

fn core_state_machines_allocate_nothing() {
    for config in all_protocols(4) {
        let mut cluster = Cluster::new(&config, DIM);
        cluster.run(2_000);
        let region = Region::new(GLOBAL);
        let handled = cluster.run(20_000);
        let stats = region.change();
        assert_eq!(
            (stats.allocations, stats.reallocations),
            (0, 0),
            "{}: {} allocations, {} reallocations over {handled} messages",
            config.name(),
            stats.allocations,
            stats.reallocations
        );
        assert_eq!(cluster.overflow, 0, "{}", config.name());
        assert!(cluster.server().stats().applied > 1_000, "{}: too little progress", config.name());
    }
}

/// BSP over the channel star, one thread driving every port. Returns the server's version.
fn channel_rounds(
    server: &mut AnyServer<f32, Vec<f32>>,
    workers: &mut [AnyWorker<f32, Vec<f32>>],
    ports: &(channel::ServerPort, Vec<channel::WorkerPort>),
    bufs: &mut [Vec<u8>],
    grad: &[f32],
    rounds: usize,
) -> u64 {
    let (server_port, worker_ports) = ports;
    let limits = Limits::for_model(DIM);
    let now = Instant::ZERO;
    let wait = Some(Duration::from_secs(5));
    let (server_buf, worker_bufs) = bufs.split_first_mut().expect("buffers");
    for _ in 0..rounds {
        // Workers: read what the server sent, compute, send.
        for ((w, port), buf) in workers.iter_mut().zip(worker_ports).zip(worker_bufs.iter_mut()) {
            while let Ok(packet) = port.recv(Some(Duration::ZERO)) {
                let msg = wire::decode_to_worker::<f32>(&packet.bytes, &limits).expect("decode");
                w.handle(now, msg).expect("worker handle");
                port.recycle(packet);
            }
            loop {
                let mut job = None;
                while let Some(out) = w.poll_output() {
                    match out {
                        WorkerOutput::Send(msg) => {
                            let n = wire::encode_to_server(&msg, buf).expect("encode");
                            port.send(&buf[..n]).expect("send");
                        }
                        WorkerOutput::Compute { id, .. } => job = Some(id),
                        WorkerOutput::Event(_) => {}
                    }
                }
                let Some(id) = job else { break };
                w.handle_gradient(now, id, grad).expect("gradient");
            }
        }
        // Server: one message from each worker, then the replies.
        for _ in 0..workers.len() {
            let packet = server_port.recv(wait).expect("server recv");
            let from = packet.from.expect("from a worker");
            let msg = wire::decode_to_server::<f32>(&packet.bytes, &limits).expect("decode");
            server.handle(now, from, msg).expect("server handle");
            server_port.recycle(packet);
            while let Some(out) = server.poll_output() {
                if let ServerOutput::Send { to, msg } = out {
                    let n = wire::encode_to_worker(&msg, server_buf).expect("encode");
                    assert!(server_port.send(to, &server_buf[..n]).is_empty());
                }
            }
        }
    }
    server.version().0
}

fn channel_adapter_allocates_nothing_per_message() {
    let n = 4;
    let config = ProtocolConfig::Bsp(BspConfig::new(n, 1e-3));
    let mut server = AnyServer::new(&config, vec![0.5f32; DIM], vec![0.0; DIM]).expect("server");
    let mut workers: Vec<_> = (0..n)
        .map(|i| {
            let setup = WorkerSetup { id: WorkerId(i), epoch: 1, rejoin_after: None };
            AnyWorker::new(&config, setup, vec![0.0f32; DIM], vec![0.0; 1]).expect("worker")
        })
        .collect();
    let ports = channel::star(n as usize, 8);
    let msg_len = Limits::for_model(DIM).max_message_len::<f32>();
    let mut bufs: Vec<Vec<u8>> = (0..=n).map(|_| vec![0u8; msg_len]).collect();
    let grad = vec![1e-3f32; DIM];
    // Warm-up: joins, first model, and every packet pool filled.
    let v0 = channel_rounds(&mut server, &mut workers, &ports, &mut bufs, &grad, 50);
    let region = Region::new(GLOBAL);
    let v1 = channel_rounds(&mut server, &mut workers, &ports, &mut bufs, &grad, 2_000);
    let stats = region.change();
    assert!(v1 >= v0 + 1_999, "BSP made {} updates in 2000 rounds", v1 - v0);
    assert_eq!(
        (stats.allocations, stats.reallocations),
        (0, 0),
        "channel adapter: {} allocations, {} reallocations over {} messages",
        stats.allocations,
        stats.reallocations,
        2_000 * 2 * n
    );
}

fn main() {
    core_state_machines_allocate_nothing();
    channel_adapter_allocates_nothing_per_message();
    println!("alloc_steady: the state machines and the channel adapter allocate nothing in steady state");
}
