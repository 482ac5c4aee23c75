//! The TCP server's per-parameter path, alone in its process: BSP over loopback with `n`
//! worker processes (this program again, `work` mode) that return a constant gradient, so
//! every instruction and every CPU second of this process is the server's (its protocol
//! thread, its connections' reader and writer threads).
//!
//! ```text
//! tcp_count serve D UPDATES [N [PATH]]  # server CPU per update (all its threads), N = 2 workers
//! tcp_count work ADDR ID                # one worker (started by `serve`)
//! ```
//!
//! `PATH` is `tcp` (every gradient and model through the sockets), `shm` (through the
//! sessions' shared-memory slots, the server's default for workers on its host) or `both`
//! (the default: one run of each, in that order, in this process). `serve` prints one line
//! per run: the path, `d`, `updates`, the server's CPU time per update (user + system,
//! every thread, from `/proc/self/task/*/schedstat`) over the updates after a warm-up of
//! [`WARMUP`] versions, the CPU time of a memory copy of the `2·n·d·4` bytes an update moves
//! through the server and the ratio of the two, and each worker's CPU time per update outside its gradient job
//! (every thread of the worker process, less the job's own CPU time). Under callgrind
//! (which does not follow the worker processes) the difference of two runs with different
//! update counts, divided by `D · Δupdates`, is the server's instructions per parameter per
//! update:
//!
//! ```text
//! valgrind --tool=callgrind --callgrind-out-file=/tmp/a.out target/release/examples/tcp_count serve 1000000 5 2 shm
//! valgrind --tool=callgrind --callgrind-out-file=/tmp/b.out target/release/examples/tcp_count serve 1000000 25 2 shm
//! ```

use std::io::{BufRead, BufReader};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};
use syncopate::{Version, WorkerId};
use syncopate_adapters::scenario::ProtocolKind;
use syncopate_adapters::tcp::{
    Note, ProtocolSettings, RunPlan, RunSettings, ServerOptions, TcpServer, WorkerOptions, run_worker,
};

/// Model versions before the measured ones (buffers paged in, socket windows grown).
const WARMUP: u64 = 3;

/// CPU time (ns) every live thread of this process has run so far (Linux); 0 elsewhere.
fn cpu_ns() -> u64 {
    let Ok(tasks) = std::fs::read_dir("/proc/self/task") else {
        return 0;
    };
    tasks
        .filter_map(Result::ok)
        .filter_map(|t| std::fs::read_to_string(t.path().join("schedstat")).ok())
        .filter_map(|s| s.split_whitespace().next().and_then(|f| f.parse::<u64>().ok()))
        .sum()
}

/// CPU time (ns) the calling thread has run so far (Linux); 0 elsewhere.
fn thread_cpu_ns() -> u64 {
    std::fs::read_to_string("/proc/thread-self/schedstat")
        .ok()
        .and_then(|s| s.split_whitespace().next().and_then(|f| f.parse::<u64>().ok()))
        .unwrap_or(0)
}

/// The least CPU time (ms) of five copies of `len` `f32`s (`copy_from_slice`, buffers
/// already paged in): the memory copy the server's CPU per update is compared with.
fn memcpy_ms(len: usize) -> f64 {
    let src = vec![1.0f32; len];
    let mut dst = vec![0.0f32; len];
    (0..5)
        .map(|_| {
            let t = thread_cpu_ns();
            dst.copy_from_slice(std::hint::black_box(&src));
            std::hint::black_box(&dst);
            thread_cpu_ns().saturating_sub(t) as f64 / 1e6
        })
        .fold(f64::INFINITY, f64::min)
}

