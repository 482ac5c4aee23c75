//! `syncopate advise` and `syncopate trace-gen` as an operator runs them: the advise
//! guide's record-then-advise recipe for any worker count, traces that are not a full table refused
//! with the file, the line and the reason, the table, the JSON and the SVG.

mod common;

use common::{stdout, syncopate};

fn scratch(name: &str) -> std::path::PathBuf {
    common::scratch("advise", name)
}

/// `train --workers N --sim --record-trace t.csv && advise --trace t.csv` for 16 and 5
/// workers: the trace's worker count is the runs' worker count.
#[test]
fn record_then_advise_works_for_any_worker_count() {
    let dir = scratch("recipe");
    for n in ["16", "5"] {
        let trace = dir.join(format!("t{n}.csv"));
        let t = trace.to_str().unwrap();
        stdout(&syncopate(&[
            "train",
            "--workers",
            n,
            "--sim",
            "--steps",
            "80",
            "--straggler",
            "1:slow=3",
            "--record-trace",
            t,
        ]));
        let out = stdout(&syncopate(&["advise", "--trace", t, "--seeds", "2", "--json"]));
        let v: serde_json::Value = serde_json::from_str(out.trim()).unwrap();
        assert_eq!(v["trace"]["workers"].as_u64(), n.parse().ok(), "{v}");
        assert_eq!(v["trace"]["steps"], 80);
        let pick = v["recommendation"].as_str().expect("a recommendation");
        let rows = v["whole"]["rows"].as_array().unwrap();
        assert!(rows.iter().any(|r| r["label"] == pick));
        assert!(rows.iter().all(|r| r["times_s"].as_array().map(Vec::len) == Some(2)));
        let text = stdout(&syncopate(&["advise", "--trace", t, "--seeds", "2"]));
        assert!(text.contains(&format!("recommendation: {pick} (")), "{text}");
        assert!(text.contains(&format!("{n} workers x 80 steps")), "{text}");
    }
    std::fs::remove_dir_all(&dir).ok();
}

#[test]
fn traces_that_are_not_a_full_table_are_refused_with_file_line_and_reason() {
    let dir = scratch("invalid");
    let h = "worker,step,seconds\n";
    for (name, body, needles) in [
        (
            "dup.csv",
            "0,0,0.01\n1,0,0.01\n0,0,0.02\n",
            vec!["dup.csv line 4", "worker 0 step 0 is a duplicate of line 2"],
        ),
        ("gap.csv", "0,0,0.01\n0,2,0.01\n1,0,0.01\n1,1,0.01\n", vec!["gap.csv line 3", "steps 1..2 are missing"]),
        ("uneq.csv", "0,0,0.01\n0,1,0.01\n1,0,0.01\n", vec!["uneq.csv line 3", "unequal step counts", "--truncate"]),
        ("nan.csv", "0,0,fast\n", vec!["nan.csv line 2", "'fast' is not a complete number"]),
        ("neg.csv", "0,0,-0.01\n", vec!["neg.csv line 2", "'-0.01'"]),
        ("hole.csv", "0,0,0.01\n2,0,0.01\n", vec!["hole.csv", "no steps for worker 1"]),
    ] {
        let path = dir.join(name);
        std::fs::write(&path, format!("{h}{body}")).unwrap();
        let out = syncopate(&["advise", "--trace", path.to_str().unwrap()]);
        assert_eq!(out.status.code(), Some(2), "{name}");
        let err = String::from_utf8_lossy(&out.stderr);
        assert_eq!(err.trim().lines().count(), 1, "{name}: {err}");
        assert!(needles.iter().all(|n| err.contains(n)), "{name}: {err}");
    }
    // The documented policy for unequal counts: --truncate keeps every worker's first S.
    let uneq = dir.join("uneq.csv");
    let out =
        stdout(&syncopate(&["advise", "--trace", uneq.to_str().unwrap(), "--truncate", "--seeds", "2", "--json"]));
    let v: serde_json::Value = serde_json::from_str(out.trim()).unwrap();
    assert_eq!((v["trace"]["workers"].as_u64(), v["trace"]["steps"].as_u64()), (Some(2), Some(1)));
    std::fs::remove_dir_all(&dir).ok();
}

