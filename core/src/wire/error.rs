//! The codec's errors: [`EncodeError`], [`DecodeError`] and [`ControlError`].

use super::MessageKind;
use core::fmt;

/// Why a message could not be encoded. On any error the output buffer is untouched.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub enum EncodeError {
    /// The output buffer is shorter than the encoding.
    TooSmall {
        /// Bytes the encoding needs (what `encoded_len_*` returns).
        required: usize,
    },
    /// A [`Values::LittleEndian`](crate::Values::LittleEndian) payload whose length is not a
    /// multiple of the element size.
    PayloadNotMultiple {
        /// The payload's length in bytes.
        len: usize,
    },
    /// The payload is longer than the header's 32-bit length field can say.
    PayloadTooLarge {
        /// The payload's length in bytes (saturated at `usize::MAX`).
        bytes: usize,
    },
    /// The control fields did not fit in [`MAX_CONTROL_LEN`](super::MAX_CONTROL_LEN) bytes.
    /// No message of this wire version does this (a test checks the largest); the variant
    /// exists so that encoding has no panicking path.
    Control,
    /// A value of the tensor is not finite once in the wire's 16-bit encoding: NaN or ±∞, or
    /// a finite `f32` beyond the encoding's range.
    NotFinite {
        /// The value's index in the tensor.
        index: usize,
        /// The encoding.
        encoding: super::Encoding,
    },
}

impl fmt::Display for EncodeError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Self::TooSmall { required } => write!(f, "output buffer too small: {required} bytes required"),
            Self::PayloadNotMultiple { len } => {
                write!(f, "little-endian payload of {len} bytes is not a whole number of elements")
            }
            Self::PayloadTooLarge { bytes } => write!(f, "payload of {bytes} bytes exceeds the 32-bit length field"),
            Self::Control => f.write_str("control fields exceed the maximum control length"),
            Self::NotFinite { index, encoding } => {
                write!(f, "value {index} of the tensor is not finite in {encoding}")
            }
        }
    }
}

impl core::error::Error for EncodeError {}

/// Why bytes were refused as a message. Decoding checks the header fields in the order of
/// the variants below, before it looks at the control section or the payload.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub enum DecodeError {
    /// Fewer bytes than the header, or than the header's lengths announce.
    Truncated {
        /// Bytes needed: the header length, or header + control + payload.
        needed: usize,
        /// Bytes given.
        got: usize,
    },
    /// The first two bytes are not `"SY"`.
    BadMagic,
    /// A wire version this build does not speak.
    UnsupportedVersion(u8),
    /// A kind byte that names no message.
    UnknownKind(u8),
    /// A known message kind for the other direction (a `ToWorker` message given to
    /// `decode_to_server`, or the reverse).
    WrongDirection,
    /// The element type tag is not the decoder's `T::WIRE_TAG`.
    ScalarMismatch {
        /// The decoder's tag (4 for `f32`, 8 for `f64`).
        expected: u8,
        /// The tag in the header.
        got: u8,
    },
    /// [`peek_header`](super::peek_header) only: the element type tag is neither 4 nor 8.
    UnknownScalarTag(u8),
    /// The control section is longer than [`MAX_CONTROL_LEN`](super::MAX_CONTROL_LEN).
    ControlTooLarge {
        /// The announced control length.
        len: usize,
    },
    /// A message kind without a tensor announced a non-empty payload.
    UnexpectedPayload {
        /// The kind.
        kind: MessageKind,
    },
    /// The payload is larger than the [`Limits`](super::Limits) allow.
    TooLarge {
        /// The announced payload length in bytes.
        len: usize,
        /// The largest payload accepted, in bytes.
        max: usize,
    },
    /// The payload length is not a multiple of the element size.
    PayloadNotMultiple,
    /// More bytes than header + control + payload.
    TrailingBytes {
        /// The number of bytes past the end of the message.
        extra: usize,
    },
    /// The control section is not a valid postcard encoding of the kind's fields.
    Control(ControlError),
    /// The control fields were decoded before the end of the control section.
    ControlNotConsumed {
        /// Bytes left over.
        extra: usize,
    },
    /// The control section decodes but is not the canonical encoding of its value (an
    /// overlong varint); every message has exactly one encoding.
    NonCanonical,
    /// [`widen`](super::widen) only: the output buffer is shorter than the widened message.
    OutputTooSmall {
        /// Bytes the widened message needs ([`widened_len`](super::widened_len)).
        required: usize,
    },
}

impl fmt::Display for DecodeError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Self::Truncated { needed, got } => write!(f, "truncated message: {needed} bytes needed, {got} given"),
            Self::BadMagic => f.write_str("bad magic (not a syncopate message)"),
            Self::UnsupportedVersion(v) => {
                write!(f, "peer speaks wire version {v}, this build speaks wire version {}", super::WIRE_VERSION)
            }
            Self::UnknownKind(k) => write!(f, "unknown message kind 0x{k:02x}"),
            Self::WrongDirection => f.write_str("message kind for the other direction"),
            Self::ScalarMismatch { expected, got } => {
                write!(f, "element type tag {got}, expected {expected}")
            }
            Self::UnknownScalarTag(t) => write!(f, "unknown element type tag {t}"),
            Self::ControlTooLarge { len } => {
                write!(f, "control section of {len} bytes exceeds {}", super::MAX_CONTROL_LEN)
            }
            Self::UnexpectedPayload { kind } => write!(f, "{} message with a payload", kind.name()),
            Self::TooLarge { len, max } => write!(f, "payload of {len} bytes exceeds the limit of {max}"),
            Self::PayloadNotMultiple => f.write_str("payload length is not a multiple of the element size"),
            Self::TrailingBytes { extra } => write!(f, "{extra} trailing bytes after the message"),
            Self::Control(e) => write!(f, "bad control section: {e}"),
            Self::ControlNotConsumed { extra } => write!(f, "{extra} unused bytes in the control section"),
            Self::NonCanonical => f.write_str("non-canonical control encoding"),
            Self::OutputTooSmall { required } => write!(f, "output buffer too small: {required} bytes required"),
        }
    }
}

impl core::error::Error for DecodeError {}

/// A copyable summary of the postcard error met while decoding a control section.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub enum ControlError {
    /// The section ended inside a field.
    UnexpectedEnd,
    /// A varint longer than its type allows, or with bits beyond the type's width.
    BadVarint,
    /// A `bool` byte other than 0 or 1.
    BadBool,
    /// Any other postcard error.
    Other,
}

impl From<postcard::Error> for ControlError {
    fn from(e: postcard::Error) -> Self {
        match e {
            postcard::Error::DeserializeUnexpectedEnd => Self::UnexpectedEnd,
            postcard::Error::DeserializeBadVarint => Self::BadVarint,
            postcard::Error::DeserializeBadBool => Self::BadBool,
            _ => Self::Other,
        }
    }
}

impl fmt::Display for ControlError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            Self::UnexpectedEnd => "unexpected end of the control section",
            Self::BadVarint => "bad varint",
            Self::BadBool => "bad bool (not 0 or 1)",
            Self::Other => "malformed control fields",
        })
    }
}

impl core::error::Error for ControlError {}
