//! A knob in a scenario file that may name one value or several: `3`, `[0, 1, 3, 8]`,
//! `"0..4"` (0, 1, 2, 3) or `"0..=15"` (0 to 15).

use serde::Deserialize;

/// One value or a list of values to sweep.
#[derive(Clone, Debug, PartialEq)]
pub struct Sweep<T>(pub Vec<T>);

#[derive(Deserialize)]
#[serde(untagged)]
enum Raw<T> {
    One(T),
    Many(Vec<T>),
    Range(String),
}

/// Values that can come from a `"a..b"` range.
pub trait RangeValue: Sized {
    /// The values of `a..b` (or `a..=b` when `inclusive`), or why not.
    fn range(a: &str, b: &str, inclusive: bool) -> Result<Vec<Self>, String>;
}

impl RangeValue for u64 {
    fn range(a: &str, b: &str, inclusive: bool) -> Result<Vec<Self>, String> {
        let parse = |s: &str| s.trim().parse::<Self>().map_err(|_| format!("'{s}' is not a whole number"));
        let (lo, hi) = (parse(a)?, parse(b)?);
        let hi = if inclusive { hi.checked_add(1).ok_or("range end too large")? } else { hi };
        if lo >= hi || hi - lo > 10_000 {
            return Err(format!("range {a}..{b} is empty or longer than 10000 values"));
        }
        Ok((lo..hi).collect())
    }
}

impl RangeValue for u32 {
    fn range(a: &str, b: &str, inclusive: bool) -> Result<Vec<Self>, String> {
        u64::range(a, b, inclusive)?
            .into_iter()
            .map(|v| Self::try_from(v).map_err(|_| format!("{v} is too large")))
            .collect()
    }
}

impl RangeValue for f64 {
    fn range(_: &str, _: &str, _: bool) -> Result<Vec<Self>, String> {
        Err("ranges are for whole numbers; list the values instead".into())
    }
}

impl<'de, T: Deserialize<'de> + RangeValue> Deserialize<'de> for Sweep<T> {
    fn deserialize<D: serde::Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        let values = match Raw::<T>::deserialize(d)? {
            Raw::One(v) => vec![v],
            Raw::Many(v) => v,
            Raw::Range(s) => {
                let (a, b, inclusive) = match s.split_once("..=") {
                    Some((a, b)) => (a, b, true),
                    None => match s.split_once("..") {
                        Some((a, b)) => (a, b, false),
                        None => {
                            return Err(serde::de::Error::custom(format!(
                                "'{s}' is not a value, a list or a range like \"0..4\""
                            )));
                        }
                    },
                };
                T::range(a, b, inclusive).map_err(serde::de::Error::custom)?
            }
        };
        if values.is_empty() {
            return Err(serde::de::Error::custom("an empty list sweeps nothing"));
        }
        Ok(Self(values))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[derive(Deserialize)]
    struct T {
        x: Sweep<u64>,
    }

    fn parse(s: &str) -> Result<Vec<u64>, String> {
        toml::from_str::<T>(s).map(|t| t.x.0).map_err(|e| e.message().to_string())
    }

    #[test]
    fn one_list_and_ranges() {
        assert_eq!(parse("x = 3").unwrap(), [3]);
        assert_eq!(parse("x = [0, 1, 3, 8]").unwrap(), [0, 1, 3, 8]);
        assert_eq!(parse("x = \"0..4\"").unwrap(), [0, 1, 2, 3]);
        assert_eq!(parse("x = \"0..=15\"").unwrap().len(), 16);
        assert!(parse("x = \"4..1\"").is_err());
        assert!(parse("x = []").is_err());
        assert!(parse("x = \"abc\"").is_err());
    }
}
