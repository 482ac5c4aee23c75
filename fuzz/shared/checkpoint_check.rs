//! The checks of the `checkpoint` fuzz target, shared with `tests/tests/fuzz_parsers_corpus.rs`.
//!
//! Every input is decoded as a checkpoint twice: as it is, and sealed with the SHA-256 of
//! its bytes appended (a checkpoint's last 32 bytes), so that the fuzzer gets past the
//! checksum to the fields. No panic and no error of more than one line; what is accepted
//! has an update rule in range and a state of exactly the rule's length for the parameters
//! (none when it keeps none); written again it decodes to the same checkpoint (bit for bit),
//! and re-encoding that is a fixed point. A file of the current format re-encodes to its own
//! bytes.

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
fn fields(c: &Checkpoint) -> (String, u64, Vec<u32>, String, Option<Vec<u32>>, String) {
    let bits = |v: &[f32]| v.iter().map(|x| x.to_bits()).collect::<Vec<_>>();
    let run = format!("{:?} {}", c.identity, c.accepted);
    (
        c.protocol.clone(),
        c.version.0,
        bits(&c.params),
        // `Debug` of an f64 tells -0.0 from 0.0: the rule's knobs compare bit for bit.
        format!("{:?}", c.optimizer),
        c.optimizer_state.as_deref().map(bits),
        run,
    )
}

fn encode(c: &Checkpoint) -> Vec<u8> {
    let rule = Some((c.optimizer, c.optimizer_state.as_deref().unwrap_or_default()));
    checkpoint::encode_stamped(&c.protocol, c.version, &c.params, rule, c.identity.as_ref(), c.accepted)
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
    assert!(c.optimizer.check().is_ok(), "a rule out of range: {:?}", c.optimizer);
    let len = c.optimizer.state_len(c.params.len());
    assert_eq!(c.optimizer_state.as_ref().map_or(0, Vec::len), len);
    assert_eq!(c.optimizer_state.is_some(), len > 0);
    let written = encode(&c);
    let back = checkpoint::decode(path, &written).unwrap_or_else(|e| panic!("a written checkpoint refused: {e}"));
    assert_eq!(fields(&back), fields(&c), "a written checkpoint decodes to another one");
    assert!(encode(&back) == written, "writing a written checkpoint again changed it");
    let format = bytes.get(8..12).map(|f| u32::from_le_bytes(f.try_into().unwrap_or_default()));
    if format == Some(4) {
        assert!(written == bytes, "re-encoding a format-4 checkpoint changed its bytes");
    }
    1
}
