//! The connection handshake: compatibility checks (transport version, wire version,
//! protocol and its settings, model shape, worker id) and, with a shared secret, mutual
//! HMAC-SHA256 challenge-response over the whole transcript.
//!
//! ```text
//! worker                                         server
//!   ClientHello{versions, auth, id, dim, nonce_c, protocol, knobs}  ->
//!                <-  ServerHello{versions, auth, nonce_s, server id, epoch, version, mac_s}
//!   ClientAuth{mac_c}                                               ->
//!                <-  Accept{mac_a}            (or Refuse{code, message} at any step)
//! ```
//!
//! `mac_s = HMAC(k_w, "syncopate-tcp-v1 server hello" || CH || SH without mac_s)`,
//! `mac_c = HMAC(k_w, "syncopate-tcp-v1 client auth" || CH || SH)`,
//! `mac_a = HMAC(k_w, "syncopate-tcp-v1 server accept" || CH || SH || CA)`, where `CH`, `SH`
//! and `CA` are the frames' payloads and `k_w` the worker's key
//! ([`Secret::worker_key`](super::auth::Secret::worker_key)). The session's frame keys are
//! then derived from `k_w` and both nonces. Without a secret the MACs are all zero and not
//! checked, and frames carry no tag. Either side may send `Refuse` instead of its next
//! message; the receiver reports its message. `adapters/transport/TCP.md` gives the byte layout.

use super::auth::{KEY_LEN, LABEL_ACCEPT, LABEL_CLIENT, LABEL_SERVER, WorkerKey, nonce};
use super::frame::{FrameError, FrameReader, FrameWriter};
use core::fmt;
use std::io::Write;
use std::time::Instant;
use syncopate::{ProtocolConfig, WorkerId};

/// `"SYNT"`: the first bytes of every handshake message after its type byte.
pub const MAGIC: [u8; 4] = *b"SYNT";
/// The version of this transport (framing and handshake).
pub const TCP_VERSION: u16 = 1;
/// The largest frame `len` accepted before the handshake completes.
pub const HANDSHAKE_MAX_LEN: usize = 512;
/// The longest protocol name in a hello.
pub const MAX_PROTOCOL_NAME: usize = 32;
/// The longest knob description in a hello.
pub const MAX_KNOBS: usize = 320;
/// The longest message in a `Refuse`.
pub const MAX_REFUSE_MESSAGE: usize = 400;

const T_CLIENT_HELLO: u8 = 0x01;
const T_SERVER_HELLO: u8 = 0x02;
const T_CLIENT_AUTH: u8 = 0x03;
const T_ACCEPT: u8 = 0x04;
const T_REFUSE: u8 = 0x7F;

/// Why a handshake was refused, as sent in a `Refuse` message.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub enum RefuseCode {
    /// The message was not a well-formed handshake message.
    Malformed,
    /// Different transport versions.
    TcpVersion,
    /// Different wire (message codec) versions.
    WireVersion,
    /// Different protocols.
    Protocol,
    /// Same protocol, different settings.
    Knobs,
    /// Different model dimension or element type.
    ModelShape,
    /// The worker id is outside `0..n`.
    WorkerId,
    /// One side has a secret and the other does not.
    AuthMode,
    /// A MAC did not verify: the two sides hold different secrets.
    AuthFailed,
    /// Too many connections; try again later.
    Busy,
    /// Any other code (from a newer peer).
    Other(u8),
}

impl RefuseCode {
    /// The code's byte.
    pub fn byte(self) -> u8 {
        match self {
            Self::Malformed => 1,
            Self::TcpVersion => 2,
            Self::WireVersion => 3,
            Self::Protocol => 4,
            Self::Knobs => 5,
            Self::ModelShape => 6,
            Self::WorkerId => 7,
            Self::AuthMode => 8,
            Self::AuthFailed => 9,
            Self::Busy => 10,
            Self::Other(b) => b,
        }
    }

    /// The code of a byte.
    pub fn from_byte(b: u8) -> Self {
        match b {
            1 => Self::Malformed,
            2 => Self::TcpVersion,
            3 => Self::WireVersion,
            4 => Self::Protocol,
            5 => Self::Knobs,
            6 => Self::ModelShape,
            7 => Self::WorkerId,
            8 => Self::AuthMode,
            9 => Self::AuthFailed,
            10 => Self::Busy,
            b => Self::Other(b),
        }
    }

