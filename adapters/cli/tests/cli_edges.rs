//! The `syncopate` command at its edges, as a new user meets them: a closed stdout ends
//! quietly, bad flags, values and files are refused in one line naming the flag or the file
//! and line and what is allowed (exit code 2), outputs are checked before a run, and every
//! summary accounts for each gradient.

use std::io::Read as _;
use std::path::PathBuf;
use std::process::{Command, Output, Stdio};

fn syncopate(args: &[&str]) -> Output {
    Command::new(env!("CARGO_BIN_EXE_syncopate")).args(args).output().expect("run syncopate")
}

fn scratch(name: &str) -> PathBuf {
    let dir = std::env::temp_dir().join(format!("syncopate-cli-edges-{}-{name}", std::process::id()));
    std::fs::create_dir_all(&dir).expect("temp dir");
    dir
}

/// Asserts exit code 2 and one line on stderr containing every needle.
fn refused(args: &[&str], needles: &[&str]) {
    let out = syncopate(args);
    let err = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(2), "{args:?}: {err}");
    assert_eq!(err.trim_end().lines().count(), 1, "{args:?}: not one line: {err}");
    for needle in needles {
        assert!(err.contains(needle), "{args:?}: '{needle}' missing from: {err}");
    }
    assert!(out.stdout.is_empty(), "{args:?}: printed to stdout on a refusal");
}

const SMALL_SCENARIO: &str = "workers = 4\nseeds = 1\nmax_time_s = 0.5\n[[protocols]]\nname = \"bsp\"\n";

#[test]
fn a_closed_stdout_ends_every_subcommand_quietly() {
    let dir = scratch("pipe");
    let scenario = dir.join("s.toml");
    std::fs::write(&scenario, SMALL_SCENARIO).unwrap();
    let trace = dir.join("t.csv");
    std::fs::write(&trace, "worker,step,seconds\n0,0,0.01\n1,0,0.02\n2,0,0.01\n3,0,0.01\n").unwrap();
    let (s, t) = (scenario.to_str().unwrap(), trace.to_str().unwrap());
    for args in [
        vec!["train", "--sim", "--json", "--steps", "20"],
        vec!["train", "--sim", "--steps", "20"],
        vec!["train", "--steps", "5", "--workers", "2", "--step-ms", "0.1"],
        vec!["compare", s],
        vec!["compare", s, "--json"],
        vec!["advise", "--trace", t, s],
        vec!["--help"],
        vec!["train", "--help"],
        vec!["--version"],
    ] {
        let mut child = Command::new(env!("CARGO_BIN_EXE_syncopate"))
            .args(&args)
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .expect("run syncopate");
        // Close the read end before the program writes: its writes meet a broken pipe.
        drop(child.stdout.take());
        let mut err = String::new();
        child.stderr.take().expect("stderr").read_to_string(&mut err).unwrap();
        let status = child.wait().unwrap();
        assert_eq!(status.code(), Some(0), "{args:?}: {err}");
        assert!(!err.contains("panicked") && !err.contains("Broken pipe"), "{args:?}: {err}");
    }
    std::fs::remove_dir_all(&dir).ok();
}

#[test]
fn bad_flags_name_the_flag_and_what_is_allowed() {
    refused(&["advise"], &["required", "--trace <FILE>"]);
    refused(&["work", "--id", "0"], &["required", "--connect <ADDR>"]);
    refused(&["train", "--interrupt", "maybe"], &["'maybe'", "--interrupt", "abort, complete"]);
    refused(&["train", "--data-format", "xml"], &["'xml'", "--data-format", "csv, libsvm"]);
    refused(&["train", "--lr", "-1"], &["'-1'", "--lr", "positive"]);
    refused(&["train", "--model", "mlp:100000000"], &["--model", "at most 4096"]);
    refused(&["train", "--step-ms", "0"], &["--step-ms", "between 0.01 and 60000"]);
    refused(&["train", "--batch-size", "100000"], &["--batch-size", "1..=4096"]);
    refused(&["train", "--target", "1.5"], &["--target", "between 0 and 1"]);
    refused(&["train", "--straggler", "5-2:slow=2"], &["--straggler", "reversed range"]);
    refused(&["train", "--straggler", "9:slow=2"], &["--straggler", "outside 0..8"]);
    refused(
        &["train", "--protocol", "bsp", "--staleness", "3"],
        &["--staleness does not apply to --protocol bsp", "ssp and bap"],
    );
    refused(&["train", "--protocol", "asp", "--stall-report", "100"], &["--stall-report does not apply"]);
    refused(&["train", "--protocol", "ssp", "--groups", "2"], &["--groups does not apply", "grouped"]);
    refused(&["train", "--protocol", "bsp", "--interrupt", "complete"], &["--interrupt does not apply"]);
    refused(&["train", "--sim", "--time-limit", "3"], &["--time-limit applies to threaded runs"]);
    refused(&["train", "--sim", "--steps", "100000000", "--workers", "256"], &["--steps", "simulator events"]);
    refused(&["train", "--bogus"], &["unexpected argument '--bogus'"]);
    refused(&["train", "--seed", "-1"], &["invalid value '-1' for '--seed': must not be negative"]);
    refused(
        &["train", "--protocol", "dbw", "--workers", "2", "--k-min", "3"],
        &["k-min 3", "between 1 and the 2 workers"],
    );
    refused(&["compare", "--preset", "nope"], &["--preset", "dbw, wbsp, bap, grouped"]);
}

