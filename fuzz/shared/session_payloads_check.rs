//! The checks of the `session_payloads` fuzz target, shared with
//! `tests/tests/fuzz_parsers_corpus.rs`.
//!
//! The transport messages of a session that are not the core's: worker 0's initial model
//! (`INIT`, [`initial`]), a worker's step times (`STEP`, [`step_times`]), and the
//! not-finite reports both ways (`NFIN`, `RFSD`, [`refusal`]); these two round-trip. Every
//! input is decoded as both, the initial model for several model sizes (its own length
//! included). No panic; what is accepted has the announced size and only finite values
//! (positive step times), is recognised by its magic, and re-encodes to the same bytes.
//! The input's first bytes also drive a worker's [`PendingSteps`], whose message must
//! always decode.

use syncopate_adapters::tcp::initial;
use syncopate_adapters::tcp::refusal;
use syncopate_adapters::tcp::step_times::{self, PendingSteps};

/// Runs every check on `data`; panics on a violation. Returns how many decodings accepted it.
pub(crate) fn check(data: &[u8]) -> usize {
    let mut accepted = 0;
    let own = data.len().saturating_sub(initial::MAGIC.len()) / 4;
    for dim in [1, 2, 3, 16, own, own + 1] {
        if let Ok(params) = initial::decode(data, dim) {
            accepted += 1;
            assert!(initial::CODEC.is(data) && !step_times::CODEC.is(data));
            assert_eq!(params.len(), dim);
            assert!(params.iter().all(|v| v.is_finite()), "accepted a non-finite initial parameter");
            let again = initial::encode(&params, dim).unwrap_or_else(|e| panic!("accepted parameters refused: {e}"));
            assert!(again == data, "re-encoding initial parameters changed their bytes");
        }
    }
    if let Ok(seconds) = step_times::decode(data) {
        accepted += 1;
        assert!(step_times::CODEC.is(data) && !initial::CODEC.is(data));
        assert!((1..=step_times::MAX_STEPS).contains(&seconds.len()));
        assert!(seconds.iter().all(|s| s.is_finite() && *s > 0.0), "accepted a step time that is not one");
        let again = step_times::encode(&seconds).unwrap_or_else(|e| panic!("accepted step times refused: {e}"));
        assert!(again == data, "re-encoding step times changed their bytes");
    }
    if let Ok(n) = refusal::NotFinite::decode(data) {
        accepted += 1;
        assert!(refusal::NOT_FINITE.is(data));
        assert_eq!(refusal::NotFinite::decode(&n.encode()), Ok(n), "a not-finite message round-trips");
    }
    if let Ok(r) = refusal::Refusal::decode(data) {
        accepted += 1;
        assert!(refusal::CODEC.is(data) && r.limit >= 1);
        assert_eq!(refusal::Refusal::decode(&r.encode()), Ok(r), "a refusal message round-trips");
    }
    check_pending(data);
    accepted
}

/// A worker's pending steps fed with the input read as `f64` step times (any bits: NaN,
/// infinite, negative, zero) always make a message that decodes, of at most what one
/// message of the model may hold.
fn check_pending(data: &[u8]) {
    let dim = usize::from(data.first().copied().unwrap_or(0)) * 97 + 1;
    let mut pending = PendingSteps::new(dim);
    let mut pushed = 0;
    for c in data.get(1..).unwrap_or_default().chunks_exact(8).take(4096) {
        pending.push(f64::from_le_bytes(c.try_into().unwrap_or_default()));
        pushed += 1;
    }
    match pending.take_message() {
        None => assert_eq!(pushed, 0, "pending steps made no message"),
        Some(msg) => {
            let seconds = step_times::decode(&msg).unwrap_or_else(|e| panic!("a worker's own step times refused: {e}"));
            assert_eq!(seconds.len(), pushed.min(step_times::max_per_message(dim)));
        }
    }
    assert!(pending.take_message().is_none(), "pending steps not cleared");
}
