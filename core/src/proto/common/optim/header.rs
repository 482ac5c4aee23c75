//! The header at the end of a rule's state buffer: the settings and the update count, so a
//! checkpoint of the buffer is the whole rule and the server itself keeps almost nothing.
//!
//! Ten 64-bit slots, each as four elements holding its 16-bit pieces (low first) as whole
//! numbers in `[0, 65535]`: exact in `f32` and `f64`, finite, and refused on reading unless
//! every piece is such a number. Slots: the update count; the rule's kind (0 SGD,
//! 1 momentum, 2 Nesterov, 3 AdamW, 4 mean) and its four knobs as `f64` bits (`β` or `β₁`, `β₂`,
//! `ε`, `λ`; unused ones 0); the schedule's kind (0 constant, 1 step, 2 warm-up and cosine)
//! and its three knobs (`every` or `warmup`; `gamma` as bits or `total`; `floor` as bits).

use super::{AdamW, Optimizer, Rule, Schedule};
use crate::math::Scalar;

/// Slots in a header.
const SLOTS: usize = 10;
/// Elements per slot.
const PIECES: usize = 4;
/// Elements of a header.
pub(crate) const LEN: usize = SLOTS * PIECES;

/// The slots of `o` with the update count `steps`.
fn slots(o: &Optimizer, steps: u64) -> [u64; SLOTS] {
    let (kind, knobs) = match o.rule {
        Rule::Sgd => (0, [0.0; 4]),
        Rule::Momentum { beta } => (1, [beta, 0.0, 0.0, 0.0]),
        Rule::Nesterov { beta } => (2, [beta, 0.0, 0.0, 0.0]),
        Rule::AdamW(a) => (3, [a.beta1, a.beta2, a.eps, a.weight_decay]),
        Rule::Mean => (4, [0.0; 4]),
    };
    let (schedule, s) = match o.schedule {
        Schedule::Constant => (0, [0; 3]),
        Schedule::Step { every, gamma } => (1, [every, gamma.to_bits(), 0]),
        Schedule::WarmupCosine { warmup, total, floor } => (2, [warmup, total, floor.to_bits()]),
    };
    let [k0, k1, k2, k3] = knobs.map(f64::to_bits);
    let [s0, s1, s2] = s;
    [steps, kind, k0, k1, k2, k3, schedule, s0, s1, s2]
}

/// Writes the header of `o` at update count `steps` into `head` (its first [`LEN`]
/// elements; a shorter `head` gets what fits).
pub(crate) fn write<T: Scalar>(head: &mut [T], o: &Optimizer, steps: u64) {
    for (piece, value) in head.chunks_exact_mut(PIECES).zip(slots(o, steps)) {
        put(piece, value);
    }
}

/// Rewrites the update count of the header in `head`.
pub(crate) fn write_steps<T: Scalar>(head: &mut [T], steps: u64) {
    if let Some(piece) = head.get_mut(..PIECES) {
        put(piece, steps);
    }
}

fn put<T: Scalar>(piece: &mut [T], value: u64) {
    for (i, e) in piece.iter_mut().enumerate() {
        *e = T::from_f64(((value >> (16 * i)) & 0xffff) as f64);
    }
}

fn get<T: Scalar>(piece: &[T]) -> Option<u64> {
    piece.iter().enumerate().try_fold(0u64, |acc, (i, e)| {
        let v = Scalar::to_f64(*e);
        let whole = (0.0..=65535.0).contains(&v) && v == libm::floor(v);
        whole.then(|| acc | ((v as u64) << (16 * i)))
    })
}

/// The settings and update count the header in `head` holds, if it is one (every piece a
/// whole number in range, known kinds).
pub(crate) fn read<T: Scalar>(head: &[T]) -> Option<(Optimizer, u64)> {
    let mut s = [0u64; SLOTS];
    for (slot, piece) in s.iter_mut().zip(head.get(..LEN)?.chunks_exact(PIECES)) {
        *slot = get(piece)?;
    }
    let [steps, kind, k0, k1, k2, k3, schedule, s0, s1, s2] = s;
    let f = f64::from_bits;
    let rule = match kind {
        0 => Rule::Sgd,
        1 => Rule::Momentum { beta: f(k0) },
        2 => Rule::Nesterov { beta: f(k0) },
        3 => Rule::AdamW(AdamW { beta1: f(k0), beta2: f(k1), eps: f(k2), weight_decay: f(k3) }),
        4 => Rule::Mean,
        _ => return None,
    };
    let schedule = match schedule {
        0 => Schedule::Constant,
        1 => Schedule::Step { every: s0, gamma: f(s1) },
        2 => Schedule::WarmupCosine { warmup: s0, total: s1, floor: f(s2) },
        _ => return None,
    };
    Some((Optimizer { rule, schedule }, steps))
}
