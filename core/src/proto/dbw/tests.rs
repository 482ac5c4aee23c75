//! Unit and property tests of the `dbw` protocol.

use super::*;
use crate::proto::backup::harness::{check, run};
use crate::proto::bsp::{BspConfig, BspServer};
use crate::proto::common::testkit::prelude::*;
use crate::rng::Rng;
use proptest::prelude::*;
use std::vec;
use std::vec::Vec;

fn server(config: DbwConfig, dim: usize) -> DbwServer<f64, Vec<f64>> {
    let scratch = vec![0.0; config.scratch_len(dim)];
    DbwServer::new(config, vec![1.0; dim], scratch).unwrap()
}

fn chosen(events: &[ServerEvent]) -> Vec<(u64, u32)> {
    events
        .iter()
        .filter_map(|e| match e {
            ServerEvent::BackupChosen { version, k, .. } => Some((version.0, *k)),
            _ => None,
        })
        .collect()
}

/// Drives a DBW server directly: every worker holds the current model (option A), its
/// round trip is `rtt(worker)` seconds and its gradient `grad(worker, params)`;
/// gradients are delivered in round-trip order until the iteration closes. Returns the
/// `BackupChosen` events.
fn drive(
    s: &mut DbwServer<f64, Vec<f64>>,
    n: u32,
    iterations: usize,
    rtt: impl FnMut(u32) -> f64,
    grad: impl FnMut(u32, &[f64]) -> Vec<f64>,
) -> Vec<ServerEvent> {
    drive_reporting(s, n, iterations, rtt, grad, |_| None)
}

/// [`drive`] with every gradient reporting the minibatch loss `loss(worker)`.
fn drive_reporting(
    s: &mut DbwServer<f64, Vec<f64>>,
    n: u32,
    iterations: usize,
    mut rtt: impl FnMut(u32) -> f64,
    mut grad: impl FnMut(u32, &[f64]) -> Vec<f64>,
    mut loss: impl FnMut(u32) -> Option<f32>,
) -> Vec<ServerEvent> {
    let mut now = Instant::ZERO;
    for w in 0..n {
        s.handle(now, WorkerId(w), ToServer::Join { epoch: 0 }).unwrap();
    }
    let mut seq = vec![0u64; n as usize];
    let mut out = Vec::new();
    for _ in 0..iterations {
        while let Some(o) = s.poll_output() {
            if let ServerOutput::Event(e @ ServerEvent::BackupChosen { .. }) = o {
                out.push(e);
            }
        }
        let v = s.version();
        let params = s.params().to_vec();
        let mut arrivals: Vec<(f64, u32)> = (0..n).map(|w| (rtt(w), w)).collect();
        arrivals.sort_by(|a, b| a.0.total_cmp(&b.0));
        let start = now;
        for (t, w) in arrivals {
            let g = grad(w, &params);
            now = start + Duration::from_secs_f64(t);
            let loss = loss(w);
            let msg = ToServer::Grad { base: v, iteration: 0, seq: seq[w as usize], values: Values::Slice(&g), loss };
            s.handle(now, WorkerId(w), msg).unwrap();
            seq[w as usize] += 1;
            if s.version() != v {
                break;
            }
        }
        assert_eq!(s.version(), v.next());
    }
    while let Some(o) = s.poll_output() {
        if let ServerOutput::Event(e @ ServerEvent::BackupChosen { .. }) = o {
            out.push(e);
        }
    }
    out
}

fn shifted_exp(rng: &mut Rng) -> f64 {
    1.0 - libm::log(1.0 - rng.next_f64())
}

/// `n` workers, η = 0.1 and a fixed `L·η` of 1, the choice of `k` on after 5 warm-up
/// iterations.
fn quick_config(n: u32) -> DbwConfig {
    let mut config = DbwConfig::new(n, 0.1);
    config.warmup_iterations = 5;
    config.warmup_k = None;
    config.l_eta = LEta::Fixed(1.0);
    config
}

