//! End-to-end BSP rounds with a trivial workload (every worker returns a constant gradient
//! of d `f32` at once), over (a) the in-process channel star with the core wire codec and
//! (b) the TCP adapter on loopback. Prints one markdown row per configuration: the median
//! round time (model version to model version at the server) and the bytes per second of
//! gradients aggregated.
//!
//! `cargo run -p syncopate-benches --release --bin rounds -- [--quick]`

use std::sync::{Arc, Mutex};
use std::thread;
use std::time::{Duration, Instant};
use syncopate::proto::bsp::BspConfig;
use syncopate::wire::{self, Limits};
use syncopate::{
    AnyServer, AnyWorker, Instant as CoreInstant, ProtocolConfig, Server, ServerEvent, ServerOutput, Version, Worker,
    WorkerId, WorkerOutput, WorkerSetup,
};
use syncopate_adapters::channel;
use syncopate_adapters::tcp::{Note, RunPlan, ServerOptions, TcpServer, WorkerOptions, run_worker};

fn median(mut xs: Vec<f64>) -> f64 {
    xs.sort_by(f64::total_cmp);
    xs.get(xs.len() / 2).copied().unwrap_or(f64::NAN)
}

/// Round times (s) from the instants of successive model versions, skipping `warmup`.
fn round_times(stamps: &[Instant], warmup: usize) -> Vec<f64> {
    stamps.windows(2).skip(warmup).map(|w| (w[1] - w[0]).as_secs_f64()).collect()
}

/// BSP over `channel::star`: one server thread and `n` worker threads.
fn channel_bsp(n: u32, dim: usize, rounds: u64) -> Vec<f64> {
    let config = ProtocolConfig::Bsp(BspConfig::new(n, 1e-6));
    let (server_port, worker_ports) = channel::star(n as usize, 4);
    let limits = Limits::for_model(dim);
    let msg_len = limits.max_message_len::<f32>();
    let workers: Vec<_> = worker_ports
        .into_iter()
        .map(|port| {
            thread::spawn(move || {
                let setup = WorkerSetup { id: port.id(), epoch: 1, rejoin_after: None };
                let mut w = AnyWorker::new(&config, setup, vec![0.0f32; dim], vec![0.0; 1]).expect("worker");
                let grad = vec![1e-3f32; dim];
                let mut buf = vec![0u8; msg_len];
                let now = CoreInstant::ZERO;
                loop {
                    loop {
                        let mut job = None;
                        while let Some(out) = w.poll_output() {
                            match out {
                                WorkerOutput::Send(msg) => {
                                    let len = wire::encode_to_server(&msg, &mut buf).expect("encode");
                                    if port.send(&buf[..len]).is_err() {
                                        return;
                                    }
                                }
                                WorkerOutput::Compute { id, .. } => job = Some(id),
                                WorkerOutput::Event(_) => {}
                            }
                        }
                        let Some(id) = job else { break };
                        let _ = w.handle_gradient(now, id, &grad);
                    }
                    if w.is_stopped() {
                        return;
                    }
                    let Ok(packet) = port.recv(None) else { return };
                    if let Ok(msg) = wire::decode_to_worker::<f32>(&packet.bytes, &limits) {
                        let _ = w.handle(now, msg);
                    }
                    port.recycle(packet);
                }
            })
        })
        .collect();
    let mut server = AnyServer::new(&config, vec![0.5f32; dim], vec![0.0; dim]).expect("server");
    let mut buf = vec![0u8; msg_len];
    let mut stamps = Vec::with_capacity(rounds as usize + 1);
    let now = CoreInstant::ZERO;
    while server.version().0 < rounds {
        let Ok(packet) = server_port.recv(Some(Duration::from_secs(30))) else { break };
        if let (Some(from), Ok(msg)) = (packet.from, wire::decode_to_server::<f32>(&packet.bytes, &limits)) {
            let _ = server.handle(now, from, msg);
        }
        server_port.recycle(packet);
        while let Some(out) = server.poll_output() {
            match out {
                ServerOutput::Send { to, msg } => {
                    let len = wire::encode_to_worker(&msg, &mut buf).expect("encode");
                    server_port.send(to, &buf[..len]);
                }
                ServerOutput::Event(ServerEvent::ModelUpdated { .. }) => stamps.push(Instant::now()),
                ServerOutput::Event(_) => {}
            }
        }
    }
    server.stop();
    while let Some(out) = server.poll_output() {
        if let ServerOutput::Send { to, msg } = out {
            let len = wire::encode_to_worker(&msg, &mut buf).expect("encode");
            server_port.send(to, &buf[..len]);
        }
    }
    // Workers may still be sending; keep draining until they have all stopped.
    let drain = thread::spawn(move || while server_port.recv(Some(Duration::from_secs(2))).is_ok() {});
    for w in workers {
        let _ = w.join();
    }
    let _ = drain.join();
    round_times(&stamps, 2)
}

