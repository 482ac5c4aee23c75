//! BSP round time over loopback TCP with the model on one server against the model split
//! over two shard servers (`serve --shard I/2`), in one process.
//!
//! `n` workers (default 4) and the servers are threads of this process talking over
//! 127.0.0.1 with the real TCP adapter (frames, handshake, heartbeats; no shared secret, so
//! no MACs). A gradient costs nothing to compute (the worker hands back the same constant
//! gradient), so a round is the adapter's and the servers' work only: encoding, the
//! kernel's loopback copies, decoding, the finiteness check and the sum, for `n·d` floats
//! up and `n·d` down. Three setups are measured, interleaved so that machine load drifts
//! alike over all of them: one unsharded server (`S = 1`), the sharded worker over one shard
//! (`S = 1 sharded`: the sharded path's own cost), and two shards (`S = 2`). Each run
//! serves `rounds` BSP rounds; the figure is the mean round after the first two (a round
//! ends when every shard has published it). The 1-minute load average is read before each
//! run.
//!
//! ```text
//! cargo run --release -p syncopate-benches --example tcp_shard_rounds [d] [n] [rounds] [repeats]
//! ```
//!
//! Defaults: `d = 10000000`, `n = 4`, `rounds = 10`, `repeats = 3`.

use core::time::Duration;
use std::sync::{Arc, Mutex};
use std::thread;
use std::time::Instant;
use syncopate::{ProtocolKind, Version, WorkerId};
use syncopate_adapters::tcp::{
    Note, ProtocolSettings, RunPlan, RunSettings, ServerOptions, ShardSettings, TcpServer, WorkerOptions,
    run_sharded_worker, run_worker,
};

#[derive(Clone, Copy, Debug, PartialEq)]
enum Setup {
    Single,
    ShardedOne,
    Shards(u32),
}

impl Setup {
    fn name(self) -> String {
        match self {
            Self::Single => "S = 1".into(),
            Self::ShardedOne => "S = 1 sharded".into(),
            Self::Shards(s) => format!("S = {s}"),
        }
    }

    fn shards(self) -> u32 {
        match self {
            Self::Single | Self::ShardedOne => 1,
            Self::Shards(s) => s,
        }
    }
}

/// This process's CPU time (all threads, user and system) in seconds, from `/proc/self/stat`
/// (clock ticks of 10 ms).
fn cpu_seconds() -> f64 {
    let stat = std::fs::read_to_string("/proc/self/stat").unwrap_or_default();
    // Fields after the command name (which ends with ')'): utime and stime are the 12th
    // and 13th.
    let rest = stat.rsplit_once(')').map_or("", |(_, r)| r);
    let fields: Vec<f64> = rest.split_whitespace().filter_map(|f| f.parse().ok()).collect();
    (fields.get(11).copied().unwrap_or(f64::NAN) + fields.get(12).copied().unwrap_or(f64::NAN)) / 100.0
}

fn load_average() -> f64 {
    std::fs::read_to_string("/proc/loadavg")
        .ok()
        .and_then(|s| s.split_whitespace().next()?.parse().ok())
        .unwrap_or(f64::NAN)
}

