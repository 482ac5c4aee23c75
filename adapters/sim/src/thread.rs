//! Real threads: one server thread and `n` worker threads in one process, connected by the
//! [`crate::channel`] star, computing real gradients of a [`Workload`], with
//! injected straggler delays.
//!
//! Each loop is the driving contract and nothing more: read the clock, feed one input,
//! drain the outputs, wait until the next deadline or message. A worker computes a gradient
//! when its state machine asks (`Compute`), then stays busy for the injected delay of that
//! step; messages that arrive meanwhile are handled at once, so a newer model or an abort
//! really interrupts the job (the late gradient is then refused by the worker itself and
//! never sent). Uploads are channel sends, so they overlap the next computation.
//!
//! A run ends at its gradient budget, its time limit, or when it diverges: an evaluation
//! finds the test loss NaN or infinite, or the server refuses a contribution for holding
//! NaN or ±∞ or overflowing its norm.

use crate::channel::{self, Packet, RecvError, ServerPort, WorkerPort};
use crate::workload::{BatchSampler, Workload};
use std::sync::Arc;
use std::thread;
use std::time::{Duration as StdDuration, Instant as StdInstant};
use syncopate::proto::Heap;
use syncopate::wire::{self, Limits};
use syncopate::{
    AnyServer, AnyWorker, Instant, ProtocolConfig, Refusals, Reject, Server, ServerEvent, ServerOutput, ServerStats,
    ToServer, Worker, WorkerEvent, WorkerOutput, WorkerSetup,
};

/// The extra time worker `i` stays busy on its `step`-th gradient (its straggler model).
pub type StepDelay = Box<dyn FnMut(u64) -> StdDuration + Send>;

/// Settings of a threaded run.
#[derive(Clone, Debug)]
pub struct ThreadConfig {
    /// The protocol and its knobs.
    pub protocol: ProtocolConfig,
    /// Minibatch size per gradient.
    pub batch_size: usize,
    /// Seed for the model's initialisation and the workers' minibatches.
    pub seed: u64,
    /// Stop once the server has accepted this many gradients (a compute budget: with `n`
    /// workers, about `max_gradients / n` steps each, whatever the protocol).
    pub max_gradients: u64,
    /// Stop after this much wall time, whatever the version.
    pub time_limit: Option<StdDuration>,
    /// Evaluate the model on the test set at most this often (and only after it changed).
    pub eval_interval: StdDuration,
    /// Workers re-send `Join` after waiting this long for the server.
    pub rejoin_after: Option<StdDuration>,
    /// Test accuracy whose first crossing is reported as the time to target.
    pub target_accuracy: f64,
    /// SGD with momentum on every update of the server's model, in `[0, 1)` (0: plain SGD).
    pub momentum: f64,
}

/// One evaluation of the server's model (time in wall-clock seconds since the start).
pub use crate::sim::CurvePoint as EvalPoint;

/// What one worker thread did.
#[derive(Clone, Debug, Default, PartialEq, serde::Serialize)]
pub struct WorkerTally {
    /// Gradients computed (including abandoned ones).
    pub computed: u64,
    /// Jobs abandoned before completion.
    pub abandoned: u64,
    /// Seconds spent computing (real compute plus injected delay).
    pub busy_s: f64,
    /// Seconds the worker thread ran.
    pub wall_s: f64,
    /// Seconds each completed step took (real compute plus injected delay), in order.
    #[serde(skip)]
    pub step_times: Vec<f64>,
    /// What each completed step's gradient measured, in order (empty unless the run records
    /// gradients: [`run_recording`]).
    #[serde(skip)]
    pub step_gradients: Vec<crate::trace::GradientStats>,
    /// Conservation ledger: distinct contributions sent to the server.
    pub sent: u64,
    /// Contributions sent again with a sequence number already sent (retransmissions).
    pub resent: u64,
    /// Inputs the worker's state machine refused (server messages, finished gradients).
    pub refused: u64,
    /// The first refusal of each kind, described (the rest are only counted).
    pub first_refusals: Vec<String>,
}

