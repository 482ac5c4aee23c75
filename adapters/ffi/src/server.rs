//! The server handle and its entry points.

use crate::config::SyncopateConfig;
use crate::engine::{self, ServerMachine};
use crate::error::{Failure, SyncopateStatus, guard};
use crate::event::SyncopateEvent;
use crate::handle::{self, Tagged};
use crate::raw;
use crate::wire;
use core::ffi::c_void;
use syncopate::{Instant, Recipient, Server, ServerOutput, Version, WorkerId};

/// An opaque server: lives in memory the caller provides (see [`syncopate_server_size`]).
// `repr(C)` so the liveness tag is the first field, where `handle::get` reads it first.
#[repr(C)]
pub struct SyncopateServer {
    tag: u64,
    dim: usize,
    owned: handle::Owned,
    machine: ServerMachine,
}

impl Tagged for SyncopateServer {
    const LIVE: u64 = 0x5359_4e43_5345_5256; // "SYNCSERV"
}

/// No output is pending.
pub const SYNCOPATE_OUTPUT_NONE: u32 = 0;
/// Send the encoded message in the caller's buffer (`message_len` bytes).
pub const SYNCOPATE_OUTPUT_SEND: u32 = 1;
/// Something happened: see `event`.
pub const SYNCOPATE_OUTPUT_EVENT: u32 = 2;
/// (Workers) compute a gradient at `params` and hand it in with `compute_id`.
pub const SYNCOPATE_OUTPUT_COMPUTE: u32 = 3;
/// (Servers with an upstream) send the encoded worker-to-server message in the caller's
/// buffer (`message_len` bytes) to the server above. Servers made by
/// `syncopate_server_init` have none and never output it.
pub const SYNCOPATE_OUTPUT_UPSTREAM: u32 = 4;

/// One output of a server.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default)]
pub struct SyncopateServerOutput {
    /// `SYNCOPATE_OUTPUT_NONE`, `_SEND`, `_EVENT` or `_UPSTREAM`.
    pub kind: u32,
    /// SEND: 1 when the message goes to every connected worker.
    pub to_all: u32,
    /// SEND with `to_all == 0`: the recipient's id.
    pub to_worker: u32,
    /// SEND, UPSTREAM: bytes of the encoded message written to the caller's buffer.
    pub message_len: usize,
    /// EVENT: the event.
    pub event: SyncopateEvent,
}

/// What a server has counted.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default)]
pub struct SyncopateServerStats {
    /// Contributions accepted for processing.
    pub accepted: u64,
    /// Contributions applied to the model.
    pub applied: u64,
    /// Contributions dropped, by `SYNCOPATE_DROP_*` reason.
    pub dropped: [u64; 5],
    /// Inputs refused.
    pub rejected: u64,
    /// Model updates.
    pub updates: u64,
    /// The model version.
    pub version: u64,
    /// Outputs that found the server's output queue full: zero by construction, a nonzero
    /// count is a bug reported here instead of lost silently.
    pub outputs_lost: u64,
}

/// Bytes of memory a server for `config` and a model of `dim` parameters needs, into `*out`.
///
/// # Safety
/// `config` points at a `SyncopateConfig`; `out` is writable. Either may be null (an error).
#[unsafe(no_mangle)]
pub unsafe extern "C" fn syncopate_server_size(
    config: *const SyncopateConfig,
    dim: usize,
    out: *mut usize,
) -> SyncopateStatus {
    guard(|| {
        // SAFETY: the caller's contract.
        let (c, momentum) = unsafe { handle::server_config(config) }?;
        let l = engine::server_layout::<SyncopateServer>(&c, dim, momentum)
            .ok_or(Failure::new(crate::error::SYNCOPATE_ERR_CONFIG, "the model is too large to address"))?;
        // SAFETY: the caller's contract.
        unsafe { raw::write_out(out, l.bytes, "`out`") }
    })
}

/// The alignment (bytes) the memory of a server handle needs.
#[unsafe(no_mangle)]
pub extern "C" fn syncopate_server_align() -> usize {
    align_of::<SyncopateServer>()
}

