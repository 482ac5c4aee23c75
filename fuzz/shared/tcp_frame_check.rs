//! The checks of the `tcp_frame` fuzz target, shared with `tests/tests/fuzz_parsers_corpus.rs`.
//!
//! Input: one mode byte, then the bytes a peer sends on a TCP connection. The mode's two low
//! bits say after how many frames the reader starts checking MACs (3: never), as a session
//! does after its handshake; bits 2-3 pick the reader's largest frame. The bytes go through
//! a real loopback connection into [`FrameReader`], frame after frame until it stops.
//!
//! Checks: no panic and no hang; the reader ends with `Closed` only after consuming every
//! byte and with `Truncated` only before; and the accepted frames, written again by
//! [`FrameWriter`] with the same MAC schedule and limit, give back exactly the bytes they
//! were read from (sequence numbers, lengths and tags included).

use std::io::Write as _;
use std::net::{Shutdown, TcpListener, TcpStream};
use std::sync::OnceLock;
use syncopate_adapters::tcp::auth::{FrameMac, TAG_LEN};
use syncopate_adapters::tcp::frame::{FrameError, FrameReader, FrameTimeout, FrameWriter, LEN_BYTES, SEQ_BYTES};

/// The key of the MACs (both sides know it, as after a real handshake).
pub(crate) const KEY: [u8; 32] = [7; 32];

/// The reader's largest frame for a mode byte.
pub(crate) fn max_len(mode: u8) -> usize {
    match (mode >> 2) & 3 {
        0 => 64,
        1 => 4096,
        2 => syncopate_adapters::tcp::session_max_len(16),
        _ => 1 << 20,
    }
}

/// After how many frames MACs start, for a mode byte (`None`: never).
pub(crate) fn mac_after(mode: u8) -> Option<usize> {
    match mode & 3 {
        3 => None,
        n => Some(usize::from(n)),
    }
}

fn listener() -> &'static TcpListener {
    static LISTENER: OnceLock<TcpListener> = OnceLock::new();
    LISTENER.get_or_init(|| TcpListener::bind("127.0.0.1:0").unwrap_or_else(|e| panic!("loopback listener: {e}")))
}

/// A connected pair (client, server) over loopback.
fn pair() -> (TcpStream, TcpStream) {
    let l = listener();
    let addr = l.local_addr().unwrap_or_else(|e| panic!("listener address: {e}"));
    let client = TcpStream::connect(addr).unwrap_or_else(|e| panic!("connect: {e}"));
    let local = client.local_addr().unwrap_or_else(|e| panic!("client address: {e}"));
    loop {
        let (server, peer) = l.accept().unwrap_or_else(|e| panic!("accept: {e}"));
        // Only this connection is ours (a stale one from an abandoned run is dropped).
        if peer == local {
            return (client, server);
        }
    }
}

/// Runs every check on `data`; panics on a violation. Returns the number of frames accepted.
pub(crate) fn check(data: &[u8]) -> usize {
    let Some((&mode, stream)) = data.split_first() else { return 0 };
    let (max_len, mac_after) = (max_len(mode), mac_after(mode));
    let (mut client, server) = pair();
    let mut payloads: Vec<Vec<u8>> = Vec::new();
    let mut consumed = 0usize;
    std::thread::scope(|s| {
        s.spawn(move || {
            // Fails only once the reader has stopped and closed its end.
            let _ = client.write_all(stream);
            let _ = client.shutdown(Shutdown::Write);
        });
        let mut reader = FrameReader::new(server, max_len, FrameTimeout::default());
        let mut buf = Vec::new();
        loop {
            let mac_on = mac_after.is_some_and(|n| payloads.len() >= n);
            if mac_after == Some(payloads.len()) {
                reader.set_mac(FrameMac::new(&KEY));
            }
            match reader.read_frame(&mut buf, None) {
                Ok(at) => {
                    assert!(at.start <= at.end && at.end <= buf.len(), "payload {at:?} outside the buffer");
                    let payload = at.of(&buf).to_vec();
                    consumed += LEN_BYTES + SEQ_BYTES + payload.len() + if mac_on { TAG_LEN } else { 0 };
                    assert!(consumed <= stream.len(), "read past the bytes sent");
                    payloads.push(payload);
                    assert_eq!(reader.next_seq(), payloads.len() as u64);
                }
                Err(FrameError::Closed) => {
                    assert_eq!(consumed, stream.len(), "Closed with bytes left");
                    break;
                }
                Err(FrameError::Truncated { .. }) => {
                    assert!(consumed < stream.len(), "Truncated with nothing left");
                    break;
                }
                Err(FrameError::TooLarge { len, max }) => {
                    assert!(len > max as u64 && max == max_len);
                    break;
                }
                Err(_) => break,
            }
        }
        // Closing the reader's end releases a writer still blocked on a full socket.
        drop(reader);
    });
    let mut writer = FrameWriter::new(Vec::new(), max_len);
    for (i, p) in payloads.iter().enumerate() {
        if mac_after == Some(i) {
            writer.set_mac(FrameMac::new(&KEY));
        }
        writer.write_frame(p).unwrap_or_else(|e| panic!("re-writing accepted frame {i}: {e}"));
    }
    assert!(writer.get_mut().as_slice() == &stream[..consumed], "re-written frames differ from the bytes read");
    payloads.len()
}
