//! `--straggler SPEC`: which workers are slow and how, as simulator compute models.
//!
//! `SPEC` is a comma-separated list of `WHO:MODEL` items; later items override earlier ones.
//!
//! | `WHO` | workers |
//! |---|---|
//! | `all`, `odd`, `even` | every, odd-index, even-index worker |
//! | `3`, `2-5` | one id, an inclusive range |
//!
//! | `MODEL` | step time |
//! |---|---|
//! | `none` | the base step time |
//! | `slow=F` | `F` times the base (a persistently slower machine) |
//! | `delay=MS` | the base plus `MS` milliseconds (WBSP's H1/H2/H3 setting) |
//! | `exp=SHIFT/RATE` | `base · (SHIFT + Exp(RATE))` |
//! | `pareto=SCALE/SHAPE` | `base · Pareto(SCALE, SHAPE)` (heavy tail) |
//! | `burst=P/F/LEN` | bursts of `LEN` steps at `F` times the base, starting with probability `P` per step |
//!
//! Example: `--straggler 0:slow=4` makes worker 0 four times slower;
//! `--straggler all:exp=1/1,odd:delay=20`.

use crate::sim::ComputeModel;
use syncopate::Duration;

fn number(what: &str, text: &str) -> Result<f64, String> {
    match text.trim().parse::<f64>() {
        Ok(x) if x.is_finite() && x >= 0.0 => Ok(x),
        _ => Err(format!("{what} '{text}' is not a non-negative number")),
    }
}

fn parts<const K: usize>(what: &str, text: &str) -> Result<[f64; K], String> {
    let fields: Vec<&str> = text.split('/').collect();
    if fields.len() != K {
        return Err(format!("{what} needs {K} values separated by '/', got '{text}'"));
    }
    let mut out = [0.0; K];
    for (o, f) in out.iter_mut().zip(fields) {
        *o = number(what, f)?;
    }
    Ok(out)
}

fn model(text: &str) -> Result<ComputeModel, String> {
    let (kind, args) = text.split_once('=').unwrap_or((text, ""));
    Ok(match kind {
        "none" => ComputeModel::None,
        "slow" => match args.trim().parse::<f64>() {
            Ok(f) if f.is_finite() && f > 0.0 => ComputeModel::Slowdown(f),
            _ => return Err(format!("slow factor '{args}' is not a positive number")),
        },
        "delay" => ComputeModel::ExtraDelay(Duration::from_secs_f64(number("delay", args)? / 1000.0)),
        "exp" => {
            let [shift, rate] = parts("exp", args)?;
            if rate <= 0.0 {
                return Err("exp rate must be positive".into());
            }
            ComputeModel::ShiftedExp { shift, rate }
        }
        "pareto" => {
            let [scale, shape] = parts("pareto", args)?;
            if scale <= 0.0 || shape <= 0.0 {
                return Err("pareto scale and shape must be positive".into());
            }
            ComputeModel::Pareto { scale, shape }
        }
        "burst" => {
            let [probability, factor, length] = parts("burst", args)?;
            if probability > 1.0 || length.fract() != 0.0 || length > f64::from(u32::MAX) {
                return Err("burst needs P in 0..1, a factor and a whole number of steps".into());
            }
            ComputeModel::Bursts { probability, factor, length: length as u32 }
        }
        other => return Err(format!("unknown straggler model '{other}' (none, slow, delay, exp, pareto, burst)")),
    })
}

fn who(text: &str, n: u32) -> Result<Vec<u32>, String> {
    let ids: Vec<u32> = match text {
        "all" => (0..n).collect(),
        "odd" => (0..n).filter(|i| i % 2 == 1).collect(),
        "even" => (0..n).filter(|i| i % 2 == 0).collect(),
        _ => {
            let id = |s: &str| s.trim().parse::<u32>().map_err(|_| format!("'{s}' is not a worker id"));
            let (lo, hi) = match text.split_once('-') {
                Some((a, b)) => (id(a)?, id(b)?),
                None => (id(text)?, id(text)?),
            };
            if lo > hi {
                return Err(format!("workers '{text}' is a reversed range: write {hi}-{lo}"));
            }
            if hi >= n {
                return Err(format!("workers '{text}' are outside 0..{n}"));
            }
            (lo..=hi).collect()
        }
    };
    Ok(ids)
}

/// Parses `spec` for `n` workers into one compute model per worker.
pub fn parse_stragglers(spec: &str, n: u32) -> Result<Vec<ComputeModel>, String> {
    let mut models = vec![ComputeModel::None; n as usize];
    for item in spec.split(',').map(str::trim).filter(|s| !s.is_empty()) {
        let err = |e: String| format!("invalid value '{spec}' for '--straggler': {e}");
        let (w, m) = item.split_once(':').ok_or_else(|| err(format!("'{item}' is not WHO:MODEL")))?;
        let m = model(m).map_err(err)?;
        for i in who(w, n).map_err(err)? {
            if let Some(slot) = models.get_mut(i as usize) {
                *slot = m.clone();
            }
        }
    }
    Ok(models)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_every_model_and_selector() {
        let m = parse_stragglers("all:exp=1/2,odd:delay=20,0:slow=4,2-3:pareto=1/3,5:burst=0.1/5/10", 6).unwrap();
        assert_eq!(m[0], ComputeModel::Slowdown(4.0));
        assert_eq!(m[1], ComputeModel::ExtraDelay(Duration::from_millis(20)));
        assert_eq!(m[2], ComputeModel::Pareto { scale: 1.0, shape: 3.0 });
        assert_eq!(m[4], ComputeModel::ShiftedExp { shift: 1.0, rate: 2.0 });
        assert_eq!(m[5], ComputeModel::Bursts { probability: 0.1, factor: 5.0, length: 10 });
        assert_eq!(parse_stragglers("", 2).unwrap(), vec![ComputeModel::None; 2]);
    }

    #[test]
    fn errors_name_the_problem() {
        for (spec, needle) in [
            ("9:slow=2", "outside 0..4"),
            ("3-1:slow=2", "workers '3-1' is a reversed range: write 1-3"),
            ("x:slow=2", "not a worker id"),
            ("0:fast=2", "unknown straggler model 'fast'"),
            ("0:slow=abc", "slow factor 'abc' is not a positive number"),
            ("0:slow=-1", "slow factor '-1' is not a positive number"),
            ("0:exp=1/-1", "not a non-negative number"),
            ("0:exp=1", "needs 2 values"),
            ("0slow", "not WHO:MODEL"),
            ("0:slow=0", "slow factor '0' is not a positive number"),
        ] {
            let e = parse_stragglers(spec, 4).unwrap_err();
            assert!(e.contains(needle), "{spec}: {e}");
            assert!(e.starts_with("invalid value"), "{e}");
            assert!(!e.contains('\n'));
        }
    }
}
