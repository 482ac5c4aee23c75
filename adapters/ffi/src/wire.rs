//! The core's wire codec for C: [`SyncopateMessage`] (every message kind as one flat struct),
//! decoding from and encoding into caller buffers.

use crate::error::{Detail, Failure, SYNCOPATE_ERR_DECODE, SYNCOPATE_ERR_ENCODE};
use crate::raw;
use syncopate::wire::{self, Direction, EncodeError, Limits, MessageKind};
use syncopate::{ToServer, ToWorker, Values, Version};

/// One message of either direction; `kind` is the wire's kind byte (`SYNCOPATE_MSG_*`) and
/// says which fields are meaningful (the others are 0).
///
/// Decoding sets `payload`/`payload_len` to the tensor's little-endian bytes *inside the
/// decoded buffer* (not aligned for `float`; read them with
/// [`syncopate_wire_payload_to_f32`](crate::syncopate_wire_payload_to_f32)) and leaves
/// `values` null. Encoding reads the tensor from `values`/`values_len` and ignores `payload`.
#[repr(C)]
#[derive(Clone, Copy, Debug)]
pub struct SyncopateMessage {
    /// A `SYNCOPATE_MSG_*` kind.
    pub kind: u32,
    /// JOIN: the worker's session epoch.
    pub epoch: u32,
    /// GRAD: base version; DELTA and PUSH_ACK: round; PULL: version held; MODEL and
    /// NOT_NEWER: version; ABORT: the abandoned iteration.
    pub version: u64,
    /// GRAD: the worker's iteration.
    pub iteration: u64,
    /// GRAD, DELTA, CLOCK: the per-worker sequence number.
    pub seq: u64,
    /// CLOCK: the clock that ended; MODEL: the snapshot's clock; PULL: the oldest clock accepted.
    pub clock: u64,
    /// DELTA: local steps it contains.
    pub local_steps: u32,
    /// PUSH_ACK: 1 when the worker must pull the new model.
    pub pull_now: u32,
    /// GRAD, DELTA, CLOCK: 1 when the message carries the worker's minibatch loss in `loss`.
    pub has_loss: u32,
    /// GRAD, DELTA, CLOCK: the minibatch loss, when `has_loss` is 1.
    pub loss: f32,
    /// Encoding: the tensor (GRAD, DELTA, CLOCK, MODEL).
    pub values: *const f32,
    /// Encoding: elements in `values`.
    pub values_len: usize,
    /// Decoding: the tensor's little-endian bytes, borrowed from the decoded buffer.
    pub payload: *const u8,
    /// Decoding: bytes in `payload`.
    pub payload_len: usize,
}

/// JOIN (worker to server).
pub const SYNCOPATE_MSG_JOIN: u32 = 0x01;
/// GRAD (worker to server).
pub const SYNCOPATE_MSG_GRAD: u32 = 0x02;
/// DELTA (worker to server).
pub const SYNCOPATE_MSG_DELTA: u32 = 0x03;
/// PULL (worker to server).
pub const SYNCOPATE_MSG_PULL: u32 = 0x04;
/// CLOCK (worker to server).
pub const SYNCOPATE_MSG_CLOCK: u32 = 0x05;
/// LEAVE (worker to server).
pub const SYNCOPATE_MSG_LEAVE: u32 = 0x06;
/// MODEL (server to worker).
pub const SYNCOPATE_MSG_MODEL: u32 = 0x81;
/// NOT_NEWER (server to worker).
pub const SYNCOPATE_MSG_NOT_NEWER: u32 = 0x82;
/// PUSH_ACK (server to worker).
pub const SYNCOPATE_MSG_PUSH_ACK: u32 = 0x83;
/// ABORT (server to worker).
pub const SYNCOPATE_MSG_ABORT: u32 = 0x84;
/// STOP (server to worker).
pub const SYNCOPATE_MSG_STOP: u32 = 0x85;

impl SyncopateMessage {
    const EMPTY: Self = Self {
        kind: 0,
        epoch: 0,
        version: 0,
        iteration: 0,
        seq: 0,
        clock: 0,
        local_steps: 0,
        pull_now: 0,
        has_loss: 0,
        loss: 0.0,
        values: core::ptr::null(),
        values_len: 0,
        payload: core::ptr::null(),
        payload_len: 0,
    };
}

/// `m` with the loss fields set from `loss`.
fn with_loss(m: SyncopateMessage, loss: Option<f32>) -> SyncopateMessage {
    SyncopateMessage { has_loss: u32::from(loss.is_some()), loss: loss.unwrap_or(0.0), ..m }
}

/// The loss a message's fields carry (`has_loss` other than 0 or 1 is refused).
fn loss_of(m: &SyncopateMessage) -> Result<Option<f32>, Failure> {
    match m.has_loss {
        0 => Ok(None),
        1 => Ok(Some(m.loss)),
        _ => Err(Failure::new(SYNCOPATE_ERR_ENCODE, "`has_loss` must be 0 or 1")),
    }
}