#[test]
fn clean_gradients_pick_k_min_noisy_ones_wait_for_more() {
    let n = 16;
    let config = quick_config(n);
    // Identical gradients (S = 0): more gradients add nothing, so the fastest k_min win.
    let mut rng = Rng::new(7);
    let mut s = server(config, 4);
    let clean = drive(&mut s, n, 60, |_| shifted_exp(&mut rng), |_, p| p.to_vec());
    let ks = ks_of(&clean);
    // Version 0 and the next four wait for all (five warm-up iterations).
    assert!(ks[..4].iter().all(|k| *k == n), "warm-up waits for all: {ks:?}");
    assert!(ks[4..].iter().all(|k| *k == 2), "{ks:?}");
    // The τ estimate for k = 2 comes from censored windows; compare with the closed form.
    let exact = math::estimate::shifted_exp_order_statistic(n, 2, 1.0, 1.0);
    let (mut tau_sum, mut observed_sum, mut m) = (0.0, 0.0, 0.0);
    for e in &clean[20..] {
        if let ServerEvent::BackupChosen { tau_estimate, observed_iteration_time, .. } = e {
            tau_sum += f64::from(*tau_estimate);
            observed_sum += f64::from(*observed_iteration_time);
            m += 1.0;
        }
    }
    assert!((tau_sum / m - exact).abs() / exact < 0.1, "tau {} vs {exact}", tau_sum / m);
    assert!((observed_sum / m - exact).abs() / exact < 0.2, "observed {} vs {exact}", observed_sum / m);

    // Gradients dominated by noise (S ≫ G): wait for (nearly) everyone.
    let ks = noisy_run(config, None);
    let mean = ks[10..].iter().map(|k| f64::from(*k)).sum::<f64>() / (ks.len() - 10) as f64;
    assert!(mean > 12.0, "{ks:?}");
}

fn ks_of(events: &[ServerEvent]) -> Vec<u32> {
    events.iter().map(|e| if let ServerEvent::BackupChosen { k, .. } = e { *k } else { 0 }).collect()
}

/// The noisy run of `clean_gradients_pick_k_min_noisy_ones_wait_for_more` (S ≫ G: the
/// gradient rule waits for nearly everyone), with the workers reporting `loss`.
fn noisy_run(config: DbwConfig, loss: Option<f32>) -> Vec<u32> {
    let n = config.workers;
    let (mut rng, mut noise) = (Rng::new(8), Rng::new(9));
    let mut s = server(config, 4);
    let events = drive_reporting(
        &mut s,
        n,
        60,
        |_| shifted_exp(&mut rng),
        |_, p| p.iter().map(|x| x + 50.0 * (noise.next_f64() - 0.5)).collect(),
        |_| loss,
    );
    ks_of(&events)
}

/// The loss rule: a loss far above the noise floor `η·Ŝ/(4k)` of every `k` makes the
/// fastest `k` win (the decrease is the loss above the floor, the same for every `k`), below
/// the gradient rule's choice; a loss at or below every floor leaves the gradient rule's
/// choice; without reports, or with the reports switched off, the choice is the gradient
/// rule's, iteration by iteration.
#[test]
fn reported_losses_bound_k_by_the_loss_above_the_noise_floor() {
    let n = 16;
    let mut config = quick_config(n);
    config.use_reported_losses = true;
    let gradient_rule = noisy_run(config, None);
    let mean = |ks: &[u32]| ks[10..].iter().map(|k| f64::from(*k)).sum::<f64>() / (ks.len() - 10) as f64;
    assert!(mean(&gradient_rule) > 12.0, "{gradient_rule:?}");
    // Ŝ ≈ 4·50²/12 ≈ 833 per gradient: floor η·Ŝ/4 ≈ 21, so 21/k for k = 1..16 is above 1.3.
    let high = noisy_run(config, Some(1.0e6));
    assert!(high[5..].iter().all(|k| *k == 2), "{high:?}");
    assert_eq!(noisy_run(config, Some(1.0)), gradient_rule, "a loss below every floor");
    assert_eq!(noisy_run(DbwConfig { use_reported_losses: false, ..config }, Some(1.0e6)), gradient_rule);
    assert!(!DbwConfig::new(n, 0.1).use_reported_losses, "off by default");
    // The warm-up is the same either way.
    assert_eq!(high[..4], gradient_rule[..4]);
}

