//! The wire codec: [`ToServer`] and [`ToWorker`] messages to and from bytes, into and out of
//! caller-owned buffers, without allocation.
//!
//! A message is a fixed [`HEADER_LEN`]-byte header, then the message's control fields
//! (every field except the tensor) encoded with postcard, then the tensor as raw
//! little-endian bytes of the element type `T`:
//!
//! | offset | size | field |
//! |---|---|---|
//! | 0 | 2 | magic [`MAGIC`] = `"SY"` (`53 59`) |
//! | 2 | 1 | [`WIRE_VERSION`] = 2 |
//! | 3 | 1 | [`MessageKind`]; the high bit is the direction (0: to the server, 1: to a worker) |
//! | 4 | 1 | element type tag [`Scalar::WIRE_TAG`] (4 = `f32`, 8 = `f64`), or a 16-bit [`Encoding`]'s (2 = `fp16`, `0x82` = `bf16`), also on messages without a tensor |
//! | 5 | 2 | control length, `u16` little-endian, at most [`MAX_CONTROL_LEN`] |
//! | 7 | 4 | payload length in bytes, `u32` little-endian, a multiple of the element size |
//!
//! `core/WIRE.md` is the byte-exact specification, with every control struct spelled out and
//! a worked example; the golden tests in this module pin it.
//!
//! Decoding ([`decode_to_server`], [`decode_to_worker`]) borrows: the tensor comes back as
//! [`Values::LittleEndian`] pointing into the input. It checks the header, in this order,
//! before it touches anything else: header length, magic, version, kind and direction,
//! element tag, control length, payload length against the [`Limits`] and the element size,
//! and that the input is exactly header + control + payload long. The control section must
//! decode completely and canonically, so every message has exactly one encoding and
//! `encode(decode(b)) == b` for every accepted `b`. Decoding never allocates and never
//! panics.
//!
//! Encoding ([`encode_to_server`], [`encode_to_worker`]) writes into the caller's buffer and
//! returns the number of bytes written; on a short buffer it returns
//! [`EncodeError::TooSmall`] and leaves the buffer untouched. [`encoded_len_to_server`] and
//! [`encoded_len_to_worker`] give the exact size beforehand.
//!
//! **Compressed tensors.** A session may carry its `f32` tensors in 16 bits ([`Encoding`]):
//! [`encode_to_server_as`] / [`encode_to_worker_as`] narrow them (round to nearest even, and
//! refuse a tensor with a value that is not finite once narrowed), and [`widen`] turns such a
//! message back into the `f32` message the decoders take (exactly), so everything after
//! the decoder sees `f32` alone.
//!
//! This codec frames nothing: a stream transport (the TCP adapter) adds its own length
//! prefix around each message.
//!
//! ```
//! use syncopate::wire::{self, Limits};
//! use syncopate::{ToServer, Values, Version};
//!
//! let grad = [0.5f32, -1.0, 2.0];
//! let msg = ToServer::Grad { base: Version(3), iteration: 3, seq: 7, values: Values::Slice(&grad), loss: Some(0.25) };
//! let mut buf = [0u8; 64];
//! let n = wire::encode_to_server(&msg, &mut buf).unwrap();
//! assert_eq!(n, wire::encoded_len_to_server(&msg));
//!
//! let limits = Limits::for_model(3);
//! match wire::decode_to_server::<f32>(&buf[..n], &limits).unwrap() {
//!     ToServer::Grad { base, seq, values, .. } => {
//!         assert_eq!((base, seq), (Version(3), 7));
//!         let mut out = [0.0f32; 3];
//!         values.copy_into(&mut out).unwrap();
//!         assert_eq!(out, grad);
//!     }
//!     other => panic!("decoded {}", other.kind_name()),
//! }
//! ```

mod compressed;
mod control;
mod error;
mod half;
mod header;
#[cfg(test)]
mod tests;

pub use compressed::{
    encode_to_server_as, encode_to_worker_as, encoded_len_to_server_as, encoded_len_to_worker_as, widen, widened_len,
};
pub use error::{ControlError, DecodeError, EncodeError};
pub use half::{Encoding, bf16_from_f32, f32_from_bf16, f32_from_fp16, fp16_from_f32};
pub use header::{Direction, HEADER_LEN, Header, MAGIC, MAX_CONTROL_LEN, MessageKind, WIRE_VERSION};