#[test]
fn time_limits_and_loss_timeouts_beyond_a_year_are_refused_before_anything_starts() {
    let huge = ["--time-limit", "1e20"];
    let why = ["invalid value '100000000000000000000' for '--time-limit'", "up to 31536000"];
    refused(&[&["train"][..], &huge].concat(), &why);
    refused(&[&["serve", "--listen", "127.0.0.1:0"][..], &huge].concat(), &why);
    refused(&[&["group", "--connect", "127.0.0.1:9", "--group", "0"][..], &huge].concat(), &why);
    refused(&[&["mpi"][..], &huge].concat(), &why);
    refused(&["serve", "--listen", "127.0.0.1:0", "--lost-after", "1e300"], &["--lost-after", "up to 31536000"]);
    refused(&["work", "--connect", "127.0.0.1:9", "--id", "0", "--lost-after", "0"], &["--lost-after", "positive"]);
}

#[test]
fn outputs_are_checked_before_the_run() {
    let dir = scratch("outputs");
    let scenario = dir.join("s.toml");
    std::fs::write(&scenario, SMALL_SCENARIO).unwrap();
    let s = scenario.to_str().unwrap();
    refused(
        &["compare", s, "--plot", "/nonexistent/dir/p.svg"],
        &["--plot", "/nonexistent/dir/p.svg", "cannot create"],
    );
    let png = dir.join("p.png");
    refused(&["compare", s, "--plot", png.to_str().unwrap()], &["--plot", "SVG", ".svg"]);
    assert!(!png.exists(), "nothing written under a .png name");
    refused(
        &["train", "--sim", "--record-trace", "/nonexistent/dir/t.csv"],
        &["/nonexistent/dir/t.csv", "cannot create"],
    );
    std::fs::remove_dir_all(&dir).ok();
}

#[test]
fn bad_traces_are_refused_with_file_line_and_reason() {
    let dir = scratch("traces");
    let zero8: String =
        core::iter::once("worker,step,seconds\n".to_string()).chain((0..8).map(|w| format!("{w},0,0\n"))).collect();
    let mut tiny = String::from("worker,step,seconds\n");
    for w in 0..8 {
        tiny.push_str(&format!("{w},0,0.000001\n"));
    }
    for (name, text, needles) in [
        ("zero8.csv", zero8.as_str(), vec!["zero8.csv line 2", "'0' is not a step time", "from 0.000001 s"]),
        ("neg.csv", "worker,step,seconds\n0,0,-1\n", vec!["neg.csv line 2", "'-1'"]),
        ("cut.csv", "worker,step,seconds\n0,0,0.5\n7,301,0.", vec!["cut.csv line 3", "truncated"]),
        ("cutnum.csv", "worker,step,seconds\n7,301,0.\n", vec!["cutnum.csv line 2", "'0.' is not a complete number"]),
        ("word.csv", "worker,step,seconds\n0,x,0.5\n", vec!["word.csv line 2", "step 'x'"]),
        // Valid steps of 1 µs: 8 workers would need ~2e8 events in compare's default 5 s
        // budget (advise's budget follows the trace, and is checked the same way below).
        ("tiny.csv", tiny.as_str(), vec!["tiny.csv", "simulator events", "at most"]),
    ] {
        let path = dir.join(name);
        std::fs::write(&path, text).unwrap();
        let p = path.to_str().unwrap();
        if name == "tiny.csv" {
            refused(&["advise", "--trace", p, "--budget", "5"], &needles);
        } else {
            refused(&["advise", "--trace", p], &needles);
        }
        refused(&["compare", "--trace", p], &needles);
    }
    std::fs::remove_dir_all(&dir).ok();
}