/// On `F(w) = (c/2)‖w‖²` with noiseless gradients `c·w`, both estimates are exactly
/// `Lη = c·η`; on an anisotropic quadratic the secant sees the larger curvature and the
/// Rayleigh quotient a mean.
#[test]
fn estimated_l_eta_on_quadratics() {
    let n = 2;
    let run = |l_eta: LEta, curvature: [f64; 3]| {
        let mut config = DbwConfig::new(n, 0.25);
        config.l_eta = l_eta;
        config.ema_beta = 0.0;
        let mut s = server(config, 3);
        let events =
            drive(&mut s, n, 6, |w| 1.0 + f64::from(w), |_, p| p.iter().zip(curvature).map(|(x, c)| c * x).collect());
        let last = events.iter().rev().find_map(|e| match e {
            ServerEvent::BackupChosen { l_eta_estimate, s_estimate, .. } => {
                assert_eq!(*s_estimate, 0.0);
                Some(f64::from(*l_eta_estimate))
            }
            _ => None,
        });
        (last.unwrap(), s.l_eta_estimate())
    };
    let secant = LEta::Secant { initial: 1.0, min: 0.01, max: 1.9 };
    let rayleigh = LEta::Rayleigh { initial: 1.0, min: 0.01, max: 1.9 };
    for mode in [secant, rayleigh] {
        let (reported, used) = run(mode, [2.0; 3]);
        assert!((reported - 0.5).abs() < 1e-6, "{mode:?}: {reported}");
        assert!((used - 0.5).abs() < 1e-9, "{mode:?}: {used}");
    }
    let (s, _) = run(secant, [3.0, 0.5, 0.5]);
    let (r, _) = run(rayleigh, [3.0, 0.5, 0.5]);
    assert!(s > r && s <= 0.75 + 1e-6 && r >= 0.125 - 1e-6, "secant {s} rayleigh {r}");
    assert_eq!(DbwConfig { l_eta: LEta::Fixed(1.0), ..DbwConfig::new(4, 0.1) }.scratch_len(10), 10);
    assert_eq!(DbwConfig::new(4, 0.1).scratch_len(10), 20);
}

#[test]
fn config_errors_and_refusals() {
    let bad = |c: DbwConfig| DbwServer::<f32, Vec<f32>>::new(c, vec![0.0; 2], vec![0.0; 4]).err();
    let base = DbwConfig::new(4, 0.1);
    assert_eq!(bad(DbwConfig { k_min: 0, ..base }), Some(ConfigError::Knob("k_min")));
    assert_eq!(bad(DbwConfig { k_min: 5, ..base }), Some(ConfigError::Knob("k_min")));
    assert_eq!(bad(DbwConfig { window: 0, ..base }), Some(ConfigError::Knob("window")));
    assert_eq!(bad(DbwConfig { flat_tolerance: -0.1, ..base }), Some(ConfigError::Knob("flat_tolerance")));
    assert_eq!(bad(DbwConfig { flat_tolerance: f64::NAN, ..base }), Some(ConfigError::Knob("flat_tolerance")));
    assert_eq!(bad(DbwConfig { ema_beta: 1.0, ..base }), Some(ConfigError::Knob("ema_beta")));
    assert_eq!(bad(DbwConfig { ema_beta: f64::NAN, ..base }), Some(ConfigError::Knob("ema_beta")));
    assert_eq!(bad(DbwConfig { l_eta: LEta::Fixed(0.0), ..base }), Some(ConfigError::Knob("l_eta")));
    let secant = LEta::Secant { initial: 3.0, min: 0.1, max: 2.0 };
    assert_eq!(bad(DbwConfig { l_eta: secant, ..base }), Some(ConfigError::Knob("l_eta")));
    let secant = LEta::Secant { initial: 1.0, min: 0.1, max: 2.0 };
    assert_eq!(
        DbwServer::<f32, Vec<f32>>::new(DbwConfig { l_eta: secant, ..base }, vec![0.0; 3], vec![0.0; 5]).err(),
        Some(ConfigError::ScratchTooSmall { needed: 6, given: 5 })
    );
    assert_eq!(bad(DbwConfig::new(0, 0.1)), Some(ConfigError::WorkerCount(0)));
    assert_eq!(DbwConfig::new(1, 0.1).k_min, 1);

    let mut s = server(base, 2);
    let g = [1.0, 1.0];
    let msg = |seq| ToServer::Grad { base: Version(0), iteration: 0, seq, values: Values::Slice(&g), loss: None };
    s.handle(Instant::ZERO, WorkerId(0), msg(0)).unwrap();
    assert_eq!(s.handle(Instant::ZERO, WorkerId(0), msg(1)), Err(Reject::Duplicate { worker: WorkerId(0), seq: 1 }));
    assert_eq!(s.handle(Instant::ZERO, WorkerId(7), msg(0)), Err(Reject::UnknownWorker(WorkerId(7))));
    assert_eq!(s.stats().rejected, 2);
    // The first iteration waits for max(⌈n/4⌉, 2) by default: 2 of 4 here.
    assert_eq!((s.received(), s.current_k()), (1, 2));
    // ⌈16/4⌉ = 4 of 16; ⌈3/4⌉ = 1 is raised to k_min = 2.
    assert_eq!(DbwConfig::new(16, 0.1).warmup_k, Some(4));
    assert_eq!(DbwConfig::new(3, 0.1).warmup_k, Some(2));
}

