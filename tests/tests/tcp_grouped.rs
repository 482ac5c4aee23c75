//! The grouped protocol's third deployment over real loopback sockets: a central ASP server,
//! one group server per group (each a `TcpServer` driving a `GroupServer` with an upstream
//! session to the central server, as `syncopate group` runs it) and the workers. It trains
//! to the accuracy the in-process grouped server reaches on the same workload and budget.

#[path = "tcp_common/mod.rs"]
mod common;

use common::*;
use core::time::Duration;
use std::sync::{Arc, Mutex};
use std::thread::{self, JoinHandle};
use syncopate::proto::asp::AspConfig;
use syncopate::proto::grouped::{GroupedConfig, LrScaling};
use syncopate::{ProtocolConfig, WorkerId};
use syncopate_adapters::tcp::{
    GroupOptions, Note, ServerOptions, ServerReport, StopReason, TcpError, TcpServer, run_group,
};
use syncopate_adapters::thread::{self as threads, ThreadConfig};

const WORKERS: u32 = 4;
const GROUPS: u32 = 2;
const LR: f64 = 0.5;
/// Gradient steps per worker.
const STEPS: u64 = 300;

fn grouped() -> GroupedConfig {
    let mut c = GroupedConfig::new(WORKERS, LR, GROUPS);
    c.lr_scaling = LrScaling::Linear;
    c
}

fn threads_accuracy() -> f64 {
    let w = workload();
    let config = ThreadConfig {
        protocol: ProtocolConfig::Grouped(grouped()),
        batch_size: BATCH,
        seed: SEED,
        max_gradients: STEPS * u64::from(WORKERS),
        time_limit: Some(Duration::from_secs(30)),
        eval_interval: Duration::from_millis(50),
        rejoin_after: Some(Duration::from_secs(1)),
        target_accuracy: 0.9,
    };
    let report = threads::run(&config, Arc::clone(&w), Vec::new(), &mut |_| {}).unwrap();
    accuracy(&w, &report.params)
}

type GroupRun = (JoinHandle<Result<ServerReport, TcpError>>, core::net::SocketAddr, Arc<Mutex<Vec<String>>>);

fn start_group(central: core::net::SocketAddr, g: u32, dim: usize) -> GroupRun {
    let config = grouped();
    let server = TcpServer::bind("127.0.0.1:0", ServerOptions::new(ProtocolConfig::Grouped(config), dim)).unwrap();
    let addr = server.local_addr().unwrap();
    let logs = Arc::new(Mutex::new(Vec::new()));
    let l2 = Arc::clone(&logs);
    let join = thread::spawn(move || {
        let mut up = GroupOptions::new(central.to_string(), g);
        up.backoff.give_up_after = Duration::from_secs(5);
        run_group(server, config, &up, &plan(u64::MAX, 30), &mut |n| {
            if let Note::Log(line) = n {
                l2.lock().unwrap().push(line.to_owned());
            }
        })
    });
    (join, addr, logs)
}

#[test]
fn group_processes_over_tcp_match_in_process_grouped() {
    bounded(Duration::from_secs(120), || {
        let w = workload();
        let dim = w.model.dim();
        let config = grouped();
        // The central server: plain ASP over the G groups at the grouped learning rate.
        let central_protocol = ProtocolConfig::Asp(config.central_config());
        assert_eq!(central_protocol, ProtocolConfig::Asp(AspConfig::new(GROUPS, LR)));
        // G aggregates per STEPS·n_g worker gradients: STEPS · G aggregates is STEPS · n.
        let central = start_server(ServerOptions::new(central_protocol, dim), &w, plan(STEPS * u64::from(GROUPS), 60));
        let groups: Vec<GroupRun> = (0..GROUPS).map(|g| start_group(central.addr, g, dim)).collect();
        let workers: Vec<_> = (0..WORKERS)
            .map(|i| {
                let g = config.group_of(WorkerId(i)).unwrap();
                let addr = groups[g as usize].1;
                spawn_worker(worker_options(addr, i, ProtocolConfig::Grouped(config), dim), Arc::clone(&w))
            })
            .collect();
        let report = central.finish();
        assert_eq!(report.reason, StopReason::Budget);
        assert!(report.stats.accepted >= STEPS * u64::from(GROUPS));
        assert_eq!(report.sessions, u64::from(GROUPS), "one session per group server");
        let mut member_grads = 0;
        for (join, _, logs) in groups {
            let r = join.join().unwrap().unwrap_or_else(|e| panic!("group failed: {e}"));
            assert_eq!(r.reason, StopReason::UpstreamStopped, "logs: {:?}", logs.lock().unwrap());
            assert!(logs.lock().unwrap().iter().any(|l| l.contains("the upstream server said stop")));
            member_grads += r.stats.accepted;
        }
        for h in workers {
            let (r, logs) = h.join().unwrap();
            let r = r.unwrap_or_else(|e| panic!("worker failed: {e}; {logs:?}"));
            assert!(r.stopped, "the central server's stop reached every worker through its group");
            assert!(r.steps > 0);
        }
        // Every central aggregate carries one gradient of each of the group's 2 members.
        assert!(member_grads >= 2 * report.stats.applied, "{member_grads} member gradients");
        let tcp = accuracy(&w, &report.params);
        let threads = threads_accuracy();
        eprintln!("grouped over group processes: tcp accuracy {tcp:.4}, in-process threads {threads:.4}");
        assert!(tcp > 0.9, "tcp accuracy {tcp}");
        assert!((tcp - threads).abs() < 0.02, "tcp {tcp} vs threads {threads}");
    });
}

#[test]
fn central_with_another_learning_rate_refuses_the_group() {
    bounded(Duration::from_secs(30), || {
        let w = workload();
        let dim = w.model.dim();
        // `serve --protocol asp --workers 2 --lr 0.5` divides by the workers: 0.25 ≠ 0.5.
        let wrong = ProtocolConfig::Asp(AspConfig::new(GROUPS, LR / f64::from(GROUPS)));
        let central = start_server(ServerOptions::new(wrong, dim), &w, plan(1000, 20));
        let (join, _, _) = start_group(central.addr, 0, dim);
        let err = join.join().unwrap().expect_err("the central server refuses other settings");
        assert!(err.0.contains("settings differ"), "{err}");
        central.wait_log("protocol settings differ", Duration::from_secs(5));
        central.handle.stop();
        let report = central.finish();
        assert_eq!(report.sessions, 0);
        assert!(report.handshake_failures >= 1);
    });
}