/// The server's side of a threaded run's conservation ledger: with the workers' `sent` and
/// `resent`, `sent + resent = received + in flight at stop`, and `received = accepted +
/// refused` (the server's counters split the accepted ones into applied, dropped and held).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, serde::Serialize)]
pub struct ThreadLedger {
    /// Contributions (gradients, deltas, clock updates) the server read and handled.
    pub received: u64,
    /// Of those, refused.
    pub refused: u64,
    /// Of the refused, those holding NaN or ±∞ or overflowing their norm: a diverged
    /// model's (the run then ends, see [`run`]).
    pub refused_not_finite: u64,
    /// Contributions the workers sent that the server never read (it had stopped).
    pub in_flight_at_stop: u64,
    /// Whether every worker thread ended before the count was closed (otherwise a late send
    /// may be missing from `in_flight_at_stop`).
    pub complete: bool,
}

/// The outcome of a threaded run.
#[derive(Clone, Debug, Default, PartialEq, serde::Serialize)]
pub struct ThreadReport {
    /// Evaluations over time.
    pub curve: Vec<EvalPoint>,
    /// Seconds until the test accuracy first reached the target, if it did.
    pub time_to_target_s: Option<f64>,
    /// Wall-clock seconds of the run.
    pub wall_s: f64,
    /// The server's counters.
    #[serde(skip)]
    pub stats: ServerStats,
    /// Per worker.
    pub workers: Vec<WorkerTally>,
    /// Staleness of each applied contribution: sum, count and maximum.
    pub staleness: (u64, u64, u64),
    /// Stall reports the server made.
    pub stalls: u64,
    /// Inputs the server refused (decoding errors included).
    pub refused: u64,
    /// Workers the server declared lost (their channel was gone).
    pub lost: u64,
    /// The final model.
    #[serde(skip)]
    pub params: Vec<f32>,
    /// The server's side of the conservation ledger.
    pub ledger: ThreadLedger,
}

/// Why a threaded run could not start.
#[derive(Debug)]
pub struct ThreadError(pub String);

impl std::fmt::Display for ThreadError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(&self.0)
    }
}

impl std::error::Error for ThreadError {}

fn since(origin: StdInstant) -> Instant {
    Instant::from_nanos(u64::try_from(origin.elapsed().as_nanos()).unwrap_or(u64::MAX))
}

fn until(origin: StdInstant, at: Instant) -> StdDuration {
    StdDuration::from_nanos(at.as_nanos().saturating_sub(since(origin).as_nanos()))
}

/// Runs `config` on `workload` with one thread per worker; `delays[i]` is worker `i`'s
/// straggler model (missing entries mean no delay). `progress` sees every evaluation.
pub fn run(
    config: &ThreadConfig,
    workload: Arc<Workload>,
    delays: Vec<StepDelay>,
    progress: &mut dyn FnMut(&EvalPoint),
) -> Result<ThreadReport, ThreadError> {
    run_recording(config, workload, delays, progress, false)
}

/// Worker and step index of a completed step.
type StepId = (usize, usize);
/// The gradient groups every worker of a recording run adds to.
type SharedGroups = Arc<std::sync::Mutex<crate::trace::GradientGroups<StepId>>>;

