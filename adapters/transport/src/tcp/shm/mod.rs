//! The same-host payload path: a session's gradients and models travel through a
//! shared-memory region instead of its socket, and the socket carries a small frame saying
//! "the message is in the slot". Control frames (the handshake, heartbeats, every other
//! message) stay on TCP, and a run across hosts never uses this path.
//!
//! **The region.** The server creates one per session that asks for it ([`Region::create`]):
//! a new file with a random name in `/dev/shm` (the temporary directory where there is none),
//! mode 0600, its space reserved up front (a full tmpfs refuses the file instead of faulting
//! later), mapped. It holds a header (magic, slot capacity, a random nonce, four counters on
//! cache lines of their own) and two slots of [`slot_capacity`] bytes, each one core message
//! as the wire format encodes it: the slot toward the server (contributions) and the slot
//! toward the worker (models).
//!
//! **The exchange** (transport messages, [`messages`]): the worker sends `SHMQ`; the server
//! answers `SHMO` naming the file and its size, or `SHMN`; the worker maps that file only if
//! it is a regular file of exactly the size its model implies with the right magic and
//! capacity ([`Region::open`]), and answers `SHMA` with the SHA-256 of the nonce it read
//! (zeros: declined); the server compares it with its own ([`Region::proof`]), unlinks the
//! file whatever the answer, and on a match turns the session's path on and sends `SHMK`.
//! Only a process that could read the server's file can answer: a worker on another host,
//! or one that cannot open the file, declines, and the session stays on TCP.
//!
//! **Slots.** A slot is the writer's when its `consumed` counter equals its `written` counter.
//! The writer encodes the message into it, stores `written = k` (Release) and sends the
//! frame `SLOT k len`; the reader checks `written == k` (Acquire), decodes the message where
//! it lies, and once done with it stores `consumed = k` (Release). A writer whose slot is
//! still unconsumed sends the ordinary full frame instead: it never waits and never
//! overwrites what the reader may still be reading. Each side reads only a slot the other
//! writes, bounded by the capacity both sides computed from the model's size. A peer that
//! writes its slot while the other reads it breaks the protocol and only changes the values
//! read; they are checked as those of any frame, but a server that reads a gradient twice
//! (admission, then accumulation) checks the first reading. Only a process of the server's
//! own user can open the file (mode 0600), and such a process can alter the server itself.

#![allow(unsafe_code)]

pub mod messages;

use core::sync::atomic::{AtomicU64, Ordering};
use memmap2::MmapRaw;
use sha2::{Digest, Sha256};
use std::fs::{File, OpenOptions};
use std::io;
use std::path::{Path, PathBuf};
use std::sync::Mutex;

/// The first bytes of a region.
pub const MAGIC: [u8; 8] = *b"SYNSHM01";
/// Bytes of the header (one page): magic, capacity, nonce, counters.
pub const HEADER: usize = 4096;
/// The prefix of every region's file name.
pub const FILE_PREFIX: &str = "syncopate-shm-";

const CAP_AT: usize = 8;
const NONCE_AT: usize = 16;
const NONCE_LEN: usize = 32;
/// The counters, each on a cache line of its own: `written` and `consumed` of the slot
/// toward the server, then of the slot toward the worker.
const COUNTERS_AT: [usize; 4] = [128, 256, 384, 512];

/// Which slot.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Dir {
    /// Written by the worker, read by the server (contributions).
    ToServer,
    /// Written by the server, read by the worker (models).
    ToWorker,
}

impl Dir {
    fn written_at(self) -> usize {
        match self {
            Self::ToServer => COUNTERS_AT[0],
            Self::ToWorker => COUNTERS_AT[2],
        }
    }
    fn consumed_at(self) -> usize {
        match self {
            Self::ToServer => COUNTERS_AT[1],
            Self::ToWorker => COUNTERS_AT[3],
        }
    }
}

/// The bytes of one slot of a session of a model of `dim` parameters: the largest core
/// message a session carries, rounded up to whole pages.
pub fn slot_capacity(dim: usize) -> usize {
    let msg = syncopate::wire::Limits::for_model(dim).max_message_len::<f32>();
    msg.div_ceil(HEADER).saturating_mul(HEADER)
}

/// The size of the region file of a model of `dim` parameters.
pub fn region_len(dim: usize) -> usize {
    HEADER.saturating_add(slot_capacity(dim).saturating_mul(2))
}

/// A mapped region (either side). The server's also knows its file until it is unlinked.
#[derive(Debug)]
pub struct Region {
    map: MmapRaw,
    cap: usize,
    /// The file, while it still has a name (server side).
    path: Mutex<Option<PathBuf>>,
}

/// Where the server creates regions: `/dev/shm` where it exists, else the temporary directory.
pub fn default_dir() -> PathBuf {
    let shm = Path::new("/dev/shm");
    if shm.is_dir() { shm.to_path_buf() } else { std::env::temp_dir() }
}