use crate::id::Version;
use crate::math::Scalar;
use crate::msg::{ToServer, ToWorker, Values};
use control::{
    AbortCtl, ClockCtl, Control, DeltaCtl, EmptyCtl, GradCtl, JoinCtl, ModelCtl, NotNewerCtl, PullCtl, PushAckCtl,
};

/// The largest message a decoder accepts, as the largest tensor in elements.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Limits {
    /// The largest tensor accepted, in elements (the model dimension for a server or worker
    /// of one model).
    pub max_elements: usize,
}

impl Limits {
    /// Limits for a model of `dim` parameters: tensors up to `dim` elements.
    pub const fn for_model(dim: usize) -> Self {
        Self { max_elements: dim }
    }

    /// The largest payload accepted for element type `T`, in bytes (saturating).
    pub const fn max_payload_len<T: Scalar>(&self) -> usize {
        self.max_elements.saturating_mul(T::BYTES)
    }

    /// The largest message accepted for element type `T`, in bytes (saturating):
    /// `HEADER_LEN + MAX_CONTROL_LEN + max_elements * T::BYTES`. A receive buffer of this
    /// size holds any message the decoder accepts.
    pub const fn max_message_len<T: Scalar>(&self) -> usize {
        (HEADER_LEN + MAX_CONTROL_LEN).saturating_add(self.max_payload_len::<T>())
    }
}

/// The header fields before any validation beyond length, magic and version.
struct RawHeader {
    kind: u8,
    tag: u8,
    control_len: usize,
    payload_len: usize,
}

fn read_raw_header(bytes: &[u8]) -> Result<RawHeader, DecodeError> {
    let Some(head) = bytes.first_chunk::<HEADER_LEN>() else {
        return Err(DecodeError::Truncated { needed: HEADER_LEN, got: bytes.len() });
    };
    let [m0, m1, version, kind, tag, c0, c1, p0, p1, p2, p3] = *head;
    if [m0, m1] != MAGIC {
        return Err(DecodeError::BadMagic);
    }
    if version != WIRE_VERSION {
        return Err(DecodeError::UnsupportedVersion(version));
    }
    let control_len = usize::from(u16::from_le_bytes([c0, c1]));
    let payload_len = usize::try_from(u32::from_le_bytes([p0, p1, p2, p3])).unwrap_or(usize::MAX);
    Ok(RawHeader { kind, tag, control_len, payload_len })
}

/// Checks the control length, then the payload length: zero for kinds without a tensor,
/// at most `max_payload` and a multiple of `elem` otherwise.
fn check_lengths(kind: MessageKind, raw: &RawHeader, elem: usize, max_payload: usize) -> Result<(), DecodeError> {
    if raw.control_len > MAX_CONTROL_LEN {
        return Err(DecodeError::ControlTooLarge { len: raw.control_len });
    }
    if !kind.has_payload() && raw.payload_len != 0 {
        return Err(DecodeError::UnexpectedPayload { kind });
    }
    if raw.payload_len > max_payload {
        return Err(DecodeError::TooLarge { len: raw.payload_len, max: max_payload });
    }
    if elem == 0 || raw.payload_len % elem != 0 {
        return Err(DecodeError::PayloadNotMultiple);
    }
    Ok(())
}

/// Reads and validates the header of a message whose element type is not yet known: length,
/// magic, version, kind, element tag (4 or 8, or a 16-bit [`Encoding`]'s), control length, and the payload length
/// (zero for kinds without a tensor, a multiple of the element size otherwise; no
/// [`Limits`] are applied). Only the first [`HEADER_LEN`] bytes are read; `bytes` may be a
/// prefix of the message.
pub fn peek_header(bytes: &[u8]) -> Result<Header, DecodeError> {
    let raw = read_raw_header(bytes)?;
    let kind = MessageKind::from_byte(raw.kind).ok_or(DecodeError::UnknownKind(raw.kind))?;
    let elem = match raw.tag {
        8 => 8,
        t => match Encoding::from_tag(t) {
            Some(e) => e.element_bytes(),
            None => return Err(DecodeError::UnknownScalarTag(t)),
        },
    };
    check_lengths(kind, &raw, elem, usize::MAX)?;
    Ok(Header { kind, scalar_tag: raw.tag, control_len: raw.control_len, payload_len: raw.payload_len })
}

