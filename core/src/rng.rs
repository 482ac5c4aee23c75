//! A small seeded PRNG (SplitMix64) and the distributions simulators, workloads, tests and
//! firmware draw from (no_std; the core itself never draws: randomness is an input). Deterministic across platforms and crate versions: the same seed always gives the
//! same stream, which is what makes a simulation replayable bit for bit.

/// SplitMix64: fast, 64-bit state, good enough statistical quality for sampling.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Rng {
    state: u64,
}

impl Rng {
    /// A generator seeded with `seed`.
    pub fn new(seed: u64) -> Self {
        Self { state: seed }
    }

    /// A generator for sub-stream `stream` of `seed` (independent streams per worker,
    /// per subsystem).
    pub fn derive(seed: u64, stream: u64) -> Self {
        let mut r = Self::new(seed ^ stream.wrapping_mul(0xA076_1D64_78BD_642F));
        r.next_u64();
        r
    }

    /// The next 64 random bits.
    pub fn next_u64(&mut self) -> u64 {
        self.state = self.state.wrapping_add(0x9E37_79B9_7F4A_7C15);
        let mut z = self.state;
        z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
        z ^ (z >> 31)
    }

    /// Uniform in `[0, 1)`.
    pub fn next_f64(&mut self) -> f64 {
        (self.next_u64() >> 11) as f64 * (1.0 / (1u64 << 53) as f64)
    }

    /// Uniform in `(0, 1]` (safe to take the logarithm of).
    pub fn next_f64_open(&mut self) -> f64 {
        1.0 - self.next_f64()
    }

    /// Uniform integer in `0..n` (`n > 0`; returns 0 for `n == 0`).
    pub fn below(&mut self, n: u64) -> u64 {
        if n == 0 {
            return 0;
        }
        // Lemire's multiply-shift; the bias is below 2^-64 * n, irrelevant here.
        ((u128::from(self.next_u64()) * u128::from(n)) >> 64) as u64
    }

    /// Standard normal (Box–Muller).
    pub fn normal(&mut self) -> f64 {
        let u1 = self.next_f64_open();
        let u2 = self.next_f64();
        libm::sqrt(-2.0 * libm::log(u1)) * libm::cos(core::f64::consts::TAU * u2)
    }

    /// Exponential with rate `rate` (mean `1/rate`).
    pub fn exponential(&mut self, rate: f64) -> f64 {
        -libm::log(self.next_f64_open()) / rate
    }

    /// Pareto with scale `x_m` and shape `alpha` (heavy tail; mean `alpha x_m / (alpha-1)`).
    pub fn pareto(&mut self, scale: f64, shape: f64) -> f64 {
        scale / libm::pow(self.next_f64_open(), 1.0 / shape)
    }

    /// Shuffles `items` in place (Fisher–Yates).
    pub fn shuffle<T>(&mut self, items: &mut [T]) {
        for i in (1..items.len()).rev() {
            let j = self.below(i as u64 + 1) as usize;
            items.swap(i, j);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn same_seed_same_stream() {
        let (mut a, mut b) = (Rng::new(7), Rng::new(7));
        for _ in 0..100 {
            assert_eq!(a.next_u64(), b.next_u64());
        }
        assert_ne!(Rng::derive(7, 1).next_u64(), Rng::derive(7, 2).next_u64());
    }

    #[test]
    fn distributions_have_the_right_means() {
        use std::vec::Vec;
        let mut r = Rng::new(1);
        let n = 200_000;
        let mean = |f: &mut dyn FnMut() -> f64| (0..n).map(|_| f()).sum::<f64>() / n as f64;
        assert!((mean(&mut || r.next_f64()) - 0.5).abs() < 0.01);
        assert!((mean(&mut || r.exponential(4.0)) - 0.25).abs() < 0.01);
        assert!((mean(&mut || r.pareto(1.0, 3.0)) - 1.5).abs() < 0.05);
        assert!(mean(&mut || r.normal()).abs() < 0.01);
        assert!((0..1000).all(|_| r.below(10) < 10));
        let mut v: Vec<u32> = (0..50).collect();
        r.shuffle(&mut v);
        v.sort_unstable();
        assert_eq!(v, (0..50).collect::<Vec<_>>());
    }
}
