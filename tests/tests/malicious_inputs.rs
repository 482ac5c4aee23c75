//! Malicious and malformed inputs into every protocol's server through [`AnyServer`]: NaN,
//! ±∞, huge norms (refused, or clipped under `GradientPolicy { max_norm, on_large: Clip }`),
//! wrong lengths, spoofed and out-of-range worker ids, replays, `seq = u64::MAX`,
//! out-of-range versions, old-epoch joins and messages of the wrong kind. Each refused input
//! must return a typed [`Reject`], emit no output, and leave the version, the model bits and
//! every counter except `rejected` unchanged (which grows by exactly one). Nothing may panic.
//!
//! `-- --nocapture` prints how many bad inputs each category tried (TESTING.md).

use std::collections::BTreeMap;
use syncopate::proto::asp::AspConfig;
use syncopate::proto::{GradientPolicy, LargeGradient};
use syncopate::{AnyServer, ProtocolConfig, Reject, Server, ServerEvent, ToServer, Values, Version, WorkerId};
use syncopate_tests::drive::{DIM, Snapshot, at_ms, drain, join_all, seq, server};
use syncopate_tests::fault::protocols;

type Srv = AnyServer<f64, Vec<f64>>;

/// Which contribution message a protocol takes.
#[derive(Clone, Copy, PartialEq, Eq, Debug)]
enum Kind {
    Grad,
    Delta,
    Clock,
}

fn kind(p: &ProtocolConfig) -> Kind {
    match p {
        ProtocolConfig::Wbsp(_) => Kind::Delta,
        ProtocolConfig::Ssp(_) => Kind::Clock,
        _ => Kind::Grad,
    }
}

fn takes_pull(p: &ProtocolConfig) -> bool {
    matches!(p, ProtocolConfig::Wbsp(_) | ProtocolConfig::Ssp(_) | ProtocolConfig::Bap(_))
}

