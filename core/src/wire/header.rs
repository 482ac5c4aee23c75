//! The fixed header: its constants, the kind byte with its direction, and the validated
//! [`Header`]. Every other file of the codec builds on these; they name nothing else in it.

#[cfg(doc)]
use crate::msg::{ToServer, ToWorker};

/// The first two bytes of every message.
pub const MAGIC: [u8; 2] = *b"SY";

/// The wire version this build speaks (byte 2 of the header). Version 2 added the optional
/// minibatch loss to `Grad`, `Delta` and `Clock`; a message of any other version is refused
/// with [`DecodeError::UnsupportedVersion`](super::DecodeError::UnsupportedVersion), which
/// names both versions.
pub const WIRE_VERSION: u8 = 2;

/// The size of the fixed header.
pub const HEADER_LEN: usize = 11;

/// The largest control section of any message kind: `Grad` with three `u64` fields of ten
/// varint bytes each and a present loss (five bytes). A test asserts this against the
/// encoding of `u64::MAX` fields.
pub const MAX_CONTROL_LEN: usize = 35;

/// Which way a message travels.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Direction {
    /// Worker to server ([`ToServer`]); kind bytes `0x01..=0x06`.
    ToServer,
    /// Server to worker ([`ToWorker`]); kind bytes `0x81..=0x85`.
    ToWorker,
}

/// The kind byte of the header (offset 3). The high bit is the [`Direction`].
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
#[repr(u8)]
pub enum MessageKind {
    /// [`ToServer::Join`].
    Join = 0x01,
    /// [`ToServer::Grad`] (has a tensor).
    Grad = 0x02,
    /// [`ToServer::Delta`] (has a tensor).
    Delta = 0x03,
    /// [`ToServer::Pull`].
    Pull = 0x04,
    /// [`ToServer::Clock`] (has a tensor).
    Clock = 0x05,
    /// [`ToServer::Leave`].
    Leave = 0x06,
    /// [`ToWorker::Model`] (has a tensor).
    Model = 0x81,
    /// [`ToWorker::NotNewer`].
    NotNewer = 0x82,
    /// [`ToWorker::PushAck`].
    PushAck = 0x83,
    /// [`ToWorker::Abort`].
    Abort = 0x84,
    /// [`ToWorker::Stop`].
    Stop = 0x85,
}

impl MessageKind {
    /// Every kind, in kind-byte order.
    pub const ALL: [Self; 11] = [
        Self::Join,
        Self::Grad,
        Self::Delta,
        Self::Pull,
        Self::Clock,
        Self::Leave,
        Self::Model,
        Self::NotNewer,
        Self::PushAck,
        Self::Abort,
        Self::Stop,
    ];

    /// The kind byte.
    pub const fn byte(self) -> u8 {
        self as u8
    }

    /// The kind of a kind byte, if it names one.
    pub const fn from_byte(b: u8) -> Option<Self> {
        Some(match b {
            0x01 => Self::Join,
            0x02 => Self::Grad,
            0x03 => Self::Delta,
            0x04 => Self::Pull,
            0x05 => Self::Clock,
            0x06 => Self::Leave,
            0x81 => Self::Model,
            0x82 => Self::NotNewer,
            0x83 => Self::PushAck,
            0x84 => Self::Abort,
            0x85 => Self::Stop,
            _ => return None,
        })
    }

    /// Which way messages of this kind travel.
    pub const fn direction(self) -> Direction {
        if self.byte() & 0x80 == 0 { Direction::ToServer } else { Direction::ToWorker }
    }

    /// Whether messages of this kind carry a tensor payload (the others must announce a
    /// payload length of 0).
    pub const fn has_payload(self) -> bool {
        matches!(self, Self::Grad | Self::Delta | Self::Clock | Self::Model)
    }

    /// The message kind's name, as [`ToServer::kind_name`] / [`ToWorker::kind_name`] say it.
    pub const fn name(self) -> &'static str {
        match self {
            Self::Join => "Join",
            Self::Grad => "Grad",
            Self::Delta => "Delta",
            Self::Pull => "Pull",
            Self::Clock => "Clock",
            Self::Leave => "Leave",
            Self::Model => "Model",
            Self::NotNewer => "NotNewer",
            Self::PushAck => "PushAck",
            Self::Abort => "Abort",
            Self::Stop => "Stop",
        }
    }
}

/// A validated header, as [`peek_header`](super::peek_header) returns it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Header {
    /// The message kind (and so its direction).
    pub kind: MessageKind,
    /// The element type tag: 4 (`f32`) or 8 (`f64`).
    pub scalar_tag: u8,
    /// The control section's length in bytes, at most [`MAX_CONTROL_LEN`].
    pub control_len: usize,
    /// The payload's length in bytes: a multiple of the element size, 0 for kinds without a
    /// tensor.
    pub payload_len: usize,
}

impl Header {
    /// Which way the message travels.
    pub const fn direction(&self) -> Direction {
        self.kind.direction()
    }

    /// The whole message's length: header + control + payload (saturating).
    pub const fn message_len(&self) -> usize {
        (HEADER_LEN + self.control_len).saturating_add(self.payload_len)
    }
}
