//! The transport messages of the shared-memory path (layout in `adapters/transport/TCP.md`):
//! the exchange that turns it on, and the frame that points at a slot.
//!
//! | payload | direction | what it is |
//! |---|---|---|
//! | `"SHMQ"` | worker → server | asks for a region |
//! | `"SHMO"` + size `u64` + path (UTF-8) | server → worker | offers one |
//! | `"SHMN"` + reason (UTF-8) | server → worker | offers none |
//! | `"SHMA"` + proof (32 bytes) | worker → server | the proof it read the region (zeros: declined) |
//! | `"SHMK"` | server → worker | the path is on |
//! | `"SLOT"` + seq `u64` + len `u32` | either | the next message is in the sender's slot |

/// The first bytes every exchange message shares.
pub const EXCHANGE_PREFIX: &[u8; 3] = b"SHM";
/// The tag of a slot frame.
pub const SLOT: [u8; 4] = *b"SLOT";
/// The longest path an offer carries.
pub const MAX_PATH: usize = 1024;

/// One message of the exchange.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Exchange<'a> {
    /// The worker asks for a region.
    Request,
    /// The server offers the region file `path` of `size` bytes.
    Offer {
        /// The file's size.
        size: u64,
        /// The file.
        path: &'a str,
    },
    /// The server offers no region, for `reason`.
    Declined(&'a str),
    /// The worker's proof that it read the region (all zero: it declined).
    Answer([u8; 32]),
    /// The server took the proof: the path is on.
    On,
}

impl Exchange<'_> {
    /// Whether `payload` is an exchange message (by its prefix).
    pub fn is(payload: &[u8]) -> bool {
        payload.starts_with(EXCHANGE_PREFIX)
    }

    /// The message's payload.
    pub fn encode(&self) -> Vec<u8> {
        let mut out = Vec::with_capacity(48);
        match self {
            Self::Request => out.extend_from_slice(b"SHMQ"),
            Self::Offer { size, path } => {
                out.extend_from_slice(b"SHMO");
                out.extend_from_slice(&size.to_le_bytes());
                out.extend_from_slice(path.as_bytes());
            }
            Self::Declined(reason) => {
                out.extend_from_slice(b"SHMN");
                out.extend_from_slice(reason.as_bytes());
            }
            Self::Answer(proof) => {
                out.extend_from_slice(b"SHMA");
                out.extend_from_slice(proof);
            }
            Self::On => out.extend_from_slice(b"SHMK"),
        }
        out
    }
}

impl<'a> Exchange<'a> {
    /// Decodes an exchange message, or says what is wrong with it.
    pub fn decode(payload: &'a [u8]) -> Result<Self, String> {
        let (tag, body) = (payload.get(..4).unwrap_or(payload), payload.get(4..).unwrap_or_default());
        let text = |b: &'a [u8]| core::str::from_utf8(b).map_err(|_| "a shared-memory message whose text is not UTF-8");
        match tag {
            b"SHMQ" if body.is_empty() => Ok(Self::Request),
            b"SHMK" if body.is_empty() => Ok(Self::On),
            b"SHMO" if body.len() > 8 && body.len() - 8 <= MAX_PATH => {
                let size = u64::from_le_bytes(body.get(..8).and_then(|b| b.try_into().ok()).unwrap_or_default());
                Ok(Self::Offer { size, path: text(body.get(8..).unwrap_or_default())? })
            }
            b"SHMN" if body.len() <= MAX_PATH => Ok(Self::Declined(text(body)?)),
            b"SHMA" => {
                body.try_into().map(Self::Answer).map_err(|_| format!("a proof of {} bytes, not 32", body.len()))
            }
            _ => Err(format!("a malformed shared-memory message ({} bytes)", payload.len())),
        }
    }
}

/// A frame that says: message `seq` of `len` bytes is in the sender's slot.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct SlotFrame {
    /// The slot's sequence number of the message.
    pub seq: u64,
    /// The message's length in bytes.
    pub len: u32,
}

impl SlotFrame {
    /// Bytes of the payload.
    pub const LEN: usize = 16;

    /// Whether `payload` is a slot frame (by its tag).
    pub fn is(payload: &[u8]) -> bool {
        payload.starts_with(&SLOT)
    }

    /// The payload.
    pub fn encode(&self) -> [u8; Self::LEN] {
        let mut out = [0u8; Self::LEN];
        out[..4].copy_from_slice(&SLOT);
        out[4..12].copy_from_slice(&self.seq.to_le_bytes());
        out[12..].copy_from_slice(&self.len.to_le_bytes());
        out
    }

    /// The frame in `payload`, if it is exactly one.
    pub fn decode(payload: &[u8]) -> Option<Self> {
        if payload.len() != Self::LEN || !Self::is(payload) {
            return None;
        }
        let seq = u64::from_le_bytes(payload.get(4..12)?.try_into().ok()?);
        let len = u32::from_le_bytes(payload.get(12..16)?.try_into().ok()?);
        Some(Self { seq, len })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn exchange_messages_round_trip_and_refuse_malformed_ones() {
        for m in [
            Exchange::Request,
            Exchange::Offer { size: 8192, path: "/dev/shm/x" },
            Exchange::Declined("off"),
            Exchange::Answer([7; 32]),
            Exchange::On,
        ] {
            let bytes = m.encode();
            assert!(Exchange::is(&bytes));
            assert_eq!(Exchange::decode(&bytes), Ok(m));
        }
        assert!(Exchange::decode(b"SHMA123").unwrap_err().contains("3 bytes, not 32"));
        assert!(Exchange::decode(b"SHMQx").is_err());
        assert!(Exchange::decode(b"SHMO\x01").is_err(), "an offer without a path");
        assert!(Exchange::decode(b"SHMN\xff").is_err());
        let frame = SlotFrame { seq: 3, len: 99 };
        assert_eq!(SlotFrame::decode(&frame.encode()), Some(frame));
        assert_eq!(SlotFrame::decode(&frame.encode()[..15]), None);
    }
}
