//! The simulated network: point-to-point links with latency and bandwidth, and a pool of
//! reusable byte buffers for the encoded messages in flight.
//!
//! A [`Link`] carries one message at a time: a message of `b` bytes handed over at `t`
//! starts transmitting when the link is free (`max(t, busy_until)`), occupies it for
//! `b / bandwidth` seconds and arrives `latency` after it finished transmitting. Messages on
//! one link therefore stay in order (FIFO) and queue behind each other; different links are
//! independent. Each worker has an uplink (worker → server) and a downlink (server →
//! worker); a broadcast sends one copy over each downlink, so the server's own network card
//! is not modelled as a shared bottleneck.

use syncopate::{Duration, Instant};

/// One direction of a connection.
#[derive(Clone, Debug)]
pub struct Link {
    latency: Duration,
    bytes_per_sec: f64,
    busy_until: Instant,
}

impl Link {
    /// A link with the given one-way latency and bandwidth (bytes per second; infinite or
    /// non-positive means transmission takes no time).
    pub fn new(latency: Duration, bytes_per_sec: f64) -> Self {
        Self { latency, bytes_per_sec, busy_until: Instant::ZERO }
    }

    /// How long `bytes` occupy the link.
    pub fn transfer_time(&self, bytes: usize) -> Duration {
        if self.bytes_per_sec.is_finite() && self.bytes_per_sec > 0.0 {
            Duration::from_secs_f64(bytes as f64 / self.bytes_per_sec)
        } else {
            Duration::ZERO
        }
    }

    /// Hands `bytes` to the link at `now`; returns the arrival time at the other end.
    pub fn send(&mut self, now: Instant, bytes: usize) -> Instant {
        let start = now.max(self.busy_until);
        let done = start + self.transfer_time(bytes);
        self.busy_until = done;
        done + self.latency
    }

    /// When the link finishes transmitting what it was given.
    pub fn busy_until(&self) -> Instant {
        self.busy_until
    }

    /// Forgets everything in flight (the endpoint crashed).
    pub fn reset(&mut self, now: Instant) {
        self.busy_until = now;
    }
}

/// A free-list pool of byte buffers with reference counts (one encoded broadcast is shared by
/// all its copies). Buffers keep their capacity, so the steady state allocates nothing.
#[derive(Debug, Default)]
pub struct BufferPool {
    min_len: usize,
    bufs: Vec<Vec<u8>>,
    lens: Vec<usize>,
    refs: Vec<u32>,
    free: Vec<usize>,
    allocated: usize,
    bad_releases: u64,
}

impl BufferPool {
    /// An empty pool whose buffers are allocated with at least `min_len` bytes (the largest
    /// message expected, so that a buffer never has to grow).
    pub fn new(min_len: usize) -> Self {
        Self { min_len, ..Self::default() }
    }

    /// Takes a buffer of at least `len` bytes, with one reference; returns its slot.
    pub fn take(&mut self, len: usize) -> usize {
        let slot = if let Some(slot) = self.free.pop() {
            slot
        } else {
            self.bufs.push(Vec::new());
            self.lens.push(0);
            self.refs.push(0);
            self.bufs.len() - 1
        };
        let buf = &mut self.bufs[slot];
        if buf.len() < len {
            self.allocated += 1;
            buf.resize(len.max(self.min_len), 0);
        }
        self.lens[slot] = len;
        self.refs[slot] = 1;
        slot
    }

    /// The writable bytes of `slot` (its full length as taken).
    pub fn bytes_mut(&mut self, slot: usize) -> &mut [u8] {
        let len = self.lens[slot];
        &mut self.bufs[slot][..len]
    }

    /// The bytes of `slot` (`len` as last set).
    pub fn bytes(&self, slot: usize) -> &[u8] {
        &self.bufs[slot][..self.lens[slot]]
    }

    /// Shrinks the visible length of `slot` to `len` (after encoding fewer bytes).
    pub fn set_len(&mut self, slot: usize, len: usize) {
        self.lens[slot] = len.min(self.bufs[slot].len());
    }

