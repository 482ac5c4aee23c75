//! Real MPI jobs of the `syncopate` binary under `mpirun` (built with the `mpi` feature; CI
//! installs OpenMPI): BSP, backup, DBW and WBSP train digits to 0.90 on 5 ranks; a stopped
//! worker rank of a backup run becomes a lost worker and the run finishes; a step longer
//! than `--lost-after` does not lose its rank; a frozen rank declared lost rejoins and is
//! counted back; two ranks frozen together are both lost, rejoin, and every protocol
//! finishes; every protocol trains digits on 2 and 3 shards with every shard's ledger
//! balanced, and a lost shard stops the run naming it; a killed worker rank ends the job
//! with mpirun naming the rank; a rank with other settings and a wrong number of ranks are
//! refused with one clear line. Every job is bounded by a deadline. Built without the
//! feature, `syncopate mpi` says how to enable it and exits with 2.

/// Bad flags are refused before MPI starts, with or without the feature.
#[test]
fn bad_flags_are_refused_with_one_line() {
    for (args, needle) in [
        (&["mpi", "--sim"][..], "use `syncopate train --sim`"),
        (&["mpi", "--lost-after", "0"][..], "invalid value '0' for '--lost-after'"),
        (&["mpi", "--record-trace", "t.csv"][..], "--record-trace is not supported"),
        (&["mpi", "--target", "2"][..], "invalid value '2' for '--target'"),
        (&["mpi", "--shards", "0"][..], "invalid value '0' for '--shards'"),
        (&["mpi", "--shards", "2", "--colocate-shards"][..], "--colocate-shards applies to `syncopate train --sim`"),
    ] {
        let out = std::process::Command::new(env!("CARGO_BIN_EXE_syncopate")).args(args).output().expect("run");
        let err = String::from_utf8_lossy(&out.stderr);
        assert_eq!(out.status.code(), Some(2), "{args:?}: {err}");
        assert_eq!(err.lines().count(), 1, "{args:?}: {err}");
        assert!(err.contains(needle), "{args:?}: {err}");
    }
}

#[cfg(not(feature = "mpi"))]
#[test]
fn without_the_feature_mpi_says_how_to_enable_it() {
    let out = std::process::Command::new(env!("CARGO_BIN_EXE_syncopate"))
        .args(["mpi", "--workers", "4"])
        .output()
        .expect("run syncopate");
    assert_eq!(out.status.code(), Some(2));
    let err = String::from_utf8_lossy(&out.stderr);
    assert_eq!(err.lines().count(), 1, "{err}");
    assert!(err.contains("built without MPI support") && err.contains("--features mpi"), "{err}");
}

#[cfg(feature = "mpi")]
mod with_mpi {
    use core::time::Duration;
    use std::io::{BufRead, BufReader, Read};
    use std::process::{Child, Command, Stdio};
    use std::sync::{Arc, Mutex, MutexGuard, PoisonError};
    use std::thread;
    use std::time::Instant;

    const BIN: &str = env!("CARGO_BIN_EXE_syncopate");

    /// One MPI job at a time: the machine's cores are shared by every rank.
    static ONE_JOB: Mutex<()> = Mutex::new(());

