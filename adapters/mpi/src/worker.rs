//! Worker ranks (`shards..shards + n`): one worker each. The loop is the threaded adapter's:
//! compute a gradient when the state machine asks, stay busy for the injected straggler
//! delay while handling messages (so a newer model or an abort really interrupts the job),
//! send heartbeats.
//!
//! The computation runs on a thread of its own (`compute`), so the rank's main thread
//! keeps driving MPI and sending heartbeats however long a step takes. A server that
//! declared this rank lost (it was silent, e.g. stopped, for longer than the loss timeout)
//! answers its next message with [`Kind::Rejoin`] and a new epoch: the rank drops its
//! session (state machine, computation) and joins again as a fresh worker of that epoch,
//! as a TCP worker that reconnects does; with shards, it joins every shard with the new
//! epoch (a shard that had not declared it lost takes the new epoch as a restart).

use crate::compute::{ComputeFn, Computer, Input, Token};
use crate::link::{Incoming, Kind, Link, SPLIT_MIN, set_payload_len};
use crate::machine::{Machine, Out};
use crate::{MpiError, Shared, Tally, since, until};
use mpi::environment::Threading;
use mpi::topology::{Rank, SimpleCommunicator};
use std::sync::Arc;
use std::time::{Duration, Instant};
use syncopate::proto::sharded::ShardLayout;
use syncopate::wire::{self, Limits};
use syncopate::{ProtocolConfig, Refusals, Reject, ToServer, ToWorker, Values, Version, WorkerId, WorkerSetup};

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
    /// The servers the model is split over ([`ShardLayout`]): ranks `0..shards`, the
    /// workers on the ranks after them. 1: one server, at rank 0.
    pub shards: u32,
}

/// A computation the state machine asked for: when it started and, once the compute
/// thread returned it, when it is ready (after the straggler delay) and its gradient.
struct Job {
    token: Token,
    started: Instant,
    /// Once computed: when its straggler delay is over, its gradient and its loss.
    done: Option<(Instant, Shared, Option<f32>)>,
}

/// The worker rank's model-sized buffers besides the state machine's: where the next model
/// lands, and spares for gradients (a buffer some send or computation may still read is
/// never written: it waits in the spares until no one else holds it).
struct Buffers {
    dim: usize,
    landing: Shared,
    spares: Vec<Shared>,
}

/// Spare buffers kept at most (more are freed).
const MAX_SPARES: usize = 8;

impl Buffers {
    fn new(dim: usize) -> Self {
        Self { dim, landing: Shared::zeroed(dim), spares: Vec::new() }
    }

    /// A buffer no one else holds: a spare, or a new one.
    fn take(&mut self) -> Shared {
        let free = self.spares.iter().position(|b| Arc::strong_count(&b.0) == 1 && b.0.len() == self.dim);
        free.map_or_else(|| Shared::zeroed(self.dim), |i| self.spares.swap_remove(i))
    }

    /// Keeps `b` as a spare.
    fn give(&mut self, b: Shared) {
        if self.spares.len() < MAX_SPARES {
            self.spares.push(b);
        }
    }

