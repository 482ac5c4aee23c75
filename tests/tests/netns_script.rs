//! `benches/netns/run.sh` refuses to run without root and changes nothing: no `ip` or `tc`
//! call, no file written, no network namespace added; bad arguments are refused with exit
//! status 2 before the root check. Cheap (no build, no network), and needs no root: the
//! unprivileged caller is emulated by an `id` on `PATH` that says uid 1000, beside `ip`,
//! `tc` and `sudo` that record any call; where the test does run as root and `setpriv`
//! exists, the script also runs as the user `nobody` (uid 65534).
#![cfg(unix)]

use std::fs;
use std::os::unix::fs::PermissionsExt;
use std::path::{Path, PathBuf};
use std::process::{Command, Output};

fn script() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../benches/netns/run.sh")
}

/// A scratch folder holding `bin/` with the stand-ins and `work/`, the script's working
/// directory (where its default output folder would go).
struct Scratch {
    root: PathBuf,
}

impl Scratch {
    fn new(name: &str) -> Self {
        let root = std::env::temp_dir().join(format!("syncopate-netns-{name}-{}", std::process::id()));
        let _ = fs::remove_dir_all(&root);
        fs::create_dir_all(root.join("bin")).expect("scratch bin");
        fs::create_dir_all(root.join("work")).expect("scratch work");
        let log = root.join("calls.log");
        let stand_in = |tool: &str, body: &str| {
            let path = root.join("bin").join(tool);
            fs::write(&path, format!("#!/bin/sh\n{body}\n")).expect("stand-in");
            fs::set_permissions(&path, fs::Permissions::from_mode(0o755)).expect("chmod");
        };
        // `id -u` says an unprivileged user (the script asks `id` nothing else).
        stand_in("id", "if [ \"$1\" = -u ]; then echo 1000; else exit 1; fi");
        for tool in ["ip", "tc", "sudo", "modprobe", "nsenter"] {
            stand_in(tool, &format!("echo \"{tool} $*\" >> '{}'; exit 1", log.display()));
        }
        Self { root }
    }

    fn run(&self, args: &[&str]) -> Output {
        let path = format!("{}:{}", self.root.join("bin").display(), std::env::var("PATH").unwrap_or_default());
        Command::new("bash")
            .arg(script())
            .args(args)
            .current_dir(self.root.join("work"))
            .env("PATH", path)
            .output()
            .expect("run bash")
    }

    fn calls(&self) -> String {
        fs::read_to_string(self.root.join("calls.log")).unwrap_or_default()
    }

    fn written(&self) -> Vec<String> {
        fs::read_dir(self.root.join("work"))
            .expect("work dir")
            .filter_map(|e| e.ok().map(|e| e.file_name().to_string_lossy().into_owned()))
            .collect()
    }
}

impl Drop for Scratch {
    fn drop(&mut self) {
        let _ = fs::remove_dir_all(&self.root);
    }
}

fn stderr(out: &Output) -> String {
    String::from_utf8_lossy(&out.stderr).into_owned()
}

#[test]
fn without_root_it_refuses_and_changes_nothing() {
    let scratch = Scratch::new("guard");
    for args in [&[][..], &["--rates", "1gbit", "--workers", "4", "--setups", "single"][..], &["--teardown"][..]] {
        let out = scratch.run(args);
        let err = stderr(&out);
        assert_eq!(out.status.code(), Some(2), "args {args:?}: {err}");
        assert!(err.starts_with("needs root: "), "args {args:?}: {err}");
        assert_eq!(err.lines().count(), 1, "one line: {err}");
        assert!(out.stdout.is_empty(), "args {args:?}: {}", String::from_utf8_lossy(&out.stdout));
        assert_eq!(scratch.calls(), "", "args {args:?}: ip, tc or sudo was called");
        assert!(scratch.written().is_empty(), "args {args:?}: wrote {:?}", scratch.written());
    }
}

#[test]
fn bad_arguments_are_refused_before_anything_else() {
    let scratch = Scratch::new("usage");
    for (args, names) in [
        (&["--workers", "1"][..], "--workers"),
        (&["--rates", "fast"][..], "--rates"),
        (&["--d", "0"][..], "--d"),
        (&["--setups", "ring"][..], "--setups"),
        (&["--frobnicate"][..], "--frobnicate"),
        (&["--rounds"][..], "--rounds"),
    ] {
        let out = scratch.run(args);
        let err = stderr(&out);
        assert_eq!(out.status.code(), Some(2), "args {args:?}: {err}");
        assert!(err.starts_with("run.sh: ") && err.contains(names), "args {args:?}: {err}");
        assert_eq!(err.lines().count(), 1, "one line: {err}");
        assert_eq!(scratch.calls(), "", "args {args:?}: ip, tc or sudo was called");
        assert!(scratch.written().is_empty(), "args {args:?}: wrote {:?}", scratch.written());
    }
    let help = scratch.run(&["--help"]);
    assert_eq!(help.status.code(), Some(0), "{}", stderr(&help));
    assert!(String::from_utf8_lossy(&help.stdout).contains("--teardown"));
}

/// The real thing where it can be done: the script run as `nobody`.
#[test]
fn as_nobody_it_refuses_and_adds_no_namespace() {
    let root = Command::new("id").arg("-u").output().is_ok_and(|o| o.stdout.starts_with(b"0\n"));
    let setpriv = Command::new("setpriv").arg("--version").output().is_ok_and(|o| o.status.success());
    if !root || !setpriv {
        eprintln!("skipped: needs uid 0 and setpriv to become nobody (the guard is checked by the other tests)");
        return;
    }
    let namespaces = || Command::new("ip").args(["netns", "list"]).output().map(|o| o.stdout).unwrap_or_default();
    let before = namespaces();
    let out = Command::new("setpriv")
        .args(["--reuid=65534", "--regid=65534", "--clear-groups", "bash"])
        .arg(script())
        .arg("--workers")
        .arg("4")
        .current_dir("/")
        .output()
        .expect("setpriv");
    let err = stderr(&out);
    assert_eq!(out.status.code(), Some(2), "{err}");
    assert!(err.starts_with("needs root: "), "{err}");
    assert_eq!(namespaces(), before, "the namespaces changed");
    assert!(!Path::new("/target/netns").exists(), "an output folder was made");
}
