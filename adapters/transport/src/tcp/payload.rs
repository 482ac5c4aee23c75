//! What a session frame carries: the one layer that says what each frame is (from a worker:
//! [`InboundFrame`]; from the server: [`FromServerKind`]).
//!
//! After the handshake, a frame's payload is exactly one of:
//!
//! | payload | what it is |
//! |---|---|
//! | empty | a heartbeat: the peer is there ([`InboundFrame::Heartbeat`]) |
//! | `"INIT"` + `f32`s | worker 0's initial parameters ([`initial`](super::initial)) |
//! | `"STEP"` + `f32`s | a worker's step times ([`step_times`](super::step_times)) |
//! | `"NFIN"` + `f32` | what a worker's protocol refused to send ([`refusal`](super::refusal)) |
//! | `"SLOT"` + seq + len | a core message in the sender's shared-memory slot ([`shm`](super::shm)) |
//! | `"SHM…"` | the shared-memory exchange, handled by the connection's reader ([`shm`](super::shm)) |
//! | anything else | a core message in the wire format (`core/WIRE.md`, magic `"SY"`) |
//!
//! The transport's own messages share one layout ([`F32Codec`]): a four-byte ASCII tag, then
//! little-endian `f32` values. No tag begins with the core's magic `"SY"`, so the kind of a
//! payload is decided by [`FrameKind::of`] alone, before any decoder runs, and every decoder
//! sees only payloads of its own kind.

use syncopate::ToServer;
use syncopate::wire::{self, Encoding, Limits};

pub use super::codec::F32Codec;

/// The kind of a session frame's payload, from its first bytes (see the module's table).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum FrameKind {
    /// An empty payload.
    Heartbeat,
    /// Worker 0's initial parameters.
    InitialModel,
    /// A worker's step times.
    StepTimes,
    /// What a worker's protocol refused to send for values that are not finite.
    NotFinite,
    /// A slot frame that does not match a message in the session's shared memory (one
    /// that does is decoded as the message in the slot).
    Slot,
    /// A core message (or bytes that are not one: the core's decoder says which).
    Core,
}

impl FrameKind {
    /// The kind of `payload`.
    pub fn of(payload: &[u8]) -> Self {
        if payload.is_empty() {
            Self::Heartbeat
        } else if super::initial::CODEC.is(payload) {
            Self::InitialModel
        } else if super::step_times::CODEC.is(payload) {
            Self::StepTimes
        } else if super::refusal::NOT_FINITE.is(payload) {
            Self::NotFinite
        } else if super::shm::messages::SlotFrame::is(payload) {
            Self::Slot
        } else {
            Self::Core
        }
    }
}

/// The kind of a session frame's payload from the server, as a worker reads it: a
/// heartbeat (empty), a refusal of a contribution for its loss (`"RFSD"`,
/// [`refusal`](super::refusal)), or a core message (magic `"SY"`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum FromServerKind {
    /// An empty payload.
    Heartbeat,
    /// The server refused a contribution whose loss is not finite.
    Refused,
    /// A message of the shared-memory exchange ([`shm`](super::shm)).
    SharedMemory,
    /// A core message in the worker's shared-memory slot.
    Slot,
    /// A core message (or bytes that are not one: the core's decoder says which).
    Core,
}

impl FromServerKind {
    /// The kind of `payload`.
    pub fn of(payload: &[u8]) -> Self {
        if payload.is_empty() {
            Self::Heartbeat
        } else if super::refusal::CODEC.is(payload) {
            Self::Refused
        } else if super::shm::messages::Exchange::is(payload) {
            Self::SharedMemory
        } else if super::shm::messages::SlotFrame::is(payload) {
            Self::Slot
        } else {
            Self::Core
        }
    }
}

/// A session frame from a worker, decoded and checked.
#[derive(Debug)]
pub enum InboundFrame<'a> {
    /// A heartbeat.
    Heartbeat,
    /// Worker 0's initial parameters, checked against the model's size and finite.
    InitialModel(Vec<f32>),
    /// A worker's step times, each finite and positive.
    StepTimes(Vec<f32>),
    /// What a worker's protocol refused to send.
    NotFinite(super::refusal::NotFinite),
    /// A core message.
    Core(ToServer<'a, f32>),
}

/// A session frame that did not decode: its kind and why.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct BadFrame {
    /// What the frame claimed to be.
    pub kind: FrameKind,
    /// Why it was refused.
    pub reason: String,
}

impl<'a> InboundFrame<'a> {
    /// Decodes a session frame's `payload` from a worker of a model of `dim` parameters
    /// whose core messages are bounded by `limits`.
    pub fn decode(payload: &'a [u8], limits: &Limits, dim: usize) -> Result<Self, BadFrame> {
        let kind = FrameKind::of(payload);
        let bad = |reason: String| BadFrame { kind, reason };
        match kind {
            FrameKind::Heartbeat => Ok(Self::Heartbeat),
            FrameKind::InitialModel => super::initial::decode(payload, dim).map(Self::InitialModel).map_err(bad),
            FrameKind::StepTimes => super::step_times::decode(payload).map(Self::StepTimes).map_err(bad),
            FrameKind::NotFinite => super::refusal::NotFinite::decode(payload).map(Self::NotFinite).map_err(bad),
            FrameKind::Slot => Err(bad("a shared-memory slot frame that matches no message in its slot".into())),
            FrameKind::Core => {
                wire::decode_to_server::<f32>(payload, limits).map(Self::Core).map_err(|e| bad(e.to_string()))
            }
        }
    }

