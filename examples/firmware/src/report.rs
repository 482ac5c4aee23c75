//! Numbers for the semihosting report, formatted with integer arithmetic so the image
//! carries no float-formatting code.

use core::fmt;
use syncopate::Duration;

/// A float in scientific notation with three significant digits: `2.91e0`, `-1.05e-4`.
#[derive(Clone, Copy, Debug)]
pub struct Sci(pub f32);

impl fmt::Display for Sci {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let x = self.0;
        if x.is_nan() {
            return f.write_str("NaN");
        }
        if x.is_infinite() {
            return f.write_str(if x > 0.0 { "inf" } else { "-inf" });
        }
        if x == 0.0 {
            return f.write_str("0.00e0");
        }
        let sign = if x < 0.0 { "-" } else { "" };
        let (mut mantissa, mut exponent) = (f64::from(x).abs(), 0i32);
        while mantissa >= 10.0 {
            mantissa /= 10.0;
            exponent += 1;
        }
        while mantissa < 1.0 {
            mantissa *= 10.0;
            exponent -= 1;
        }
        let mut digits = libm::round(mantissa * 100.0) as u32;
        if digits >= 1000 {
            digits /= 10;
            exponent += 1;
        }
        write!(f, "{sign}{}.{:02}e{exponent}", digits / 100, digits % 100)
    }
}

/// A duration in whole milliseconds.
#[derive(Clone, Copy, Debug)]
pub struct Millis(pub Duration);

impl fmt::Display for Millis {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{} ms", self.0.as_nanos() / 1_000_000)
    }
}

/// `numerator / denominator` with one decimal (`0.0` for a zero denominator).
#[derive(Clone, Copy, Debug)]
pub struct Ratio(pub u64, pub u64);

impl fmt::Display for Ratio {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let tenths = (self.0 * 10 + self.1 / 2).checked_div(self.1).unwrap_or(0);
        write!(f, "{}.{}", tenths / 10, tenths % 10)
    }
}