/// [`run`]; with `record_gradients`, every completed step's minibatch loss and gradient
/// norm, and the norm of the mean of the gradients computed on the same model
/// ([`crate::trace::GradientGroups`]), are in [`WorkerTally::step_gradients`].
pub fn run_recording(
    config: &ThreadConfig,
    workload: Arc<Workload>,
    delays: Vec<StepDelay>,
    progress: &mut dyn FnMut(&EvalPoint),
    record_gradients: bool,
) -> Result<ThreadReport, ThreadError> {
    let groups: Option<SharedGroups> = record_gradients.then(SharedGroups::default);
    let n = config.protocol.workers() as usize;
    let dim = workload.model.dim();
    let mut params = vec![0.0f32; dim];
    workload.model.init(config.seed, &mut params);
    let scratch = vec![0.0f32; config.protocol.server_scratch_len(dim)];
    let spare = vec![0.0f32; config.protocol.spare_accumulator_len(dim)];
    let server = AnyServer::new(&config.protocol, params, scratch)
        .and_then(|s| s.with_spare_accumulator(spare))
        .and_then(|s| if config.momentum > 0.0 { s.with_momentum(config.momentum, vec![0.0; dim]) } else { Ok(s) })
        .map_err(|e| ThreadError(e.to_string()))?;
    if server.has_upstream() {
        return Err(ThreadError("the server needs an upstream link, which threaded runs do not have".into()));
    }
    let (port, ports) = channel::star(n, 64);
    let origin = StdInstant::now();
    let mut delays = delays.into_iter();
    let mut handles = Vec::with_capacity(n);
    for worker_port in ports {
        let id = worker_port.id();
        let setup = WorkerSetup {
            id,
            epoch: 0,
            rejoin_after: config.rejoin_after.map(|d| syncopate::Duration::from_nanos(d.as_nanos() as u64)),
        };
        let worker = AnyWorker::new(
            &config.protocol,
            setup,
            vec![0.0f32; dim],
            vec![0.0f32; config.protocol.worker_scratch_len(dim)],
        )
        .map_err(|e| ThreadError(e.to_string()))?;
        let delay = delays.next().unwrap_or_else(|| Box::new(|_| StdDuration::ZERO));
        let workload = Arc::clone(&workload);
        let seed = config.seed ^ (u64::from(id.0) + 1).wrapping_mul(0x9E37_79B9_7F4A_7C15);
        let batch = config.batch_size;
        let groups = groups.clone();
        handles.push(
            thread::Builder::new()
                .name(format!("worker-{}", id.0))
                .spawn(move || worker_loop(worker, worker_port, &workload, (batch, seed), delay, origin, groups))
                .map_err(|e| ThreadError(format!("cannot start a worker thread: {e}")))?,
        );
    }
    let mut report = server_loop(server, &port, &workload, config, origin, progress);
    // What the workers sent after the server stopped reading is in flight at the stop: read
    // it until every worker has ended (they end on the server's `Stop`), for a bounded time.
    let limits = Limits::for_model(dim);
    let deadline = StdInstant::now() + StdDuration::from_secs(2);
    while StdInstant::now() < deadline {
        match port.recv(Some(StdDuration::from_millis(5))) {
            Ok(packet) => {
                if is_contribution(&packet, &limits) {
                    report.ledger.in_flight_at_stop += 1;
                }
                port.recycle(packet);
            }
            Err(RecvError::Disconnected) => {
                report.ledger.complete = true;
                break;
            }
            Err(RecvError::Timeout) => {}
        }
    }
    drop(port);
    for h in handles {
        report.workers.push(h.join().unwrap_or_default());
    }
    if let Some(groups) = groups {
        let groups = std::mem::take(&mut *groups.lock().unwrap_or_else(std::sync::PoisonError::into_inner));
        for ((w, i), mean_norm, count) in groups.finish() {
            if let Some(g) = report.workers.get_mut(w).and_then(|t| t.step_gradients.get_mut(i)) {
                g.mean_norm = mean_norm.is_finite().then_some(mean_norm);
                g.mean_of = count;
            }
        }
    }
    Ok(report)
}

fn is_contribution(packet: &Packet, limits: &Limits) -> bool {
    matches!(
        wire::decode_to_server::<f32>(&packet.bytes, limits),
        Ok(ToServer::Grad { .. } | ToServer::Delta { .. } | ToServer::Clock { .. })
    )
}

struct ServerSide<'a> {
    port: &'a ServerPort,
    report: ThreadReport,
}