    /// Whether trying again later can succeed.
    pub fn is_transient(self) -> bool {
        matches!(self, Self::Busy)
    }
}

/// What both sides must agree on: everything but the worker id and the secret.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Terms {
    /// The wire (message codec) version.
    pub wire_version: u8,
    /// The protocol's name.
    pub protocol: String,
    /// The protocol's settings, as text (compared exactly).
    pub knobs: String,
    /// The model dimension.
    pub dim: u64,
    /// Bytes per element (4 for `f32`).
    pub scalar_bytes: u8,
}

impl Terms {
    /// The terms of `config` with a model of `dim` `f32` parameters.
    pub fn new(config: &ProtocolConfig, dim: usize) -> Self {
        let mut knobs = format!("{config:?}");
        truncate(&mut knobs, MAX_KNOBS);
        let mut protocol = config.name().to_owned();
        truncate(&mut protocol, MAX_PROTOCOL_NAME);
        Self { wire_version: syncopate::wire::WIRE_VERSION, protocol, knobs, dim: dim as u64, scalar_bytes: 4 }
    }
}

fn truncate(s: &mut String, max: usize) {
    if s.len() > max {
        let mut end = max;
        while !s.is_char_boundary(end) {
            end -= 1;
        }
        s.truncate(end);
    }
}

/// The first message, worker to server.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ClientHello {
    /// The worker's transport version.
    pub tcp_version: u16,
    /// Whether the worker authenticates.
    pub auth: bool,
    /// The worker's id.
    pub worker: WorkerId,
    /// The worker's nonce.
    pub nonce: [u8; KEY_LEN],
    /// What the worker runs.
    pub terms: Terms,
}

/// The server's answer.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ServerHello {
    /// The server's transport version.
    pub tcp_version: u16,
    /// The server's wire version.
    pub wire_version: u8,
    /// Whether the server authenticates.
    pub auth: bool,
    /// The server's nonce.
    pub nonce: [u8; KEY_LEN],
    /// Identifies one run of the server process (random at start).
    pub server_id: u64,
    /// The session epoch the worker must use in `Join`.
    pub epoch: u32,
    /// The server's model version when it answered.
    pub version: u64,
    /// `mac_s` (zeros without a secret).
    pub mac: [u8; KEY_LEN],
}

/// A handshake message.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Message {
    /// Worker → server, first.
    ClientHello(ClientHello),
    /// Server → worker.
    ServerHello(ServerHello),
    /// Worker → server: `mac_c`.
    ClientAuth([u8; KEY_LEN]),
    /// Server → worker: `mac_a`; the session starts.
    Accept([u8; KEY_LEN]),
    /// Either way: the handshake failed.
    Refuse {
        /// Why.
        code: RefuseCode,
        /// A line for the peer's operator.
        message: String,
    },
}

/// Why a handshake failed.
#[derive(Debug)]
#[non_exhaustive]
pub enum HandshakeError {
    /// The peer refused us.
    Refused {
        /// Its reason.
        code: RefuseCode,
        /// Its message.
        message: String,
    },
    /// We refused the peer (and told it so).
    Refusing {
        /// Our reason.
        code: RefuseCode,
        /// Our message.
        message: String,
        /// The worker id the peer claimed, if it got that far.
        worker: Option<WorkerId>,
    },
    /// A frame could not be read or written (including the handshake deadline).
    Frame(FrameError),
}

impl HandshakeError {
    /// Whether trying again later can succeed.
    pub fn is_transient(&self) -> bool {
        match self {
            Self::Refused { code, .. } | Self::Refusing { code, .. } => code.is_transient(),
            Self::Frame(_) => true,
        }
    }
}

impl fmt::Display for HandshakeError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Self::Refused { message, .. } => write!(f, "refused by peer: {message}"),
            Self::Refusing { message, .. } => f.write_str(message),
            Self::Frame(e) => write!(f, "handshake: {e}"),
        }
    }
}

impl core::error::Error for HandshakeError {}

impl From<FrameError> for HandshakeError {
    fn from(e: FrameError) -> Self {
        Self::Frame(e)
    }
}

