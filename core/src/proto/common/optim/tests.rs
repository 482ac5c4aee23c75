//! The rules and schedules against closed forms, their knobs' ranges, checkpoints of their
//! state, and that every rule keeps a finite model finite.

use super::*;
use crate::error::ConfigError;
use crate::id::{Version, WorkerId};
use crate::msg::{ToServer, Values};
use crate::proto::Server;
use crate::proto::asp::{AspConfig, AspServer};
use crate::proto::bsp::{BspConfig, BspServer};
use crate::time::Instant;
use proptest::prelude::*;
use std::vec;
use std::vec::Vec;

fn grad<T>(base: u64, seq: u64, values: &[T]) -> ToServer<'_, T> {
    ToServer::Grad { base: Version(base), iteration: base, seq, values: Values::Slice(values), loss: None }
}

/// Feeds one gradient from `worker` and drains the outputs.
fn feed<T: crate::math::Scalar, S: Server<T>>(s: &mut S, worker: u32, msg: ToServer<'_, T>) {
    s.handle(Instant::ZERO, WorkerId(worker), msg).unwrap();
    while s.poll_output().is_some() {}
}

/// A one-worker BSP server on `x0` at rate `lr` with `optimizer`: each round's direction is
/// the one gradient.
fn bsp<T: crate::math::Scalar>(x0: &[T], lr: f64, optimizer: Optimizer) -> BspServer<T, Vec<T>> {
    let dim = x0.len();
    let s: BspServer<T, Vec<T>> = BspServer::new(BspConfig::new(1, lr), x0.to_vec(), vec![T::zero(); dim]).unwrap();
    s.with_optimizer(optimizer, vec![T::zero(); optimizer.state_len(dim)]).unwrap()
}

const TORCH_ADAMW: AdamW = AdamW { beta1: 0.9, beta2: 0.999, eps: 1e-8, weight_decay: 0.01 };

#[test]
fn adamw_two_steps_match_torch() {
    // torch.optim.AdamW(lr=0.1, betas=(0.9, 0.999), eps=1e-8, weight_decay=0.01) on
    // x0 = (1, −0.5), gradients (2, 0.25) then (−1, 0.5). First coordinate by hand:
    // step 1: x = 1·0.999; m = 0.2; v = 0.004; m̂ = 2, √v̂ = 2;
    //   x1 = 0.999 − 0.1·2/(2 + 1e-8) = 0.8990000005.
    // step 2: x = 0.999·x1; m = 0.18 − 0.1 = 0.08; v = 0.999·0.004 + 0.001 = 0.004996;
    //   x2 = 0.999·x1 − (0.1/0.19)·0.08/(√(0.004996/0.001999) + 1e-8) = 0.8714672967019315.
    // Second coordinate: x1 = −0.4995 − 0.1·0.25/(0.25 + 1e-8) = −0.599499996;
    //   m = 0.0725, v = 0.0003124375, x2 = −0.6954186961448046.
    let mut s = bsp(&[1.0f64, -0.5], 0.1, Optimizer::adamw(TORCH_ADAMW));
    feed(&mut s, 0, grad(0, 0, &[2.0, 0.25]));
    let x1 = s.params().to_vec();
    assert!((x1[0] - 0.8990000005).abs() < 1e-12 && (x1[1] + 0.599499996).abs() < 1e-12, "{x1:?}");
    feed(&mut s, 0, grad(1, 1, &[-1.0, 0.5]));
    let x2 = s.params();
    assert!((x2[0] - 0.8714672967019315).abs() < 1e-12, "{x2:?}");
    assert!((x2[1] + 0.6954186961448046).abs() < 1e-12, "{x2:?}");
    let state = s.optimizer_state().unwrap();
    assert_eq!(state.len(), 4 + 40, "m, v, then the header");
    let want = [0.08, 0.0725, 0.004996, 0.0003124375];
    assert!(state.iter().zip(want).all(|(a, b)| (a - b).abs() < 1e-15), "m then v: {state:?}");
    assert_eq!(s.optimizer_steps(), 2);
    // The same in f32, within its precision.
    let mut s = bsp(&[1.0f32, -0.5], 0.1, Optimizer::adamw(TORCH_ADAMW));
    feed(&mut s, 0, grad(0, 0, &[2.0f32, 0.25]));
    feed(&mut s, 0, grad(1, 1, &[-1.0f32, 0.5]));
    assert!((s.params()[0] - 0.871_467_3).abs() < 1e-6 && (s.params()[1] + 0.695_418_7).abs() < 1e-6);
}