/// BSP over the TCP adapter on loopback: `n` worker threads with `run_worker`.
fn tcp_bsp(n: u32, dim: usize, rounds: u64) -> Result<Vec<f64>, String> {
    let config = ProtocolConfig::Bsp(BspConfig::new(n, 1e-6));
    let options = ServerOptions::new(config, dim);
    let server = TcpServer::bind("127.0.0.1:0", options).map_err(|e| e.to_string())?;
    let addr = server.local_addr().map_err(|e| e.to_string())?.to_string();
    let stamps = Arc::new(Mutex::new(Vec::with_capacity(rounds as usize + 1)));
    let workers: Vec<_> = (0..n)
        .map(|i| {
            let opts = WorkerOptions::new(addr.clone(), WorkerId(i), config, dim);
            thread::spawn(move || {
                run_worker(&opts, &mut |_params, grad| grad.fill(1e-3), &mut |_| {}).map_err(|e| e.to_string())
            })
        })
        .collect();
    let plan = RunPlan { max_gradients: rounds * u64::from(n), time_limit: Some(Duration::from_secs(300)) };
    let sink = Arc::clone(&stamps);
    let report = server.run(vec![0.5f32; dim], Version::ZERO, &plan, &mut |note| {
        if let Note::Model { .. } = note {
            sink.lock().expect("stamps").push(Instant::now());
        }
    });
    for w in workers {
        let _ = w.join();
    }
    report.map_err(|e| e.to_string())?;
    let stamps = stamps.lock().expect("stamps").clone();
    Ok(round_times(&stamps, 2))
}

/// The median `MPI_Allreduce` time (s) of `dim` floats over `n` ranks with the byte transfer
/// layers `btl`, by running the peer program under `mpirun`; `None` if it did not run.
fn mpi_allreduce(bin: &str, btl: &str, n: u32, dim: usize, iters: u64) -> Option<f64> {
    let out = std::process::Command::new("mpirun")
        .args(["--allow-run-as-root", "--oversubscribe", "--mca", "btl", btl, "-np", &n.to_string(), bin])
        .args([dim.to_string(), iters.to_string()])
        .output()
        .ok()?;
    let text = String::from_utf8_lossy(&out.stdout);
    let line = text.lines().find(|l| l.starts_with("mpi "))?;
    let ms = line.split_whitespace().find_map(|f| f.strip_prefix("median_ms="))?;
    ms.parse::<f64>().ok().map(|ms| ms / 1e3)
}

fn row(transport: &str, n: u32, dim: usize, times: &[f64], peer: Option<(&str, f64)>) {
    let m = median(times.to_vec());
    let gbs = (u64::from(n) * dim as u64 * 4) as f64 / m / 1e9;
    let (peer_name, peer_ms, ratio) = match peer {
        Some((name, t)) => (name, format!("{:.3}", t * 1e3), format!("{:.2}x", t / m)),
        None => ("–", "–".into(), "–".into()),
    };
    println!(
        "| {transport} | {n} | {dim:.0e} | {} | {:.3} | {gbs:.2} | {peer_name} | {peer_ms} | {ratio} |",
        times.len(),
        m * 1e3
    );
}

fn main() {
    let args: Vec<String> = std::env::args().collect();
    let quick = args.iter().any(|a| a == "--quick");
    let mpi = args.iter().position(|a| a == "--mpi").and_then(|i| args.get(i + 1)).cloned();
    // OpenMPI 4 calls its shared-memory transport `vader`, OpenMPI 5 `sm`.
    let shm_btl = mpi.as_deref().and_then(|bin| {
        ["self,vader", "self,sm"].into_iter().find(|btl| mpi_allreduce(bin, btl, 2, 1000, 3).is_some())
    });
    println!(
        "| transport | n | d | rounds | median round (ms) | gradient GB/s | MPI peer (btl) | MPI_Allreduce (ms) | MPI / ours |"
    );
    println!("|---|---:|---:|---:|---:|---:|---|---:|---:|");
    for dim in [1_000_000usize, 10_000_000] {
        let rounds = match (quick, dim >= 10_000_000) {
            (true, _) => 6,
            (false, true) => 20,
            (false, false) => 60,
        };
        for n in [2u32, 4] {
            let peer = |btl: Option<&'static str>| {
                let (bin, btl) = (mpi.as_deref()?, btl?);
                mpi_allreduce(bin, btl, n, dim, rounds).map(|t| (btl, t))
            };
            row("channel", n, dim, &channel_bsp(n, dim, rounds), peer(shm_btl));
            match tcp_bsp(n, dim, rounds) {
                Ok(t) => row("tcp", n, dim, &t, peer(Some("self,tcp"))),
                Err(e) => println!("| tcp | {n} | {dim:.0e} | – | failed: {e} | – | – | – | – |"),
            }
        }
    }
}
