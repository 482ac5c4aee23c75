//! One host of `benches/netns/run.sh`: a BSP server (whole model or one shard of it) or a
//! worker, run in its own network namespace over the real TCP adapter.
//!
//! ```text
//! netns_node server --listen ADDR --d D --workers N --rounds R [--shard K/S]
//! netns_node worker --connect ADDR[,ADDR...] --id I [--sharded]
//! ```
//!
//! A server serves `R` BSP rounds of `N` workers on a model of `D` floats (with `--shard K/S`,
//! the `K`-th of `S` slices of it) and prints, for every model it publishes, a line
//! `model VERSION UNIX_NANOS`, so that rounds can be timed across processes on one clock
//! (a round of a sharded run ends when its last shard publishes it). A worker takes the
//! model's size from its server(s) and hands back a constant gradient, written whole every
//! step, so a round is the transport's and the servers' work only. Both print `cpu SECONDS`
//! (their user and system time so far) once a round: a server after each model, a worker
//! before each gradient. Nothing is authenticated: the hosts are namespaces of one machine
//! on a private bridge.
//!
//! Bad arguments end the program with a one-line message and exit status 2; a failed run
//! with exit status 1.

use core::time::Duration;
use std::process::ExitCode;
use std::time::{SystemTime, UNIX_EPOCH};
use syncopate::{ProtocolKind, Version, WorkerId};
use syncopate_adapters::tcp::{
    FrameTimeout, Note, ProtocolSettings, RunPlan, RunSettings, ServerOptions, ShardSettings, TcpServer, WorkerOptions,
    run_sharded_worker, run_worker,
};

/// The value of every gradient element.
const GRADIENT: f32 = 1e-6;
/// A session silent this long is lost; a round on a 1 Gbit/s link shared by eight workers
/// takes several seconds, so this is generous.
const LOST_AFTER: Duration = Duration::from_secs(120);
/// How long one socket write or one handshake may take.
const IO_TIMEOUT: Duration = Duration::from_secs(120);
/// The slowest transfer rate a frame may have before it counts as stalled.
const MIN_BYTES_PER_SEC: u64 = 1 << 20;

/// What the command line asks for.
#[derive(Debug, PartialEq)]
enum Role {
    Server { listen: String, d: usize, workers: u32, rounds: u64, shard: Option<(u32, u32)> },
    Worker { connect: String, id: u32, sharded: bool },
}

const USAGE: &str = "usage: netns_node server --listen ADDR --d D --workers N --rounds R [--shard K/S] | \
                     netns_node worker --connect ADDR[,ADDR...] --id I [--sharded]";

fn number<T: core::str::FromStr>(flag: &str, value: Option<&String>) -> Result<T, String> {
    let value = value.ok_or_else(|| format!("{flag} needs a value"))?;
    value.parse().map_err(|_| format!("{flag}: not a number: '{value}'"))
}

fn parse_shard(value: Option<&String>) -> Result<(u32, u32), String> {
    let value = value.ok_or("--shard needs a value K/S")?;
    let (k, s) = value.split_once('/').ok_or_else(|| format!("--shard: expected K/S, got '{value}'"))?;
    let (k, s): (u32, u32) = match (k.parse(), s.parse()) {
        (Ok(k), Ok(s)) => (k, s),
        _ => return Err(format!("--shard: expected K/S, got '{value}'")),
    };
    if s == 0 || k >= s {
        return Err(format!("--shard: K must be below S, got '{value}'"));
    }
    Ok((k, s))
}

fn parse(args: &[String]) -> Result<Role, String> {
    let (role, rest) = args.split_first().ok_or(USAGE)?;
    let mut listen = None;
    let mut connect = None;
    let (mut d, mut workers, mut rounds, mut id) = (None, None, None, None);
    let mut shard = None;
    let mut sharded = false;
    let mut i = 0;
    while let Some(flag) = rest.get(i) {
        let value = rest.get(i + 1);
        i += 2;
        match flag.as_str() {
            "--listen" => listen = Some(value.ok_or("--listen needs an address")?.clone()),
            "--connect" => connect = Some(value.ok_or("--connect needs addresses")?.clone()),
            "--d" => d = Some(number::<usize>(flag, value)?),
            "--workers" => workers = Some(number::<u32>(flag, value)?),
            "--rounds" => rounds = Some(number::<u64>(flag, value)?),
            "--id" => id = Some(number::<u32>(flag, value)?),
            "--shard" => shard = Some(parse_shard(value)?),
            "--sharded" => {
                sharded = true;
                i -= 1;
            }
            other => return Err(format!("unknown argument '{other}'; {USAGE}")),
        }
    }
    match role.as_str() {
        "server" => {
            let d = d.ok_or("server: --d is required")?;
            let workers = workers.ok_or("server: --workers is required")?;
            let rounds = rounds.ok_or("server: --rounds is required")?;
            if d == 0 || workers == 0 || rounds == 0 {
                return Err("server: --d, --workers and --rounds must be at least 1".into());
            }
            Ok(Role::Server { listen: listen.ok_or("server: --listen is required")?, d, workers, rounds, shard })
        }
        "worker" => Ok(Role::Worker {
            connect: connect.ok_or("worker: --connect is required")?,
            id: id.ok_or("worker: --id is required")?,
            sharded,
        }),
        other => Err(format!("unknown role '{other}'; {USAGE}")),
    }
}

