//! The element types the core computes with.

use core::fmt::Debug;
use num_traits::Float;

/// A floating-point element of a model or gradient: `f32` or `f64`.
///
/// Beyond [`Float`] it knows its little-endian wire encoding, which is how tensors cross
/// the wire whatever the host's byte order.
pub trait Scalar: Float + Default + Debug + Send + Sync + 'static {
    /// Bytes per element on the wire.
    const BYTES: usize;
    /// The element-type tag in the wire header (4 for `f32`, 8 for `f64`).
    const WIRE_TAG: u8;
    /// Decodes one element from exactly [`Self::BYTES`] little-endian bytes; `None` if the
    /// slice has another length.
    fn from_le(bytes: &[u8]) -> Option<Self>;
    /// Encodes into exactly [`Self::BYTES`] bytes; returns `false` (and writes nothing) if
    /// `out` has another length.
    fn write_le(self, out: &mut [u8]) -> bool;
    /// Converts from `f64` (rounding to nearest for `f32`).
    fn from_f64(x: f64) -> Self;
    /// Converts to `f64` exactly.
    fn to_f64(self) -> f64;
}

impl Scalar for f32 {
    const BYTES: usize = 4;
    const WIRE_TAG: u8 = 4;
    fn from_le(bytes: &[u8]) -> Option<Self> {
        <[u8; 4]>::try_from(bytes).ok().map(Self::from_le_bytes)
    }
    fn write_le(self, out: &mut [u8]) -> bool {
        match <&mut [u8; 4]>::try_from(out) {
            Ok(o) => {
                *o = self.to_le_bytes();
                true
            }
            Err(_) => false,
        }
    }
    fn from_f64(x: f64) -> Self {
        x as Self
    }
    fn to_f64(self) -> f64 {
        f64::from(self)
    }
}

impl Scalar for f64 {
    const BYTES: usize = 8;
    const WIRE_TAG: u8 = 8;
    fn from_le(bytes: &[u8]) -> Option<Self> {
        <[u8; 8]>::try_from(bytes).ok().map(Self::from_le_bytes)
    }
    fn write_le(self, out: &mut [u8]) -> bool {
        match <&mut [u8; 8]>::try_from(out) {
            Ok(o) => {
                *o = self.to_le_bytes();
                true
            }
            Err(_) => false,
        }
    }
    fn from_f64(x: f64) -> Self {
        x
    }
    fn to_f64(self) -> f64 {
        self
    }
}
