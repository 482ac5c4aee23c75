//! Tensors on the wire in 16 bits ([`Encoding::Bf16`], [`Encoding::Fp16`]): the element
//! encodings and their conversions to and from `f32`, in plain bit arithmetic (no tables,
//! no allocation, no panics).
//!
//! - **Narrowing** (`f32` to 16 bits) rounds to nearest, ties to even. A finite `f32` beyond
//!   the target's largest finite value rounds to ±∞; NaN stays NaN (quiet, sign kept);
//!   `bf16` keeps `f32`'s exponent range, so only values within half an ulp of `f32::MAX`
//!   overflow; `fp16` overflows from 65,520 on and flushes magnitudes below 2^-25 to ±0.
//!   Senders refuse a tensor that narrows to anything not finite
//!   ([`Encoding::carries`]), so ±∞ and NaN never travel.
//! - **Widening** (16 bits to `f32`) is exact for every one of the 65,536 patterns of
//!   either encoding: every `bf16` and `fp16` value is an `f32` value.

/// The element encoding of the tensors of a session's core messages (its *wire*). The
/// header's element type tag (byte 4) names it; messages without a tensor carry it too.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash)]
pub enum Encoding {
    /// IEEE 754 binary32, four bytes (tag 4): the values as they are.
    #[default]
    F32,
    /// bfloat16, two bytes (tag `0x82`): `f32`'s sign, 8-bit exponent and top 7 mantissa
    /// bits.
    Bf16,
    /// IEEE 754 binary16, two bytes (tag 2): 5-bit exponent, 10-bit mantissa.
    Fp16,
}

impl Encoding {
    /// Every encoding.
    pub const ALL: [Self; 3] = [Self::F32, Self::Bf16, Self::Fp16];

    /// The header's element type tag.
    pub const fn tag(self) -> u8 {
        match self {
            Self::F32 => 4,
            Self::Bf16 => 0x82,
            Self::Fp16 => 2,
        }
    }

    /// The encoding a tag names, among these three.
    pub const fn from_tag(tag: u8) -> Option<Self> {
        match tag {
            4 => Some(Self::F32),
            0x82 => Some(Self::Bf16),
            2 => Some(Self::Fp16),
            _ => None,
        }
    }

    /// Bytes per element.
    pub const fn element_bytes(self) -> usize {
        match self {
            Self::F32 => 4,
            Self::Bf16 | Self::Fp16 => 2,
        }
    }

    /// Its name, as options spell it: `f32`, `bf16`, `fp16`.
    pub const fn name(self) -> &'static str {
        match self {
            Self::F32 => "f32",
            Self::Bf16 => "bf16",
            Self::Fp16 => "fp16",
        }
    }

    /// The encoding of a name ([`name`](Self::name)).
    pub fn from_name(name: &str) -> Option<Self> {
        Self::ALL.into_iter().find(|e| e.name() == name)
    }

    /// `x` as this encoding's element, rounded to nearest even, then back as `f32`.
    pub fn round_trip(self, x: f32) -> f32 {
        match self {
            Self::F32 => x,
            Self::Bf16 => f32_from_bf16(bf16_from_f32(x)),
            Self::Fp16 => f32_from_fp16(fp16_from_f32(x)),
        }
    }

    /// The 16-bit element of `x` (for [`F32`](Self::F32), as [`Bf16`](Self::Bf16)).
    #[cfg(test)]
    pub(super) fn narrow(self, x: f32) -> u16 {
        match self {
            Self::Fp16 => fp16_from_f32(x),
            Self::F32 | Self::Bf16 => bf16_from_f32(x),
        }
    }

    /// The `f32` of a 16-bit element (for [`F32`](Self::F32), as [`Bf16`](Self::Bf16)).
    #[cfg(test)]
    pub(super) fn widen(self, h: u16) -> f32 {
        match self {
            Self::Fp16 => f32_from_fp16(h),
            Self::F32 | Self::Bf16 => f32_from_bf16(h),
        }
    }

    /// Whether `x` stays finite in this encoding: the threshold form of
    /// `round_trip(x).is_finite()` (tests check the two agree). For `bf16` the bound is the
    /// midpoint between its largest finite value (an odd pattern) and ∞, which rounds up;
    /// for `fp16` likewise 65,520.
    pub(super) fn keeps(self, x: f32) -> bool {
        match self {
            Self::F32 => x.is_finite(),
            Self::Bf16 => x.to_bits() & 0x7FFF_FFFF < 0x7F7F_8000,
            Self::Fp16 => x.abs() < 65_520.0,
        }
    }

    /// The index of the first value that is not finite once in this encoding (NaN or ±∞
    /// in `f32`, or a finite value that rounds to ±∞), if any.
    pub fn first_not_carried(self, values: impl IntoIterator<Item = f32>) -> Option<usize> {
        let mut values = values.into_iter();
        // One loop per encoding, each with its test inlined.
        match self {
            Self::F32 => values.position(|x| !Self::F32.keeps(x)),
            Self::Bf16 => values.position(|x| !Self::Bf16.keeps(x)),
            Self::Fp16 => values.position(|x| !Self::Fp16.keeps(x)),
        }
    }

    /// Whether every value stays finite in this encoding.
    pub fn carries(self, values: &[f32]) -> bool {
        self.first_not_carried(values.iter().copied()).is_none()
    }
}

