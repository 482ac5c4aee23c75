//! A `syncopate` child process for the process tests: its stderr lines are collected, its
//! stdout kept; killed when dropped.

#![allow(dead_code, unreachable_pub)]

use core::time::Duration;
use std::io::{BufRead, BufReader};
use std::process::{Child, Command, Stdio};
use std::sync::{Arc, Mutex};
use std::thread;
use std::time::Instant;

pub const BIN: &str = env!("CARGO_BIN_EXE_syncopate");

/// A child process whose stderr lines are collected; killed when dropped.
pub struct Proc {
    pub child: Child,
    err: Arc<Mutex<Vec<String>>>,
    err_reader: Option<thread::JoinHandle<()>>,
    out: Option<thread::JoinHandle<String>>,
}

impl Proc {
    pub fn spawn(args: &[&str]) -> Self {
        Self::spawn_env(args, &[])
    }

    pub fn spawn_env(args: &[&str], env: &[(&str, &str)]) -> Self {
        let mut command = Command::new(BIN);
        for var in ["SYNCOPATE_SECRET", "RANK", "OMPI_COMM_WORLD_RANK", "SLURM_PROCID", "PMI_RANK"] {
            command.env_remove(var);
        }
        let mut child = command
            .args(args)
            .envs(env.iter().copied())
            .stdin(Stdio::null())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .expect("spawn syncopate");
        let err = Arc::new(Mutex::new(Vec::new()));
        let e2 = Arc::clone(&err);
        let stderr = child.stderr.take().unwrap();
        let err_reader = thread::spawn(move || {
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
        Self { child, err, err_reader: Some(err_reader), out: Some(out) }
    }

    /// The address a `serve` or `group` process listens on, from its `listening on ADDR`
    /// line (waited for up to 30 s).
    pub fn listening_addr(&self) -> String {
        let line = self.wait_err("listening on ", Duration::from_secs(30));
        let after = line.split("listening on ").nth(1).unwrap_or_default();
        after.split([' ', ',']).next().unwrap_or_default().to_owned()
    }

    pub fn wait_err(&self, needle: &str, within: Duration) -> String {
        let end = Instant::now() + within;
        while Instant::now() < end {
            if let Some(l) = self.err.lock().unwrap().iter().find(|l| l.contains(needle)) {
                return l.clone();
            }
            thread::sleep(Duration::from_millis(10));
        }
        panic!("no stderr line with {needle:?} within {within:?}: {:#?}", self.err.lock().unwrap());
    }

    /// Sends `signal` (`INT`, `TERM`) to the process.
    pub fn signal(&self, signal: &str) {
        let status = Command::new("kill").args([&format!("-{signal}"), &self.child.id().to_string()]).status();
        assert!(status.is_ok_and(|s| s.success()), "kill -{signal}");
    }

    /// Waits for exit (bounded); returns the exit code and stdout.
    pub fn finish(mut self, within: Duration) -> (i32, String) {
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

impl Proc {
    /// The stderr lines so far.
    pub fn lines(&self) -> Vec<String> {
        self.err.lock().unwrap().clone()
    }

    /// SIGKILL, and wait for the process to be gone (and every stderr line it wrote read).
    pub fn kill9(&mut self) {
        self.child.kill().unwrap();
        let _ = self.child.wait();
        self.read_all_of_stderr();
    }

    /// Waits (bounded) for the process to exit on its own, then until every stderr line it
    /// wrote is read; true if it exited.
    pub fn wait_exit(&mut self, within: Duration) -> bool {
        let end = Instant::now() + within;
        while self.child.try_wait().unwrap().is_none() {
            if Instant::now() >= end {
                return false;
            }
            thread::sleep(Duration::from_millis(10));
        }
        self.read_all_of_stderr();
        true
    }

    /// Once the process is gone: waits until its stderr reader has read the last line.
    fn read_all_of_stderr(&mut self) {
        if let Some(reader) = self.err_reader.take() {
            let _ = reader.join();
        }
    }

    /// The session epochs a `work` process logged.
    pub fn epochs(&self) -> Vec<u32> {
        self.lines()
            .iter()
            .filter_map(|l| l.split("(epoch ").nth(1))
            .filter_map(|r| r.split(',').next()?.parse().ok())
            .collect()
    }
}

impl Drop for Proc {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// Starts `serve` on an ephemeral port with `args`; returns it and its address.
pub fn serve(args: &[&str]) -> (Proc, String) {
    serve_as_given(&[&["--listen", "127.0.0.1:0"][..], args].concat())
}

/// Starts `serve` with exactly `args` (which name its `--listen` address); returns it and
/// the address it listens on.
pub fn serve_as_given(args: &[&str]) -> (Proc, String) {
    let p = Proc::spawn(&[&["serve"][..], args].concat());
    let addr = p.listening_addr();
    (p, addr)
}

/// A summary printed with `--json`.
pub fn json(out: &str) -> serde_json::Value {
    serde_json::from_str(out.trim()).unwrap_or_else(|e| panic!("{e}: {out}"))
}

/// Starts `work` as worker `id` of the server at `addr` with `args` (giving up after 10 s
/// without a server).
pub fn work(addr: &str, id: u32, args: &[&str]) -> Proc {
    let id = id.to_string();
    let mut all = vec!["work", "--connect", addr, "--id", &id, "--give-up-after", "10"];
    all.extend_from_slice(args);
    Proc::spawn(&all)
}