/// A message split into its sections after every header check.
struct Sections<'a> {
    kind: MessageKind,
    control: &'a [u8],
    payload: &'a [u8],
}

fn split<'a, T: Scalar>(bytes: &'a [u8], direction: Direction, limits: &Limits) -> Result<Sections<'a>, DecodeError> {
    let raw = read_raw_header(bytes)?;
    let kind = MessageKind::from_byte(raw.kind).ok_or(DecodeError::UnknownKind(raw.kind))?;
    if kind.direction() != direction {
        return Err(DecodeError::WrongDirection);
    }
    if raw.tag != T::WIRE_TAG {
        return Err(DecodeError::ScalarMismatch { expected: T::WIRE_TAG, got: raw.tag });
    }
    check_lengths(kind, &raw, T::BYTES, limits.max_payload_len::<T>())?;
    let body_end = HEADER_LEN + raw.control_len;
    let total = body_end.saturating_add(raw.payload_len);
    if bytes.len() < total {
        return Err(DecodeError::Truncated { needed: total, got: bytes.len() });
    }
    if bytes.len() > total {
        return Err(DecodeError::TrailingBytes { extra: bytes.len() - total });
    }
    match (bytes.get(HEADER_LEN..body_end), bytes.get(body_end..)) {
        (Some(control), Some(payload)) => Ok(Sections { kind, control, payload }),
        // Unreachable: `bytes.len() == total >= body_end`.
        _ => Err(DecodeError::Truncated { needed: total, got: bytes.len() }),
    }
}

/// Decodes a worker-to-server message. The tensor of `Grad`, `Delta` and `Clock` comes back
/// as [`Values::LittleEndian`] borrowing from `bytes`. Never allocates or panics.
pub fn decode_to_server<'a, T: Scalar>(bytes: &'a [u8], limits: &Limits) -> Result<ToServer<'a, T>, DecodeError> {
    let Sections { kind, control, payload } = split::<T>(bytes, Direction::ToServer, limits)?;
    let values = Values::LittleEndian(payload);
    Ok(match kind {
        MessageKind::Join => {
            let c: JoinCtl = control::decode(control)?;
            ToServer::Join { epoch: c.epoch }
        }
        MessageKind::Grad => {
            let c: GradCtl = control::decode(control)?;
            ToServer::Grad { base: Version(c.base), iteration: c.iteration, seq: c.seq, values, loss: c.loss }
        }
        MessageKind::Delta => {
            let c: DeltaCtl = control::decode(control)?;
            ToServer::Delta { round: Version(c.round), local_steps: c.local_steps, seq: c.seq, values, loss: c.loss }
        }
        MessageKind::Pull => {
            let c: PullCtl = control::decode(control)?;
            ToServer::Pull { have: Version(c.have), min_clock: c.min_clock }
        }
        MessageKind::Clock => {
            let c: ClockCtl = control::decode(control)?;
            ToServer::Clock { clock: c.clock, seq: c.seq, values, loss: c.loss }
        }
        MessageKind::Leave => {
            let EmptyCtl = control::decode(control)?;
            ToServer::Leave
        }
        // Unreachable: `split` checked the direction.
        MessageKind::Model | MessageKind::NotNewer | MessageKind::PushAck | MessageKind::Abort | MessageKind::Stop => {
            return Err(DecodeError::WrongDirection);
        }
    })
}

