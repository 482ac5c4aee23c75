//! The worker's drive loop: the server's frames into the protocol's state machine, its
//! outputs to the writer thread and the job, the held gradient handed over once due, the
//! protocol's timeouts, and the server's silence judged against `lost_after` (never the
//! worker's own: time the worker itself was stopped does not count as the server's silence).

use super::job::{WorkerJob, WorkerOptions, WorkerReport, killed};
use super::step::{Held, compute, refused};
use crate::tcp::frame::{FrameError, FrameReader};
use crate::tcp::payload::FromServerKind;
use crate::tcp::shm::messages::{Exchange, SlotFrame};
use crate::tcp::shm::{Dir, Region};
use crate::tcp::writer::Upload;
use crate::tcp::{at, since};
use core::time::Duration;
use std::net::TcpStream;
use std::time::Instant as StdInstant;
use syncopate::wire::Limits;
use syncopate::{AnyWorker, ComputeId, Worker, WorkerEvent, WorkerOutput};

/// What a session's settings fix for its loop.
#[derive(Clone, Copy, Debug)]
pub(super) struct SessionShape {
    /// The model's number of parameters.
    pub dim: usize,
    /// Whether each new contribution is preceded by its steps' times
    /// ([`step_times`](crate::tcp::step_times)).
    pub report_step_times: bool,
    /// How long the server may stay silent before the session is lost.
    pub lost_after: Duration,
    /// How often this side sends a heartbeat when it has nothing else to send.
    pub beat: Duration,
    /// The tensor encoding of the session's core messages.
    pub wire: syncopate::wire::Encoding,
}

/// How a session ended.
pub(super) enum SessionEnd {
    Stopped,
    Killed,
    Lost(String),
}

/// The session's upload queue to its writer thread and the buffers it gives back.
pub(super) struct Uploads<'a> {
    /// Frames for the writer, with their ledger class.
    pub tx: &'a crossbeam_channel::Sender<(Vec<u8>, Upload)>,
    /// Encoded buffers the writer gives back.
    pub spare: &'a crossbeam_channel::Receiver<Vec<u8>>,
}

/// A computation the protocol asked for while more of the server's frames were already
/// readable: it starts only once those are handed to the protocol (which may abandon it for
/// a newer model), with the model it was asked on.
struct Deferred {
    id: ComputeId,
    version: syncopate::Version,
}