    /// Adds `n` references to `slot`.
    pub fn share(&mut self, slot: usize, n: u32) {
        self.refs[slot] += n;
    }

    /// Drops one reference; the buffer returns to the free list with the last one. A
    /// release of a buffer that holds no reference (released more often than taken) changes
    /// nothing and is counted ([`Self::bad_releases`]): putting the slot on the free list a
    /// second time would hand one buffer to two messages.
    pub fn release(&mut self, slot: usize) {
        match self.refs.get_mut(slot) {
            Some(r) if *r > 0 => {
                *r -= 1;
                if *r == 0 {
                    self.free.push(slot);
                }
            }
            _ => self.bad_releases += 1,
        }
    }

    /// Releases of a buffer that held no reference, or of no buffer: zero unless the caller
    /// has a bug.
    pub fn bad_releases(&self) -> u64 {
        self.bad_releases
    }

    /// Buffers currently in use.
    pub fn in_use(&self) -> usize {
        self.bufs.len() - self.free.len()
    }

    /// How many times a buffer had to grow (allocations); flat in the steady state.
    pub fn allocations(&self) -> usize {
        self.allocated
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_buffer_released_twice_is_counted_and_never_handed_out_twice() {
        let mut pool = BufferPool::new(8);
        let a = pool.take(8);
        pool.release(a);
        pool.release(a);
        pool.release(99);
        assert_eq!(pool.bad_releases(), 2);
        let (b, c) = (pool.take(8), pool.take(8));
        assert_ne!(b, c, "one slot on the free list once");
        assert_eq!(pool.in_use(), 2);
    }

    fn ms(x: u64) -> Instant {
        Instant::from_nanos(x * 1_000_000)
    }

    #[test]
    fn transfer_time_and_latency() {
        // 1000 bytes at 1 MB/s = 1 ms on the wire, plus 2 ms latency.
        let mut l = Link::new(Duration::from_millis(2), 1e6);
        assert_eq!(l.transfer_time(1000), Duration::from_millis(1));
        assert_eq!(l.send(ms(10), 1000), ms(13));
        assert_eq!(l.busy_until(), ms(11));
        let mut free = Link::new(Duration::from_millis(2), f64::INFINITY);
        assert_eq!(free.send(ms(10), 1_000_000), ms(12));
    }

    #[test]
    fn messages_queue_fifo_behind_each_other() {
        let mut l = Link::new(Duration::from_millis(1), 1e6);
        // Three 1 ms messages handed over at once leave one after the other.
        let a = l.send(ms(0), 1000);
        let b = l.send(ms(0), 1000);
        let c = l.send(ms(0), 1000);
        assert_eq!([a, b, c], [ms(2), ms(3), ms(4)]);
        // A small message after a big one still arrives after it.
        let big = l.send(ms(5), 10_000);
        let small = l.send(ms(5), 1);
        assert_eq!(big, ms(16));
        assert!(small > big);
        // An idle link starts at once; a reset link forgets its queue.
        assert_eq!(l.send(ms(100), 1000), ms(102));
        l.send(ms(200), 100_000);
        l.reset(ms(201));
        assert_eq!(l.send(ms(201), 1000), ms(203));
    }

    #[test]
    fn pool_reuses_buffers() {
        let mut p = BufferPool::new(64);
        let a = p.take(100);
        p.bytes_mut(a)[0] = 7;
        p.set_len(a, 10);
        assert_eq!(p.bytes(a).len(), 10);
        p.share(a, 2);
        p.release(a);
        p.release(a);
        assert_eq!(p.in_use(), 1);
        p.release(a);
        assert_eq!(p.in_use(), 0);
        for _ in 0..100 {
            let s = p.take(80);
            assert_eq!(s, a);
            p.release(s);
        }
        assert_eq!(p.allocations(), 1);
        // Larger than the minimum: grows once.
        let s = p.take(1000);
        assert_eq!(p.bytes(s).len(), 1000);
        assert_eq!(p.allocations(), 2);
    }
}
