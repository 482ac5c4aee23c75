//! `syncopate train --sim --workers 10000` for every protocol, as BENCHMARKS.md states: each
//! run exits 0 with 10,000 workers, two steps per worker, no refused input, every accepted
//! gradient accounted for, and the simulator's events per second in the report.

mod common;

use common::{stdout, syncopate};

#[test]
fn every_protocol_trains_ten_thousand_simulated_workers() {
    for protocol in syncopate::ProtocolKind::NAMES {
        let args = ["train", "--sim", "--workers", "10000", "--protocol", protocol, "--steps", "2", "--json"];
        let out = stdout(&syncopate(&args));
        let v: serde_json::Value = serde_json::from_str(out.trim()).unwrap();
        assert_eq!(v["protocol"], protocol);
        assert_eq!(v["workers"], 10_000, "{protocol}");
        assert!(v["updates"].as_u64() >= Some(2), "{protocol}: {}", v["updates"]);
        let g = &v["gradients"];
        assert_eq!(g["refused"], 0, "{protocol}: {g}");
        let n = |k: &str| g[k].as_u64().unwrap_or_else(|| panic!("{protocol}: no {k} in {g}"));
        assert!(n("accepted") >= 20_000, "{protocol}: {g}");
        assert_eq!(n("applied") + n("dropped") + n("held_at_stop"), n("accepted"), "{protocol}: {g}");
        assert!(n("applied") > 0, "{protocol}: {g}");
        assert!(v["simulator"]["events_per_s"].as_f64() > Some(0.0), "{protocol}: {}", v["simulator"]);
    }
}