/// Builds a server in `mem` (`mem_len` bytes, at least [`syncopate_server_size`], aligned to
/// [`syncopate_server_align`]) starting from the model in `params` (`dim` floats) at version
/// 0, and stores the handle (an address inside `mem`) in `*out`.
///
/// # Safety
/// `mem` and `params` stay valid, and are neither read nor written by anything but this
/// library, until [`syncopate_server_fini`]; `params` may be read between calls. `config`
/// points at a `SyncopateConfig`; `out` is writable. Null pointers are reported as errors.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn syncopate_server_init(
    mem: *mut c_void,
    mem_len: usize,
    config: *const SyncopateConfig,
    params: *mut f32,
    dim: usize,
    out: *mut *mut SyncopateServer,
) -> SyncopateStatus {
    guard(|| {
        raw::checked(out.cast_const(), "`out`")?;
        // SAFETY: the caller's contract.
        let (c, momentum) = unsafe { handle::server_config(config) }?;
        // SAFETY: the caller's contract.
        let params = unsafe { handle::params(params, dim) }?;
        let layout = engine::server_layout::<SyncopateServer>(&c, dim, momentum);
        let (base, l) = handle::block::<SyncopateServer>(mem, mem_len, layout, &params)?;
        let owned = handle::Owned::new(&params, base, l.bytes);
        // SAFETY: `block` checked the memory; the caller lends it until `fini`.
        let machine = unsafe { engine::new_server(&c, momentum, params, base, &l) }
            .map_err(|e| Failure::config("the core refused the configuration", e))?;
        // SAFETY: `base` was checked by `block` for this type; `out` was checked above.
        unsafe { handle::place(base, SyncopateServer { tag: SyncopateServer::LIVE, dim, owned, machine }, out) }
    })
}

/// Runs `f` on the live server behind `s`.
fn with_server(
    s: *mut SyncopateServer,
    f: impl FnOnce(&mut SyncopateServer) -> Result<(), Failure>,
) -> SyncopateStatus {
    guard(|| {
        // SAFETY: every entry taking a handle requires it to come from `syncopate_server_init`
        // and not be used by two threads at once (the header's threading rule).
        let server = unsafe { handle::get(s, "`server`") }?;
        f(server)
    })
}

/// Feeds the encoded message `bytes` (`len` bytes) that worker `from` sent, at `now_ns`.
///
/// # Safety
/// `server` comes from [`syncopate_server_init`]; `bytes` is readable for `len` bytes.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn syncopate_server_handle(
    server: *mut SyncopateServer,
    now_ns: u64,
    from: u32,
    bytes: *const u8,
    len: usize,
) -> SyncopateStatus {
    with_server(server, |s| {
        // SAFETY: the caller's contract.
        let bytes = unsafe { raw::slice_in(bytes, len, "`bytes`") }?;
        let msg = wire::decode_to_server(bytes, s.dim)?;
        s.machine.handle(Instant::from_nanos(now_ns), WorkerId(from), msg).map_err(Failure::rejected)
    })
}

/// Tells the server that the transport lost worker `worker` at `now_ns`.
///
/// # Safety
/// `server` comes from [`syncopate_server_init`].
#[unsafe(no_mangle)]
pub unsafe extern "C" fn syncopate_server_handle_worker_lost(
    server: *mut SyncopateServer,
    now_ns: u64,
    worker: u32,
) -> SyncopateStatus {
    with_server(server, |s| {
        s.machine.handle_worker_lost(Instant::from_nanos(now_ns), WorkerId(worker)).map_err(Failure::rejected)
    })
}

/// The deadline from [`syncopate_server_poll_timeout`] has passed: it is `now_ns`.
///
/// # Safety
/// `server` comes from [`syncopate_server_init`].
#[unsafe(no_mangle)]
pub unsafe extern "C" fn syncopate_server_handle_timeout(server: *mut SyncopateServer, now_ns: u64) -> SyncopateStatus {
    with_server(server, |s| {
        s.machine.handle_timeout(Instant::from_nanos(now_ns));
        Ok(())
    })
}

