//! # syncopate-adapters
//!
//! The std side of syncopate: everything that binds the sans-IO protocol state machines of
//! the `syncopate` core crate to a real or simulated world.
//!
//! - [`rng`]: a seeded PRNG and the distributions the simulator draws from.

#![forbid(unsafe_code)]
#![deny(missing_docs)]

pub mod rng;