impl Region {
    /// Creates, sizes and maps a new region for a model of `dim` parameters in `dir`, with a
    /// fresh nonce. The file is the caller's to unlink ([`Self::unlink`]; dropping the region
    /// unlinks it too).
    pub fn create(dir: &Path, dim: usize) -> io::Result<Self> {
        let cap = slot_capacity(dim);
        let len = region_len(dim);
        let mut name = [0u8; 16];
        getrandom::fill(&mut name).map_err(|e| io::Error::other(format!("no randomness: {e}")))?;
        let hex: String = name.iter().map(|b| format!("{b:02x}")).collect();
        let path = dir.join(format!("{FILE_PREFIX}{hex}"));
        let mut opts = OpenOptions::new();
        opts.read(true).write(true).create_new(true);
        #[cfg(unix)]
        std::os::unix::fs::OpenOptionsExt::mode(&mut opts, 0o600);
        let file = opts.open(&path)?;
        // From here on the file has a name: every failure unlinks it.
        let region = (|| {
            reserve(&file, len)?;
            // SAFETY: the file was just created with a random name and mode 0600; nothing
            // else has it open yet. A worker may map it later: every access to the shared
            // bytes goes through the slot protocol above, and the counters are atomics.
            MmapRaw::map_raw(&file)
        })();
        let map = match region {
            Ok(map) => map,
            Err(e) => {
                let _ = std::fs::remove_file(&path);
                return Err(e);
            }
        };
        let mut nonce = [0u8; NONCE_LEN];
        getrandom::fill(&mut nonce).map_err(|e| io::Error::other(format!("no randomness: {e}")))?;
        let mut head = [0u8; NONCE_AT + NONCE_LEN];
        head[..8].copy_from_slice(&MAGIC);
        head[CAP_AT..CAP_AT + 8].copy_from_slice(&(cap as u64).to_le_bytes());
        head[NONCE_AT..].copy_from_slice(&nonce);
        // SAFETY: the mapping has `len > HEADER` bytes and no other process has the file yet.
        unsafe { core::ptr::copy_nonoverlapping(head.as_ptr(), map.as_mut_ptr(), head.len()) };
        Ok(Self { map, cap, path: Mutex::new(Some(path)) })
    }

    /// Maps the region a server offered for a model of `dim` parameters, or says why not:
    /// the path must name a regular file (not a link) of exactly [`region_len`]`(dim)`
    /// bytes whose header has the magic and the capacity of `dim`. Nothing is mapped
    /// otherwise.
    pub fn open(path: &Path, dim: usize) -> Result<Self, String> {
        let len = region_len(dim);
        let meta = std::fs::symlink_metadata(path).map_err(|e| format!("{}: {e}", path.display()))?;
        if !meta.file_type().is_file() {
            return Err(format!("{} is not a regular file", path.display()));
        }
        if meta.len() != len as u64 {
            return Err(format!("{} has {} bytes, a region for this model has {len}", path.display(), meta.len()));
        }
        let mut opts = OpenOptions::new();
        opts.read(true).write(true);
        // A link swapped in after the check above is not followed.
        #[cfg(unix)]
        std::os::unix::fs::OpenOptionsExt::custom_flags(&mut opts, libc::O_NOFOLLOW);
        let file = opts.open(path).map_err(|e| format!("{}: {e}", path.display()))?;
        let opened = file.metadata().map_err(|e| format!("{}: {e}", path.display()))?;
        if !opened.file_type().is_file() {
            return Err(format!("{} is not a regular file", path.display()));
        }
        let size = opened.len();
        if size != len as u64 {
            return Err(format!("{} has {size} bytes, a region for this model has {len}", path.display()));
        }
        let map = MmapRaw::map_raw(&file).map_err(|e| format!("cannot map {}: {e}", path.display()))?;
        if map.len() != len {
            return Err(format!("{} mapped {} bytes, expected {len}", path.display(), map.len()));
        }
        let cap = slot_capacity(dim);
        let mut head = [0u8; NONCE_AT];
        // SAFETY: the mapping has `len > HEADER` bytes; the header's first bytes are written
        // once by the server, before it names the file.
        unsafe { core::ptr::copy_nonoverlapping(map.as_ptr(), head.as_mut_ptr(), head.len()) };
        if head.get(..8) != Some(&MAGIC[..]) {
            return Err(format!("{} is not a syncopate region (bad magic)", path.display()));
        }
        let have = head.get(CAP_AT..CAP_AT + 8).and_then(|b| b.try_into().ok()).map(u64::from_le_bytes);
        if have != Some(cap as u64) {
            return Err(format!("{} has slots of another size than this model's", path.display()));
        }
        Ok(Self { map, cap, path: Mutex::new(None) })
    }

    /// The file's path while it has one.
    pub fn path(&self) -> Option<PathBuf> {
        self.path.lock().ok().and_then(|p| p.clone())
    }

    /// Removes the file's name (the mapping stays valid); idempotent.
    pub fn unlink(&self) {
        if let Some(path) = self.path.lock().ok().and_then(|mut p| p.take()) {
            let _ = std::fs::remove_file(path);
        }
    }

