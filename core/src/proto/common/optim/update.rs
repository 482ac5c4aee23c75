//! The shapes a protocol's update comes in, each with its plain SGD step (the protocol's own
//! fused kernel) and its elements for the rules that need the direction.

use crate::math::{self, LengthMismatch, Scalar};
use crate::msg::Values;

/// One update of the server's model as a protocol computes it: the plain step
/// `x ← x + a·u` at the protocol's learning rate `η`, with the work the protocol fuses into
/// that pass. The rule reads the direction as `d = −(a/η)·u`.
pub(crate) trait Update<T: Scalar> {
    /// The protocol's learning rate `η` (above 0).
    fn lr(&self) -> f64;
    /// The coefficient `a` of the plain step.
    fn coefficient(&self) -> T;
    /// Whether the update's vectors have the model's `dim` elements; on `Err` neither
    /// [`Self::plain`] nor [`Self::each`] may be called.
    fn check(&self, dim: usize) -> Result<(), LengthMismatch>;
    /// The plain step, as the protocol takes it without a rule (its own bits).
    fn plain(self, params: &mut [T]) -> Result<(), LengthMismatch>;
    /// Calls `f(x_i, u_i)` for every element in order (lengths checked by [`Self::check`]),
    /// then does the protocol's fused work (clearing its accumulator).
    fn each(self, params: &mut [T], f: impl FnMut(&mut T, T));
}

/// The elements of a payload, from a slice or decoded from little-endian bytes (a length
/// other than a whole number of elements was refused by the length check before).
fn elements<'a, T: Scalar>(values: &'a Values<'_, T>) -> impl Iterator<Item = T> + 'a {
    let (slice, bytes): (&[T], &[u8]) = match *values {
        Values::Slice(s) => (s, &[]),
        Values::LittleEndian(b) => (&[], b),
    };
    slice.iter().copied().chain(bytes.chunks_exact(T::BYTES).map(|e| T::from_le(e).unwrap_or_else(T::zero)))
}

fn same_len(expected: usize, actual: usize) -> Result<(), LengthMismatch> {
    if expected == actual { Ok(()) } else { Err(LengthMismatch { expected, actual }) }
}

/// An accumulator applied and cleared: `x ← x + a·acc`, `acc ← 0` (a round's mean, a BAP
/// iteration, a WBSP round).
pub(crate) struct Cleared<'a, T> {
    /// The accumulator, the model's length.
    pub(crate) acc: &'a mut [T],
    /// The plain step's coefficient.
    pub(crate) a: T,
    /// The protocol's learning rate.
    pub(crate) lr: f64,
}

impl<T: Scalar> Update<T> for Cleared<'_, T> {
    fn lr(&self) -> f64 {
        self.lr
    }
    fn coefficient(&self) -> T {
        self.a
    }
    fn check(&self, dim: usize) -> Result<(), LengthMismatch> {
        same_len(dim, self.acc.len())
    }
    #[inline(always)]
    fn plain(self, params: &mut [T]) -> Result<(), LengthMismatch> {
        math::apply_and_clear(params, self.a, self.acc)
    }
    fn each(self, params: &mut [T], mut f: impl FnMut(&mut T, T)) {
        for (x, g) in params.iter_mut().zip(self.acc.iter_mut()) {
            f(x, *g);
            *g = T::zero();
        }
    }
}

/// A round's last gradient folded into its close: `x ← x + a·(acc + factor·values)`,
/// `acc ← 0` (BSP).
pub(crate) struct FoldedLast<'a, 'v, 'w, T> {
    /// The round's accumulator, the model's length.
    pub(crate) acc: &'a mut [T],
    /// The last gradient.
    pub(crate) values: &'w Values<'v, T>,
    /// Its admission factor.
    pub(crate) factor: T,
    /// The plain step's coefficient.
    pub(crate) a: T,
    /// The protocol's learning rate.
    pub(crate) lr: f64,
}

impl<T: Scalar> Update<T> for FoldedLast<'_, '_, '_, T> {
    fn lr(&self) -> f64 {
        self.lr
    }
    fn coefficient(&self) -> T {
        self.a
    }
    fn check(&self, dim: usize) -> Result<(), LengthMismatch> {
        same_len(dim, self.acc.len())?;
        self.values.check_len(dim)
    }
    #[inline(always)]
    fn plain(self, params: &mut [T]) -> Result<(), LengthMismatch> {
        self.values.add_apply_and_clear(self.factor, params, self.a, self.acc)
    }
    fn each(self, params: &mut [T], mut f: impl FnMut(&mut T, T)) {
        let factor = self.factor;
        for ((x, g), v) in params.iter_mut().zip(self.acc.iter_mut()).zip(elements(self.values)) {
            f(x, *g + factor * v);
            *g = T::zero();
        }
    }
}

/// One payload scaled: `x ← x + a·values` (an ASP gradient).
pub(crate) struct Scaled<'v, 'w, T> {
    /// The payload.
    pub(crate) values: &'w Values<'v, T>,
    /// The plain step's coefficient.
    pub(crate) a: T,
    /// The protocol's learning rate.
    pub(crate) lr: f64,
}

impl<T: Scalar> Update<T> for Scaled<'_, '_, T> {
    fn lr(&self) -> f64 {
        self.lr
    }
    fn coefficient(&self) -> T {
        self.a
    }
    fn check(&self, dim: usize) -> Result<(), LengthMismatch> {
        self.values.check_len(dim)
    }
    #[inline(always)]
    fn plain(self, params: &mut [T]) -> Result<(), LengthMismatch> {
        self.values.scaled_add_into(params, self.a)
    }
    fn each(self, params: &mut [T], mut f: impl FnMut(&mut T, T)) {
        for (x, v) in params.iter_mut().zip(elements(self.values)) {
            f(x, v);
        }
    }
}

/// A model change applied as it came, or scaled by its clipping factor:
/// `x ← x + factor·values` (an SSP clock update, whose payload already is `−η·g`). The rate
/// is computed only when a rule reads it (`lr`, called on the rule's path alone).
pub(crate) struct UnitOrScaled<'v, 'w, T, L> {
    /// The payload.
    pub(crate) values: &'w Values<'v, T>,
    /// Its admission factor (the plain step's coefficient).
    pub(crate) factor: T,
    /// The rate the payload was made with.
    pub(crate) lr: L,
}

impl<T: Scalar, L: Fn() -> f64> Update<T> for UnitOrScaled<'_, '_, T, L> {
    fn lr(&self) -> f64 {
        (self.lr)()
    }
    fn coefficient(&self) -> T {
        self.factor
    }
    fn check(&self, dim: usize) -> Result<(), LengthMismatch> {
        self.values.check_len(dim)
    }
    #[inline(always)]
    fn plain(self, params: &mut [T]) -> Result<(), LengthMismatch> {
        if self.factor == T::one() {
            self.values.add_into(params)
        } else {
            self.values.scaled_add_into(params, self.factor)
        }
    }
    fn each(self, params: &mut [T], mut f: impl FnMut(&mut T, T)) {
        for (x, v) in params.iter_mut().zip(elements(self.values)) {
            f(x, v);
        }
    }
}