    /// The landing buffer, writable without a copy: one a send or a computation still reads
    /// is set aside for a spare no one reads any more (or a new buffer).
    fn landing(&mut self) -> &mut [f32] {
        if Arc::strong_count(&self.landing.0) > 1 {
            let fresh = self.take();
            let busy = core::mem::replace(&mut self.landing, fresh);
            self.give(busy);
        }
        Arc::make_mut(&mut self.landing.0).as_mut_slice()
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

/// Whether `msg` is a contribution (what a server's ledger counts).
fn is_contribution(msg: &ToServer<'_, f32>) -> bool {
    matches!(msg, ToServer::Grad { .. } | ToServer::Delta { .. } | ToServer::Clock { .. })
}

/// Runs worker `rank - shards` of `options.protocol` at this rank of `world` until every
/// server stops it; then sends each server its tally and returns the tally. `compute(params,
/// grad)` writes a gradient of `params` into `grad` and returns the extra time the step
/// should take (the straggler model; zero for none) and the minibatch loss, if it reports
/// one ([`Computed`](crate::Computed); a bare `Duration` converts with `.into()`); it runs on a thread of its own when
/// MPI gives the process at least `MPI_THREAD_FUNNELED` (initialise MPI with
/// `mpi::initialize_with_threading(Threading::Funneled)`), else inline, with a line to
/// `log` saying what that costs.
///
/// Every input the state machine refuses is counted in the tally; `log` gets a line for the
/// first refusal of each kind, and one for each rejoin.
pub fn run_worker(
    world: SimpleCommunicator,
    options: &WorkerOptions,
    compute: &mut ComputeFn<'_>,
    log: &mut dyn FnMut(&str),
) -> Result<Tally, MpiError> {
    let protocol = &options.protocol;
    let layout = crate::shard_layout(options.dim, options.shards)?;
    crate::check_message_size(layout.len(0))?;
    let link = Link::new(world);
    crate::check_world(&link, protocol.workers(), options.shards)?;
    let first = Rank::try_from(options.shards).unwrap_or(Rank::MAX);
    let id = u32::try_from(link.rank() - first).map(WorkerId).map_err(|_| {
        MpiError(format!("rank {} is a server (ranks 0..{first}): run_worker needs a worker rank", link.rank()))
    })?;
    let setup = WorkerSetup {
        id,
        epoch: 0,
        rejoin_after: options.rejoin_after.map(|d| syncopate::Duration::from_nanos(d.as_nanos() as u64)),
    };
    let machine = Machine::new(protocol, setup, options.dim, layout)
        .map_err(|e| MpiError(format!("cannot start worker {}: {e}", id.0)))?;
    let threaded = mpi::environment::threading_support() >= Threading::Funneled;
    if !threaded {
        log(&format!(
            "worker {}: MPI gives this process a thread level below MPI_THREAD_FUNNELED, so the computation runs \
             on the MPI thread: a step longer than the loss timeout gets this rank declared lost (it then rejoins)",
            id.0
        ));
    }
    let mut rank = WorkerRank::new(link, options, layout, setup, machine, log);
    std::thread::scope(|scope| {
        let mut computer = if threaded { Computer::threaded(scope, compute) } else { Computer::inline(compute) };
        let result = rank.run(&mut computer);
        computer.close();
        result
    })?;
    rank.finish()
}

/// One worker rank's loop state.
struct WorkerRank<'a> {
    link: Link,
    options: &'a WorkerOptions,
    layout: ShardLayout,
    setup: WorkerSetup,
    machine: Machine,
    /// The gradient worker of a large model lends its buffers: a model lands in the buffer
    /// the host computes from, a gradient is sent from the buffer it was computed in (the
    /// raw bytes are the wire's little-endian payload only on a little-endian host).
    lend: bool,
    bufs: Buffers,
    /// The gradient the state machine holds in a lent buffer, until its `Grad` is sent.
    lent: Option<Arc<Vec<f32>>>,
    limits: Limits,
    /// The server ranks (`0..shards`).
    servers: Vec<Rank>,
    /// Contributions sent to each server.
    sent: Vec<u64>,
    tally: Tally,
    refusals: Refusals,
    job: Option<Job>,
    clock: Instant,
    log: &'a mut dyn FnMut(&str),
}

impl<'a> WorkerRank<'a> {
    fn new(
        link: Link,
        options: &'a WorkerOptions,
        layout: ShardLayout,
        setup: WorkerSetup,
        mut machine: Machine,
        log: &'a mut dyn FnMut(&str),
    ) -> Self {
        let lend = machine.gradient().is_some()
            && cfg!(target_endian = "little")
            && options.dim.saturating_mul(4) >= SPLIT_MIN;
        let shards = layout.shards();
        Self {
            link,
            options,
            layout,
            setup,
            machine,
            lend,
            bufs: Buffers::new(options.dim),
            lent: None,
            limits: Limits::for_model(layout.len(0)),
            servers: (0..Rank::try_from(shards).unwrap_or(0)).collect(),
            sent: vec![0; shards as usize],
            tally: Tally::default(),
            refusals: Refusals::default(),
            job: None,
            clock: Instant::now(),
            log,
        }
    }

    fn refused(&mut self, what: &str, e: &Reject) {
        if self.refusals.record(e) {
            (self.log)(&format!(
                "worker {}: the protocol refused {what}: {e} (the first {}; more are counted)",
                self.setup.id.0,
                e.kind_name()
            ));
        }
        self.tally.refused = self.refusals.total();
    }

