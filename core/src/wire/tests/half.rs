//! The 16-bit element conversions, over all 65,536 patterns of each encoding and against a
//! nearest-value reference for arbitrary `f32`s.

use super::*;

/// Whether `h` is a NaN pattern of `enc`.
fn is_nan(enc: Encoding, h: u16) -> bool {
    match enc {
        Encoding::Bf16 => h & 0x7FFF > 0x7F80,
        _ => h & 0x7FFF > 0x7C00,
    }
}

#[test]
fn every_pattern_widens_exactly_and_narrows_back_to_itself() {
    for enc in [Encoding::Bf16, Encoding::Fp16] {
        for h in 0..=u16::MAX {
            let x = enc.widen(h);
            if is_nan(enc, h) {
                assert!(x.is_nan(), "{enc} {h:#06x}");
                assert!(is_nan(enc, enc.narrow(x)), "{enc} {h:#06x}: NaN stays NaN");
                assert_eq!(enc.narrow(x) & 0x8000, h & 0x8000, "{enc} {h:#06x}: sign kept");
            } else {
                assert_eq!(enc.narrow(x), h, "{enc} {h:#06x} -> {x:e}");
            }
        }
    }
}

#[test]
fn widening_matches_the_formats_definitions() {
    // bf16: the upper half of the f32.
    for h in 0..=u16::MAX {
        assert_eq!(f32_from_bf16(h).to_bits(), u32::from(h) << 16);
    }
    // fp16: (-1)^s * 2^(e-15) * 1.m, subnormals 2^-14 * 0.m, e = 31 infinite or NaN; the
    // reference is computed in f64, where every such value is exact.
    for h in 0..=u16::MAX {
        let (s, e, m) = (h >> 15, i32::from((h >> 10) & 0x1F), f64::from(h & 0x3FF));
        let sign = if s == 1 { -1.0 } else { 1.0 };
        let want = match e {
            0 => sign * m * 2f64.powi(-24),
            31 if m == 0.0 => sign * f64::INFINITY,
            31 => f64::NAN,
            _ => sign * (1.0 + m / 1024.0) * 2f64.powi(e - 15),
        };
        let got = f64::from(f32_from_fp16(h));
        assert!(got == want || (got.is_nan() && want.is_nan()), "{h:#06x}: {got:e} != {want:e}");
        if want == 0.0 {
            assert_eq!(got.is_sign_negative(), s == 1, "{h:#06x}: signed zero");
        }
    }
}

#[test]
fn halfway_cases_round_to_even() {
    for enc in [Encoding::Bf16, Encoding::Fp16] {
        for h in 0..0x7FFFu16 {
            let (lo, hi) = (enc.widen(h), enc.widen(h + 1));
            if !lo.is_finite() || !hi.is_finite() {
                continue;
            }
            // The midpoint of two adjacent values of either encoding is an f32.
            let mid = ((f64::from(lo) + f64::from(hi)) / 2.0) as f32;
            assert_eq!(f64::from(mid), (f64::from(lo) + f64::from(hi)) / 2.0);
            let even = if h % 2 == 0 { h } else { h + 1 };
            assert_eq!(enc.narrow(mid), even, "{enc}: midpoint of {h:#06x} and the next");
            assert_eq!(enc.narrow(-mid), even | 0x8000, "{enc}: negative midpoint of {h:#06x}");
            // Just either side of the midpoint goes to the nearer value.
            assert_eq!(enc.narrow(f32::from_bits(mid.to_bits() - 1)), h, "{enc}: below the midpoint of {h:#06x}");
            assert_eq!(enc.narrow(f32::from_bits(mid.to_bits() + 1)), h + 1, "{enc}: above the midpoint of {h:#06x}");
        }
    }
}