impl From<std::io::Error> for HandshakeError {
    fn from(e: std::io::Error) -> Self {
        Self::Frame(FrameError::Io(e))
    }
}

struct Cursor<'a>(&'a [u8]);

impl<'a> Cursor<'a> {
    fn take(&mut self, n: usize) -> Option<&'a [u8]> {
        let (head, rest) = (self.0.get(..n)?, self.0.get(n..)?);
        self.0 = rest;
        Some(head)
    }
    fn u8(&mut self) -> Option<u8> {
        self.take(1)?.first().copied()
    }
    fn u16(&mut self) -> Option<u16> {
        Some(u16::from_le_bytes(self.take(2)?.try_into().ok()?))
    }
    fn u32(&mut self) -> Option<u32> {
        Some(u32::from_le_bytes(self.take(4)?.try_into().ok()?))
    }
    fn u64(&mut self) -> Option<u64> {
        Some(u64::from_le_bytes(self.take(8)?.try_into().ok()?))
    }
    fn key(&mut self) -> Option<[u8; KEY_LEN]> {
        self.take(KEY_LEN)?.try_into().ok()
    }
    fn bool(&mut self) -> Option<bool> {
        match self.u8()? {
            0 => Some(false),
            1 => Some(true),
            _ => None,
        }
    }
    fn str8(&mut self, max: usize) -> Option<String> {
        let n = usize::from(self.u8()?);
        if n > max {
            return None;
        }
        String::from_utf8(self.take(n)?.to_vec()).ok()
    }
    fn str16(&mut self, max: usize) -> Option<String> {
        let n = usize::from(self.u16()?);
        if n > max {
            return None;
        }
        String::from_utf8(self.take(n)?.to_vec()).ok()
    }
    fn magic(&mut self) -> Option<()> {
        (self.take(4)? == MAGIC).then_some(())
    }
}

fn put_str8(out: &mut Vec<u8>, s: &str, max: usize) {
    let mut s = s.to_owned();
    truncate(&mut s, max.min(255));
    out.push(s.len() as u8);
    out.extend_from_slice(s.as_bytes());
}

fn put_str16(out: &mut Vec<u8>, s: &str, max: usize) {
    let mut s = s.to_owned();
    truncate(&mut s, max.min(u16::MAX as usize));
    out.extend_from_slice(&(s.len() as u16).to_le_bytes());
    out.extend_from_slice(s.as_bytes());
}

impl Message {
    /// The message's bytes (a frame payload).
    pub fn encode(&self) -> Vec<u8> {
        let mut out = Vec::with_capacity(128);
        match self {
            Self::ClientHello(h) => {
                out.push(T_CLIENT_HELLO);
                out.extend_from_slice(&MAGIC);
                out.extend_from_slice(&h.tcp_version.to_le_bytes());
                out.push(h.terms.wire_version);
                out.push(u8::from(h.auth));
                out.extend_from_slice(&h.worker.0.to_le_bytes());
                out.push(h.terms.scalar_bytes);
                out.extend_from_slice(&h.terms.dim.to_le_bytes());
                out.extend_from_slice(&h.nonce);
                put_str8(&mut out, &h.terms.protocol, MAX_PROTOCOL_NAME);
                put_str16(&mut out, &h.terms.knobs, MAX_KNOBS);
            }
            Self::ServerHello(h) => {
                out.extend_from_slice(&Self::server_hello_unsigned(h));
                out.extend_from_slice(&h.mac);
            }
            Self::ClientAuth(mac) => {
                out.push(T_CLIENT_AUTH);
                out.extend_from_slice(mac);
            }
            Self::Accept(mac) => {
                out.push(T_ACCEPT);
                out.extend_from_slice(mac);
            }
            Self::Refuse { code, message } => {
                out.push(T_REFUSE);
                out.push(code.byte());
                put_str16(&mut out, message, MAX_REFUSE_MESSAGE);
            }
        }
        out
    }