/// K3 and liveness: a loss lowers the open iteration's `k` to the gradients it holds plus
/// one from each live worker not yet in it (closing it if it holds them already), and the
/// next choice is bounded by the live count.
#[test]
fn lost_workers_bound_the_open_and_the_next_k() {
    let mut config = DbwConfig::new(4, 0.5);
    config.warmup_iterations = 100;
    config.warmup_k = None;
    let mut s = server(config, 1);
    let grad = |base: u64, seq: u64| ToServer::Grad {
        base: Version(base),
        iteration: 0,
        seq,
        values: Values::Slice(&[1.0]),
        loss: None,
    };
    let drain = |s: &mut DbwServer<f64, Vec<f64>>| {
        let mut events = Vec::new();
        while let Some(o) = s.poll_output() {
            if let ServerOutput::Event(e) = o {
                events.push(e);
            }
        }
        events
    };
    // Iteration 0 waits for all 4; worker 3 is lost before sending: 3 suffice.
    s.handle_worker_lost(Instant::ZERO, WorkerId(3)).unwrap();
    for w in 0..3 {
        s.handle(Instant::ZERO, WorkerId(w), grad(0, 0)).unwrap();
    }
    assert_eq!(s.version(), Version(1), "iteration 0 closed on the 3 live workers");
    assert_eq!(chosen(&drain(&mut s)), [(1, 3)], "the next k is bounded by the live count");
    // Worker 0 contributes to iteration 1; workers 1 and 2 are lost together: the round
    // holds all it can still get, so it closes at once with the one gradient.
    s.handle(Instant::ZERO, WorkerId(0), grad(1, 1)).unwrap();
    s.handle_worker_lost(Instant::ZERO, WorkerId(1)).unwrap();
    s.handle_worker_lost(Instant::ZERO, WorkerId(2)).unwrap();
    assert_eq!(s.version(), Version(2), "no iteration waits for a lost worker");
    assert_eq!(chosen(&drain(&mut s)), [(2, 1)]);
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(32))]

    /// K1–K3 and conservation with k changing every iteration, for random cluster
    /// sizes, bounds, warm-ups, interrupt options and delivery orders.
    #[test]
    fn k_invariants_hold(
        n in 1u32..8, k_min in 1u32..8, warmup in 0u32..4, abort in any::<bool>(), mode in 0u8..4,
        half in any::<bool>(),
        seed in any::<u64>(), dim in 1usize..4, slow in 0u32..8, tol in 0.0f64..0.2,
    ) {
        let mut config = DbwConfig::new(n, 0.5);
        config.k_min = 1 + (k_min - 1) % n;
        config.flat_tolerance = tol;
        config.warmup_iterations = warmup;
        config.window = 4;
        config.interrupt = if abort { Interrupt::Abort } else { Interrupt::RunToCompletion };
        config.l_eta = match mode {
            0 => LEta::Fixed(1.0),
            1 => LEta::Secant { initial: 1.0, min: 0.05, max: 1.9 },
            2 => LEta::Rayleigh { initial: 1.0, min: 0.05, max: 1.9 },
            _ => LEta::Split { initial: 1.0, min: 0.05, max: 1.9 },
        };
        if !half {
            config.warmup_k = None;
        }
        let k0 = config.warmup_k.map_or(n, |k| k.clamp(config.k_min, n));
        let mut s = server(config, dim);
        let trace = run(&mut s, n, dim, 12, seed, &[slow]);
        let ks = chosen(&trace.events);
        prop_assert_eq!(ks.len(), 12);
        for (i, (v, k)) in ks.iter().enumerate() {
            prop_assert_eq!(*v, i as u64 + 1);
            prop_assert!(*k >= config.k_min && *k <= n, "K3: k = {} outside [{}, {}]", k, config.k_min, n);
            if i + 1 < warmup as usize {
                prop_assert_eq!(*k, k0);
            }
        }
        let k_of = |v: u64| if v == 0 { k0 as usize } else { ks[v as usize - 1].1 as usize };
        let dropped = check(&trace, dim, 0.5, 1.0, k_of);
        prop_assert_eq!(dropped, s.stats().dropped_total());
    }

    /// With `k_min = n` DBW never cuts a straggler: BSP's trace, plus one
    /// `BackupChosen` per iteration.
    #[test]
    fn k_min_n_is_bsp(n in 1u32..7, seed in any::<u64>(), dim in 1usize..4) {
        let mut bsp: BspServer<f64, Vec<f64>> = BspServer::new(BspConfig::new(n, 0.5), vec![1.0; dim], vec![0.0; dim]).unwrap();
        let reference = run(&mut bsp, n, dim, 5, seed, &[0]);
        let mut config = DbwConfig::new(n, 0.5);
        config.k_min = n;
        let mut s = server(config, dim);
        let mut trace = run(&mut s, n, dim, 5, seed, &[0]);
        prop_assert_eq!(chosen(&trace.events).len(), 5);
        trace.events.retain(|e| !matches!(e, ServerEvent::BackupChosen { .. }));
        prop_assert_eq!(&trace, &reference);
    }
}

