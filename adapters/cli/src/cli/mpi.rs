//! `syncopate mpi`: one training run as an MPI job, `mpirun -n N+1 syncopate mpi ...` (or
//! `srun`): rank 0 runs the parameter server and prints the summary, ranks `1..=N` run the
//! workers. With `--shards S` (`mpirun -n N+S`), ranks `0..S` run the shards, each the
//! protocol's server over its slice of the model, and ranks `S..` the workers. Every rank
//! gets the same command line and derives the run's settings from it; rank 0 checks that
//! every rank hashed the same settings before anything starts.
//!
//! The transport is the `syncopate-mpi` crate, built only with this crate's `mpi` feature;
//! without it the subcommand says how to enable it and exits with 2.

use super::failure::Failure;
use super::train::TrainArgs;
use clap::Args;

/// Flags of `syncopate mpi`: those of `train` (but `--sim` and `--record-trace`, which
/// it refuses and its help does not list), plus the MPI ones.
#[derive(Clone, Debug, Args)]
#[command(mut_arg("sim", |a| a.hide(true)), mut_arg("record_trace", |a| a.hide(true)))]
// Shards: `--shards` is this command's own (shards on ranks 0..S); the simulator's
// `--colocate-shards` does not apply.
#[command(
    mut_arg("shards", |a| a.help(
        "Split the model over S shards on ranks 0..S-1 (contiguous slices, each shard the protocol's server \
         over its slice); the workers are the ranks after them"
    )),
    mut_arg("colocate_shards", |a| a.hide(true))
)]
pub struct MpiArgs {
    /// The protocol, workload and straggler flags of `train` (`--workers N` needs N+S ranks
    /// with `--shards S`; without `--workers`, every rank but the shards' is a worker).
    #[command(flatten)]
    pub train: TrainArgs,
    /// A worker rank silent this many seconds (no message, no heartbeat: hung, stopped or cut
    /// off) becomes a lost worker and the run goes on without it.
    #[arg(long, value_name = "SECS", default_value_t = 10.0)]
    pub lost_after: f64,
}

impl MpiArgs {
    /// `train`'s flags with one shard: `--shards` is `mpi`'s own (shard ranks), which
    /// `train` takes for the simulator only.
    pub(super) fn train_without_shards(&self) -> TrainArgs {
        let mut train = self.train.clone();
        train.shards = 1;
        train
    }

    /// Refuses what `mpi` refuses before MPI starts (the one-line reason).
    pub(super) fn check(&self) -> Result<(), String> {
        // Shards: checked here, since `train` takes `--shards` for the simulator only.
        if self.train.colocate_shards {
            return Err(
                "--colocate-shards applies to `syncopate train --sim`: each MPI shard is a rank of its own".into()
            );
        }
        self.train_without_shards().check()?;
        check_shards(self.train.shards)?;
        if self.train.sim {
            return Err("--sim runs the simulator in one process: use `syncopate train --sim`".into());
        }
        if self.train.record_trace.is_some() {
            return Err("--record-trace is not supported by `syncopate mpi`: use `syncopate train`".into());
        }
        super::values::seconds("lost-after", self.lost_after)?;
        Ok(())
    }
}

/// Refuses a shard count outside `1..=MAX_SHARDS`.
fn check_shards(shards: u32) -> Result<(), String> {
    if shards == 0 || shards > crate::scenario::MAX_SHARDS {
        return Err(format!(
            "invalid value '{shards}' for '--shards': must be between 1 and {}",
            crate::scenario::MAX_SHARDS
        ));
    }
    Ok(())
}

/// Whether the command line names `--workers` (otherwise the world size decides).
#[cfg_attr(not(feature = "mpi"), allow(dead_code, reason = "the MPI build uses it"))]
fn workers_given(mut args: impl Iterator<Item = String>) -> bool {
    args.any(|a| a == "--workers" || a.starts_with("--workers="))
}

