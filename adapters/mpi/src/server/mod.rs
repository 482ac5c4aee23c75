//! Server ranks: rank 0 the parameter server, or, with `S` shards, ranks `0..S`, each the
//! protocol's unchanged server over its slice of the model (docs/PROTOCOLS.md, "Sharded
//! servers": every shard decides alone). The loop is the core's driving contract: read the
//! clock, feed one input, drain the outputs, wait until the next deadline or message.
//!
//! Liveness of workers: a worker rank silent for longer than the loss timeout is a lost
//! worker; a lost rank heard again is told to rejoin with a new epoch ([`Kind::Rejoin`]),
//! and counted back once its `Join` of that epoch arrives.
//!
//! Shards: rank 0 and every other shard send each other heartbeats (a star around rank 0);
//! a shard silent for the loss timeout stops the run, naming it (rank 0 tells the other
//! shards). A shard also stops once every live worker has sent its final tally (the
//! workers stopped: nothing more will come). At the end every shard sends rank 0 its
//! report ([`ShardSummary`]): rank 0 assembles the model and sums the counters.

use crate::ledger::ShardLedger;
use crate::link::{Kind, Link};
use crate::{MpiError, RunPlan, Shared, since};
use mpi::topology::{Rank, SimpleCommunicator};
use std::sync::Arc;
use std::time::{Duration, Instant};
use syncopate::wire::{self, Limits};
use syncopate::{AnyServer, ProtocolConfig, Server, ToWorker, Version, WorkerId};

mod end;
mod ranks;
mod report;
mod side;
#[cfg(test)]
mod tests;

use end::{collect_tallies, finish};
use ranks::{Peers, Ranks};
pub use report::{ServerReport, StopReason};
use side::Side;

/// Runs the server of `protocol` at rank 0 of `world` (ranks `1..=n` must run
/// [`crate::run_worker`]) from `params` until `plan` ends the run. `on_model` sees the model
/// after every drained input that changed its version; `log` gets one line per event worth
/// telling (a lost rank, a rejoin).
pub fn run_server(
    world: SimpleCommunicator,
    protocol: &ProtocolConfig,
    params: Vec<f32>,
    plan: &RunPlan,
    on_model: &mut dyn FnMut(Version, &[f32]),
    log: &mut dyn FnMut(&str),
) -> Result<ServerReport, MpiError> {
    run_shard(world, protocol, 1, params, plan, on_model, log)
}

