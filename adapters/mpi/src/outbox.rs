//! Raw MPI calls the safe bindings cannot express: non-blocking sends that outlive the
//! call that starts them, and receives of a message's bytes straight into `f32` memory. The
//! only `unsafe` of the adapter.
//!
//! Why unsafe: rsmpi ties a non-blocking send's buffer to a lexical scope, and a scope must
//! see every request complete before it ends. A protocol loop cannot wait like that: a send
//! to a worker rank that is hung, stopped or busy (a large message needs the receiver to
//! take part) would stall the server for every other rank, and a rank that never comes back
//! would stall it for good. So the sends here are plain `MPI_Isend`s whose requests live in
//! [`Outbox`] next to the buffer they read, tested with `MPI_Test` on every turn of the loop.
//!
//! Soundness: a buffer is an `Arc<Vec<u8>>` (or, for a payload lent from a worker's model
//! buffer, an `Arc<Vec<f32>>`) that every pending send of it holds, so its bytes stay
//! allocated and unchanged (an `Arc` gives only shared access; the worker's buffers are
//! copy-on-write, `Arc::make_mut`) until `MPI_Test` reports that send complete; only then is
//! that hold dropped. A send that never completes keeps its buffer for good
//! ([`Outbox::abandon`] frees the request and leaks the bytes, as MPI may still read them).
//! [`receive_floats`] writes through a `&mut [f32]`, which no one else can read meanwhile.

#![allow(unsafe_code)]

use mpi::datatype::Equivalence;
use mpi::ffi;
use mpi::point_to_point::Message;
use mpi::raw::{AsRaw, AsRawMut};
use mpi::topology::{Rank, SimpleCommunicator};
use std::os::raw::c_int;
use std::sync::Arc;

/// One `MPI_Isend` in flight and the bytes it reads: `bytes`, or the payload `lent` (a
/// worker's gradient, sent from the buffer it was computed in).
struct Pending {
    request: ffi::MPI_Request,
    to: Rank,
    bytes: Arc<Vec<u8>>,
    lent: Option<Arc<Vec<f32>>>,
}

/// Starts one `MPI_Isend` of `count` bytes at `ptr`; `None` if MPI refused (only under a
/// non-default error handler).
///
/// # Safety
/// The `count` bytes at `ptr` must stay allocated and unmodified until the returned request
/// completes (or for ever, if it is abandoned).
unsafe fn isend(
    world: &SimpleCommunicator,
    ptr: *const u8,
    count: c_int,
    to: Rank,
    tag: c_int,
) -> Option<ffi::MPI_Request> {
    // SAFETY: `request` is written by MPI_Isend before it is read; the caller keeps the
    // bytes alive and unchanged while MPI reads them.
    let mut request = unsafe { ffi::RSMPI_REQUEST_NULL };
    let rc = unsafe {
        ffi::MPI_Isend(ptr.cast(), count, u8::equivalent_datatype().as_raw(), to, tag, world.as_raw(), &mut request)
    };
    (rc == 0).then_some(request)
}

/// Receives the probed `message`, whose length is `4 * into.len()` bytes (checked by the
/// caller against its status), straight into `into`: the bytes as sent, so on a
/// little-endian host the `f32`s of a little-endian payload. False (and nothing received)
/// if the length does not fit MPI's `int` count.
pub(crate) fn receive_floats(mut message: Message, into: &mut [f32]) -> bool {
    let Ok(count) = c_int::try_from(size_of_val(into)) else {
        // rsmpi insists that a probed message is received: take it into a throwaway buffer.
        let mut sink = vec![0u8; size_of_val(into)];
        let _ = message.matched_receive_into(&mut sink[..]);
        return false;
    };
    // SAFETY: `into` is `count` bytes of writable memory borrowed mutably for the call
    // (MPI_Mrecv is blocking: it writes before it returns, at most `count` bytes, and any
    // byte pattern is a valid `f32`); `message` is a matched message, which MPI_Mrecv
    // receives and sets to MPI_MESSAGE_NULL, as rsmpi's `Drop` of it expects.
    unsafe {
        ffi::MPI_Mrecv(
            into.as_mut_ptr().cast(),
            count,
            u8::equivalent_datatype().as_raw(),
            message.as_raw_mut(),
            ffi::RSMPI_STATUS_IGNORE,
        );
    }
    true
}

/// The sends of one rank still in flight.
#[derive(Default)]
pub(crate) struct Outbox {
    pending: Vec<Pending>,
    /// Buffers of past sends, reused once no pending send holds them.
    free: Vec<Arc<Vec<u8>>>,
}

impl Outbox {
    /// A buffer to fill before [`Outbox::send`]: a free one (unshared) or a new one.
    pub(crate) fn buffer(&mut self) -> Vec<u8> {
        // A buffer no pending send holds any more; the others stay until theirs complete.
        let unshared = self.free.iter().position(|b| Arc::strong_count(b) == 1);
        unshared.and_then(|i| Arc::try_unwrap(self.free.swap_remove(i)).ok()).unwrap_or_default()
    }

    /// Starts one `MPI_Isend` of `bytes` with `tag` to each rank of `to` (all reading the one
    /// buffer); returns at once. A message longer than MPI's `int` count is not sent (the
    /// wire codec's limits keep messages far below it); it returns false then.
    pub(crate) fn send(&mut self, world: &SimpleCommunicator, to: &[Rank], tag: c_int, bytes: Vec<u8>) -> bool {
        self.send_split(world, to, (tag, tag), bytes, 0)
    }