fn serve(dim: usize, updates: u64, n: u32, shared_memory: bool) -> Result<(), String> {
    let protocol = ProtocolSettings::named(ProtocolKind::Bsp, n, 1e-6);
    let mut options = ServerOptions::new(RunSettings::new(protocol, dim));
    options.shared_memory = shared_memory;
    let server = TcpServer::bind("127.0.0.1:0", options).map_err(|e| e.to_string())?;
    let addr = server.local_addr().map_err(|e| e.to_string())?.to_string();
    let exe = std::env::current_exe().map_err(|e| e.to_string())?;
    let mut children = Vec::new();
    for i in 0..n {
        let child = Command::new(&exe)
            .args(["work", &addr, &i.to_string()])
            .env("TCP_COUNT_UPDATES", updates.to_string())
            .stdout(Stdio::piped())
            .spawn()
            .map_err(|e| format!("cannot start worker {i}: {e}"))?;
        children.push(child);
    }
    let last = WARMUP + updates;
    let plan = RunPlan { max_gradients: last * u64::from(n), time_limit: Some(Duration::from_secs(600)) };
    let (mut from, mut to) = ((0u64, Instant::now()), (0u64, Instant::now()));
    let report = server.run(vec![0.5f32; dim], Version::ZERO, &plan, &mut |note| {
        if let Note::Model { version, .. } = note {
            if version.0 == WARMUP {
                from = (cpu_ns(), Instant::now());
            } else if version.0 == last {
                to = (cpu_ns(), Instant::now());
            }
        }
    });
    let report = report.map_err(|e| e.to_string())?;
    let mut worker_ms = Vec::new();
    for mut child in children {
        let out = child.stdout.take().map(|s| BufReader::new(s).lines().map_while(Result::ok).collect::<Vec<_>>());
        let _ = child.wait();
        let ms = out.unwrap_or_default().iter().find_map(|l| l.strip_prefix("worker_cpu_ms=").map(str::to_owned));
        worker_ms.push(ms.unwrap_or_else(|| "?".into()));
    }
    let per = |x: f64| x / updates as f64;
    let server_ms = per(to.0.saturating_sub(from.0) as f64 / 1e6);
    let copy_ms = memcpy_ms(2 * n as usize * dim);
    let path = if shared_memory { "shm" } else { "tcp" };
    println!(
        "path={path} via_shm={} d={dim} n={n} updates={updates} version={} server_cpu_ms={server_ms:.3} wall_ms={:.3} memcpy_ms={copy_ms:.3} \
         server/memcpy={:.2} worker_cpu_ms_outside_job={}",
        report.via_shared_memory,
        report.version.0,
        per(to.1.saturating_duration_since(from.1).as_secs_f64() * 1e3),
        server_ms / copy_ms,
        worker_ms.join(",")
    );
    Ok(())
}

fn work(addr: &str, id: u32) -> Result<(), String> {
    let updates: u64 = std::env::var("TCP_COUNT_UPDATES").ok().and_then(|s| s.parse().ok()).unwrap_or(0);
    let last = WARMUP + updates;
    let mut opts = WorkerOptions::new(addr, WorkerId(id));
    // A large model can take longer than the default rejoin wait to arrive on a loaded
    // machine; a re-sent Join would make the server send it again.
    opts.rejoin_after = None;
    let (mut calls, mut in_job, mut from, mut to) = (0u64, 0u64, 0u64, (0u64, 0u64));
    let mut job = |_params: &[f32], grad: &mut [f32]| {
        // The job's call k computes on version k: the window runs from the call on the
        // server's first measured version to the call on its last but one.
        if calls == WARMUP {
            from = cpu_ns();
            in_job = 0;
        } else if calls + 1 == last {
            to = (cpu_ns(), in_job);
        }
        calls += 1;
        let t = thread_cpu_ns();
        grad.fill(1e-3);
        in_job += thread_cpu_ns().saturating_sub(t);
    };
    run_worker(&opts, &mut job, &mut |_| {}).map_err(|e| e.to_string())?;
    if to.0 > from && updates > 1 {
        let outside = to.0.saturating_sub(from).saturating_sub(to.1) as f64 / 1e6;
        println!("worker_cpu_ms={:.3}", outside / (updates - 1) as f64);
    }
    Ok(())
}

fn main() {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let arg = |i: usize| args.get(i).map(String::as_str);
    let result = match arg(0) {
        Some("serve") => {
            let dim = arg(1).and_then(|s| s.parse().ok()).unwrap_or(1_000_000);
            let updates = arg(2).and_then(|s| s.parse().ok()).unwrap_or(20);
            let n = arg(3).and_then(|s| s.parse().ok()).unwrap_or(2);
            match arg(4).unwrap_or("both") {
                "tcp" => serve(dim, updates, n, false),
                "shm" => serve(dim, updates, n, true),
                "both" => serve(dim, updates, n, false).and_then(|()| serve(dim, updates, n, true)),
                other => Err(format!("PATH must be tcp, shm or both, not {other:?}")),
            }
        }
        Some("work") => match (arg(1), arg(2).and_then(|s| s.parse().ok())) {
            (Some(addr), Some(id)) => work(addr, id),
            _ => Err("usage: tcp_count work ADDR ID".into()),
        },
        _ => Err("usage: tcp_count serve D UPDATES [N [tcp|shm|both]] | tcp_count work ADDR ID".into()),
    };
    if let Err(e) = result {
        eprintln!("tcp_count: {e}");
        std::process::exit(2);
    }
}
