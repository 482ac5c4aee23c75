//! Keys and MACs: the shared secret, per-worker keys (HKDF-SHA256), the handshake MACs
//! (HMAC-SHA256 over the transcript with a direction label) and the per-frame MAC
//! (HMAC-SHA256 over length, sequence number and payload, truncated to [`TAG_LEN`] bytes).
//!
//! Every comparison of a MAC goes through `hmac`'s constant-time `verify_*`.

use core::fmt;
use hkdf::Hkdf;
use hmac::{Hmac, KeyInit, Mac};
use sha2::Sha256;
use std::path::Path;
use syncopate::WorkerId;

type HmacSha256 = Hmac<Sha256>;

/// Bytes of a derived key, a nonce and a full handshake MAC.
pub const KEY_LEN: usize = 32;
/// Bytes of the truncated MAC that ends every authenticated frame.
pub const TAG_LEN: usize = 16;
/// The shortest shared secret accepted, in bytes.
pub const MIN_SECRET_LEN: usize = 16;
/// The environment variable the CLI reads the shared secret from.
pub const SECRET_ENV: &str = "SYNCOPATE_SECRET";

const KEY_SALT: &[u8] = b"syncopate-tcp-v1 worker key";
const SESSION_INFO_TO_WORKER: &[u8] = b"syncopate-tcp-v1 session server->worker";
const SESSION_INFO_TO_SERVER: &[u8] = b"syncopate-tcp-v1 session worker->server";

/// Direction labels of the handshake MACs: a MAC made for one role is never valid for the
/// other (no reflection).
pub(crate) const LABEL_SERVER: &[u8] = b"syncopate-tcp-v1 server hello";
pub(crate) const LABEL_CLIENT: &[u8] = b"syncopate-tcp-v1 client auth";
pub(crate) const LABEL_ACCEPT: &[u8] = b"syncopate-tcp-v1 server accept";
/// The label of the client hello's early MAC (transport version 2).
pub(crate) const LABEL_HELLO: &[u8] = b"syncopate-tcp-v2 client hello";

/// The master secret shared by the server (and, in the simplest deployment, the workers).
#[derive(Clone)]
pub struct Secret(Vec<u8>);

impl fmt::Debug for Secret {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "Secret({} bytes)", self.0.len())
    }
}

/// Why a secret could not be loaded.
#[derive(Debug)]
pub struct SecretError(pub String);

impl fmt::Display for SecretError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.0)
    }
}

impl core::error::Error for SecretError {}

impl Secret {
    /// A secret from raw bytes; trailing ASCII whitespace (a newline from `echo`) is
    /// removed. Refused if shorter than [`MIN_SECRET_LEN`] bytes.
    pub fn new(bytes: &[u8]) -> Result<Self, SecretError> {
        let end = bytes.iter().rposition(|b| !b.is_ascii_whitespace()).map_or(0, |i| i + 1);
        let trimmed = bytes.get(..end).unwrap_or_default();
        if trimmed.len() < MIN_SECRET_LEN {
            return Err(SecretError(format!(
                "shared secret is {} bytes long, at least {MIN_SECRET_LEN} are required",
                trimmed.len()
            )));
        }
        Ok(Self(trimmed.to_vec()))
    }

    /// Reads the secret from a file.
    pub fn from_file(path: &Path) -> Result<Self, SecretError> {
        let bytes =
            std::fs::read(path).map_err(|e| SecretError(format!("cannot read secret file {}: {e}", path.display())))?;
        Self::new(&bytes).map_err(|e| SecretError(format!("secret file {}: {e}", path.display())))
    }

    /// Reads the secret from the environment variable `var`; `Ok(None)` if it is unset.
    pub fn from_env(var: &str) -> Result<Option<Self>, SecretError> {
        match std::env::var_os(var) {
            None => Ok(None),
            Some(v) => Self::new(v.as_encoded_bytes()).map(Some).map_err(|e| SecretError(format!("${var}: {e}"))),
        }
    }