fn payload(v: Values<'_, f32>) -> (*const u8, usize) {
    match v {
        Values::LittleEndian(b) => (b.as_ptr(), b.len()),
        // Decoding only makes byte payloads; a slice here is never handed out.
        Values::Slice(_) => (core::ptr::null(), 0),
    }
}

fn from_server(msg: ToServer<'_, f32>) -> SyncopateMessage {
    let e = SyncopateMessage::EMPTY;
    match msg {
        ToServer::Join { epoch } => SyncopateMessage { kind: SYNCOPATE_MSG_JOIN, epoch, ..e },
        ToServer::Grad { base, iteration, seq, values, loss } => {
            let (payload, payload_len) = payload(values);
            let e = with_loss(e, loss);
            SyncopateMessage { kind: SYNCOPATE_MSG_GRAD, version: base.0, iteration, seq, payload, payload_len, ..e }
        }
        ToServer::Delta { round, local_steps, seq, values, loss } => {
            let (payload, payload_len) = payload(values);
            let e = with_loss(e, loss);
            SyncopateMessage {
                kind: SYNCOPATE_MSG_DELTA,
                version: round.0,
                local_steps,
                seq,
                payload,
                payload_len,
                ..e
            }
        }
        ToServer::Pull { have, min_clock } => {
            SyncopateMessage { kind: SYNCOPATE_MSG_PULL, version: have.0, clock: min_clock, ..e }
        }
        ToServer::Clock { clock, seq, values, loss } => {
            let (payload, payload_len) = payload(values);
            let e = with_loss(e, loss);
            SyncopateMessage { kind: SYNCOPATE_MSG_CLOCK, clock, seq, payload, payload_len, ..e }
        }
        ToServer::Leave => SyncopateMessage { kind: SYNCOPATE_MSG_LEAVE, ..e },
    }
}

fn from_worker(msg: ToWorker<'_, f32>) -> SyncopateMessage {
    let e = SyncopateMessage::EMPTY;
    match msg {
        ToWorker::Model { version, clock, values } => {
            let (payload, payload_len) = payload(values);
            SyncopateMessage { kind: SYNCOPATE_MSG_MODEL, version: version.0, clock, payload, payload_len, ..e }
        }
        ToWorker::NotNewer { version } => SyncopateMessage { kind: SYNCOPATE_MSG_NOT_NEWER, version: version.0, ..e },
        ToWorker::PushAck { round, pull_now } => {
            SyncopateMessage { kind: SYNCOPATE_MSG_PUSH_ACK, version: round.0, pull_now: u32::from(pull_now), ..e }
        }
        ToWorker::Abort { iteration } => SyncopateMessage { kind: SYNCOPATE_MSG_ABORT, version: iteration, ..e },
        ToWorker::Stop => SyncopateMessage { kind: SYNCOPATE_MSG_STOP, ..e },
    }
}

fn decode_failure(e: wire::DecodeError) -> Failure {
    Failure::new(SYNCOPATE_ERR_DECODE, "the bytes are not a valid message").with(Detail::Decode(e))
}

/// Decodes a message of either direction, tensors up to `max_elements`.
pub(crate) fn decode(bytes: &[u8], max_elements: usize) -> Result<SyncopateMessage, Failure> {
    let limits = Limits::for_model(max_elements);
    let header = wire::peek_header(bytes).map_err(decode_failure)?;
    match header.direction() {
        Direction::ToServer => wire::decode_to_server::<f32>(bytes, &limits).map(from_server),
        Direction::ToWorker => wire::decode_to_worker::<f32>(bytes, &limits).map(from_worker),
    }
    .map_err(decode_failure)
}

