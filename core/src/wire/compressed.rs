//! Core messages whose tensor travels in a 16-bit [`Encoding`]: encoding with narrowing,
//! and widening back to the `f32` message the decoders take.
//!
//! A compressed message is the `f32` message with the header's element tag set to the
//! encoding's and each element in two little-endian bytes; its payload length counts those
//! bytes. [`widen`] checks the header exactly as the decoders do (magic, version, kind, tag,
//! lengths against the [`Limits`], exact total length), then writes the `f32` message:
//! tag 4, payload length doubled, control section copied, each element widened exactly.
//! The control section and the direction are left to the decoder that follows.

use super::control::Control;
use super::half::{Encoding, bf16_from_f32, f32_from_bf16, f32_from_fp16, fp16_from_f32};
use super::{
    DecodeError, EncodeError, HEADER_LEN, Limits, MessageKind, check_lengths, encode, encode_raw, read_raw_header,
    server_parts, worker_parts,
};
use crate::msg::{ToServer, ToWorker, Values};

/// The little-endian `f32`s of a payload (whole elements only).
fn le_f32s(b: &[u8]) -> impl Iterator<Item = f32> + '_ {
    b.chunks_exact(4).map(|c| c.try_into().map_or(f32::NAN, f32::from_le_bytes))
}

/// The number of elements of a payload; a little-endian payload must hold whole `f32`s.
fn elements(values: Option<&Values<'_, f32>>) -> Result<usize, EncodeError> {
    match values {
        None => Ok(0),
        Some(Values::Slice(s)) => Ok(s.len()),
        Some(Values::LittleEndian(b)) if b.len() % 4 != 0 => Err(EncodeError::PayloadNotMultiple { len: b.len() }),
        Some(Values::LittleEndian(b)) => Ok(b.len() / 4),
    }
}

/// Writes each value narrowed to `enc` (one loop per encoding, its conversion inlined).
fn narrow_into(enc: Encoding, values: impl Iterator<Item = f32>, out: &mut [u8]) {
    let pairs = out.chunks_exact_mut(2).zip(values);
    match enc {
        Encoding::Fp16 => pairs.for_each(|(c, x)| c.copy_from_slice(&fp16_from_f32(x).to_le_bytes())),
        Encoding::F32 | Encoding::Bf16 => pairs.for_each(|(c, x)| c.copy_from_slice(&bf16_from_f32(x).to_le_bytes())),
    }
}

/// Writes each 16-bit element of `src` widened from `enc` (one loop per encoding).
fn widen_into(enc: Encoding, src: &[u8], out: &mut [u8]) {
    let pairs = out.chunks_exact_mut(4).zip(src.chunks_exact(2).map(|c| c.try_into().map_or(0, u16::from_le_bytes)));
    match enc {
        Encoding::Fp16 => pairs.for_each(|(d, h)| d.copy_from_slice(&f32_from_fp16(h).to_le_bytes())),
        Encoding::F32 | Encoding::Bf16 => pairs.for_each(|(d, h)| d.copy_from_slice(&f32_from_bf16(h).to_le_bytes())),
    }
}

fn encode_as(
    control: &Control,
    values: Option<&Values<'_, f32>>,
    enc: Encoding,
    out: &mut [u8],
) -> Result<usize, EncodeError> {
    if enc == Encoding::F32 {
        return encode(control, values, out);
    }
    let n = elements(values)?;
    let first_bad = match values {
        None => None,
        Some(Values::Slice(s)) => enc.first_not_carried(s.iter().copied()),
        Some(Values::LittleEndian(b)) => enc.first_not_carried(le_f32s(b)),
    };
    if let Some(index) = first_bad {
        return Err(EncodeError::NotFinite { index, encoding: enc });
    }
    encode_raw(control, enc.tag(), n.saturating_mul(2), out, |payload| match values {
        None => {}
        Some(Values::Slice(s)) => narrow_into(enc, s.iter().copied(), payload),
        Some(Values::LittleEndian(b)) => narrow_into(enc, le_f32s(b), payload),
    })
}

fn encoded_len_as(control: &Control, values: Option<&Values<'_, f32>>, enc: Encoding) -> usize {
    let n = match values {
        None => 0,
        Some(Values::Slice(s)) => s.len(),
        Some(Values::LittleEndian(b)) => b.len() / 4,
    };
    (HEADER_LEN + control.encoded_len()).saturating_add(n.saturating_mul(enc.element_bytes()))
}

/// The exact number of bytes [`encode_to_server_as`] writes for `msg` in `enc` (saturating).
pub fn encoded_len_to_server_as(msg: &ToServer<'_, f32>, enc: Encoding) -> usize {
    let (control, values) = server_parts(msg);
    encoded_len_as(&control, values, enc)
}