    /// The key of worker `id`: HKDF-SHA256 with this secret as input key material, a fixed
    /// salt, and the id (u32 little-endian) in the info. Knowing one worker's key does not
    /// give another's.
    pub fn worker_key(&self, id: WorkerId) -> WorkerKey {
        let hk = Hkdf::<Sha256>::new(Some(KEY_SALT), &self.0);
        let mut info = *b"worker \0\0\0\0";
        if let Some(slot) = info.get_mut(7..11) {
            slot.copy_from_slice(&id.0.to_le_bytes());
        }
        let mut key = [0u8; KEY_LEN];
        // 32 bytes is far below HKDF-SHA256's limit of 255 * 32; this cannot fail.
        let _ = hk.expand(&info, &mut key);
        WorkerKey(key)
    }
}

/// One worker's key, derived from the master secret and the worker id.
#[derive(Clone)]
pub struct WorkerKey([u8; KEY_LEN]);

impl fmt::Debug for WorkerKey {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("WorkerKey(..)")
    }
}

fn hmac(key: &[u8]) -> HmacSha256 {
    // HMAC takes keys of any length; this cannot fail.
    <HmacSha256 as KeyInit>::new_from_slice(key).unwrap_or_else(|_| unreachable!("HMAC accepts any key length"))
}

impl WorkerKey {
    /// The handshake MAC: HMAC-SHA256 keyed with this key over `label || parts...`.
    pub(crate) fn transcript_mac(&self, label: &[u8], parts: &[&[u8]]) -> [u8; KEY_LEN] {
        let mut m = hmac(&self.0);
        m.update(label);
        for p in parts {
            m.update(p);
        }
        m.finalize().into_bytes().into()
    }

    /// Constant-time check of a handshake MAC.
    pub(crate) fn verify_transcript(&self, label: &[u8], parts: &[&[u8]], mac: &[u8]) -> bool {
        let mut m = hmac(&self.0);
        m.update(label);
        for p in parts {
            m.update(p);
        }
        m.verify_slice(mac).is_ok()
    }

    /// Constant-time check of a handshake MAC truncated to its first `mac.len()` bytes
    /// (at least [`TAG_LEN`]).
    pub(crate) fn verify_transcript_prefix(&self, label: &[u8], parts: &[&[u8]], mac: &[u8]) -> bool {
        if mac.len() < TAG_LEN {
            return false;
        }
        let mut m = hmac(&self.0);
        m.update(label);
        for p in parts {
            m.update(p);
        }
        m.verify_truncated_left(mac).is_ok()
    }

    /// The two session keys (server→worker, worker→server) for a handshake with these nonces.
    pub(crate) fn session_keys(&self, client_nonce: &[u8], server_nonce: &[u8]) -> SessionKeys {
        let mut salt = [0u8; 2 * KEY_LEN];
        for (d, s) in salt.iter_mut().zip(client_nonce.iter().chain(server_nonce)) {
            *d = *s;
        }
        let hk = Hkdf::<Sha256>::new(Some(&salt), &self.0);
        let mut to_worker = [0u8; KEY_LEN];
        let mut to_server = [0u8; KEY_LEN];
        let _ = hk.expand(SESSION_INFO_TO_WORKER, &mut to_worker);
        let _ = hk.expand(SESSION_INFO_TO_SERVER, &mut to_server);
        SessionKeys { to_worker: FrameMac::new(&to_worker), to_server: FrameMac::new(&to_server) }
    }
}

/// The frame MACs of one session, one per direction.
#[derive(Clone, Debug)]
pub(crate) struct SessionKeys {
    pub(crate) to_worker: FrameMac,
    pub(crate) to_server: FrameMac,
}

/// The MAC of one direction of a session: HMAC-SHA256 over `len (u32 LE) || seq (u64 LE)
/// || payload`, truncated to its first [`TAG_LEN`] bytes. The keyed state is computed once.
#[derive(Clone)]
pub struct FrameMac(HmacSha256);

impl fmt::Debug for FrameMac {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("FrameMac(..)")
    }
}