#[test]
fn a_generated_trace_gives_a_table_json_and_an_svg_with_intervals() {
    let dir = scratch("outputs");
    let trace = dir.join("rc.csv");
    let t = trace.to_str().unwrap();
    let said =
        stdout(&syncopate(&["trace-gen", "regime-change", "--workers", "6", "--steps", "160", "--seed", "3", "-o", t]));
    assert!(said.contains("regime-change trace, 6 workers x 160 steps"), "{said}");
    let again = dir.join("rc2.csv");
    stdout(&syncopate(&[
        "trace-gen",
        "regime-change",
        "--workers",
        "6",
        "--steps",
        "160",
        "--seed",
        "3",
        "-o",
        again.to_str().unwrap(),
    ]));
    assert_eq!(std::fs::read(&trace).unwrap(), std::fs::read(&again).unwrap(), "trace-gen is seeded");
    let svg = dir.join("a.svg");
    let text = stdout(&syncopate(&["advise", "--trace", t, "--seeds", "3", "--plot", svg.to_str().unwrap()]));
    for needle in ["± 95%", "recommendation: ", "phases: the step times change regime", "steps 0..", "plot written"] {
        assert!(text.contains(needle), "{needle}: {text}");
    }
    let svg = std::fs::read_to_string(&svg).unwrap();
    assert!(svg.contains("<svg") && svg.contains("virtual seconds to target") && svg.contains("alone"), "svg");
    // The same seeds give the same advice; a scenario file limits the candidates to its own.
    let a = stdout(&syncopate(&["advise", "--trace", t, "--seeds", "2", "--json", "--no-phases"]));
    let b = stdout(&syncopate(&["advise", "--trace", t, "--seeds", "2", "--json", "--no-phases", "--jobs", "1"]));
    assert_eq!(a, b);
    let scenario = dir.join("s.toml");
    std::fs::write(
        &scenario,
        "workers = 6\n[[protocols]]\nname = \"bsp\"\n[[protocols]]\nname = \"backup\"\nbackup_workers = [1, 2]\n",
    )
    .unwrap();
    let out = stdout(&syncopate(&["advise", "--trace", t, scenario.to_str().unwrap(), "--seeds", "2", "--json"]));
    let v: serde_json::Value = serde_json::from_str(out.trim()).unwrap();
    let labels: Vec<&str> = v["whole"]["rows"].as_array().unwrap().iter().filter_map(|r| r["label"].as_str()).collect();
    assert_eq!(labels, ["bsp", "backup b=1", "backup b=2"]);
    let bad = syncopate(&["trace-gen", "nope", "-o", t]);
    assert_eq!(bad.status.code(), Some(2));
    assert!(String::from_utf8_lossy(&bad.stderr).contains("dead-node"));
    std::fs::remove_dir_all(&dir).ok();
}

/// A trace with Pareto(1.5)-tailed step times (finite mean, infinite variance) runs with no
/// budget flag: 3x BSP's replay is more than the event guard allows, so the budget is the
/// most the guard allows, and the race stops the candidates measurably slower than the
/// fastest finished one long before it.
#[test]
fn a_heavy_tailed_trace_runs_without_a_budget_flag() {
    let dir = scratch("pareto15");
    let trace = dir.join("p15.csv");
    let t = trace.to_str().unwrap();
    let generate =
        ["trace-gen", "pareto", "--shape", "1.5", "--workers", "256", "--steps", "150", "--seed", "2", "-o", t];
    stdout(&syncopate(&generate));
    let out = stdout(&syncopate(&["advise", "--trace", t, "--seeds", "2", "--no-noise-sweep", "--json"]));
    let v: serde_json::Value = serde_json::from_str(out.trim()).unwrap();
    let pick = v["recommendation"].as_str().expect("a recommendation");
    let setting = &v["whole"]["setting"];
    assert!(setting["budget_note"].as_str().unwrap().contains("the most the event guard allows"), "{setting}");
    let budget = setting["budget_s"].as_f64().unwrap();
    let rows = v["whole"]["rows"].as_array().unwrap();
    let stopped: Vec<&serde_json::Value> = rows.iter().filter(|r| !r["stopped_early"].is_null()).collect();
    assert!(!stopped.is_empty(), "{v}");
    for r in &stopped {
        let s = &r["stopped_early"];
        assert!(s["at_s"].as_f64().unwrap() < budget / 10.0, "{s}");
        assert!(s["lower_bound_s"].as_f64().unwrap() > 1.25 * s["by_mean_s"].as_f64().unwrap(), "{s}");
        assert!(rows.iter().any(|q| q["label"] == s["by"] && q["reached"] == q["repeats"]), "{s}");
        assert_ne!(r["label"], pick);
    }
    assert!(rows.iter().any(|r| r["label"] == pick && r["reached"] == 2));
    std::fs::remove_dir_all(&dir).ok();
}

