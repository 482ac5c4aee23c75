//! Non-blocking sends that outlive the call that starts them: the only `unsafe` of the
//! adapter.
//!
//! Why unsafe: rsmpi ties a non-blocking send's buffer to a lexical scope, and a scope must
//! see every request complete before it ends. A protocol loop cannot wait like that: a send
//! to a worker rank that is hung, stopped or busy (a large message needs the receiver to
//! take part) would stall the server for every other rank, and a rank that never comes back
//! would stall it for good. So the sends here are plain `MPI_Isend`s whose requests live in
//! [`Outbox`] next to the buffer they read, tested with `MPI_Test` on every turn of the loop.
//!
//! Soundness: a buffer is an `Arc<Vec<u8>>` that every pending send of it holds, so its bytes
//! stay allocated and unchanged (an `Arc` gives only shared access) until `MPI_Test` reports
//! that send complete; only then is that hold dropped. A send that never completes keeps its
//! buffer for good ([`Outbox::abandon`] frees the request and leaks the bytes, as MPI may
//! still read them).

#![allow(unsafe_code)]

use mpi::datatype::Equivalence;
use mpi::ffi;
use mpi::raw::AsRaw;
use mpi::topology::{Rank, SimpleCommunicator};
use std::os::raw::c_int;
use std::sync::Arc;

/// One `MPI_Isend` in flight and the bytes it reads.
struct Pending {
    request: ffi::MPI_Request,
    to: Rank,
    bytes: Arc<Vec<u8>>,
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
        let Ok(count) = c_int::try_from(bytes.len()) else {
            self.free.push(Arc::new(bytes));
            return false;
        };
        let bytes = Arc::new(bytes);
        for &rank in to {
            // SAFETY: MPI_Isend reads `count` bytes at `bytes.as_ptr()` until the request
            // completes; the `Arc` stored with the request keeps that allocation alive and
            // unmodified until `MPI_Test` reports completion (or for ever, see `abandon`).
            // `request` is written by MPI_Isend before it is read.
            let mut request = unsafe { ffi::RSMPI_REQUEST_NULL };
            let rc = unsafe {
                ffi::MPI_Isend(
                    bytes.as_ptr().cast(),
                    count,
                    u8::equivalent_datatype().as_raw(),
                    rank,
                    tag,
                    world.as_raw(),
                    &mut request,
                )
            };
            // The default error handler aborts the job on an error; a nonzero code can only
            // come back under another handler, and then nothing is in flight.
            if rc == 0 {
                self.pending.push(Pending { request, to: rank, bytes: Arc::clone(&bytes) });
            }
        }
        self.free.push(bytes);
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
