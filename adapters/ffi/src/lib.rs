//! # syncopate-ffi: the C ABI of syncopate
//!
//! Opaque server and worker handles over every protocol of the core, built from one plain
//! C struct ([`SyncopateConfig`]), driven with the core's verbs (handle, handle_timeout,
//! poll_output, poll_timeout, gradient hand-in), messages in the core's wire format
//! (`core/WIRE.md`), and status codes with [`syncopate_last_error_message`] describing the
//! last failure. The header `include/syncopate.h` is generated from this crate by cbindgen.
//!
//! ## Ownership
//! The library never allocates. A handle lives in memory the caller provides: ask
//! `syncopate_server_size(config, dim)` (or `_worker_size`) and `_align`, pass a block that
//! large and aligned to `_init`, which writes the handle inside it. The model buffer
//! `params` stays the caller's memory too. Both must stay valid and untouched (the caller
//! may *read* `params` between calls) until `_fini`; then they are the caller's again.
//! Pointers an output carries (a worker's `params` to compute at) point into those buffers
//! and are valid until the next call with the same handle.
//!
//! ## Threading
//! A handle may move between threads but must not be used by two threads at once. Handles
//! are independent: different handles may be used from different threads concurrently.
//! With the `std` feature the last error is per thread; without it, one slot is shared by
//! the program (a concurrent failure may be missed, never corrupted).
//!
//! ## Safety at the boundary
//! Every entry checks its pointers for null and alignment, lengths against the model and
//! the buffers, and handles for liveness, and returns a `SYNCOPATE_ERR_*` code instead of
//! crashing. Nothing unwinds into C: the code is panic-free, and with std each entry runs
//! under `catch_unwind`. Without std (`--no-default-features`) the crate is `#![no_std]`
//! and brings its own panic handler (an abort-style loop), so firmware can link it.
//!
//! Every `unsafe` block is small and carries a SAFETY comment; the invariants come from
//! the contracts documented on each function and summarised above.
//!
//! Layering: `error`, then `raw`, then `config`, `engine` and `wire`, then `handle`, then
//! `server`, then `worker`; `event` imports nothing of this crate. No module imports one
//! after it.

#![cfg_attr(not(feature = "std"), no_std)]
#![deny(unsafe_op_in_unsafe_fn)]

mod config;
mod engine;
mod error;
mod event;
mod handle;
mod raw;
mod server;
mod wire;
mod worker;

pub use config::*;
pub use error::{
    SYNCOPATE_ERR_BAD_HANDLE, SYNCOPATE_ERR_BUFFER_TOO_SHORT, SYNCOPATE_ERR_CONFIG, SYNCOPATE_ERR_DECODE,
    SYNCOPATE_ERR_ENCODE, SYNCOPATE_ERR_INTERNAL, SYNCOPATE_ERR_MISALIGNED, SYNCOPATE_ERR_NULL_POINTER,
    SYNCOPATE_ERR_OVERLAP, SYNCOPATE_ERR_REJECTED, SYNCOPATE_ERR_WRONG_LENGTH, SYNCOPATE_OK, SyncopateStatus,
};
pub use event::*;
pub use server::*;
pub use wire::{
    SYNCOPATE_MSG_ABORT, SYNCOPATE_MSG_CLOCK, SYNCOPATE_MSG_DELTA, SYNCOPATE_MSG_GRAD, SYNCOPATE_MSG_JOIN,
    SYNCOPATE_MSG_LEAVE, SYNCOPATE_MSG_MODEL, SYNCOPATE_MSG_NOT_NEWER, SYNCOPATE_MSG_PULL, SYNCOPATE_MSG_PUSH_ACK,
    SYNCOPATE_MSG_STOP, SyncopateMessage,
};
pub use worker::*;

use core::ffi::c_char;
use core::fmt::Write as _;
use error::{Failure, Truncating, guard};

#[cfg(all(not(feature = "std"), not(test)))]
#[panic_handler]
fn panic(_: &core::panic::PanicInfo<'_>) -> ! {
    // The code is written not to panic; if it ever does on firmware, stop here.
    loop {
        core::hint::spin_loop();
    }
}

/// Fills `*out` with `protocol`'s defaults (the core's) for `workers` workers and learning
/// rate `learning_rate`; change knobs afterwards.
///
/// # Safety
/// `out` is null (an error) or writable.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn syncopate_config_default(
    out: *mut SyncopateConfig,
    protocol: u32,
    workers: u32,
    learning_rate: f64,
) -> SyncopateStatus {
    guard(|| {
        let c = SyncopateConfig::defaults(protocol, workers, learning_rate)?;
        // SAFETY: the caller's contract.
        unsafe { raw::write_out(out, c, "`out`") }
    })
}

/// The largest encoded message for a model of `dim` parameters, into `*out`: the size of
/// the buffers `*_poll_output` write into.
///
/// # Safety
/// `out` is null (an error) or writable.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn syncopate_max_message_len(dim: usize, out: *mut usize) -> SyncopateStatus {
    // SAFETY: the caller's contract.
    guard(|| unsafe { raw::write_out(out, wire::max_message_len(dim), "`out`") })
}

