//! The one place that knows how the core's [`AnyServer`] / [`AnyWorker`] are built and how
//! much memory they need: a handle is laid out in the caller's memory as the handle struct
//! followed by the state machine's scratch `f32` storage. When the core's storage changes
//! (e.g. caller-sized per-worker tables), only this module changes.

use crate::raw::RawSlice;
use core::ptr::NonNull;
use syncopate::{AnyServer, AnyWorker, ConfigError, ProtocolConfig, WorkerSetup};

/// A server over caller-owned buffers.
pub(crate) type ServerMachine = AnyServer<f32, RawSlice>;
/// A worker over caller-owned buffers.
pub(crate) type WorkerMachine = AnyWorker<f32, RawSlice>;

/// Where the parts of a handle go in the caller's memory block.
#[derive(Clone, Copy, Debug)]
pub(crate) struct Layout {
    /// Bytes the whole block needs.
    pub(crate) bytes: usize,
    /// Offset of the first scratch element (after the handle struct, `f32`-aligned).
    pub(crate) scratch_offset: usize,
    /// Scratch elements: the protocol's scratch, then the momentum buffer (a server with
    /// momentum), then the spare accumulator (server).
    pub(crate) scratch_len: usize,
    /// Of which the momentum buffer (before the spare accumulator): the model's length, or 0.
    pub(crate) momentum_len: usize,
    /// Of which the spare accumulator (at the end).
    pub(crate) spare_len: usize,
}

fn layout(handle_size: usize, scratch_len: usize, momentum_len: usize, spare_len: usize) -> Option<Layout> {
    let scratch_offset = handle_size.checked_next_multiple_of(align_of::<f32>())?;
    let total = scratch_len.checked_add(momentum_len)?.checked_add(spare_len)?;
    let bytes = total.checked_mul(size_of::<f32>())?.checked_add(scratch_offset)?;
    Some(Layout { bytes, scratch_offset, scratch_len: total, momentum_len, spare_len })
}

/// The memory a server handle of type `H` needs for `config`, a model of `dim`, and SGD with
/// momentum `momentum` (any value but 0 reserves the buffer; the core checks the range).
pub(crate) fn server_layout<H>(config: &ProtocolConfig, dim: usize, momentum: f64) -> Option<Layout> {
    let momentum_len = if momentum == 0.0 { 0 } else { dim };
    layout(size_of::<H>(), config.server_scratch_len(dim), momentum_len, config.spare_accumulator_len(dim))
}

/// The memory a worker handle of type `H` needs for `config` and a model of `dim`.
pub(crate) fn worker_layout<H>(config: &ProtocolConfig, dim: usize) -> Option<Layout> {
    layout(size_of::<H>(), config.worker_scratch_len(dim), 0, 0)
}

/// Splits the scratch area of a block at `base` laid out by `l` into (scratch, momentum,
/// spare).
///
/// # Safety
/// `base` is valid for writes of `l.bytes` bytes, aligned for the handle, and the scratch
/// area is used by nothing else while the returned slices live.
unsafe fn scratch(base: NonNull<u8>, l: &Layout) -> (RawSlice, RawSlice, RawSlice) {
    let main = l.scratch_len - l.momentum_len - l.spare_len;
    // SAFETY: `scratch_offset + scratch_len * 4 == bytes` is inside the block; the offset is a
    // multiple of 4 from a base aligned at least as much as `f32`.
    let first = unsafe { base.add(l.scratch_offset) }.cast::<f32>();
    // SAFETY: zero the scratch so every element is initialised before it is read.
    unsafe { first.as_ptr().write_bytes(0, l.scratch_len) };
    // SAFETY: `main + momentum_len <= scratch_len`, so both areas start inside (or at the end
    // of) the block.
    let (momentum, spare) = unsafe { (first.add(main), first.add(main + l.momentum_len)) };
    let part = |start: NonNull<f32>, len: usize| {
        // SAFETY: disjoint parts of the zeroed scratch area, exclusively the handle's (contract).
        if len == 0 { RawSlice::empty() } else { unsafe { RawSlice::new(start, len) } }
    };
    (part(first, main), part(momentum, l.momentum_len), part(spare, l.spare_len))
}

/// Builds a server on `params`, with its scratch (and momentum buffer, when `momentum` is
/// not 0) in the block at `base`.
///
/// # Safety
/// As [`scratch`].
pub(crate) unsafe fn new_server(
    config: &ProtocolConfig,
    momentum: f64,
    params: RawSlice,
    base: NonNull<u8>,
    l: &Layout,
) -> Result<ServerMachine, ConfigError> {
    // SAFETY: forwarded.
    let (scratch, prev, spare) = unsafe { scratch(base, l) };
    let mut server = AnyServer::new(config, params, scratch)?;
    if l.spare_len != 0 {
        server = server.with_spare_accumulator(spare)?;
    }
    if l.momentum_len != 0 {
        server = server.with_momentum(momentum, prev)?;
    }
    Ok(server)
}

/// Builds a worker on `params`, with its scratch in the block at `base`.
///
/// # Safety
/// As [`scratch`].
pub(crate) unsafe fn new_worker(
    config: &ProtocolConfig,
    setup: WorkerSetup,
    params: RawSlice,
    base: NonNull<u8>,
    l: &Layout,
) -> Result<WorkerMachine, ConfigError> {
    // SAFETY: forwarded.
    let (scratch, _, _) = unsafe { scratch(base, l) };
    AnyWorker::new(config, setup, params, scratch)
}
