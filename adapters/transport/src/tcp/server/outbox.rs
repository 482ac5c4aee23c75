//! Outgoing messages: each encoded once into a reused buffer and shared by every writer
//! that sends it (each writer adds its own sequence number and MAC).

use std::sync::Arc;
use syncopate::wire;

/// Buffers of encoded outgoing messages. Each message is encoded once into one of them and
/// shared by every writer that sends it; a buffer no writer holds any more is reused for the
/// next message, so a model broadcast neither allocates nor zeroes a fresh buffer of the
/// model's size.
pub(super) struct SharedBufs {
    bufs: Vec<Arc<Vec<u8>>>,
    keep: usize,
}

impl SharedBufs {
    pub(super) fn new(keep: usize) -> Self {
        Self { bufs: Vec::with_capacity(keep), keep }
    }

    /// A buffer holding what `encode` wrote into `len` bytes, ready to share.
    pub(super) fn fill<E>(
        &mut self,
        len: usize,
        encode: impl FnOnce(&mut [u8]) -> Result<usize, E>,
    ) -> Result<Arc<Vec<u8>>, E> {
        // Only this pool clones these `Arc`s, so a count of 1 cannot go back up.
        let free = self.bufs.iter().position(|b| Arc::strong_count(b) == 1 && Arc::weak_count(b) == 0);
        let mut shared = free.map(|i| self.bufs.swap_remove(i)).unwrap_or_default();
        let written = match Arc::get_mut(&mut shared) {
            Some(buf) => encode_into(buf, len, encode),
            None => {
                let mut buf = Vec::new();
                let written = encode_into(&mut buf, len, encode);
                shared = Arc::new(buf);
                written
            }
        };
        if self.bufs.len() < self.keep {
            self.bufs.push(Arc::clone(&shared));
        }
        written.map(|()| shared)
    }

    /// A buffer holding `msg` encoded in `enc`, ready to share.
    pub(super) fn encode(
        &mut self,
        msg: &syncopate::ToWorker<'_, f32>,
        enc: wire::Encoding,
    ) -> Result<Arc<Vec<u8>>, wire::EncodeError> {
        self.fill(wire::encoded_len_to_worker_as(msg, enc), |buf| wire::encode_to_worker_as(msg, enc, buf))
    }
}

/// Makes `buf` exactly `len` bytes and lets `encode` fill it, keeping what it wrote. Only
/// the bytes the buffer gains are zeroed: `encode` overwrites the rest. A length no
/// allocation can hold leaves the buffer short, and the encoder refuses it.
fn encode_into<E>(buf: &mut Vec<u8>, len: usize, encode: impl FnOnce(&mut [u8]) -> Result<usize, E>) -> Result<(), E> {
    if buf.capacity() < len {
        let _ = buf.try_reserve_exact(len.saturating_add(wire::MAX_CONTROL_LEN).saturating_sub(buf.len()));
    }
    if buf.capacity() >= len {
        buf.resize(len, 0);
    }
    encode(buf).map(|n| buf.truncate(n))
}