/// Takes the next output into `*out`. A message is encoded into `buf`, which must hold
/// [`syncopate_max_message_len`](crate::syncopate_max_message_len) bytes (checked before anything is taken, so a short buffer
/// loses nothing). Call until `out->kind` is `SYNCOPATE_OUTPUT_NONE`.
///
/// # Safety
/// `server` comes from [`syncopate_server_init`]; `out` is writable; `buf` writable for
/// `buf_len` bytes, overlapping neither the model nor the handle's memory (refused with
/// `SYNCOPATE_ERR_OVERLAP`).
#[unsafe(no_mangle)]
pub unsafe extern "C" fn syncopate_server_poll_output(
    server: *mut SyncopateServer,
    out: *mut SyncopateServerOutput,
    buf: *mut u8,
    buf_len: usize,
) -> SyncopateStatus {
    with_server(server, |s| {
        raw::checked(out.cast_const(), "`out`")?;
        // SAFETY: the caller's contract.
        s.owned.check(handle::span(buf.cast_const(), buf_len), "`buf` overlaps the server's model or memory")?;
        // SAFETY: the caller's contract; it overlaps nothing the server reads (checked).
        let buf = unsafe { raw::slice_out(buf, buf_len, "`buf`") }?;
        let needed = wire::max_message_len(s.dim);
        if buf.len() < needed {
            return Err(Failure::short("`buf_len` (see syncopate_max_message_len)", buf.len(), needed));
        }
        let result = match s.machine.poll_output() {
            None => SyncopateServerOutput::default(),
            Some(ServerOutput::Event(e)) => {
                SyncopateServerOutput { kind: SYNCOPATE_OUTPUT_EVENT, event: e.into(), ..Default::default() }
            }
            Some(ServerOutput::Send { to, msg }) => {
                let message_len = wire::encode_to_worker(&msg, buf)?;
                let (to_all, to_worker) = match to {
                    Recipient::AllWorkers => (1, 0),
                    Recipient::Worker(w) => (0, w.0),
                };
                SyncopateServerOutput {
                    kind: SYNCOPATE_OUTPUT_SEND,
                    to_all,
                    to_worker,
                    message_len,
                    ..Default::default()
                }
            }
            Some(ServerOutput::Upstream(msg)) => {
                let message_len = wire::encode_to_server(&msg, buf)?;
                SyncopateServerOutput { kind: SYNCOPATE_OUTPUT_UPSTREAM, message_len, ..Default::default() }
            }
        };
        // SAFETY: checked above; writable per the contract.
        unsafe { raw::write_out(out, result, "`out`") }
    })
}

/// The next deadline: `*has_deadline` is 1 and `*at_ns` the instant, or `*has_deadline` is 0.
///
/// # Safety
/// `server` comes from [`syncopate_server_init`]; both outputs are writable.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn syncopate_server_poll_timeout(
    server: *mut SyncopateServer,
    has_deadline: *mut u32,
    at_ns: *mut u64,
) -> SyncopateStatus {
    with_server(server, |s| {
        raw::checked(has_deadline.cast_const(), "`has_deadline`")?;
        raw::checked(at_ns.cast_const(), "`at_ns`")?;
        let t = s.machine.poll_timeout();
        // SAFETY: both checked above and writable per the contract.
        unsafe {
            raw::write_out(has_deadline, u32::from(t.is_some()), "`has_deadline`")?;
            raw::write_out(at_ns, t.map_or(0, Instant::as_nanos), "`at_ns`")
        }
    })
}

/// Ends training: the server tells every worker to stop and takes no more input.
///
/// # Safety
/// `server` comes from [`syncopate_server_init`].
#[unsafe(no_mangle)]
pub unsafe extern "C" fn syncopate_server_stop(server: *mut SyncopateServer) -> SyncopateStatus {
    with_server(server, |s| {
        s.machine.stop();
        Ok(())
    })
}

/// The server's counters and model version.
///
/// # Safety
/// `server` comes from [`syncopate_server_init`]; `out` is writable.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn syncopate_server_stats(
    server: *mut SyncopateServer,
    out: *mut SyncopateServerStats,
) -> SyncopateStatus {
    with_server(server, |s| {
        let st = s.machine.stats();
        let Version(version) = s.machine.version();
        let stats = SyncopateServerStats {
            accepted: st.accepted,
            applied: st.applied,
            dropped: st.dropped,
            rejected: st.rejected,
            updates: st.updates,
            version,
            outputs_lost: st.outputs_lost,
        };
        // SAFETY: the caller's contract.
        unsafe { raw::write_out(out, stats, "`out`") }
    })
}

/// Finishes the handle: later calls with it return `SYNCOPATE_ERR_BAD_HANDLE`, and `mem` and
/// `params` are the caller's again. Nothing to free: the library never allocates.
///
/// # Safety
/// `server` comes from [`syncopate_server_init`].
#[unsafe(no_mangle)]
pub unsafe extern "C" fn syncopate_server_fini(server: *mut SyncopateServer) -> SyncopateStatus {
    with_server(server, |s| {
        s.tag = 0;
        Ok(())
    })
}