    fn run(&mut self, computer: &mut Computer<'_, '_>) -> Result<(), MpiError> {
        let heartbeat = crate::heartbeat_interval(self.options.lost_after);
        let mut next_heartbeat = Instant::now() + heartbeat;
        // When a shard first stopped this worker: the others' `Stop` is awaited up to the loss
        // timeout (a lost shard never sends one).
        let mut first_stop: Option<Instant> = None;
        loop {
            self.drain(computer)?;
            if self.machine.is_stopped() {
                return Ok(());
            }
            if self.machine.any_stopped() {
                let at = *first_stop.get_or_insert_with(Instant::now);
                if at.elapsed() >= self.options.lost_after {
                    (self.log)(&format!(
                        "worker {}: some shards stopped this worker and the others did not within the loss timeout: \
                         stopping",
                        self.setup.id.0
                    ));
                    return Ok(());
                }
            }
            while let Some(out) = computer.poll()? {
                self.tally.computed += 1;
                match self.job.as_mut().filter(|j| j.token == out.token && j.done.is_none()) {
                    Some(j) => j.done = Some((Instant::now() + out.computed.extra, out.grad, out.computed.loss)),
                    None => self.bufs.give(out.grad),
                }
            }
            if self.hand_in_ready_gradient() {
                continue;
            }
            let now = Instant::now();
            if now >= next_heartbeat {
                self.link.send(&self.servers, Kind::Heartbeat, Vec::new());
                next_heartbeat = now + heartbeat;
            }
            let mut deadline = next_heartbeat;
            if let Some((at, _, _)) = self.job.as_ref().and_then(|j| j.done.as_ref()) {
                deadline = deadline.min(*at);
            }
            if let Some(at) = self.machine.poll_timeout() {
                deadline = deadline.min(now + until(self.clock, at));
            }
            if let Some(at) = first_stop {
                deadline = deadline.min(at + self.options.lost_after);
            }
            let landing = if self.lend { Some(self.bufs.landing()) } else { None };
            match self.link.recv_until(deadline, landing, Some(computer.wake())) {
                Some(m) => {
                    self.take_message(&m, computer)?;
                    self.link.recycle(m);
                }
                None => {
                    if self.machine.poll_timeout().is_some_and(|at| at <= since(self.clock)) {
                        self.machine.handle_timeout(since(self.clock));
                    }
                }
            }
        }
    }

    /// Acts on every output of the state machine.
    fn drain(&mut self, computer: &mut Computer<'_, '_>) -> Result<(), MpiError> {
        let Self { link, machine, bufs, lent, sent, job, tally, setup, .. } = self;
        // The buffer a `Compute`'s params are in, handed to the compute thread as is: one
        // server's worker writes nothing while its outputs are polled, so it is the same
        // buffer throughout. A sharded worker assembles the model while polled (a write, which
        // a clone held here would turn into a copy): its params are copied once instead.
        let model = matches!(machine, Machine::One(_)).then(|| Arc::clone(&machine.params_buffer().0));
        while let Some(out) = machine.poll_output() {
            match out {
                Out::Send { shard, msg } => {
                    if is_contribution(&msg) {
                        if let Some(n) = sent.get_mut(shard as usize) {
                            *n += 1;
                        }
                    }
                    let to = Rank::try_from(shard).unwrap_or(0);
                    send(link, to, &msg, lent.take_if(|_| matches!(msg, ToServer::Grad { .. })), setup.id)?;
                }
                Out::Compute { id, params } => {
                    let params = match &model {
                        Some(m) if params.as_ptr() == m.as_ptr() && params.len() == m.len() => Arc::clone(m),
                        _ => Arc::new(params.to_vec()),
                    };
                    if let Some(old) = job.take() {
                        abandon(tally, bufs, computer, old);
                    }
                    let token = Token { epoch: setup.epoch, id };
                    if let Some(replaced) = computer.start(Input { token, params, grad: bufs.take() }) {
                        bufs.give(replaced.grad);
                    }
                    *job = Some(Job { token, started: Instant::now(), done: None });
                }
                Out::Abandoned(id) => {
                    if let Some(old) = job.take_if(|j| j.token.id == id) {
                        abandon(tally, bufs, computer, old);
                    }
                }
                Out::Other => {}
            }
        }
        Ok(())
    }

    /// Hands the state machine the gradient of the job whose straggler delay is over, if
    /// any; true if it did.
    fn hand_in_ready_gradient(&mut self) -> bool {
        let ready = |j: &Job| j.done.as_ref().is_some_and(|(at, _, _)| Instant::now() >= *at);
        let Some(Job { token, started, done: Some((_, mut grad, loss)) }) = self.job.take_if(|j| ready(j)) else {
            return false;
        };
        self.tally.busy_s += started.elapsed().as_secs_f64();
        let now = since(self.clock);
        let lend = self.lend;
        let result = match self.machine.gradient() {
            Some(gw) if lend => {
                let payload = Arc::clone(&grad.0);
                let r = gw.handle_gradient_in(now, token.id, &mut grad, loss);
                if r.is_ok() {
                    self.lent = Some(payload);
                }
                r
            }
            _ => self.machine.handle_gradient(now, token.id, grad.as_ref(), loss),
        };
        // After a trade, `grad` holds the state machine's previous buffer.
        self.bufs.give(grad);
        if let Err(e) = result {
            self.refused("a finished gradient", &e);
        }
        true
    }