#[test]
fn bad_scenarios_are_refused_with_line_and_reason() {
    let dir = scratch("scenarios");
    for (text, needles) in [
        (
            "workers = 4\n[[protocols]]\nname = \"bsp\"\nstaleness = 3\n",
            vec![":4: protocols[0].staleness: does not apply to bsp"],
        ),
        ("workers = 4\nmax_time_s = 1e9\n[[protocols]]\nname = \"bsp\"\n", vec![":2: max_time_s", "outside"]),
        (
            "workers = 4\neval_interval_ms = 0.000001\n[[protocols]]\nname = \"bsp\"\n",
            vec![":2: eval_interval_ms", "at most"],
        ),
        ("workers = 4\nbatch_size = 100000\n[[protocols]]\nname = \"bsp\"\n", vec![":2: batch_size"]),
        ("workers = 4\nmodel = \"mlp:100000000\"\n[[protocols]]\nname = \"bsp\"\n", vec![":2: model", "at most 4096"]),
        ("workers = 0\n[[protocols]]\nname = \"bsp\"\n", vec![":1: workers"]),
    ] {
        let path = dir.join("s.toml");
        std::fs::write(&path, text).unwrap();
        refused(&["compare", path.to_str().unwrap()], &needles);
    }
    std::fs::remove_dir_all(&dir).ok();
}

#[test]
fn a_data_file_without_test_rows_is_refused() {
    let dir = scratch("data");
    let path = dir.join("two.csv");
    std::fs::write(&path, "0.1,0.2,0\n0.3,0.4,1\n").unwrap();
    refused(&["train", "--sim", "--data", path.to_str().unwrap()], &["two.csv", "no test rows"]);
    std::fs::remove_dir_all(&dir).ok();
}

#[test]
fn every_summary_accounts_for_each_gradient() {
    for protocol in syncopate::ProtocolKind::NAMES {
        for mode in [&["--sim"][..], &["--step-ms", "0.2"][..]] {
            let mut args = vec!["train", "--protocol", protocol, "--straggler", "0:slow=4", "--steps", "40", "--json"];
            args.extend_from_slice(mode);
            let out = syncopate(&args);
            assert!(out.status.success(), "{args:?}: {}", String::from_utf8_lossy(&out.stderr));
            let v: serde_json::Value = serde_json::from_slice(&out.stdout).expect("one JSON object");
            let g = &v["gradients"];
            let n = |k: &str| g[k].as_u64().unwrap_or_else(|| panic!("{args:?}: no {k}"));
            let by_reason: u64 =
                g["dropped_by_reason"].as_object().unwrap().values().map(|x| x.as_u64().unwrap()).sum();
            assert_eq!(by_reason, n("dropped"), "{args:?}");
            assert!(n("applied") + n("dropped") <= n("accepted"), "{args:?}: applied + dropped exceed accepted: {g}");
            assert_eq!(n("applied") + n("dropped") + n("held_at_stop"), n("accepted"), "{args:?}: {g}");
            // What a server may hold at a stop: a partial iteration, or BAP's cached next one.
            assert!(n("held_at_stop") <= 2 * 8, "{args:?}: {g}");
        }
    }
    let text = String::from_utf8_lossy(&syncopate(&["train", "--sim", "--protocol", "dbw", "--steps", "40"]).stdout)
        .into_owned();
    assert!(text.contains("= applied") && text.contains("+ held at stop"), "{text}");
}