/// A knob whose best value is at the edge of its sweep is extended until the best is inside
/// or the range ends, and the report says so; `--no-extend` keeps the built-in sweep.
#[test]
fn sweeps_extend_past_their_edge_and_say_so() {
    let dir = scratch("extend");
    let trace = dir.join("st.csv");
    let t = trace.to_str().unwrap();
    stdout(&syncopate(&["trace-gen", "steady", "--workers", "8", "--steps", "200", "--seed", "3", "-o", t]));
    let text = stdout(&syncopate(&["advise", "--trace", t, "--seeds", "2", "--no-noise-sweep", "--jobs", "1"]));
    let notes: Vec<&str> = text.lines().filter_map(|l| l.strip_prefix("sweep extended: ")).collect();
    let tried: Vec<&str> = notes.iter().filter(|n| n.contains(" was the ")).copied().collect();
    assert!(!tried.is_empty(), "{text}");
    // Every extension is a row of the table, and every extended knob ends inside its sweep or
    // at the end of its range.
    let rows: Vec<&str> = text.lines().filter(|l| l.contains("past the sweep's edge")).collect();
    assert!(rows.len() >= tried.len(), "{text}");
    assert!(notes.iter().all(|n| !n.contains("still at the edge")), "{text}");
    assert!(notes.iter().any(|n| n.contains("is inside the extended sweep") || n.contains("end of the knob's range")));
    let plain =
        stdout(&syncopate(&["advise", "--trace", t, "--seeds", "2", "--no-noise-sweep", "--no-extend", "--json"]));
    let v: serde_json::Value = serde_json::from_str(plain.trim()).unwrap();
    assert!(v["whole"]["extended"].is_null());
    assert!(v["whole"]["rows"].as_array().unwrap().iter().all(|r| r["extension"] == false));
    std::fs::remove_dir_all(&dir).ok();
}

/// With the NQM's noise set by `--noise-scale` (the operator's critical batch), much gradient
/// noise makes the pick average more gradients per step than little noise does, as the
/// large-batch theory says; the report shows the pick at n/10, n and 10n by default.
#[test]
fn a_larger_noise_scale_makes_the_pick_aggregate_more_gradients() {
    let dir = scratch("noise");
    let trace = dir.join("st.csv");
    let t = trace.to_str().unwrap();
    stdout(&syncopate(&["trace-gen", "steady", "--workers", "16", "--steps", "300", "--seed", "3", "-o", t]));
    let scenario = dir.join("s.toml");
    std::fs::write(
        &scenario,
        "workers = 16\n[[protocols]]\nname = \"bsp\"\n[[protocols]]\nname = \"backup\"\nbackup_workers = [4, 8, 12, 14]\n[[protocols]]\nname = \"asp\"\n",
    )
    .unwrap();
    let s = scenario.to_str().unwrap();
    let pick_batch = |noise: &str| {
        let out = stdout(&syncopate(&[
            "advise",
            "--trace",
            t,
            s,
            "--seeds",
            "3",
            "--noise-scale",
            noise,
            "--no-noise-sweep",
            "--json",
        ]));
        let v: serde_json::Value = serde_json::from_str(out.trim()).unwrap();
        let b = v["whole"]["setting"]["critical_batch"].as_f64().unwrap();
        assert!((b - noise.parse::<f64>().unwrap()).abs() < 1e-6 * b, "{b}");
        let pick = v["recommendation"].as_str().expect("a recommendation").to_string();
        let row = v["whole"]["rows"].as_array().unwrap().iter().find(|r| r["label"] == pick.as_str()).unwrap().clone();
        (pick, row["effective_batch"].as_f64().unwrap())
    };
    let (small_pick, small) = pick_batch("1.6");
    let (large_pick, large) = pick_batch("160");
    assert!(large > small, "B = 1.6: {small_pick} ({small}); B = 160: {large_pick} ({large})");
    let text = stdout(&syncopate(&["advise", "--trace", t, s, "--seeds", "2"]));
    assert!(text.contains("how the pick depends on the gradient noise"), "{text}");
    for b in ["1.60", "16.0", "160"] {
        assert!(text.contains(&format!("  critical batch {b} examples: ")), "{b}: {text}");
    }
    assert!(text.contains("(the built-in noise); set --noise-scale to your model's"), "{text}");
    let bad = syncopate(&["advise", "--trace", t, "--noise-scale", "-3"]);
    assert_eq!(bad.status.code(), Some(2));
    assert!(String::from_utf8_lossy(&bad.stderr).contains("--noise-scale"));
    std::fs::remove_dir_all(&dir).ok();
}