/// The workers of an MPI world of `size` ranks: `shards` ranks are the servers.
#[cfg_attr(not(feature = "mpi"), allow(dead_code, reason = "the MPI build uses it"))]
fn workers_of_world(size: i32, shards: u32) -> Result<u32, String> {
    match u32::try_from(size) {
        Ok(size) if size > shards && (size - shards) as usize <= syncopate::MAX_WORKERS => Ok(size - shards),
        _ if shards > 1 => Err(format!(
            "{size} MPI ranks for --shards {shards}: a run needs ranks 0..{shards} for the shards and 1 to {} more \
             for the workers (e.g. mpirun -n {} for 4 workers)",
            syncopate::MAX_WORKERS,
            shards + 4
        )),
        _ => Err(format!(
            "{size} MPI ranks: a run needs rank 0 for the server and 1 to {} more for the workers (e.g. mpirun -n 5 for 4 workers)",
            syncopate::MAX_WORKERS
        )),
    }
}

/// A test hook: `SYNCOPATE_MPI_BLOCK_STEP=RANK:MS` makes every computation of worker rank
/// `RANK` hold the computing thread `MS` milliseconds, as a long real step does (the
/// straggler models wait outside the computation instead). The MPI tests use it for a step
/// longer than `--lost-after`.
#[cfg_attr(not(feature = "mpi"), allow(dead_code, reason = "the MPI build uses it"))]
const BLOCK_STEP_VAR: &str = "SYNCOPATE_MPI_BLOCK_STEP";

/// The hold of [`BLOCK_STEP_VAR`]'s value `spec` for rank `rank` (`None`: none, or a value
/// that is not `RANK:MS`).
#[cfg_attr(not(feature = "mpi"), allow(dead_code, reason = "the MPI build uses it"))]
fn blocked_step(spec: Option<&str>, rank: i32) -> Option<core::time::Duration> {
    let (r, ms) = spec?.split_once(':')?;
    let ms: u64 = ms.trim().parse().ok()?;
    (r.trim().parse::<i32>().ok()? == rank).then(|| core::time::Duration::from_millis(ms))
}

/// Writes `line` and a newline to stderr in one write: the ranks share `mpirun`'s stderr,
/// and `eprintln!` writes a formatted line in pieces, which interleave across processes.
#[cfg_attr(not(feature = "mpi"), allow(dead_code, reason = "the MPI build uses it"))]
fn say(line: &str) {
    let line = format!("{line}\n");
    let _ = std::io::Write::write_all(&mut std::io::stderr().lock(), line.as_bytes());
}

#[cfg(not(feature = "mpi"))]
pub(super) fn run(args: &MpiArgs) -> Result<(), Failure> {
    args.check().map_err(Failure::Usage)?;
    Err(Failure::Usage(
        "this syncopate was built without MPI support: rebuild with `cargo build --release -p syncopate-adapters \
         --features mpi` (needs an MPI library and libclang, e.g. Debian's libopenmpi-dev openmpi-bin libclang-dev)"
            .into(),
    ))
}

