//! Gradient math over caller-owned slices, generic on [`Scalar`] (`f32` and `f64`).
//!
//! Every kernel checks lengths and returns [`LengthMismatch`] instead of panicking. The
//! kernels are plain loops written so that the compiler vectorises them; the benches in
//! `benches/` measure them against a memory copy of the same bytes.

pub mod dbw_policy;
pub mod estimate;
mod scalar;
mod vector;

pub(crate) use vector::{FINITE_BLOCK, LANES, lanes_are_zero, sum_lanes, zero_if_finite};

pub use crate::error::LengthMismatch;
pub use scalar::Scalar;
pub use vector::{
    add, add_apply_and_clear, add_to_measured, all_finite, apply_and_clear, clip_by_norm, copy, copy_finite, fill_zero,
    mean_of, scale, scaled_add, scaled_add_apply_and_clear, scaled_add_to, squared_norm, sub_into,
};
