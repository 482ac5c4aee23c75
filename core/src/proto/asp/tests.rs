//! Unit and property tests of the `asp` protocol.

use super::*;
use crate::proto::DropReason;
use crate::proto::common::testkit::drain_server;
use crate::proto::common::testkit::prelude::*;
use proptest::prelude::*;
use std::vec;
use std::vec::Vec;

#[test]
fn applies_on_arrival_and_replies_to_the_sender_only() {
    let mut s: AspServer<f64, Vec<f64>> = AspServer::new(AspConfig::new(3, 0.25), vec![1.0; 2]).unwrap();
    s.handle(Instant::ZERO, WorkerId(2), grad(0, 0, &[4.0, -4.0])).unwrap();
    s.handle(Instant::ZERO, WorkerId(1), grad(0, 0, &[4.0, 4.0])).unwrap();
    assert_eq!(s.version(), Version(2));
    assert_eq!(s.params(), &[-1.0, 1.0]);
    let (events, sends) = drain_server(&mut s);
    for e in events {
        if let ServerEvent::Applied { worker, staleness, .. } = e {
            assert_eq!(staleness, if worker == WorkerId(1) { 1 } else { 0 });
        }
    }
    let seen: Vec<Recipient> = sends.into_iter().map(|(to, _)| to).collect();
    assert_eq!(seen, [Recipient::Worker(WorkerId(2)), Recipient::Worker(WorkerId(1))]);
    assert_eq!(s.stats().dropped_for(DropReason::Stale), 0);
}

#[test]
fn refusals_change_nothing() {
    let mut s: AspServer<f32, Vec<f32>> = AspServer::new(AspConfig::new(2, 0.5), vec![0.0; 2]).unwrap();
    let g = |seq, v: &'static [f32]| ToServer::Grad {
        base: Version(0),
        iteration: 0,
        seq,
        values: Values::Slice(v),
        loss: None,
    };
    s.handle(Instant::ZERO, WorkerId(0), g(0, &[1.0, 1.0])).unwrap();
    while s.poll_output().is_some() {}
    let before = (s.params().to_vec(), s.version());
    assert!(matches!(s.handle(Instant::ZERO, WorkerId(0), g(0, &[1.0, 1.0])), Err(Reject::Duplicate { .. })));
    assert!(matches!(s.handle(Instant::ZERO, WorkerId(9), g(5, &[1.0, 1.0])), Err(Reject::UnknownWorker(_))));
    assert!(matches!(s.handle(Instant::ZERO, WorkerId(1), g(0, &[1.0])), Err(Reject::WrongLength(_))));
    assert!(matches!(s.handle(Instant::ZERO, WorkerId(1), g(0, &[f32::NAN, 0.0])), Err(Reject::NotFinite)));
    assert!(matches!(s.handle(Instant::ZERO, WorkerId(1), g(0, &[f32::NEG_INFINITY, 0.0])), Err(Reject::NotFinite)));
    let future = ToServer::Grad {
        base: Version(9),
        iteration: 0,
        seq: 1,
        values: Values::Slice(&[0.0f32, 0.0][..]),
        loss: None,
    };
    assert!(matches!(s.handle(Instant::ZERO, WorkerId(1), future), Err(Reject::FutureVersion { .. })));
    assert_eq!((s.params().to_vec(), s.version()), before);
    assert!(s.poll_output().is_none());
}

proptest! {
    /// Every valid gradient is applied exactly once, replays and duplicates never; the
    /// final model is the initial one minus η times the sum of the admitted gradients.
    #[test]
    fn every_valid_gradient_applied_exactly_once(
        sends in proptest::collection::vec((0u32..4, -50i32..50, 0u8..4), 1..120)
    ) {
        let mut s: AspServer<f64, Vec<f64>> = AspServer::new(AspConfig::new(4, 0.5), vec![0.0; 1]).unwrap();
        let mut next_seq = [0u64; 4];
        let mut sent: Vec<(u32, u64, f64)> = Vec::new();
        let mut expected = 0.0f64;
        let mut applied_events = 0u64;
        for (w, g, action) in sends {
            let x = f64::from(g);
            // action 0: replay an earlier message of this worker (if any); otherwise a new one.
            let (seq, value, fresh) = match sent.iter().rev().find(|m| m.0 == w) {
                Some(m) if action == 0 => (m.1, m.2, false),
                _ => { let q = next_seq[w as usize]; next_seq[w as usize] += 1; (q, x, true) }
            };
            let result = s.handle(Instant::ZERO, WorkerId(w), grad(s.version().0, seq, &[value]));
            prop_assert_eq!(result.is_ok(), fresh);
            if fresh { sent.push((w, seq, value)); expected -= 0.5 * value; }
            let (events, _) = drain_server(&mut s);
            applied_events += events.iter().filter(|e| matches!(e, ServerEvent::Applied { .. })).count() as u64;
        }
        prop_assert_eq!(applied_events, sent.len() as u64);
        prop_assert_eq!(s.version(), Version(sent.len() as u64));
        prop_assert_eq!(s.params(), &[expected][..]);
    }
}
