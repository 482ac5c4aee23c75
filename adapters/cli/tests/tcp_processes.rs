//! Real multi-process runs of the `syncopate` binary on loopback: `serve` plus `work`
//! processes train to the accuracy `train` reaches with threads; a killed worker process is
//! a lost worker (BSP reports the stall naming it, ASP finishes); a wrong secret is refused
//! with a clear line on both sides. Every process is bounded by a deadline and killed on
//! failure.

use core::time::Duration;
use std::io::{BufRead, BufReader};
use std::process::{Child, Command, Stdio};
use std::sync::{Arc, Mutex};
use std::thread;
use std::time::Instant;

const BIN: &str = env!("CARGO_BIN_EXE_syncopate");

/// A child process whose stderr lines are collected; killed when dropped.
struct Proc {
    child: Child,
    err: Arc<Mutex<Vec<String>>>,
    out: Option<thread::JoinHandle<String>>,
}

impl Proc {
    fn spawn(args: &[&str]) -> Self {
        let mut child = Command::new(BIN)
            .args(args)
            .env_remove("SYNCOPATE_SECRET")
            .stdin(Stdio::null())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .expect("spawn syncopate");
        let err = Arc::new(Mutex::new(Vec::new()));
        let e2 = Arc::clone(&err);
        let stderr = child.stderr.take().unwrap();
        thread::spawn(move || {
            for line in BufReader::new(stderr).lines().map_while(Result::ok) {
                e2.lock().unwrap().push(line);
            }
        });
        let mut stdout = child.stdout.take().unwrap();
        let out = thread::spawn(move || {
            let mut s = String::new();
            let _ = std::io::Read::read_to_string(&mut stdout, &mut s);
            s
        });
        Self { child, err, out: Some(out) }
    }

    fn wait_err(&self, needle: &str, within: Duration) -> String {
        let end = Instant::now() + within;
        while Instant::now() < end {
            if let Some(l) = self.err.lock().unwrap().iter().find(|l| l.contains(needle)) {
                return l.clone();
            }
            thread::sleep(Duration::from_millis(10));
        }
        panic!("no stderr line with {needle:?} within {within:?}: {:#?}", self.err.lock().unwrap());
    }

    /// Waits for exit (bounded); returns the exit code and stdout.
    fn finish(mut self, within: Duration) -> (i32, String) {
        let end = Instant::now() + within;
        loop {
            if let Some(status) = self.child.try_wait().unwrap() {
                let out = self.out.take().unwrap().join().unwrap();
                return (status.code().unwrap_or(-1), out);
            }
            if Instant::now() >= end {
                panic!("process did not exit within {within:?}: {:#?}", self.err.lock().unwrap());
            }
            thread::sleep(Duration::from_millis(10));
        }
    }
}

impl Drop for Proc {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// Starts `serve` on an ephemeral port; returns it and its address.
fn serve(args: &[&str]) -> (Proc, String) {
    let mut all = vec!["serve", "--listen", "127.0.0.1:0"];
    all.extend_from_slice(args);
    let p = Proc::spawn(&all);
    let line = p.wait_err("listening on ", Duration::from_secs(20));
    let addr = line.split("listening on ").nth(1).unwrap().split([' ', ',']).next().unwrap().to_owned();
    (p, addr)
}

fn work(addr: &str, id: u32, args: &[&str]) -> Proc {
    let id = id.to_string();
    let mut all = vec!["work", "--connect", addr, "--id", &id, "--give-up-after", "10"];
    all.extend_from_slice(args);
    Proc::spawn(&all)
}

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
        let workers: Vec<Proc> = (0..3).map(|i| work(&addr, i, &knobs)).collect();
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
    let mut workers: Vec<Proc> = (0..3).map(|i| work(&addr, i, &knobs)).collect();
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
    let mut workers: Vec<Proc> = (0..3).map(|i| work(&addr, i, &knobs)).collect();
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
    let knobs = ["--workers", "1"];
    let (server, addr) = serve(&["--workers", "1", "--secret-file", a.to_str().unwrap(), "--time-limit", "20"]);
    let w = work(&addr, 0, &[&knobs[..], &["--secret-file", b.to_str().unwrap()]].concat());
    let line = w.wait_err("error:", Duration::from_secs(10));
    assert!(line.contains("server failed authentication for worker 0: wrong shared secret"), "{line}");
    assert_eq!(w.finish(Duration::from_secs(10)).0, 1);
    server.wait_err("refused by peer: server failed authentication", Duration::from_secs(5));
    // The right secret works on the same server.
    let ok = work(&addr, 0, &[&knobs[..], &["--secret-file", a.to_str().unwrap()]].concat());
    let (code, _) = server.finish(Duration::from_secs(30));
    assert_eq!(code, 0);
    assert_eq!(ok.finish(Duration::from_secs(10)).0, 0);
    // Bad flags and files: one clear line, exit code 2.
    let p = Proc::spawn(&["serve", "--secret-file", "/nonexistent/key"]);
    assert_eq!(p.finish(Duration::from_secs(10)).0, 2);
    let p = Proc::spawn(&["serve", "--listen", "0.0.0.0:0"]);
    let err = p.wait_err("error:", Duration::from_secs(10));
    assert!(err.contains("without a shared secret"), "{err}");
    let p = Proc::spawn(&["work", "--connect", "127.0.0.1:1", "--id", "9", "--workers", "2"]);
    let err = p.wait_err("error:", Duration::from_secs(10));
    assert!(err.contains("--id 9 is out of range"), "{err}");
    let _ = std::fs::remove_dir_all(&dir);
}

/// The grouped protocol with its group servers as their own processes: a central
/// `serve --protocol asp --workers 2`, two `group` processes and four `work` processes reach
/// the accuracy `train --protocol grouped --groups 2 --workers 4` reaches with threads.
#[test]
fn group_server_processes_train_like_in_process_grouped() {
    let knobs = ["--protocol", "grouped", "--groups", "2", "--workers", "4", "--lr", "0.5"];
    let mut train_args = vec!["train", "--steps", "300", "--json"];
    train_args.extend_from_slice(&knobs);
    let (code, out) = Proc::spawn(&train_args).finish(Duration::from_secs(60));
    assert_eq!(code, 0, "train grouped");
    let threads = json_field(&out, "final_accuracy");
    // The central learning rate per aggregate is the grouped lr: `serve` divides by G.
    let central_knobs = ["--protocol", "asp", "--workers", "2", "--lr", "1.0"];
    let mut serve_args = vec!["--steps", "300", "--json", "--time-limit", "60"];
    serve_args.extend_from_slice(&central_knobs);
    let (central, central_addr) = serve(&serve_args);
    let groups: Vec<(Proc, String)> = (0..2)
        .map(|g| {
            let g = g.to_string();
            let mut all = vec!["group", "--listen", "127.0.0.1:0", "--connect", &central_addr, "--group", &g];
            all.extend_from_slice(&knobs);
            let p = Proc::spawn(&all);
            let line = p.wait_err("listening on ", Duration::from_secs(20));
            let addr = line.split("listening on ").nth(1).unwrap().split([' ', ',']).next().unwrap().to_owned();
            (p, addr)
        })
        .collect();
    let workers: Vec<Proc> = (0..4).map(|i| work(&groups[i as usize / 2].1, i, &knobs)).collect();
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