/// A contribution of `kind` computed on `base`.
fn contribution(k: Kind, base: u64, seq: u64, values: Values<'_, f64>) -> ToServer<'_, f64> {
    match k {
        Kind::Grad => {
            ToServer::Grad { base: Version(base), iteration: base.saturating_add(1), seq, values, loss: None }
        }
        Kind::Delta => ToServer::Delta { round: Version(base), local_steps: 1, seq, values, loss: None },
        Kind::Clock => ToServer::Clock { clock: base, seq, values, loss: None },
    }
}

/// Counts of bad inputs tried, by category.
#[derive(Default)]
struct Tally(BTreeMap<&'static str, u64>);

/// Feeds `msg` (or a `handle_worker_lost` when `msg` is `None`) and asserts it is refused and
/// changed nothing. Returns the reject.
fn refused(
    s: &mut Srv,
    tally: &mut Tally,
    cat: &'static str,
    from: WorkerId,
    msg: Option<ToServer<'_, f64>>,
) -> Reject {
    let _ = drain(s);
    let before = Snapshot::of(s);
    let rejected = s.stats().rejected;
    let what = format!("{cat}: {msg:?} from {from}");
    let r = match msg {
        Some(m) => s.handle(at_ms(50), from, m),
        None => s.handle_worker_lost(at_ms(50), from),
    };
    let Err(e) = r else { panic!("{what} was accepted") };
    assert!(s.poll_output().is_none(), "{what}: refused input produced output");
    assert_eq!(Snapshot::of(s), before, "{what}: refused input changed state");
    if msg.is_some() {
        assert_eq!(s.stats().rejected, rejected + 1, "{what}: rejected counter");
    }
    *tally.0.entry(cat).or_default() += 1;
    e
}

fn le_bytes(v: &[f64]) -> Vec<u8> {
    v.iter().flat_map(|x| x.to_le_bytes()).collect()
}

fn attack(name: &str, p: &ProtocolConfig, tally: &mut Tally) {
    let n = p.workers();
    let k = kind(p);
    let mut s = server(p);
    join_all(&mut s, n);
    let good = [1.0, -1.0, 2.0, 0.0];
    // One valid contribution from worker 0 (for the replays).
    s.handle(at_ms(1), WorkerId(0), contribution(k, 0, seq(1, 0), Values::Slice(&good)))
        .unwrap_or_else(|e| panic!("{name}: valid contribution refused: {e:?}"));
    let _ = drain(&mut s);
    let v = s.version().0;
    let w1 = WorkerId(1);
    let fresh = seq(1, 10);

    // Non-finite values, as slices and as little-endian bytes.
    let nan = f64::NAN;
    let inf = f64::INFINITY;
    let bad_values: [[f64; DIM]; 7] = [
        [nan, 0.0, 0.0, 0.0],
        [0.0, 0.0, 0.0, nan],
        [inf, 0.0, 0.0, 0.0],
        [0.0, -inf, 0.0, 0.0],
        [nan, inf, -inf, 1.0],
        [f64::from_bits(0x7ff8_dead_beef_0001); DIM],
        [-nan, 1.0, 1.0, 1.0],
    ];
    for b in &bad_values {
        let e = refused(&mut s, tally, "non-finite", w1, Some(contribution(k, v, fresh, Values::Slice(b))));
        assert!(matches!(e, Reject::NotFinite), "{name}: {e:?}");
        let bytes = le_bytes(b);
        let e = refused(&mut s, tally, "non-finite", w1, Some(contribution(k, v, fresh, Values::LittleEndian(&bytes))));
        assert!(matches!(e, Reject::NotFinite), "{name}: {e:?}");
    }
    // Finite values whose norm overflows.
    for b in [[1e300; DIM], [f64::MAX, 0.0, 0.0, 0.0], [-f64::MAX, f64::MAX, 1.0, 1.0], [1e155, 1e155, 1e155, 1e155]] {
        let e = refused(&mut s, tally, "huge norm", w1, Some(contribution(k, v, fresh, Values::Slice(&b))));
        assert!(matches!(e, Reject::NormTooLarge), "{name}: {e:?}");
    }
    // Wrong lengths.
    let long = vec![1.0; 1000];
    for len in [0, 1, DIM - 1, DIM + 1, 1000] {
        let e =
            refused(&mut s, tally, "wrong length", w1, Some(contribution(k, v, fresh, Values::Slice(&long[..len]))));
        assert!(matches!(e, Reject::WrongLength(_)), "{name}: {e:?}");
    }
    let bytes = le_bytes(&good);
    for cut in [0, 7, 8 * DIM - 1, 8 * DIM + 1] {
        let mut b = bytes.clone();
        b.resize(cut, 0);
        let e = refused(&mut s, tally, "wrong length", w1, Some(contribution(k, v, fresh, Values::LittleEndian(&b))));
        assert!(matches!(e, Reject::WrongLength(_)), "{name}: {e:?}");
    }
    // Spoofed and out-of-range worker ids, every message kind and a transport loss.
    for id in [n, n + 1, 255, 256, 4096, u32::MAX] {
        let w = WorkerId(id);
        let msgs = [
            ToServer::Join { epoch: 1 },
            ToServer::Join { epoch: u32::MAX },
            contribution(k, v, fresh, Values::Slice(&good)),
            ToServer::Pull { have: Version(v), min_clock: 0 },
            ToServer::Leave,
        ];
        for m in msgs {
            let e = refused(&mut s, tally, "spoofed id", w, Some(m));
            assert!(matches!(e, Reject::UnknownWorker(x) if x == w), "{name}: {e:?}");
        }
        let e = refused(&mut s, tally, "spoofed id", w, None);
        assert!(matches!(e, Reject::UnknownWorker(_)), "{name}: {e:?}");
    }
    // Replays of worker 0's accepted contribution (same seq, other values, older seqs).
    for (sq, vals) in [(seq(1, 0), good), (seq(1, 0), [0.0; DIM]), (seq(1, 0) - 1, good), (0, good), (1, good)] {
        let e = refused(&mut s, tally, "replay", WorkerId(0), Some(contribution(k, v, sq, Values::Slice(&vals))));
        assert!(matches!(e, Reject::Duplicate { .. } | Reject::StaleEpoch { .. }), "{name}: {e:?}");
    }
    // Out-of-range versions.
    for base in [v + 1, v + 2, u64::MAX / 2, u64::MAX] {
        if k == Kind::Clock {
            break; // SSP clocks are the worker's own counter, not a server version.
        }
        let e = refused(&mut s, tally, "future version", w1, Some(contribution(k, base, fresh, Values::Slice(&good))));
        assert!(matches!(e, Reject::FutureVersion { .. } | Reject::Unexpected { .. }), "{name}: {e:?}");
    }
    if takes_pull(p) {
        for have in [v + 1, u64::MAX] {
            let e = refused(
                &mut s,
                tally,
                "future version",
                w1,
                Some(ToServer::Pull { have: Version(have), min_clock: 0 }),
            );
            assert!(matches!(e, Reject::FutureVersion { .. }), "{name}: {e:?}");
        }
    }
    // Old-epoch joins: worker 1 rejoins in epoch 5, then epochs 4, 1 and 0 arrive.
    s.handle(at_ms(60), w1, ToServer::Join { epoch: 5 }).expect("rejoin");
    for epoch in [4, 1, 0] {
        let e = refused(&mut s, tally, "old-epoch join", w1, Some(ToServer::Join { epoch }));
        assert!(matches!(e, Reject::StaleEpoch { .. }), "{name}: {e:?}");
    }
    // A contribution numbered in the old session after the rejoin.
    let e = refused(&mut s, tally, "replay", w1, Some(contribution(k, v, seq(4, 99), Values::Slice(&good))));
    assert!(matches!(e, Reject::Duplicate { .. } | Reject::StaleEpoch { .. }), "{name}: {e:?}");
    // Messages of the wrong kind.
    let v = s.version().0;
    let mut wrong: Vec<ToServer<'_, f64>> = Vec::new();
    for other in [Kind::Grad, Kind::Delta, Kind::Clock] {
        if other != k {
            wrong.push(contribution(other, v, seq(5, 1), Values::Slice(&good)));
        }
    }
    if !takes_pull(p) {
        wrong.push(ToServer::Pull { have: Version(v), min_clock: 0 });
    }
    for m in wrong {
        let e = refused(&mut s, tally, "wrong kind", WorkerId(2), Some(m));
        assert!(matches!(e, Reject::Unexpected { .. }), "{name}: {e:?}");
    }
}

/// `seq = u64::MAX`: refused (it is reserved: the high-water mark saturates there, so its
/// replay could not be told apart), and so is its replay; a valid contribution still follows.
fn seq_max(name: &str, p: &ProtocolConfig, tally: &mut Tally) {
    let k = kind(p);
    let mut s = server(p);
    join_all(&mut s, p.workers());
    let good = [1.0, 0.0, 0.0, 0.0];
    for _ in 0..2 {
        let e = refused(
            &mut s,
            tally,
            "seq u64::MAX",
            WorkerId(0),
            Some(contribution(k, 0, u64::MAX, Values::Slice(&good))),
        );
        assert!(matches!(e, Reject::Duplicate { .. }), "{name}: {e:?}");
    }
    s.handle(at_ms(2), WorkerId(0), contribution(k, 0, seq(1, 0), Values::Slice(&good)))
        .unwrap_or_else(|e| panic!("{name}: valid contribution after u64::MAX refused: {e:?}"));
}

fn with_policy(p: &ProtocolConfig, policy: GradientPolicy) -> ProtocolConfig {
    let mut p = *p;
    match &mut p {
        ProtocolConfig::Bsp(c) => c.gradient_policy = policy,
        ProtocolConfig::Asp(c) => c.gradient_policy = policy,
        ProtocolConfig::Backup(c) => c.gradient_policy = policy,
        ProtocolConfig::Dbw(c) => c.gradient_policy = policy,
        ProtocolConfig::Wbsp(c) => c.gradient_policy = policy,
        ProtocolConfig::Grouped(c) => c.gradient_policy = policy,
        ProtocolConfig::Ssp(c) => c.gradient_policy = policy,
        ProtocolConfig::Bap(c) => c.gradient_policy = policy,
        _ => unreachable!("every protocol is listed"),
    }
    p
}

#[test]
fn malicious_inputs_are_refused_and_change_nothing() {
    let mut tally = Tally::default();
    for (name, p) in protocols() {
        attack(name, &p, &mut tally);
        seq_max(name, &p, &mut tally);
    }
    let total: u64 = tally.0.values().sum();
    for (cat, count) in &tally.0 {
        println!("malicious: category={cat:<16} inputs={count}");
    }
    println!("malicious: total={total} protocols={}", protocols().len());
}

/// `max_norm` with `Reject` refuses a large gradient; with `Clip` it applies it scaled down, and
/// the `Applied` weight shows the factor (norm 5 clipped to 1: a fifth of an unclipped peer's).
#[test]
fn large_gradients_refused_or_clipped() {
    for (name, p) in protocols() {
        let k = kind(&p);
        // SSP's `Clock` carries the step `−η/n · g`, and its norm bound applies to that step
        // (`max_norm · η/n`): scale the test values the same way.
        let scale = if k == Kind::Clock { 0.25 / f64::from(p.workers()) } else { 1.0 };
        let big = [3.0 * scale, 4.0 * scale, 0.0, 0.0];
        let small = [0.5 * scale, 0.0, 0.0, 0.0];
        let refuse = with_policy(&p, GradientPolicy { max_norm: Some(1.0), on_large: LargeGradient::Reject });
        let mut s = server(&refuse);
        join_all(&mut s, p.workers());
        let e = refused(
            &mut s,
            &mut Tally::default(),
            "norm",
            WorkerId(0),
            Some(contribution(k, 0, seq(1, 0), Values::Slice(&big))),
        );
        assert_eq!(e, Reject::NormTooLarge, "{name}");

        let clip = with_policy(&p, GradientPolicy { max_norm: Some(1.0), on_large: LargeGradient::Clip });
        let mut s = server(&clip);
        join_all(&mut s, p.workers());
        let mut events = Vec::new();
        for w in 0..p.workers() {
            let vals = if w == 0 { &big } else { &small };
            s.handle(at_ms(1), WorkerId(w), contribution(k, 0, seq(1, 0), Values::Slice(vals)))
                .unwrap_or_else(|e| panic!("{name}: {e:?}"));
            events.extend(drain(&mut s));
        }
        assert!(s.params().iter().all(|x| x.is_finite()));
        let weight = |w: u32| {
            events.iter().find_map(|e| match e {
                ServerEvent::Applied { worker, weight, .. } if worker.0 == w => Some(*weight),
                _ => None,
            })
        };
        let clipped = weight(0).unwrap_or_else(|| panic!("{name}: clipped gradient not applied: {events:?}"));
        let peer = (1..p.workers()).find_map(weight).unwrap_or_else(|| panic!("{name}: no peer applied"));
        // BAP keeps the factor as `f32` for its event (0.2 → 0.200000003): a relative 1e-6.
        assert!((clipped / peer - 0.2).abs() < 1e-6, "{name}: clipped weight {clipped}, unclipped peer {peer}");
    }
    // And the update is the clipped one: ASP with one worker moves by exactly η · g / 5.
    let p = with_policy(
        &ProtocolConfig::Asp(AspConfig::new(1, 0.25)),
        GradientPolicy { max_norm: Some(1.0), on_large: LargeGradient::Clip },
    );
    let mut s = server(&p);
    join_all(&mut s, 1);
    s.handle(at_ms(1), WorkerId(0), contribution(Kind::Grad, 0, seq(1, 0), Values::Slice(&[3.0, 4.0, 0.0, 0.0])))
        .unwrap();
    let expect = [0.0 - 0.25 * 0.6, 1.0 - 0.25 * 0.8, 2.0, 3.0];
    for (a, b) in s.params().iter().zip(expect) {
        assert!((a - b).abs() < 1e-12, "{:?}", s.params());
    }
}