/// A BSP run of the noisy quadratic model recorded by `train --sim --record-trace` carries
/// each step's loss and gradient norms; from them the trace's noise scale comes within 1.3x
/// of the model's true simple noise scale, `tr(Σ)/|G|²` with `|G|²` the closed-form expected
/// full-batch gradient over the same steps (every run of 8 workers x 200 steps, batch 16,
/// lr 0.05, where the true scale is about 6.7 worker gradients); `advise` uses it and says so,
/// and `--noise-scale` overrides it. An older trace without the columns still loads.
#[test]
fn a_recorded_nqm_trace_gives_its_noise_scale_and_advise_uses_it() {
    use syncopate_adapters::advise::{self, noise};
    let dir = scratch("measured-noise");
    let trace = dir.join("nqm.csv");
    let t = trace.to_str().unwrap();
    let (workers, steps, batch, lr) = (8usize, 200u64, 16usize, 0.05);
    stdout(&syncopate(&[
        "train",
        "--sim",
        "--protocol",
        "bsp",
        "--workers",
        "8",
        "--model",
        "nqm:100",
        "--batch-size",
        "16",
        "--lr",
        "0.05",
        "--steps",
        "200",
        "--record-trace",
        t,
    ]));
    let text = std::fs::read_to_string(&trace).unwrap();
    assert!(text.starts_with("worker,step,seconds,loss,grad_norm,mean_norm,mean_of\n"), "{}", &text[..200]);
    let rows = syncopate_adapters::trace::read_gradient_stats(&trace).unwrap();
    assert_eq!(rows.len(), workers * steps as usize);
    // BSP: every step's gradients are computed on one model, so each mean holds all 8.
    assert!(rows.iter().all(|(_, g)| g.mean_of == 8 && g.loss.is_some()), "{:?}", rows[0]);
    let e = advise::noise_estimate::estimate(&rows, steps).unwrap();
    let window: Vec<f64> = (e.from_step..e.until_step).map(|s| s as f64).collect();
    let signal = window.iter().map(|&s| noise::nqm_expected_gradient_sq(100, lr, workers, batch, s, 1.0)).sum::<f64>()
        / window.len() as f64;
    let truth = noise::nqm_noise_trace(100, 1.0) / batch as f64 / signal;
    assert!((5.0..9.0).contains(&truth), "{truth}");
    let ratio = e.gradients / truth;
    assert!((1.0 / 1.3..1.3).contains(&ratio), "estimate {} vs true {truth}: {e:?}", e.gradients);
    // advise sets the NQM's critical batch from it (in gradients with --worker-batch 1).
    let advise_args = ["advise", "--trace", t, "--seeds", "2", "--no-noise-sweep", "--no-phases", "--json"];
    let v: serde_json::Value = serde_json::from_str(stdout(&syncopate(&advise_args)).trim()).unwrap();
    assert_eq!(v["noise_from_trace"], true, "{v}");
    let critical = v["whole"]["setting"]["critical_batch"].as_f64().unwrap();
    let estimated = v["measured_noise"]["estimated"]["gradients"].as_f64().unwrap();
    assert!((critical - estimated).abs() < 1e-6 * critical, "{critical} {estimated}");
    let report = stdout(&syncopate(&advise_args[..advise_args.len() - 1]));
    assert!(report.contains("noise scale from the trace: B = "), "{report}");
    assert!(report.contains("from the trace's gradient norms; --noise-scale overrides"), "{report}");
    let mut given = advise_args.to_vec();
    given.extend(["--noise-scale", "50"]);
    let v: serde_json::Value = serde_json::from_str(stdout(&syncopate(&given)).trim()).unwrap();
    assert_eq!(v["noise_from_trace"], false);
    assert!((v["whole"]["setting"]["critical_batch"].as_f64().unwrap() - 50.0).abs() < 1e-6);
    // ASP: every worker pulls its own version, so no gradient has a partner on its model.
    let asp = dir.join("asp.csv");
    let a = asp.to_str().unwrap();
    stdout(&syncopate(&[
        "train",
        "--sim",
        "--protocol",
        "asp",
        "--workers",
        "4",
        "--model",
        "nqm:100",
        "--steps",
        "60",
        "--straggler",
        "all:exp=1/1",
        "--record-trace",
        a,
    ]));
    let report =
        stdout(&syncopate(&["advise", "--trace", a, "--truncate", "--seeds", "2", "--no-noise-sweep", "--no-phases"]));
    assert!(report.contains("noise scale from the trace: no estimate: "), "{report}");
    assert!(report.contains("record a BSP or backup-workers run"), "{report}");
    assert!(report.contains("(the built-in noise); set --noise-scale to your model's"), "{report}");
    // The step times alone (an older trace) still load, with no estimate.
    let plain: String = text
        .lines()
        .map(|l| l.split(',').take(3).collect::<Vec<_>>().join(","))
        .map(|l| if l.starts_with("worker") { "worker,step,seconds".to_string() } else { l })
        .collect::<Vec<_>>()
        .join("\n")
        + "\n";
    std::fs::write(&trace, plain).unwrap();
    let v: serde_json::Value = serde_json::from_str(stdout(&syncopate(&advise_args)).trim()).unwrap();
    assert!(v["measured_noise"].is_null() && v["noise_from_trace"] == false, "{v}");
    std::fs::remove_dir_all(&dir).ok();
}

