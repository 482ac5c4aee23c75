//! The run's trace hash: FNV-1a, and the fast `Debug` text of the most frequent trace items.

use super::Node;
use core::fmt::{self, Write as _};
use syncopate::{Reject, ServerEvent};

/// FNV-1a, 64 bit. Also a [`fmt::Write`] sink, so `Debug` output can be hashed without
/// allocating.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct Fnv(pub(crate) u64);

impl Fnv {
    pub(crate) const fn new() -> Self {
        Self(0xcbf2_9ce4_8422_2325)
    }

    pub(crate) fn bytes(&mut self, bytes: &[u8]) {
        for &b in bytes {
            self.0 ^= u64::from(b);
            self.0 = self.0.wrapping_mul(0x0000_0100_0000_01b3);
        }
    }

    pub(crate) fn u64(&mut self, x: u64) {
        self.bytes(&x.to_le_bytes());
    }

    pub(crate) fn node(&mut self, n: Node) {
        match n {
            Node::Server => self.u64(u64::MAX),
            Node::Worker(i) => self.u64(u64::from(i)),
            Node::Group(g) => self.u64((1 << 32) | u64::from(g)),
        }
    }
}

/// Hashes the `Debug` text of the most frequent trace items without the formatting
/// machinery (the trace hash is of the exact same bytes; a test compares both).
#[derive(Debug, Default)]
pub(crate) struct FastDebug {
    /// The `Debug` text of the last `Applied` weight (weights repeat: `1/k`).
    weight_bits: u64,
    weight: String,
}

impl FastDebug {
    /// `write!(h, "{event:?}")`.
    pub(crate) fn server_event(&mut self, h: &mut Fnv, event: &ServerEvent) {
        match *event {
            ServerEvent::Applied { worker, base, version, staleness, weight } => {
                h.bytes(b"Applied { worker: WorkerId(");
                h.decimal(u64::from(worker.0));
                h.bytes(b"), base: Version(");
                h.decimal(base.0);
                h.bytes(b"), version: Version(");
                h.decimal(version.0);
                h.bytes(b"), staleness: ");
                h.decimal(staleness);
                h.bytes(b", weight: ");
                if self.weight.is_empty() || self.weight_bits != weight.to_bits() {
                    self.weight.clear();
                    let _ = write!(self.weight, "{weight:?}");
                    self.weight_bits = weight.to_bits();
                }
                h.bytes(self.weight.as_bytes());
                h.bytes(b" }");
            }
            ServerEvent::ModelUpdated { version, contributions, mean_loss: None } => {
                h.bytes(b"ModelUpdated { version: Version(");
                h.decimal(version.0);
                h.bytes(b"), contributions: ");
                h.decimal(u64::from(contributions));
                h.bytes(b", mean_loss: None }");
            }
            _ => {
                let _ = write!(h, "{event:?}");
            }
        }
    }
}

impl Fnv {
    /// `write!(self, "{x}")` for an unsigned integer.
    pub(crate) fn decimal(&mut self, mut x: u64) {
        let mut buf = [0u8; 20];
        let mut i = buf.len();
        loop {
            i -= 1;
            buf[i] = b'0' + (x % 10) as u8;
            x /= 10;
            if x == 0 {
                break;
            }
        }
        self.bytes(&buf[i..]);
    }

    /// `write!(self, "{result:?}")`.
    pub(crate) fn result(&mut self, result: &Result<(), Reject>) {
        match result {
            Ok(()) => self.bytes(b"Ok(())"),
            Err(_) => {
                let _ = write!(self, "{result:?}");
            }
        }
    }
}

impl fmt::Write for Fnv {
    fn write_str(&mut self, s: &str) -> fmt::Result {
        self.bytes(s.as_bytes());
        Ok(())
    }
}