/// Runs shard `rank` of `shards` of `protocol` at this rank of `world` (ranks `0..shards`
/// run this, ranks `shards..shards + n` run [`crate::run_worker`] with the same `shards`):
/// `params` is the whole initial model; this rank holds its slice
/// ([`crate::shard_layout`]) and `on_model` sees that slice. Each shard ends on its own
/// budget or time limit, when every worker stopped, or when a shard is lost; then rank 0
/// gathers every shard's report and returns the assembled model and the summed counters.
/// With `shards` 1, [`run_server`].
pub fn run_shard(
    world: SimpleCommunicator,
    protocol: &ProtocolConfig,
    shards: u32,
    params: Vec<f32>,
    plan: &RunPlan,
    on_model: &mut dyn FnMut(Version, &[f32]),
    log: &mut dyn FnMut(&str),
) -> Result<ServerReport, MpiError> {
    let n = protocol.workers();
    let layout = crate::shard_layout(params.len(), shards)?;
    crate::check_message_size(layout.len(0))?;
    let link = Link::new(world);
    crate::check_world(&link, n, shards)?;
    let shard = u32::try_from(link.rank()).unwrap_or(u32::MAX);
    let range = layout.range(shard).ok_or_else(|| {
        MpiError(format!("rank {shard} is a worker (ranks {shards}..): run_shard needs a shard rank"))
    })?;
    let slice = params.get(range.clone()).unwrap_or_default().to_vec();
    let dim = slice.len();
    let scratch = Shared::zeroed(protocol.server_scratch_len(dim));
    let spare = Shared::zeroed(protocol.spare_accumulator_len(dim));
    let mut server = AnyServer::new(protocol, Shared(Arc::new(slice)), scratch)
        .and_then(|s| s.with_spare_accumulator(spare))
        .and_then(|s| if plan.momentum == 0.0 { Ok(s) } else { s.with_momentum(plan.momentum, Shared::zeroed(dim)) })
        .map_err(|e| MpiError(format!("cannot start the server: {e}")))?;
    if server.has_upstream() {
        return Err(MpiError("the server needs an upstream link, which the MPI adapter does not have".into()));
    }
    let limits = Limits::for_model(dim);
    let report = ServerReport::empty(n as usize);
    let first = Rank::try_from(shards).unwrap_or(Rank::MAX);
    let mut side = Side {
        link,
        shard,
        layout,
        ranks: Ranks::new(n, first),
        peers: Peers::new(shard, shards, plan.lost_after),
        report,
        ledger: ShardLedger { shard, elements: dim as u64, ..ShardLedger::default() },
        stop: None,
        summaries: vec![None; shards as usize],
        started: Instant::now(),
        log,
    };
    let origin = side.started;
    let tick = Duration::from_millis(50);
    let mut seen: Option<Version> = None;
    let reason = loop {
        side.drain(&mut server);
        if seen != Some(server.version()) {
            seen = Some(server.version());
            on_model(server.version(), server.params());
        }
        if server.stats().accepted >= plan.max_gradients {
            break StopReason::Budget;
        }
        if plan.time_limit.is_some_and(|t| origin.elapsed() >= t) {
            break StopReason::TimeLimit;
        }
        if let Some(reason) = side.stop {
            break reason;
        }
        side.check_silence(&mut server, plan.lost_after, origin);
        if side.ranks.live.is_empty() {
            break StopReason::AllWorkersLost;
        }
        if shards > 1 && side.workers_done() {
            break StopReason::WorkersDone;
        }
        if let Some(k) = side.check_peers(plan.lost_after) {
            break StopReason::ShardLost(k);
        }
        let now = Instant::now();
        let mut wait = server.poll_timeout().map_or(tick, |at| crate::until(origin, at).min(tick));
        if !side.peers.ranks.is_empty() {
            wait = wait.min(side.peers.next_heartbeat.saturating_duration_since(now));
        }
        match side.link.recv_until(now + wait, None, None) {
            Some(m) => {
                side.feed(&mut server, &m, &limits, origin);
                side.link.recycle(m);
            }
            None => server.handle_timeout(since(origin)),
        }
    };
    server.stop();
    side.drain(&mut server);
    let wall_s = origin.elapsed().as_secs_f64();
    // A lost rank that comes back must stop too.
    let lost: Vec<Rank> = (0..n).map(WorkerId).filter(|w| side.ranks.is_lost(*w)).map(|w| side.ranks.rank(w)).collect();
    if !lost.is_empty() {
        let mut stop = side.link.buffer();
        stop.resize(wire::encoded_len_to_worker(&ToWorker::<f32>::Stop), 0);
        if let Ok(len) = wire::encode_to_worker(&ToWorker::<f32>::Stop, &mut stop) {
            stop.truncate(len);
            side.link.send(&lost, Kind::Wire, stop);
        }
    }
    // With shards, a worker waits up to the loss timeout for a shard's `Stop` after
    // another's, so its tally may come that much later.
    let patience =
        plan.lost_after.max(Duration::from_secs(5)) + if shards > 1 { plan.lost_after } else { Duration::ZERO };
    collect_tallies(&mut side, &mut server, &limits, origin, patience);
    // Sends to live ranks complete (they are reading); those to lost ranks may never.
    for rank in &lost {
        side.link.abandon(*rank);
    }
    let mut report = finish(&mut side, &server, reason, wall_s, patience);
    side.link.flush(Instant::now() + patience);
    if shard == 0 && shards > 1 {
        end::assemble(&mut side, &mut report, &params);
    }
    Ok(report)
}