    /// Acts on a message from a server rank.
    fn take_message(&mut self, m: &Incoming, computer: &mut Computer<'_, '_>) -> Result<(), MpiError> {
        let Some(shard) = u32::try_from(m.from).ok().filter(|s| *s < self.layout.shards()) else {
            return Ok(());
        };
        let now = since(self.clock);
        match m.kind {
            // The payload is in `bufs.landing`: the model trades places with the worker's
            // buffer if accepted.
            Kind::Wire if m.landed => {
                let result = match (self.machine.gradient(), model_version(m.message(), &self.limits)) {
                    (Some(gw), Some(version)) => gw.handle_model_in(now, version, &mut self.bufs.landing),
                    _ => Ok(()),
                };
                if let Err(e) = result {
                    self.refused("the server's Model message", &e);
                }
            }
            Kind::Wire => {
                if let Ok(msg) = wire::decode_to_worker::<f32>(m.message(), &self.limits) {
                    let kind = msg.kind_name();
                    if let Err(e) = self.machine.handle(now, shard, msg) {
                        self.refused(&format!("the server's {kind} message"), &e);
                    }
                }
            }
            Kind::Rejoin => {
                let epoch = m.message().try_into().ok().map(u32::from_le_bytes);
                if let Some(epoch) = epoch.filter(|e| *e > self.setup.epoch) {
                    self.rejoin(epoch, computer)?;
                }
            }
            Kind::Heartbeat | Kind::Tally | Kind::Head | Kind::Payload | Kind::ShardStop | Kind::ShardReport => {}
        }
        Ok(())
    }

    /// Drops this rank's session and joins again as a fresh worker of `epoch`.
    fn rejoin(&mut self, epoch: u32, computer: &mut Computer<'_, '_>) -> Result<(), MpiError> {
        let id = self.setup.id;
        (self.log)(&format!("worker {}: the server declared this rank lost; rejoining with epoch {epoch}", id.0));
        self.setup.epoch = epoch;
        self.machine = Machine::new(&self.options.protocol, self.setup, self.options.dim, self.layout)
            .map_err(|e| MpiError(format!("cannot restart worker {}: {e}", id.0)))?;
        if let Some(old) = self.job.take() {
            abandon(&mut self.tally, &mut self.bufs, computer, old);
        }
        if let Some(waiting) = computer.forget_all() {
            self.bufs.give(waiting.grad);
        }
        self.lent = None;
        Ok(())
    }

    /// Sends every server its tally (with the contributions this rank sent it) and waits
    /// until they took this rank's last messages.
    fn finish(mut self) -> Result<Tally, MpiError> {
        self.tally.wall_s = self.clock.elapsed().as_secs_f64();
        for (rank, sent) in self.servers.iter().zip(&self.sent) {
            let tally = Tally { sent: *sent, ..self.tally };
            self.link.send(&[*rank], Kind::Tally, tally.to_bytes().to_vec());
        }
        if !self.link.flush(Instant::now() + self.options.lost_after.max(Duration::from_secs(5))) {
            return Err(MpiError(format!(
                "worker {}: the server did not take this rank's last messages",
                self.setup.id.0
            )));
        }
        self.tally.sent = self.sent.iter().sum();
        Ok(self.tally)
    }
}

/// Counts the abandoned job `old` and takes back its buffers.
fn abandon(tally: &mut Tally, bufs: &mut Buffers, computer: &mut Computer<'_, '_>, old: Job) {
    tally.busy_s += old.started.elapsed().as_secs_f64();
    tally.abandoned += 1;
    if let Some((_, grad, _)) = old.done {
        bufs.give(grad);
    }
    if let Some(waiting) = computer.forget(old.token) {
        bufs.give(waiting.grad);
    }
}

/// Sends `msg` to rank `to`: a `Grad` whose values are the lent buffer `lent` as its head
/// and then its payload straight from that buffer; anything else encoded whole.
fn send(
    link: &mut Link,
    to: Rank,
    msg: &ToServer<'_, f32>,
    lent: Option<Arc<Vec<f32>>>,
    id: WorkerId,
) -> Result<(), MpiError> {
    let encode_error = |e| MpiError(format!("worker {}: cannot encode a message: {e}", id.0));
    if let (ToServer::Grad { base, iteration, seq, values: Values::Slice(s), loss }, Some(payload)) = (msg, lent) {
        if s.as_ptr() == payload.as_ptr() && s.len() == payload.len() {
            let head: ToServer<'_, f32> = ToServer::Grad {
                base: *base,
                iteration: *iteration,
                seq: *seq,
                values: Values::Slice(&[]),
                loss: *loss,
            };
            let mut out = link.buffer();
            out.resize(wire::encoded_len_to_server(&head), 0);
            let len = wire::encode_to_server(&head, &mut out).map_err(encode_error)?;
            out.truncate(len);
            if set_payload_len(&mut out, size_of_val(*s)) && link.send_lent(&[to], out, payload) {
                return Ok(());
            }
        }
    }
    let mut out = link.buffer();
    out.resize(wire::encoded_len_to_server(msg), 0);
    let len = wire::encode_to_server(msg, &mut out).map_err(encode_error)?;
    out.truncate(len);
    link.send(&[to], Kind::Wire, out);
    Ok(())
}