/// The exact number of bytes [`encode_to_worker_as`] writes for `msg` in `enc` (saturating).
pub fn encoded_len_to_worker_as(msg: &ToWorker<'_, f32>, enc: Encoding) -> usize {
    let (control, values) = worker_parts(msg);
    encoded_len_as(&control, values, enc)
}

/// Encodes a worker-to-server message with its tensor in `enc` (for [`Encoding::F32`],
/// exactly [`encode_to_server`](super::encode_to_server)). A tensor with a value that is
/// not finite in `enc` is refused ([`EncodeError::NotFinite`]); on any error nothing is
/// written.
pub fn encode_to_server_as(msg: &ToServer<'_, f32>, enc: Encoding, out: &mut [u8]) -> Result<usize, EncodeError> {
    let (control, values) = server_parts(msg);
    encode_as(&control, values, enc, out)
}

/// Encodes a server-to-worker message with its tensor in `enc`; as
/// [`encode_to_server_as`].
pub fn encode_to_worker_as(msg: &ToWorker<'_, f32>, enc: Encoding, out: &mut [u8]) -> Result<usize, EncodeError> {
    let (control, values) = worker_parts(msg);
    encode_as(&control, values, enc, out)
}

/// A message in `enc` after the header checks: its kind, control section and payload.
struct Checked<'a> {
    kind: u8,
    control: &'a [u8],
    payload: &'a [u8],
    widened: usize,
}

fn check<'a>(bytes: &'a [u8], enc: Encoding, limits: &Limits) -> Result<Checked<'a>, DecodeError> {
    let raw = read_raw_header(bytes)?;
    let kind = MessageKind::from_byte(raw.kind).ok_or(DecodeError::UnknownKind(raw.kind))?;
    if raw.tag != enc.tag() {
        return Err(DecodeError::ScalarMismatch { expected: enc.tag(), got: raw.tag });
    }
    let elem = enc.element_bytes();
    check_lengths(kind, &raw, elem, limits.max_elements.saturating_mul(elem))?;
    let body_end = HEADER_LEN + raw.control_len;
    let total = body_end.saturating_add(raw.payload_len);
    if bytes.len() < total {
        return Err(DecodeError::Truncated { needed: total, got: bytes.len() });
    }
    if bytes.len() > total {
        return Err(DecodeError::TrailingBytes { extra: bytes.len() - total });
    }
    let wide_payload = (raw.payload_len / elem).saturating_mul(4);
    if u32::try_from(wide_payload).is_err() {
        return Err(DecodeError::TooLarge { len: raw.payload_len, max: (u32::MAX / 4) as usize * elem });
    }
    match (bytes.get(HEADER_LEN..body_end), bytes.get(body_end..)) {
        (Some(control), Some(payload)) => {
            Ok(Checked { kind: raw.kind, control, payload, widened: body_end.saturating_add(wide_payload) })
        }
        // Unreachable: `bytes.len() == total >= body_end`.
        _ => Err(DecodeError::Truncated { needed: total, got: bytes.len() }),
    }
}

/// The length of the `f32` message [`widen`] makes of `bytes` (after the same checks).
pub fn widened_len(bytes: &[u8], enc: Encoding, limits: &Limits) -> Result<usize, DecodeError> {
    check(bytes, enc, limits).map(|c| c.widened)
}

/// Rewrites a message whose tensor is in `enc` as the same message in `f32` (exactly:
/// every 16-bit value is an `f32`) into `out`, and returns its length. The header is
/// checked as the decoders check it, with `enc`'s tag and element size, and with
/// `limits` counting elements; the control section is copied unread, for the decoder to
/// check. For [`Encoding::F32`] the message is copied as it is. Never allocates or panics;
/// on a short `out`, [`DecodeError::OutputTooSmall`] and nothing written.
pub fn widen(bytes: &[u8], enc: Encoding, limits: &Limits, out: &mut [u8]) -> Result<usize, DecodeError> {
    let c = check(bytes, enc, limits)?;
    let Some(out) = out.get_mut(..c.widened) else {
        return Err(DecodeError::OutputTooSmall { required: c.widened });
    };
    let (head, body) = out.split_at_mut(HEADER_LEN.min(c.widened));
    let (ctl_out, payload_out) = body.split_at_mut(c.control.len().min(body.len()));
    let [c0, c1] = u16::try_from(c.control.len()).unwrap_or(u16::MAX).to_le_bytes();
    let [p0, p1, p2, p3] = u32::try_from(payload_out.len()).unwrap_or(u32::MAX).to_le_bytes();
    let [m0, m1] = super::MAGIC;
    head.copy_from_slice(&[m0, m1, super::WIRE_VERSION, c.kind, Encoding::F32.tag(), c0, c1, p0, p1, p2, p3]);
    ctl_out.copy_from_slice(c.control);
    if enc == Encoding::F32 {
        payload_out.copy_from_slice(c.payload);
    } else {
        widen_into(enc, c.payload, payload_out);
    }
    Ok(c.widened)
}
