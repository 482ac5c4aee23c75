//! One session of the worker with the server: the handshake (learning the run's settings,
//! pinning them for later sessions, sending worker 0's initial model when the server takes
//! it from the worker), a fresh state machine with the epoch the server assigned, and the
//! session's writer thread around the [drive loop](super::drive).

use super::connect::{ConnectError, Opened, open};
use super::drive::{SessionEnd, SessionShape};
use super::job::{WorkerJob, WorkerOptions, WorkerReport};
use crate::tcp::core_duration;
use crate::tcp::handshake::{self, ClientSide, Role};
use crate::tcp::settings::RunSettings;
use crate::tcp::writer::{Ledger, UPLOADS_IN_FLIGHT, Upload, write_uploads};
use std::thread;
use std::time::Instant as StdInstant;
use syncopate::{AnyWorker, WorkerId, WorkerSetup};

/// A session whose handshake succeeded.
pub(super) struct Session {
    link: Opened,
    worker: AnyWorker<f32, Vec<f32>>,
    shape: SessionShape,
}

/// Connects and shakes hands; `pinned` is the digest of the settings this worker insists
/// on (set from the first session's), `prepared` whether the job has seen them.
pub(super) fn establish(
    options: &WorkerOptions,
    pinned: &mut Option<[u8; 32]>,
    prepared: &mut bool,
    report: &mut WorkerReport,
    job: &mut dyn WorkerJob,
    log: &mut dyn FnMut(&str),
) -> Result<Session, ConnectError> {
    let Opened { stream, mut reader, mut writer } =
        open(&options.addr, options.handshake_timeout, options.write_timeout, options.frame_timeout)?;
    let deadline = StdInstant::now() + options.handshake_timeout;
    let me = ClientSide {
        worker: options.id,
        role: Role::Worker,
        key: options.key.as_ref(),
        want: *pinned,
        dim: options.dim.map(|d| d as u64),
        lost_after: options.lost_after,
        wire: options.wire,
    };
    // Settings this worker cannot run are refused inside the handshake, so the server logs
    // the same reason the worker exits with.
    let job = core::cell::RefCell::new(job);
    let newly_prepared = core::cell::Cell::new(false);
    let check = |settings: &RunSettings| -> Result<(), String> {
        let refused = |e: String| format!("the server's settings ({}): {e}", settings.label());
        settings.worker_config().map_err(refused)?;
        settings.dim().map_err(refused)?;
        if !*prepared && !newly_prepared.get() {
            job.borrow_mut().prepare(settings)?;
            newly_prepared.set(true);
        }
        Ok(())
    };
    let (s, settings) = handshake::client_handshake_checked(&mut reader, &mut writer, &me, deadline, &check)
        .map_err(ConnectError::Handshake)?;
    let job = job.into_inner();
    let refused = |e: String| ConnectError::Job(format!("the server's settings ({}): {e}", settings.label()));
    let config = settings.worker_config().map_err(refused)?;
    let dim = settings.dim().map_err(refused)?;
    if newly_prepared.get() {
        *prepared = true;
        *pinned = Some(settings.digest().map_err(refused)?);
    }
    // Socket buffers that hold a whole large frame, now that the model's size is known.
    crate::tcp::frame::tune_stream(&stream, crate::tcp::session_max_len(dim)).map_err(ConnectError::io)?;
    if settings.initial_from_worker && options.id == WorkerId(0) {
        // The initial model, before anything else (see `initial`).
        let mut initial = vec![0.0f32; dim];
        job.initial_params(&mut initial).map_err(ConnectError::Job)?;
        let message = crate::tcp::initial::encode(&initial, dim)
            .map_err(|e| ConnectError::Job(format!("the initial parameters: {e}")))?;
        writer.write_frame(&message).map_err(ConnectError::io)?;
    }
    if options.shared_memory {
        // The offer comes back while the session runs (see `shm`).
        let request = crate::tcp::shm::messages::Exchange::Request.encode();
        writer.write_frame(&request).map_err(ConnectError::io)?;
    }
    report.sessions += 1;
    log(&format!(
        "worker {}: connected to {} (epoch {}, server at version {}; {})",
        options.id.0,
        options.addr,
        s.epoch,
        s.version,
        settings.label()
    ));
    let setup = WorkerSetup { id: options.id, epoch: s.epoch, rejoin_after: options.rejoin_after.map(core_duration) };
    let worker = AnyWorker::new(&config, setup, vec![0.0f32; dim], vec![0.0f32; config.worker_scratch_len(dim)])
        .map_err(|e| refused(e.to_string()))?;
    let lost_after = options.lost_after;
    let (report_step_times, beat, wire) = (settings.report_step_times, s.beat(lost_after), s.wire);
    let shape = SessionShape { dim, report_step_times, lost_after, beat, wire };
    Ok(Session { link: Opened { stream, reader, writer }, worker, shape })
}

/// Runs a session until it ends. Uploads go through a writer thread, so sending a large
/// gradient or delta overlaps the next computation (the optimized WBSP worker relies on it);
/// encoded buffers come back through a spare queue and are reused, so steady state
/// allocates nothing. The writer counts the contributions it wrote whole.
pub(super) fn run(
    session: Session,
    options: &WorkerOptions,
    report: &mut WorkerReport,
    job: &mut dyn WorkerJob,
    log: &mut dyn FnMut(&str),
) -> SessionEnd {
    let Session { link: Opened { stream, mut reader, mut writer }, mut worker, shape } = session;
    let (to_writer, frames) = crossbeam_channel::bounded::<(Vec<u8>, Upload)>(UPLOADS_IN_FLIGHT);
    let (give_back, spare) = crossbeam_channel::bounded::<Vec<u8>>(UPLOADS_IN_FLIGHT + 1);
    let ledger = Ledger::default();
    let end = thread::scope(|scope| {
        let ledger = &ledger;
        let writing = scope.spawn(move || write_uploads(&mut writer, &frames, shape.beat, ledger, &give_back));
        let uploads = super::drive::Uploads { tx: &to_writer, spare: &spare };
        let end = super::drive::drive(&mut worker, &mut reader, uploads, shape, options, report, job, log);
        drop(to_writer);
        match (writing.join(), end) {
            (Ok(Err(e)), SessionEnd::Lost(_)) => SessionEnd::Lost(e.to_string()),
            (_, end) => end,
        }
    });
    let (sent, resent) = ledger.counts();
    report.sent += sent;
    report.resent += resent;
    let _ = stream.shutdown(std::net::Shutdown::Both);
    end
}