    /// A server hello's bytes without its MAC (what `mac_s` covers after the client hello).
    fn server_hello_unsigned(h: &ServerHello) -> Vec<u8> {
        let mut out = Vec::with_capacity(96);
        out.push(T_SERVER_HELLO);
        out.extend_from_slice(&MAGIC);
        out.extend_from_slice(&h.tcp_version.to_le_bytes());
        out.push(h.wire_version);
        out.push(u8::from(h.auth));
        out.extend_from_slice(&h.nonce);
        out.extend_from_slice(&h.server_id.to_le_bytes());
        out.extend_from_slice(&h.epoch.to_le_bytes());
        out.extend_from_slice(&h.version.to_le_bytes());
        out
    }

    /// Parses a frame payload; `None` if it is not exactly one well-formed message.
    pub fn decode(bytes: &[u8]) -> Option<Self> {
        let mut c = Cursor(bytes);
        let msg = match c.u8()? {
            T_CLIENT_HELLO => {
                c.magic()?;
                let tcp_version = c.u16()?;
                let wire_version = c.u8()?;
                let auth = c.bool()?;
                let worker = WorkerId(c.u32()?);
                let scalar_bytes = c.u8()?;
                let dim = c.u64()?;
                let nonce = c.key()?;
                let protocol = c.str8(MAX_PROTOCOL_NAME)?;
                let knobs = c.str16(MAX_KNOBS)?;
                Self::ClientHello(ClientHello {
                    tcp_version,
                    auth,
                    worker,
                    nonce,
                    terms: Terms { wire_version, protocol, knobs, dim, scalar_bytes },
                })
            }
            T_SERVER_HELLO => {
                c.magic()?;
                Self::ServerHello(ServerHello {
                    tcp_version: c.u16()?,
                    wire_version: c.u8()?,
                    auth: c.bool()?,
                    nonce: c.key()?,
                    server_id: c.u64()?,
                    epoch: c.u32()?,
                    version: c.u64()?,
                    mac: c.key()?,
                })
            }
            T_CLIENT_AUTH => Self::ClientAuth(c.key()?),
            T_ACCEPT => Self::Accept(c.key()?),
            T_REFUSE => {
                let code = RefuseCode::from_byte(c.u8()?);
                let message = c.str16(MAX_REFUSE_MESSAGE)?;
                Self::Refuse { code, message }
            }
            _ => return None,
        };
        c.0.is_empty().then_some(msg)
    }
}

/// What the server needs to run a handshake.
#[derive(Debug)]
pub struct ServerSide<'a> {
    /// What workers must agree to.
    pub terms: &'a Terms,
    /// The number of workers (ids `0..workers`).
    pub workers: u32,
    /// The master secret, if authenticating.
    pub secret: Option<&'a super::auth::Secret>,
    /// This server run's id.
    pub server_id: u64,
    /// The model version to announce.
    pub version: u64,
}

/// What a completed handshake established.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Session {
    /// The worker (authenticated when a secret is in use).
    pub worker: WorkerId,
    /// The epoch the server assigned to this session.
    pub epoch: u32,
    /// The server run's id.
    pub server_id: u64,
    /// The server's model version at the handshake.
    pub version: u64,
}

fn read_message(reader: &mut FrameReader, buf: &mut Vec<u8>, deadline: Instant) -> Result<Message, HandshakeError> {
    let p = reader.read_frame(buf, Some(deadline)).map_err(|e| match e {
        FrameError::Idle => FrameError::Deadline { got: 0, allowed: core::time::Duration::ZERO },
        e => e,
    })?;
    let payload = p.of(buf);
    match Message::decode(payload) {
        Some(Message::Refuse { code, message }) => Err(HandshakeError::Refused { code, message }),
        Some(m) => Ok(m),
        None => Err(HandshakeError::Refusing {
            code: RefuseCode::Malformed,
            message: format!("malformed handshake message ({} bytes)", payload.len()),
            worker: None,
        }),
    }
}

/// Sends a `Refuse` (best effort) and returns the error describing it.
fn refuse<W: Write>(
    writer: &mut FrameWriter<W>,
    code: RefuseCode,
    message: String,
    worker: Option<WorkerId>,
) -> HandshakeError {
    let _ = writer.write_frame(&Message::Refuse { code, message: message.clone() }.encode());
    HandshakeError::Refusing { code, message, worker }
}

