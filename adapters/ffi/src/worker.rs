//! The worker handle and its entry points.

use crate::config::SyncopateConfig;
use crate::engine::{self, WorkerMachine};
use crate::error::{Failure, SyncopateStatus, guard};
use crate::event::SyncopateEvent;
use crate::handle::{self, Tagged};
use crate::raw;
use crate::server::{SYNCOPATE_OUTPUT_COMPUTE, SYNCOPATE_OUTPUT_EVENT, SYNCOPATE_OUTPUT_SEND};
use crate::wire;
use core::ffi::c_void;
use syncopate::{ComputeId, Duration, Instant, Worker, WorkerId, WorkerOutput, WorkerSetup};

/// An opaque worker: lives in memory the caller provides (see [`syncopate_worker_size`]).
// `repr(C)` so the liveness tag is the first field, where `handle::get` reads it first.
#[repr(C)]
pub struct SyncopateWorker {
    tag: u64,
    dim: usize,
    owned: handle::Owned,
    machine: WorkerMachine,
}

/// What a worker has counted.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default)]
pub struct SyncopateWorkerStats {
    /// Outputs that found the worker's output queue full: zero by construction, a nonzero
    /// count is a bug reported here instead of lost silently.
    pub outputs_lost: u64,
}

impl Tagged for SyncopateWorker {
    const LIVE: u64 = 0x5359_4e43_574f_524b; // "SYNCWORK"
}

/// Who a worker is.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default)]
pub struct SyncopateWorkerSetup {
    /// The worker's id, in `0..workers`.
    pub id: u32,
    /// Its session epoch (increase it on every restart of the same id).
    pub epoch: u32,
    /// Re-send `Join` after waiting this long for the server (ns); 0 never.
    pub rejoin_after_ns: u64,
}

/// One output of a worker.
#[repr(C)]
#[derive(Clone, Copy, Debug)]
pub struct SyncopateWorkerOutput {
    /// `SYNCOPATE_OUTPUT_NONE`, `_SEND`, `_COMPUTE` or `_EVENT`.
    pub kind: u32,
    /// SEND: bytes of the encoded message (for the server) written to the caller's buffer.
    pub message_len: usize,
    /// COMPUTE: the job's token, to pass back with the gradient.
    pub compute_id: u64,
    /// COMPUTE: the model version `params` belongs to.
    pub version: u64,
    /// COMPUTE: the parameters to compute the gradient at (inside the worker's buffers;
    /// valid until the next call with this handle).
    pub params: *const f32,
    /// COMPUTE: elements in `params` (the model's dimension).
    pub params_len: usize,
    /// EVENT: the event.
    pub event: SyncopateEvent,
}

impl Default for SyncopateWorkerOutput {
    fn default() -> Self {
        Self {
            kind: 0,
            message_len: 0,
            compute_id: 0,
            version: 0,
            params: core::ptr::null(),
            params_len: 0,
            event: SyncopateEvent::default(),
        }
    }
}

/// Bytes of memory a worker for `config` and a model of `dim` parameters needs, into `*out`.
///
/// # Safety
/// `config` points at a `SyncopateConfig`; `out` is writable. Either may be null (an error).
#[unsafe(no_mangle)]
pub unsafe extern "C" fn syncopate_worker_size(
    config: *const SyncopateConfig,
    dim: usize,
    out: *mut usize,
) -> SyncopateStatus {
    guard(|| {
        // SAFETY: the caller's contract.
        let c = unsafe { handle::protocol(config) }?;
        let l = engine::worker_layout::<SyncopateWorker>(&c, dim)
            .ok_or(Failure::new(crate::error::SYNCOPATE_ERR_CONFIG, "the model is too large to address"))?;
        // SAFETY: the caller's contract.
        unsafe { raw::write_out(out, l.bytes, "`out`") }
    })
}