impl FrameMac {
    /// A frame MAC keyed with `key`.
    pub fn new(key: &[u8]) -> Self {
        Self(hmac(key))
    }

    fn start(&self, len: u32, seq: u64, payload: &[u8]) -> HmacSha256 {
        let mut m = self.0.clone();
        m.update(&len.to_le_bytes());
        m.update(&seq.to_le_bytes());
        m.update(payload);
        m
    }

    /// The tag of a frame.
    pub fn tag(&self, len: u32, seq: u64, payload: &[u8]) -> [u8; TAG_LEN] {
        let full = self.start(len, seq, payload).finalize().into_bytes();
        let mut tag = [0u8; TAG_LEN];
        for (d, s) in tag.iter_mut().zip(full.iter()) {
            *d = *s;
        }
        tag
    }

    /// Constant-time check of a frame's tag.
    pub fn verify(&self, len: u32, seq: u64, payload: &[u8], tag: &[u8]) -> bool {
        tag.len() == TAG_LEN && self.start(len, seq, payload).verify_truncated_left(tag).is_ok()
    }
}

/// `KEY_LEN` bytes from the operating system's random number generator.
pub(crate) fn nonce() -> std::io::Result<[u8; KEY_LEN]> {
    let mut n = [0u8; KEY_LEN];
    getrandom::fill(&mut n).map_err(|e| std::io::Error::other(format!("OS random number generator: {e}")))?;
    Ok(n)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn secrets_are_trimmed_and_checked() {
        assert!(Secret::new(b"short").is_err());
        assert!(Secret::new(b"0123456789abcde \n").is_err());
        let s = Secret::new(b"0123456789abcdef\n").unwrap();
        assert_eq!(s.0, b"0123456789abcdef");
        assert!(!format!("{s:?}").contains("0123"));
    }

    #[test]
    fn worker_keys_differ_by_id_and_secret() {
        let a = Secret::new(b"0123456789abcdef").unwrap();
        let b = Secret::new(b"0123456789abcdeX").unwrap();
        assert_eq!(a.worker_key(WorkerId(1)).0, a.worker_key(WorkerId(1)).0);
        assert_ne!(a.worker_key(WorkerId(1)).0, a.worker_key(WorkerId(2)).0);
        assert_ne!(a.worker_key(WorkerId(1)).0, b.worker_key(WorkerId(1)).0);
    }

    #[test]
    fn transcript_macs_are_labelled() {
        let k = Secret::new(b"0123456789abcdef").unwrap().worker_key(WorkerId(0));
        let mac = k.transcript_mac(LABEL_SERVER, &[b"hello", b"world"]);
        assert!(k.verify_transcript(LABEL_SERVER, &[b"helloworld"], &mac));
        assert!(!k.verify_transcript(LABEL_CLIENT, &[b"helloworld"], &mac));
        assert!(!k.verify_transcript(LABEL_SERVER, &[b"helloworle"], &mac));
        assert!(!k.verify_transcript(LABEL_SERVER, &[b"helloworld"], &mac[..16]));
    }

    #[test]
    fn frame_tags_cover_length_seq_and_payload() {
        let k = Secret::new(b"0123456789abcdef").unwrap().worker_key(WorkerId(0));
        let keys = k.session_keys(&[1; 32], &[2; 32]);
        let t = keys.to_server.tag(10, 3, b"ab");
        assert!(keys.to_server.verify(10, 3, b"ab", &t));
        assert!(!keys.to_worker.verify(10, 3, b"ab", &t));
        assert!(!keys.to_server.verify(11, 3, b"ab", &t));
        assert!(!keys.to_server.verify(10, 4, b"ab", &t));
        assert!(!keys.to_server.verify(10, 3, b"ac", &t));
        assert!(!keys.to_server.verify(10, 3, b"ab", &t[..15]));
        let other = k.session_keys(&[1; 32], &[3; 32]);
        assert!(!other.to_server.verify(10, 3, b"ab", &t));
    }
}
