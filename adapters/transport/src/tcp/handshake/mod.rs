//! The connection handshake: compatibility checks (transport and wire versions, worker id,
//! role), the run's settings from the server, and, with a shared secret, mutual
//! HMAC-SHA256 challenge-response over the whole transcript.
//!
//! ```text
//! worker                                         server
//!   ClientHello{versions, auth, role, id, nonce_c, want, dim, lost_after, wire, early_mac}  ->
//!     <-  ServerHello{versions, auth, nonce_s, server id, epoch, version, lost_after, wire, settings, mac_s}
//!   ClientAuth{mac_c}                                                ->
//!                <-  Accept{mac_a}            (or Refuse{code, message} at any step)
//! ```
//!
//! `early_mac = HMAC(k_w, "syncopate-tcp-v2 client hello" || CH without early_mac)[..16]`
//! lets the server tell a worker holding the secret from anybody else as soon as the first
//! frame is in, before it spends anything on the connection (see the admission rules in
//! [`server`](super::server)).
//! `mac_s = HMAC(k_w, "syncopate-tcp-v1 server hello" || CH || SH without mac_s)`,
//! `mac_c = HMAC(k_w, "syncopate-tcp-v1 client auth" || CH || SH)`,
//! `mac_a = HMAC(k_w, "syncopate-tcp-v1 server accept" || CH || SH || CA)`, where `CH`, `SH`
//! and `CA` are the frames' payloads and `k_w` the worker's key
//! ([`Secret::worker_key`](super::auth::Secret::worker_key)). The session's frame keys are
//! then derived from `k_w` and both nonces. Without a secret the MACs are all zero and not
//! checked, and frames carry no tag. Either side may send `Refuse` instead of its next
//! message; the receiver reports its message. `adapters/transport/TCP.md` gives the byte layout.
//!
//! The run's settings ([`RunSettings`]) travel in the server hello as their canonical
//! bytes, covered by `mac_s`; `want` in the client hello is the SHA-256 of the settings the
//! worker insists on (all zero: whatever the server runs).
//!
//! **Wire.** The server hello names the tensor encoding of the session's core messages
//! (`f32`, `bf16` or `fp16`, [`Encoding`]); a worker that asks for another one in its hello
//! is refused ([`RefuseCode::Wire`]) with a line naming both.
//!
//! **Liveness.** Each hello carries its sender's silence limit (`lost_after`, in
//! milliseconds): each side then beats at the [`heartbeat_interval`](super::heartbeat_interval)
//! of the smaller of the two limits ([`Session::beat`]), so neither side declares a healthy
//! peer lost. A limit below [`MIN_LOST_AFTER`](super::MIN_LOST_AFTER) (twice the shortest
//! beat) is refused.

mod messages;

pub use messages::{
    ClientHello, HANDSHAKE_MAX_LEN, MAGIC, MAX_REFUSE_MESSAGE, Message, RefuseCode, Role, SERVER_HANDSHAKE_MAX_LEN,
    ServerHello, TCP_VERSION, ms,
};

use super::auth::{KEY_LEN, LABEL_ACCEPT, LABEL_CLIENT, LABEL_SERVER, WorkerKey, nonce};
use super::frame::{FrameError, FrameReader, FrameWriter};
use super::settings::RunSettings;
use core::fmt;
use std::io::Write;
use std::time::Instant;
use syncopate::WorkerId;
use syncopate::wire::Encoding;

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
            Self::Refused { message, .. } => write!(f, "refused by peer: {}", PeerText(message)),
            Self::Refusing { message, .. } => f.write_str(message),
            Self::Frame(e) => write!(f, "handshake: {e}"),
        }
    }
}

impl core::error::Error for HandshakeError {}

/// The most characters of a peer's text (a `Refuse` message) printed; the rest is cut and
/// marked.
pub const MAX_PEER_TEXT: usize = 160;

/// Text a peer supplied, made safe to print on one line of an operator's log: control and
/// formatting characters (newlines, terminal escapes, bidirectional overrides) are shown
/// escaped, and at most [`MAX_PEER_TEXT`] characters are shown. An unauthenticated client
/// can send such text, so it never reaches a log verbatim.
#[derive(Clone, Copy, Debug)]
pub struct PeerText<'a>(pub &'a str);

