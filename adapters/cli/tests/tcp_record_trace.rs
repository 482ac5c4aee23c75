//! `serve --record-trace`: the workers' measured step times, with each gradient's loss and
//! norms, become a trace that `advise` and `compare` read; the flag's refusals.

mod procs;

use core::time::Duration;
use procs::{Proc, serve, work};
use std::path::PathBuf;
use std::process::Command;
use syncopate_adapters::trace;

fn scratch(name: &str) -> PathBuf {
    let dir = std::env::temp_dir().join(format!("syncopate-record-trace-{name}-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    dir
}

fn syncopate(args: &[&str]) -> std::process::Output {
    Command::new(env!("CARGO_BIN_EXE_syncopate")).args(args).output().unwrap()
}

/// A BSP run of 4 `work` processes on the noisy quadratic model, worker 3 emulating a
/// machine 4 times slower: every gradient the server received is a row with its worker's
/// own step time (at least the emulated one), its loss, its norm and the norm of the mean
/// of the 4 gradients of its version; `advise` reads the trace, estimates the noise scale
/// from it and ranks protocols on it.
#[test]
fn serve_records_every_workers_step_times_and_gradient_columns_for_advise() {
    let dir = scratch("bsp");
    let path = dir.join("served.csv");
    let t = path.to_str().unwrap();
    let knobs = ["--protocol", "bsp", "--workers", "4", "--model", "nqm:100", "--batch-size", "16", "--lr", "0.05"];
    let (server, addr) = serve(&[&knobs[..], &["--steps", "40", "--json", "--record-trace", t]].concat());
    let emulate = ["--step-ms", "5", "--straggler", "3:slow=4"];
    let workers: Vec<Proc> = (0..4).map(|i| work(&addr, i, &emulate)).collect();
    let (code, out) = server.finish(Duration::from_secs(120));
    assert_eq!(code, 0, "{out}");
    for w in workers {
        assert_eq!(w.finish(Duration::from_secs(30)).0, 0);
    }
    let summary: serde_json::Value = serde_json::from_str(out.lines().last().unwrap()).unwrap();
    let received = summary["ledger"]["received"].as_u64().unwrap();
    // The straggler report names worker 3 and accounts for every gradient.
    let stragglers = summary["stragglers"].as_array().unwrap_or_else(|| panic!("{summary}"));
    assert_eq!(stragglers.len(), 4, "{summary}");
    assert!(stragglers[3]["ratio"].as_f64().unwrap() > 1.5, "{summary}");
    assert!(stragglers[..3].iter().all(|r| r["ratio"].as_f64().unwrap() < 1.5), "{summary}");
    let sum = |k: &str| stragglers.iter().map(|r| r[k].as_u64().unwrap()).sum::<u64>();
    let g = &summary["gradients"];
    let totals = [g["applied"].as_u64(), g["dropped"].as_u64(), g["held_at_stop"].as_u64()];
    assert_eq!([Some(sum("applied")), Some(sum("dropped")), Some(sum("held"))], totals, "{summary}");
    let rows = trace::read_lines_with_stats(&path).unwrap();
    assert_eq!(rows.len() as u64, received, "one row per gradient received");
    for w in 0..4u32 {
        let mine: Vec<_> = rows.iter().filter(|(_, s, _)| s.worker == w).collect();
        assert!(mine.len() >= 40, "worker {w}: {} rows", mine.len());
        let steps: Vec<u64> = mine.iter().map(|(_, s, _)| s.step).collect();
        assert_eq!(steps, (0..mine.len() as u64).collect::<Vec<_>>(), "worker {w}'s steps in order");
        // The emulated step time is a lower bound of the measured one.
        let least = if w == 3 { 0.020 } else { 0.005 };
        assert!(mine.iter().all(|(_, s, _)| s.seconds >= least), "worker {w}: {:?}", mine[0]);
    }
    // BSP: the gradients of one version share a model, so each mean holds all 4.
    assert!(rows.iter().all(|(_, _, g)| g.loss.is_some() && g.grad_norm.is_some()), "{:?}", rows[0]);
    let full = rows.iter().filter(|(_, _, g)| g.mean_of == 4).count();
    assert!(full * 10 >= rows.len() * 9, "{full} of {} rows in a group of 4", rows.len());
    let advise =
        syncopate(&["advise", "--trace", t, "--truncate", "--seeds", "2", "--no-noise-sweep", "--no-phases", "--json"]);
    assert!(advise.status.success(), "{}", String::from_utf8_lossy(&advise.stderr));
    let v: serde_json::Value = serde_json::from_str(String::from_utf8_lossy(&advise.stdout).trim()).unwrap();
    assert_eq!(v["noise_from_trace"], true, "{v}");
    assert!(v["measured_noise"]["estimated"]["gradients"].as_f64().unwrap() > 0.0, "{v}");
    std::fs::remove_dir_all(&dir).ok();
}

/// A server killed with SIGKILL while recording leaves the rows it had written (at least
/// every 2 s): each worker's first steps, whole lines, which `advise --truncate` reads.
#[test]
fn a_killed_server_leaves_the_rows_recorded_before_the_kill() {
    let dir = scratch("killed");
    let path = dir.join("served.csv");
    let t = path.to_str().unwrap();
    let knobs = ["--protocol", "bsp", "--workers", "2", "--model", "nqm:100", "--batch-size", "16", "--lr", "0.05"];
    let (mut server, addr) = serve(&[&knobs[..], &["--steps", "100000", "--record-trace", t]].concat());
    let workers: Vec<Proc> = (0..2).map(|i| work(&addr, i, &["--step-ms", "5"])).collect();
    server.wait_err("connected after", Duration::from_secs(30));
    std::thread::sleep(Duration::from_secs(5));
    server.kill9();
    drop(workers);
    let rows = trace::read_lines_with_stats(&path).unwrap_or_else(|e| panic!("the killed server's trace: {e}"));
    for w in 0..2u32 {
        let mine: Vec<u64> = rows.iter().filter(|(_, s, _)| s.worker == w).map(|(_, s, _)| s.step).collect();
        assert!(mine.len() >= 10, "worker {w}: {} rows written before the kill", mine.len());
        assert_eq!(mine, (0..mine.len() as u64).collect::<Vec<_>>(), "worker {w}'s first steps");
    }
    let advise = syncopate(&["advise", "--trace", t, "--truncate", "--seeds", "2", "--no-noise-sweep", "--no-phases"]);
    assert!(advise.status.success(), "{}", String::from_utf8_lossy(&advise.stderr));
    std::fs::remove_dir_all(&dir).ok();
}

/// Every checkpoint writes out the trace: a server killed right after one (long before
/// the 2 s flush) leaves a row for every gradient the checkpoint's model holds.
#[test]
fn a_server_killed_after_a_checkpoint_leaves_every_row_its_model_holds() {
    let dir = scratch("checkpoint");
    let (path, ckpt) = (dir.join("served.csv"), dir.join("m.ckpt"));
    let (t, c) = (path.to_str().unwrap(), ckpt.to_str().unwrap());
    let knobs = ["--protocol", "bsp", "--workers", "2", "--model", "nqm:100", "--batch-size", "16", "--lr", "0.05"];
    let files = ["--record-trace", t, "--checkpoint", c, "--checkpoint-every", "3"];
    let (mut server, addr) = serve(&[&knobs[..], &["--steps", "100000"], &files[..]].concat());
    let _workers: Vec<Proc> = (0..2).map(|i| work(&addr, i, &["--step-ms", "60"])).collect();
    let end = std::time::Instant::now() + Duration::from_secs(60);
    let version = loop {
        assert!(std::time::Instant::now() < end, "no checkpoint at version 12 within 60 s");
        match syncopate_adapters::tcp::checkpoint::load(&ckpt, "bsp", 100) {
            Ok(k) if k.version.0 >= 12 => break k.version.0,
            _ => std::thread::sleep(Duration::from_millis(2)),
        }
    };
    server.kill9();
    let rows = trace::read_lines_with_stats(&path).unwrap_or_else(|e| panic!("the killed server's trace: {e}"));
    // BSP over 2 workers: each of the checkpoint's `version` updates applied 2 gradients.
    assert!(rows.len() as u64 >= 2 * version, "{} rows for a checkpoint at version {version}", rows.len());
    std::fs::remove_dir_all(&dir).ok();
}

/// Under ASP the worker 4 times slower sends about a quarter as many gradients, each row a
/// gradient on a model of its own, and `advise` reads the unequal table with --truncate.
#[test]
fn an_asp_trace_counts_each_workers_own_steps() {
    let dir = scratch("asp");
    let path = dir.join("asp.csv");
    let t = path.to_str().unwrap();
    let knobs = ["--protocol", "asp", "--workers", "2", "--steps", "60", "--record-trace", t];
    let (server, addr) = serve(&knobs);
    let emulate = ["--step-ms", "4", "--straggler", "1:slow=4"];
    let workers: Vec<Proc> = (0..2).map(|i| work(&addr, i, &emulate)).collect();
    server.wait_err("steps to the trace", Duration::from_secs(120));
    let (code, out) = server.finish(Duration::from_secs(30));
    assert_eq!(code, 0, "{out}");
    for w in workers {
        assert_eq!(w.finish(Duration::from_secs(30)).0, 0);
    }
    let rows = trace::read_lines_with_stats(&path).unwrap();
    let count = |w: u32| rows.iter().filter(|(_, s, _)| s.worker == w).count();
    assert!(count(0) > 2 * count(1), "fast {} slow {}", count(0), count(1));
    assert!(rows.iter().filter(|(_, s, _)| s.worker == 1).all(|(_, s, _)| s.seconds >= 0.016));
    // The built-in workers report their minibatch loss with each gradient.
    assert!(rows.iter().all(|(_, _, g)| g.grad_norm.is_some() && g.loss.is_some()), "{:?}", rows[0]);
    // Under ASP each gradient has a model of its own: no mean of several.
    assert!(rows.iter().filter(|(_, _, g)| g.mean_of > 1).count() * 2 < rows.len());
    let advise = syncopate(&["advise", "--trace", t, "--truncate", "--seeds", "2", "--no-noise-sweep", "--no-phases"]);
    assert!(advise.status.success(), "{}", String::from_utf8_lossy(&advise.stderr));
    std::fs::remove_dir_all(&dir).ok();
}

/// `--record-trace` with a shard or remote groups, or to a file that cannot be created, is
/// a usage error naming the reason.
#[test]
fn record_trace_refusals_name_the_reason() {
    let cases: [(&[&str], &str); 3] = [
        (&["--model", "nqm:3", "--shard", "0/2", "--record-trace", "t.csv"], "--shard"),
        (
            &["--protocol", "grouped", "--groups", "2", "--workers", "4", "--remote-groups", "--record-trace", "t.csv"],
            "--remote-groups",
        ),
        (&["--record-trace", "/nonexistent/dir/t.csv"], "cannot create the trace file"),
    ];
    for (args, needle) in cases {
        let mut all = vec!["serve", "--listen", "127.0.0.1:0"];
        all.extend_from_slice(args);
        let out = syncopate(&all);
        let err = String::from_utf8_lossy(&out.stderr);
        assert_eq!(out.status.code(), Some(2), "{args:?}: {err}");
        assert!(err.contains(needle), "{args:?}: {err}");
    }
}
