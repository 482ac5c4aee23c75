//! BSP rounds over the MPI adapter (`syncopate-mpi`), for `rounds --mpi-adapter BIN`:
//! `mpirun -n N+1 mpi_rounds D ROUNDS` runs the server at rank 0 and N workers that return
//! a constant gradient of D `f32` at once, and rank 0 prints
//!   mpi-adapter workers=<N> d=<D> rounds=<k> median_ms=<t> times_ms=<t1,t2,...>
//! where a round is model version to model version at the server (after the warm-up).
//!
//! Build: cargo build --release -p syncopate-benches --features mpi --bin mpi_rounds

use std::time::{Duration, Instant};
use syncopate::ProtocolConfig;
use syncopate::proto::bsp::BspConfig;
use syncopate_mpi::mpi::topology::Communicator;
use syncopate_mpi::{RunPlan, WorkerOptions, run_server, run_worker};

/// Model versions before the measured rounds.
const WARMUP: usize = 3;

fn main() {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let number = |i: usize| args.get(i).and_then(|a| a.parse::<f64>().ok()).filter(|x| *x >= 1.0 && x.fract() == 0.0);
    let (Some(dim), Some(rounds)) = (number(0), number(1)) else {
        eprintln!("usage: mpirun -n N+1 mpi_rounds D ROUNDS (whole numbers, at least 1)");
        std::process::exit(2);
    };
    let (dim, rounds) = (dim as usize, rounds as u64 + WARMUP as u64);
    // The workers compute on a thread of their own: MPI_THREAD_FUNNELED.
    let Some((universe, _)) =
        syncopate_mpi::mpi::initialize_with_threading(syncopate_mpi::mpi::environment::Threading::Funneled)
    else {
        eprintln!("mpi_rounds: MPI could not be initialised");
        std::process::exit(1);
    };
    let world = universe.world();
    let workers = u32::try_from(world.size() - 1).unwrap_or(0).max(1);
    let config = ProtocolConfig::Bsp(BspConfig::new(workers, 1e-6));
    let lost_after = Duration::from_secs(600);
    let result = if world.rank() == 0 {
        let plan = RunPlan { max_gradients: rounds * u64::from(workers), time_limit: None, lost_after, momentum: 0.0 };
        let mut stamps: Vec<Instant> = Vec::new();
        run_server(world, &config, vec![0.5f32; dim], &plan, &mut |_, _| stamps.push(Instant::now()), &mut |line| {
            eprintln!("mpi_rounds: {line}");
        })
        .map(|_| {
            let mut times: Vec<f64> = stamps.windows(2).skip(WARMUP).map(|w| (w[1] - w[0]).as_secs_f64()).collect();
            times.sort_by(f64::total_cmp);
            let median = times.get(times.len() / 2).copied().unwrap_or(f64::NAN);
            let all: Vec<String> = times.iter().map(|t| format!("{:.4}", t * 1e3)).collect();
            println!(
                "mpi-adapter workers={workers} d={dim} rounds={} median_ms={:.3} times_ms={}",
                times.len(),
                median * 1e3,
                all.join(",")
            );
        })
    } else {
        let options = WorkerOptions { protocol: config, dim, lost_after, rejoin_after: None, shards: 1 };
        run_worker(
            world,
            &options,
            &mut |_, grad| {
                grad.fill(1e-3);
                Duration::ZERO.into()
            },
            &mut |line| eprintln!("mpi_rounds worker: {line}"),
        )
        .map(|_| ())
    };
    if let Err(e) = result {
        eprintln!("error: {e}");
        std::process::exit(1);
    }
}
