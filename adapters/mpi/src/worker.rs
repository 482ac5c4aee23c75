//! Ranks `1..=n`: one worker each. The loop is the threaded adapter's: compute a gradient
//! when the state machine asks, stay busy for the injected straggler delay while handling
//! messages (so a newer model or an abort really interrupts the job), send heartbeats.

use crate::link::{Kind, Link};
use crate::{MpiError, Tally, since, until};
use mpi::topology::SimpleCommunicator;
use std::time::{Duration, Instant};
use syncopate::wire::{self, Limits};
use syncopate::{AnyWorker, ComputeId, ProtocolConfig, Worker, WorkerEvent, WorkerId, WorkerOutput, WorkerSetup};

/// Settings of a worker rank.
#[derive(Clone, Debug)]
pub struct WorkerOptions {
    /// The protocol and its knobs (the server's).
    pub protocol: ProtocolConfig,
    /// Parameters in the model.
    pub dim: usize,
    /// The server declares a rank silent this long lost; heartbeats go out at
    /// [`crate::heartbeat_interval`] of it.
    pub lost_after: Duration,
    /// Re-send `Join` after waiting this long for the server.
    pub rejoin_after: Option<Duration>,
}

struct Job {
    id: ComputeId,
    started: Instant,
    ready: Instant,
}

/// Runs worker `rank - 1` of `options.protocol` at this rank of `world` until the server
/// stops it; then sends its tally to rank 0 and returns it. `compute(params, grad)` writes a
/// gradient of `params` into `grad` and returns the extra time the step should take (the
/// straggler model; zero for none).
pub fn run_worker(
    world: SimpleCommunicator,
    options: &WorkerOptions,
    compute: &mut dyn FnMut(&[f32], &mut [f32]) -> Duration,
) -> Result<Tally, MpiError> {
    let protocol = &options.protocol;
    let mut link = Link::new(world);
    crate::check_world(&link, protocol.workers())?;
    let id = u32::try_from(link.rank() - 1)
        .map(WorkerId)
        .map_err(|_| MpiError("rank 0 is the server: run_worker needs a worker rank".into()))?;
    let dim = options.dim;
    let setup = WorkerSetup {
        id,
        epoch: 0,
        rejoin_after: options.rejoin_after.map(|d| syncopate::Duration::from_nanos(d.as_nanos() as u64)),
    };
    let mut worker = AnyWorker::new(protocol, setup, vec![0.0f32; dim], vec![0.0f32; protocol.worker_scratch_len(dim)])
        .map_err(|e| MpiError(format!("cannot start worker {}: {e}", id.0)))?;
    let limits = Limits::for_model(dim);
    let heartbeat = crate::heartbeat_interval(options.lost_after);
    let epoch = Instant::now();
    let mut tally = Tally::default();
    let mut grad = vec![0.0f32; dim];
    let mut job: Option<Job> = None;
    let mut next_heartbeat = Instant::now() + heartbeat;
    loop {
        while let Some(output) = worker.poll_output() {
            match output {
                WorkerOutput::Send(msg) => {
                    let mut out = link.buffer();
                    out.resize(wire::encoded_len_to_server(&msg), 0);
                    let len = wire::encode_to_server(&msg, &mut out)
                        .map_err(|e| MpiError(format!("worker {}: cannot encode a message: {e}", id.0)))?;
                    out.truncate(len);
                    link.send(&[0], Kind::Wire, out);
                    next_heartbeat = Instant::now() + heartbeat;
                }
                WorkerOutput::Compute { id: job_id, params, .. } => {
                    let now = Instant::now();
                    if let Some(old) = job.take() {
                        tally.busy_s += now.duration_since(old.started).as_secs_f64();
                        tally.abandoned += 1;
                    }
                    let extra = compute(params, &mut grad);
                    tally.computed += 1;
                    job = Some(Job { id: job_id, started: now, ready: Instant::now() + extra });
                }
                WorkerOutput::Event(WorkerEvent::Abandoned { id: job_id }) => {
                    if let Some(j) = job.take_if(|j| j.id == job_id) {
                        tally.busy_s += j.started.elapsed().as_secs_f64();
                        tally.abandoned += 1;
                    }
                }
                WorkerOutput::Event(_) => {}
            }
        }
        if worker.is_stopped() {
            break;
        }
        if let Some(j) = job.take_if(|j| Instant::now() >= j.ready) {
            tally.busy_s += j.started.elapsed().as_secs_f64();
            let _ = worker.handle_gradient(since(epoch), j.id, &grad);
            continue;
        }
        let now = Instant::now();
        if now >= next_heartbeat {
            link.send(&[0], Kind::Heartbeat, Vec::new());
            next_heartbeat = now + heartbeat;
        }
        let mut deadline = next_heartbeat;
        if let Some(j) = &job {
            deadline = deadline.min(j.ready);
        }
        if let Some(at) = worker.poll_timeout() {
            deadline = deadline.min(now + until(epoch, at));
        }
        match link.recv_until(deadline) {
            Some(m) => {
                if m.kind == Kind::Wire && m.from == 0 {
                    if let Ok(msg) = wire::decode_to_worker::<f32>(&m.bytes, &limits) {
                        let _ = worker.handle(since(epoch), msg);
                    }
                }
                link.recycle(m);
            }
            None => worker.handle_timeout(since(epoch)),
        }
    }
    tally.wall_s = epoch.elapsed().as_secs_f64();
    link.send(&[0], Kind::Tally, tally.to_bytes().to_vec());
    if !link.flush(Instant::now() + options.lost_after.max(Duration::from_secs(5))) {
        return Err(MpiError(format!("worker {}: rank 0 did not take this rank's last messages", id.0)));
    }
    Ok(tally)
}