/// The plain loops the blocked secant passes replace: `ḡ_{t−1} ← acc·inv_k`, with
/// `(Σ (m − q)², Σ m·q)` summed in element order.
fn plain_passes<T: Scalar>(prev: &mut [T], acc: &[T], inv_k: T) -> (f64, f64) {
    let (mut diff_sq, mut dot) = (0.0, 0.0);
    for (p, a) in prev.iter_mut().zip(acc.iter()) {
        let mean = *a * inv_k;
        let (m, q) = (mean.to_f64(), p.to_f64());
        diff_sq += (m - q) * (m - q);
        dot += m * q;
        *p = mean;
    }
    (diff_sq, dot)
}

proptest! {
    /// The blocked passes of the close ([`server::rayleigh_pass`], [`server::secant_pass`])
    /// give the plain loops' sums bit for bit and leave the same `ḡ_{t−1}`, for `f32` and
    /// `f64`, every length (whole blocks, a remainder, unequal lengths) and values with
    /// cancellation, infinities and NaN.
    #[test]
    fn secant_passes_are_the_plain_loops(
        pairs in proptest::collection::vec(
            (prop_oneof![8 => -1e3f64..1e3, 1 => Just(f64::INFINITY), 1 => Just(f64::NAN), 1 => Just(0.0)], -1e3f64..1e3),
            0..40,
        ),
        extra in 0usize..3, inv_k in prop_oneof![Just(0.25f64), Just(1.0 / 3.0), 1e-3f64..2.0],
    ) {
        let acc: Vec<f64> = pairs.iter().map(|p| p.0).collect();
        let prev: Vec<f64> = pairs.iter().map(|p| p.1).chain((0..extra).map(|i| i as f64)).collect();
        // Bits, with every NaN as one (which NaN an operation returns may depend on operand
        // order, which the compiler may swap).
        let one = |x: f64| if x.is_nan() { f64::NAN.to_bits() } else { x.to_bits() };
        let bits = |x: (f64, f64)| (one(x.0), one(x.1));
        let (mut want, mut got, mut got2) = (prev.clone(), prev.clone(), prev.clone());
        let plain = plain_passes(&mut want, &acc, inv_k);
        prop_assert_eq!(bits(server::secant_pass(&mut got, &acc, inv_k)), bits(plain));
        prop_assert_eq!(one(server::rayleigh_pass(&mut got2, &acc, inv_k)), one(plain.1));
        let as_bits = |v: &[f64]| v.iter().map(|x| one(*x)).collect::<Vec<_>>();
        prop_assert_eq!(as_bits(&got), as_bits(&want));
        prop_assert_eq!(as_bits(&got2), as_bits(&want));
        // The same in `f32`, as the benches and most callers store the model.
        let acc: Vec<f32> = acc.iter().map(|x| *x as f32).collect();
        let prev: Vec<f32> = prev.iter().map(|x| *x as f32).collect();
        let inv_k = inv_k as f32;
        let (mut want, mut got, mut got2) = (prev.clone(), prev.clone(), prev);
        let plain = plain_passes(&mut want, &acc, inv_k);
        prop_assert_eq!(bits(server::secant_pass(&mut got, &acc, inv_k)), bits(plain));
        prop_assert_eq!(one(server::rayleigh_pass(&mut got2, &acc, inv_k)), one(plain.1));
        let as_bits = |v: &[f32]| v.iter().map(|x| one(f64::from(*x))).collect::<Vec<_>>();
        prop_assert_eq!(as_bits(&got), as_bits(&want));
        prop_assert_eq!(as_bits(&got2), as_bits(&want));
    }
}

