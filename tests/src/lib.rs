//! Shared helpers for the integration tests: the swarm fault simulator and its invariant
//! checker ([`fault`]), the seeded PRNG ([`rng`]) and the swarm runner used by the fault
//! suite, the canaries and the fuzz targets.
//!
//! Layering: [`rng`], [`ledger`] and [`drive`] import nothing of this crate; [`model`]
//! imports [`ledger`]; [`fault`] imports [`ledger`] and [`rng`].

pub mod drive;
pub mod fault;
pub mod ledger;
pub mod model;
pub mod rng;
