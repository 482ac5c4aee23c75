//! Real multi-process runs of the `syncopate` binary on loopback: `serve` plus `work`
//! processes train to the accuracy `train` reaches with threads, the workers taking every
//! setting from the server; a killed worker process is a lost worker (BSP reports the stall
//! naming it, ASP finishes); a wrong secret is refused with a clear line on both sides;
//! `work` emulates stragglers like `train`; SIGINT/SIGTERM on `serve` stop the run cleanly
//! with a checkpoint and a summary. Every process is bounded by a deadline and killed on
//! failure.

#[path = "procs/mod.rs"]
mod procs;

use core::time::Duration;
use procs::{Proc, serve, work};
use std::thread;
use std::time::Instant;

fn json_field(json: &str, key: &str) -> f64 {
    let v: serde_json::Value = serde_json::from_str(json.trim()).unwrap_or_else(|e| panic!("{e}: {json}"));
    v[key].as_f64().unwrap_or_else(|| panic!("no {key} in {json}"))
}

#[test]
fn every_protocol_trains_across_processes_like_threads() {
    let mut ran = Vec::new();
    for protocol in ["bsp", "asp", "ssp", "bap", "backup", "dbw", "wbsp", "grouped"] {
        let knobs = ["--protocol", protocol, "--workers", "3"];
        let mut train_args = vec!["train", "--steps", "150", "--json"];
        train_args.extend_from_slice(&knobs);
        let train = Proc::spawn(&train_args);
        let (code, out) = train.finish(Duration::from_secs(60));
        if code == 2 {
            continue; // this build's CLI does not offer the protocol yet
        }
        assert_eq!(code, 0, "train {protocol}");
        let threads = json_field(&out, "final_accuracy");
        let mut serve_args = vec!["--steps", "150", "--json", "--time-limit", "60"];
        serve_args.extend_from_slice(&knobs);
        let (server, addr) = serve(&serve_args);
        // The workers are told nothing but where the server is.
        let workers: Vec<Proc> = (0..3).map(|i| work(&addr, i, &[])).collect();
        let (code, out) = server.finish(Duration::from_secs(90));
        assert_eq!(code, 0, "serve {protocol}");
        let tcp = json_field(&out, "final_accuracy");
        for w in workers {
            let (code, out) = w.finish(Duration::from_secs(10));
            assert_eq!(code, 0, "work {protocol}");
            assert!(out.contains("stopped by the server"), "{out}");
        }
        eprintln!("{protocol}: processes {tcp:.4}, threads {threads:.4}");
        assert!(tcp > 0.8, "{protocol}: {tcp}");
        assert!((tcp - threads).abs() < 0.05, "{protocol}: processes {tcp} vs threads {threads}");
        ran.push(protocol);
    }
    assert!(ran.contains(&"bsp") && ran.contains(&"asp"), "{ran:?}");
}

#[test]
fn killed_worker_process_stalls_bsp_naming_it_and_asp_goes_on() {
    // BSP: the stall is reported, naming the killed worker; the run ends at its time limit.
    let knobs = ["--protocol", "bsp", "--workers", "3", "--stall-report", "200"];
    let mut args = vec!["--steps", "100000", "--time-limit", "4", "--json"];
    args.extend_from_slice(&knobs);
    let (server, addr) = serve(&args);
    let mut workers: Vec<Proc> = (0..3).map(|i| work(&addr, i, &[])).collect();
    server.wait_err("version", Duration::from_secs(20));
    let mut killed = workers.remove(1);
    killed.child.kill().unwrap();
    let _ = killed.child.wait();
    server.wait_err("worker 1 lost", Duration::from_secs(5));
    server.wait_err("stalled: waiting for worker 1 (1 missing)", Duration::from_secs(5));
    let (code, out) = server.finish(Duration::from_secs(20));
    assert_eq!(code, 0);
    assert!(json_field(&out, "stalls") >= 1.0);
    for w in workers {
        assert_eq!(w.finish(Duration::from_secs(10)).0, 0);
    }
    // ASP: the other workers finish the budget.
    let knobs = ["--protocol", "asp", "--workers", "3"];
    let mut args = vec!["--steps", "400", "--time-limit", "60", "--json"];
    args.extend_from_slice(&knobs);
    let (server, addr) = serve(&args);
    let mut workers: Vec<Proc> = (0..3).map(|i| work(&addr, i, &[])).collect();
    server.wait_err("version", Duration::from_secs(20));
    let mut killed = workers.remove(0);
    killed.child.kill().unwrap();
    let _ = killed.child.wait();
    let (code, out) = server.finish(Duration::from_secs(60));
    assert_eq!(code, 0);
    assert!(json_field(&out, "final_accuracy") > 0.8, "{out}");
    server_lost_one(&out);
    for w in workers {
        let (code, out) = w.finish(Duration::from_secs(10));
        assert_eq!(code, 0);
        assert!(out.contains("stopped by the server"), "{out}");
    }
}