    /// Whether this is a contribution (a gradient, delta or clock update), which the
    /// server's conservation ledger counts.
    pub fn is_contribution(&self) -> bool {
        matches!(self, Self::Core(ToServer::Grad { .. } | ToServer::Delta { .. } | ToServer::Clock { .. }))
    }
}

/// A frame from a session whose wire is `enc`, as the decoders take it: a core message of
/// a 16-bit wire widened to its `f32` message (into a buffer from `pool`, `buf` going back
/// `home`); every other frame as it is, and so is a core message that does not widen (the
/// decoder that follows then names what is wrong with it). Returns the buffer and the
/// payload's range in it. The widened message is bounded by the session's frame limit
/// times two, which its reader already applied.
pub fn widened(
    buf: Vec<u8>,
    range: core::ops::Range<usize>,
    pool: &crossbeam_channel::Receiver<Vec<u8>>,
    enc: Encoding,
    home: &crossbeam_channel::Sender<Vec<u8>>,
) -> (Vec<u8>, usize, usize) {
    let payload = buf.get(range.clone()).unwrap_or_default();
    if enc == Encoding::F32 || FrameKind::of(payload) != FrameKind::Core {
        return (buf, range.start, range.end);
    }
    let limits = Limits::for_model(usize::MAX);
    let Ok(len) = wire::widened_len(payload, enc, &limits) else {
        return (buf, range.start, range.end);
    };
    let mut out = pool.try_recv().unwrap_or_default();
    out.resize(len, 0);
    match wire::widen(payload, enc, &limits, &mut out) {
        Ok(n) => {
            let _ = home.try_send(buf);
            (out, 0, n)
        }
        Err(_) => (buf, range.start, range.end),
    }
}

/// Decodes a core message from the server of a session whose wire is `enc`: a 16-bit
/// wire's message widened into `wide` first, then decoded as `f32`.
pub fn decode_to_worker<'a>(
    payload: &'a [u8],
    enc: Encoding,
    limits: &Limits,
    wide: &'a mut Vec<u8>,
) -> Result<syncopate::ToWorker<'a, f32>, wire::DecodeError> {
    if enc == Encoding::F32 {
        return wire::decode_to_worker::<f32>(payload, limits);
    }
    wide.resize(wire::widened_len(payload, enc, limits)?, 0);
    let n = wire::widen(payload, enc, limits, wide)?;
    wire::decode_to_worker::<f32>(wide.get(..n).unwrap_or_default(), limits)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_payload_has_one_kind_and_decodes_as_it() {
        let limits = Limits::for_model(2);
        let init = crate::tcp::initial::encode(&[1.0, 2.0], 2).unwrap();
        let steps = crate::tcp::step_times::encode(&[0.5]).unwrap();
        let join: ToServer<'_, f32> = ToServer::Join { epoch: 3 };
        let mut core = vec![0u8; wire::encoded_len_to_server(&join)];
        let n = wire::encode_to_server(&join, &mut core).unwrap();
        core.truncate(n);
        assert_eq!(FrameKind::of(&[]), FrameKind::Heartbeat);
        assert_eq!(FrameKind::of(&init), FrameKind::InitialModel);
        assert_eq!(FrameKind::of(&steps), FrameKind::StepTimes);
        assert_eq!(FrameKind::of(&core), FrameKind::Core);
        assert!(matches!(InboundFrame::decode(&[], &limits, 2), Ok(InboundFrame::Heartbeat)));
        let decoded = InboundFrame::decode(&init, &limits, 2);
        assert!(matches!(decoded, Ok(InboundFrame::InitialModel(ref p)) if p == &[1.0, 2.0]), "{decoded:?}");
        let decoded = InboundFrame::decode(&steps, &limits, 2);
        assert!(matches!(decoded, Ok(InboundFrame::StepTimes(ref s)) if s == &[0.5]), "{decoded:?}");
        let decoded = InboundFrame::decode(&core, &limits, 2);
        assert!(matches!(decoded, Ok(InboundFrame::Core(ToServer::Join { epoch: 3 }))), "{decoded:?}");
        assert!(!decoded.unwrap().is_contribution());
        let bad = InboundFrame::decode(&init, &limits, 3).unwrap_err();
        assert_eq!(
            bad,
            BadFrame { kind: FrameKind::InitialModel, reason: "2 parameters, the server's model has 3".into() }
        );
        assert_eq!(InboundFrame::decode(b"STEP", &limits, 2).unwrap_err().kind, FrameKind::StepTimes);
        assert_eq!(InboundFrame::decode(b"xyz", &limits, 2).unwrap_err().kind, FrameKind::Core);
    }
}
