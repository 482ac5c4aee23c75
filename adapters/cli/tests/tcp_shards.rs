//! Sharded runs of the `syncopate` binary on loopback: `serve --shard I/S` processes, one per
//! shard, and `work --connect A0,A1,...` processes.
//!
//! - Every protocol of `ProtocolKind::ALL` trains digits with 2 and 3 shards: the model
//!   assembled from the shards' final checkpoints reaches the accuracy an unsharded run
//!   reaches, and the conservation ledger balances on every shard (what the workers wrote
//!   to that shard equals what it read, and its gradients are each applied, dropped, held
//!   or refused).
//! - A shard killed with SIGKILL and resumed from its checkpoint: the workers reconnect to
//!   it within their retry window, the resumed shard names exactly the versions its journal
//!   says were lost, and its ledger balances across the kill, nothing applied unaccounted.
//! - Bad input: a worker listing the shards in the wrong order, too few of them, or a shard
//!   of another run is refused at the handshake naming the shard; a model that does not
//!   split is refused at start; a checkpoint of another shard is refused at `--resume`; a
//!   shard that is gone for good ends the workers with a line naming it.
//!
//! Small model (softmax on digits), 3 workers, every process bounded by a deadline.

#[path = "../../../tests/src/ledger.rs"]
#[allow(dead_code, unreachable_pub)]
mod ledger;

#[path = "procs/mod.rs"]
mod procs;

mod resume;

use core::time::Duration;
use ledger::{Ledger, Loss};
use procs::{Proc, json, serve_as_given};
use resume::{check_ledger_across_kill, has_update, knobs, wait_for_checkpoint};
use std::path::{Path, PathBuf};
use syncopate::ProtocolKind;
use syncopate_adapters::tcp::checkpoint;
use syncopate_adapters::workload::{ModelKind, Workload};

const N: u32 = 3;

fn work(addrs: &str, id: u32, extra: &[&str]) -> Proc {
    let id = id.to_string();
    let mut args = vec!["work", "--connect", addrs, "--id", &id, "--json"];
    if !extra.contains(&"--give-up-after") {
        args.extend(["--give-up-after", "20"]);
    }
    args.extend_from_slice(extra);
    Proc::spawn(&args)
}

