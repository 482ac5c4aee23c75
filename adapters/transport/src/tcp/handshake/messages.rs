//! The handshake's messages and their byte encoding (layout in
//! `adapters/transport/TCP.md`).

use crate::tcp::auth::{KEY_LEN, LABEL_HELLO, TAG_LEN, WorkerKey, nonce};
use crate::tcp::settings::MAX_SETTINGS_LEN;
use syncopate::WorkerId;

/// `"SYNT"`: the first bytes of every handshake message after its type byte.
pub const MAGIC: [u8; 4] = *b"SYNT";
/// The version of this transport (framing and handshake).
pub const TCP_VERSION: u16 = 8;
/// The largest frame `len` the server accepts before the handshake completes.
pub const HANDSHAKE_MAX_LEN: usize = 512;
/// The largest frame `len` a worker accepts before the handshake completes (the server
/// hello carries the settings).
pub const SERVER_HANDSHAKE_MAX_LEN: usize = 256 + MAX_SETTINGS_LEN;
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
    /// Different protocols (unused since transport version 2: the worker takes the
    /// server's).
    Protocol,
    /// The worker pinned settings (by their digest) that differ from the server's.
    Knobs,
    /// Different model dimension or element type (unused since transport version 2: the
    /// worker takes the server's).
    ModelShape,
    /// The worker id is outside `0..n`.
    WorkerId,
    /// One side has a secret and the other does not.
    AuthMode,
    /// A MAC did not verify: the two sides hold different secrets.
    AuthFailed,
    /// Too many connections; try again later.
    Busy,
    /// The peer is not of the kind this server takes (a worker at a central server of
    /// remote groups, or a group server at an ordinary server).
    Role,
    /// Sessions of this worker id keep replacing live ones: two processes claim the id.
    Claimed,
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
            Self::Role => 11,
            Self::Claimed => 12,
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
            11 => Self::Role,
            12 => Self::Claimed,
            b => Self::Other(b),
        }
    }

    /// Whether trying again later can succeed.
    pub fn is_transient(self) -> bool {
        matches!(self, Self::Busy)
    }
}

/// Who is connecting: a worker of the run, or a group server of the grouped protocol
/// connecting upstream to its central server.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Role {
    /// A worker.
    Worker,
    /// A group server (`syncopate group`).
    Group,
}

impl Role {
    fn byte(self) -> u8 {
        match self {
            Self::Worker => 0,
            Self::Group => 1,
        }
    }

    fn from_byte(b: u8) -> Option<Self> {
        match b {
            0 => Some(Self::Worker),
            1 => Some(Self::Group),
            _ => None,
        }
    }

    pub(super) fn name(self) -> &'static str {
        match self {
            Self::Worker => "worker",
            Self::Group => "group server",
        }
    }
}

/// The first message, worker to server.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ClientHello {
    /// The worker's transport version.
    pub tcp_version: u16,
    /// The worker's wire (message codec) version.
    pub wire_version: u8,
    /// Whether the worker authenticates.
    pub auth: bool,
    /// A worker or a group server.
    pub role: Role,
    /// The worker's id (a group server's index at its central server).
    pub worker: WorkerId,
    /// The worker's nonce.
    pub nonce: [u8; KEY_LEN],
    /// SHA-256 of the settings the worker insists on; all zero to take the server's.
    pub want: [u8; KEY_LEN],
    /// The number of parameters of the worker's own model; 0 when the worker takes the
    /// server's (the server refuses a worker whose model has another size).
    pub dim: u64,
    /// How long the worker waits on a silent server before it counts the session as lost,
    /// in milliseconds (the server beats often enough for it; see
    /// [`heartbeat_interval`](crate::tcp::heartbeat_interval)).
    pub lost_after_ms: u64,
    /// `early_mac` (zeros without a secret).
    pub early_mac: [u8; TAG_LEN],
}

impl ClientHello {
    /// A hello of `worker` in `role`, pinning `want` (if any), signed with `key` (if any).
    pub fn new(
        worker: WorkerId,
        role: Role,
        want: Option<[u8; KEY_LEN]>,
        key: Option<&WorkerKey>,
    ) -> std::io::Result<Self> {
        let mut h = Self {
            tcp_version: TCP_VERSION,
            wire_version: syncopate::wire::WIRE_VERSION,
            auth: key.is_some(),
            role,
            worker,
            nonce: nonce()?,
            want: want.unwrap_or([0; KEY_LEN]),
            dim: 0,
            lost_after_ms: ms(crate::tcp::DEFAULT_LOST_AFTER),
            early_mac: [0; TAG_LEN],
        };
        if let Some(k) = key {
            h.sign(k);
        }
        Ok(h)
    }

    /// Sets `early_mac` for `key`.
    pub fn sign(&mut self, key: &WorkerKey) {
        let unsigned = Message::client_hello_unsigned(self);
        let mac = key.transcript_mac(LABEL_HELLO, &[&unsigned]);
        self.early_mac.copy_from_slice(mac.get(..TAG_LEN).unwrap_or(&[0; TAG_LEN]));
    }

