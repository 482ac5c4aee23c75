//! End-to-end BSP rounds with a trivial workload (every worker returns a constant gradient
//! of d `f32` at once), over (a) the in-process channel star with the core wire codec and
//! (b) the TCP adapter on loopback. Prints one markdown row per configuration: the median
//! round time (model version to model version at the server) and the bytes per second of
//! gradients aggregated.
//!
//! Next to each row: the MPI peers of the same floats and ranks (`benches/mpi/allreduce.c`
//! under `mpirun`, with `--mpi BIN`): `MPI_Allreduce` (the target) and `MPI_Reduce` to rank 0
//! + `MPI_Bcast` (the gather/broadcast pattern of a parameter server).
//!
//! With `--mpi-adapter BIN` (the `mpi_rounds` binary, feature `mpi`) it also runs (c) BSP
//! over the MPI adapter, `mpirun -n N+1` (a server rank and N worker ranks), next to the MPI
//! peers of the same floats on N ranks (the same number of gradients) and, in a second row,
//! on N+1 ranks (the same ranks as ours; the rank in the server's place sums a vector too), over the same
//! shared-memory transport. With
//! `--mpi-baseline BIN` (another build of `mpi_rounds`, e.g. before a change) it runs that one
//! too, interleaved, as the row "mpi (baseline)". With `--mpi` as well it runs the bare
//! point-to-point star of the peer program on N+1 ranks (`allreduce D ITERS star`: gradients
//! in to rank 0, summed as they land, the sum back out; no protocol, no codec), whole and in
//! segments: the rows "p2p star" and "p2p star, segments", the lower bound of any star.
//!
//! `cargo run -p syncopate-benches --release --bin rounds -- --help`

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

/// Model versions before the measured rounds (the first rounds page in buffers and grow
/// socket windows).
const WARMUP: u64 = 3;

/// CPU time (ns) all threads of this process have run so far, from
/// `/proc/self/task/*/schedstat` (Linux); `None` elsewhere.
fn cpu_ns() -> Option<u64> {
    let mut total = 0u64;
    for task in std::fs::read_dir("/proc/self/task").ok()? {
        let path = task.ok()?.path().join("schedstat");
        let text = std::fs::read_to_string(path).unwrap_or_default();
        total += text.split_whitespace().next().and_then(|f| f.parse::<u64>().ok()).unwrap_or(0);
    }
    Some(total)
}

/// One run: the time (s) of each measured round and the CPU time per round (s) of every
/// thread (server, workers, and for TCP the socket readers and writers), which machine
/// noise inflates far less than wall time.
#[derive(Debug, Default)]
struct Run {
    times: Vec<f64>,
    cpu: Option<f64>,
}

/// Collects the instant of every model version.
#[derive(Debug)]
struct Stamps {
    at: Vec<Instant>,
    cpu_from: Option<u64>,
    cpu_to: Option<u64>,
    last: u64,
}

impl Stamps {
    fn new(last: u64) -> Self {
        Self { at: Vec::with_capacity(last as usize + 1), cpu_from: None, cpu_to: None, last }
    }

    fn version(&mut self, v: Version) {
        self.at.push(Instant::now());
        if v.0 == WARMUP {
            self.cpu_from = cpu_ns();
        } else if v.0 == self.last {
            self.cpu_to = cpu_ns();
        }
    }

    /// Round times from successive model versions after the warm-up.
    fn run(&self) -> Run {
        let times: Vec<f64> =
            self.at.windows(2).skip(WARMUP as usize - 1).map(|w| (w[1] - w[0]).as_secs_f64()).collect();
        let cpu = match (self.cpu_from, self.cpu_to) {
            (Some(a), Some(b)) if !times.is_empty() => Some(b.saturating_sub(a) as f64 / 1e9 / times.len() as f64),
            _ => None,
        };
        Run { times, cpu }
    }
}