/// Drives one session until it ends: stopped by the server, killed, or lost.
#[allow(clippy::too_many_arguments)]
pub(super) fn drive(
    worker: &mut AnyWorker<f32, Vec<f32>>,
    reader: &mut FrameReader,
    uploads: Uploads<'_>,
    shape: SessionShape,
    options: &WorkerOptions,
    report: &mut WorkerReport,
    job: &mut dyn WorkerJob,
    log: &mut dyn FnMut(&str),
) -> SessionEnd {
    // The origin of the core's clock for this session.
    let origin = StdInstant::now();
    let me = options.id.0;
    let Uploads { tx: uploads, spare } = uploads;
    let limits = Limits::for_model(shape.dim);
    let (mut inbuf, mut wide, mut grad) = (Vec::new(), Vec::new(), vec![0.0f32; shape.dim]);
    // The times of the steps handed over since the last contribution (sent only when the
    // run asks for them).
    let mut steps = crate::tcp::step_times::PendingSteps::new(shape.dim);
    // Set when an upload could not be handed to the writer (the connection broke while
    // sending). The session then ends as lost, but only after reading what the server
    // already sent: a `Stop` that crossed with the upload ends it as stopped instead.
    let mut upload_failed: Option<String> = None;
    let mut held: Option<Held> = None;
    // A computation waiting for the frames already readable (see `Deferred`), and a copy of
    // the model it was asked on (the worker's buffer is overwritten by the next model).
    let mut deferred: Option<Deferred> = None;
    let mut deferred_params: Vec<f32> = Vec::new();
    // Each model the server sends, for a job that takes every round (`WorkerJob::round`).
    let mut round_params: Vec<f32> = Vec::new();
    // When the server was last heard from (a frame or a heartbeat).
    let mut heard = StdInstant::now();
    // The session's shared-memory region once mapped, and whether the server took the
    // proof (contributions then go through it).
    let mut region: Option<Region> = None;
    let mut upload_slot = false;
    loop {
        while let Some(o) = worker.poll_output() {
            match o {
                // A contribution the wire cannot carry (a delta beyond its range): the server
                // hears of values that are not finite, and ends the run as diverged.
                WorkerOutput::Send(msg) if upload_failed.is_none() && !contribution_fits(shape.wire, &msg) => {
                    let n = crate::tcp::refusal::NotFinite::Values;
                    if uploads.send((n.encode(), Upload::Other)).is_err() {
                        upload_failed = Some("the connection broke while sending".to_string());
                    }
                }
                WorkerOutput::Send(msg) if upload_failed.is_none() => {
                    let encoded = match region.as_ref().filter(|_| upload_slot) {
                        Some(r) => Upload::encode_placed(&msg, &mut report.stats, spare, r),
                        None => Upload::encode(&msg, shape.wire, &mut report.stats, spare),
                    };
                    match encoded {
                        Ok((out, class)) => {
                            let new = matches!(class, Upload::New) && shape.report_step_times;
                            if let Some(times) = new.then(|| steps.take_message()).flatten() {
                                if uploads.send((times, Upload::Other)).is_err() {
                                    upload_failed = Some("the connection broke while sending".to_string());
                                }
                            }
                            if uploads.send((out, class)).is_err() {
                                upload_failed = Some("the connection broke while sending".to_string());
                            }
                        }
                        Err(e) => return SessionEnd::Lost(e),
                    }
                }
                WorkerOutput::Send(_) => {}
                WorkerOutput::Compute { id, version, params } => {
                    // What the server sent while the job was busy (a computation the worker
                    // cannot interrupt) goes to the protocol first: when it holds a newer
                    // model the protocol abandons this computation, and the worker computes
                    // on the newest model instead of on every queued one in turn.
                    if deferred.take().is_some() {
                        report.superseded += 1;
                    }
                    if server_has_sent(reader.stream()) {
                        deferred_params.clear();
                        deferred_params.extend_from_slice(params);
                        deferred = Some(Deferred { id, version });
                        continue;
                    }
                    compute(job, report, &mut held, &mut grad, id, version, params);
                }
                WorkerOutput::Event(WorkerEvent::Abandoned { id }) => {
                    if deferred.take_if(|d| d.id == id).is_some() {
                        report.superseded += 1;
                    }
                    if let Some(h) = held.take_if(|h| h.id == id) {
                        h.abandon(report);
                    }
                }
                WorkerOutput::Event(_) => {}
            }
        }
        // A finished step is handed over at once unless something else needs the loop first:
        // frames the server sent (read before the next step, so a worker whose steps take no
        // time still sees a `Stop` or a newer model, and, at the latest with the server's next
        // heartbeat, its kill switch), a due timeout, a broken upload or a silent server. The
        // next step is only computed after that. A step finished when the kill switch was set
        // is handed over before the worker stops.
        let due = held.as_ref().is_some_and(Held::is_due);
        let look_first = || {
            upload_failed.is_some()
                || heard.elapsed() >= shape.lost_after
                || worker.poll_timeout().is_some_and(|t| at(origin, t) <= StdInstant::now())
                || server_has_sent(reader.stream())
        };
        if let Some(h) = held.take_if(|_| due && !look_first()) {
            let (id, loss) = (h.id, h.loss);
            let took = h.finish(report).as_secs_f64();
            // A gradient worker adopts the buffer itself (the two buffers trade places, and
            // `grad` then holds the model the job computed on, which nothing reads again: the
            // job writes every element of the next gradient); the others copy it.
            let now = since(origin);
            let handed = match &mut *worker {
                // A gradient the session's wire cannot carry is refused as one not finite.
                _ if !fits_wire(shape.wire, &grad) => Err(syncopate::Reject::NotFinite),
                AnyWorker::Gradient(gw) => gw.handle_gradient_in(now, id, &mut grad, loss),
                other => other.handle_gradient_with_loss(now, id, &grad, loss),
            };
            match handed {
                Ok(()) => {
                    report.steps += 1;
                    if shape.report_step_times {
                        steps.push(took);
                    }
                }
                Err(e) => {
                    refused(me, log, report, "a finished gradient", &e);
                    // Values that are not finite: the server hears of it (a round would wait
                    // for this gradient for ever) and the step is computed again on the
                    // next minibatch (the server ends a run of such steps as diverged).
                    // A job that failed poisons its gradient and sets the kill switch: the
                    // session ends with nothing more sent.
                    if let Some(n) = crate::tcp::refusal::NotFinite::of(&e).filter(|_| !killed(options)) {
                        if uploads.send((n.encode(), Upload::Other)).is_err() {
                            upload_failed = Some("the connection broke while sending".to_string());
                        }
                        let version = syncopate::Version(report.last_version.unwrap_or(0));
                        compute(job, report, &mut held, &mut grad, id, version, worker.params_buffer());
                    }
                }
            }
            continue;
        }
        if worker.is_stopped() {
            return SessionEnd::Stopped;
        }
        if killed(options) {
            return SessionEnd::Killed;
        }
        if deferred.is_some() && !server_has_sent(reader.stream()) {
            if let Some(Deferred { id, version }) = deferred.take() {
                compute(job, report, &mut held, &mut grad, id, version, &deferred_params);
            }
            continue;
        }
        let mut wake = StdInstant::now() + Duration::from_millis(100);
        if let Some(t) = worker.poll_timeout() {
            wake = wake.min(at(origin, t));
        }
        if let Some(h) = &held {
            wake = wake.min(h.ready);
        }
        if upload_failed.is_some() {
            wake = StdInstant::now() + Duration::from_millis(50);
        }
        // Never a deadline already past: after a long computation the frames the server
        // sent meanwhile are read before its silence is judged.
        wake = wake.min(heard + shape.lost_after).max(StdInstant::now() + Duration::from_millis(1));
        match reader.read_frame(&mut inbuf, Some(wake)) {
            // A heartbeat: the server is there.
            Ok(p) if FromServerKind::of(p.of(&inbuf)) == FromServerKind::Heartbeat => heard = StdInstant::now(),
            // The server refused a contribution for its loss (see `refusal`).
            Ok(p) if FromServerKind::of(p.of(&inbuf)) == FromServerKind::Refused => {
                heard = StdInstant::now();
                crate::tcp::refusal::worker_line(me, p.of(&inbuf)).iter().for_each(|l| log(l));
            }
            // The shared-memory exchange (see `shm`).
            Ok(p) if FromServerKind::of(p.of(&inbuf)) == FromServerKind::SharedMemory => {
                heard = StdInstant::now();
                match exchange(p.of(&inbuf), shape.dim, &mut region, me, log) {
                    Ok(Some(answer)) => {
                        if uploads.send((answer, Upload::Other)).is_err() {
                            upload_failed = Some("the connection broke while sending".to_string());
                        }
                    }
                    Ok(None) => upload_slot = region.is_some(),
                    Err(e) => return SessionEnd::Lost(e),
                }
            }
            Ok(p) => {
                let (bytes, slot) = match slot_message(region.as_ref(), p.of(&inbuf)) {
                    Ok(found) => found,
                    Err(e) => return SessionEnd::Lost(e),
                };
                // A slot always holds an `f32` message (see `shm`); a frame, the session's wire.
                let enc = if slot.is_some() { syncopate::wire::Encoding::F32 } else { shape.wire };
                let handled = handle_message(
                    worker,
                    (bytes, enc, &mut wide),
                    (&limits, shape.dim),
                    origin,
                    job,
                    &mut round_params,
                    report,
                    log,
                    me,
                );
                if let (Some(r), Some(k)) = (region.as_ref(), slot) {
                    r.consume(Dir::ToWorker, k);
                }
                match handled {
                    Ok(()) => heard = StdInstant::now(),
                    Err(e) => return SessionEnd::Lost(e),
                }
            }
            Err(FrameError::Idle) => {
                if let Some(e) = upload_failed.take() {
                    return SessionEnd::Lost(e);
                }
                // A wait that ends long past its deadline means this process did not run
                // (stopped, suspended): that silence is this worker's, not the server's, so
                // the server is judged afresh from now, and its frames read first.
                let asleep = StdInstant::now().saturating_duration_since(wake);
                if asleep >= shape.lost_after {
                    log(&format!(
                        "worker {me}: this worker was stopped for {:.1} s (its clock jumped past the {:.1} s \
                         silence limit between two turns of its loop); the server may have counted it as lost",
                        asleep.as_secs_f64(),
                        shape.lost_after.as_secs_f64()
                    ));
                    heard = StdInstant::now();
                } else if heard.elapsed() >= shape.lost_after {
                    return SessionEnd::Lost(format!(
                        "the server was silent for {:.1} s (no frame, no heartbeat)",
                        shape.lost_after.as_secs_f64()
                    ));
                }
            }
            Err(e) => return SessionEnd::Lost(upload_failed.take().unwrap_or_else(|| e.to_string())),
        }
        if worker.poll_timeout().is_some_and(|t| at(origin, t) <= StdInstant::now()) {
            worker.handle_timeout(since(origin));
        }
    }
}

