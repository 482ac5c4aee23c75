//! Sweeps that extend past their edge: when the best value of a knob is the largest (or
//! smallest) of its sweep, the next value beyond it is tried, until the best is inside the
//! sweep or the knob's range ends (backup `b` up to `n − 1`, staleness up to
//! [`MAX_STALENESS`] (BAP's own bound below that), grouped `G` up to `n/2`, time knobs from [`MIN_TIME_MULTIPLE`] to
//! [`MAX_TIME_MULTIPLE`] median steps).
//!
//! A knob's sweep is the candidates of one protocol whose other knobs are equal; its best is
//! the candidate with the lowest mean time among those that reached the target on every seed
//! pair. Backup's next value halves the gradients waited for (`n − b`); staleness and `G`
//! double (or halve, down to 1 and 2); time knobs double or halve.

use super::candidates::round_ms;
use super::{Candidate, Measured};
use crate::scenario::ProtocolKind;

/// The largest staleness an extended sweep tries.
pub const MAX_STALENESS: u64 = 64;
/// The largest time knob an extended sweep tries, in median steps.
pub const MAX_TIME_MULTIPLE: f64 = 16.0;
/// The smallest time knob an extended sweep tries, in median steps.
pub const MIN_TIME_MULTIPLE: f64 = 0.25;

/// A knob that a sweep varies.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Knob {
    /// Backup workers `b`.
    Backup,
    /// SSP's or BAP's staleness `s`.
    Staleness,
    /// BAP's iteration limit or WBSP's round deadline, in median steps.
    Time,
    /// The grouped protocol's `G`.
    Groups,
}

impl Knob {
    /// The knobs of `c`'s protocol.
    fn of(c: &Candidate) -> &'static [Self] {
        match c.spec.name {
            ProtocolKind::Backup => &[Self::Backup],
            ProtocolKind::Ssp => &[Self::Staleness],
            ProtocolKind::Bap => &[Self::Staleness, Self::Time],
            ProtocolKind::Wbsp | ProtocolKind::WbspOverlap => &[Self::Time],
            ProtocolKind::Grouped => &[Self::Groups],
            ProtocolKind::Bsp | ProtocolKind::Asp | ProtocolKind::Dbw => &[],
        }
    }

    fn name(self) -> &'static str {
        match self {
            Self::Backup => "b",
            Self::Staleness => "s",
            Self::Time => "time knob (median steps)",
            Self::Groups => "G",
        }
    }

    fn get(self, c: &Candidate) -> Option<f64> {
        match self {
            Self::Backup => c.spec.backup_workers.map(f64::from),
            Self::Staleness => c.spec.staleness.map(|s| s as f64),
            Self::Time => c.median_multiple,
            Self::Groups => c.spec.groups.map(f64::from),
        }
    }

    fn set(self, c: &Candidate, v: f64, median_s: f64) -> Candidate {
        let mut out = c.clone();
        match self {
            Self::Backup => out.spec.backup_workers = Some(v as u32),
            Self::Staleness => out.spec.staleness = Some(v as u64),
            Self::Time => {
                out.median_multiple = Some(v);
                let ms = Some(round_ms(v * median_s * 1000.0));
                if c.spec.name == ProtocolKind::Bap {
                    out.spec.iteration_timeout_ms = ms;
                } else {
                    out.spec.round_deadline_ms = ms;
                }
            }
            Self::Groups => out.spec.groups = Some(v as u32),
        }
        out
    }

    /// The value past `v` upwards (`up`) or downwards, inside the knob's range for `n` workers.
    fn beyond(self, v: f64, up: bool, n: u32) -> Option<f64> {
        let next = match (self, up) {
            (Self::Backup, true) => {
                let waited = (f64::from(n) - v) / 2.0;
                (waited >= 1.0).then(|| f64::from(n) - waited.floor())
            }
            (Self::Backup, false) => None,
            (Self::Staleness, true) => Some(v * 2.0).filter(|&s| s <= MAX_STALENESS as f64),
            (Self::Staleness, false) => Some((v / 2.0).floor()).filter(|&s| s >= 1.0),
            (Self::Groups, true) => Some(v * 2.0).filter(|&g| g <= f64::from(n / 2)),
            (Self::Groups, false) => Some((v / 2.0).floor()).filter(|&g| g >= 2.0),
            (Self::Time, true) => Some(v * 2.0).filter(|&f| f <= MAX_TIME_MULTIPLE),
            (Self::Time, false) => Some(v / 2.0).filter(|&f| f >= MIN_TIME_MULTIPLE),
        };
        next.filter(|&x| x != v)
    }
}

