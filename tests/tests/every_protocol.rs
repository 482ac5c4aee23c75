//! Every protocol of `ProtocolKind::ALL` through every adapter: the command line's parser, the
//! scenario parser, the TCP run settings, the C ABI's configuration, the simulator, the
//! threads adapter (over the in-process channels) and TCP on loopback. A protocol added to
//! `ALL` and not wired into one of them fails here (docs/ADDING_A_PROTOCOL.md); the
//! exhaustive `match`es over `ProtocolKind` in the adapters fail to compile first.

#[path = "tcp_common/mod.rs"]
mod common;

use clap::Parser;
use common::*;
use core::time::Duration;
use std::sync::Arc;
use syncopate::{ProtocolConfig, ProtocolKind};
use syncopate_adapters::cli::{Cli, Command};
use syncopate_adapters::scenario::{ProtocolSpec, Scenario};
use syncopate_adapters::sim::{self, SimConfig};
use syncopate_adapters::tcp::{ProtocolSettings, RunSettings, ServerOptions, StopReason, run_worker};
use syncopate_adapters::thread::{self, ThreadConfig};
use syncopate_adapters::workload::{ModelKind, Workload};
use syncopate_ffi::SyncopateConfig;

const WORKERS: u32 = 4;
const LR: f64 = 0.5;

/// The configuration every adapter builds for `kind` (the adapters' one translation).
fn config(kind: ProtocolKind) -> ProtocolConfig {
    let config = ProtocolSpec::new(kind).config(WORKERS, LR).unwrap_or_else(|e| panic!("{kind}: {e}"));
    assert_eq!(config.kind(), kind);
    assert_eq!(config.name(), kind.as_str());
    config
}

#[test]
fn the_command_line_takes_every_name() {
    for kind in ProtocolKind::ALL {
        let cli = Cli::try_parse_from(["syncopate", "train", "--protocol", kind.as_str(), "--workers", "4"])
            .unwrap_or_else(|e| panic!("{kind}: {e}"));
        let Command::Train(args) = cli.command else { panic!("{kind}: not train") };
        assert_eq!(args.protocol.protocol, kind);
        assert_eq!(args.protocol.config().unwrap().kind(), kind);
    }
    let refused = Cli::try_parse_from(["syncopate", "train", "--protocol", "nope"]).unwrap_err().to_string();
    for name in ProtocolKind::NAMES {
        assert!(refused.contains(name), "{name} missing from {refused}");
    }
}

#[test]
fn scenario_files_take_every_name() {
    for kind in ProtocolKind::ALL {
        let text = format!("workers = {WORKERS}\n[[protocols]]\nname = \"{kind}\"\n");
        let scenario = Scenario::parse(&text, "t.toml").unwrap_or_else(|e| panic!("{kind}: {e}"));
        assert_eq!(scenario.runs.len(), 1);
        assert_eq!(scenario.runs[0].spec.name, kind);
    }
    let refused = Scenario::parse("workers = 4\n[[protocols]]\nname = \"nope\"\n", "t.toml").unwrap_err();
    assert!(refused.contains("unknown variant `nope`") && refused.contains("`wbsp-overlap`"), "{refused}");
}

#[test]
fn tcp_run_settings_carry_every_name() {
    for kind in ProtocolKind::ALL {
        let settings = RunSettings::new(ProtocolSettings::named(kind, WORKERS, LR), 10);
        let back = RunSettings::decode(&settings.encode().unwrap()).unwrap();
        assert_eq!(back.protocol.name, kind.as_str());
        assert_eq!(back.worker_config().unwrap(), config(kind));
    }
}

#[test]
fn the_c_abi_selects_every_protocol() {
    for kind in ProtocolKind::ALL {
        let c = SyncopateConfig::for_kind(kind, WORKERS, LR);
        assert_eq!(c.kind(), Some(kind));
        let (protocol, overlap) = syncopate_ffi::protocol_code(kind);
        assert_eq!((c.protocol, c.wbsp_overlap), (protocol, overlap));
    }
}