/// A core message from the server, handed to the protocol (and to a job that takes every
/// round); `Err` when it does not decode.
#[allow(clippy::too_many_arguments)]
fn handle_message(
    worker: &mut AnyWorker<f32, Vec<f32>>,
    (bytes, enc, wide): (&[u8], syncopate::wire::Encoding, &mut Vec<u8>),
    (limits, dim): (&Limits, usize),
    origin: StdInstant,
    job: &mut dyn WorkerJob,
    round_params: &mut Vec<f32>,
    report: &mut WorkerReport,
    log: &mut dyn FnMut(&str),
    me: u32,
) -> Result<(), String> {
    let msg = crate::tcp::payload::decode_to_worker(bytes, enc, limits, wide)
        .map_err(|e| format!("server sent a bad message: {e}"))?;
    if let syncopate::msg::ToWorker::Model { version, ref values, .. } = msg {
        if job.wants_rounds() {
            round_params.resize(dim, 0.0);
            if values.copy_into(round_params).is_ok() {
                job.round(version, round_params);
            }
        }
    }
    let kind = msg.kind_name();
    if let Err(e) = worker.handle(since(origin), msg) {
        refused(me, log, report, &format!("the server's {kind} message"), &e);
    }
    Ok(())
}

/// The message a frame from the server carries: for a slot frame, the one in the worker's
/// slot (with its sequence number, to hand the slot back once read); else the payload.
fn slot_message<'a>(region: Option<&'a Region>, payload: &'a [u8]) -> Result<(&'a [u8], Option<u64>), String> {
    let Some(frame) = SlotFrame::decode(payload) else {
        return Ok((payload, None));
    };
    let region = region.ok_or("the server sent a slot frame, but this session has no shared memory")?;
    let bytes = region
        .read(Dir::ToWorker, frame.seq, frame.len as usize)
        .ok_or("the server sent a slot frame that matches no message in its slot")?;
    Ok((bytes, Some(frame.seq)))
}