#[test]
fn reference_rows_are_never_the_fastest_and_advise_describes_the_trace() {
    let dir = scratch("fastest");
    let scenario = dir.join("s.toml");
    // BSP without the straggler is the fastest row, but it is a reference, not a candidate.
    std::fs::write(
        &scenario,
        "workers = 4\nseeds = 1\nmax_time_s = 2\n[[stragglers]]\nworkers = \"0\"\nmodel = \"slow=8\"\n\
         [[protocols]]\nname = \"bsp\"\n[[protocols]]\nname = \"bsp\"\nstragglers = \"\"\n[[protocols]]\nname = \"backup\"\n",
    )
    .unwrap();
    let out = syncopate(&["compare", scenario.to_str().unwrap(), "--json"]);
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    let v: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    let runs = v["runs"].as_array().unwrap();
    let reference = runs.iter().find(|r| r["reference"] == true).expect("a reference row");
    let backup = runs.iter().find(|r| r["label"] == "backup").expect("backup row");
    // The reference is listed first and is at least as fast: the old rule picked it.
    assert!(reference["time_to_target_s"].as_f64() <= backup["time_to_target_s"].as_f64(), "{v}");
    assert_eq!(v["fastest"], "backup", "{v}");

    let trace = dir.join("t.csv");
    let mut text = String::from("worker,step,seconds\n");
    for w in 0..3 {
        for s in 0..4 {
            text.push_str(&format!("{w},{s},{}\n", if w == 0 { 0.04 } else { 0.01 }));
        }
    }
    std::fs::write(&trace, text).unwrap();
    let out = syncopate(&["advise", "--trace", trace.to_str().unwrap()]);
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    let header = stdout.lines().next().unwrap_or("");
    assert!(header.contains("t.csv") && header.contains("3 workers") && !header.contains("four times"), "{header}");
    assert!(stdout.contains("recommendation: "), "{stdout}");
    std::fs::remove_dir_all(&dir).ok();
}

/// On a terminal, `train`'s progress bar counts gradients as the workers compute them: run
/// under `script` (a pseudo-terminal), the bar shows counts between 0 and the total. Without
/// `script` (util-linux) on the machine the test says so and checks nothing else.
#[test]
fn the_progress_bar_moves_on_a_terminal() {
    let bin = env!("CARGO_BIN_EXE_syncopate");
    let log = scratch("progress").join("tty.txt");
    let command = format!("{bin} train --workers 4 --steps 200 --step-ms 5");
    let Ok(out) = Command::new("script").args(["-qec", &command]).arg(&log).stdin(Stdio::null()).output() else {
        eprintln!("`script` is not installed: the progress bar was not checked");
        return;
    };
    assert!(out.status.success(), "train under script failed: {}", String::from_utf8_lossy(&out.stderr));
    let screen = std::fs::read(&log).expect("script's log");
    let screen = String::from_utf8_lossy(&screen);
    // Every redraw shows `done/total`; collect the `done` values of the bar's redraws.
    let counts: Vec<u64> = screen
        .split(['\r', '\n'])
        .filter_map(|frame| {
            let at = frame.find("/800")?;
            let digits: String = frame[..at]
                .chars()
                .rev()
                .take_while(char::is_ascii_digit)
                .collect::<Vec<_>>()
                .into_iter()
                .rev()
                .collect();
            digits.parse().ok()
        })
        .collect();
    assert!(counts.iter().any(|&c| c > 0 && c < 800), "the bar never showed progress between 0 and 800: {counts:?}");
}

#[test]
fn a_momentum_outside_zero_to_one_is_refused() {
    for bad in ["1.5", "1", "nan", "x"] {
        refused(&["serve", "--momentum", bad], &["momentum must be a number in [0, 1)", &format!("'{bad}'")]);
    }
    refused(&["serve", "--momentum", "-0.1"], &["--momentum", "'-0.1'", "negative"]);
}

/// A version-1 `.npy` file with `header` (the dict) and `data`.
fn npy_file(dir: &std::path::Path, name: &str, header: &str, data: &[u8]) -> String {
    let mut header = header.to_owned();
    header.push('\n');
    let mut bytes = b"\x93NUMPY\x01\x00".to_vec();
    bytes.extend_from_slice(&(header.len() as u16).to_le_bytes());
    bytes.extend_from_slice(header.as_bytes());
    bytes.extend_from_slice(data);
    let path = dir.join(name);
    std::fs::write(&path, bytes).unwrap();
    path.to_str().unwrap().to_owned()
}