/// Checks a client hello against the server's terms; the message of a refusal names both
/// sides' values.
fn check_hello(h: &ClientHello, side: &ServerSide<'_>) -> Result<(), (RefuseCode, String)> {
    let t = side.terms;
    let w = &h.terms;
    if h.tcp_version != TCP_VERSION {
        return Err((
            RefuseCode::TcpVersion,
            format!("transport version mismatch: server speaks {TCP_VERSION}, worker {}", h.tcp_version),
        ));
    }
    if w.wire_version != t.wire_version {
        return Err((
            RefuseCode::WireVersion,
            format!("wire version mismatch: server speaks {}, worker {}", t.wire_version, w.wire_version),
        ));
    }
    if h.worker.0 >= side.workers {
        return Err((
            RefuseCode::WorkerId,
            format!("worker id {} is out of range: the server has workers 0..{}", h.worker.0, side.workers),
        ));
    }
    if w.protocol != t.protocol {
        return Err((
            RefuseCode::Protocol,
            format!("protocol mismatch: server runs {}, worker {} runs {}", t.protocol, h.worker.0, w.protocol),
        ));
    }
    if w.knobs != t.knobs {
        return Err((
            RefuseCode::Knobs,
            format!("protocol settings differ: server has {}, worker {} has {}", t.knobs, h.worker.0, w.knobs),
        ));
    }
    if w.dim != t.dim || w.scalar_bytes != t.scalar_bytes {
        return Err((
            RefuseCode::ModelShape,
            format!(
                "model shape mismatch: server has {} parameters of {} bytes, worker {} has {} of {} bytes",
                t.dim, t.scalar_bytes, h.worker.0, w.dim, w.scalar_bytes
            ),
        ));
    }
    match (side.secret.is_some(), h.auth) {
        (true, false) => Err((
            RefuseCode::AuthMode,
            format!("server requires authentication but worker {} has no shared secret", h.worker.0),
        )),
        (false, true) => Err((
            RefuseCode::AuthMode,
            format!("server runs without a shared secret but worker {} offers one", h.worker.0),
        )),
        _ => Ok(()),
    }
}

/// Runs the server side over a fresh connection. `assign_epoch` is called once the worker is
/// authenticated enough to be worth an epoch (after its hello checks out). On success the
/// reader and writer are switched to session mode (MACs, `session_max_len`).
pub fn server_handshake<W: Write>(
    reader: &mut FrameReader,
    writer: &mut FrameWriter<W>,
    side: &ServerSide<'_>,
    deadline: Instant,
    session_max_len: usize,
    assign_epoch: impl FnOnce(WorkerId) -> u32,
) -> Result<Session, HandshakeError> {
    reader.set_hard_deadline(Some(deadline));
    reader.set_max_len(HANDSHAKE_MAX_LEN);
    writer.set_max_len(HANDSHAKE_MAX_LEN);
    let mut buf = Vec::with_capacity(HANDSHAKE_MAX_LEN);
    let hello = match read_message(reader, &mut buf, deadline) {
        Ok(Message::ClientHello(h)) => h,
        Ok(_) => return Err(refuse(writer, RefuseCode::Malformed, "expected a client hello".into(), None)),
        Err(HandshakeError::Refusing { code, message, worker }) => return Err(refuse(writer, code, message, worker)),
        Err(e) => return Err(e),
    };
    let ch_bytes = buf.get(super::frame::SEQ_BYTES..).unwrap_or_default().to_vec();
    if let Err((code, message)) = check_hello(&hello, side) {
        return Err(refuse(writer, code, message, Some(hello.worker)));
    }
    let worker = hello.worker;
    let key = side.secret.map(|s| s.worker_key(worker));
    let epoch = assign_epoch(worker);
    let mut sh = ServerHello {
        tcp_version: TCP_VERSION,
        wire_version: side.terms.wire_version,
        auth: key.is_some(),
        nonce: nonce()?,
        server_id: side.server_id,
        epoch,
        version: side.version,
        mac: [0; KEY_LEN],
    };
    let sh_unsigned = Message::server_hello_unsigned(&sh);
    if let Some(k) = &key {
        sh.mac = k.transcript_mac(LABEL_SERVER, &[&ch_bytes, &sh_unsigned]);
    }
    let sh_bytes = Message::ServerHello(sh.clone()).encode();
    writer.write_frame(&sh_bytes)?;
    let mac_c = match read_message(reader, &mut buf, deadline) {
        Ok(Message::ClientAuth(mac)) => mac,
        Ok(_) => return Err(refuse(writer, RefuseCode::Malformed, "expected client auth".into(), Some(worker))),
        Err(HandshakeError::Refusing { code, message, .. }) => {
            return Err(refuse(writer, code, message, Some(worker)));
        }
        Err(e) => return Err(e),
    };
    let ca_bytes = Message::ClientAuth(mac_c).encode();
    let mut mac_a = [0; KEY_LEN];
    if let Some(k) = &key {
        if !k.verify_transcript(LABEL_CLIENT, &[&ch_bytes, &sh_bytes], &mac_c) {
            return Err(refuse(
                writer,
                RefuseCode::AuthFailed,
                format!("authentication failed for worker {}: wrong shared secret", worker.0),
                Some(worker),
            ));
        }
        mac_a = k.transcript_mac(LABEL_ACCEPT, &[&ch_bytes, &sh_bytes, &ca_bytes]);
    }
    writer.write_frame(&Message::Accept(mac_a).encode())?;
    if let Some(k) = &key {
        let keys = k.session_keys(&hello.nonce, &sh.nonce);
        reader.set_mac(keys.to_server);
        writer.set_mac(keys.to_worker);
    }
    reader.set_hard_deadline(None);
    reader.set_max_len(session_max_len);
    writer.set_max_len(session_max_len);
    Ok(Session { worker, epoch, server_id: side.server_id, version: side.version })
}