#[cfg(feature = "mpi")]
pub(super) fn run(args: &MpiArgs) -> Result<(), Failure> {
    use syncopate_mpi::mpi::topology::Communicator;
    args.check().map_err(Failure::Usage)?;
    // The workers compute on a thread of their own, which makes no MPI call: FUNNELED. A
    // library that gives less makes them compute inline (`run_worker` says so).
    let Some((universe, _)) =
        syncopate_mpi::mpi::initialize_with_threading(syncopate_mpi::mpi::environment::Threading::Funneled)
    else {
        return Err(Failure::Run("MPI could not be initialised (or was already)".into()));
    };
    let world = universe.world();
    let shards = args.train.shards;
    let mut train = args.train.clone();
    if !workers_given(std::env::args()) {
        train.protocol.workers = workers_of_world(world.size(), shards).map_err(Failure::Usage)?;
    }
    let train = &train;
    let protocol = train.protocol.config().map_err(Failure::Usage)?;
    let stragglers =
        crate::straggler::parse_stragglers(&train.straggler, protocol.workers()).map_err(Failure::Usage)?;
    let workload = train.workload.workload().map_err(Failure::Usage)?;
    // Shards: a model that does not split into S slices of at least one parameter.
    syncopate_mpi::shard_layout(workload.model.dim(), shards).map_err(|e| Failure::Usage(e.0))?;
    let hash = syncopate_mpi::settings::settings_hash(std::env::args_os().skip(1).map(|a| a.into_encoded_bytes()));
    syncopate_mpi::agree_on_settings(&world, hash).map_err(|e| Failure::Usage(e.0))?;
    let plan = syncopate_mpi::RunPlan {
        max_gradients: train.steps.saturating_mul(u64::from(protocol.workers())),
        time_limit: super::values::time_limit(train.time_limit).map_err(Failure::Usage)?,
        lost_after: super::values::seconds("lost-after", args.lost_after).map_err(Failure::Usage)?,
        momentum: train.momentum,
    };
    if world.rank() < i32::try_from(shards).unwrap_or(i32::MAX) {
        server::run(train, protocol, &workload, &plan, world)
    } else {
        worker::run(train, protocol, stragglers, &workload, &plan, world)
    }
}

#[cfg(feature = "mpi")]
mod server {
    use super::super::{failure::Failure, summary::Summary};
    use super::TrainArgs;
    use crate::thread::{EvalPoint, ThreadReport, WorkerTally};
    use crate::workload::Workload;
    use std::time::{Duration, Instant};
    use syncopate::{ProtocolConfig, Version};
    use syncopate_mpi::mpi::topology::{Communicator, SimpleCommunicator};
    use syncopate_mpi::{RunPlan, StopReason, run_shard};