impl fmt::Display for PeerText<'_> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let mut chars = self.0.chars();
        for c in chars.by_ref().take(MAX_PEER_TEXT) {
            let unsafe_char = c.is_control()
                || matches!(c, '\u{200B}'..='\u{200F}' | '\u{2028}'..='\u{202E}' | '\u{2060}'..='\u{206F}' | '\u{FEFF}');
            if unsafe_char {
                write!(f, "{}", c.escape_default())?;
            } else {
                write!(f, "{c}")?;
            }
        }
        if chars.next().is_some() {
            f.write_str(" [cut]")?;
        }
        Ok(())
    }
}

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

/// What the server needs to run a handshake.
#[derive(Debug)]
pub struct ServerSide<'a> {
    /// The run's settings, canonically encoded.
    pub settings: &'a [u8],
    /// Their SHA-256.
    pub digest: [u8; KEY_LEN],
    /// A one-line description of the settings, for refusals.
    pub label: &'a str,
    /// The number of peers (ids `0..peers`).
    pub peers: u32,
    /// The role every peer must have.
    pub role: Role,
    /// The master secret, if authenticating.
    pub secret: Option<&'a super::auth::Secret>,
    /// This server run's id.
    pub server_id: u64,
    /// The model version to announce.
    pub version: u64,
    /// The model's number of parameters (a worker announcing another is refused).
    pub dim: u64,
    /// How long the server waits on a silent worker.
    pub lost_after: core::time::Duration,
    /// The tensor encoding of every session.
    pub wire: Encoding,
}

/// The deadlines of the server's side of a handshake.
#[derive(Clone, Copy, Debug)]
pub struct Deadlines {
    /// The client hello must be in by then.
    pub hello: Instant,
    /// The whole handshake must be done by then.
    pub done: Instant,
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
    /// How long the peer waits on a silent session before it counts it as lost.
    pub peer_lost_after: core::time::Duration,
    /// The tensor encoding of the session's core messages, both ways.
    pub wire: Encoding,
}

impl Session {
    /// How often this side sends a heartbeat when it has nothing else to send, for its own
    /// silence limit `lost_after` and the peer's: often enough for the stricter of the two.
    pub fn beat(&self, lost_after: core::time::Duration) -> core::time::Duration {
        super::heartbeat_interval(lost_after.min(self.peer_lost_after))
    }
}

