//! Pinned regressions: each test reproduces one bug the reliability suite found, by name.

use syncopate::{Reject, Server, WorkerId};
use syncopate_tests::drive::{at_ms, grad, join_all, seq, server};
use syncopate_tests::fault::protocols;

/// Found by `tests/tests/malicious_inputs.rs`: a contribution numbered `seq = u64::MAX` was
/// accepted, after which the roster's high-water mark saturated at `u64::MAX` and the very same
/// message was accepted again (counted twice, in ASP applied twice). `u64::MAX` is now reserved.
#[test]
fn seq_u64_max_replay_is_not_accepted_twice() {
    for (name, p) in protocols() {
        if !matches!(name, "bsp" | "asp" | "backup" | "dbw" | "grouped") {
            continue; // the Grad protocols; the others are covered by malicious_inputs.rs
        }
        let mut s = server(&p);
        join_all(&mut s, p.workers());
        let g = [1.0, 0.0, 0.0, 0.0];
        for _ in 0..2 {
            let r = s.handle(at_ms(1), WorkerId(0), grad(0, 1, u64::MAX, &g));
            assert!(matches!(r, Err(Reject::Duplicate { .. })), "{name}: {r:?}");
        }
        assert_eq!(s.stats().accepted, 0, "{name}");
        s.handle(at_ms(2), WorkerId(0), grad(0, 1, seq(1, 0), &g)).expect("a normal seq still works");
    }
}

#[path = "../../fuzz/shared/bytes.rs"]
mod bytes;
#[path = "../../fuzz/shared/server_ops_check.rs"]
mod server_ops_check;
#[path = "../../fuzz/shared/worker_ops_check.rs"]
mod worker_ops_check;

fn corpus_file(target: &str, name: &str) -> Vec<u8> {
    let p = std::path::PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../fuzz/corpus").join(target).join(name);
    std::fs::read(&p).unwrap_or_else(|e| panic!("{}: {e}", p.display()))
}

/// Found by the `server_ops` fuzzer (first minute): one BAP `handle_timeout` closed two
/// iterations (version 1 → 3). Legitimate (both were ready; each `ModelUpdated` is +1), so the
/// check now allows BAP to close up to `s_bap + 1` iterations per input and requires the
/// `ModelUpdated` events to match the version exactly.
#[test]
fn server_ops_bap_timeout_closes_two_iterations() {
    assert!(server_ops_check::check(&corpus_file("server_ops", "regression-bap-timeout-closes-two")) > 0);
}

/// Found by the `server_ops` fuzzer (second run): one BAP gradient closed iteration 3 and the
/// already complete iteration 4 (version 2 → 4). Legitimate, as above.
#[test]
fn server_ops_bap_gradient_closes_two_iterations() {
    assert!(server_ops_check::check(&corpus_file("server_ops", "regression-bap-grad-closes-two")) > 0);
}

/// Found by the `worker_ops` fuzzer: the harness's version chooser overflowed at a `Model` with
/// version `u64::MAX` (a harness bug, fixed with saturating arithmetic); the worker itself was
/// fine. Kept so the worker path with `u64::MAX` versions stays exercised.
#[test]
fn worker_ops_model_version_u64_max() {
    assert!(worker_ops_check::check(&corpus_file("worker_ops", "regression-version-u64-max")) > 0);
}