/// The alignment (bytes) the memory of a worker handle needs.
#[unsafe(no_mangle)]
pub extern "C" fn syncopate_worker_align() -> usize {
    align_of::<SyncopateWorker>()
}

/// Builds a worker in `mem` (`mem_len` bytes, at least [`syncopate_worker_size`], aligned to
/// [`syncopate_worker_align`]) holding its copy of the model in `params` (`dim` floats), and
/// stores the handle in `*out`. Its first output is the `Join` to send.
///
/// # Safety
/// As [`syncopate_server_init`](crate::syncopate_server_init); `setup` points at a
/// `SyncopateWorkerSetup`.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn syncopate_worker_init(
    mem: *mut c_void,
    mem_len: usize,
    config: *const SyncopateConfig,
    setup: *const SyncopateWorkerSetup,
    params: *mut f32,
    dim: usize,
    out: *mut *mut SyncopateWorker,
) -> SyncopateStatus {
    guard(|| {
        raw::checked(out.cast_const(), "`out`")?;
        // SAFETY: the caller's contract.
        let c = unsafe { handle::protocol(config) }?;
        // SAFETY: the caller's contract.
        let setup = unsafe { raw::ref_in(setup, "`setup`") }?;
        let setup = WorkerSetup {
            id: WorkerId(setup.id),
            epoch: setup.epoch,
            rejoin_after: (setup.rejoin_after_ns != 0).then(|| Duration::from_nanos(setup.rejoin_after_ns)),
        };
        // SAFETY: the caller's contract.
        let params = unsafe { handle::params(params, dim) }?;
        let (base, l) =
            handle::block::<SyncopateWorker>(mem, mem_len, engine::worker_layout::<SyncopateWorker>(&c, dim), &params)?;
        let owned = handle::Owned::new(&params, base, l.bytes);
        // SAFETY: `block` checked the memory; the caller lends it until `fini`.
        let machine = unsafe { engine::new_worker(&c, setup, params, base, &l) }
            .map_err(|e| Failure::config("the core refused the configuration", e))?;
        // SAFETY: `base` was checked by `block` for this type; `out` was checked above.
        unsafe { handle::place(base, SyncopateWorker { tag: SyncopateWorker::LIVE, dim, owned, machine }, out) }
    })
}

fn with_worker(
    w: *mut SyncopateWorker,
    f: impl FnOnce(&mut SyncopateWorker) -> Result<(), Failure>,
) -> SyncopateStatus {
    guard(|| {
        // SAFETY: every entry taking a handle requires it to come from `syncopate_worker_init`
        // and not be used by two threads at once (the header's threading rule).
        let worker = unsafe { handle::get(w, "`worker`") }?;
        f(worker)
    })
}

/// Feeds the encoded message `bytes` (`len` bytes) the server sent, at `now_ns`.
///
/// # Safety
/// `worker` comes from [`syncopate_worker_init`]; `bytes` is readable for `len` bytes.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn syncopate_worker_handle(
    worker: *mut SyncopateWorker,
    now_ns: u64,
    bytes: *const u8,
    len: usize,
) -> SyncopateStatus {
    with_worker(worker, |w| {
        // SAFETY: the caller's contract.
        let bytes = unsafe { raw::slice_in(bytes, len, "`bytes`") }?;
        let msg = wire::decode_to_worker(bytes, w.dim)?;
        w.machine.handle(Instant::from_nanos(now_ns), msg).map_err(Failure::rejected)
    })
}

/// Hands in the gradient (`len` floats, the model's dimension) of computation `compute_id`.
/// A `grad` that overlaps the worker's model or memory (such as the COMPUTE output's
/// `params`) is refused with `SYNCOPATE_ERR_OVERLAP`: copy the gradient out first.
///
/// # Safety
/// `worker` comes from [`syncopate_worker_init`]; `grad` is readable for `len` floats.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn syncopate_worker_handle_gradient(
    worker: *mut SyncopateWorker,
    now_ns: u64,
    compute_id: u64,
    grad: *const f32,
    len: usize,
) -> SyncopateStatus {
    with_worker(worker, |w| {
        // SAFETY: the caller's contract.
        let grad = unsafe { gradient_in(w, grad, len) }?;
        w.machine.handle_gradient(Instant::from_nanos(now_ns), ComputeId(compute_id), grad).map_err(Failure::rejected)
    })
}