/// This process's CPU time (all threads, user and system) in seconds, from `/proc/self/stat`
/// (clock ticks of 10 ms).
fn cpu_seconds() -> f64 {
    let stat = std::fs::read_to_string("/proc/self/stat").unwrap_or_default();
    // Fields after the command name (which ends with ')'): utime and stime are the 12th and
    // 13th.
    let rest = stat.rsplit_once(')').map_or("", |(_, r)| r);
    let fields: Vec<f64> = rest.split_whitespace().filter_map(|f| f.parse().ok()).collect();
    (fields.get(11).copied().unwrap_or(f64::NAN) + fields.get(12).copied().unwrap_or(f64::NAN)) / 100.0
}

fn unix_nanos() -> u128 {
    SystemTime::now().duration_since(UNIX_EPOCH).map_or(0, |t| t.as_nanos())
}

fn serve(listen: &str, d: usize, workers: u32, rounds: u64, shard: Option<(u32, u32)>) -> Result<(), String> {
    let mut settings = RunSettings::new(ProtocolSettings::named(ProtocolKind::Bsp, workers, 1e-3), d);
    settings.shard = shard.map(|(index, count)| ShardSettings { index, count, run: "netns".into() });
    let len = settings.served_range().map_err(|e| format!("shard layout: {e}"))?.len();
    let mut options = ServerOptions::new(settings);
    options.insecure = true;
    options.lost_after = LOST_AFTER;
    options.handshake_timeout = IO_TIMEOUT;
    options.write_timeout = IO_TIMEOUT;
    options.frame_timeout = FrameTimeout { base: IO_TIMEOUT, min_bytes_per_sec: MIN_BYTES_PER_SEC };
    let server = TcpServer::bind(listen, options).map_err(|e| e.to_string())?;
    println!("listening {}", server.local_addr().map_err(|e| e.to_string())?);
    let plan = RunPlan { max_gradients: rounds * u64::from(workers), time_limit: Some(Duration::from_secs(3600)) };
    server
        .run(vec![0.0; len], Version::ZERO, &plan, &mut |note| match note {
            Note::Model { version, .. } => {
                println!("model {} {}", version.0, unix_nanos());
                println!("cpu {:.3}", cpu_seconds());
            }
            Note::Log(line) => eprintln!("server: {line}"),
            _ => {}
        })
        .map_err(|e| e.to_string())?;
    Ok(())
}

fn work(connect: &str, id: u32, sharded: bool) -> Result<(), String> {
    let mut options = WorkerOptions::new(connect, WorkerId(id));
    options.lost_after = LOST_AFTER;
    options.handshake_timeout = IO_TIMEOUT;
    options.write_timeout = IO_TIMEOUT;
    options.frame_timeout = FrameTimeout { base: IO_TIMEOUT, min_bytes_per_sec: MIN_BYTES_PER_SEC };
    // No message is lost on these links: a worker waiting for a slow round must not ask for
    // the model again (the answer would be one more model over the link).
    options.rejoin_after = None;
    let mut job = |_: &[f32], g: &mut [f32]| {
        println!("cpu {:.3}", cpu_seconds());
        g.fill(GRADIENT);
    };
    let mut log = |line: &str| eprintln!("worker {id}: {line}");
    if sharded {
        run_sharded_worker(&options, &mut job, &mut log).map_err(|e| e.to_string())?;
    } else {
        run_worker(&options, &mut job, &mut log).map_err(|e| e.to_string())?;
    }
    Ok(())
}

fn main() -> ExitCode {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let role = match parse(&args) {
        Ok(role) => role,
        Err(e) => {
            eprintln!("netns_node: {e}");
            return ExitCode::from(2);
        }
    };
    let result = match role {
        Role::Server { listen, d, workers, rounds, shard } => serve(&listen, d, workers, rounds, shard),
        Role::Worker { connect, id, sharded } => work(&connect, id, sharded),
    };
    match result {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("netns_node: {e}");
            ExitCode::FAILURE
        }
    }
}
