//! The checks of the `handshake` fuzz target, shared with `tests/tests/fuzz_parsers_corpus.rs`.
//!
//! Every input goes to both parsers of the TCP handshake: [`Message::decode`] (a hello,
//! auth, accept or refusal) and [`RunSettings::decode`] (the settings a server announces,
//! also parsed out of every decoded server hello). No panic; what is accepted re-encodes to
//! the same bytes (a refusal's unknown code byte excepted: it reads as a known code) and
//! decodes again to the same value; and everything a worker derives from a peer's settings
//! (dimension, configurations, shard layout, digests, label) returns without panicking.

use syncopate_adapters::tcp::handshake::Message;
use syncopate_adapters::tcp::settings::RunSettings;

/// Runs every check on `data`; panics on a violation. Returns how many parses accepted it.
pub(crate) fn check(data: &[u8]) -> usize {
    let mut accepted = check_settings(data);
    if let Some(msg) = Message::decode(data) {
        accepted += 1;
        let again = msg.encode();
        match &msg {
            // An unknown refusal code reads as a known one: the other bytes are kept.
            Message::Refuse { code, .. } if data.get(1) != Some(&code.byte()) => {
                assert_eq!(again.len(), data.len());
                assert_eq!((again.first(), again.get(2..)), (data.first(), data.get(2..)));
            }
            _ => assert!(again == data, "re-encoding a decoded handshake message changed its bytes"),
        }
        assert_eq!(Message::decode(&again).as_ref(), Some(&msg), "a re-encoded message decodes differently");
        if let Message::ServerHello(h) = &msg {
            accepted += check_settings(&h.settings);
        }
    }
    accepted
}

/// The settings checks; 1 if `bytes` are accepted settings.
fn check_settings(bytes: &[u8]) -> usize {
    let Ok(s) = RunSettings::decode(bytes) else { return 0 };
    let again = s.encode().unwrap_or_else(|e| panic!("accepted settings do not re-encode: {e}"));
    assert!(again == bytes, "re-encoding accepted settings changed their bytes");
    let back = RunSettings::decode(&again).unwrap_or_else(|e| panic!("re-encoded settings refused: {e}"));
    assert!(back.encode().ok() == Some(again), "re-decoded settings encode differently");
    assert!(s.digest().is_ok());
    let _ = (s.dim(), s.peers(), s.label(), s.run_digest());
    let _ = (s.worker_config(), s.shard_worker_config(), s.server_config());
    if let (Ok(Some(_)), Ok(r), Ok(dim)) = (s.shard_layout(), s.served_range(), s.dim()) {
        assert!(r.start < r.end && r.end <= dim, "a shard's range {r:?} outside the model of {dim}");
    }
    1
}
