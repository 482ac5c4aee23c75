//! A seeded integer generator (SplitMix64): the same seed gives the same problem and the
//! same step times on every run, in QEMU or on a board. The core has no generator of its
//! own and the workspace's copies are std crates, so the firmware carries this one.

/// SplitMix64.
#[derive(Clone, Debug)]
pub struct Rng(u64);

impl Rng {
    /// A generator for stream `stream` of `seed`: distinct streams are independent.
    pub fn new(seed: u64, stream: u64) -> Self {
        let mut mixer = Self(seed ^ stream.wrapping_mul(0xD1B5_4A32_D192_ED03));
        Self(mixer.next_u64())
    }

    /// The next 64 random bits.
    pub fn next_u64(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9E37_79B9_7F4A_7C15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
        z ^ (z >> 31)
    }

    /// Uniform in `(0, 1]`, 24 bits (never 0, so its logarithm is finite).
    pub fn unit_open(&mut self) -> f32 {
        ((self.next_u64() >> 40) + 1) as f32 / (1u64 << 24) as f32
    }

    /// A standard exponential sample, `−ln U`.
    pub fn exponential(&mut self) -> f32 {
        -libm::logf(self.unit_open())
    }
}