/// BSP over `channel::star`: one server thread and `n` worker threads.
fn channel_bsp(n: u32, dim: usize, rounds: u64) -> Run {
    let config = ProtocolConfig::Bsp(BspConfig::new(n, 1e-6));
    let (server_port, worker_ports) = channel::star(n as usize, 4);
    let limits = Limits::for_model(dim);
    let workers: Vec<_> = worker_ports
        .into_iter()
        .map(|port| {
            thread::spawn(move || {
                let setup = WorkerSetup { id: port.id(), epoch: 1, rejoin_after: None };
                let mut w = AnyWorker::new(&config, setup, vec![0.0f32; dim], vec![0.0; 1]).expect("worker");
                let grad = vec![1e-3f32; dim];
                let now = CoreInstant::ZERO;
                loop {
                    loop {
                        let mut job = None;
                        while let Some(out) = w.poll_output() {
                            match out {
                                WorkerOutput::Send(msg) => {
                                    if port.send_to_server(&msg).is_err() {
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
    let mut server = AnyServer::<f32, Vec<f32>>::new(&config, vec![0.5f32; dim], vec![0.0; dim])
        .and_then(|s| s.with_spare_accumulator(vec![0.0; config.spare_accumulator_len(dim)]))
        .expect("server");
    let mut stamps = Stamps::new(rounds);
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
                    server_port.send_to_worker(to, &msg).expect("encode");
                }
                ServerOutput::Event(ServerEvent::ModelUpdated { version, .. }) => stamps.version(version),
                ServerOutput::Event(_) => {}
                ServerOutput::Upstream(m) => {
                    panic!("the server sent {} upstream; this bench has no upstream", m.kind_name())
                }
            }
        }
    }
    server.stop();
    while let Some(out) = server.poll_output() {
        if let ServerOutput::Send { to, msg } = out {
            server_port.send_to_worker(to, &msg).expect("encode");
        }
    }
    // Workers may still be sending; keep draining until they have all stopped.
    let drain = thread::spawn(move || while server_port.recv(Some(Duration::from_secs(2))).is_ok() {});
    for w in workers {
        let _ = w.join();
    }
    let _ = drain.join();
    stamps.run()
}

/// BSP over the TCP adapter on loopback: `n` worker threads with `run_worker`.
fn tcp_bsp(n: u32, dim: usize, rounds: u64) -> Result<Run, String> {
    let protocol =
        syncopate_adapters::tcp::ProtocolSettings::named(syncopate_adapters::scenario::ProtocolKind::Bsp, n, 1e-6);
    let options = ServerOptions::new(syncopate_adapters::tcp::RunSettings::new(protocol, dim));
    let server = TcpServer::bind("127.0.0.1:0", options).map_err(|e| e.to_string())?;
    let addr = server.local_addr().map_err(|e| e.to_string())?.to_string();
    let stamps = Arc::new(Mutex::new(Stamps::new(rounds)));
    let workers: Vec<_> = (0..n)
        .map(|i| {
            let opts = WorkerOptions::new(addr.clone(), WorkerId(i));
            thread::spawn(move || {
                run_worker(&opts, &mut |_params: &[f32], grad: &mut [f32]| grad.fill(1e-3), &mut |_| {})
                    .map_err(|e| e.to_string())
            })
        })
        .collect();
    let plan = RunPlan { max_gradients: rounds * u64::from(n), time_limit: Some(Duration::from_secs(300)) };
    let sink = Arc::clone(&stamps);
    let report = server.run(vec![0.5f32; dim], Version::ZERO, &plan, &mut |note| {
        if let Note::Model { version, .. } = note {
            sink.lock().expect("stamps").version(version);
        }
    });
    for w in workers {
        let _ = w.join();
    }
    report.map_err(|e| e.to_string())?;
    let run = stamps.lock().expect("stamps").run();
    Ok(run)
}

/// The two MPI peers of one configuration: medians (s) of `MPI_Allreduce` and of
/// `MPI_Reduce` to rank 0 + `MPI_Bcast`.
#[derive(Clone, Copy, Debug)]
struct MpiTimes {
    allreduce: f64,
    reduce_bcast: Option<f64>,
}

/// Runs the peer program `bin` under `mpirun` on `ranks` ranks with the byte transfer layers
/// `btl` and the arguments `args`; the median (s) of each operation it printed, by name.
fn run_peer(bin: &str, btl: &str, ranks: u32, args: &[String]) -> Option<impl Fn(&str) -> Option<f64> + use<>> {
    let out = std::process::Command::new("mpirun")
        .args(["--allow-run-as-root", "--oversubscribe", "--mca", "btl", btl, "-np", &ranks.to_string(), bin])
        .args(args)
        .output()
        .ok()?;
    let text = String::from_utf8_lossy(&out.stdout).into_owned();
    Some(move |op: &str| {
        let line = text.lines().find(|l| l.starts_with("mpi ") && l.split_whitespace().any(|f| f == op))?;
        let ms = line.split_whitespace().find_map(|f| f.strip_prefix("median_ms="))?;
        ms.parse::<f64>().ok().map(|ms| ms / 1e3)
    })
}

/// Runs the peer program under `mpirun` with the byte transfer layers `btl` on `dim` floats
/// over `n` ranks; `None` if it did not run.
fn mpi_peer(bin: &str, btl: &str, n: u32, dim: usize, iters: u64) -> Option<MpiTimes> {
    let median_of = run_peer(bin, btl, n, &[dim.to_string(), iters.to_string()])?;
    // An older peer program prints one line without `op=`: its median is the allreduce.
    let allreduce = median_of("op=allreduce").or_else(|| median_of("mpi"))?;
    Some(MpiTimes { allreduce, reduce_bcast: median_of("op=reduce_bcast") })
}

/// The bare point-to-point star of the peer program on `n + 1` ranks (`bin dim iters star`):
/// medians (s) of whole gradients and of segments summed as they land; `None` if it did not
/// run.
fn mpi_star(bin: &str, btl: &str, n: u32, dim: usize, iters: u64) -> Option<(f64, f64)> {
    let median_of = run_peer(bin, btl, n + 1, &[dim.to_string(), iters.to_string(), "star".into()])?;
    Some((median_of("op=star")?, median_of("op=star_seg")?))
}

/// One run of BSP over the MPI adapter: `mpirun -n n+1 bin dim rounds` with the byte
/// transfer layers `btl`; the round times rank 0 printed.
fn mpi_adapter_bsp(bin: &str, btl: &str, n: u32, dim: usize, rounds: u64) -> Result<Run, String> {
    let out = std::process::Command::new("mpirun")
        .args(["--allow-run-as-root", "--oversubscribe", "--mca", "btl", btl, "-np", &(n + 1).to_string(), bin])
        .args([dim.to_string(), rounds.saturating_sub(WARMUP).max(1).to_string()])
        .output()
        .map_err(|e| format!("cannot run mpirun: {e}"))?;
    let text = String::from_utf8_lossy(&out.stdout);
    let times = text
        .lines()
        .find(|l| l.starts_with("mpi-adapter "))
        .and_then(|l| l.split_whitespace().find_map(|f| f.strip_prefix("times_ms=")))
        .map(|t| t.split(',').filter_map(|x| x.parse::<f64>().ok()).map(|ms| ms / 1e3).collect::<Vec<f64>>())
        .filter(|t| !t.is_empty());
    match times {
        Some(times) => Ok(Run { times, cpu: None }),
        None => {
            let err = String::from_utf8_lossy(&out.stderr);
            Err(format!("no result from {bin}: {}", err.lines().find(|l| !l.trim().is_empty()).unwrap_or("")))
        }
    }
}

/// `a / b` as the table's ratio, or a dash.
fn ratio(a: Option<f64>, b: f64) -> String {
    a.map_or_else(|| "–".into(), |a| format!("{:.2}x", a / b))
}

fn ms(t: Option<f64>) -> String {
    t.map_or_else(|| "–".into(), |t| format!("{:.3}", t * 1e3))
}

/// One table row: the median of the runs' median round times (and their range), the
/// median CPU time per round, next to the median of the MPI runs (each run of the peer
/// reports its own median).
fn row(transport: &str, n: u32, dim: usize, runs: &[Run], btl: Option<&str>, peers: &[MpiTimes]) {
    let rounds = runs.first().map_or(0, |r| r.times.len());
    row_of(transport, n, dim, runs, rounds, btl, peers);
}

/// [`row`] with the rounds per run given (runs that carry one median each, the star's).
fn row_of(transport: &str, n: u32, dim: usize, runs: &[Run], rounds: usize, btl: Option<&str>, peers: &[MpiTimes]) {
    let medians: Vec<f64> = runs.iter().filter(|r| !r.times.is_empty()).map(|r| median(r.times.clone())).collect();
    let m = median(medians.clone());
    let spread = match (medians.iter().copied().reduce(f64::min), medians.iter().copied().reduce(f64::max)) {
        (Some(lo), Some(hi)) if medians.len() > 1 => format!(" ({:.1}–{:.1})", lo * 1e3, hi * 1e3),
        _ => String::new(),
    };
    let cpu: Vec<f64> = runs.iter().filter_map(|r| r.cpu).collect();
    let cpu = (!cpu.is_empty()).then(|| median(cpu));
    let gbs = (u64::from(n) * dim as u64 * 4) as f64 / m / 1e9;
    let all = (!peers.is_empty()).then(|| median(peers.iter().map(|p| p.allreduce).collect()));
    let rb: Vec<f64> = peers.iter().filter_map(|p| p.reduce_bcast).collect();
    let rb = (!rb.is_empty()).then(|| median(rb));
    println!(
        "| {transport} | {n} | {dim:.0e} | {rounds}×{} | {:.3}{spread} | {} | {gbs:.2} | {} | {} | {} | {} | {} |",
        runs.len(),
        m * 1e3,
        ms(cpu),
        if peers.is_empty() { "–" } else { btl.unwrap_or("–") },
        ms(all),
        ratio(all, m),
        ms(rb),
        ratio(rb, m),
    );
}

const USAGE: &str =
    "usage: rounds [--quick] [--mpi BIN] [--mpi-adapter BIN] [--mpi-baseline BIN] [--transport channel|tcp|mpi] \
                     [--n N] [--dim D] [--rounds R] [--repeat K]
  --quick         6 rounds per run instead of 60 (d = 1e6) / 20 (d = 1e7)
  --mpi BIN       also run the MPI peer program BIN (benches/mpi/allreduce.c) under mpirun
  --mpi-adapter B also run BSP over the MPI adapter with B (the mpi_rounds binary); with --mpi,
                  also the bare point-to-point star on N+1 ranks (allreduce D ITERS star)
  --mpi-baseline B also run B, another build of mpi_rounds, interleaved: the row \"mpi (baseline)\"
  --transport T   only this transport: channel, tcp or mpi (default: all available)
  --n N[,N..]     only these numbers of workers (default: 2 and 4)
  --dim D[,D..]   only these model dimensions (default: 1e6 and 1e7)
  --rounds R      rounds per run (the first 3 are warm-up and not counted)
  --repeat K      runs per configuration, ours and the peer's interleaved; the table shows the
                  median of the runs' medians and, in parentheses, their range (default 1)";

fn usage_exit(why: &str) -> ! {
    eprintln!("{why}\n{USAGE}");
    std::process::exit(2);
}

/// The value after `flag`.
fn flag_str(args: &[String], flag: &str) -> Option<String> {
    let i = args.iter().position(|a| a == flag)?;
    Some(args.get(i + 1).cloned().unwrap_or_else(|| usage_exit(&format!("{flag} needs a value"))))
}

/// The whole number after `flag`, written plainly or as `1e6`.
fn flag_num(args: &[String], flag: &str) -> Option<u64> {
    flag_nums(args, flag)?.first().copied()
}

/// The comma-separated whole numbers after `flag`, each written plainly or as `1e6`.
fn flag_nums(args: &[String], flag: &str) -> Option<Vec<u64>> {
    let v = flag_str(args, flag)?;
    let one = |x: &str| {
        x.parse::<u64>().ok().or_else(|| {
            let f = x.parse::<f64>().ok()?;
            (f >= 0.0 && f.fract() == 0.0 && f < 1e15).then_some(f as u64)
        })
    };
    let xs: Option<Vec<u64>> = v.split(',').map(one).collect();
    Some(xs.filter(|xs| !xs.is_empty()).unwrap_or_else(|| usage_exit(&format!("bad value for {flag}: {v}"))))
}

fn main() {
    let args: Vec<String> = std::env::args().skip(1).collect();
    if args.iter().any(|a| a == "--help" || a == "-h") {
        println!("{USAGE}");
        return;
    }
    let quick = args.iter().any(|a| a == "--quick");
    let mpi = flag_str(&args, "--mpi");
    let mpi_adapter = flag_str(&args, "--mpi-adapter");
    let mpi_baseline = flag_str(&args, "--mpi-baseline");
    if mpi_baseline.is_some() && mpi_adapter.is_none() {
        usage_exit("--mpi-baseline needs --mpi-adapter BIN");
    }
    let transport = flag_str(&args, "--transport");
    if transport.as_deref().is_some_and(|t| !["channel", "tcp", "mpi"].contains(&t)) {
        usage_exit("--transport is channel, tcp or mpi");
    }
    if transport.as_deref() == Some("mpi") && mpi_adapter.is_none() {
        usage_exit("--transport mpi needs --mpi-adapter BIN");
    }
    let only_n: Option<Vec<u32>> =
        flag_nums(&args, "--n").map(|ns| ns.into_iter().map(|n| u32::try_from(n).unwrap_or(u32::MAX)).collect());
    let only_dim: Option<Vec<usize>> =
        flag_nums(&args, "--dim").map(|ds| ds.into_iter().map(|d| usize::try_from(d).unwrap_or(usize::MAX)).collect());
    let fixed_rounds = flag_num(&args, "--rounds").map(|r| r.max(4));
    let repeat = flag_num(&args, "--repeat").unwrap_or(1).max(1);
    let want = |t: &str| transport.as_deref().is_none_or(|x| x == t);
    // OpenMPI 4 calls its shared-memory transport `vader`, OpenMPI 5 `sm`.
    let shm_btl = mpi
        .as_deref()
        .and_then(|bin| ["self,vader", "self,sm"].into_iter().find(|btl| mpi_peer(bin, btl, 2, 1000, 3).is_some()));
    println!(
        "| transport | n | d | rounds×runs | median round (ms) | CPU per round (ms) | gradient GB/s | MPI peer (btl) \
         | MPI_Allreduce (ms) | Allreduce / ours | MPI Reduce+Bcast (ms) | Reduce+Bcast / ours |"
    );
    println!("|---|---:|---:|---:|---:|---:|---:|---|---:|---:|---:|---:|");
    let dims: Vec<usize> = only_dim.unwrap_or_else(|| vec![1_000_000, 10_000_000]);
    let ns: Vec<u32> = only_n.unwrap_or_else(|| vec![2, 4]);
    for &dim in &dims {
        let rounds = fixed_rounds.unwrap_or(match (quick, dim >= 10_000_000) {
            (true, _) => 6,
            (false, true) => 20,
            (false, false) => 60,
        });
        for &n in &ns {
            let peer = |btl: Option<&str>| -> Option<MpiTimes> { mpi_peer(mpi.as_deref()?, btl?, n, dim, rounds) };
            if want("channel") {
                let (mut runs, mut peers) = (Vec::new(), Vec::new());
                for _ in 0..repeat {
                    runs.push(channel_bsp(n, dim, rounds));
                    peers.extend(peer(shm_btl));
                }
                row("channel", n, dim, &runs, shm_btl, &peers);
            }
            if let (true, Some(bin), Some(btl)) = (want("mpi"), mpi_adapter.as_deref(), shm_btl) {
                let (mut runs, mut base_runs, mut stars, mut segs, mut peers, mut peers_same) =
                    (Vec::new(), Vec::new(), Vec::new(), Vec::new(), Vec::new(), Vec::new());
                let (mut failed, mut base_failed) = (None, None);
                let per_run = rounds.saturating_sub(WARMUP).max(1);
                for _ in 0..repeat {
                    match mpi_adapter_bsp(bin, btl, n, dim, rounds) {
                        Ok(t) => runs.push(t),
                        Err(e) => failed = Some(e),
                    }
                    if let Some(base) = mpi_baseline.as_deref() {
                        match mpi_adapter_bsp(base, btl, n, dim, rounds) {
                            Ok(t) => base_runs.push(t),
                            Err(e) => base_failed = Some(e),
                        }
                    }
                    if let Some((whole, seg)) = mpi.as_deref().and_then(|peer| mpi_star(peer, btl, n, dim, per_run)) {
                        stars.push(Run { times: vec![whole], cpu: None });
                        segs.push(Run { times: vec![seg], cpu: None });
                    }
                    peers.extend(peer(Some(btl)));
                    // The same ranks as ours (the rank in the server's place contributes a vector too).
                    peers_same.extend(mpi.as_deref().and_then(|bin| mpi_peer(bin, btl, n + 1, dim, rounds)));
                }
                let (on_n, on_same) = (format!("{btl}, {n} ranks"), format!("{btl}, {} ranks", n + 1));
                let failed_row = |name: &str, e: &str| {
                    println!("| {name} | {n} | {dim:.0e} | – | failed: {e} | – | – | – | – | – | – | – |");
                };
                match failed {
                    Some(e) if runs.is_empty() => failed_row("mpi", &e),
                    _ => {
                        row("mpi", n, dim, &runs, Some(&on_n), &peers);
                        if !peers_same.is_empty() {
                            row("mpi", n, dim, &runs, Some(&on_same), &peers_same);
                        }
                    }
                }
                match base_failed {
                    Some(e) if base_runs.is_empty() => failed_row("mpi (baseline)", &e),
                    _ if base_runs.is_empty() => {}
                    _ => row("mpi (baseline)", n, dim, &base_runs, Some(&on_n), &peers),
                }
                if !stars.is_empty() {
                    let per_run = usize::try_from(per_run).unwrap_or(0);
                    row_of("p2p star", n, dim, &stars, per_run, Some(&on_same), &peers_same);
                    row_of("p2p star, segments", n, dim, &segs, per_run, Some(&on_same), &peers_same);
                }
            }
            if want("tcp") {
                let (mut runs, mut peers) = (Vec::new(), Vec::new());
                let mut failed = None;
                for _ in 0..repeat {
                    match tcp_bsp(n, dim, rounds) {
                        Ok(t) => runs.push(t),
                        Err(e) => failed = Some(e),
                    }
                    peers.extend(peer(Some("self,tcp")));
                }
                match failed {
                    Some(e) if runs.is_empty() => {
                        println!("| tcp | {n} | {dim:.0e} | – | failed: {e} | – | – | – | – | – | – | – |");
                    }
                    _ => row("tcp", n, dim, &runs, Some("self,tcp"), &peers),
                }
            }
        }
    }
}