    pub(super) fn early_mac_ok(&self, key: &WorkerKey) -> bool {
        key.verify_transcript_prefix(LABEL_HELLO, &[&Message::client_hello_unsigned(self)], &self.early_mac)
    }
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
    /// How long the server waits on a silent worker before it counts the worker as lost,
    /// in milliseconds (the worker beats often enough for it).
    pub lost_after_ms: u64,
    /// The run's settings, canonically encoded ([`RunSettings::encode`](crate::tcp::settings::RunSettings::encode)).
    pub settings: Vec<u8>,
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
    fn array<const N: usize>(&mut self) -> Option<[u8; N]> {
        self.take(N)?.try_into().ok()
    }
    fn bool(&mut self) -> Option<bool> {
        match self.u8()? {
            0 => Some(false),
            1 => Some(true),
            _ => None,
        }
    }
    fn bytes16(&mut self, max: usize) -> Option<&'a [u8]> {
        let n = usize::from(self.u16()?);
        if n > max {
            return None;
        }
        self.take(n)
    }
    fn magic(&mut self) -> Option<()> {
        (self.take(4)? == MAGIC).then_some(())
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

fn put_bytes16(out: &mut Vec<u8>, b: &[u8], max: usize) {
    let b = b.get(..b.len().min(max).min(usize::from(u16::MAX))).unwrap_or_default();
    out.extend_from_slice(&(b.len() as u16).to_le_bytes());
    out.extend_from_slice(b);
}

impl Message {
    /// The message's bytes (a frame payload).
    pub fn encode(&self) -> Vec<u8> {
        let mut out = Vec::with_capacity(128);
        match self {
            Self::ClientHello(h) => {
                out.extend_from_slice(&Self::client_hello_unsigned(h));
                out.extend_from_slice(&h.early_mac);
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
                let mut m = message.clone();
                truncate(&mut m, MAX_REFUSE_MESSAGE);
                put_bytes16(&mut out, m.as_bytes(), MAX_REFUSE_MESSAGE);
            }
        }
        out
    }

    /// A client hello's payload without `early_mac` (what that MAC covers).
    fn client_hello_unsigned(h: &ClientHello) -> Vec<u8> {
        let mut out = Vec::with_capacity(96);
        out.push(T_CLIENT_HELLO);
        out.extend_from_slice(&MAGIC);
        out.extend_from_slice(&h.tcp_version.to_le_bytes());
        out.push(h.wire_version);
        out.push(u8::from(h.auth));
        out.push(h.role.byte());
        out.extend_from_slice(&h.worker.0.to_le_bytes());
        out.extend_from_slice(&h.nonce);
        out.extend_from_slice(&h.want);
        out.extend_from_slice(&h.dim.to_le_bytes());
        out.extend_from_slice(&h.lost_after_ms.to_le_bytes());
        out
    }

    /// A server hello's payload without `mac_s` (what `mac_s` covers, after the client
    /// hello).
    pub(super) fn server_hello_unsigned(h: &ServerHello) -> Vec<u8> {
        let mut out = Vec::with_capacity(96 + h.settings.len());
        out.push(T_SERVER_HELLO);
        out.extend_from_slice(&MAGIC);
        out.extend_from_slice(&h.tcp_version.to_le_bytes());
        out.push(h.wire_version);
        out.push(u8::from(h.auth));
        out.extend_from_slice(&h.nonce);
        out.extend_from_slice(&h.server_id.to_le_bytes());
        out.extend_from_slice(&h.epoch.to_le_bytes());
        out.extend_from_slice(&h.version.to_le_bytes());
        out.extend_from_slice(&h.lost_after_ms.to_le_bytes());
        put_bytes16(&mut out, &h.settings, MAX_SETTINGS_LEN);
        out
    }

    /// Parses a frame payload; `None` if it is not exactly one well-formed message.
    pub fn decode(bytes: &[u8]) -> Option<Self> {
        let mut c = Cursor(bytes);
        let msg = match c.u8()? {
            T_CLIENT_HELLO => {
                c.magic()?;
                Self::ClientHello(ClientHello {
                    tcp_version: c.u16()?,
                    wire_version: c.u8()?,
                    auth: c.bool()?,
                    role: Role::from_byte(c.u8()?)?,
                    worker: WorkerId(c.u32()?),
                    nonce: c.array()?,
                    want: c.array()?,
                    dim: c.u64()?,
                    lost_after_ms: c.u64()?,
                    early_mac: c.array()?,
                })
            }
            T_SERVER_HELLO => {
                c.magic()?;
                Self::ServerHello(ServerHello {
                    tcp_version: c.u16()?,
                    wire_version: c.u8()?,
                    auth: c.bool()?,
                    nonce: c.array()?,
                    server_id: c.u64()?,
                    epoch: c.u32()?,
                    version: c.u64()?,
                    lost_after_ms: c.u64()?,
                    settings: c.bytes16(MAX_SETTINGS_LEN)?.to_vec(),
                    mac: c.array()?,
                })
            }
            T_CLIENT_AUTH => Self::ClientAuth(c.array()?),
            T_ACCEPT => Self::Accept(c.array()?),
            T_REFUSE => {
                let code = RefuseCode::from_byte(c.u8()?);
                let message = String::from_utf8(c.bytes16(MAX_REFUSE_MESSAGE)?.to_vec()).ok()?;
                Self::Refuse { code, message }
            }
            _ => return None,
        };
        c.0.is_empty().then_some(msg)
    }
}

/// A duration in whole milliseconds, as the hellos carry it (saturating).
pub fn ms(d: core::time::Duration) -> u64 {
    u64::try_from(d.as_millis()).unwrap_or(u64::MAX)
}
