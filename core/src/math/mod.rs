//! Gradient math over caller-owned slices, generic on [`Scalar`] (`f32` and `f64`).
//!
//! Every kernel checks lengths and returns [`LengthMismatch`] instead of panicking. The
//! kernels are plain loops written so that the compiler vectorises them; the benches in
//! `benches/` measure them against a memory copy of the same bytes.

pub mod estimate;
mod scalar;
mod vector;

pub(crate) use vector::LANES;

pub use scalar::Scalar;
pub use vector::{
    LengthMismatch, add, all_finite, apply_and_clear, clip_by_norm, copy, fill_zero, mean_of, scale, scaled_add,
    squared_norm, sub_into,
};
