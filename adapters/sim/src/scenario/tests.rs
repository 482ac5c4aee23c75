//! Scenario files: the built-in ones, sweeps, the event budget, and every refusal with its
//! file, line and reason.

use super::*;

#[test]
fn built_in_scenarios_parse() {
    let d = Scenario::default_scenario();
    assert!(d.runs.len() >= 9);
    for (name, _) in PRESETS {
        let s = Scenario::preset(name).unwrap().unwrap();
        assert!(!s.runs.is_empty(), "{name}");
    }
    assert!(Scenario::preset("nope").is_none());
}

#[test]
fn every_run_is_bounded_in_events() {
    let s = Scenario::default_scenario();
    for run in &s.runs {
        assert_eq!(s.sim_config(run, 0).unwrap().stop.max_events, EVENT_BUDGET);
    }
    let mut traced = s.clone();
    traced.compute = vec![ComputeModel::Trace(vec![2e-6]); s.workers as usize];
    let e = traced.check_event_budget().unwrap_err();
    assert!(e.starts_with("max_time_s:") && e.contains("simulator events"), "{e}");
    assert!(Scenario::default_for_workers(2).unwrap().runs.iter().all(|r| r.spec.config(2, 0.5).is_ok()));
}

#[test]
fn sweeps_expand() {
    let s = Scenario::parse(
        "workers = 4\n[[protocols]]\nname = \"ssp\"\nstaleness = [0, 3]\n[[protocols]]\nname = \"backup\"\nbackup_workers = \"0..=2\"\n",
        "t.toml",
    )
    .unwrap();
    let labels: Vec<String> = s.runs.iter().map(Run::label).collect();
    assert_eq!(labels, ["ssp s=0", "ssp s=3", "backup b=0", "backup b=1", "backup b=2"]);
}

#[test]
fn bad_files_name_file_position_and_reason() {
    for (text, needle) in [
        ("workers = 4\nbogus = 1\n[[protocols]]\nname = \"bsp\"\n", "t.toml:2:1: unknown field `bogus`"),
        ("workers = 4\n[[protocols]]\nname = \"nope\"\n", "unknown variant `nope`"),
        ("workers = 0\n[[protocols]]\nname = \"bsp\"\n", "t.toml:1: workers: 0 is outside"),
        (
            "workers = 4\n[[protocols]]\nname = \"bsp\"\n[[protocols]]\nname = \"bsp\"\nstaleness = 3\n",
            "t.toml:6: protocols[1].staleness: does not apply to bsp",
        ),
        (
            "workers = 4\nmax_time_s = 1e9\n[[protocols]]\nname = \"bsp\"\n",
            "t.toml:2: max_time_s: 1000000000 is outside",
        ),
        (
            "workers = 4\nmax_time_s = 3000\nstep_ms = 0.01\n[[protocols]]\nname = \"asp\"\n",
            "t.toml:2: max_time_s: 3000 s of asp would take about",
        ),
        (
            "workers = 4\neval_interval_ms = 0.000001\n[[protocols]]\nname = \"bsp\"\n",
            "t.toml:2: eval_interval_ms: 0.000001 gives",
        ),
        ("workers = 4\nstep_ms = 0\n[[protocols]]\nname = \"bsp\"\n", "t.toml:2: step_ms: 0 is outside"),
        (
            "workers = 4\nbatch_size = 100000\n[[protocols]]\nname = \"bsp\"\n",
            "t.toml:2: batch_size: 100000 is outside",
        ),
        (
            "workers = 4\nmodel = \"mlp:100000000\"\n[[protocols]]\nname = \"bsp\"\n",
            "t.toml:2: model: mlp:100000000 has too many",
        ),
        ("workers = 4\n[network]\nlatency_ms = -1\n[[protocols]]\nname = \"bsp\"\n", "t.toml:3: network.latency_ms"),
        (
            "workers = 4\naccuracy_ladder = [0.9, 0.8]\n[[protocols]]\nname = \"bsp\"\n",
            "t.toml:2: accuracy_ladder: the targets must be in ascending order",
        ),
        (
            "workers = 4\naccuracy_ladder = [0.5, 1.5]\n[[protocols]]\nname = \"bsp\"\n",
            "t.toml:2: accuracy_ladder: 1.5 is outside 0..1",
        ),
        ("workers = 4\n", "missing field `protocols`"),
        ("workers = 4\nprotocols = []\n", "at least one"),
        ("workers = 4\nstep_ms = -1\n[[protocols]]\nname = \"bsp\"\n", "t.toml:2: step_ms: -1 is outside"),
        (
            "workers = 4\n[[stragglers]]\nworkers = \"9\"\nmodel = \"slow=2\"\n[[protocols]]\nname = \"bsp\"\n",
            "outside 0..4",
        ),
        (
            "workers = 4\n[[protocols]]\nname = \"backup\"\nbackup_workers = 4\n",
            "t.toml:2: protocols[0] (backup b=4): backup workers 4 must be fewer than the 4 workers",
        ),
        ("workers = 4\nmodel = \"cnn\"\n[[protocols]]\nname = \"bsp\"\n", "model:"),
        ("workers = 4\nworkers = 5\n[[protocols]]\nname = \"bsp\"\n", "t.toml:2:1: duplicate key 'workers'"),
        ("workers = 4\n[[protocols]]\nname = \"bsp\"\nstaleness = \"x\"\n", "t.toml:4:"),
    ] {
        let e = Scenario::parse(text, "t.toml").unwrap_err();
        assert!(e.contains(needle), "{text:?}: {e}");
        assert!(e.starts_with("t.toml"), "{e}");
        assert!(!e.contains('\n'), "{e}");
    }
}

