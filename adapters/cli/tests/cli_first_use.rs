//! What a new user tries first, as commands: every listed model runs (or is refused in one
//! line), runs that could go on without end are bounded or refused before they start, a
//! diverging run says so, and the summary explains its own figures.

mod common;

use common::{scratch, syncopate};
use std::process::Output;

fn text(out: &Output) -> (String, String) {
    (String::from_utf8_lossy(&out.stdout).into_owned(), String::from_utf8_lossy(&out.stderr).into_owned())
}

/// Asserts exit code 2 and one line on stderr containing every needle.
fn refused(args: &[&str], needles: &[&str]) {
    let out = syncopate(args);
    let (stdout, err) = text(&out);
    assert_eq!(out.status.code(), Some(2), "{args:?}: {err}");
    assert_eq!(err.trim_end().lines().count(), 1, "{args:?}: not one line: {err}");
    assert!(!err.starts_with("error: error:"), "{args:?}: doubled prefix: {err}");
    for needle in needles {
        assert!(err.contains(needle), "{args:?}: '{needle}' missing from: {err}");
    }
    assert!(stdout.is_empty(), "{args:?}: printed to stdout on a refusal");
}

/// The stdout of a run that must have exited 0 without a panic.
fn succeeded(args: &[&str]) -> String {
    let out = syncopate(args);
    let (_, err) = text(&out);
    assert!(!err.contains("panicked"), "{args:?}: {err}");
    common::stdout(&out)
}

#[test]
fn every_nqm_dimension_runs_and_reports_a_loss_without_an_accuracy() {
    for model in ["nqm:100", "nqm:64", "nqm:7"] {
        for mode in [&["--sim"][..], &["--step-ms", "0.05", "--workers", "2"][..]] {
            let mut args = vec!["train", "--model", model, "--steps", "20"];
            args.extend_from_slice(mode);
            let out = succeeded(&args);
            assert!(out.contains(&format!("{model} (")), "{args:?}: {out}");
            assert!(!out.contains("test accuracy"), "{args:?}: an accuracy for the NQM: {out}");
            assert!(!out.contains("time to 0.90"), "{args:?}: an accuracy target for the NQM: {out}");
            assert!(out.contains("the noisy quadratic model has no accuracy"), "{args:?}: {out}");
        }
    }
    let dir = scratch("first-use", "nqm");
    let scenario = dir.join("nqm.toml");
    std::fs::write(
        &scenario,
        "workers = 4\nseeds = 1\nmax_time_s = 0.2\nmodel = \"nqm:100\"\n[[protocols]]\nname = \"bsp\"\n",
    )
    .unwrap();
    succeeded(&["compare", scenario.to_str().unwrap()]);
    let data = dir.join("d.csv");
    std::fs::write(&data, "0,1,0\n1,0,1\n0,1,0\n1,0,1\n0,1,0\n1,0,1\n").unwrap();
    refused(&["train", "--sim", "--model", "nqm:2", "--data", data.to_str().unwrap()], &["nqm:2", "--data"]);
    std::fs::remove_dir_all(&dir).ok();
}

#[test]
fn runs_without_a_bound_are_refused_before_they_start() {
    refused(&["train", "--sim", "--straggler", "0:delay=1e12", "--steps", "5"], &["--straggler", "virtual seconds"]);
    refused(
        &["train", "--sim", "--straggler", "all:pareto=1/0.5", "--steps", "50"],
        &["--straggler", "no finite mean"],
    );
    refused(&["train", "--sim", "--straggler", "0:slow=1e9", "--steps", "20"], &["--straggler", "stall reports"]);
}

#[test]
fn slow_stragglers_finish_with_a_bounded_curve() {
    // A run of 400 virtual seconds evaluated every base step would make 200,000
    // evaluations; the run spreads them out.
    let out = succeeded(&["train", "--sim", "--straggler", "0:slow=10000", "--steps", "20", "--json"]);
    let v: serde_json::Value = serde_json::from_str(&out).unwrap();
    let points = v["curve"].as_array().unwrap().len();
    assert!((2..=2_002).contains(&points), "{points} evaluations");
    assert_eq!(v["updates"], 20);
}