impl ServerSide<'_> {
    /// Drains the server's outputs; a worker whose channel is gone is reported lost, and
    /// what the losses produce is drained in turn. Every loss is reported (the core refuses
    /// none for want of room); a refusal (an id outside the run) is counted.
    fn drain(&mut self, server: &mut AnyServer<f32, Vec<f32>, Heap>, origin: StdInstant) {
        loop {
            let lost = self.drain_once(server);
            if lost.is_empty() {
                return;
            }
            for w in lost {
                if server.handle_worker_lost(since(origin), w).is_err() {
                    self.report.refused += 1;
                }
            }
        }
    }

    /// Drains the outputs once; returns the workers found gone.
    fn drain_once(&mut self, server: &mut AnyServer<f32, Vec<f32>, Heap>) -> Vec<syncopate::WorkerId> {
        let mut lost = Vec::new();
        while let Some(out) = server.poll_output() {
            match out {
                ServerOutput::Send { to, msg } => {
                    // Encoded once into a buffer every recipient shares.
                    if let Ok(gone) = self.port.send_to_worker(to, &msg) {
                        lost.extend(gone);
                    }
                }
                ServerOutput::Event(ServerEvent::Applied { staleness, .. }) => {
                    let s = &mut self.report.staleness;
                    s.0 += staleness;
                    s.1 += 1;
                    s.2 = s.2.max(staleness);
                }
                ServerOutput::Event(ServerEvent::Stalled { .. }) => self.report.stalls += 1,
                ServerOutput::Event(ServerEvent::WorkerLost { .. }) => self.report.lost += 1,
                ServerOutput::Event(_) => {}
                // This adapter has no upstream link: a server with an upstream is refused
                // before the run (`run`), and one without never sends upstream.
                ServerOutput::Upstream(_) => {}
            }
        }
        lost
    }

    fn feed(&mut self, server: &mut AnyServer<f32, Vec<f32>, Heap>, packet: &Packet, limits: &Limits, now: Instant) {
        let result = match (packet.from, wire::decode_to_server::<f32>(&packet.bytes, limits)) {
            (Some(from), Ok(msg)) => {
                let contribution =
                    matches!(msg, ToServer::Grad { .. } | ToServer::Delta { .. } | ToServer::Clock { .. });
                let result = server.handle(now, from, msg);
                let ok = result.is_ok();
                self.report.ledger.received += u64::from(contribution);
                self.report.ledger.refused += u64::from(contribution && !ok);
                self.report.ledger.refused_not_finite +=
                    u64::from(matches!(result, Err(Reject::NotFinite | Reject::NormTooLarge)));
                ok
            }
            _ => false,
        };
        if !result {
            self.report.refused += 1;
        }
    }
}

fn server_loop(
    mut server: AnyServer<f32, Vec<f32>, Heap>,
    port: &ServerPort,
    workload: &Workload,
    config: &ThreadConfig,
    origin: StdInstant,
    progress: &mut dyn FnMut(&EvalPoint),
) -> ThreadReport {
    let limits = Limits::for_model(workload.model.dim());
    let mut side = ServerSide { port, report: ThreadReport::default() };
    let mut last_eval: Option<(u64, StdInstant)> = None;
    let tick = StdDuration::from_millis(50);
    loop {
        side.drain(&mut server, origin);
        let version = server.version().0;
        let due = last_eval.is_none_or(|(v, at)| v != version && at.elapsed() >= config.eval_interval);
        if due {
            last_eval = Some((version, StdInstant::now()));
            let e = workload.model.evaluate(server.params(), &workload.test);
            let point =
                EvalPoint { time_s: origin.elapsed().as_secs_f64(), version, accuracy: e.accuracy, loss: e.loss };
            if side.report.time_to_target_s.is_none() && e.accuracy >= config.target_accuracy {
                side.report.time_to_target_s = Some(point.time_s);
            }
            progress(&point);
            side.report.curve.push(point);
        }
        if server.stats().accepted >= config.max_gradients || config.time_limit.is_some_and(|t| origin.elapsed() >= t) {
            break;
        }
        // Diverged: a model with a NaN or infinite loss cannot recover, and a contribution
        // refused for NaN, ±∞ or an overflowing norm leaves a synchronous round waiting for
        // ever. The run ends; its summary says why.
        let not_finite_loss = side.report.curve.last().is_some_and(|p| !p.loss.is_finite());
        if not_finite_loss || side.report.ledger.refused_not_finite > 0 {
            break;
        }
        let wait = server.poll_timeout().map_or(tick, |at| until(origin, at).min(tick));
        match port.recv(Some(wait)) {
            Ok(packet) => {
                side.feed(&mut server, &packet, &limits, since(origin));
                port.recycle(packet);
            }
            Err(RecvError::Timeout) => server.handle_timeout(since(origin)),
            Err(RecvError::Disconnected) => break,
        }
    }
    server.stop();
    side.drain(&mut server, origin);
    let mut report = side.report;
    if report.curve.last().is_none_or(|p| p.version != server.version().0) {
        let e = workload.model.evaluate(server.params(), &workload.test);
        report.curve.push(EvalPoint {
            time_s: origin.elapsed().as_secs_f64(),
            version: server.version().0,
            accuracy: e.accuracy,
            loss: e.loss,
        });
    }
    report.wall_s = origin.elapsed().as_secs_f64();
    report.stats = *server.stats();
    report.params = server.params().to_vec();
    report
}