/// Runs the worker side over a fresh connection. On success the reader and writer are
/// switched to session mode.
pub fn client_handshake<W: Write>(
    reader: &mut FrameReader,
    writer: &mut FrameWriter<W>,
    terms: &Terms,
    worker: WorkerId,
    key: Option<&WorkerKey>,
    deadline: Instant,
    session_max_len: usize,
) -> Result<Session, HandshakeError> {
    reader.set_hard_deadline(Some(deadline));
    reader.set_max_len(HANDSHAKE_MAX_LEN);
    writer.set_max_len(HANDSHAKE_MAX_LEN);
    let hello =
        ClientHello { tcp_version: TCP_VERSION, auth: key.is_some(), worker, nonce: nonce()?, terms: terms.clone() };
    let ch_bytes = Message::ClientHello(hello.clone()).encode();
    writer.write_frame(&ch_bytes)?;
    let mut buf = Vec::with_capacity(HANDSHAKE_MAX_LEN);
    let sh = match read_message(reader, &mut buf, deadline) {
        Ok(Message::ServerHello(sh)) => sh,
        Ok(_) => return Err(refuse(writer, RefuseCode::Malformed, "expected a server hello".into(), Some(worker))),
        Err(HandshakeError::Refusing { code, message, .. }) => {
            return Err(refuse(writer, code, message, Some(worker)));
        }
        Err(e) => return Err(e),
    };
    let sh_bytes = buf.get(super::frame::SEQ_BYTES..).unwrap_or_default().to_vec();
    if sh.tcp_version != TCP_VERSION || sh.wire_version != terms.wire_version {
        let message = format!(
            "version mismatch: server speaks transport {} wire {}, worker transport {TCP_VERSION} wire {}",
            sh.tcp_version, sh.wire_version, terms.wire_version
        );
        return Err(refuse(writer, RefuseCode::WireVersion, message, Some(worker)));
    }
    if sh.auth != key.is_some() {
        let message = if sh.auth {
            "server requires authentication but this worker has no shared secret"
        } else {
            "server runs without a shared secret but this worker has one"
        };
        return Err(refuse(writer, RefuseCode::AuthMode, message.into(), Some(worker)));
    }
    let mut mac_c = [0; KEY_LEN];
    if let Some(k) = key {
        let unsigned = Message::server_hello_unsigned(&sh);
        if !k.verify_transcript(LABEL_SERVER, &[&ch_bytes, &unsigned], &sh.mac) {
            let message = format!("server failed authentication for worker {}: wrong shared secret", worker.0);
            return Err(refuse(writer, RefuseCode::AuthFailed, message, Some(worker)));
        }
        mac_c = k.transcript_mac(LABEL_CLIENT, &[&ch_bytes, &sh_bytes]);
    }
    let ca_bytes = Message::ClientAuth(mac_c).encode();
    writer.write_frame(&ca_bytes)?;
    match read_message(reader, &mut buf, deadline) {
        Ok(Message::Accept(mac_a)) => {
            if let Some(k) = key {
                if !k.verify_transcript(LABEL_ACCEPT, &[&ch_bytes, &sh_bytes, &ca_bytes], &mac_a) {
                    let message = "server's accept failed authentication".to_owned();
                    return Err(refuse(writer, RefuseCode::AuthFailed, message, Some(worker)));
                }
            }
        }
        Ok(_) => return Err(refuse(writer, RefuseCode::Malformed, "expected accept".into(), Some(worker))),
        Err(HandshakeError::Refusing { code, message, .. }) => {
            return Err(refuse(writer, code, message, Some(worker)));
        }
        Err(e) => return Err(e),
    }
    if let Some(k) = key {
        let keys = k.session_keys(&hello.nonce, &sh.nonce);
        reader.set_mac(keys.to_worker);
        writer.set_mac(keys.to_server);
    }
    reader.set_hard_deadline(None);
    reader.set_max_len(session_max_len);
    writer.set_max_len(session_max_len);
    Ok(Session { worker, epoch: sh.epoch, server_id: sh.server_id, version: sh.version })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn terms() -> Terms {
        Terms { wire_version: 1, protocol: "bsp".into(), knobs: "Bsp(..)".into(), dim: 650, scalar_bytes: 4 }
    }

    #[test]
    fn messages_round_trip_and_reject_trailing_bytes() {
        let msgs = [
            Message::ClientHello(ClientHello {
                tcp_version: 1,
                auth: true,
                worker: WorkerId(3),
                nonce: [9; 32],
                terms: terms(),
            }),
            Message::ServerHello(ServerHello {
                tcp_version: 1,
                wire_version: 1,
                auth: false,
                nonce: [1; 32],
                server_id: 77,
                epoch: 4,
                version: 12,
                mac: [2; 32],
            }),
            Message::ClientAuth([5; 32]),
            Message::Accept([6; 32]),
            Message::Refuse { code: RefuseCode::Knobs, message: "nope".into() },
        ];
        for m in msgs {
            let bytes = m.encode();
            assert!(bytes.len() + 8 <= HANDSHAKE_MAX_LEN);
            assert_eq!(Message::decode(&bytes), Some(m.clone()));
            let mut longer = bytes.clone();
            longer.push(0);
            assert_eq!(Message::decode(&longer), None);
            for cut in 0..bytes.len() {
                assert_eq!(Message::decode(&bytes[..cut]), None);
            }
        }
        assert_eq!(Message::decode(b"GET / HTTP/1.1\r\n"), None);
    }

    #[test]
    fn hello_checks_name_both_sides() {
        let t = terms();
        let side = ServerSide { terms: &t, workers: 2, secret: None, server_id: 1, version: 0 };
        let mut h = ClientHello { tcp_version: 1, auth: false, worker: WorkerId(1), nonce: [0; 32], terms: terms() };
        assert!(check_hello(&h, &side).is_ok());
        h.terms.protocol = "asp".into();
        let (code, msg) = check_hello(&h, &side).unwrap_err();
        assert_eq!(code, RefuseCode::Protocol);
        assert!(msg.contains("server runs bsp") && msg.contains("runs asp"), "{msg}");
        h.terms = terms();
        h.terms.dim = 10;
        assert_eq!(check_hello(&h, &side).unwrap_err().0, RefuseCode::ModelShape);
        h.terms = terms();
        h.terms.wire_version = 9;
        assert_eq!(check_hello(&h, &side).unwrap_err().0, RefuseCode::WireVersion);
        h.terms = terms();
        h.worker = WorkerId(2);
        assert_eq!(check_hello(&h, &side).unwrap_err().0, RefuseCode::WorkerId);
        h.worker = WorkerId(0);
        h.auth = true;
        assert_eq!(check_hello(&h, &side).unwrap_err().0, RefuseCode::AuthMode);
    }
}