/// Either direction's message, borrowed from a [`SyncopateMessage`].
enum Borrowed<'a> {
    ToServer(ToServer<'a, f32>),
    ToWorker(ToWorker<'a, f32>),
}

/// The core message `m` describes.
///
/// # Safety
/// `m.values` is valid for reads of `m.values_len` floats (or null with length 0) for `'a`.
unsafe fn borrow<'a>(m: &SyncopateMessage) -> Result<Borrowed<'a>, Failure> {
    let kind = u8::try_from(m.kind).ok().and_then(MessageKind::from_byte);
    let bad_kind = Failure::new(SYNCOPATE_ERR_ENCODE, "unknown message kind").with(Detail::Value(u64::from(m.kind)));
    let kind = kind.ok_or(bad_kind)?;
    let values = if kind.has_payload() {
        // SAFETY: forwarded from this function's contract.
        Values::Slice(unsafe { raw::slice_in(m.values, m.values_len, "message `values`") }?)
    } else {
        Values::Slice(&[][..])
    };
    Ok(match kind {
        MessageKind::Join => Borrowed::ToServer(ToServer::Join { epoch: m.epoch }),
        MessageKind::Grad => Borrowed::ToServer(ToServer::Grad {
            base: Version(m.version),
            iteration: m.iteration,
            seq: m.seq,
            values,
            loss: loss_of(m)?,
        }),
        MessageKind::Delta => Borrowed::ToServer(ToServer::Delta {
            round: Version(m.version),
            local_steps: m.local_steps,
            seq: m.seq,
            values,
            loss: loss_of(m)?,
        }),
        MessageKind::Pull => Borrowed::ToServer(ToServer::Pull { have: Version(m.version), min_clock: m.clock }),
        MessageKind::Clock => {
            Borrowed::ToServer(ToServer::Clock { clock: m.clock, seq: m.seq, values, loss: loss_of(m)? })
        }
        MessageKind::Leave => Borrowed::ToServer(ToServer::Leave),
        MessageKind::Model => {
            Borrowed::ToWorker(ToWorker::Model { version: Version(m.version), clock: m.clock, values })
        }
        MessageKind::NotNewer => Borrowed::ToWorker(ToWorker::NotNewer { version: Version(m.version) }),
        MessageKind::PushAck => {
            Borrowed::ToWorker(ToWorker::PushAck { round: Version(m.version), pull_now: m.pull_now != 0 })
        }
        MessageKind::Abort => Borrowed::ToWorker(ToWorker::Abort { iteration: m.version }),
        MessageKind::Stop => Borrowed::ToWorker(ToWorker::Stop),
        #[allow(unreachable_patterns)]
        _ => return Err(bad_kind),
    })
}

fn encode_failure(e: EncodeError) -> Failure {
    match e {
        EncodeError::TooSmall { required } => Failure::short("output buffer", 0, required),
        e => Failure::new(SYNCOPATE_ERR_ENCODE, "the message cannot be encoded").with(Detail::Encode(e)),
    }
}

/// Bytes the message `m` encodes to.
///
/// # Safety
/// As [`borrow`].
pub(crate) unsafe fn encoded_len(m: &SyncopateMessage) -> Result<usize, Failure> {
    // SAFETY: forwarded.
    Ok(match unsafe { borrow(m) }? {
        Borrowed::ToServer(msg) => wire::encoded_len_to_server(&msg),
        Borrowed::ToWorker(msg) => wire::encoded_len_to_worker(&msg),
    })
}

/// Encodes `m` into `out`, returning the bytes written.
///
/// # Safety
/// As [`borrow`].
pub(crate) unsafe fn encode(m: &SyncopateMessage, out: &mut [u8]) -> Result<usize, Failure> {
    // SAFETY: forwarded.
    let msg = unsafe { borrow(m) }?;
    let needed = match &msg {
        Borrowed::ToServer(msg) => wire::encoded_len_to_server(msg),
        Borrowed::ToWorker(msg) => wire::encoded_len_to_worker(msg),
    };
    if out.len() < needed {
        return Err(Failure::short("output buffer", out.len(), needed));
    }
    match msg {
        Borrowed::ToServer(msg) => wire::encode_to_server(&msg, out),
        Borrowed::ToWorker(msg) => wire::encode_to_worker(&msg, out),
    }
    .map_err(encode_failure)
}

/// Encodes a server's outgoing message into `out` (sized by the caller for the largest).
pub(crate) fn encode_to_worker(msg: &ToWorker<'_, f32>, out: &mut [u8]) -> Result<usize, Failure> {
    wire::encode_to_worker(msg, out).map_err(encode_failure)
}

/// Encodes a worker's outgoing message into `out` (sized by the caller for the largest).
pub(crate) fn encode_to_server(msg: &ToServer<'_, f32>, out: &mut [u8]) -> Result<usize, Failure> {
    wire::encode_to_server(msg, out).map_err(encode_failure)
}

/// The largest encoded message for a model of `dim` elements.
pub(crate) fn max_message_len(dim: usize) -> usize {
    Limits::for_model(dim).max_message_len::<f32>()
}

/// Decodes `bytes` as a message to a server, tensors of `dim` elements at most.
pub(crate) fn decode_to_server(bytes: &[u8], dim: usize) -> Result<ToServer<'_, f32>, Failure> {
    wire::decode_to_server(bytes, &Limits::for_model(dim)).map_err(decode_failure)
}

/// Decodes `bytes` as a message to a worker, tensors of `dim` elements at most.
pub(crate) fn decode_to_worker(bytes: &[u8], dim: usize) -> Result<ToWorker<'_, f32>, Failure> {
    wire::decode_to_worker(bytes, &Limits::for_model(dim)).map_err(decode_failure)
}