struct Job {
    id: syncopate::ComputeId,
    started: StdInstant,
    ready: StdInstant,
    /// The minibatch loss of its gradient (finite), reported with it.
    loss: Option<f32>,
    /// The model's key ([`crate::trace::model_key`]), when recording.
    model_key: Option<u64>,
}

fn worker_loop(
    mut worker: AnyWorker<f32, Vec<f32>>,
    port: WorkerPort,
    workload: &Workload,
    (batch_size, seed): (usize, u64),
    mut delay: StepDelay,
    origin: StdInstant,
    groups: Option<SharedGroups>,
) -> WorkerTally {
    let me = port.id().0 as usize;
    let started = StdInstant::now();
    let dim = workload.model.dim();
    let limits = Limits::for_model(dim);
    let mut tally = WorkerTally::default();
    let mut sampler = BatchSampler::new(workload.train.len(), seed);
    let mut scratch = workload.model.scratch();
    let (mut batch, mut grad) = (Vec::with_capacity(batch_size), vec![0.0f32; dim]);
    let mut job: Option<Job> = None;
    let mut sent = syncopate::WorkerStats::default();
    let mut refusals = Refusals::default();
    'run: loop {
        while let Some(out) = worker.poll_output() {
            match out {
                WorkerOutput::Send(msg) => {
                    // Encoded straight into a pooled packet.
                    if port.send_to_server(&msg).is_err() {
                        break 'run;
                    }
                    sent.record(&msg);
                }
                WorkerOutput::Compute { id, params, .. } => {
                    let now = StdInstant::now();
                    if let Some(old) = job.take() {
                        tally.busy_s += now.duration_since(old.started).as_secs_f64();
                        tally.abandoned += 1;
                    }
                    sampler.next_batch(batch_size, &mut batch);
                    let loss = workload.model.gradient(params, &workload.train, &batch, &mut grad, &mut scratch);
                    let model_key = groups.is_some().then(|| crate::trace::model_key(params));
                    tally.computed += 1;
                    let extra = delay(tally.computed - 1);
                    let loss = Some(loss).filter(|l| l.is_finite());
                    job = Some(Job { id, started: now, ready: StdInstant::now() + extra, loss, model_key });
                }
                WorkerOutput::Event(WorkerEvent::Abandoned { id }) => {
                    if let Some(j) = job.take_if(|j| j.id == id) {
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
        if job.as_ref().is_some_and(|j| StdInstant::now() >= j.ready) {
            // What arrived during the job comes first: a worker that asks for its next job at
            // once (WBSP's overlap variant) would otherwise never read its inbox, not even
            // the server's replies or its `Stop`.
            match port.recv(Some(StdDuration::ZERO)) {
                Ok(packet) => {
                    deliver(&mut worker, &port, packet, &limits, origin, &mut refusals, &mut tally);
                    continue;
                }
                Err(RecvError::Disconnected) => break,
                Err(RecvError::Timeout) => {}
            }
        }
        if let Some(j) = job.take_if(|j| StdInstant::now() >= j.ready) {
            let took = j.started.elapsed().as_secs_f64();
            tally.busy_s += took;
            if let (Some(groups), Some(key)) = (&groups, j.model_key) {
                tally.step_gradients.push(crate::trace::GradientStats {
                    loss: j.loss.map(f64::from),
                    grad_norm: Some(crate::trace::norm(&grad)),
                    ..Default::default()
                });
                let mut groups = groups.lock().unwrap_or_else(std::sync::PoisonError::into_inner);
                groups.add((me, tally.step_times.len()), key, &grad);
            }
            tally.step_times.push(took);
            if let Err(e) = worker.handle_gradient_with_loss(since(origin), j.id, &grad, j.loss) {
                note_refusal(&mut refusals, &mut tally, "a finished gradient", &e);
            }
            continue;
        }
        let mut wait = StdDuration::from_millis(100);
        if let Some(j) = &job {
            wait = wait.min(j.ready.saturating_duration_since(StdInstant::now()));
        }
        if let Some(at) = worker.poll_timeout() {
            wait = wait.min(until(origin, at));
        }
        match port.recv(Some(wait)) {
            Ok(packet) => deliver(&mut worker, &port, packet, &limits, origin, &mut refusals, &mut tally),
            Err(RecvError::Timeout) => worker.handle_timeout(since(origin)),
            Err(RecvError::Disconnected) => break,
        }
    }
    tally.wall_s = started.elapsed().as_secs_f64();
    tally.sent = sent.contributions;
    tally.resent = sent.resent;
    tally
}

/// Counts a refusal of the worker's state machine; the first of each kind is described in
/// the tally.
fn note_refusal(refusals: &mut Refusals, tally: &mut WorkerTally, what: &str, e: &Reject) {
    if refusals.record(e) {
        tally.first_refusals.push(format!("{what}: {e}"));
    }
    tally.refused += 1;
}

/// Hands one packet from the server to the worker; a packet that does not decode and a
/// message the worker refuses are counted as refusals.
fn deliver(
    worker: &mut AnyWorker<f32, Vec<f32>>,
    port: &WorkerPort,
    packet: Packet,
    limits: &Limits,
    origin: StdInstant,
    refusals: &mut Refusals,
    tally: &mut WorkerTally,
) {
    match wire::decode_to_worker::<f32>(&packet.bytes, limits) {
        Ok(msg) => {
            let kind = msg.kind_name();
            if let Err(e) = worker.handle(since(origin), msg) {
                note_refusal(refusals, tally, &format!("the server's {kind} message"), &e);
            }
        }
        Err(e) => {
            tally.refused += 1;
            if tally.first_refusals.len() < 16 {
                tally.first_refusals.push(format!("an undecodable message: {e}"));
            }
        }
    }
    port.recycle(packet);
}

#[cfg(test)]
mod tests {
    use super::*;
    use syncopate::proto::ssp::SspConfig;
    use syncopate::{Values, Version, WorkerId};

    fn empty_report() -> ThreadReport {
        ThreadReport::default()
    }

    /// Workers 1, 2 and 3 are found gone in one drain; the loss of worker 1, the laggard,
    /// releases the workers waiting on it (SSP queues a batch), and the losses of 2 and 3
    /// reported right after are applied too.
    #[test]
    fn several_workers_found_gone_in_one_drain_are_all_lost() {
        let n = 4;
        let protocol = ProtocolConfig::Ssp(SspConfig::new(n, 0.1, 0));
        let dim = 2;
        let mut server: AnyServer<f32, Vec<f32>, Heap> =
            AnyServer::new(&protocol, vec![0.0; dim], vec![0.0; protocol.server_scratch_len(dim)]).unwrap();
        let (port, ports) = channel::star(n as usize, 64);
        let mut side = ServerSide { port: &port, report: empty_report() };
        let origin = StdInstant::now();
        let now = since(origin);
        for w in 0..n {
            server.handle(now, WorkerId(w), ToServer::Join { epoch: 0 }).unwrap();
        }
        side.drain(&mut server, origin);
        let grad = [0.5f32, -0.5];
        for w in [0, 2, 3] {
            let clock = ToServer::Clock { clock: 1, seq: 1, values: Values::Slice(&grad), loss: None };
            server.handle(now, WorkerId(w), clock).unwrap();
            side.drain(&mut server, origin);
            let pull = ToServer::Pull { have: Version::ZERO, min_clock: 1 };
            server.handle(now, WorkerId(w), pull).unwrap();
            side.drain(&mut server, origin);
        }
        let mut ports = ports.into_iter();
        let _keep = ports.next();
        drop(ports);
        server.stop();
        side.drain(&mut server, origin);
        assert_eq!(side.report.lost, 3, "every gone worker is lost");
        assert_eq!(side.report.refused, 0);
        assert_eq!(server.stats().outputs_lost, 0);
    }
}