#[test]
fn a_diverging_run_stops_and_says_why() {
    for protocol in ["bsp", "ssp", "backup", "dbw", "bap", "asp", "wbsp", "grouped"] {
        for mode in [&["--sim"][..], &["--step-ms", "0.05"][..]] {
            let mut args = vec!["train", "--lr", "1e38", "--steps", "20", "--protocol", protocol];
            args.extend_from_slice(mode);
            let out = succeeded(&args);
            assert!(out.contains("DIVERGED"), "{args:?}: {out}");
            assert!(out.contains("lower --lr"), "{args:?}: {out}");
        }
    }
    let out = succeeded(&["train", "--sim", "--lr", "1e30", "--steps", "20"]);
    assert!(out.contains("DIVERGED") && out.contains("the test loss grew"), "{out}");
    let json = succeeded(&["train", "--sim", "--lr", "1e38", "--steps", "20", "--protocol", "ssp", "--json"]);
    let v: serde_json::Value = serde_json::from_str(&json).unwrap();
    assert!(v["diverged"].as_str().unwrap().contains("refused for holding NaN"), "{json}");
    let healthy = succeeded(&["train", "--sim", "--steps", "20", "--json"]);
    let v: serde_json::Value = serde_json::from_str(&healthy).unwrap();
    assert!(v.get("diverged").is_none(), "{healthy}");
}

#[test]
fn a_backup_summary_shows_the_abandoned_computations() {
    let out = succeeded(&["train", "--sim", "--protocol", "backup", "--steps", "30", "--straggler", "0:slow=4"]);
    let line = out.lines().find(|l| l.trim_start().starts_with("abandoned")).unwrap_or_else(|| panic!("{out}"));
    let first: u64 = line.split_whitespace().nth(1).unwrap().parse().unwrap();
    assert!(first > 0, "worker 0 abandoned nothing: {out}");
}

#[test]
fn a_server_address_without_a_port_is_a_usage_error() {
    refused(&["work", "--connect", "nowhere", "--id", "0"], &["--connect", "no port", "HOST:PORT"]);
    refused(&["work", "--connect", "127.0.0.1", "--id", "0"], &["--connect", "no port"]);
    refused(&["work", "--connect", "127.0.0.1:http", "--id", "0"], &["--connect", "not a port number"]);
    refused(&["group", "--connect", "nowhere", "--group", "0"], &["--connect", "no port"]);
}

#[test]
fn wrong_reasons_are_now_the_right_ones() {
    refused(&["train", "--model", "mlp:0"], &["'mlp:0'", "at least 1"]);
    refused(&["train", "--model", "nqm:0"], &["'nqm:0'", "at least 1"]);
    refused(&["train", "--straggler", "0:slow=-1"], &["slow factor '-1' is not a positive number"]);
    refused(&["train", "--straggler", "0:slow=0"], &["slow factor '0' is not a positive number"]);
    refused(&["train", "--data-format", "libsvm"], &["--data"]);
    let dir = scratch("first-use", "reasons");
    for (name, body, needles) in [
        ("neg.csv", "worker,step,seconds\n0,0,-0.01\n", vec!["neg.csv line 2", "'-0.01' is not a step time"]),
        ("huge.csv", "worker,step,seconds\n0,0,1e300\n", vec!["huge.csv line 2", "'1e300' is not a step time"]),
    ] {
        let path = dir.join(name);
        std::fs::write(&path, body).unwrap();
        refused(&["advise", "--trace", path.to_str().unwrap()], &needles);
    }
    let dup = dir.join("dup.toml");
    std::fs::write(&dup, "workers = 4\nworkers = 5\n[[protocols]]\nname = \"bsp\"\n").unwrap();
    refused(&["compare", dup.to_str().unwrap()], &["dup.toml:2", "duplicate key 'workers'"]);
    std::fs::remove_dir_all(&dir).ok();
}