/// [`syncopate_worker_handle_gradient`] with the minibatch loss the gradient was computed
/// with: sent to the server with the gradient (the server reports the mean of the losses
/// of each update). A NaN or infinite `loss` is refused (`SYNCOPATE_ERR_REJECTED`), nothing
/// changed; a `grad` that overlaps the worker's model or memory is refused with
/// `SYNCOPATE_ERR_OVERLAP`, as there.
///
/// # Safety
/// `worker` comes from [`syncopate_worker_init`]; `grad` is readable for `len` floats.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn syncopate_worker_handle_gradient_loss(
    worker: *mut SyncopateWorker,
    now_ns: u64,
    compute_id: u64,
    grad: *const f32,
    len: usize,
    loss: f32,
) -> SyncopateStatus {
    with_worker(worker, |w| {
        // SAFETY: the caller's contract.
        let grad = unsafe { gradient_in(w, grad, len) }?;
        let now = Instant::from_nanos(now_ns);
        w.machine.handle_gradient_with_loss(now, ComputeId(compute_id), grad, Some(loss)).map_err(Failure::rejected)
    })
}

/// The caller's gradient as a slice of the model's length, refused if it overlaps the
/// worker's own buffers: a `grad` inside them (the COMPUTE output's `params`, say) would be
/// read while the worker writes them. The check comes before the slice is made.
///
/// # Safety
/// `grad` is readable for `len` floats (the entry points' contract).
unsafe fn gradient_in<'a>(w: &SyncopateWorker, grad: *const f32, len: usize) -> Result<&'a [f32], Failure> {
    w.owned.check(handle::span(grad, len), "`grad` overlaps the worker's model or memory")?;
    // SAFETY: the caller's contract; it overlaps nothing the worker writes (checked).
    let grad = unsafe { raw::slice_in(grad, len, "`grad`") }?;
    if grad.len() != w.dim {
        return Err(Failure::new(crate::error::SYNCOPATE_ERR_WRONG_LENGTH, "`len` must be the model's dimension")
            .with(crate::error::Detail::Lengths { given: grad.len(), needed: w.dim }));
    }
    Ok(grad)
}

/// The deadline from [`syncopate_worker_poll_timeout`] has passed: it is `now_ns`.
///
/// # Safety
/// `worker` comes from [`syncopate_worker_init`].
#[unsafe(no_mangle)]
pub unsafe extern "C" fn syncopate_worker_handle_timeout(worker: *mut SyncopateWorker, now_ns: u64) -> SyncopateStatus {
    with_worker(worker, |w| {
        w.machine.handle_timeout(Instant::from_nanos(now_ns));
        Ok(())
    })
}