    /// Rank 0: the server, the evaluations and the summary. With shards, ranks `0..S`: each
    /// a shard; rank 0 evaluates the model assembled at the end and prints the summary.
    pub(super) fn run(
        args: &TrainArgs,
        protocol: ProtocolConfig,
        workload: &Workload,
        plan: &RunPlan,
        world: SimpleCommunicator,
    ) -> Result<(), Failure> {
        let n = protocol.workers();
        let dim = workload.model.dim();
        let model_name = args.workload.model.to_string();
        let shards = args.shards;
        let rank = world.rank();
        if shards == 1 {
            super::say(&format!(
                "mpi: {} with {n} workers on ranks 1..={n}, {model_name} ({dim} params)",
                protocol.name()
            ));
        } else if rank == 0 {
            super::say(&format!(
                "mpi: {} with {shards} shards on ranks 0 to {} and {n} workers on ranks {shards} to {}, {model_name} \
                 ({dim} params)",
                protocol.name(),
                shards - 1,
                n + shards - 1
            ));
        } else {
            super::say(&format!("mpi: rank {rank} (shard {rank}) pid {}", std::process::id()));
        }
        let mut params = vec![0.0f32; dim];
        workload.model.init(args.workload.seed, &mut params);
        let start = Instant::now();
        let mut curve: Vec<EvalPoint> = Vec::new();
        let mut time_to_target = None;
        let mut last_eval: Option<Instant> = None;
        let mut evaluate = |version: Version, params: &[f32], curve: &mut Vec<EvalPoint>| {
            let e = workload.model.evaluate(params, &workload.test);
            let point = EvalPoint {
                time_s: start.elapsed().as_secs_f64(),
                version: version.0,
                accuracy: e.accuracy,
                loss: e.loss,
            };
            if time_to_target.is_none() && e.accuracy >= args.target {
                time_to_target = Some(point.time_s);
            }
            curve.push(point);
        };
        let eval_interval = Duration::from_millis(20);
        let report = run_shard(
            world,
            &protocol,
            shards,
            params,
            plan,
            &mut |version, params| {
                // A shard holds a slice: the model is evaluated once assembled, at the end.
                if shards == 1 && last_eval.is_none_or(|t| t.elapsed() >= eval_interval) {
                    last_eval = Some(Instant::now());
                    evaluate(version, params, &mut curve);
                }
            },
            &mut |line| super::say(&format!("mpi: {line}")),
        )
        .map_err(|e| Failure::Run(e.0))?;
        if rank > 0 {
            return match report.reason {
                StopReason::ShardLost(k) => Err(Failure::Run(lost_shard(k))),
                _ => Ok(()),
            };
        }
        if curve.last().is_none_or(|p| p.version != report.version.0) {
            evaluate(report.version, &report.params, &mut curve);
        }
        let ranks = |ws: &[syncopate::WorkerId]| {
            ws.iter().map(|w| format!("rank {}", w.0 + shards)).collect::<Vec<_>>().join(", ")
        };
        let mut line = format!("mpi: finished ({:?}) at version {}", report.reason, report.version.0);
        if !report.lost.is_empty() {
            line += &format!(", lost {}", ranks(&report.lost));
        }
        if !report.rejoined.is_empty() {
            line += &format!(", rejoined {}", ranks(&report.rejoined));
        }
        super::say(&line);
        let threads = ThreadReport {
            curve,
            time_to_target_s: time_to_target,
            wall_s: report.wall_s,
            stats: report.stats,
            workers: report
                .workers
                .iter()
                .map(|t| {
                    t.map_or_else(WorkerTally::default, |t| WorkerTally {
                        computed: t.computed,
                        abandoned: t.abandoned,
                        refused: t.refused,
                        busy_s: t.busy_s,
                        wall_s: t.wall_s,
                        step_times: Vec::new(),
                        ..WorkerTally::default()
                    })
                })
                .collect(),
            staleness: report.staleness,
            stalls: report.stalls,
            refused: report.refused,
            lost: report.lost.len() as u64,
            params: Vec::new(),
            ledger: crate::thread::ThreadLedger::default(),
        };
        // Shards: every shard's ledger.
        if shards > 1 {
            for l in &report.shards {
                super::say(&format!(
                    "mpi: shard {}: {} params, {} updates, sent {}, delivered {}, refused {}, late {}, accepted {}, \
                     applied {}, dropped {}, held {}: ledger {}",
                    l.shard,
                    l.elements,
                    l.updates,
                    l.sent,
                    l.delivered,
                    l.refused,
                    l.late,
                    l.accepted,
                    l.applied,
                    l.dropped,
                    l.held(),
                    if l.balanced() { "balanced" } else { "open (a tally missing, or contributions unaccounted for)" }
                ));
            }
        }
        let mut summary =
            Summary::from_threads(&threads, protocol.name(), n, &model_name, dim, args.workload.seed, args.target);
        summary.mode = "mpi".into();
        summary.momentum = plan.momentum;
        if !report.loss_curve.is_empty() {
            let points =
                report.loss_curve.iter().map(|&(version, t_s, loss)| crate::tcp::LossPoint { version, t_s, loss });
            summary.loss_curve = Some(crate::cli::loss_curve::LossCurve::new(points.collect(), None));
        }
        summary.print(args.json);
        match report.reason {
            StopReason::AllWorkersLost => {
                Err(Failure::Run("every worker rank was lost before the run's budget was spent".into()))
            }
            StopReason::ShardLost(k) => Err(Failure::Run(lost_shard(k))),
            _ => Ok(()),
        }
    }

    /// The error of a run stopped by a lost shard.
    fn lost_shard(k: u32) -> String {
        format!("shard {k} (rank {k}) was lost: the run stopped before its budget was spent")
    }
}