#[test]
fn help_lists_what_each_command_takes_and_no_command_is_a_usage_error() {
    let out = syncopate(&[]);
    let (stdout, err) = text(&out);
    assert_eq!(out.status.code(), Some(2), "bare syncopate: {err}");
    assert!(stdout.is_empty() && err.contains("Usage: syncopate <COMMAND>"), "{err}");
    let help = succeeded(&["--help"]);
    for command in ["train", "compare", "advise", "trace-gen", "serve", "work", "group", "reproduce", "mpi"] {
        assert!(help.lines().next().unwrap().contains(command), "the description omits {command}: {help}");
    }
    let mpi = succeeded(&["mpi", "--help"]);
    assert!(!mpi.contains("--sim") && !mpi.contains("--record-trace"), "{mpi}");
    let train = succeeded(&["train", "--help"]);
    assert!(train.contains("mlp2:H1:H2") && train.contains("nqm:D"), "{train}");
}

#[test]
fn trace_gen_bounds_its_size_and_writes_to_stdout() {
    refused(&["trace-gen", "steady", "--workers", "65535", "--steps", "1000000", "-o", "huge.csv"], &["at most"]);
    assert!(!std::path::Path::new("huge.csv").exists());
    let out = succeeded(&["trace-gen", "steady", "--workers", "2", "--steps", "3", "-o", "-"]);
    assert_eq!(out.lines().count(), 7, "{out}");
    assert!(!std::path::Path::new("-").exists(), "a file named '-' was created");
    // A closed pipe ends it quietly, whether the trace goes to `-` or to /dev/stdout.
    for target in ["-", "/dev/stdout"] {
        let mut child = std::process::Command::new(env!("CARGO_BIN_EXE_syncopate"))
            .args(["trace-gen", "steady", "--workers", "16", "--steps", "20000", "-o", target])
            .stdout(std::process::Stdio::piped())
            .stderr(std::process::Stdio::piped())
            .spawn()
            .unwrap();
        drop(child.stdout.take());
        let out = child.wait_with_output().unwrap();
        let err = String::from_utf8_lossy(&out.stderr);
        assert_eq!(out.status.code(), Some(0), "-o {target}: {err}");
        assert!(!err.contains("Broken pipe") && !err.contains("panicked"), "-o {target}: {err}");
    }
}

#[test]
fn compare_names_its_baseline_says_which_runs_diverged_and_shows_progress_without_a_terminal() {
    let dir = scratch("first-use", "compare");
    let path = dir.join("lr.toml");
    let scenario = "workers = 4\nseeds = 1\nmax_time_s = 0.3\n[[protocols]]\nname = \"bsp\"\n[[protocols]]\nname = \"asp\"\n\
                    [[protocols]]\nname = \"wbsp\"\nlr = 1e38\n";
    std::fs::write(&path, scenario).unwrap();
    let out = syncopate(&["compare", path.to_str().unwrap()]);
    let (_, err) = text(&out);
    let table = common::stdout(&out);
    assert!(table.contains("speedup: bsp's time to target over each run's"), "{table}");
    assert!(table.contains("note: wbsp") && table.contains("diverged in 1 of 1 seeds"), "{table}");
    assert!(!table.contains("note: bsp diverged") && !table.contains("note: asp diverged"), "{table}");
    assert!(err.contains("compare: 3/3 simulations done"), "no progress lines: {err}");
    std::fs::remove_dir_all(&dir).ok();
}

#[test]
fn advise_says_which_protocols_a_one_worker_trace_leaves_out() {
    let dir = scratch("first-use", "advise");
    let path = dir.join("one.csv");
    let body: String = (0..40).map(|s| format!("0,{s},0.01\n")).collect();
    std::fs::write(&path, format!("worker,step,seconds\n{body}")).unwrap();
    let out = syncopate(&["advise", "--trace", path.to_str().unwrap(), "--seeds", "2", "--no-phases"]);
    let (_, err) = text(&out);
    assert!(err.contains("a 1-worker trace leaves out") && err.contains("backup"), "{err}");
    std::fs::remove_dir_all(&dir).ok();
}

#[test]
fn more_worker_threads_than_the_memory_holds_are_refused() {
    refused(&["train", "--workers", "65535", "--steps", "1"], &["'65535' for '--workers'", "GB", "--sim"]);
}
