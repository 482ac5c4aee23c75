//! Ranks `1..=n`: one worker each. The loop is the threaded adapter's: compute a gradient
//! when the state machine asks, stay busy for the injected straggler delay while handling
//! messages (so a newer model or an abort really interrupts the job), send heartbeats.

use crate::link::{Kind, Link, SPLIT_MIN, set_payload_len};
use crate::{MpiError, Shared, Tally, since, until};
use mpi::topology::SimpleCommunicator;
use std::sync::Arc;
use std::time::{Duration, Instant};
use syncopate::wire::{self, Limits};
use syncopate::{
    AnyWorker, ComputeId, ProtocolConfig, ToServer, ToWorker, Values, Version, Worker, WorkerEvent, WorkerId,
    WorkerOutput, WorkerSetup,
};

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

/// The worker rank's buffers besides the state machine's: where the next model lands,
/// where the next gradient is computed, and spares (buffers some send may still read).
struct Buffers {
    dim: usize,
    landing: Shared,
    grad: Shared,
    spares: Vec<Shared>,
}

impl Buffers {
    fn new(dim: usize) -> Self {
        Self { dim, landing: Shared::zeroed(dim), grad: Shared::zeroed(dim), spares: Vec::new() }
    }

    /// `slot` (`landing` or `grad`), writable without a copy: a slot a send still reads is
    /// set aside for a spare no send reads any more (or a new buffer).
    fn writable<'a>(slot: &'a mut Shared, spares: &mut Vec<Shared>, dim: usize) -> &'a mut [f32] {
        if Arc::strong_count(&slot.0) > 1 {
            let free = spares.iter().position(|b| Arc::strong_count(&b.0) == 1);
            let fresh = free.map_or_else(|| Shared::zeroed(dim), |i| spares.swap_remove(i));
            spares.push(core::mem::replace(slot, fresh));
        }
        Arc::make_mut(&mut slot.0).as_mut_slice()
    }

    fn landing(&mut self) -> &mut [f32] {
        Self::writable(&mut self.landing, &mut self.spares, self.dim)
    }

    fn grad(&mut self) -> &mut [f32] {
        Self::writable(&mut self.grad, &mut self.spares, self.dim)
    }
}

/// The version of the `Model` whose head is `head` (its payload landed elsewhere): the head
/// decoded as the message with an empty payload.
fn model_version(head: &[u8], limits: &Limits) -> Option<Version> {
    let mut copy = [0u8; wire::HEADER_LEN + wire::MAX_CONTROL_LEN];
    let copy = copy.get_mut(..head.len())?;
    copy.copy_from_slice(head);
    set_payload_len(copy, 0).then_some(())?;
    match wire::decode_to_worker::<f32>(copy, limits) {
        Ok(ToWorker::Model { version, .. }) => Some(version),
        _ => None,
    }
}

