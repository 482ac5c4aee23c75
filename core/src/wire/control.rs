//! The control sections: one small postcard-encoded struct per message kind, holding every
//! field of the message except its tensor.
//!
//! postcard encodes a struct as its fields in declaration order with no names, tags or
//! lengths; every unsigned integer wider than a byte as a LEB128 varint; a `bool` as one byte
//! `0x00` or `0x01`; an `Option<f32>` as `0x00` (none) or `0x01` followed by the
//! four little-endian bytes of the `f32`. A struct without fields encodes to nothing. `core/WIRE.md` spells this
//! out; the golden tests pin it.

use super::{DecodeError, MAX_CONTROL_LEN, MessageKind};
use serde::de::DeserializeOwned;
use serde::{Deserialize, Serialize};

/// `Join` (kind 0x01).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub(super) struct JoinCtl {
    pub(super) epoch: u32,
}

/// `Grad` (kind 0x02); the gradient follows as the payload.
#[derive(Clone, Copy, Debug, PartialEq, Serialize, Deserialize)]
pub(super) struct GradCtl {
    pub(super) base: u64,
    pub(super) iteration: u64,
    pub(super) seq: u64,
    pub(super) loss: Option<f32>,
}

/// `Delta` (kind 0x03); the delta follows as the payload.
#[derive(Clone, Copy, Debug, PartialEq, Serialize, Deserialize)]
pub(super) struct DeltaCtl {
    pub(super) round: u64,
    pub(super) local_steps: u32,
    pub(super) seq: u64,
    pub(super) loss: Option<f32>,
}

/// `Pull` (kind 0x04).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub(super) struct PullCtl {
    pub(super) have: u64,
    pub(super) min_clock: u64,
}

/// `Clock` (kind 0x05); the update follows as the payload.
#[derive(Clone, Copy, Debug, PartialEq, Serialize, Deserialize)]
pub(super) struct ClockCtl {
    pub(super) clock: u64,
    pub(super) seq: u64,
    pub(super) loss: Option<f32>,
}

/// `Model` (kind 0x81); the parameters follow as the payload.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub(super) struct ModelCtl {
    pub(super) version: u64,
    pub(super) clock: u64,
}

/// `NotNewer` (kind 0x82).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub(super) struct NotNewerCtl {
    pub(super) version: u64,
}

/// `PushAck` (kind 0x83).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub(super) struct PushAckCtl {
    pub(super) round: u64,
    pub(super) pull_now: bool,
}

/// `Abort` (kind 0x84).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub(super) struct AbortCtl {
    pub(super) iteration: u64,
}

/// `Leave` (0x06) and `Stop` (0x85): no control fields, an empty section.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub(super) struct EmptyCtl;

/// A control section's bytes, encoded on the stack.
pub(super) struct Encoded {
    buf: [u8; MAX_CONTROL_LEN],
    len: usize,
}

impl Encoded {
    pub(super) fn as_bytes(&self) -> &[u8] {
        self.buf.get(..self.len).unwrap_or(&[])
    }
}

/// Encodes `ctl` into a stack buffer of [`MAX_CONTROL_LEN`] bytes; `None` only if it does not
/// fit, which the `max_control_len_is_the_largest_encoding` test rules out for every kind.
pub(super) fn encode<C: Serialize>(ctl: &C) -> Option<Encoded> {
    let mut buf = [0u8; MAX_CONTROL_LEN];
    let len = postcard::to_slice(ctl, &mut buf).ok()?.len();
    Some(Encoded { buf, len })
}

/// The encoded length of `ctl` (without writing it anywhere).
pub(super) fn encoded_len<C: Serialize>(ctl: &C) -> usize {
    postcard::experimental::serialized_size(ctl).unwrap_or(MAX_CONTROL_LEN)
}

/// Decodes a whole control section. Refuses a section with bytes left over, and a
/// non-canonical one (an overlong varint such as `80 00` for 0): re-encoding the decoded
/// value must give back exactly `bytes`, so each message has one encoding.
pub(super) fn decode<C: Serialize + DeserializeOwned>(bytes: &[u8]) -> Result<C, DecodeError> {
    let (ctl, rest) = postcard::take_from_bytes::<C>(bytes).map_err(|e| DecodeError::Control(e.into()))?;
    if !rest.is_empty() {
        return Err(DecodeError::ControlNotConsumed { extra: rest.len() });
    }
    match encode(&ctl) {
        Some(enc) if enc.as_bytes() == bytes => Ok(ctl),
        _ => Err(DecodeError::NonCanonical),
    }
}

/// The control struct of any message, tagged with its kind.
#[derive(Clone, Copy, Debug, PartialEq)]
pub(super) enum Control {
    Join(JoinCtl),
    Grad(GradCtl),
    Delta(DeltaCtl),
    Pull(PullCtl),
    Clock(ClockCtl),
    Leave,
    Model(ModelCtl),
    NotNewer(NotNewerCtl),
    PushAck(PushAckCtl),
    Abort(AbortCtl),
    Stop,
}

impl Control {
    pub(super) const fn kind(&self) -> MessageKind {
        match self {
            Self::Join(_) => MessageKind::Join,
            Self::Grad(_) => MessageKind::Grad,
            Self::Delta(_) => MessageKind::Delta,
            Self::Pull(_) => MessageKind::Pull,
            Self::Clock(_) => MessageKind::Clock,
            Self::Leave => MessageKind::Leave,
            Self::Model(_) => MessageKind::Model,
            Self::NotNewer(_) => MessageKind::NotNewer,
            Self::PushAck(_) => MessageKind::PushAck,
            Self::Abort(_) => MessageKind::Abort,
            Self::Stop => MessageKind::Stop,
        }
    }

    pub(super) fn encode(&self) -> Option<Encoded> {
        match self {
            Self::Join(c) => encode(c),
            Self::Grad(c) => encode(c),
            Self::Delta(c) => encode(c),
            Self::Pull(c) => encode(c),
            Self::Clock(c) => encode(c),
            Self::Model(c) => encode(c),
            Self::NotNewer(c) => encode(c),
            Self::PushAck(c) => encode(c),
            Self::Abort(c) => encode(c),
            Self::Leave | Self::Stop => encode(&EmptyCtl),
        }
    }

    pub(super) fn encoded_len(&self) -> usize {
        match self {
            Self::Join(c) => encoded_len(c),
            Self::Grad(c) => encoded_len(c),
            Self::Delta(c) => encoded_len(c),
            Self::Pull(c) => encoded_len(c),
            Self::Clock(c) => encoded_len(c),
            Self::Model(c) => encoded_len(c),
            Self::NotNewer(c) => encoded_len(c),
            Self::PushAck(c) => encoded_len(c),
            Self::Abort(c) => encoded_len(c),
            Self::Leave | Self::Stop => encoded_len(&EmptyCtl),
        }
    }
}