/// Refuses a peer's silence limit below [`MIN_LOST_AFTER`](super::MIN_LOST_AFTER).
fn check_peer_lost_after(peer: &str, lost_after_ms: u64) -> Result<core::time::Duration, String> {
    let d = core::time::Duration::from_millis(lost_after_ms);
    super::check_lost_after(d).map_err(|e| format!("the {peer} announces {e}"))?;
    Ok(d)
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

/// Checks what must hold before anything else: the transport version, the worker id (its
/// key depends on it) and the authentication mode, then the early MAC. A hello that passes
/// comes from a holder of the worker's key (or, without a secret, is at least well formed).
fn check_identity(h: &ClientHello, side: &ServerSide<'_>) -> Result<Option<WorkerKey>, (RefuseCode, String)> {
    if h.tcp_version != TCP_VERSION {
        return Err((
            RefuseCode::TcpVersion,
            format!("transport version mismatch: server speaks {TCP_VERSION}, worker {}", h.tcp_version),
        ));
    }
    if h.worker.0 >= side.peers {
        return Err((
            RefuseCode::WorkerId,
            format!(
                "worker id {} is out of range: the server has {}",
                h.worker.0,
                if side.peers == 1 {
                    "one worker, id 0".to_owned()
                } else {
                    format!("workers 0 to {}", side.peers - 1)
                }
            ),
        ));
    }
    let key = match (side.secret, h.auth) {
        (Some(_), false) => {
            return Err((
                RefuseCode::AuthMode,
                format!("server requires authentication but worker {} has no shared secret", h.worker.0),
            ));
        }
        (None, true) => {
            return Err((
                RefuseCode::AuthMode,
                format!("server runs without a shared secret but worker {} offers one", h.worker.0),
            ));
        }
        (Some(s), true) => Some(s.worker_key(h.worker)),
        (None, false) => None,
    };
    if let Some(k) = &key {
        if !h.early_mac_ok(k) {
            return Err((
                RefuseCode::AuthFailed,
                format!("authentication failed for worker {}: wrong shared secret", h.worker.0),
            ));
        }
    }
    Ok(key)
}

/// Checks an identified hello against the run: wire version, role, pinned settings.
fn check_terms(h: &ClientHello, side: &ServerSide<'_>) -> Result<(), (RefuseCode, String)> {
    let wire = syncopate::wire::WIRE_VERSION;
    if h.wire_version != wire {
        return Err((
            RefuseCode::WireVersion,
            format!("wire version mismatch: server speaks {wire}, worker {}", h.wire_version),
        ));
    }
    if let Some(asked) = h.wire.filter(|w| *w != side.wire) {
        let message = format!("worker asks for {asked}, server speaks {} (worker {})", side.wire, h.worker.0);
        return Err((RefuseCode::Wire, message));
    }
    if h.role != side.role {
        return Err((
            RefuseCode::Role,
            format!(
                "this server takes only {}s, but a {} connected as {}",
                side.role.name(),
                h.role.name(),
                h.worker.0
            ),
        ));
    }
    if h.dim != 0 && h.dim != side.dim {
        return Err((
            RefuseCode::Knobs,
            format!(
                "model size mismatch: the server's model has {} parameters, worker {}'s has {}",
                side.dim, h.worker.0, h.dim
            ),
        ));
    }
    if let Err(e) = check_peer_lost_after("worker", h.lost_after_ms) {
        return Err((RefuseCode::Malformed, format!("worker {}: {e}", h.worker.0)));
    }
    if h.want != [0; KEY_LEN] && h.want != side.digest {
        return Err((
            RefuseCode::Knobs,
            format!(
                "run settings differ: worker {} expects other settings than the server's ({})",
                h.worker.0, side.label
            ),
        ));
    }
    Ok(())
}

/// Runs the server side over a fresh connection. The client hello must arrive by
/// `deadlines.hello`, the rest by `deadlines.done`. `admit` is called once the hello is
/// identified (its early MAC verified) and compatible; it returns the worker's epoch, or a
/// refusal (a replayed hello, a connection evicted meanwhile). On success the reader and
/// writer are switched to session mode (MACs, `session_max_len`).
pub fn server_handshake<W: Write>(
    reader: &mut FrameReader,
    writer: &mut FrameWriter<W>,
    side: &ServerSide<'_>,
    deadlines: Deadlines,
    session_max_len: usize,
    admit: impl FnOnce(&ClientHello) -> Result<u32, (RefuseCode, String)>,
) -> Result<Session, HandshakeError> {
    reader.set_hard_deadline(Some(deadlines.done.min(deadlines.hello)));
    reader.set_max_len(HANDSHAKE_MAX_LEN);
    writer.set_max_len(SERVER_HANDSHAKE_MAX_LEN);
    let mut buf = Vec::with_capacity(HANDSHAKE_MAX_LEN);
    let hello = match read_message(reader, &mut buf, deadlines.hello) {
        Ok(Message::ClientHello(h)) => h,
        Ok(_) => return Err(refuse(writer, RefuseCode::Malformed, "expected a client hello".into(), None)),
        Err(HandshakeError::Refusing { code, message, worker }) => return Err(refuse(writer, code, message, worker)),
        Err(e) => return Err(e),
    };
    reader.set_hard_deadline(Some(deadlines.done));
    let ch_bytes = buf.get(super::frame::SEQ_BYTES..).unwrap_or_default().to_vec();
    let key = match check_identity(&hello, side) {
        Ok(key) => key,
        Err((code, message)) => return Err(refuse(writer, code, message, Some(hello.worker))),
    };
    let worker = hello.worker;
    let epoch = match check_terms(&hello, side).and_then(|()| admit(&hello)) {
        Ok(epoch) => epoch,
        Err((code, message)) => return Err(refuse(writer, code, message, Some(worker))),
    };
    let mut sh = ServerHello {
        tcp_version: TCP_VERSION,
        wire_version: syncopate::wire::WIRE_VERSION,
        auth: key.is_some(),
        nonce: nonce()?,
        server_id: side.server_id,
        epoch,
        version: side.version,
        lost_after_ms: ms(side.lost_after),
        wire: side.wire,
        settings: side.settings.to_vec(),
        mac: [0; KEY_LEN],
    };
    let sh_unsigned = Message::server_hello_unsigned(&sh);
    if let Some(k) = &key {
        sh.mac = k.transcript_mac(LABEL_SERVER, &[&ch_bytes, &sh_unsigned]);
    }
    let sh_bytes = Message::ServerHello(sh.clone()).encode();
    writer.write_frame(&sh_bytes)?;
    let mac_c = match read_message(reader, &mut buf, deadlines.done) {
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
    let peer_lost_after = core::time::Duration::from_millis(hello.lost_after_ms);
    Ok(Session { worker, epoch, server_id: side.server_id, version: side.version, peer_lost_after, wire: side.wire })
}

/// Who the worker side of a handshake is.
#[derive(Clone, Copy, Debug)]
pub struct ClientSide<'a> {
    /// The worker's id.
    pub worker: WorkerId,
    /// A worker or a group server.
    pub role: Role,
    /// The worker's key, if the server authenticates.
    pub key: Option<&'a WorkerKey>,
    /// The settings the worker insists on (their digest), if any.
    pub want: Option<[u8; KEY_LEN]>,
    /// The number of parameters of the worker's own model, if it has one: the server
    /// refuses the worker if its model has another size.
    pub dim: Option<u64>,
    /// How long the worker waits on a silent server.
    pub lost_after: core::time::Duration,
    /// The tensor encoding the worker asks for; `None`: the server's.
    pub wire: Option<Encoding>,
}

/// Runs the worker side over a fresh connection and returns the session with the run's
/// settings. On success the reader and writer are switched to session mode.
pub fn client_handshake<W: Write>(
    reader: &mut FrameReader,
    writer: &mut FrameWriter<W>,
    me: &ClientSide<'_>,
    deadline: Instant,
) -> Result<(Session, RunSettings), HandshakeError> {
    client_handshake_checked(reader, writer, me, deadline, &|_| Ok(()))
}

/// [`client_handshake`], with `check` judging the server's (authenticated) settings before
/// the worker answers: an error is sent to the server as a refusal (code
/// [`RefuseCode::Knobs`]) and returned, so both sides log the same line. A sharded worker
/// checks each shard's identity this way.
pub fn client_handshake_checked<W: Write>(
    reader: &mut FrameReader,
    writer: &mut FrameWriter<W>,
    me: &ClientSide<'_>,
    deadline: Instant,
    check: &dyn Fn(&RunSettings) -> Result<(), String>,
) -> Result<(Session, RunSettings), HandshakeError> {
    let (worker, key) = (me.worker, me.key);
    reader.set_hard_deadline(Some(deadline));
    reader.set_max_len(SERVER_HANDSHAKE_MAX_LEN);
    writer.set_max_len(HANDSHAKE_MAX_LEN);
    let mut hello = ClientHello::new(worker, me.role, me.want, key)?;
    hello.dim = me.dim.unwrap_or(0);
    hello.lost_after_ms = ms(me.lost_after);
    hello.wire = me.wire;
    // Signed again: the early MAC covers the fields just set.
    if let Some(k) = key {
        hello.sign(k);
    }
    let ch_bytes = Message::ClientHello(hello.clone()).encode();
    writer.write_frame(&ch_bytes)?;
    let mut buf = Vec::with_capacity(SERVER_HANDSHAKE_MAX_LEN);
    let sh = match read_message(reader, &mut buf, deadline) {
        Ok(Message::ServerHello(sh)) => sh,
        Ok(_) => return Err(refuse(writer, RefuseCode::Malformed, "expected a server hello".into(), Some(worker))),
        Err(HandshakeError::Refusing { code, message, .. }) => {
            return Err(refuse(writer, code, message, Some(worker)));
        }
        Err(e) => return Err(e),
    };
    let sh_bytes = buf.get(super::frame::SEQ_BYTES..).unwrap_or_default().to_vec();
    let wire = syncopate::wire::WIRE_VERSION;
    if sh.tcp_version != TCP_VERSION || sh.wire_version != wire {
        let message = format!(
            "version mismatch: server speaks transport {} wire {}, worker transport {TCP_VERSION} wire {wire}",
            sh.tcp_version, sh.wire_version
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
    if let Some(asked) = me.wire.filter(|w| *w != sh.wire) {
        let message = format!("worker asks for {asked}, server speaks {}", sh.wire);
        return Err(refuse(writer, RefuseCode::Wire, message, Some(worker)));
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
    // Only now, with the settings authenticated, are they worth reading.
    let settings = match RunSettings::decode(&sh.settings) {
        Ok(s) => s,
        Err(e) => return Err(refuse(writer, RefuseCode::Malformed, e, Some(worker))),
    };
    if me.want.is_some_and(|w| w != super::settings::digest(&sh.settings)) {
        let message = format!("the server runs other settings than this worker expects: {}", settings.label());
        return Err(refuse(writer, RefuseCode::Knobs, message, Some(worker)));
    }
    if let Err(message) = check(&settings) {
        return Err(refuse(writer, RefuseCode::Knobs, message, Some(worker)));
    }
    let peer_lost_after = match check_peer_lost_after("server", sh.lost_after_ms) {
        Ok(d) => d,
        Err(e) => return Err(refuse(writer, RefuseCode::Malformed, e, Some(worker))),
    };
    let session_max_len = match settings.dim() {
        Ok(dim) => super::session_max_len(dim),
        Err(e) => return Err(refuse(writer, RefuseCode::ModelShape, e, Some(worker))),
    };
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
    let (epoch, server_id, version, wire) = (sh.epoch, sh.server_id, sh.version, sh.wire);
    let session = Session { worker, epoch, server_id, version, peer_lost_after, wire };
    Ok((session, settings))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_peers_refusal_is_printed_escaped_and_capped() {
        let message = format!("ok\nFAKE LOG LINE\r\u{1b}[31mred\u{202E}{}", "x".repeat(400));
        let shown = HandshakeError::Refused { code: RefuseCode::Busy, message }.to_string();
        assert!(!shown.chars().any(|c| c.is_control() || c == '\u{202E}'), "{shown:?}");
        assert!(shown.contains("ok\\nFAKE LOG LINE\\r\\u{1b}[31mred\\u{202e}"), "{shown:?}");
        assert!(shown.ends_with(" [cut]"), "{shown:?}");
        assert!(shown.chars().count() < MAX_PEER_TEXT + 40, "{shown:?}");
        assert_eq!(PeerText("plain words").to_string(), "plain words");
    }
    use crate::protocol_spec::ProtocolKind;
    use crate::tcp::auth::Secret;
    use crate::tcp::settings::{ProtocolSettings, digest};

    fn settings() -> Vec<u8> {
        RunSettings::new(ProtocolSettings::named(ProtocolKind::Bsp, 2, 0.5), 650).encode().unwrap()
    }

    #[test]
    fn messages_round_trip_and_reject_trailing_bytes() {
        let msgs = [
            Message::ClientHello(ClientHello {
                tcp_version: TCP_VERSION,
                wire_version: 1,
                auth: true,
                role: Role::Group,
                worker: WorkerId(3),
                nonce: [9; 32],
                want: [4; 32],
                dim: 5994,
                lost_after_ms: 500,
                wire: Some(Encoding::Bf16),
                early_mac: [8; 16],
            }),
            Message::ServerHello(ServerHello {
                tcp_version: TCP_VERSION,
                wire_version: 1,
                auth: false,
                nonce: [1; 32],
                server_id: 77,
                epoch: 4,
                version: 12,
                lost_after_ms: 10_000,
                wire: Encoding::Fp16,
                settings: settings(),
                mac: [2; 32],
            }),
            Message::ClientAuth([5; 32]),
            Message::Accept([6; 32]),
            Message::Refuse { code: RefuseCode::Knobs, message: "nope".into() },
        ];
        for m in msgs {
            let bytes = m.encode();
            assert!(bytes.len() + 8 <= SERVER_HANDSHAKE_MAX_LEN);
            assert_eq!(Message::decode(&bytes), Some(m.clone()));
            let mut longer = bytes.clone();
            longer.push(0);
            assert_eq!(Message::decode(&longer), None);
            for cut in 0..bytes.len() {
                assert_eq!(Message::decode(&bytes[..cut]), None);
            }
        }
        let hello = Message::ClientHello(ClientHello::new(WorkerId(0), Role::Worker, None, None).unwrap());
        assert_eq!(hello.encode().len(), 111, "adapters/transport/TCP.md §5 gives this length");
        assert!(hello.encode().len() + 8 <= HANDSHAKE_MAX_LEN);
        assert_eq!(Message::decode(b"GET / HTTP/1.1\r\n"), None);
    }

    #[test]
    fn hello_checks_name_what_is_wrong() {
        let s = settings();
        let secret = Secret::new(b"sixteen bytes at least").unwrap();
        let side = ServerSide {
            settings: &s,
            digest: digest(&s),
            label: "bsp",
            peers: 2,
            role: Role::Worker,
            secret: Some(&secret),
            server_id: 1,
            version: 0,
            dim: 7,
            lost_after: crate::tcp::DEFAULT_LOST_AFTER,
            wire: Encoding::F32,
        };
        let key = secret.worker_key(WorkerId(1));
        let good = ClientHello::new(WorkerId(1), Role::Worker, Some(digest(&s)), Some(&key)).unwrap();
        assert!(check_identity(&good, &side).unwrap().is_some());
        assert!(check_terms(&good, &side).is_ok());
        let asks = ClientHello { wire: Some(Encoding::Bf16), ..good.clone() };
        let (code, line) = check_terms(&asks, &side).unwrap_err();
        assert_eq!((code, line.as_str()), (RefuseCode::Wire, "worker asks for bf16, server speaks f32 (worker 1)"));
        assert!(check_terms(&ClientHello { wire: Some(Encoding::F32), ..good.clone() }, &side).is_ok());
        // A worker of another model size is refused, both sizes named; one of the same
        // size, or one that takes the server's (0), is not.
        let mut sized = good.clone();
        sized.dim = 9;
        let (code, why) = check_terms(&sized, &side).unwrap_err();
        assert_eq!(code, RefuseCode::Knobs);
        assert_eq!(why, "model size mismatch: the server's model has 7 parameters, worker 1's has 9");
        sized.dim = 7;
        assert!(check_terms(&sized, &side).is_ok());
        let mut h = good.clone();
        h.nonce[0] ^= 1;
        assert_eq!(check_identity(&h, &side).unwrap_err().0, RefuseCode::AuthFailed, "the early MAC covers the nonce");
        let other = Secret::new(b"another secret of sixteen").unwrap();
        let wrong = ClientHello::new(WorkerId(1), Role::Worker, None, Some(&other.worker_key(WorkerId(1)))).unwrap();
        assert_eq!(check_identity(&wrong, &side).unwrap_err().0, RefuseCode::AuthFailed);
        let mut h = good.clone();
        h.worker = WorkerId(2);
        assert_eq!(check_identity(&h, &side).unwrap_err().0, RefuseCode::WorkerId);
        let h = ClientHello::new(WorkerId(0), Role::Worker, None, None).unwrap();
        assert_eq!(check_identity(&h, &side).unwrap_err().0, RefuseCode::AuthMode);
        let mut h = good.clone();
        h.want = [1; 32];
        let (code, msg) = check_terms(&h, &side).unwrap_err();
        assert_eq!(code, RefuseCode::Knobs);
        assert!(msg.contains("run settings differ") && msg.contains("bsp"), "{msg}");
        let mut h = good.clone();
        h.role = Role::Group;
        assert_eq!(check_terms(&h, &side).unwrap_err().0, RefuseCode::Role);
        let mut h = good;
        h.wire_version = 99;
        assert_eq!(check_terms(&h, &side).unwrap_err().0, RefuseCode::WireVersion);
    }
}