/// Runs worker `rank - 1` of `options.protocol` at this rank of `world` until the server
/// stops it; then sends its tally to rank 0 and returns it. `compute(params, grad)` writes a
/// gradient of `params` into `grad` and returns the extra time the step should take (the
/// straggler model; zero for none).
///
/// Every input the state machine refuses is counted in the tally; `log` gets a line for the
/// first refusal of each kind.
pub fn run_worker(
    world: SimpleCommunicator,
    options: &WorkerOptions,
    compute: &mut dyn FnMut(&[f32], &mut [f32]) -> Duration,
    log: &mut dyn FnMut(&str),
) -> Result<Tally, MpiError> {
    let protocol = &options.protocol;
    crate::check_message_size(options.dim)?;
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
    let mut worker =
        AnyWorker::new(protocol, setup, Shared::zeroed(dim), Shared::zeroed(protocol.worker_scratch_len(dim)))
            .map_err(|e| MpiError(format!("cannot start worker {}: {e}", id.0)))?;
    // The gradient worker (BSP, ASP, backup, DBW) of a large model lends its buffers: a model
    // lands in the buffer the host computes from, a gradient is sent from the buffer it was
    // computed in (the raw bytes are the wire's little-endian payload only on a
    // little-endian host).
    let lend = matches!(worker, AnyWorker::Gradient(_))
        && cfg!(target_endian = "little")
        && dim.saturating_mul(4) >= SPLIT_MIN;
    let mut bufs = Buffers::new(dim);
    // The gradient the state machine holds in a lent buffer, until its `Grad` is sent.
    let mut lent: Option<Arc<Vec<f32>>> = None;
    let limits = Limits::for_model(dim);
    let heartbeat = crate::heartbeat_interval(options.lost_after);
    let epoch = Instant::now();
    let mut tally = Tally::default();
    let mut refusals = syncopate::Refusals::default();
    let mut refused = |tally: &mut Tally, what: &str, e: &syncopate::Reject| {
        if refusals.record(e) {
            log(&format!(
                "worker {}: the protocol refused {what}: {e} (the first {}; more are counted)",
                id.0,
                e.kind_name()
            ));
        }
        tally.refused = refusals.total();
    };
    let mut job: Option<Job> = None;
    let mut next_heartbeat = Instant::now() + heartbeat;
    loop {
        while let Some(output) = worker.poll_output() {
            match output {
                WorkerOutput::Send(msg) => {
                    let sent = match (&msg, lent.take_if(|_| matches!(msg, ToServer::Grad { .. }))) {
                        (ToServer::Grad { base, iteration, seq, values: Values::Slice(s) }, Some(payload))
                            if s.as_ptr() == payload.as_ptr() && s.len() == payload.len() =>
                        {
                            let head: ToServer<'_, f32> = ToServer::Grad {
                                base: *base,
                                iteration: *iteration,
                                seq: *seq,
                                values: Values::Slice(&[]),
                            };
                            let mut out = link.buffer();
                            out.resize(wire::encoded_len_to_server(&head), 0);
                            let len = wire::encode_to_server(&head, &mut out)
                                .map_err(|e| MpiError(format!("worker {}: cannot encode a message: {e}", id.0)))?;
                            out.truncate(len);
                            set_payload_len(&mut out, size_of_val(*s)) && link.send_lent(&[0], out, payload)
                        }
                        _ => false,
                    };
                    if !sent {
                        let mut out = link.buffer();
                        out.resize(wire::encoded_len_to_server(&msg), 0);
                        let len = wire::encode_to_server(&msg, &mut out)
                            .map_err(|e| MpiError(format!("worker {}: cannot encode a message: {e}", id.0)))?;
                        out.truncate(len);
                        link.send(&[0], Kind::Wire, out);
                    }
                    next_heartbeat = Instant::now() + heartbeat;
                }
                WorkerOutput::Compute { id: job_id, params, .. } => {
                    let now = Instant::now();
                    if let Some(old) = job.take() {
                        tally.busy_s += now.duration_since(old.started).as_secs_f64();
                        tally.abandoned += 1;
                    }
                    let extra = compute(params, bufs.grad());
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
            match &mut worker {
                AnyWorker::Gradient(gw) if lend => {
                    let payload = Arc::clone(&bufs.grad.0);
                    match gw.handle_gradient_in(since(epoch), j.id, &mut bufs.grad) {
                        Ok(()) => lent = Some(payload),
                        Err(e) => refused(&mut tally, "a finished gradient", &e),
                    }
                }
                _ => {
                    if let Err(e) = worker.handle_gradient(since(epoch), j.id, bufs.grad.as_ref()) {
                        refused(&mut tally, "a finished gradient", &e);
                    }
                }
            }
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
        let landing = if lend { Some(bufs.landing()) } else { None };
        match link.recv_until(deadline, landing) {
            Some(m) => {
                if m.kind == Kind::Wire && m.from == 0 {
                    match &mut worker {
                        // The payload is in `bufs.landing`: the model trades places with the
                        // worker's buffer if accepted.
                        AnyWorker::Gradient(gw) if m.landed => {
                            if let Some(version) = model_version(m.message(), &limits) {
                                if let Err(e) = gw.handle_model_in(since(epoch), version, &mut bufs.landing) {
                                    refused(&mut tally, "the server's Model message", &e);
                                }
                            }
                        }
                        _ => {
                            if let Ok(msg) = wire::decode_to_worker::<f32>(m.message(), &limits) {
                                let kind = msg.kind_name();
                                if let Err(e) = worker.handle(since(epoch), msg) {
                                    refused(&mut tally, &format!("the server's {kind} message"), &e);
                                }
                            }
                        }
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