/// The estimator windows live in the caller's storage: a server for eight workers with
/// inline tables (the firmware's) keeps its whole state beside the model within 8 KiB.
#[test]
fn an_inline_server_for_eight_workers_fits_in_8_kib() {
    use crate::proto::Inline;
    let size = size_of::<DbwServer<f32, &mut [f32], Inline<8>>>();
    assert!(size <= 8 * 1024, "{size} bytes");
    let mut params = [0.0f32; 4];
    let mut scratch = [0.0f32; 8];
    assert!(DbwServer::<f32, &mut [f32], Inline<8>>::new(DbwConfig::new(8, 0.1), &mut params, &mut scratch).is_ok());
    let (mut params, mut scratch) = ([0.0f32; 4], [0.0f32; 8]);
    assert!(DbwServer::<f32, &mut [f32], Inline<8>>::new(DbwConfig::new(9, 0.1), &mut params, &mut scratch).is_err());
}

#[test]
fn a_retried_join_after_the_gradient_arrived_gets_no_model() {
    // A worker waiting for the round asks again (same session): its gradient on the current
    // model is in, so a model would only make it compute the same step again, which the server
    // would refuse as a duplicate.
    let mut s = server(DbwConfig::new(3, 0.1), 2);
    let now = Instant::ZERO;
    for w in 0..3 {
        s.handle(now, WorkerId(w), ToServer::Join { epoch: 0 }).unwrap();
    }
    let g = [1.0, 1.0];
    s.handle(
        now,
        WorkerId(1),
        ToServer::Grad { base: Version(0), iteration: 0, seq: 0, values: Values::Slice(&g), loss: None },
    )
    .unwrap();
    while s.poll_output().is_some() {}
    s.handle(now, WorkerId(1), ToServer::Join { epoch: 0 }).unwrap();
    let mut models = 0;
    while let Some(o) = s.poll_output() {
        models += usize::from(matches!(o, ServerOutput::Send { msg: ToWorker::Model { .. }, .. }));
    }
    assert_eq!(models, 0);
    // A worker whose gradient is not in the round is answered.
    s.handle(now, WorkerId(2), ToServer::Join { epoch: 0 }).unwrap();
    let mut to_2 = 0;
    while let Some(o) = s.poll_output() {
        to_2 += usize::from(matches!(o, ServerOutput::Send { to: Recipient::Worker(WorkerId(2)), .. }));
    }
    assert_eq!(to_2, 1);
}