impl core::fmt::Display for Encoding {
    fn fmt(&self, f: &mut core::fmt::Formatter<'_>) -> core::fmt::Result {
        f.write_str(self.name())
    }
}

/// `x` as `bf16`, rounded to nearest, ties to even; NaN becomes a quiet NaN of the same
/// sign.
pub const fn bf16_from_f32(x: f32) -> u16 {
    let b = x.to_bits();
    if b & 0x7FFF_FFFF > 0x7F80_0000 {
        return ((b >> 16) as u16) | 0x0040;
    }
    // Adding 0x7FFF plus the kept part's lowest bit carries into the kept part exactly when
    // the dropped half is above one half, or one half with the kept part odd. The largest
    // non-NaN pattern is 0xFF80_0000, so the sum never wraps.
    let round = 0x7FFF + ((b >> 16) & 1);
    (b.wrapping_add(round) >> 16) as u16
}

/// The `f32` of a `bf16` (exact).
pub const fn f32_from_bf16(h: u16) -> f32 {
    f32::from_bits((h as u32) << 16)
}

/// `x` as `fp16`, rounded to nearest, ties to even: finite values from 65,520 on become
/// ±∞, magnitudes below 2^-25 (and exactly 2^-25) ±0; NaN becomes a quiet NaN of the same
/// sign.
pub const fn fp16_from_f32(x: f32) -> u16 {
    let b = x.to_bits();
    let sign = ((b >> 16) & 0x8000) as u16;
    let exp = (b >> 23) & 0xFF;
    let man = b & 0x007F_FFFF;
    if exp == 0xFF {
        let nan = if man != 0 { 0x0200 | (man >> 13) as u16 } else { 0 };
        return sign | 0x7C00 | nan;
    }
    // The fp16 biased exponent of a normal result: exp - 127 + 15.
    if exp >= 143 {
        return sign | 0x7C00;
    }
    if exp >= 113 {
        let h = ((exp - 112) << 10) | (man >> 13);
        let rem = man & 0x1FFF;
        // A carry out of the mantissa steps the exponent (up to ∞), as it must.
        let up = rem > 0x1000 || (rem == 0x1000 && h & 1 == 1);
        return sign | (h + up as u32) as u16;
    }
    // A subnormal result: the value in units of 2^-24 is M / 2^shift, M the 24-bit
    // significand; from a shift of 25 on it is below one half and rounds to zero.
    let shift = 126 - exp;
    if shift > 24 {
        return sign;
    }
    let m = man | 0x0080_0000;
    let q = m >> shift;
    let rem = m & ((1 << shift) - 1);
    let half = 1 << (shift - 1);
    let up = rem > half || (rem == half && q & 1 == 1);
    sign | (q + up as u32) as u16
}

/// The `f32` of an `fp16` (exact; NaN payloads kept).
pub const fn f32_from_fp16(h: u16) -> f32 {
    let sign = ((h & 0x8000) as u32) << 16;
    let exp = ((h >> 10) & 0x1F) as u32;
    let man = (h & 0x03FF) as u32;
    if exp == 0x1F {
        return f32::from_bits(sign | 0x7F80_0000 | (man << 13));
    }
    if exp != 0 {
        return f32::from_bits(sign | ((exp + 112) << 23) | (man << 13));
    }
    if man == 0 {
        return f32::from_bits(sign);
    }
    // A subnormal: man * 2^-24, normalised. With k leading zeros within the ten bits, the
    // leading one is bit 9 - k, worth 2^(9 - k - 24): biased f32 exponent 112 - k.
    let lz = man.leading_zeros() - 22;
    let e = 112 - lz;
    let frac = (man << (lz + 14)) & 0x007F_FFFF;
    f32::from_bits(sign | (e << 23) | frac)
}
