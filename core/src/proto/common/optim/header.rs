//! The header at the end of a rule's state buffer: the settings and the update count, so a
//! checkpoint of the buffer is the whole rule and the server itself keeps almost nothing.
//!
//! Ten 64-bit slots, each as four elements holding its 16-bit pieces (low first) as whole
//! numbers in `[0, 65535]`: exact in `f32` and `f64`, finite, and refused on reading unless
//! every piece is such a number. Slots: the update count; the rule's kind (0 SGD,
//! 1 momentum, 2 Nesterov, 3 AdamW, 4 mean) and its four knobs as `f64` bits (`β` or `β₁`, `β₂`,
//! `ε`, `λ`; unused ones 0); the schedule's kind (0 constant, 1 step, 2 warm-up and cosine)
//! and its three knobs (`every` or `warmup`; `gamma` as bits or `total`; `floor` as bits).

use super::{HEADER_LEN, Optimizer};
use crate::math::Scalar;

/// Slots in a header.
const SLOTS: usize = 10;
/// Elements per slot.
const PIECES: usize = 4;
/// Elements of a header.
pub(crate) const LEN: usize = HEADER_LEN;
const _: () = assert!(SLOTS * PIECES == LEN);

/// The slots of `o` with the update count `steps`.
fn slots(o: &Optimizer, steps: u64) -> [u64; SLOTS] {
    let (kind, knobs, schedule, s) = o.fields();
    let [k0, k1, k2, k3] = knobs.map(f64::to_bits);
    let [s0, s1, s2] = s;
    [steps, u64::from(kind), k0, k1, k2, k3, u64::from(schedule), s0, s1, s2]
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
    let kind = u8::try_from(kind).ok()?;
    let schedule = u8::try_from(schedule).ok()?;
    let o = Optimizer::from_fields(kind, [k0, k1, k2, k3].map(f64::from_bits), schedule, [s0, s1, s2])?;
    Some((o, steps))
}