/// Seconds per round after the first two, and CPU seconds per round over the whole run
/// (every thread: workers, servers, their connections), for one run of `setup`.
fn run(setup: Setup, d: usize, n: u32, rounds: u64) -> (f64, f64) {
    let cpu = cpu_seconds();
    let count = setup.shards();
    let base = RunSettings::new(ProtocolSettings::named(ProtocolKind::Bsp, n, 1e-3), d);
    let times: Arc<Mutex<Vec<Vec<Instant>>>> = Arc::new(Mutex::new(vec![Vec::new(); count as usize]));
    let mut addrs = Vec::new();
    let mut servers = Vec::new();
    for k in 0..count {
        let mut settings = base.clone();
        if setup != Setup::Single {
            settings.shard = Some(ShardSettings { index: k, count, run: "bench".into() });
        }
        let len = settings.served_range().expect("layout").len();
        let mut options = ServerOptions::new(settings);
        options.lost_after = Duration::from_secs(60);
        let server = TcpServer::bind("127.0.0.1:0", options).expect("bind");
        addrs.push(server.local_addr().expect("addr").to_string());
        let times = Arc::clone(&times);
        let plan = RunPlan { max_gradients: rounds * u64::from(n), time_limit: Some(Duration::from_secs(600)) };
        servers.push(thread::spawn(move || {
            server
                .run(vec![0.0; len], Version::ZERO, &plan, &mut |note| {
                    if let Note::Model { .. } = note {
                        if let Some(t) = times.lock().expect("times").get_mut(k as usize) {
                            t.push(Instant::now());
                        }
                    }
                })
                .expect("server")
        }));
    }
    let list = addrs.join(",");
    let workers: Vec<_> = (0..n)
        .map(|i| {
            let list = list.clone();
            thread::spawn(move || {
                let mut options = WorkerOptions::new(list, WorkerId(i));
                options.lost_after = Duration::from_secs(60);
                let mut job = |_: &[f32], g: &mut [f32]| {
                    if g.first() != Some(&1e-6) {
                        g.fill(1e-6);
                    }
                };
                if setup == Setup::Single {
                    run_worker(&options, &mut job, &mut |_| {}).expect("worker");
                } else {
                    run_sharded_worker(&options, &mut job, &mut |_| {}).expect("sharded worker");
                }
            })
        })
        .collect();
    for s in servers {
        s.join().expect("server thread");
    }
    for w in workers {
        w.join().expect("worker thread");
    }
    let cpu = (cpu_seconds() - cpu) / rounds as f64;
    let times = times.lock().expect("times");
    // Round r ends when every shard has published version r (the initial model is not
    // published by a Note::Model).
    let ends: Vec<Instant> = (0..rounds as usize)
        .filter_map(|r| times.iter().map(|t| t.get(r).copied()).collect::<Option<Vec<_>>>()?.into_iter().max())
        .collect();
    let (Some(first), Some(last)) = (ends.get(1), ends.last()) else { return (f64::NAN, cpu) };
    (last.duration_since(*first).as_secs_f64() / (ends.len() - 2) as f64, cpu)
}

fn main() {
    let args: Vec<u64> = std::env::args().skip(1).filter_map(|a| a.parse().ok()).collect();
    let d = args.first().copied().unwrap_or(10_000_000) as usize;
    let n = args.get(1).copied().unwrap_or(4) as u32;
    let rounds = args.get(2).copied().unwrap_or(10).max(4);
    let repeats = args.get(3).copied().unwrap_or(3).max(1);
    let setups = [Setup::Single, Setup::ShardedOne, Setup::Shards(2)];
    let mut results: Vec<Vec<f64>> = vec![Vec::new(); setups.len()];
    let mut cpus: Vec<Vec<f64>> = vec![Vec::new(); setups.len()];
    println!("d = {d}, n = {n}, BSP, {rounds} rounds per run, loopback TCP, {} cores", cores());
    for rep in 0..repeats {
        for (i, setup) in setups.iter().enumerate() {
            let load = load_average();
            let (t, cpu) = run(*setup, d, n, rounds);
            println!(
                "repeat {rep}: {:<14} round {:8.1} ms   CPU per round {:8.1} ms   (load average {load:.2})",
                setup.name(),
                t * 1e3,
                cpu * 1e3
            );
            results[i].push(t);
            cpus[i].push(cpu);
        }
    }
    println!();
    println!("| setup | BSP round, median (ms) | min | max | vs S = 1 | CPU per round, median (ms) | vs S = 1 |");
    println!("|---|---|---|---|---|---|---|");
    let median = |v: &[f64]| {
        let mut v = v.to_vec();
        v.sort_by(f64::total_cmp);
        v[v.len() / 2]
    };
    let (single, single_cpu) = (median(&results[0]), median(&cpus[0]));
    for ((setup, r), c) in setups.iter().zip(&results).zip(&cpus) {
        let (m, mc) = (median(r), median(c));
        let (lo, hi) = r.iter().fold((f64::INFINITY, 0.0f64), |(a, b), x| (a.min(*x), b.max(*x)));
        println!(
            "| {} | {:.1} | {:.1} | {:.1} | {:.2}x | {:.1} | {:.2}x |",
            setup.name(),
            m * 1e3,
            lo * 1e3,
            hi * 1e3,
            m / single,
            mc * 1e3,
            mc / single_cpu
        );
    }
    let gb = 2.0 * f64::from(n) * d as f64 * 4.0 / 1e9;
    println!();
    println!("each round moves {gb:.2} GB through loopback ({} floats up and down per worker)", d);
}

fn cores() -> usize {
    thread::available_parallelism().map_or(1, usize::from)
}