#[test]
fn nesterov_two_steps_match_torch() {
    // torch.optim.SGD(lr=0.5, momentum=0.9, nesterov=True), x0 = 1, gradients 2 then 4:
    // b1 = 2, x1 = 1 − 0.5·(2 + 0.9·2) = −0.9; b2 = 0.9·2 + 4 = 5.8,
    // x2 = −0.9 − 0.5·(4 + 0.9·5.8) = −5.51.
    let mut s = bsp(&[1.0f64], 0.5, Optimizer::nesterov(0.9));
    feed(&mut s, 0, grad(0, 0, &[2.0]));
    assert!((s.params()[0] + 0.9).abs() < 1e-12, "{:?}", s.params());
    feed(&mut s, 0, grad(1, 1, &[4.0]));
    assert!((s.params()[0] + 5.51).abs() < 1e-12, "{:?}", s.params());
    assert_eq!(s.optimizer_state().and_then(|b| b.first()), Some(&5.8), "the velocity, then the header");
    assert_eq!(s.momentum_buffer(), None, "Nesterov's state is a velocity, not the last model");
}

#[test]
fn schedules_match_their_closed_forms() {
    let step = Schedule::Step { every: 3, gamma: 0.5 };
    let got: Vec<f64> = (0..8).map(|t| step.factor(t)).collect();
    assert_eq!(got, [1.0, 1.0, 1.0, 0.5, 0.5, 0.5, 0.25, 0.25]);
    let cos = Schedule::WarmupCosine { warmup: 4, total: 8, floor: 0.1 };
    // Warm-up 0.1 + 0.9·(t + 1)/4; cosine 0.1 + 0.45·(1 + cos(π(t − 4)/4)); then 0.1.
    let want =
        [0.325, 0.55, 0.775, 1.0, 1.0, 0.1 + 0.45 * (1.0 + 0.5f64.sqrt()), 0.55, 0.1 + 0.45 * (1.0 - 0.5f64.sqrt())];
    for (t, w) in want.iter().enumerate() {
        assert!((cos.factor(t as u64) - w).abs() < 1e-12, "t = {t}: {} vs {w}", cos.factor(t as u64));
    }
    assert_eq!((cos.factor(8), cos.factor(u64::MAX)), (0.1, 0.1));
    assert_eq!(Schedule::Constant.factor(12345), 1.0);
    let none = Schedule::WarmupCosine { warmup: 0, total: 0, floor: 0.0 };
    assert_eq!(none.factor(0), 0.0, "no warm-up and no cosine: the floor from the start");
}

#[test]
fn a_step_schedule_scales_each_update_of_an_asp_server() {
    // ASP at η = 0.5, gradient 1 from alternating workers: update t moves by −0.5·0.5^⌊t/2⌋.
    let mut s: AspServer<f64, Vec<f64>> = AspServer::new(AspConfig::new(2, 0.5), vec![0.0]).unwrap();
    let o = Optimizer::SGD.with_schedule(Schedule::Step { every: 2, gamma: 0.5 });
    s = s.with_optimizer(o, vec![0.0; o.state_len(1)]).unwrap();
    let mut x = 0.0;
    for t in 0..6u64 {
        feed(&mut s, (t % 2) as u32, grad(t, t / 2, &[1.0]));
        x -= 0.5 * 0.5f64.powi((t / 2) as i32);
        assert_eq!(s.params()[0], x, "update {t}");
    }
    assert_eq!((s.optimizer_steps(), s.optimizer_state().map(<[f64]>::len)), (6, Some(40)), "a header only");
}

#[test]
fn knobs_out_of_range_are_refused_by_name() {
    let nan = f64::NAN;
    let adamw = |f: fn(&mut AdamW)| {
        let mut a = AdamW::default();
        f(&mut a);
        Optimizer::adamw(a)
    };
    let cases: Vec<(Optimizer, &str)> = vec![
        (Optimizer::momentum(1.0), "momentum"),
        (Optimizer::momentum(nan), "momentum"),
        (Optimizer::nesterov(-0.1), "nesterov"),
        (Optimizer::nesterov(f64::INFINITY), "nesterov"),
        (adamw(|a| a.beta1 = 1.0), "beta1"),
        (adamw(|a| a.beta1 = f64::NAN), "beta1"),
        (adamw(|a| a.beta2 = -0.5), "beta2"),
        (adamw(|a| a.eps = 0.0), "eps"),
        (adamw(|a| a.eps = f64::INFINITY), "eps"),
        (adamw(|a| a.weight_decay = -0.1), "weight_decay"),
        (adamw(|a| a.weight_decay = f64::NAN), "weight_decay"),
        (Optimizer::SGD.with_schedule(Schedule::Step { every: 0, gamma: 0.5 }), "every"),
        (Optimizer::SGD.with_schedule(Schedule::Step { every: 1, gamma: 0.0 }), "gamma"),
        (Optimizer::SGD.with_schedule(Schedule::Step { every: 1, gamma: 1.5 }), "gamma"),
        (Optimizer::SGD.with_schedule(Schedule::Step { every: 1, gamma: nan }), "gamma"),
        (Optimizer::SGD.with_schedule(Schedule::WarmupCosine { warmup: 1, total: 2, floor: -0.1 }), "floor"),
        (Optimizer::SGD.with_schedule(Schedule::WarmupCosine { warmup: 1, total: 2, floor: nan }), "floor"),
        (Optimizer::SGD.with_schedule(Schedule::WarmupCosine { warmup: 3, total: 2, floor: 0.0 }), "total"),
    ];
    for (o, name) in cases {
        let s: AspServer<f64, Vec<f64>> = AspServer::new(AspConfig::new(1, 0.1), vec![0.0; 2]).unwrap();
        let got = s.with_optimizer(o, vec![0.0; 4]).map(|_| ());
        assert_eq!(got, Err(ConfigError::Knob(name)), "{o:?}");
    }
}