#[test]
fn serve_refuses_a_bad_init_file_naming_it_and_flags_a_vector_does_not_have() {
    let dir = scratch("npy");
    let floats = |v: &[f32]| v.iter().flat_map(|x| x.to_le_bytes()).collect::<Vec<u8>>();
    let f4 = |n: usize| format!("{{'descr': '<f4', 'fortran_order': False, 'shape': ({n},), }}");
    let f8 = npy_file(&dir, "f8.npy", "{'descr': '<f8', 'fortran_order': False, 'shape': (2,), }", &[0; 16]);
    refused(&["serve", "--init", &f8], &["f8.npy: dtype '<f8': expected '<f4'"]);
    let two = npy_file(&dir, "2d.npy", "{'descr': '<f4', 'fortran_order': False, 'shape': (2, 2), }", &[0; 16]);
    refused(&["serve", "--init", &two], &["2d.npy: shape (2, 2): expected one dimension"]);
    let nan = npy_file(&dir, "nan.npy", &f4(3), &floats(&[0.0, 1.0, f32::NAN]));
    refused(&["serve", "--init", &nan], &["nan.npy: element 2 is NaN"]);
    let inf = npy_file(&dir, "inf.npy", &f4(2), &floats(&[f32::INFINITY, 1.0]));
    refused(&["serve", "--init", &inf], &["inf.npy: element 0 is inf"]);
    let cut = npy_file(&dir, "cut.npy", &f4(3), &floats(&[0.0, 1.0]));
    refused(&["serve", "--init", &cut], &["cut.npy: truncated: shape (3,) needs 12 bytes"]);
    let junk = dir.join("junk.npy");
    std::fs::write(&junk, b"not numpy").unwrap();
    refused(&["serve", "--init", junk.to_str().unwrap()], &["junk.npy: not a NumPy .npy file"]);
    let ok = npy_file(&dir, "ok.npy", &f4(2), &floats(&[0.5, 1.5]));
    for flag in [["--model", "mlp"], ["--target", "0.5"], ["--batch-size", "8"], ["--seed", "3"]] {
        refused(&["serve", "--init", &ok, flag[0], flag[1]], &["'--init <FILE.npy>' cannot be used with", flag[0]]);
    }
    refused(&["serve", "--init", &ok, "--init-from-worker", "--dim", "2"], &["cannot be used with"]);
    refused(&["serve", "--init-from-worker"], &["--dim <N>"]);
    refused(&["serve", "--dim", "4"], &["--init-from-worker"]);
    refused(&["serve", "--init", &ok, "--target-loss", "nan"], &["the target loss must be a finite number"]);
    std::fs::remove_dir_all(&dir).unwrap();
}

#[test]
fn resume_refuses_a_checkpoint_made_with_another_momentum_naming_both() {
    let dir = scratch("momentum");
    let path = dir.join("m.ckpt");
    let dim = 650; // the default model: softmax on the digits
    let prev = vec![0.0f32; dim];
    syncopate_adapters::tcp::checkpoint::save_with_momentum(
        &path,
        "bsp",
        syncopate::Version(3),
        &vec![0.0f32; dim],
        Some((0.5, &prev)),
    )
    .unwrap();
    let p = path.to_str().unwrap();
    refused(
        &["serve", "--resume", "--checkpoint", p],
        &["was made with momentum 0.5, this server runs --momentum 0", "m.ckpt"],
    );
    refused(&["serve", "--resume", "--checkpoint", p, "--momentum", "0.9"], &["momentum 0.5", "--momentum 0.9"]);
    std::fs::remove_dir_all(&dir).unwrap();
}

#[test]
fn train_momentum_reaches_the_server_in_the_simulator_and_in_threads() {
    let final_loss = |extra: &[&str]| -> f64 {
        let mut args = vec!["train", "--sim", "--json", "--workers", "4", "--lr", "0.05", "--steps", "50"];
        args.extend_from_slice(extra);
        let out = syncopate(&args);
        assert!(out.status.success(), "{args:?}: {}", String::from_utf8_lossy(&out.stderr));
        let summary: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
        summary["final_loss"].as_f64().unwrap()
    };
    let plain = final_loss(&[]);
    assert_eq!(final_loss(&["--momentum", "0"]), plain, "momentum 0 is plain SGD, bit for bit");
    let heavy = final_loss(&["--momentum", "0.9"]);
    assert!(heavy < 0.8 * plain, "momentum 0.9 at a small step trains faster: {heavy} vs {plain}");
    let out =
        syncopate(&["train", "--json", "--workers", "2", "--steps", "20", "--step-ms", "0.1", "--momentum", "0.5"]);
    assert!(out.status.success(), "threads: {}", String::from_utf8_lossy(&out.stderr));
    refused(&["train", "--momentum", "1"], &["momentum must be a number in [0, 1), got '1'"]);
}