#[test]
fn the_momentum_key_reaches_the_simulator_and_bad_values_are_refused() {
    let s = Scenario::parse("workers = 4\nmomentum = 0.9\n[[protocols]]\nname = \"bsp\"\n", "t.toml").unwrap();
    assert_eq!(s.sim_config(&s.runs[0], 0).unwrap().momentum, 0.9);
    let plain = Scenario::parse("workers = 4\n[[protocols]]\nname = \"bsp\"\n", "t.toml").unwrap();
    assert_eq!(plain.sim_config(&plain.runs[0], 0).unwrap().momentum, 0.0);
    for (value, shown) in [("1.0", "1"), ("-0.5", "-0.5"), ("nan", "NaN")] {
        let text = format!("workers = 4\nmomentum = {value}\n[[protocols]]\nname = \"bsp\"\n");
        let e = Scenario::parse(&text, "t.toml").unwrap_err();
        assert!(e.contains(&format!("momentum: {shown} is outside [0, 1)")), "{e}");
    }
}

#[test]
fn the_shards_key_reaches_the_simulator_and_bad_counts_are_refused() {
    let text = "workers = 4\nshards = 3\ncolocate_shards = true\n[[protocols]]\nname = \"bsp\"\n";
    let s = Scenario::parse(text, "t.toml").unwrap();
    assert_eq!((s.shards, s.colocate_shards), (3, true));
    let c = s.sim_config(&s.runs[0], 0).unwrap();
    assert_eq!((c.shards, c.colocate_shards), (3, true));
    let one = Scenario::parse("workers = 4\n[[protocols]]\nname = \"bsp\"\n", "t.toml").unwrap();
    assert_eq!((one.shards, one.colocate_shards), (1, false));
    for (text, needle) in [
        ("workers = 4\nshards = 0\n[[protocols]]\nname = \"bsp\"\n", "shards: 0 is outside 1..=1024"),
        (
            "workers = 4\nshards = 5\ncolocate_shards = true\n[[protocols]]\nname = \"bsp\"\n",
            "colocate_shards: 5 shards cannot run on 4 workers' machines",
        ),
    ] {
        let e = Scenario::parse(text, "t.toml").unwrap_err();
        assert!(e.contains(needle), "{e}");
    }
}