#[test]
fn overflow_and_underflow_are_where_the_formats_put_them() {
    assert_eq!(fp16_from_f32(65_504.0), 0x7BFF);
    assert_eq!(fp16_from_f32(65_519.996), 0x7BFF);
    assert_eq!(fp16_from_f32(65_520.0), 0x7C00, "the midpoint to infinity rounds up (even)");
    assert_eq!(fp16_from_f32(-1.0e6), 0xFC00);
    assert_eq!(fp16_from_f32(f32::MAX), 0x7C00);
    assert_eq!(fp16_from_f32(2f32.powi(-24)), 0x0001);
    assert_eq!(fp16_from_f32(2f32.powi(-25)), 0x0000, "half the smallest subnormal rounds to even zero");
    assert_eq!(fp16_from_f32(-(2f32.powi(-25) * 1.5)), 0x8001);
    assert_eq!(fp16_from_f32(1.0e-30), 0x0000);
    assert_eq!(fp16_from_f32(f32::from_bits(1)), 0x0000);
    assert_eq!(bf16_from_f32(f32::MAX), 0x7F80, "within half an ulp of f32::MAX is beyond bf16");
    assert_eq!(bf16_from_f32(f32::from_bits(0x7F7F_7FFF)), 0x7F7F);
    assert_eq!(bf16_from_f32(f32::INFINITY), 0x7F80);
    assert_eq!(bf16_from_f32(f32::NEG_INFINITY), 0xFF80);
    assert_eq!(fp16_from_f32(f32::NEG_INFINITY), 0xFC00);
    assert_eq!(bf16_from_f32(f32::from_bits(1)), 0x0000, "f32 subnormals round within bf16's subnormals");
    assert_eq!(bf16_from_f32(-0.0), 0x8000);
    assert_eq!(fp16_from_f32(-0.0), 0x8000);
    assert!(is_nan(Encoding::Bf16, bf16_from_f32(f32::NAN)));
    assert!(is_nan(Encoding::Fp16, fp16_from_f32(f32::NAN)));
    // A signalling NaN whose payload lies in the dropped bits stays NaN (never ∞).
    assert!(is_nan(Encoding::Bf16, bf16_from_f32(f32::from_bits(0x7F80_0001))));
    assert!(is_nan(Encoding::Fp16, fp16_from_f32(f32::from_bits(0x7F80_0001))));
}

#[test]
fn the_range_test_agrees_with_rounding_around_each_bound() {
    // Every f32 from well below to just past each encoding's overflow bound, both signs.
    for (enc, lo, hi) in [(Encoding::Bf16, 0x7F7E_0000u32, 0x7F80_0100), (Encoding::Fp16, 0x477E_0000, 0x4781_0000)] {
        for bits in lo..=hi {
            for x in [f32::from_bits(bits), -f32::from_bits(bits)] {
                assert_eq!(enc.first_not_carried([x]).is_none(), enc.round_trip(x).is_finite(), "{enc} {x:e}");
            }
        }
    }
}

#[test]
fn names_and_tags_are_one_to_one() {
    for enc in Encoding::ALL {
        assert_eq!(Encoding::from_name(enc.name()), Some(enc));
        assert_eq!(Encoding::from_tag(enc.tag()), Some(enc));
    }
    assert_eq!(Encoding::from_name("f16"), None);
    assert_eq!(Encoding::from_tag(8), None, "f64 is a scalar type, not a wire encoding");
    assert_eq!(Encoding::default(), Encoding::F32);
}

proptest::proptest! {
    #![proptest_config(proptest::prelude::ProptestConfig::with_cases(4096))]

    /// Narrowing gives the nearest value (ties to the even pattern), and a value stays
    /// finite exactly when the threshold test says it does.
    #[test]
    fn narrowing_is_nearest_even(bits in proptest::num::u32::ANY) {
        let x = f32::from_bits(bits);
        for enc in [Encoding::Bf16, Encoding::Fp16] {
            let h = enc.narrow(x);
            proptest::prop_assert_eq!(enc.round_trip(x).is_finite(), enc.first_not_carried([x]).is_none());
            if x.is_nan() {
                proptest::prop_assert!(is_nan(enc, h));
                continue;
            }
            let (xd, got) = (f64::from(x), f64::from(enc.widen(h)));
            if got.is_infinite() {
                // Only beyond the largest finite value plus half an ulp.
                let max = f64::from(enc.widen(if enc == Encoding::Bf16 { 0x7F7F } else { 0x7BFF }));
                let next = if enc == Encoding::Bf16 { 2f64.powi(128) } else { 65_536.0 };
                proptest::prop_assert!(x.is_infinite() || xd.abs() >= (max + next) / 2.0);
                continue;
            }
            let mag = h & 0x7FFF;
            for n in [mag.wrapping_sub(1), mag + 1] {
                let other = enc.widen(n | (h & 0x8000));
                if is_nan(enc, n) || n > 0x7FFF { continue; }
                let (d_got, d_other) = ((got - xd).abs(), (f64::from(other) - xd).abs());
                proptest::prop_assert!(
                    d_got < d_other || (d_got == d_other && mag % 2 == 0) || other.is_infinite(),
                    "{} {:e}: {:#06x} is not nearest even", enc, x, h
                );
            }
        }
    }
}