    /// Like [`Outbox::send`], but as two messages to each rank, both read from the one
    /// buffer: its first `head` bytes with `tags.0`, then the rest with `tags.1` (with `head`
    /// 0, only the whole buffer, with `tags.0`).
    pub(crate) fn send_split(
        &mut self,
        world: &SimpleCommunicator,
        to: &[Rank],
        tags: (c_int, c_int),
        bytes: Vec<u8>,
        head: usize,
    ) -> bool {
        let (Ok(total), Ok(head_count)) = (c_int::try_from(bytes.len()), c_int::try_from(head)) else {
            self.free.push(Arc::new(bytes));
            return false;
        };
        let bytes = Arc::new(bytes);
        let parts: &[(usize, c_int, c_int)] = if head == 0 || head >= bytes.len() {
            &[(0, total, tags.0)]
        } else {
            &[(0, head_count, tags.0), (head, total - head_count, tags.1)]
        };
        for &rank in to {
            for &(at, count, tag) in parts {
                // SAFETY: MPI_Isend reads `count` bytes at offset `at` of `bytes` (within it:
                // `at + count` is `head` or `bytes.len()`) until the request
                // completes; the `Arc` stored with the request keeps that allocation alive
                // and unmodified until `MPI_Test` reports completion (or for ever, see
                // `abandon`).
                let ptr = bytes.get(at..).map_or(bytes.as_ptr(), <[u8]>::as_ptr);
                if let Some(request) = unsafe { isend(world, ptr, count, rank, tag) } {
                    self.pending.push(Pending { request, to: rank, bytes: Arc::clone(&bytes), lent: None });
                }
            }
        }
        self.free.push(bytes);
        true
    }

    /// Sends `head` with `tags.0`, then the `f32`s of `payload` as their bytes (little-endian
    /// on a little-endian host) with `tags.1`, to each rank of `to`, without copying the
    /// payload: each request holds the `Arc` until its send completed, and the buffer's
    /// owner writes only through `Arc::make_mut` (a copy while it is shared). False (nothing
    /// sent) if the payload's length does not fit MPI's `int` count.
    pub(crate) fn send_lent(
        &mut self,
        world: &SimpleCommunicator,
        to: &[Rank],
        tags: (c_int, c_int),
        head: Vec<u8>,
        payload: Arc<Vec<f32>>,
    ) -> bool {
        let (Ok(head_len), Ok(len)) = (c_int::try_from(head.len()), c_int::try_from(size_of_val(&payload[..]))) else {
            self.free.push(Arc::new(head));
            return false;
        };
        let head = Arc::new(head);
        for &rank in to {
            // SAFETY: both buffers are held by their `Pending` (the `Arc`s) until MPI_Test
            // reports the send complete, and neither is written while shared (see the module
            // docs).
            if let Some(request) = unsafe { isend(world, head.as_ptr(), head_len, rank, tags.0) } {
                self.pending.push(Pending { request, to: rank, bytes: Arc::clone(&head), lent: None });
            }
            if let Some(request) = unsafe { isend(world, payload.as_ptr().cast(), len, rank, tags.1) } {
                self.pending.push(Pending {
                    request,
                    to: rank,
                    bytes: Arc::clone(&head),
                    lent: Some(Arc::clone(&payload)),
                });
            }
        }
        self.free.push(head);
        true
    }

    /// Tests every send in flight (`MPI_Test`, which also drives MPI's progress) and lets
    /// go of the completed ones; returns how many are still in flight.
    pub(crate) fn progress(&mut self) -> usize {
        self.pending.retain_mut(|p| {
            let mut done: c_int = 0;
            // SAFETY: `p.request` came from MPI_Isend and has not completed (completed ones
            // are removed below); the status is ignored.
            let rc = unsafe { ffi::MPI_Test(&mut p.request, &mut done, ffi::RSMPI_STATUS_IGNORE) };
            rc != 0 || done == 0
        });
        self.pending.len()
    }

    /// Gives up on every send still in flight to `rank` (a lost rank): MPI frees each
    /// request when it completes, if ever, and its bytes are leaked, since MPI may still read
    /// them.
    pub(crate) fn abandon(&mut self, rank: Rank) {
        let (gone, keep): (Vec<Pending>, Vec<Pending>) = self.pending.drain(..).partition(|p| p.to == rank);
        self.pending = keep;
        // Their buffers are never free again: stop offering them for reuse.
        self.free.retain(|b| !gone.iter().any(|p| Arc::ptr_eq(b, &p.bytes)));
        for mut p in gone {
            // SAFETY: `p.request` is an active request from MPI_Isend; MPI_Request_free lets
            // MPI complete it on its own. Its buffer must outlive that: it is leaked.
            unsafe { ffi::MPI_Request_free(&mut p.request) };
            std::mem::forget(p.bytes);
            std::mem::forget(p.lent);
        }
    }
}

impl Drop for Outbox {
    /// Sends still in flight when the outbox goes (the run ended without them completing):
    /// their requests are freed and their bytes leaked, so MPI never reads freed memory.
    fn drop(&mut self) {
        let ranks: Vec<Rank> = self.pending.iter().map(|p| p.to).collect();
        for rank in ranks {
            self.abandon(rank);
        }
    }
}