/// Decodes a server-to-worker message. The tensor of `Model` comes back as
/// [`Values::LittleEndian`] borrowing from `bytes`. Never allocates or panics.
pub fn decode_to_worker<'a, T: Scalar>(bytes: &'a [u8], limits: &Limits) -> Result<ToWorker<'a, T>, DecodeError> {
    let Sections { kind, control, payload } = split::<T>(bytes, Direction::ToWorker, limits)?;
    Ok(match kind {
        MessageKind::Model => {
            let c: ModelCtl = control::decode(control)?;
            ToWorker::Model { version: Version(c.version), clock: c.clock, values: Values::LittleEndian(payload) }
        }
        MessageKind::NotNewer => {
            let c: NotNewerCtl = control::decode(control)?;
            ToWorker::NotNewer { version: Version(c.version) }
        }
        MessageKind::PushAck => {
            let c: PushAckCtl = control::decode(control)?;
            ToWorker::PushAck { round: Version(c.round), pull_now: c.pull_now }
        }
        MessageKind::Abort => {
            let c: AbortCtl = control::decode(control)?;
            ToWorker::Abort { iteration: c.iteration }
        }
        MessageKind::Stop => {
            let EmptyCtl = control::decode(control)?;
            ToWorker::Stop
        }
        // Unreachable: `split` checked the direction.
        MessageKind::Join
        | MessageKind::Grad
        | MessageKind::Delta
        | MessageKind::Pull
        | MessageKind::Clock
        | MessageKind::Leave => return Err(DecodeError::WrongDirection),
    })
}

/// The control struct and payload of a `ToServer` message.
fn server_parts<'m, 'a, T>(msg: &'m ToServer<'a, T>) -> (Control, Option<&'m Values<'a, T>>) {
    match msg {
        ToServer::Join { epoch } => (Control::Join(JoinCtl { epoch: *epoch }), None),
        ToServer::Grad { base, iteration, seq, values, loss } => {
            (Control::Grad(GradCtl { base: base.0, iteration: *iteration, seq: *seq, loss: *loss }), Some(values))
        }
        ToServer::Delta { round, local_steps, seq, values, loss } => (
            Control::Delta(DeltaCtl { round: round.0, local_steps: *local_steps, seq: *seq, loss: *loss }),
            Some(values),
        ),
        ToServer::Pull { have, min_clock } => (Control::Pull(PullCtl { have: have.0, min_clock: *min_clock }), None),
        ToServer::Clock { clock, seq, values, loss } => {
            (Control::Clock(ClockCtl { clock: *clock, seq: *seq, loss: *loss }), Some(values))
        }
        ToServer::Leave => (Control::Leave, None),
    }
}

/// The control struct and payload of a `ToWorker` message.
fn worker_parts<'m, 'a, T>(msg: &'m ToWorker<'a, T>) -> (Control, Option<&'m Values<'a, T>>) {
    match msg {
        ToWorker::Model { version, clock, values } => {
            (Control::Model(ModelCtl { version: version.0, clock: *clock }), Some(values))
        }
        ToWorker::NotNewer { version } => (Control::NotNewer(NotNewerCtl { version: version.0 }), None),
        ToWorker::PushAck { round, pull_now } => {
            (Control::PushAck(PushAckCtl { round: round.0, pull_now: *pull_now }), None)
        }
        ToWorker::Abort { iteration } => (Control::Abort(AbortCtl { iteration: *iteration }), None),
        ToWorker::Stop => (Control::Stop, None),
    }
}

/// The payload's length in bytes (saturating; for a `LittleEndian` payload, its length).
fn payload_len<T: Scalar>(values: Option<&Values<'_, T>>) -> usize {
    match values {
        None => 0,
        Some(Values::Slice(s)) => s.len().saturating_mul(T::BYTES),
        Some(Values::LittleEndian(b)) => b.len(),
    }
}

fn encoded_len<T: Scalar>(control: &Control, values: Option<&Values<'_, T>>) -> usize {
    (HEADER_LEN + control.encoded_len()).saturating_add(payload_len(values))
}

/// The exact number of bytes [`encode_to_server`] writes for `msg` (saturating at
/// `usize::MAX` for a tensor too large to address).
pub fn encoded_len_to_server<T: Scalar>(msg: &ToServer<'_, T>) -> usize {
    let (control, values) = server_parts(msg);
    encoded_len(&control, values)
}