    fn one_job() -> MutexGuard<'static, ()> {
        ONE_JOB.lock().unwrap_or_else(PoisonError::into_inner)
    }

    fn signal(pid: u32, sig: &str) {
        let ok = Command::new("kill").args([sig, &pid.to_string()]).status().is_ok_and(|s| s.success());
        assert!(ok, "kill {sig} {pid} failed");
    }

    /// The `mpirun` options of every job: oversubscribe the cores, allow root (CI runs as root).
    fn mpirun_base() -> Command {
        let mut cmd = Command::new("mpirun");
        cmd.args(["--oversubscribe", "--allow-run-as-root", "--mca", "btl_vader_single_copy_mechanism", "none"]);
        cmd
    }

    /// An `mpirun` job whose stderr lines are collected; ended (SIGTERM, then SIGKILL) when dropped.
    struct Job {
        child: Child,
        err: Arc<Mutex<Vec<String>>>,
        out: Option<thread::JoinHandle<String>>,
    }

    impl Job {
        /// `mpirun -n ranks syncopate mpi ARGS`.
        fn spawn(ranks: u32, args: &[&str]) -> Self {
            Self::spawn_env(ranks, args, &[])
        }

        /// [`Job::spawn`] with `env` set for every rank.
        fn spawn_env(ranks: u32, args: &[&str], env: &[(&str, &str)]) -> Self {
            let mut cmd = mpirun_base();
            cmd.args(["-n", &ranks.to_string(), BIN, "mpi"]).args(args);
            cmd.envs(env.iter().copied());
            Self::start(cmd)
        }

        fn start(mut cmd: Command) -> Self {
            let mut child =
                cmd.stdin(Stdio::null()).stdout(Stdio::piped()).stderr(Stdio::piped()).spawn().expect("spawn mpirun");
            let err = Arc::new(Mutex::new(Vec::new()));
            let lines = Arc::clone(&err);
            let stderr = child.stderr.take().expect("stderr");
            thread::spawn(move || {
                for line in BufReader::new(stderr).lines().map_while(Result::ok) {
                    lines.lock().unwrap_or_else(PoisonError::into_inner).push(line);
                }
            });
            let mut stdout = child.stdout.take().expect("stdout");
            let out = thread::spawn(move || {
                let mut s = String::new();
                let _ = stdout.read_to_string(&mut s);
                s
            });
            Self { child, err, out: Some(out) }
        }

        fn stderr(&self) -> Vec<String> {
            self.err.lock().unwrap_or_else(PoisonError::into_inner).clone()
        }

        fn wait_err(&self, needle: &str, within: Duration) -> String {
            let end = Instant::now() + within;
            while Instant::now() < end {
                if let Some(l) = self.stderr().into_iter().find(|l| l.contains(needle)) {
                    return l;
                }
                thread::sleep(Duration::from_millis(10));
            }
            panic!("no stderr line with {needle:?} within {within:?}: {:#?}", self.stderr());
        }

        /// The pid of worker rank `rank`, from its start-up line.
        fn pid_of(&self, rank: u32) -> u32 {
            self.pid_from(&format!("mpi: rank {rank} (worker {}) pid ", rank - 1))
        }

        /// The pid of the worker on rank `rank` (after the shards), from its start-up line.
        fn pid_of_rank(&self, rank: u32) -> u32 {
            self.pid_from(&format!("mpi: rank {rank} (worker "))
        }

        /// The pid at the end of the first stderr line with `needle`.
        fn pid_from(&self, needle: &str) -> u32 {
            let line = self.wait_err(needle, Duration::from_secs(60));
            line.rsplit(' ').next().and_then(|p| p.parse().ok()).expect("a pid")
        }

        /// Waits for exit (bounded); returns the exit code, stdout and the stderr lines.
        fn finish(mut self, within: Duration) -> (i32, String, Vec<String>) {
            let end = Instant::now() + within;
            loop {
                if let Some(status) = self.child.try_wait().expect("try_wait") {
                    let out = self.out.take().expect("stdout thread").join().expect("stdout");
                    return (status.code().unwrap_or(-1), out, self.stderr());
                }
                assert!(Instant::now() < end, "mpirun did not exit within {within:?}: {:#?}", self.stderr());
                thread::sleep(Duration::from_millis(20));
            }
        }

        /// Waits for a failed exit (bounded; a success fails the test); returns the stderr lines.
        fn refused(self, within: Duration) -> Vec<String> {
            let (code, out, err) = self.finish(within);
            assert_ne!(code, 0, "{out} {err:#?}");
            err
        }
    }

    /// The first `error: ` line of `err`.
    fn error_line(err: &[String]) -> &str {
        err.iter().find(|l| l.starts_with("error: ")).unwrap_or_else(|| panic!("{err:#?}"))
    }

    impl Drop for Job {
        fn drop(&mut self) {
            if matches!(self.child.try_wait(), Ok(None)) {
                // mpirun ends every rank on SIGTERM; SIGKILL would orphan them.
                let _ = Command::new("kill").args(["-TERM", &self.child.id().to_string()]).status();
                let end = Instant::now() + Duration::from_secs(10);
                while matches!(self.child.try_wait(), Ok(None)) && Instant::now() < end {
                    thread::sleep(Duration::from_millis(50));
                }
                let _ = self.child.kill();
                let _ = self.child.wait();
            }
        }
    }

    fn summary(out: &str) -> serde_json::Value {
        let line = out.lines().find(|l| l.starts_with('{')).unwrap_or_else(|| panic!("no JSON summary in {out:?}"));
        serde_json::from_str(line).expect("summary JSON")
    }

    /// Trains digits with `protocol` (and `extra` flags) on 4 worker ranks; returns the summary.
    fn train(protocol: &str, extra: &[&str]) -> serde_json::Value {
        let _job = one_job();
        let mut args = vec!["--protocol", protocol, "--workers", "4", "--steps", "300", "--step-ms", "2", "--json"];
        args.extend_from_slice(extra);
        let job = Job::spawn(5, &args);
        let (code, out, _) = job.finish(Duration::from_secs(240));
        assert_eq!(code, 0, "{protocol}: {out}");
        let s = summary(&out);
        assert_eq!(
            (s["mode"].as_str(), s["protocol"].as_str(), s["workers"].as_u64()),
            (Some("mpi"), Some(protocol), Some(4))
        );
        s
    }

    fn assert_trained(s: &serde_json::Value) {
        let accuracy = s["final_accuracy"].as_f64().expect("accuracy");
        assert!(accuracy >= 0.90, "final accuracy {accuracy}: {s}");
        assert!(s["gradients"]["accepted"].as_u64().expect("accepted") >= 4 * 300, "{s}");
        let steps: Vec<u64> =
            s["per_worker"].as_array().expect("per_worker").iter().map(|w| w["steps"].as_u64().unwrap_or(0)).collect();
        assert!(steps.iter().all(|n| *n > 0), "every worker rank reported its steps: {steps:?}");
        assert_loss_curve_falls(s);
    }

    /// The worker ranks report their minibatch losses: the summary's loss curve has a point
    /// per update and its final 10-update mean is below the first update's loss.
    fn assert_loss_curve_falls(s: &serde_json::Value) {
        let curve = &s["loss_curve"];
        let points = curve["points"].as_array().expect("a loss curve from the reported losses");
        assert!(points.len() >= 10, "{curve}");
        let first = points[0]["loss"].as_f64().expect("a loss");
        let last = curve["final_mean_loss"].as_f64().expect("a final mean loss");
        assert!(last < first, "the reported loss fell from {first} to {last}");
    }

    #[test]
    fn bsp_trains_digits_over_mpi() {
        let s = train("bsp", &[]);
        assert_trained(&s);
        assert_eq!(s["gradients"]["dropped"].as_u64(), Some(0), "BSP drops nothing: {s}");
    }

    /// `--momentum` reaches every shard's server: with a small step, momentum 0.9 (an
    /// effective step ten times larger once the velocity builds) ends at a lower loss than
    /// plain SGD from the same start.
    #[test]
    fn momentum_is_applied_by_the_mpi_server() {
        let loss = |momentum: &str| {
            let _job = one_job();
            let args = [
                "--protocol",
                "bsp",
                "--workers",
                "2",
                "--steps",
                "40",
                "--lr",
                "0.01",
                "--momentum",
                momentum,
                "--json",
            ];
            let (code, out, _) = Job::spawn(3, &args).finish(Duration::from_secs(120));
            assert_eq!(code, 0, "momentum {momentum}: {out}");
            summary(&out)["final_loss"].as_f64().expect("final_loss")
        };
        let (plain, heavy) = (loss("0"), loss("0.9"));
        assert!(heavy < 0.8 * plain, "momentum 0.9 ends at loss {heavy}, plain SGD at {plain}");
    }

    #[test]
    fn backup_trains_digits_over_mpi() {
        assert_trained(&train("backup", &["--backup-workers", "1", "--straggler", "3:slow=4"]));
    }

    #[test]
    fn dbw_trains_digits_over_mpi() {
        assert_trained(&train("dbw", &["--straggler", "all:exp=1/1"]));
    }

    #[test]
    fn wbsp_trains_digits_over_mpi() {
        assert_trained(&train("wbsp", &[]));
    }

    #[test]
    fn a_stopped_worker_rank_is_lost_and_the_backup_run_finishes() {
        let _job = one_job();
        let args =
            ["--protocol", "backup", "--backup-workers", "1", "--workers", "4", "--steps", "300", "--step-ms", "5"];
        let job = Job::spawn(5, &[&args[..], &["--lost-after", "1", "--json"]].concat());
        let pid = job.pid_of(3);
        thread::sleep(Duration::from_millis(500));
        // The rank stops participating: alive for MPI (so the job goes on), silent for the server.
        signal(pid, "-STOP");
        job.wait_err("rank 3 (worker 2) silent", Duration::from_secs(60));
        job.wait_err("mpi: finished (Budget)", Duration::from_secs(180));
        // Let it go: it gets the Stop rank 0 sent it, and the job ends cleanly.
        signal(pid, "-CONT");
        let (code, out, _) = job.finish(Duration::from_secs(60));
        assert_eq!(code, 0, "{out}");
        let s = summary(&out);
        assert!(s["gradients"]["accepted"].as_u64().expect("accepted") >= 4 * 300, "{s}");
        let steps: Vec<u64> =
            s["per_worker"].as_array().expect("per_worker").iter().map(|w| w["steps"].as_u64().unwrap_or(0)).collect();
        assert_eq!(steps[2], 0, "the lost rank's tally is not counted: {steps:?}");
        assert!(s["final_accuracy"].as_f64().expect("accuracy") >= 0.90, "{s}");
    }

    fn per_worker_steps(s: &serde_json::Value) -> Vec<u64> {
        s["per_worker"].as_array().expect("per_worker").iter().map(|w| w["steps"].as_u64().unwrap_or(0)).collect()
    }

    /// A step that holds its computing thread 2.5 s, with `--lost-after 1`: the rank's main
    /// thread keeps sending heartbeats, so it is never declared lost.
    #[test]
    fn a_step_longer_than_lost_after_does_not_lose_the_rank() {
        let _job = one_job();
        let args = ["--protocol", "bsp", "--workers", "2", "--steps", "3", "--lost-after", "1", "--json"];
        let job = Job::spawn_env(3, &args, &[("SYNCOPATE_MPI_BLOCK_STEP", "2:2500")]);
        let (code, out, err) = job.finish(Duration::from_secs(120));
        assert_eq!(code, 0, "{out} {err:#?}");
        assert!(!err.iter().any(|l| l.contains("silent")), "a computing rank is live: {err:#?}");
        let s = summary(&out);
        assert_eq!(s["gradients"]["accepted"].as_u64(), Some(6), "{s}");
        assert!(per_worker_steps(&s).iter().all(|n| *n >= 3), "{s}");
    }

    /// A rank frozen (SIGSTOP) past `--lost-after` is declared lost; resumed, it is told to
    /// rejoin, joins with epoch 1 and is counted back, and BSP finishes its budget with it.
    #[test]
    fn a_frozen_rank_declared_lost_rejoins_and_is_counted_back() {
        let _job = one_job();
        let args = ["--protocol", "bsp", "--workers", "2", "--steps", "150", "--step-ms", "20", "--lost-after", "1"];
        let job = Job::spawn(3, &[&args[..], &["--json"]].concat());
        let pid = job.pid_of(2);
        thread::sleep(Duration::from_millis(500));
        signal(pid, "-STOP");
        job.wait_err("rank 2 (worker 1) silent", Duration::from_secs(60));
        signal(pid, "-CONT");
        job.wait_err("worker 1: the server declared this rank lost; rejoining with epoch 1", Duration::from_secs(60));
        job.wait_err("rank 2 (worker 1) rejoined with epoch 1: counted back", Duration::from_secs(60));
        let line = job.wait_err("mpi: finished (", Duration::from_secs(180));
        assert!(line.contains("finished (Budget)") && line.contains("rejoined rank 2"), "{line}");
        let (code, out, _) = job.finish(Duration::from_secs(60));
        assert_eq!(code, 0, "{out}");
        let s = summary(&out);
        assert!(s["gradients"]["accepted"].as_u64().expect("accepted") >= 2 * 150, "{s}");
        assert!(per_worker_steps(&s)[1] > 0, "the rejoined rank's tally is counted: {s}");
    }

    /// Two of four worker ranks frozen with one signal: both are declared lost and counted
    /// (each loss reported to the protocol right after the other when they fall in one
    /// pass), then resumed: both rejoin and are counted back, and every protocol finishes its
    /// budget (BSP, grouped and DBW's warm-up wait for a lost worker by design, so they
    /// finish only because the ranks come back).
    #[test]
    fn two_ranks_frozen_together_are_both_lost_then_rejoin_and_every_protocol_finishes() {
        for protocol in ["bsp", "asp", "ssp", "bap", "backup", "dbw", "wbsp", "grouped"] {
            let _job = one_job();
            let args = ["--protocol", protocol, "--workers", "4", "--steps", "300", "--step-ms", "10"];
            let job = Job::spawn(5, &[&args[..], &["--lost-after", "1", "--json"]].concat());
            let (a, b) = (job.pid_of(2), job.pid_of(3));
            thread::sleep(Duration::from_millis(300));
            let ok = Command::new("kill").args(["-STOP", &a.to_string(), &b.to_string()]).status();
            assert!(ok.is_ok_and(|s| s.success()), "kill -STOP {a} {b}");
            job.wait_err("rank 2 (worker 1) silent", Duration::from_secs(60));
            job.wait_err("rank 3 (worker 2) silent", Duration::from_secs(60));
            let ok = Command::new("kill").args(["-CONT", &a.to_string(), &b.to_string()]).status();
            assert!(ok.is_ok_and(|s| s.success()), "kill -CONT {a} {b}");
            job.wait_err("rank 2 (worker 1) rejoined with epoch 1", Duration::from_secs(60));
            job.wait_err("rank 3 (worker 2) rejoined with epoch 1", Duration::from_secs(60));
            let line = job.wait_err("mpi: finished (", Duration::from_secs(180));
            assert!(line.contains("finished (Budget)"), "{protocol}: {line}");
            for rank in ["rank 2", "rank 3"] {
                let lost = line.split(", rejoined").next().unwrap_or_default();
                assert!(lost.contains(rank), "{protocol}: {rank} counted lost: {line}");
                assert!(line.split(", rejoined").nth(1).is_some_and(|r| r.contains(rank)), "{protocol}: {line}");
            }
            let (code, out, _) = job.finish(Duration::from_secs(60));
            assert_eq!(code, 0, "{protocol}: {out}");
            let s = summary(&out);
            assert!(s["gradients"]["accepted"].as_u64().expect("accepted") >= 4 * 300, "{protocol}: {s}");
            assert!(per_worker_steps(&s).iter().all(|n| *n > 0), "{protocol}: every tally counted: {s}");
        }
    }

    /// Every protocol trains digits to 0.90 with the model split over 2 and 3 shard ranks
    /// (2 workers), and every shard's ledger balances: every contribution the workers sent
    /// it was delivered (or arrived after it stopped), every delivered one accepted or
    /// refused, every accepted one applied, dropped or held.
    #[test]
    fn every_protocol_trains_digits_on_two_and_three_shards_with_balanced_ledgers() {
        for protocol in ["bsp", "asp", "ssp", "bap", "backup", "dbw", "wbsp", "grouped"] {
            for shards in [2u32, 3] {
                let _job = one_job();
                let s_arg = shards.to_string();
                let args = ["--protocol", protocol, "--shards", &s_arg, "--steps", "300", "--step-ms", "2", "--json"];
                let job = Job::spawn(shards + 2, &args);
                let (code, out, err) = job.finish(Duration::from_secs(240));
                assert_eq!(code, 0, "{protocol} S={shards}: {out} {err:#?}");
                let s = summary(&out);
                assert_eq!(s["workers"].as_u64(), Some(2), "{s}");
                let accuracy = s["final_accuracy"].as_f64().expect("accuracy");
                assert!(accuracy >= 0.90, "{protocol} S={shards}: final accuracy {accuracy}: {s}");
                let ledgers: Vec<&String> = err.iter().filter(|l| l.contains(": ledger ")).collect();
                assert_eq!(ledgers.len(), shards as usize, "{protocol} S={shards}: {err:#?}");
                for k in 0..shards {
                    let line = ledgers.iter().find(|l| l.starts_with(&format!("mpi: shard {k}: "))).expect("a ledger");
                    assert!(line.ends_with("ledger balanced"), "{protocol} S={shards}: {line}");
                    assert!(!line.contains(" applied 0,"), "{protocol} S={shards}: {line}");
                }
                assert_loss_curve_falls(&s);
            }
        }
    }

    /// A worker rank of a sharded run frozen past `--lost-after`: every shard declares it
    /// lost; resumed, it rejoins every shard with epoch 1 (the shards agree on it), BSP
    /// finishes its budget and both ledgers balance (the stale session's contributions
    /// counted refused).
    #[test]
    fn a_frozen_worker_rank_of_a_sharded_run_rejoins_every_shard() {
        let _job = one_job();
        let args = ["--protocol", "bsp", "--shards", "2", "--steps", "150", "--step-ms", "20", "--lost-after", "1"];
        let job = Job::spawn(4, &[&args[..], &["--json"]].concat());
        let pid = job.pid_of_rank(3);
        thread::sleep(Duration::from_millis(500));
        signal(pid, "-STOP");
        job.wait_err("shard 0: rank 3 (worker 1) silent", Duration::from_secs(60));
        job.wait_err("shard 1: rank 3 (worker 1) silent", Duration::from_secs(60));
        signal(pid, "-CONT");
        job.wait_err("shard 0: rank 3 (worker 1) rejoined with epoch 1: counted back", Duration::from_secs(60));
        job.wait_err("shard 1: rank 3 (worker 1) rejoined with epoch 1: counted back", Duration::from_secs(60));
        let line = job.wait_err("mpi: finished (", Duration::from_secs(180));
        assert!(line.contains("finished (Budget)"), "{line}");
        let (code, out, err) = job.finish(Duration::from_secs(60));
        assert_eq!(code, 0, "{out}");
        let ledgers: Vec<&String> = err.iter().filter(|l| l.contains(": ledger ")).collect();
        assert_eq!(ledgers.len(), 2, "{err:#?}");
        assert!(ledgers.iter().all(|l| l.ends_with("ledger balanced")), "{ledgers:#?}");
        let s = summary(&out);
        assert!(s["final_accuracy"].as_f64().expect("accuracy") >= 0.90, "{s}");
        assert!(per_worker_steps(&s)[1] > 0, "the rejoined rank's tally is counted: {s}");
    }

    /// A shard rank frozen past `--lost-after`: rank 0 names it and the run stops with an
    /// error naming it.
    #[test]
    fn a_lost_shard_stops_the_run_naming_it() {
        let _job = one_job();
        let args = ["--protocol", "bsp", "--shards", "2", "--steps", "100000", "--step-ms", "5", "--lost-after", "1"];
        let job = Job::spawn(4, &args);
        let pid = job.pid_from("mpi: rank 1 (shard 1) pid ");
        thread::sleep(Duration::from_millis(300));
        signal(pid, "-STOP");
        let line = job.wait_err("shard 0: shard 1 (rank 1) silent for", Duration::from_secs(60));
        assert!(line.contains("lost shard, the run stops"), "{line}");
        signal(pid, "-CONT");
        let err = job.refused(Duration::from_secs(120));
        assert!(err.iter().any(|l| l.contains("shard 1 (rank 1) was lost: the run stopped")), "{err:#?}");
    }

    /// As many shards as ranks leaves no rank for a worker: refused with one clear line.
    #[test]
    fn shards_without_a_worker_rank_are_refused() {
        let _job = one_job();
        let job = Job::spawn(3, &["--shards", "3"]);
        let err = job.refused(Duration::from_secs(60));
        assert!(err.iter().any(|l| l.contains("3 MPI ranks for --shards 3")), "{err:#?}");
    }

    #[test]
    fn a_killed_worker_rank_ends_the_job_naming_the_rank() {
        let _job = one_job();
        let job = Job::spawn(5, &["--protocol", "backup", "--workers", "4", "--steps", "100000", "--step-ms", "5"]);
        let pid = job.pid_of(2);
        thread::sleep(Duration::from_millis(300));
        signal(pid, "-KILL");
        let err = job.refused(Duration::from_secs(60)).join("\n");
        assert!(err.contains("rank 2") && err.contains("signal 9"), "mpirun names the killed rank: {err}");
    }

    #[test]
    fn a_rank_with_other_settings_is_refused() {
        let _job = one_job();
        // MPMD: rank 0 and rank 1 get different seeds.
        let mut cmd = mpirun_base();
        cmd.args([
            "-n",
            "1",
            BIN,
            "mpi",
            "--workers",
            "1",
            "--seed",
            "1",
            ":",
            "-n",
            "1",
            BIN,
            "mpi",
            "--workers",
            "1",
            "--seed",
            "2",
        ]);
        let job = Job::start(cmd);
        let err = job.refused(Duration::from_secs(60));
        let line = error_line(&err);
        assert!(line.contains("rank 1 was started with other settings than rank 0"), "{line}");
    }

    /// A rank started with another `--shards` (another split of the model) is refused before
    /// anything starts, naming the rank.
    #[test]
    fn a_rank_with_another_shard_count_is_refused() {
        let _job = one_job();
        // MPMD: ranks 0 and 1 split the model in two, rank 2 thinks it is one server.
        let mut cmd = mpirun_base();
        let same = ["mpi", "--workers", "1", "--shards", "2"];
        cmd.args(["-n", "2", BIN]).args(same).args([":", "-n", "1", BIN, "mpi", "--workers", "1", "--shards", "1"]);
        let job = Job::start(cmd);
        let err = job.refused(Duration::from_secs(60));
        let line = error_line(&err);
        assert!(line.contains("rank 2 was started with other settings than rank 0"), "{line}");
    }

    #[test]
    fn a_wrong_number_of_ranks_is_refused() {
        let _job = one_job();
        let job = Job::spawn(3, &["--workers", "4"]);
        let err = job.refused(Duration::from_secs(60));
        assert!(err.iter().any(|l| l.contains("3 MPI ranks for --workers 4: launch 5 ranks")), "{err:#?}");
        assert!(!err.iter().any(|l| l.contains("error: error:")), "{err:#?}");
    }

    /// Without `--workers`, the world size says how many: every rank but rank 0.
    #[test]
    fn the_world_size_gives_the_workers() {
        let _job = one_job();
        let job = Job::spawn(3, &["--steps", "20", "--json"]);
        let (code, out, _) = job.finish(Duration::from_secs(60));
        assert_eq!(code, 0, "{out}");
        assert_eq!(summary(&out)["workers"], 2, "{out}");
    }
}
