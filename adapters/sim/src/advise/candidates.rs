//! The built-in sweep: every protocol with the knobs that matter, scaled to the trace.

use crate::scenario::{ProtocolKind, ProtocolSpec};

/// The simplicity rank of a protocol, for picking among tied candidates: fewer moving
/// parts first (BSP, static backup, DBW, SSP, ASP, BAP, WBSP, grouped).
pub fn simplicity(name: ProtocolKind) -> u32 {
    match name {
        ProtocolKind::Bsp => 0,
        ProtocolKind::Backup => 1,
        ProtocolKind::Dbw => 2,
        ProtocolKind::Ssp => 3,
        ProtocolKind::Asp => 4,
        ProtocolKind::Bap => 5,
        ProtocolKind::Wbsp | ProtocolKind::WbspOverlap => 6,
        ProtocolKind::Grouped => 7,
    }
}

/// One candidate: a protocol with its knobs, and how a time knob relates to the trace.
#[derive(Clone, Debug, PartialEq)]
pub struct Candidate {
    /// The protocol and knobs.
    pub spec: ProtocolSpec,
    /// A time knob as a multiple of the median step (`None`: no time knob).
    pub median_multiple: Option<f64>,
}

/// Milliseconds rounded to three significant digits.
pub(super) fn round_ms(ms: f64) -> f64 {
    if ms <= 0.0 {
        return ms;
    }
    let scale = 10f64.powi(2 - ms.log10().floor() as i32);
    (ms * scale).round() / scale
}

/// The sweep for `workers` workers and a median step of `median_s`: BSP; ASP; SSP with
/// `s` in 1, 2, 4, 8; BAP with `s` in 1, 3 and an iteration limit of 1.5 or 3 median steps;
/// backup workers `b` in 1, 2, n/4, n/2 (below n); DBW; WBSP with a round deadline of 2 or 4
/// median steps; grouped with `G` in 2, 4, n/4 (at most n/2).
pub fn candidates(workers: u32, median_s: f64) -> Vec<Candidate> {
    let n = workers;
    let mut out = Vec::new();
    let plain = |name| Candidate { spec: ProtocolSpec::new(name), median_multiple: None };
    out.push(plain(ProtocolKind::Bsp));
    let mut bs: Vec<u32> = [1, 2, n / 4, n / 2].into_iter().filter(|&b| b >= 1 && b < n).collect();
    bs.sort_unstable();
    bs.dedup();
    for b in bs {
        let mut c = plain(ProtocolKind::Backup);
        c.spec.backup_workers = Some(b);
        out.push(c);
    }
    if n >= 2 {
        out.push(plain(ProtocolKind::Dbw));
    }
    for s in [1, 2, 4, 8] {
        let mut c = plain(ProtocolKind::Ssp);
        c.spec.staleness = Some(s);
        out.push(c);
    }
    out.push(plain(ProtocolKind::Asp));
    for s in [1, 3] {
        for f in [1.5, 3.0] {
            let mut c = plain(ProtocolKind::Bap);
            c.spec.staleness = Some(s);
            c.spec.iteration_timeout_ms = Some(round_ms(f * median_s * 1000.0));
            c.median_multiple = Some(f);
            out.push(c);
        }
    }
    for f in [2.0, 4.0] {
        let mut c = plain(ProtocolKind::Wbsp);
        c.spec.round_deadline_ms = Some(round_ms(f * median_s * 1000.0));
        c.median_multiple = Some(f);
        out.push(c);
    }
    let mut gs: Vec<u32> = [2, 4, n / 4].into_iter().filter(|&g| g >= 2 && g <= n / 2).collect();
    gs.sort_unstable();
    gs.dedup();
    for g in gs {
        let mut c = plain(ProtocolKind::Grouped);
        c.spec.groups = Some(g);
        out.push(c);
    }
    out.retain(|c| c.spec.config(n, 0.5).is_ok());
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn knobs_scale_with_the_trace_and_fit_the_worker_count() {
        for n in [1, 2, 5, 16, 64] {
            let c = candidates(n, 0.05);
            assert!(c.iter().all(|c| c.spec.config(n, 0.5).is_ok()));
            assert!(c.iter().any(|c| c.spec.name == ProtocolKind::Bsp));
        }
        let c = candidates(16, 0.05);
        let bap: Vec<f64> = c.iter().filter_map(|c| c.spec.iteration_timeout_ms).collect();
        assert!(bap.contains(&75.0) && bap.contains(&150.0), "{bap:?}");
        let b: Vec<u32> = c.iter().filter_map(|c| c.spec.backup_workers).collect();
        assert_eq!(b, [1, 2, 4, 8]);
        let g: Vec<u32> = c.iter().filter_map(|c| c.spec.groups).collect();
        assert_eq!(g, [2, 4]);
        assert_eq!(round_ms(0.0123456), 0.0123);
    }
}