fn server_lost_one(json: &str) {
    let v: serde_json::Value = serde_json::from_str(json.trim()).unwrap();
    assert!(v["gradients"]["accepted"].as_u64().unwrap() >= 1200, "{json}");
}

#[test]
fn wrong_secret_is_refused_on_both_sides_across_processes() {
    let dir = std::env::temp_dir().join(format!("syncopate-procs-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let (a, b) = (dir.join("a.key"), dir.join("b.key"));
    std::fs::write(&a, "server secret: 0123456789\n").unwrap();
    std::fs::write(&b, "another secret: 0123456789\n").unwrap();
    let (server, addr) = serve(&["--workers", "1", "--secret-file", a.to_str().unwrap(), "--time-limit", "20"]);
    let w = work(&addr, 0, &["--secret-file", b.to_str().unwrap()]);
    let line = w.wait_err("error:", Duration::from_secs(10));
    assert_eq!(line, "error: worker 0: refused by peer: authentication failed for worker 0: wrong shared secret");
    assert_eq!(w.finish(Duration::from_secs(10)).0, 1);
    server.wait_err("authentication failed for worker 0: wrong shared secret", Duration::from_secs(5));
    // The right secret works on the same server.
    let ok = work(&addr, 0, &["--secret-file", a.to_str().unwrap()]);
    let (code, _) = server.finish(Duration::from_secs(30));
    assert_eq!(code, 0);
    assert_eq!(ok.finish(Duration::from_secs(10)).0, 0);
    // Bad flags and files: one clear line, exit code 2.
    let p = Proc::spawn(&["serve", "--secret-file", "/nonexistent/key"]);
    assert_eq!(p.finish(Duration::from_secs(10)).0, 2);
    let p = Proc::spawn(&["serve", "--listen", "0.0.0.0:0"]);
    let err = p.wait_err("error:", Duration::from_secs(10));
    assert!(err.contains("without a shared secret"), "{err}");
    let _ = std::fs::remove_dir_all(&dir);
}

/// The grouped protocol with its group servers as their own processes: a central
/// `serve --protocol grouped --remote-groups`, two `group` processes and four `work`
/// processes, none repeating a setting, reach the accuracy `train --protocol grouped
/// --groups 2 --workers 4` reaches with threads.
#[test]
fn group_server_processes_train_like_in_process_grouped() {
    let knobs = ["--protocol", "grouped", "--groups", "2", "--workers", "4", "--lr", "0.5"];
    let mut train_args = vec!["train", "--steps", "300", "--json"];
    train_args.extend_from_slice(&knobs);
    let (code, out) = Proc::spawn(&train_args).finish(Duration::from_secs(60));
    assert_eq!(code, 0, "train grouped");
    let threads = json_field(&out, "final_accuracy");
    let mut serve_args = vec!["--steps", "300", "--json", "--time-limit", "60", "--remote-groups"];
    serve_args.extend_from_slice(&knobs);
    let (central, central_addr) = serve(&serve_args);
    let groups: Vec<(Proc, String)> = (0..2)
        .map(|g| {
            let g = g.to_string();
            let all = ["group", "--listen", "127.0.0.1:0", "--connect", &central_addr, "--group", &g];
            let p = Proc::spawn(&all);
            let addr = p.listening_addr();
            (p, addr)
        })
        .collect();
    let workers: Vec<Proc> = (0..4).map(|i| work(&groups[i as usize / 2].1, i, &[])).collect();
    let (code, out) = central.finish(Duration::from_secs(90));
    assert_eq!(code, 0, "central serve");
    let tcp = json_field(&out, "final_accuracy");
    for (g, _) in groups {
        let (code, out) = g.finish(Duration::from_secs(10));
        assert_eq!(code, 0, "group");
        assert!(out.contains("finished (UpstreamStopped)"), "{out}");
    }
    for w in workers {
        let (code, out) = w.finish(Duration::from_secs(10));
        assert_eq!(code, 0, "work");
        assert!(out.contains("stopped by the server"), "{out}");
    }
    eprintln!("grouped with group processes: {tcp:.4}, threads {threads:.4}");
    assert!(tcp > 0.9, "{tcp}");
    assert!((tcp - threads).abs() < 0.03, "processes {tcp} vs threads {threads}");
}

/// Workers learn the model, batch size and seed from the server; a worker cannot state
/// them (so they cannot differ); the id comes from a launcher's rank variable.
#[test]
fn workers_take_the_servers_settings_and_the_launchers_rank() {
    for flag in ["--seed", "--batch-size", "--protocol", "--workers", "--model", "--lr"] {
        let p = Proc::spawn(&["work", "--connect", "127.0.0.1:1", "--id", "0", flag, "3"]);
        let err = p.wait_err("error", Duration::from_secs(10));
        assert!(err.contains(&format!("unexpected argument '{flag}'")), "{err}");
        assert_eq!(p.finish(Duration::from_secs(10)).0, 2);
    }
    let p = Proc::spawn(&["serve", "--listen", "127.0.0.1:0", "--remote-groups"]);
    let err = p.wait_err("error", Duration::from_secs(10));
    assert_eq!(err, "error: --remote-groups: remote groups need the grouped protocol, not bsp");
    assert_eq!(p.finish(Duration::from_secs(10)).0, 2);
    let p = Proc::spawn(&["work", "--connect", "127.0.0.1:1"]);
    let err = p.wait_err("error", Duration::from_secs(10));
    assert!(err.starts_with("error: --id is required outside a launcher: give --id N, or set one of $RANK"), "{err}");
    assert_eq!(p.finish(Duration::from_secs(10)).0, 2);
    let p = Proc::spawn_env(&["work", "--connect", "127.0.0.1:1"], &[("SLURM_PROCID", "one")]);
    let err = p.wait_err("error", Duration::from_secs(10));
    assert!(err.contains("invalid value 'one' in $SLURM_PROCID for the worker id"), "{err}");
    assert_eq!(p.finish(Duration::from_secs(10)).0, 2);
    let p = Proc::spawn(&["work", "--connect", "127.0.0.1:1", "--id", "0", "--straggler", "0:fast=2"]);
    let err = p.wait_err("error", Duration::from_secs(10));
    assert!(err.contains("unknown straggler model 'fast'"), "{err}");
    assert_eq!(p.finish(Duration::from_secs(10)).0, 2);
    let (server, addr) =
        serve(&["--workers", "2", "--steps", "50", "--batch-size", "8", "--seed", "7", "--model", "mlp:8", "--json"]);
    let w0 = Proc::spawn_env(&["work", "--connect", &addr], &[("OMPI_COMM_WORLD_RANK", "0")]);
    let w1 = Proc::spawn_env(&["work", "--connect", &addr], &[("RANK", "1"), ("PMI_RANK", "0")]);
    let line = w1.wait_err("connected to", Duration::from_secs(20));
    assert!(line.contains("worker 1: connected") && line.contains("model mlp:8 batch 8 seed 7"), "{line}");
    let (code, out) = server.finish(Duration::from_secs(60));
    assert_eq!(code, 0);
    assert!(json_field(&out, "final_accuracy") > 0.3, "{out}");
    for w in [w0, w1] {
        assert_eq!(w.finish(Duration::from_secs(10)).0, 0);
    }
    // An id the server does not have: refused by the server, exit 2.
    let (server, addr) = serve(&["--workers", "1", "--time-limit", "10"]);
    let w = work(&addr, 9, &[]);
    let err = w.wait_err("error", Duration::from_secs(10));
    assert!(err.contains("worker id 9 is out of range: the server has one worker, id 0"), "{err}");
    assert_eq!(w.finish(Duration::from_secs(10)).0, 2);
    drop(server);
}

fn per_worker(json: &str) -> Vec<(f64, f64)> {
    let v: serde_json::Value = serde_json::from_str(json.trim()).unwrap();
    v["per_worker"]
        .as_array()
        .unwrap()
        .iter()
        .map(|w| (w["steps"].as_f64().unwrap(), w["compute_share"].as_f64().unwrap()))
        .collect()
}

/// `work --straggler` emulates the same straggler `train --straggler` does, and the
/// server's summary measures every worker's compute share; the run's clock excludes the
/// wait for the workers to connect.
#[test]
fn stragglers_emulated_by_workers_match_train_and_the_clock_starts_when_all_connected() {
    let knobs = ["--protocol", "asp", "--workers", "2", "--steps", "150", "--json"];
    let straggler = ["--straggler", "0:slow=5", "--step-ms", "4"];
    let (code, out) = Proc::spawn(&[&["train"][..], &knobs, &straggler].concat()).finish(Duration::from_secs(60));
    assert_eq!(code, 0);
    let threads = per_worker(&out);
    let (server, addr) = serve(&knobs);
    let started = Instant::now();
    thread::sleep(Duration::from_millis(1500));
    let workers: Vec<Proc> = (0..2).map(|i| work(&addr, i, &straggler)).collect();
    server.wait_err("all 2 workers connected after", Duration::from_secs(20));
    let (code, out) = server.finish(Duration::from_secs(60));
    let total = started.elapsed().as_secs_f64();
    assert_eq!(code, 0);
    for w in workers {
        assert_eq!(w.finish(Duration::from_secs(10)).0, 0);
    }
    let tcp = per_worker(&out);
    let time_s = json_field(&out, "time_s");
    eprintln!("threads {threads:?}, processes {tcp:?}, time {time_s:.2} s of {total:.2} s");
    assert!(time_s < total - 1.4, "the wait for workers is not run time: {time_s} of {total}");
    for (name, run) in [("threads", &threads), ("processes", &tcp)] {
        // Worker 0 is five times slower: it contributes far fewer of the ASP gradients.
        assert!(run[0].0 < 0.5 * run[1].0, "{name}: {run:?}");
        assert!(run.iter().all(|(_, share)| *share > 0.05), "{name}: compute share measured: {run:?}");
    }
}

/// SIGINT or SIGTERM on `serve`: the workers are stopped, the checkpoint written and the
/// summary printed; exit code 0.
#[test]
fn sigint_and_sigterm_on_serve_checkpoint_and_summarise() {
    let dir = std::env::temp_dir().join(format!("syncopate-signal-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    for signal in ["INT", "TERM"] {
        let ckpt = dir.join(format!("{signal}.ckpt"));
        let args = ["--workers", "2", "--steps", "100000000", "--json", "--checkpoint", ckpt.to_str().unwrap()];
        let (server, addr) = serve(&args);
        let workers: Vec<Proc> = (0..2).map(|i| work(&addr, i, &[])).collect();
        server.wait_err("version", Duration::from_secs(20));
        server.signal(signal);
        server.wait_err("serve: interrupted: the workers were told to stop", Duration::from_secs(10));
        let (code, out) = server.finish(Duration::from_secs(20));
        assert_eq!(code, 0, "SIG{signal}");
        assert!(json_field(&out, "updates") > 0.0, "{out}");
        assert!(std::fs::metadata(&ckpt).is_ok_and(|m| m.len() > 0), "SIG{signal}: checkpoint written");
        for w in workers {
            let (code, out) = w.finish(Duration::from_secs(10));
            assert_eq!(code, 0);
            assert!(out.contains("stopped by the server"), "{out}");
        }
    }
    let _ = std::fs::remove_dir_all(&dir);
}

/// A data file the server trains on reaches the workers as a path and a SHA-256: a worker
/// finds it at the same path (or at `--data`), and a different file is refused.
#[test]
fn a_workers_data_file_must_be_the_servers() {
    let dir = std::env::temp_dir().join(format!("syncopate-data-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let rows = |shift: f64| -> String {
        (0..60).map(|i| format!("{},{},{}\n", f64::from(i % 7) + shift, f64::from(i % 5), i % 2)).collect()
    };
    let (data, copy, other) = (dir.join("d.csv"), dir.join("copy.csv"), dir.join("other.csv"));
    std::fs::write(&data, rows(0.0)).unwrap();
    std::fs::write(&copy, rows(0.0)).unwrap();
    std::fs::write(&other, rows(1.0)).unwrap();
    let (server, addr) = serve(&["--workers", "2", "--steps", "20", "--json", "--data", data.to_str().unwrap()]);
    let bad = work(&addr, 1, &["--data", other.to_str().unwrap()]);
    let err = bad.wait_err("error", Duration::from_secs(20));
    assert!(
        err.contains(&format!("data file {} differs from the server's (SHA-256 mismatch)", other.display())),
        "{err}"
    );
    assert_eq!(bad.finish(Duration::from_secs(10)).0, 2);
    let same_path = work(&addr, 0, &[]);
    let elsewhere = work(&addr, 1, &["--data", copy.to_str().unwrap()]);
    let (code, _) = server.finish(Duration::from_secs(60));
    assert_eq!(code, 0);
    assert_eq!(same_path.finish(Duration::from_secs(10)).0, 0);
    assert_eq!(elsewhere.finish(Duration::from_secs(10)).0, 0);
    let _ = std::fs::remove_dir_all(&dir);
}
