//! `syncopate compare` and `syncopate advise` as a user runs them: the same scenario gives the
//! same table twice, `advise` sweeps a scenario file's protocols on a recorded trace,
//! the plot is an SVG, and a bad scenario file is refused in one line with exit code 2.

mod common;

use common::{stdout, syncopate};

fn scratch(name: &str) -> std::path::PathBuf {
    common::scratch("compare", name)
}

const SCENARIO: &str = r#"
name = "cli test"
seed = 3
seeds = 2
workers = 4
step_ms = 10.0
max_time_s = 1.5
eval_interval_ms = 10.0

[[stragglers]]
workers = "0"
model = "slow=4"

[[protocols]]
name = "bsp"
[[protocols]]
name = "asp"
[[protocols]]
name = "backup"
backup_workers = 1
[[protocols]]
name = "grouped"
groups = 2
"#;

#[test]
fn same_scenario_same_table_and_a_plot() {
    let dir = scratch("det");
    let file = dir.join("s.toml");
    std::fs::write(&file, SCENARIO).unwrap();
    let f = file.to_str().unwrap();
    let a = stdout(&syncopate(&["compare", f, "--json"]));
    let b = stdout(&syncopate(&["compare", f, "--json", "--jobs", "1"]));
    assert_eq!(a, b, "the same seeded scenario must print the same table");
    let v: serde_json::Value = serde_json::from_str(a.trim()).unwrap();
    assert_eq!(v["runs"].as_array().map(Vec::len), Some(4));
    let svg = dir.join("p.svg");
    let text = stdout(&syncopate(&["compare", f, "--plot", svg.to_str().unwrap()]));
    assert!(text.contains("bsp") && text.contains("plot written"), "{text}");
    let svg = std::fs::read_to_string(&svg).unwrap();
    assert!(svg.contains("<svg") && svg.contains("virtual time (s)") && svg.contains("test accuracy"));
    std::fs::remove_dir_all(&dir).ok();
}

#[test]
fn advise_sweeps_a_scenario_files_protocols_on_a_recorded_trace() {
    let dir = scratch("advise");
    let file = dir.join("s.toml");
    std::fs::write(&file, SCENARIO).unwrap();
    let trace = dir.join("trace.csv");
    let t = trace.to_str().unwrap();
    stdout(&syncopate(&[
        "train",
        "--sim",
        "--workers",
        "4",
        "--straggler",
        "1:slow=3",
        "--steps",
        "60",
        "--step-ms",
        "10",
        "--record-trace",
        t,
        "--json",
    ]));
    let f = file.to_str().unwrap();
    let compared: serde_json::Value =
        serde_json::from_str(stdout(&syncopate(&["compare", f, "--trace", t, "--json"])).trim()).unwrap();
    let advised: serde_json::Value =
        serde_json::from_str(stdout(&syncopate(&["advise", "--trace", t, f, "--json", "--seeds", "2"])).trim())
            .unwrap();
    let labels = |rows: &serde_json::Value| -> Vec<String> {
        rows.as_array().unwrap().iter().filter_map(|r| r["label"].as_str().map(String::from)).collect()
    };
    assert_eq!(labels(&advised["whole"]["rows"]), labels(&compared["runs"]));
    let pick = advised["recommendation"].as_str().expect("a pick").to_string();
    let text = stdout(&syncopate(&["advise", "--trace", t, f, "--seeds", "2"]));
    assert!(text.contains(&format!("recommendation: {pick}")), "{text}");
    std::fs::remove_dir_all(&dir).ok();
}

#[test]
fn bad_scenarios_and_flags_are_refused_in_one_line() {
    let dir = scratch("bad");
    let file = dir.join("bad.toml");
    std::fs::write(&file, "workers = 4\nbogus = 1\n[[protocols]]\nname = \"bsp\"\n").unwrap();
    for args in [
        vec!["compare", file.to_str().unwrap()],
        vec!["compare", "/nonexistent/scenario.toml"],
        vec!["compare", "--preset", "nope"],
        vec!["advise", "--trace", "/nonexistent/trace.csv"],
    ] {
        let out = syncopate(&args);
        assert_eq!(out.status.code(), Some(2), "{args:?}");
        let err = String::from_utf8_lossy(&out.stderr);
        assert_eq!(err.trim().lines().count(), 1, "{args:?}: {err}");
    }
    let err = String::from_utf8_lossy(&syncopate(&["compare", file.to_str().unwrap()]).stderr).into_owned();
    assert!(err.contains("bad.toml:2:1") && err.contains("bogus"), "{err}");
    std::fs::remove_dir_all(&dir).ok();
}