/// A message of the shared-memory exchange from the server: an offer is mapped (the
/// answer is returned for the writer: the proof, or zeros when the region cannot be
/// used, which is logged); `On` returns nothing and turns the upload slot on; a refusal
/// is logged. `Err` for a message a server never sends.
fn exchange(
    payload: &[u8],
    dim: usize,
    region: &mut Option<Region>,
    me: u32,
    log: &mut dyn FnMut(&str),
) -> Result<Option<Vec<u8>>, String> {
    match Exchange::decode(payload).map_err(|e| format!("the server sent {e}"))? {
        Exchange::Offer { size, path } if region.is_none() => {
            let mapped = if size == crate::tcp::shm::region_len(dim) as u64 {
                Region::open(std::path::Path::new(path), dim)
            } else {
                Err(format!("the offered region has {size} bytes, not {}", crate::tcp::shm::region_len(dim)))
            };
            let proof = match mapped {
                Ok(r) => {
                    let proof = r.proof();
                    *region = Some(r);
                    proof
                }
                Err(e) => {
                    log(&format!("worker {me}: cannot use the server's shared memory ({e}): the session stays on TCP"));
                    [0; 32]
                }
            };
            Ok(Some(Exchange::Answer(proof).encode()))
        }
        Exchange::On if region.is_some() => Ok(None),
        Exchange::Declined(reason) => {
            log(&format!(
                "worker {me}: no shared memory ({}): the session stays on TCP",
                crate::tcp::handshake::PeerText(reason)
            ));
            Ok(None)
        }
        _ => Err("the server sent a shared-memory message out of turn".into()),
    }
}

/// Whether a contribution's values stay finite in the session's wire (any other message:
/// yes).
fn contribution_fits(wire: syncopate::wire::Encoding, msg: &syncopate::ToServer<'_, f32>) -> bool {
    use syncopate::ToServer::{Clock, Delta, Grad};
    let (Grad { values, .. } | Delta { values, .. } | Clock { values, .. }) = msg else {
        return true;
    };
    let mut all = (0..values.len()).filter_map(|i| values.get(i));
    wire == syncopate::wire::Encoding::F32 || wire.first_not_carried(&mut all).is_none()
}

/// Whether the server sent bytes not read yet (or closed the connection, or the socket has
/// an error for the reader to report), without blocking and without switching the socket to
/// non-blocking mode, which its clone in the writer thread shares.
#[cfg(unix)]
fn server_has_sent(stream: &TcpStream) -> bool {
    let mut byte = [core::mem::MaybeUninit::<u8>::uninit()];
    match socket2::SockRef::from(stream).recv_with_flags(&mut byte, libc::MSG_PEEK | libc::MSG_DONTWAIT) {
        Ok(_) => true,
        Err(e) => !matches!(e.kind(), std::io::ErrorKind::WouldBlock | std::io::ErrorKind::Interrupted),
    }
}

/// Without a non-blocking peek, the loop reads (a short wait) between every two steps.
#[cfg(not(unix))]
fn server_has_sent(_: &TcpStream) -> bool {
    true
}

/// Whether a gradient stays finite in the session's wire (always, for `f32`: the protocol
/// checks finiteness itself).
pub(crate) fn fits_wire(wire: syncopate::wire::Encoding, grad: &[f32]) -> bool {
    wire == syncopate::wire::Encoding::F32 || wire.carries(grad)
}