/// A threaded run (`train` without `--sim`) records the same gradient columns: under BSP
/// every step's gradients are computed on one model, so each row's mean holds all workers'.
#[test]
fn a_threaded_recording_carries_the_gradient_columns() {
    let dir = scratch("threads-noise");
    let trace = dir.join("t.csv");
    let t = trace.to_str().unwrap();
    stdout(&syncopate(&[
        "train",
        "--protocol",
        "bsp",
        "--workers",
        "4",
        "--model",
        "nqm:20",
        "--steps",
        "30",
        "--step-ms",
        "0.5",
        "--record-trace",
        t,
    ]));
    let rows = syncopate_adapters::trace::read_gradient_stats(&trace).unwrap();
    assert!(rows.len() >= 4 * 25, "{}", rows.len());
    let full = rows.iter().filter(|(_, g)| g.mean_of == 4 && g.grad_norm.is_some() && g.loss.is_some()).count();
    assert!(full * 10 >= rows.len() * 9, "{full} of {} rows have a group of 4: {:?}", rows.len(), &rows[..4]);
    std::fs::remove_dir_all(&dir).ok();
}

/// A 1-worker BSP recording: the ranking comes with the caveat that one worker waits for no
/// one, and the noise estimate asks for more workers, not for the BSP run it already is; a
/// trace of 1 step per worker says its ranking repeats those few steps.
#[test]
fn a_one_worker_or_one_step_trace_is_ranked_with_what_it_cannot_tell() {
    let dir = scratch("caveats");
    let one = dir.join("one.csv");
    let t = one.to_str().unwrap();
    let record = ["train", "--sim", "--protocol", "bsp", "--workers", "1", "--model", "nqm:100", "--steps", "40"];
    stdout(&syncopate(&[&record[..], &["--record-trace", t]].concat()));
    let report = stdout(&syncopate(&["advise", "--trace", t, "--seeds", "2", "--no-noise-sweep", "--no-phases"]));
    assert!(report.contains("caveat: the trace holds 1 worker: no worker waits for another"), "{report}");
    assert!(report.contains("the trace holds one worker: no gradient has a partner"), "{report}");
    assert!(!report.contains("record a BSP or backup-workers run"), "it was a BSP run: {report}");
    let steps = dir.join("steps.csv");
    std::fs::write(&steps, "worker,step,seconds\n0,0,0.01\n1,0,0.02\n").unwrap();
    let s = steps.to_str().unwrap();
    let v: serde_json::Value =
        serde_json::from_str(stdout(&syncopate(&["advise", "--trace", s, "--seeds", "2", "--json"])).trim()).unwrap();
    let caveats = v["caveats"].as_array().unwrap();
    assert_eq!(caveats.len(), 1, "{v}");
    assert!(caveats[0].as_str().unwrap().contains("1 step(s) per worker"), "{v}");
    std::fs::remove_dir_all(&dir).ok();
}