/// Where a knob's best value sits in its sweep.
struct Edge {
    knob: Knob,
    best: usize,
    value: f64,
    /// `Some(true)`: the largest of at least two values; `Some(false)`: the smallest.
    up: Option<bool>,
}

/// Every knob of every protocol's best candidate, with where its value sits.
fn edges(rows: &[Measured], candidates: &[Candidate]) -> Vec<Edge> {
    let complete = |i: usize| rows.get(i).is_some_and(|r| r.reached == r.repeats && r.repeats > 0);
    let mut out = Vec::new();
    let mut protocols: Vec<ProtocolKind> = Vec::new();
    for c in candidates {
        if !protocols.contains(&c.spec.name) {
            protocols.push(c.spec.name);
        }
    }
    for p in protocols {
        let best = (0..candidates.len())
            .filter(|&i| candidates[i].spec.name == p && complete(i))
            .min_by(|&a, &b| rows[a].time.mean.total_cmp(&rows[b].time.mean));
        let Some(best) = best else { continue };
        let c = &candidates[best];
        for &knob in Knob::of(c) {
            let Some(value) = knob.get(c) else { continue };
            let others_equal = |d: &Candidate| {
                d.spec.name == p && Knob::of(c).iter().filter(|&&k| k != knob).all(|&k| k.get(d) == k.get(c))
            };
            let values: Vec<f64> = candidates.iter().filter(|d| others_equal(d)).filter_map(|d| knob.get(d)).collect();
            let (lo, hi) = values.iter().fold((f64::INFINITY, f64::NEG_INFINITY), |(l, h), &v| (l.min(v), h.max(v)));
            let up = if values.len() < 2 || lo == hi {
                None
            } else if value == hi {
                Some(true)
            } else if value == lo {
                Some(false)
            } else {
                None
            };
            out.push(Edge { knob, best, value, up });
        }
    }
    out
}

fn show(knob: Knob, v: f64) -> String {
    if knob == Knob::Time { format!("{v}x") } else { format!("{v}") }
}

/// The candidates one step past the edge of every knob whose best value is at its sweep's
/// edge, each with a note saying why (`workers`, `median_s`: the trace's).
pub fn past_edges(
    rows: &[Measured],
    candidates: &[Candidate],
    workers: u32,
    median_s: f64,
) -> Vec<(Candidate, String)> {
    let mut out: Vec<(Candidate, String)> = Vec::new();
    for e in edges(rows, candidates) {
        let Some(up) = e.up else { continue };
        let Some(next) = e.knob.beyond(e.value, up, workers) else { continue };
        let c = e.knob.set(&candidates[e.best], next, median_s);
        let known = candidates.iter().chain(out.iter().map(|(c, _)| c)).any(|d| d.spec == c.spec);
        let valid = match c.spec.config(workers, 0.5) {
            Ok(syncopate::ProtocolConfig::Bap(b)) => b.s_bap().is_ok(),
            Ok(_) => true,
            Err(_) => false,
        };
        if known || !valid {
            continue;
        }
        let note = format!(
            "{} {}: the best value, {}, was the {} of its sweep: tried {}",
            candidates[e.best].spec.name.as_str(),
            e.knob.name(),
            show(e.knob, e.value),
            if up { "largest" } else { "smallest" },
            show(e.knob, next)
        );
        out.push((c, note));
    }
    out
}