/// The code of the last failed call (on this thread with std), or `SYNCOPATE_OK` if none.
#[unsafe(no_mangle)]
pub extern "C" fn syncopate_last_error_code() -> SyncopateStatus {
    error::last_failure().map_or(SYNCOPATE_OK, |f| f.code)
}

/// Writes a one-line, NUL-terminated description of the last failed call into `buf`
/// (truncated to `len - 1` bytes) and returns the description's full length (like
/// `snprintf`); 0 when no call failed. `buf` may be null when `len` is 0.
///
/// # Safety
/// `buf` is writable for `len` bytes.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn syncopate_last_error_message(buf: *mut c_char, len: usize) -> usize {
    let Some(failure) = error::last_failure() else {
        // SAFETY: the caller's contract (an empty string when there is room).
        if let Ok(b) = unsafe { raw::slice_out(buf.cast::<u8>(), len, "`buf`") } {
            if let Some(first) = b.first_mut() {
                *first = 0;
            }
        }
        return 0;
    };
    let mut empty = [];
    // SAFETY: the caller's contract.
    let b = unsafe { raw::slice_out(buf.cast::<u8>(), len, "`buf`") }.unwrap_or(&mut empty);
    let mut w = Truncating { buf: b, written: 0, total: 0 };
    let _ = write!(w, "{failure}");
    let end = w.written;
    if let Some(nul) = w.buf.get_mut(end) {
        *nul = 0;
    }
    w.total
}

/// Decodes the message `bytes` (`len` bytes, either direction, tensors up to `max_elements`)
/// into `*out`; the payload fields point into `bytes`.
///
/// # Safety
/// `bytes` is readable for `len` bytes (and stays so while `out`'s payload is used); `out`
/// is writable.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn syncopate_wire_decode(
    bytes: *const u8,
    len: usize,
    max_elements: usize,
    out: *mut SyncopateMessage,
) -> SyncopateStatus {
    guard(|| {
        // SAFETY: the caller's contract.
        let bytes = unsafe { raw::slice_in(bytes, len, "`bytes`") }?;
        let msg = wire::decode(bytes, max_elements)?;
        // SAFETY: the caller's contract.
        unsafe { raw::write_out(out, msg, "`out`") }
    })
}

/// The encoded length of `*msg`, into `*out`.
///
/// # Safety
/// `msg` points at a `SyncopateMessage` whose `values` is readable for `values_len` floats;
/// `out` is writable.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn syncopate_wire_encoded_len(msg: *const SyncopateMessage, out: *mut usize) -> SyncopateStatus {
    guard(|| {
        // SAFETY: the caller's contract.
        let m = unsafe { raw::ref_in(msg, "`msg`") }?;
        // SAFETY: the caller's contract.
        let n = unsafe { wire::encoded_len(m) }?;
        // SAFETY: the caller's contract.
        unsafe { raw::write_out(out, n, "`out`") }
    })
}

/// Encodes `*msg` into `buf` (`buf_len` bytes) and stores the bytes written in `*written`.
///
/// # Safety
/// As [`syncopate_wire_encoded_len`]; `buf` is writable for `buf_len` bytes.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn syncopate_wire_encode(
    msg: *const SyncopateMessage,
    buf: *mut u8,
    buf_len: usize,
    written: *mut usize,
) -> SyncopateStatus {
    guard(|| {
        raw::checked(written.cast_const(), "`written`")?;
        // SAFETY: the caller's contract.
        let m = unsafe { raw::ref_in(msg, "`msg`") }?;
        // SAFETY: the caller's contract.
        let buf = unsafe { raw::slice_out(buf, buf_len, "`buf`") }?;
        // SAFETY: the caller's contract.
        let n = unsafe { wire::encode(m, buf) }?;
        // SAFETY: the caller's contract.
        unsafe { raw::write_out(written, n, "`written`") }
    })
}

/// Converts a little-endian payload (`payload_len` bytes, a whole number of floats) into
/// `out` (`out_len` floats, exactly `payload_len / 4`).
///
/// # Safety
/// `payload` is readable for `payload_len` bytes; `out` writable for `out_len` floats.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn syncopate_wire_payload_to_f32(
    payload: *const u8,
    payload_len: usize,
    out: *mut f32,
    out_len: usize,
) -> SyncopateStatus {
    guard(|| {
        // SAFETY: the caller's contract.
        let bytes = unsafe { raw::slice_in(payload, payload_len, "`payload`") }?;
        // SAFETY: the caller's contract.
        let out = unsafe { raw::slice_out(out, out_len, "`out`") }?;
        syncopate::Values::<f32>::LittleEndian(bytes).copy_into(out).map_err(|m| {
            Failure::new(SYNCOPATE_ERR_WRONG_LENGTH, "`out_len` must be `payload_len / 4`")
                .with(error::Detail::Lengths { given: m.actual, needed: m.expected })
        })
    })
}