fn temp_dir(name: &str) -> PathBuf {
    let dir = std::env::temp_dir().join(format!("syncopate-shards-{name}-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).unwrap();
    dir
}

/// Starts `shards` shard servers with `args`, each checkpointing to `dir/k.ckpt`.
fn shards(dir: &Path, shards: u32, args: &[&str]) -> (Vec<Proc>, Vec<String>, Vec<PathBuf>) {
    let (mut procs, mut addrs, mut ckpts) = (Vec::new(), Vec::new(), Vec::new());
    for k in 0..shards {
        let ckpt = dir.join(format!("{k}.ckpt"));
        let shard = format!("{k}/{shards}");
        let mut all = vec!["--listen", "127.0.0.1:0", "--shard", &shard, "--checkpoint", ckpt.to_str().unwrap()];
        all.extend_from_slice(args);
        let (p, addr) = serve_as_given(&all);
        procs.push(p);
        addrs.push(addr);
        ckpts.push(ckpt);
    }
    (procs, addrs, ckpts)
}

/// The test accuracy of the model assembled from the shards' checkpoints.
fn assembled_accuracy(protocol: &str, ckpts: &[PathBuf]) -> f64 {
    let workload = Workload::digits(ModelKind::Softmax, 1);
    let dim = workload.model.dim();
    let mut params = Vec::with_capacity(dim);
    for (k, c) in ckpts.iter().enumerate() {
        let len = dim / ckpts.len() + usize::from(k < dim % ckpts.len());
        params.extend(checkpoint::load(c, protocol, len).unwrap_or_else(|e| panic!("{e}")).params);
    }
    workload.model.evaluate(&params, &workload.test).accuracy
}

/// One shard's ledger: what every worker wrote to it against what it read and did.
fn check_shard_ledger(protocol: &str, k: usize, summary: &serde_json::Value, reports: &[serde_json::Value]) {
    let mut ledger = Ledger::from_summary_json(&summary["gradients"]).unwrap();
    let l = &summary["ledger"];
    let written: u64 = reports
        .iter()
        .map(|r| r["shards"][k]["sent"].as_u64().unwrap() + r["shards"][k]["resent"].as_u64().unwrap())
        .sum();
    let read: u64 = ["received", "discarded", "in_flight_at_stop"].iter().map(|f| l[*f].as_u64().unwrap()).sum();
    assert_eq!(written, read, "{protocol}: shard {k}: the workers wrote {written}, the shard read {read}");
    ledger.sent = written;
    ledger.in_flight = l["in_flight_at_stop"].as_u64().unwrap();
    ledger.add_lost(Loss::Refused, l["refused"].as_u64().unwrap());
    ledger.add_lost(Loss::ConnectionLost, l["discarded"].as_u64().unwrap());
    eprintln!("{protocol}, shard {k}: {}", ledger.line());
    ledger.check().unwrap_or_else(|e| panic!("{protocol}: shard {k}: {e}"));
}

fn every_protocol_trains_over(count: u32) {
    for kind in ProtocolKind::ALL {
        let protocol = kind.as_str();
        let dir = temp_dir(&format!("{protocol}-{count}"));
        let mut args = vec!["--steps", "120", "--json", "--time-limit", "60"];
        args.extend(knobs(protocol));
        let (servers, addrs, ckpts) = shards(&dir, count, &args);
        let list = addrs.join(",");
        let workers: Vec<Proc> = (0..N).map(|i| work(&list, i, &[])).collect();
        let summaries: Vec<serde_json::Value> = servers
            .into_iter()
            .enumerate()
            .map(|(k, s)| {
                let (code, out) = s.finish(Duration::from_secs(90));
                assert_eq!(code, 0, "{protocol}: shard {k}");
                json(&out)
            })
            .collect();
        let reports: Vec<serde_json::Value> = workers
            .into_iter()
            .enumerate()
            .map(|(i, w)| {
                let (code, out) = w.finish(Duration::from_secs(30));
                assert_eq!(code, 0, "{protocol}: work {i}");
                let report = json(&out);
                assert!(report["stopped"].as_bool().unwrap(), "{protocol}: worker {i}: {report}");
                assert_eq!(report["shards"].as_array().unwrap().len(), count as usize);
                report
            })
            .collect();
        for (k, summary) in summaries.iter().enumerate() {
            assert_eq!(summary["mode"], "tcp-shard");
            check_shard_ledger(protocol, k, summary, &reports);
            // The sharded worker sends its minibatch loss with every shard's slice.
            let points = summary["loss_curve"]["points"].as_array().map_or(0, Vec::len);
            assert!(points > 0, "{protocol}: shard {k} kept no loss curve: {summary}");
        }
        let accuracy = assembled_accuracy(protocol, &ckpts);
        eprintln!("{protocol} over {count} shards: assembled model's test accuracy {accuracy:.4}");
        assert!(accuracy > 0.8, "{protocol} over {count} shards: {accuracy}");
        let _ = std::fs::remove_dir_all(&dir);
    }
}

#[test]
fn every_protocol_trains_digits_over_two_shards() {
    every_protocol_trains_over(2);
}

#[test]
fn every_protocol_trains_digits_over_three_shards() {
    every_protocol_trains_over(3);
}

/// Kills shard 1 of 2 (the last of `servers`, SIGKILL) and waits until every worker says
/// it lost the shard at `addr`.
fn kill_shard_1(servers: &mut Vec<Proc>, workers: &[Proc], addr: &str) {
    let mut killed = servers.pop().unwrap();
    killed.kill9();
    drop(killed);
    for w in workers {
        w.wait_err(&format!("shard 1 at {addr} lost"), Duration::from_secs(20));
    }
}

/// Kills shard 1 of 2 once it has checkpointed past version 4 (with a checkpoint every
/// `every` updates, and, for `every > 1`, with updates after the checkpoint), then resumes it.
fn kill_a_shard_then_resume(protocol: &'static str, every: u64) {
    let dir = temp_dir(&format!("kill-{protocol}-{every}"));
    let every_text = every.to_string();
    let mut args = vec!["--steps", "100000", "--json", "--time-limit", "60", "--checkpoint-every", &every_text];
    args.extend(knobs(protocol));
    let (mut servers, addrs, ckpts) = shards(&dir, 2, &args);
    let list = addrs.join(",");
    let workers: Vec<Proc> = (0..N).map(|i| work(&list, i, &["--step-ms", "5", "--lost-after", "3"])).collect();
    // Kill shard 1 between two checkpoints: once a checkpoint was written and updates followed.
    wait_for_checkpoint(&ckpts[1], 4, |text| every == 1 || has_update(text));
    kill_shard_1(&mut servers, &workers, &addrs[1]);
    let ck = ckpts[1].to_str().unwrap();
    let mut resume = vec!["--listen", addrs[1].as_str(), "--shard", "1/2", "--resume", "--checkpoint", ck];
    resume.extend(["--steps", "40", "--json", "--time-limit", "60"]);
    resume.extend(knobs(protocol));
    let (resumed, _) = serve_as_given(&resume);
    let line = resumed.wait_err("serve: resumed: ", Duration::from_secs(10));
    eprintln!("{protocol}: {line}");
    let (code, out) = resumed.finish(Duration::from_secs(90));
    assert_eq!(code, 0, "{protocol}: resumed shard");
    // Shard 0 goes on until the workers stop; then it is stopped by its signal handler.
    let summary = json(&out);
    let r = &summary["ledger"]["resumed"];
    let ckpt_v = r["checkpoint_version"].as_u64().unwrap();
    assert!(ckpt_v >= 4 && ckpt_v % every == 0, "{protocol}: checkpoint version {ckpt_v}");
    let at = |k: &str, i: usize| r[k][i].as_u64().unwrap();
    let lost = r["lost_contributions"].as_u64().unwrap();
    assert_eq!(
        lost,
        at("at_last_update", 2) - at("at_checkpoint", 2),
        "{protocol}: lost = applied after the checkpoint"
    );
    if let Some(first) = r["lost_versions"][0].as_u64() {
        assert_eq!(first, ckpt_v + 1, "{protocol}: the lost versions start right after the checkpoint");
        if every == 1 {
            // A checkpoint precedes every model sent: at most the update the kill cut
            // short between its journal line and its checkpoint, which no worker saw.
            assert_eq!(r["lost_versions"][1].as_u64(), Some(first), "{protocol}: one version at most");
        }
    }
    let reports: Vec<serde_json::Value> = workers
        .into_iter()
        .enumerate()
        .map(|(i, w)| {
            let (code, out) = w.finish(Duration::from_secs(40));
            assert_eq!(code, 0, "{protocol}: work {i}");
            json(&out)
        })
        .collect();
    for (i, rep) in reports.iter().enumerate() {
        assert!(rep["shards"][1]["sessions"].as_u64().unwrap() >= 2, "{protocol}: worker {i} reconnected: {rep}");
    }
    // Shard 1's ledger across the kill: what the workers wrote to it is what the resumed
    // shard did, what the killed one applied before its checkpoint or after it (lost,
    // named by the journal), dropped, held or refused, and what it never read.
    let sent: u64 = reports
        .iter()
        .map(|r| r["shards"][1]["sent"].as_u64().unwrap() + r["shards"][1]["resent"].as_u64().unwrap())
        .sum();
    check_ledger_across_kill(&summary, sent, 4 * u64::from(N), &format!("{protocol}, shard 1 killed and resumed"));
    for s in servers {
        s.signal("TERM");
        let (code, _) = s.finish(Duration::from_secs(30));
        assert_eq!(code, 0, "{protocol}: shard 0");
    }
    let _ = std::fs::remove_dir_all(&dir);
}

#[test]
fn bsp_shard_killed_and_resumed() {
    kill_a_shard_then_resume("bsp", 4);
}

#[test]
fn bsp_shard_checkpointing_every_update_killed_and_resumed() {
    kill_a_shard_then_resume("bsp", 1);
}

#[test]
fn asp_shard_killed_and_resumed() {
    kill_a_shard_then_resume("asp", 4);
}

/// The guide's recipe for a killed shard: resumed with the run's own flags, it goes on with
/// what is left of the whole run's `--steps`, and when shard 0 ends the run and the workers
/// leave, the resumed shard ends too (no worker for its `--lost-after`), though the updates
/// it lost may leave it short of its budget: every process exits on its own.
#[test]
fn a_shard_resumed_with_the_runs_own_flags_ends_with_the_run() {
    let dir = temp_dir("recipe");
    let mut args = vec!["--steps", "60", "--json", "--time-limit", "120", "--checkpoint-every", "2"];
    args.extend(["--lost-after", "2"]);
    args.extend(knobs("bsp"));
    let (mut servers, addrs, ckpts) = shards(&dir, 2, &args);
    let list = addrs.join(",");
    let workers: Vec<Proc> = (0..N).map(|i| work(&list, i, &["--step-ms", "5", "--lost-after", "3"])).collect();
    wait_for_checkpoint(&ckpts[1], 4, |_| true);
    kill_shard_1(&mut servers, &workers, &addrs[1]);
    let ck = ckpts[1].to_str().unwrap();
    let resume =
        [&["--listen", addrs[1].as_str(), "--shard", "1/2", "--resume", "--checkpoint", ck][..], &args].concat();
    let (resumed, _) = serve_as_given(&resume);
    resumed.wait_err("whole run's budget", Duration::from_secs(10));
    let (code, out) = resumed.finish(Duration::from_secs(60));
    assert_eq!(code, 0, "the resumed shard");
    let updates = json(&out)["updates"].as_u64().unwrap();
    assert!(updates <= 61, "the resumed shard went past the run's 60 steps: version {updates}");
    for (k, s) in servers.into_iter().enumerate() {
        assert_eq!(s.finish(Duration::from_secs(30)).0, 0, "shard {k}");
    }
    for (i, w) in workers.into_iter().enumerate() {
        assert_eq!(w.finish(Duration::from_secs(30)).0, 0, "work {i}");
    }
    let _ = std::fs::remove_dir_all(&dir);
}

#[test]
fn a_worker_whose_shard_list_disagrees_is_refused_naming_the_shard() {
    let dir = temp_dir("refused");
    let args = ["--steps", "100000", "--time-limit", "30", "--run-id", "one"];
    let mut all = args.to_vec();
    all.extend(knobs("bsp"));
    let (servers, addrs, _) = shards(&dir, 2, &all);
    let expect = |list: String, needle: &str| {
        let (code, _) = {
            let w = work(&list, 0, &[]);
            let line = w.wait_err(needle, Duration::from_secs(20));
            eprintln!("{line}");
            w.finish(Duration::from_secs(20))
        };
        assert_eq!(code, 2, "{needle}");
    };
    let (a0, a1) = (addrs[0].clone(), addrs[1].clone());
    expect(format!("{a1},{a0}"), &format!("shard 0 ({a1}) is shard 1 of 2: list the shards' addresses in shard order"));
    // The shard that was refused logs the same line.
    let line = servers[1].wait_err("refused by peer: shard 0 (", Duration::from_secs(10));
    assert!(line.contains("is shard 1 of 2"), "{line}");
    expect(format!("{a0},{a1},{a1}"), &format!("shard 0 ({a0}) is one of 2 shards, but --connect lists 3 addresses"));
    // An unsharded worker of a shard is told to connect to every shard.
    expect(a0.clone(), "the server is shard 0 of 2 of a sharded run: connect to every shard");
    // A shard of another run, with the same settings otherwise.
    let ckpt = dir.join("other.ckpt");
    let mut other = vec!["--listen", "127.0.0.1:0", "--shard", "1/2", "--checkpoint", ckpt.to_str().unwrap()];
    other.extend(["--steps", "100000", "--time-limit", "30", "--run-id", "two"]);
    other.extend(knobs("bsp"));
    let (_other, b1) = serve_as_given(&other);
    expect(format!("{a0},{b1}"), &format!("shard 1 ({b1}) belongs to run 'two', shard 0 to run 'one'"));
    let _ = std::fs::remove_dir_all(&dir);
}

#[test]
fn a_model_that_does_not_split_and_a_checkpoint_of_another_shard_are_refused_at_start() {
    let p = Proc::spawn(&["serve", "--listen", "127.0.0.1:0", "--model", "nqm:3", "--shard", "0/4"]);
    let line = p.wait_err("does not split", Duration::from_secs(20));
    assert!(line.contains("a model of 3 elements does not split into 4 shards"), "{line}");
    assert_eq!(p.finish(Duration::from_secs(10)).0, 2);
    // Shard 0's checkpoint offered to shard 1.
    let dir = temp_dir("wrong-ckpt");
    let mut args = vec!["--steps", "5", "--time-limit", "30"];
    args.extend(knobs("bsp"));
    let (servers, addrs, ckpts) = shards(&dir, 2, &args);
    let workers: Vec<Proc> = (0..N).map(|i| work(&addrs.join(","), i, &[])).collect();
    for s in servers {
        assert_eq!(s.finish(Duration::from_secs(60)).0, 0);
    }
    drop(workers);
    let mut resume = vec!["serve", "--listen", "127.0.0.1:0", "--shard", "1/2", "--resume"];
    resume.extend(["--checkpoint", ckpts[0].to_str().unwrap()]);
    resume.extend(knobs("bsp"));
    let p = Proc::spawn(&resume);
    let line = p.wait_err("checkpoint", Duration::from_secs(20));
    assert!(line.contains("it holds shard 0 of 2's slice, this server is shard 1 of 2"), "{line}");
    assert_eq!(p.finish(Duration::from_secs(10)).0, 2);
    let _ = std::fs::remove_dir_all(&dir);
}

#[test]
fn a_shard_gone_for_good_ends_the_workers_naming_it() {
    let dir = temp_dir("gone");
    let mut args = vec!["--steps", "100000", "--time-limit", "60"];
    args.extend(knobs("asp"));
    let (mut servers, addrs, _) = shards(&dir, 2, &args);
    let w = work(&addrs.join(","), 0, &["--give-up-after", "2"]);
    let others: Vec<Proc> = (1..N).map(|i| work(&addrs.join(","), i, &["--give-up-after", "2"])).collect();
    w.wait_err("connected to shard 1", Duration::from_secs(20));
    servers[1].kill9();
    let line = w.wait_err("is lost: cannot reach it", Duration::from_secs(30));
    assert!(line.contains(&format!("shard 1 at {} is lost", addrs[1])), "{line}");
    assert_eq!(w.finish(Duration::from_secs(10)).0, 1);
    drop(others);
    let _ = std::fs::remove_dir_all(&dir);
}

#[test]
fn every_shard_session_is_authenticated_with_the_run_secret() {
    let dir = temp_dir("secret");
    let secret = dir.join("secret");
    std::fs::write(&secret, "a secret of at least sixteen bytes").unwrap();
    #[cfg(unix)]
    {
        use std::os::unix::fs::PermissionsExt;
        std::fs::set_permissions(&secret, std::fs::Permissions::from_mode(0o600)).unwrap();
    }
    let file = secret.to_str().unwrap();
    let mut args = vec!["--steps", "30", "--json", "--time-limit", "60", "--secret-file", file];
    args.extend(knobs("bsp"));
    let (servers, addrs, _) = shards(&dir, 2, &args);
    let list = addrs.join(",");
    // A worker without the secret is refused by shard 0 and ends.
    let stranger = work(&list, 0, &[]);
    let line = stranger.wait_err("authentication", Duration::from_secs(20));
    assert!(line.contains("shard 0 at"), "{line}");
    assert_ne!(stranger.finish(Duration::from_secs(20)).0, 0);
    let workers: Vec<Proc> = (0..N).map(|i| work(&list, i, &["--secret-file", file])).collect();
    for (k, s) in servers.into_iter().enumerate() {
        assert_eq!(s.finish(Duration::from_secs(60)).0, 0, "shard {k}");
    }
    for (i, w) in workers.into_iter().enumerate() {
        let (code, out) = w.finish(Duration::from_secs(30));
        assert_eq!(code, 0, "work {i}");
        assert!(json(&out)["stopped"].as_bool().unwrap(), "worker {i}: {out}");
    }
    let _ = std::fs::remove_dir_all(&dir);
}

/// A diverging sharded BSP run ends: with a learning rate that sends the model to infinity
/// the workers' losses and gradients stop being finite, their protocol refuses to send them,
/// and each worker tells every shard so (and computes again); every shard then stops as
/// diverged instead of waiting for ever for gradients that never come.
#[test]
fn a_diverging_sharded_run_stops_as_diverged_on_every_shard() {
    let dir = temp_dir("diverged");
    let args =
        ["--protocol", "bsp", "--workers", "3", "--model", "mlp", "--lr", "1e30", "--time-limit", "600", "--json"];
    let (procs, addrs, _) = shards(&dir, 2, &args);
    let joined = addrs.join(",");
    let workers: Vec<Proc> = (0..N).map(|i| work(&joined, i, &[])).collect();
    for (k, p) in procs.into_iter().enumerate() {
        let (code, out) = p.finish(Duration::from_secs(90));
        assert_eq!(code, 0, "shard {k}: {out}");
        let summary = json(&out);
        assert!(summary["diverged"].is_string(), "shard {k}: {summary}");
    }
    for (i, w) in workers.into_iter().enumerate() {
        let (code, out) = w.finish(Duration::from_secs(30));
        assert_eq!(code, 0, "worker {i}: {out}");
    }
    let _ = std::fs::remove_dir_all(&dir);
}

#[test]
fn shards_speak_one_wire_a_worker_takes_it_and_a_shard_of_another_is_refused() {
    let dir = temp_dir("wire");
    let mut all = vec!["--steps", "30", "--time-limit", "60", "--run-id", "w", "--wire", "bf16"];
    all.extend(knobs("bsp"));
    let (servers, addrs, _) = shards(&dir, 2, &all);
    let list = addrs.join(",");
    let workers: Vec<Proc> = (0..N).map(|i| work(&list, i, &[])).collect();
    for w in workers {
        let lines = w.lines();
        let (code, _) = w.finish(Duration::from_secs(60));
        assert_eq!(code, 0, "{lines:#?}");
    }
    for s in servers {
        assert_eq!(s.finish(Duration::from_secs(30)).0, 0);
    }
    // Shard 1 speaking f32 beside a bf16 shard 0: the worker takes shard 0's and is refused.
    let (ck0, ck1) = (dir.join("a.ckpt"), dir.join("b.ckpt"));
    let base = ["--steps", "100000", "--time-limit", "30", "--run-id", "x"];
    let mut zero = vec!["--listen", "127.0.0.1:0", "--shard", "0/2", "--checkpoint", ck0.to_str().unwrap()];
    zero.extend(base.iter().chain(&["--wire", "bf16"]).chain(knobs("bsp").iter()));
    let mut one = vec!["--listen", "127.0.0.1:0", "--shard", "1/2", "--checkpoint", ck1.to_str().unwrap()];
    one.extend(base.iter().chain(knobs("bsp").iter()));
    let ((_s0, a0), (s1, a1)) = (serve_as_given(&zero), serve_as_given(&one));
    let w = work(&format!("{a0},{a1}"), 0, &[]);
    w.wait_err("worker asks for bf16, server speaks f32", Duration::from_secs(20));
    assert_eq!(w.finish(Duration::from_secs(20)).0, 2);
    s1.wait_err("worker asks for bf16, server speaks f32 (worker 0)", Duration::from_secs(10));
    let _ = std::fs::remove_dir_all(&dir);
}