/// For each knob that was extended (a candidate of its protocol is an extension): where its
/// best value ended, inside the sweep or at the end of the knob's range.
pub fn summary(rows: &[Measured], candidates: &[Candidate], workers: u32) -> Vec<String> {
    let mut out = Vec::new();
    for e in edges(rows, candidates) {
        let p = candidates[e.best].spec.name;
        let extended =
            candidates.iter().zip(rows).any(|(c, r)| r.extension && c.spec.name == p && Knob::of(c).contains(&e.knob));
        if !extended {
            continue;
        }
        let at = show(e.knob, e.value);
        let line = match e.up {
            None => format!("{} {}: the best value, {at}, is inside the extended sweep", p.as_str(), e.knob.name()),
            Some(up) if e.knob.beyond(e.value, up, workers).is_none() => {
                format!("{} {}: the best value, {at}, is at the end of the knob's range", p.as_str(), e.knob.name())
            }
            Some(_) => format!(
                "{} {}: the best value, {at}, is still at the edge (the extension stopped)",
                p.as_str(),
                e.knob.name()
            ),
        };
        out.push(line);
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::advise::candidates;

    fn measured(c: &Candidate, mean: f64) -> Measured {
        Measured {
            label: c.spec.label(),
            protocol: c.spec.name.as_str().to_string(),
            median_multiple: c.median_multiple,
            ..crate::advise::race::test_row(&[mean, mean])
        }
    }

    /// Each candidate's mean from `time(candidate)`.
    fn rows(cs: &[Candidate], time: &dyn Fn(&Candidate) -> f64) -> Vec<Measured> {
        cs.iter().map(|c| measured(c, time(c))).collect()
    }

    #[test]
    fn knobs_at_their_edge_extend_until_the_best_is_inside_or_the_range_ends() {
        let n = 16;
        let mut cs = candidates(n, 0.01);
        // Backup: faster the more workers it leaves out (best at b = 15); SSP best at s = 8
        // then 16 (inside once 32 is tried); BAP's time knob best at its smallest.
        let time = |c: &Candidate| match c.spec.name {
            ProtocolKind::Backup => 100.0 - c.spec.backup_workers.unwrap_or(0) as f64,
            ProtocolKind::Ssp => (c.spec.staleness.unwrap_or(0) as f64 - 16.0).abs() + 50.0,
            ProtocolKind::Bap => 60.0 + c.median_multiple.unwrap_or(0.0) + c.spec.staleness.unwrap_or(0) as f64,
            ProtocolKind::Wbsp => 200.0 - c.median_multiple.unwrap_or(0.0),
            _ => 200.0,
        };
        let mut tried = Vec::new();
        loop {
            let r = rows(&cs, &time);
            let next = past_edges(&r, &cs, n, 0.01);
            if next.is_empty() {
                break;
            }
            for (c, note) in next {
                tried.push(note);
                cs.push(c);
            }
        }
        let b: Vec<u32> = cs.iter().filter_map(|c| c.spec.backup_workers).collect();
        assert_eq!(b, [1, 2, 4, 8, 12, 14, 15], "{tried:?}");
        let s: Vec<u64> =
            cs.iter().filter(|c| c.spec.name == ProtocolKind::Ssp).filter_map(|c| c.spec.staleness).collect();
        assert_eq!(s, [1, 2, 4, 8, 16, 32]);
        let f: Vec<f64> =
            cs.iter().filter(|c| c.spec.name == ProtocolKind::Bap).filter_map(|c| c.median_multiple).collect();
        assert_eq!(f, [1.5, 3.0, 1.5, 3.0, 0.75, 0.375]);
        assert!(cs.iter().filter(|c| c.spec.name == ProtocolKind::Bap).all(|c| c.spec.config(n, 0.5).is_ok()));
        // BAP's staleness stops at its bound: best at the largest, 3, then 6 and 12, not 24.
        let mut bap: Vec<Candidate> = cs.iter().filter(|c| c.spec.name == ProtocolKind::Bap).take(4).cloned().collect();
        let slower_when_small = |c: &Candidate| 100.0 - c.spec.staleness.unwrap_or(0) as f64;
        while let Some((c, _)) = past_edges(&rows(&bap, &slower_when_small), &bap, n, 0.01).into_iter().next() {
            bap.push(c);
        }
        let s: Vec<u64> = bap.iter().filter_map(|c| c.spec.staleness).collect();
        assert_eq!(s, [1, 1, 3, 3, 6, 12]);
        assert!(
            tried.iter().any(|t| t == "backup b: the best value, 8, was the largest of its sweep: tried 12"),
            "{tried:?}"
        );
        let f: Vec<f64> =
            cs.iter().filter(|c| c.spec.name == ProtocolKind::Wbsp).filter_map(|c| c.median_multiple).collect();
        assert_eq!(f, [2.0, 4.0, 8.0, 16.0]);
        // Grouped (every value equally slow): its best is the first, G = 2, the smallest allowed.
        assert_eq!(cs.iter().filter(|c| c.spec.name == ProtocolKind::Grouped).count(), 2);
        let mut r = rows(&cs, &time);
        for (row, c) in r.iter_mut().zip(&cs) {
            row.extension = !candidates(n, 0.01).contains(c);
        }
        let said = summary(&r, &cs, n);
        assert!(
            said.contains(&"backup b: the best value, 15, is at the end of the knob's range".to_string()),
            "{said:?}"
        );
        assert!(said.contains(&"ssp s: the best value, 16, is inside the extended sweep".to_string()), "{said:?}");
        assert!(said.iter().any(|l| l.starts_with("bap time knob (median steps): the best value, 0.375x")), "{said:?}");
    }
}