#[test]
fn a_state_buffer_too_small_or_a_bad_checkpoint_is_refused() {
    let fresh = || -> AspServer<f64, Vec<f64>> { AspServer::new(AspConfig::new(1, 0.1), vec![0.0; 3]).unwrap() };
    let adamw = Optimizer::adamw(AdamW::default());
    let e = fresh().with_optimizer(adamw, vec![0.0; 5]).map(|_| ());
    assert_eq!(e, Err(ConfigError::ScratchTooSmall { needed: 46, given: 5 }));
    let e = fresh().with_optimizer(Optimizer::nesterov(0.5), vec![]).map(|_| ());
    assert_eq!(e, Err(ConfigError::ScratchTooSmall { needed: 43, given: 0 }));
    let mut s = fresh().with_optimizer(adamw, vec![0.0; 46]).unwrap();
    feed(&mut s, 0, grad(0, 0, &[1.0, -1.0, 2.0]));
    let good = s.optimizer_state().unwrap().to_vec();
    assert!(fresh().with_optimizer_state(adamw, good.clone()).is_ok());
    let corrupt = |i: usize, v: f64| {
        let mut state = good.clone();
        state[i] = v;
        fresh().with_optimizer_state(adamw, state).map(|_| ())
    };
    let refused = Err(ConfigError::Knob("optimizer state"));
    assert_eq!(corrupt(2, f64::NAN), refused, "a moment not finite");
    assert_eq!(corrupt(4, -1e-9), refused, "a negative second moment");
    assert_eq!(corrupt(6 + 4, 0.5), refused, "a header piece that is not a whole number");
    assert_eq!(corrupt(6 + 4, 65536.0), refused, "a header piece out of range");
    let other = Optimizer::adamw(AdamW { eps: 1e-6, ..AdamW::default() });
    assert_eq!(fresh().with_optimizer_state(other, good.clone()).map(|_| ()), refused, "other settings");
    // Plain SGD at a constant rate keeps no rule, whatever form it is asked in.
    for plain in [Optimizer::SGD, Optimizer::momentum(0.0), Optimizer::nesterov(0.0)] {
        let s = fresh().with_optimizer(plain, vec![]).unwrap();
        assert_eq!((s.optimizer(), s.optimizer_state(), s.optimizer_steps()), (Optimizer::SGD, None, 0));
    }
}

/// Four updates of AdamW under a warm-up on ASP, or two, a checkpoint (model, version, the
/// rule's state and count) and a server resumed from it for the other two: the same bits.
#[test]
fn a_rule_resumed_from_its_checkpoint_goes_on_bit_for_bit() {
    let o =
        Optimizer::adamw(AdamW::default()).with_schedule(Schedule::WarmupCosine { warmup: 3, total: 9, floor: 0.0 });
    let gradients: [[f32; 2]; 4] = [[1.0, -2.0], [0.5, 0.25], [-3.0, 1.0], [2.0, 2.0]];
    let server = |x0: Vec<f32>, version: u64| -> AspServer<f32, Vec<f32>> {
        AspServer::resume(AspConfig::new(1, 0.01), x0, Version(version)).unwrap()
    };
    let mut whole = server(vec![0.3, -0.7], 0).with_optimizer(o, vec![0.0; o.state_len(2)]).unwrap();
    for (t, g) in gradients.iter().enumerate() {
        feed(&mut whole, 0, grad(t as u64, t as u64, g));
    }
    let mut first = server(vec![0.3, -0.7], 0).with_optimizer(o, vec![0.0; o.state_len(2)]).unwrap();
    for (t, g) in gradients.iter().take(2).enumerate() {
        feed(&mut first, 0, grad(t as u64, t as u64, g));
    }
    let state = first.optimizer_state().unwrap().to_vec();
    assert_eq!(first.optimizer_steps(), 2);
    let mut second = server(first.params().to_vec(), 2).with_optimizer_state(o, state).unwrap();
    for (t, g) in gradients.iter().enumerate().skip(2) {
        feed(&mut second, 0, grad(t as u64, t as u64, g));
    }
    let bits = |s: &AspServer<f32, Vec<f32>>| s.params().iter().map(|x| x.to_bits()).collect::<Vec<_>>();
    assert_eq!(bits(&second), bits(&whole));
    assert_eq!(second.optimizer_state(), whole.optimizer_state());
    assert_eq!((second.optimizer_steps(), whole.optimizer_steps()), (4, 4));
}