    /// What a peer that read this region's nonce answers: SHA-256 of a label and the nonce.
    pub fn proof(&self) -> [u8; 32] {
        let mut nonce = [0u8; NONCE_LEN];
        // SAFETY: the nonce lies inside the header page of the mapping; it is written once,
        // before the file is named.
        unsafe { core::ptr::copy_nonoverlapping(self.map.as_ptr().add(NONCE_AT), nonce.as_mut_ptr(), NONCE_LEN) };
        let mut h = Sha256::new();
        h.update(b"syncopate shared-memory proof");
        h.update(nonce);
        h.finalize().into()
    }

    /// The bytes of one slot.
    pub fn capacity(&self) -> usize {
        self.cap
    }

    fn counter(&self, at: usize) -> &AtomicU64 {
        let base = self.map.as_ptr();
        // SAFETY: `at` is one of `COUNTERS_AT`, 8-aligned offsets inside the header page of a
        // page-aligned mapping of at least `HEADER` bytes, which lives as long as `self`.
        // The word is only ever accessed atomically (by both processes).
        unsafe { &*base.add(at).cast::<AtomicU64>() }
    }

    fn slot_ptr(&self, dir: Dir) -> *mut u8 {
        let off = match dir {
            Dir::ToServer => HEADER,
            Dir::ToWorker => HEADER + self.cap,
        };
        // SAFETY: the mapping has `HEADER + 2 * cap` bytes (checked when it was made), so
        // both slot offsets are inside it.
        unsafe { self.map.as_mut_ptr().add(off) }
    }

    /// Writes one message into slot `dir` if it is free: `fill` gets the slot and returns
    /// how many bytes it wrote (at most the capacity); the message is then published with
    /// the next sequence number, returned with the length. `None` when the slot is still
    /// unconsumed or `fill` fails: the caller sends the message by TCP.
    pub fn try_write<E>(&self, dir: Dir, fill: impl FnOnce(&mut [u8]) -> Result<usize, E>) -> Option<(u64, usize)> {
        let written = self.counter(dir.written_at());
        let k = written.load(Ordering::Relaxed);
        if self.counter(dir.consumed_at()).load(Ordering::Acquire) != k {
            return None;
        }
        // SAFETY: the slot is inside the mapping (see `slot_ptr`); by the slot protocol the
        // reader does not touch it between its `consumed == written` store and our next
        // `written` store, so this is the only access. A peer breaking the protocol can
        // only change the bytes the reader then validates.
        let slot = unsafe { core::slice::from_raw_parts_mut(self.slot_ptr(dir), self.cap) };
        let len = fill(slot).ok().filter(|n| *n <= self.cap)?;
        let k = k.wrapping_add(1);
        written.store(k, Ordering::Release);
        Some((k, len))
    }

    /// The message `k` of `len` bytes in slot `dir`, if the writer published exactly that;
    /// hand it back with [`Self::consume`] once done with it.
    pub fn read(&self, dir: Dir, k: u64, len: usize) -> Option<&[u8]> {
        if len > self.cap || self.counter(dir.written_at()).load(Ordering::Acquire) != k {
            return None;
        }
        // SAFETY: `len <= cap`, so the bytes are inside the slot; the writer published them
        // (Release) before we read `written` (Acquire) and does not write the slot again
        // until we store `consumed = k`.
        Some(unsafe { core::slice::from_raw_parts(self.slot_ptr(dir), len) })
    }

    /// Hands slot `dir` back to its writer after message `k`.
    pub fn consume(&self, dir: Dir, k: u64) {
        self.counter(dir.consumed_at()).store(k, Ordering::Release);
    }
}

impl Drop for Region {
    fn drop(&mut self) {
        self.unlink();
    }
}

/// Reserves `len` bytes for `file`: on Linux the blocks themselves, so a full tmpfs fails
/// here rather than with a fault on first touch; elsewhere the length.
fn reserve(file: &File, len: usize) -> io::Result<()> {
    #[cfg(target_os = "linux")]
    {
        use std::os::fd::AsRawFd;
        let len = libc::off_t::try_from(len).map_err(|_| io::Error::other("region too large"))?;
        // SAFETY: a plain system call on an open descriptor; no memory is passed.
        let rc = unsafe { libc::posix_fallocate(file.as_raw_fd(), 0, len) };
        if rc != 0 {
            return Err(io::Error::from_raw_os_error(rc));
        }
        Ok(())
    }
    #[cfg(not(target_os = "linux"))]
    file.set_len(len as u64)
}

/// The server's regions whose files may still have names, so that a server that ends
/// unlinks them all, whatever its sessions' threads are doing.
#[derive(Debug, Default)]
pub struct Registry(Mutex<Vec<std::sync::Weak<Region>>>);

impl Registry {
    /// Remembers `region`.
    pub fn add(&self, region: &std::sync::Arc<Region>) {
        if let Ok(mut v) = self.0.lock() {
            v.retain(|w| w.strong_count() > 0);
            v.push(std::sync::Arc::downgrade(region));
        }
    }

    /// Unlinks every remembered region's file.
    pub fn unlink_all(&self) {
        if let Ok(mut v) = self.0.lock() {
            for r in v.drain(..).filter_map(|w| w.upgrade()) {
                r.unlink();
            }
        }
    }
}

#[cfg(test)]
mod tests;