#[cfg(feature = "mpi")]
mod worker {
    use super::super::failure::Failure;
    use super::TrainArgs;
    use crate::sim::{ComputeModel, ComputeSampler};
    use crate::workload::{BatchSampler, Workload};
    use core::time::Duration;
    use syncopate::ProtocolConfig;
    use syncopate_mpi::mpi::topology::{Communicator, SimpleCommunicator};
    use syncopate_mpi::{Computed, RunPlan, WorkerOptions, run_worker};

    /// Ranks 1..=n: worker `rank - 1`, with its straggler model.
    pub(super) fn run(
        args: &TrainArgs,
        protocol: ProtocolConfig,
        stragglers: Vec<ComputeModel>,
        workload: &Workload,
        plan: &RunPlan,
        world: SimpleCommunicator,
    ) -> Result<(), Failure> {
        let id = u32::try_from(world.rank() - i32::try_from(args.shards).unwrap_or(1)).unwrap_or(u32::MAX);
        let dim = workload.model.dim();
        let seed = args.workload.seed ^ (u64::from(id) + 1).wrapping_mul(0x9E37_79B9_7F4A_7C15);
        let model = stragglers.get(id as usize).cloned().unwrap_or(ComputeModel::None);
        let mut delays = ComputeSampler::new(model, args.base_step(), args.workload.seed, id);
        let mut sampler = BatchSampler::new(workload.train.len(), seed);
        let mut scratch = workload.model.scratch();
        let mut batch = Vec::new();
        let batch_size = args.workload.batch_size as usize;
        let block = super::blocked_step(std::env::var(super::BLOCK_STEP_VAR).ok().as_deref(), world.rank());
        let options = WorkerOptions {
            protocol,
            dim,
            lost_after: plan.lost_after,
            rejoin_after: Some(Duration::from_secs(2)),
            shards: args.shards,
        };
        super::say(&format!("mpi: rank {} (worker {id}) pid {}", world.rank(), std::process::id()));
        run_worker(
            world,
            &options,
            &mut |params, grad| {
                if let Some(hold) = block {
                    std::thread::sleep(hold);
                }
                sampler.next_batch(batch_size, &mut batch);
                let loss = workload.model.gradient(params, &workload.train, &batch, grad, &mut scratch);
                Computed {
                    extra: Duration::from_nanos(delays.next_step().as_nanos()),
                    loss: Some(loss).filter(|l| l.is_finite()),
                }
            },
            &mut |line| super::say(&format!("mpi: {line}")),
        )
        .map_err(|e| Failure::Run(e.0))?;
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_world_size_gives_the_workers_unless_the_flag_does() {
        let args = |a: &[&str]| a.iter().map(|s| (*s).to_owned()).collect::<Vec<_>>().into_iter();
        assert!(workers_given(args(&["syncopate", "mpi", "--workers", "4"])));
        assert!(workers_given(args(&["syncopate", "mpi", "--workers=4"])));
        assert!(!workers_given(args(&["syncopate", "mpi", "--steps", "4"])));
        assert_eq!(workers_of_world(5, 1), Ok(4));
        assert!(workers_of_world(1, 1).unwrap_err().contains("1 MPI ranks"));
        assert_eq!(workers_of_world(5, 2), Ok(3));
        let e = workers_of_world(3, 3).unwrap_err();
        assert!(e.contains("3 MPI ranks for --shards 3") && e.contains("ranks 0..3 for the shards"), "{e}");
        assert!(check_shards(0).is_err() && check_shards(2).is_ok());
    }

    #[test]
    fn the_block_step_hook_names_one_rank_and_its_hold() {
        use core::time::Duration;
        assert_eq!(blocked_step(Some("2:2500"), 2), Some(Duration::from_millis(2500)));
        assert_eq!(blocked_step(Some("2:2500"), 1), None);
        assert_eq!(blocked_step(Some("2"), 2), None);
        assert_eq!(blocked_step(None, 2), None);
    }
}