#[test]
fn the_simulator_runs_every_protocol() {
    for kind in ProtocolKind::ALL {
        let c = SimConfig::new(config(kind), ModelKind::Softmax).with_max_updates(5);
        let report = sim::try_run(&c, &c.digits_workload()).unwrap_or_else(|e| panic!("{kind}: {e}"));
        assert_eq!(report.protocol, kind.as_str());
        assert!(report.updates >= 5 && report.applied > 0, "{kind}: {report:?}");
    }
}

#[test]
fn threads_over_channels_run_every_protocol() {
    let w = workload();
    for kind in ProtocolKind::ALL {
        let run = ThreadConfig {
            protocol: config(kind),
            batch_size: BATCH,
            seed: SEED,
            max_gradients: 10 * u64::from(WORKERS),
            time_limit: Some(Duration::from_secs(20)),
            eval_interval: Duration::from_secs(10),
            rejoin_after: Some(Duration::from_millis(300)),
            target_accuracy: 0.9,
            momentum: 0.0,
        };
        let report =
            thread::run(&run, Arc::clone(&w), Vec::new(), &mut |_| {}).unwrap_or_else(|e| panic!("{kind}: {e}"));
        assert!(report.stats.applied > 0, "{kind}: {:?}", report.stats);
    }
}

#[test]
fn tcp_on_loopback_runs_every_protocol() {
    on_every_protocol_over_tcp(|kind, server, w| {
        let workers: Vec<_> =
            (0..WORKERS).map(|i| spawn_worker(worker_options(server.addr, i), Arc::clone(&w))).collect();
        let report = server.finish();
        let mut reports = Vec::new();
        for h in workers {
            let (r, logs) = h.join().unwrap();
            reports.push(r.unwrap_or_else(|e| panic!("{kind}: worker failed: {e}; {logs:?}")));
        }
        check_ledger(&report, &reports);
        assert!(report.stats.applied > 0, "{kind}: {:?}", report.stats);
    });
}

/// Runs `body` on a server of every protocol (each bounded to 120 s) on the loopback, with a
/// budget every worker joins well before (as in `tcp_train`): a worker that first connects as
/// the run ends is not what these tests are about.
fn on_every_protocol_over_tcp(body: fn(ProtocolKind, Running, Arc<Workload>)) {
    let w = workload();
    for kind in ProtocolKind::ALL {
        let w = Arc::clone(&w);
        bounded(Duration::from_secs(120), move || {
            let settings = run_settings(ProtocolSettings::named(kind, WORKERS, LR));
            let server = start_server(ServerOptions::new(settings), &w, plan(150 * u64::from(WORKERS), 30));
            body(kind, server, w);
        });
    }
}

/// Workers whose steps take no time at all (a job that only writes a constant gradient):
/// between two steps each still reads what the server sent, so every one sees the `Stop`
/// (under wbsp-overlap the next step is always ready, and a worker that stepped whenever it
/// could never read its socket).
#[test]
fn tcp_workers_whose_steps_take_no_time_still_read_the_server() {
    on_every_protocol_over_tcp(|kind, server, _| {
        let workers: Vec<_> = (0..WORKERS)
            .map(|i| {
                let options = worker_options(server.addr, i);
                std::thread::spawn(move || {
                    let mut job = |_: &[f32], grad: &mut [f32]| grad.fill(1e-3);
                    run_worker(&options, &mut job, &mut |_| {})
                })
            })
            .collect();
        let report = server.finish();
        assert_eq!(report.reason, StopReason::Budget, "{kind}: {report:?}");
        let mut reports = Vec::new();
        for h in workers {
            let r = h.join().unwrap().unwrap_or_else(|e| panic!("{kind}: worker failed: {e}"));
            assert!(r.stopped, "{kind}: a worker did not get the Stop: {r:?}");
            reports.push(r);
        }
        check_ledger(&report, &reports);
    });
}
