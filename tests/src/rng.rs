//! The seeded PRNG of the fault suite: the core's SplitMix64 ([`syncopate::rng::Rng`]),
//! stable across versions and platforms, so a seed always replays the same run.

pub use syncopate::rng::Rng;