/// Takes the next output into `*out`; a message for the server is encoded into `buf`, which
/// must hold [`syncopate_max_message_len`](crate::syncopate_max_message_len) bytes (checked
/// before anything is taken). Call until `out->kind` is `SYNCOPATE_OUTPUT_NONE`. A `buf`
/// that overlaps the worker's model or memory is refused with `SYNCOPATE_ERR_OVERLAP`.
///
/// # Safety
/// `worker` comes from [`syncopate_worker_init`]; `out` is writable; `buf` writable for
/// `buf_len` bytes.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn syncopate_worker_poll_output(
    worker: *mut SyncopateWorker,
    out: *mut SyncopateWorkerOutput,
    buf: *mut u8,
    buf_len: usize,
) -> SyncopateStatus {
    with_worker(worker, |w| {
        raw::checked(out.cast_const(), "`out`")?;
        w.owned.check(handle::span(buf.cast_const(), buf_len), "`buf` overlaps the worker's model or memory")?;
        // SAFETY: the caller's contract; it overlaps nothing the worker reads (checked).
        let buf = unsafe { raw::slice_out(buf, buf_len, "`buf`") }?;
        let needed = wire::max_message_len(w.dim);
        if buf.len() < needed {
            return Err(Failure::short("`buf_len` (see syncopate_max_message_len)", buf.len(), needed));
        }
        let none = SyncopateWorkerOutput::default();
        let result = match w.machine.poll_output() {
            None => none,
            Some(WorkerOutput::Event(e)) => {
                SyncopateWorkerOutput { kind: SYNCOPATE_OUTPUT_EVENT, event: e.into(), ..none }
            }
            Some(WorkerOutput::Send(msg)) => {
                let message_len = wire::encode_to_server(&msg, buf)?;
                SyncopateWorkerOutput { kind: SYNCOPATE_OUTPUT_SEND, message_len, ..none }
            }
            Some(WorkerOutput::Compute { id, version, params }) => SyncopateWorkerOutput {
                kind: SYNCOPATE_OUTPUT_COMPUTE,
                compute_id: id.0,
                version: version.0,
                params: params.as_ptr(),
                params_len: params.len(),
                ..none
            },
        };
        // SAFETY: checked above; writable per the contract.
        unsafe { raw::write_out(out, result, "`out`") }
    })
}

/// The next deadline: `*has_deadline` is 1 and `*at_ns` the instant, or `*has_deadline` is 0.
///
/// # Safety
/// `worker` comes from [`syncopate_worker_init`]; both outputs are writable.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn syncopate_worker_poll_timeout(
    worker: *mut SyncopateWorker,
    has_deadline: *mut u32,
    at_ns: *mut u64,
) -> SyncopateStatus {
    with_worker(worker, |w| {
        raw::checked(has_deadline.cast_const(), "`has_deadline`")?;
        raw::checked(at_ns.cast_const(), "`at_ns`")?;
        let t = w.machine.poll_timeout();
        // SAFETY: both checked above and writable per the contract.
        unsafe {
            raw::write_out(has_deadline, u32::from(t.is_some()), "`has_deadline`")?;
            raw::write_out(at_ns, t.map_or(0, Instant::as_nanos), "`at_ns`")
        }
    })
}

/// `*stopped` is 1 once the server has said training is over, else 0.
///
/// # Safety
/// `worker` comes from [`syncopate_worker_init`]; `stopped` is writable.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn syncopate_worker_is_stopped(
    worker: *mut SyncopateWorker,
    stopped: *mut u32,
) -> SyncopateStatus {
    with_worker(worker, |w| {
        // SAFETY: the caller's contract.
        unsafe { raw::write_out(stopped, u32::from(w.machine.is_stopped()), "`stopped`") }
    })
}

/// The worker's counters, into `*out`.
///
/// # Safety
/// `worker` comes from [`syncopate_worker_init`]; `out` is writable.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn syncopate_worker_stats(
    worker: *mut SyncopateWorker,
    out: *mut SyncopateWorkerStats,
) -> SyncopateStatus {
    with_worker(worker, |w| {
        let stats = SyncopateWorkerStats { outputs_lost: w.machine.outputs_lost() };
        // SAFETY: the caller's contract.
        unsafe { raw::write_out(out, stats, "`out`") }
    })
}

/// Finishes the handle: later calls with it return `SYNCOPATE_ERR_BAD_HANDLE`, and `mem` and
/// `params` are the caller's again.
///
/// # Safety
/// `worker` comes from [`syncopate_worker_init`].
#[unsafe(no_mangle)]
pub unsafe extern "C" fn syncopate_worker_fini(worker: *mut SyncopateWorker) -> SyncopateStatus {
    with_worker(worker, |w| {
        w.tag = 0;
        Ok(())
    })
}
