//! The checks of the `checkpoint` fuzz target, shared with `tests/tests/fuzz_parsers_corpus.rs`.
//!
//! Every input is decoded as a checkpoint twice: as it is, and sealed with the SHA-256 of
//! its bytes appended (a checkpoint's last 32 bytes), so that the fuzzer gets past the
//! checksum to the fields. No panic and no error of more than one line; what is accepted
//! has momentum in `[0, 1)` and a momentum buffer exactly when momentum is positive, of the
//! parameters' length; written again it decodes to the same checkpoint (bit for bit), and
//! re-encoding that is a fixed point. A format-3 file with a non-negative momentum re-encodes
//! to its own bytes.

use std::path::Path;
use syncopate_adapters::tcp::checkpoint::{self, Checkpoint};
use syncopate_adapters::tcp::settings::digest;

/// The input with its SHA-256 appended.
pub(crate) fn seal(body: &[u8]) -> Vec<u8> {
    let mut out = body.to_vec();
    out.extend_from_slice(&digest(body));
    out
}

/// A checkpoint as comparable bits.
fn fields(c: &Checkpoint) -> (String, u64, Vec<u32>, u64, Option<Vec<u32>>, String) {
    let bits = |v: &[f32]| v.iter().map(|x| x.to_bits()).collect::<Vec<_>>();
    let run = format!("{:?} {}", c.identity, c.accepted);
    (
        c.protocol.clone(),
        c.version.0,
        bits(&c.params),
        c.momentum.to_bits(),
        c.momentum_buffer.as_deref().map(bits),
        run,
    )
}

fn encode(c: &Checkpoint) -> Vec<u8> {
    let momentum = c.momentum_buffer.as_deref().map(|b| (c.momentum, b));
    checkpoint::encode_stamped(&c.protocol, c.version, &c.params, momentum, c.identity.as_ref(), c.accepted)
}

/// Runs every check on `data`; panics on a violation. Returns how many decodings accepted it.
pub(crate) fn check(data: &[u8]) -> usize {
    check_one(data) + check_one(&seal(data))
}

fn check_one(bytes: &[u8]) -> usize {
    let path = Path::new("fuzz.ckpt");
    let c = match checkpoint::decode(path, bytes) {
        Err(e) => {
            assert!(!e.to_string().contains('\n'), "a checkpoint error of more than one line: {e}");
            return 0;
        }
        Ok(c) => c,
    };
    assert!(c.momentum.is_finite() && (0.0..1.0).contains(&c.momentum));
    assert_eq!(c.momentum_buffer.is_some(), c.momentum > 0.0);
    if let Some(b) = &c.momentum_buffer {
        assert_eq!(b.len(), c.params.len());
    }
    let written = encode(&c);
    let back = checkpoint::decode(path, &written).unwrap_or_else(|e| panic!("a written checkpoint refused: {e}"));
    // A momentum of -0.0 is written as 0.0: compare it as a number, the rest bit for bit.
    assert_eq!(back.momentum, c.momentum);
    let (mut got, mut want) = (fields(&back), fields(&c));
    (got.3, want.3) = (0, 0);
    assert_eq!(got, want, "a written checkpoint decodes to another one");
    assert!(encode(&back) == written, "writing a written checkpoint again changed it");
    let format = bytes.get(8..12).map(|f| u32::from_le_bytes(f.try_into().unwrap_or_default()));
    if format == Some(3) && c.momentum.is_sign_positive() {
        assert!(written == bytes, "re-encoding a format-3 checkpoint changed its bytes");
    }
    1
}
