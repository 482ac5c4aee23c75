//! A tiny deterministic reader that turns fuzzer bytes into choices (past the end it reads
//! zeros), shared by the `server_ops`, `worker_ops` and `sim_schedule` checks. Hand-rolled
//! rather than `arbitrary` so that the committed corpus files keep their meaning whatever the
//! `arbitrary` version, and so the tests crate needs no extra dependency.

pub(crate) struct Bytes<'a>(pub(crate) &'a [u8]);

impl Bytes<'_> {
    pub(crate) fn is_empty(&self) -> bool {
        self.0.is_empty()
    }

    pub(crate) fn u8(&mut self) -> u8 {
        match self.0.split_first() {
            Some((b, rest)) => {
                self.0 = rest;
                *b
            }
            None => 0,
        }
    }

    pub(crate) fn u64(&mut self) -> u64 {
        (0..8).fold(0, |acc, _| (acc << 8) | u64::from(self.u8()))
    }

    /// A small integer in `-8..=7`, or (rarely) an extreme or non-finite value.
    pub(crate) fn value(&mut self) -> f64 {
        match self.u8() {
            255 => f64::NAN,
            254 => f64::INFINITY,
            253 => -f64::INFINITY,
            252 => 1e300,
            b => f64::from(b % 16) - 8.0,
        }
    }

    /// A sequence number near the session's range, or an extreme.
    pub(crate) fn seq(&mut self, epoch: u32) -> u64 {
        let b = self.u8();
        match b {
            255 => u64::MAX,
            254 => 0,
            253 => self.u64(),
            _ => (u64::from(epoch) << 32) + u64::from(b % 32),
        }
    }

    /// A version near `current` (at most 3 behind, 1 ahead), or an extreme.
    pub(crate) fn version(&mut self, current: u64) -> u64 {
        match self.u8() {
            255 => u64::MAX,
            254 => self.u64(),
            b => current.saturating_add(1).saturating_sub(u64::from(b % 5)),
        }
    }
}