#[test]
fn serve_refuses_a_bad_update_rule_flag_naming_it() {
    refused(
        &["serve", "--optimizer", "lamb"],
        &["--optimizer 'lamb': expected one of sgd, momentum, nesterov, adamw, mean"],
    );
    refused(&["serve", "--optimizer", "adamw", "--beta1", "1"], &["--beta1 must be a number in [0, 1), got 1"]);
    refused(&["serve", "--optimizer", "adamw", "--beta2", "x"], &["--beta2 must be a number, got 'x'"]);
    refused(&["serve", "--optimizer", "adamw", "--eps", "0"], &["--eps must be a finite number above 0"]);
    refused(&["serve", "--optimizer", "adamw", "--weight-decay", "nan"], &["--weight-decay must be a finite number"]);
    refused(
        &["serve", "--optimizer", "sgd", "--weight-decay", "0.1"],
        &["--weight-decay applies to rule 'adamw' only"],
    );
    refused(&["serve", "--beta1", "0.8"], &["--beta1 applies to rule 'adamw' only, not 'sgd'"]);
    refused(&["serve", "--optimizer", "adamw", "--momentum", "0.9"], &["--momentum applies to rules 'momentum' and"]);
    refused(&["serve", "--optimizer", "nesterov"], &["--momentum must be in (0, 1) for rule 'nesterov'"]);
    refused(&["serve", "--schedule", "cosine"], &["--schedule 'cosine': expected constant, step:EVERY:GAMMA"]);
    refused(&["serve", "--schedule", "step:0:0.5"], &["--schedule EVERY must be at least 1"]);
    refused(&["serve", "--schedule", "warmup-cosine:10:5"], &["--schedule TOTAL must be at least WARMUP"]);
    refused(&["serve", "--optimizer", "mean", "--schedule", "step:2:0.5"], &["--schedule is unused by rule 'mean'"]);
    refused(&["serve", "--optimizer", "mean"], &["--optimizer mean cannot be used with a built-in model"]);
    let dir = scratch("mean");
    let init = npy_file(&dir, "v.npy", "{'descr': '<f4', 'fortran_order': False, 'shape': (2,), }", &[0; 8]);
    let ckpt = dir.join("c.ckpt");
    refused(
        &["serve", "--optimizer", "mean", "--init", &init, "--checkpoint", ckpt.to_str().unwrap()],
        &["--optimizer mean cannot be used with --checkpoint"],
    );
    refused(
        &["serve", "--optimizer", "mean", "--init", &init, "--protocol", "asp"],
        &["--optimizer mean: update rule `mean` does not run under protocol `asp`"],
    );
    refused(
        &[
            "serve",
            "--optimizer",
            "mean",
            "--init",
            &init,
            "--protocol",
            "backup",
            "--backup-workers",
            "1",
            "--interrupt",
            "complete",
        ],
        &["protocol `backup with interrupt complete`"],
    );
    std::fs::remove_dir_all(&dir).unwrap();
}

#[test]
fn resume_refuses_a_checkpoint_of_another_update_rule_naming_both() {
    use syncopate::proto::{AdamW, Optimizer};
    let dir = scratch("rule");
    let path = dir.join("m.ckpt");
    let dim = 650; // the default model: softmax on the digits
    let o = Optimizer::adamw(AdamW::default());
    let state = vec![0.0f32; o.state_len(dim)];
    let stamp = syncopate_adapters::tcp::checkpoint::Stamp::default();
    syncopate_adapters::tcp::checkpoint::save_stamped(
        &path,
        "bsp",
        syncopate::Version(3),
        &vec![0.0f32; dim],
        Some((o, &state)),
        &stamp,
        0,
    )
    .unwrap();
    let p = path.to_str().unwrap();
    refused(
        &["serve", "--resume", "--checkpoint", p, "--optimizer", "nesterov", "--momentum", "0.9"],
        &["was made with update rule adamw (betas 0.9, 0.999", "this server runs nesterov 0.9", "m.ckpt"],
    );
    std::fs::remove_dir_all(&dir).unwrap();
}