/// Any rule in range, with random knobs.
fn any_optimizer() -> impl Strategy<Value = Optimizer> {
    let beta = 0.0f64..0.999;
    let rule = prop_oneof![
        Just(Rule::Sgd),
        beta.clone().prop_map(|beta| Rule::Momentum { beta }),
        beta.clone().prop_map(|beta| Rule::Nesterov { beta }),
        (beta.clone(), beta, 1e-12f64..1.0, 0.0f64..1.0)
            .prop_map(|(beta1, beta2, eps, weight_decay)| Rule::AdamW(AdamW { beta1, beta2, eps, weight_decay })),
    ];
    (rule, any_schedule()).prop_map(|(rule, schedule)| Optimizer { rule, schedule })
}

fn any_schedule() -> impl Strategy<Value = Schedule> {
    prop_oneof![
        Just(Schedule::Constant),
        (1u64..10, 0.01f64..=1.0).prop_map(|(every, gamma)| Schedule::Step { every, gamma }),
        (0u64..10, 0u64..20, 0.0f64..=1.0).prop_map(|(warmup, extra, floor)| Schedule::WarmupCosine {
            warmup,
            total: warmup + extra,
            floor
        }),
    ]
}

proptest! {
    // Finite knobs, a finite model and finite gradients: the model stays finite under every
    // rule and schedule, in f32 and f64.
    #[test]
    fn every_rule_keeps_a_finite_model_finite(
        o in any_optimizer(),
        lr in 1e-4f64..1.0,
        x0 in proptest::collection::vec(-1e3f32..1e3, 1..6),
        gradients in proptest::collection::vec(proptest::collection::vec(-1e3f32..1e3, 6), 1..12),
    ) {
        let dim = x0.len();
        let mut s: AspServer<f32, Vec<f32>> = AspServer::new(AspConfig::new(1, lr), x0.clone()).unwrap();
        s = s.with_optimizer(o, vec![0.0; o.state_len(dim)]).unwrap();
        let x64: Vec<f64> = x0.iter().map(|x| f64::from(*x)).collect();
        let mut d: AspServer<f64, Vec<f64>> = AspServer::new(AspConfig::new(1, lr), x64).unwrap();
        d = d.with_optimizer(o, vec![0.0; o.state_len(dim)]).unwrap();
        for (t, g) in gradients.iter().enumerate() {
            let g = &g[..dim];
            feed(&mut s, 0, grad(t as u64, t as u64, g));
            let g64: Vec<f64> = g.iter().map(|x| f64::from(*x)).collect();
            feed(&mut d, 0, grad(t as u64, t as u64, &g64));
        }
        prop_assert!(s.params().iter().all(|x| x.is_finite()), "{:?}", s.params());
        prop_assert!(d.params().iter().all(|x| x.is_finite()), "{:?}", d.params());
        prop_assert!(s.optimizer_state().unwrap_or(&[]).iter().all(|x| x.is_finite()));
        let expected_steps = if o.is_plain() || o.is_light() { 0 } else { gradients.len() as u64 };
        prop_assert_eq!(s.optimizer_steps(), expected_steps);
    }

    // Every checked schedule's factor is in [0, 1]; warm-up and cosine in [floor, 1], and at
    // the peak (1) at the end of the warm-up.
    #[test]
    fn schedules_stay_between_their_floor_and_the_learning_rate(s in any_schedule(), t in 0u64..40) {
        prop_assert!(s.check().is_ok());
        let f = s.factor(t);
        prop_assert!((0.0..=1.0).contains(&f), "{s:?} at {t}: {f}");
        if let Schedule::WarmupCosine { warmup, floor, .. } = s {
            prop_assert!(f >= floor && f <= 1.0, "{s:?} at {t}: {f}");
            if warmup > 0 {
                prop_assert_eq!(s.factor(warmup - 1), 1.0);
            }
        }
    }
}