/// The exact number of bytes [`encode_to_worker`] writes for `msg` (saturating at
/// `usize::MAX` for a tensor too large to address).
pub fn encoded_len_to_worker<T: Scalar>(msg: &ToWorker<'_, T>) -> usize {
    let (control, values) = worker_parts(msg);
    encoded_len(&control, values)
}

/// Writes `values` as little-endian bytes into `out`, which is exactly as long as the
/// payload (checked by the caller).
fn write_payload<T: Scalar>(values: &Values<'_, T>, out: &mut [u8]) {
    match values {
        Values::Slice(s) => {
            // One fixed-size store per element; with `T::BYTES` a constant this is a plain
            // (vectorised) copy on little-endian hosts and a byte swap loop on big-endian ones.
            for (chunk, x) in out.chunks_exact_mut(T::BYTES).zip(s.iter()) {
                let _ = x.write_le(chunk);
            }
        }
        Values::LittleEndian(b) => {
            if let Some(dst) = out.get_mut(..b.len()) {
                dst.copy_from_slice(b);
            }
        }
    }
}

fn encode<T: Scalar>(control: &Control, values: Option<&Values<'_, T>>, out: &mut [u8]) -> Result<usize, EncodeError> {
    let payload_len = match values {
        Some(Values::LittleEndian(b)) if b.len() % T::BYTES != 0 => {
            return Err(EncodeError::PayloadNotMultiple { len: b.len() });
        }
        v => payload_len(v),
    };
    encode_raw(control, T::WIRE_TAG, payload_len, out, |payload_out| {
        if let Some(values) = values {
            write_payload(values, payload_out);
        }
    })
}

/// Writes the header (with element tag `tag`), the control section and, through `write`,
/// a payload of exactly `payload_len` bytes; all checks come before the first byte written.
fn encode_raw(
    control: &Control,
    tag: u8,
    payload_len: usize,
    out: &mut [u8],
    write: impl FnOnce(&mut [u8]),
) -> Result<usize, EncodeError> {
    let Ok(payload_len_field) = u32::try_from(payload_len) else {
        return Err(EncodeError::PayloadTooLarge { bytes: payload_len });
    };
    let ctl = control.encode().ok_or(EncodeError::Control)?;
    let ctl = ctl.as_bytes();
    let Ok(control_len_field) = u16::try_from(ctl.len()) else {
        return Err(EncodeError::Control);
    };
    let body_end = HEADER_LEN + ctl.len();
    let required = body_end.saturating_add(payload_len);
    let Some(out) = out.get_mut(..required) else {
        return Err(EncodeError::TooSmall { required });
    };
    // `out` is exactly `required` bytes long from here on; nothing below can fail.
    let (head, body) = out.split_at_mut(HEADER_LEN.min(required));
    let (ctl_out, payload_out) = body.split_at_mut(ctl.len().min(body.len()));
    let [c0, c1] = control_len_field.to_le_bytes();
    let [p0, p1, p2, p3] = payload_len_field.to_le_bytes();
    let [m0, m1] = MAGIC;
    head.copy_from_slice(&[m0, m1, WIRE_VERSION, control.kind().byte(), tag, c0, c1, p0, p1, p2, p3]);
    ctl_out.copy_from_slice(ctl);
    write(payload_out);
    Ok(required)
}

/// Encodes a worker-to-server message into `out` and returns the number of bytes written
/// ([`encoded_len_to_server`]). On a short buffer returns [`EncodeError::TooSmall`] and
/// writes nothing; so does every other error.
pub fn encode_to_server<T: Scalar>(msg: &ToServer<'_, T>, out: &mut [u8]) -> Result<usize, EncodeError> {
    let (control, values) = server_parts(msg);
    encode(&control, values, out)
}

/// Encodes a server-to-worker message into `out` and returns the number of bytes written
/// ([`encoded_len_to_worker`]). On a short buffer returns [`EncodeError::TooSmall`] and
/// writes nothing; so does every other error.
pub fn encode_to_worker<T: Scalar>(msg: &ToWorker<'_, T>, out: &mut [u8]) -> Result<usize, EncodeError> {
    let (control, values) = worker_parts(msg);
    encode(&control, values, out)
}
