//! The grouped protocol's third deployment over real loopback sockets: a central server of
//! remote groups (ASP over the groups), one group server per group (each a `TcpServer`
//! driving the core's sub-server, `AnyServer::subserver`, with an upstream session to the
//! central server, as `syncopate group` runs it) and the workers. The groups and the workers learn the run's settings from
//! upstream. It trains to the accuracy the in-process grouped server reaches on the same
//! workload and budget.

#[path = "tcp_common/mod.rs"]
mod common;

use common::*;
use core::time::Duration;
use std::sync::{Arc, Mutex};
use std::thread::{self, JoinHandle};
use syncopate::proto::Heap;
use syncopate::proto::asp::AspConfig;
use syncopate::proto::grouped::GroupedConfig;
use syncopate::{AnyServer, ProtocolConfig, Server, WorkerId};
use syncopate_adapters::scenario::ProtocolKind;
use syncopate_adapters::tcp::{
    GroupOptions, Note, ProtocolSettings, RunSettings, ServerOptions, ServerReport, StopReason, TcpError, TcpServer,
    run_group,
};

const WORKERS: u32 = 4;
const GROUPS: u32 = 2;
const LR: f64 = 0.5;
/// Gradient steps per worker.
const STEPS: u64 = 300;

/// The run as the central server announces it: grouped, G groups as their own processes.
fn settings() -> RunSettings {
    let mut p = ProtocolSettings::named(ProtocolKind::Grouped, WORKERS, LR);
    p.groups = Some(GROUPS);
    let mut s = run_settings(p);
    s.remote_groups = true;
    s
}

fn grouped() -> GroupedConfig {
    match settings().worker_config().unwrap() {
        ProtocolConfig::Grouped(c) => c,
        other => panic!("{other:?}"),
    }
}

type GroupRun = (JoinHandle<Result<ServerReport, TcpError>>, core::net::SocketAddr, Arc<Mutex<Vec<String>>>);

/// Starts group `g` of the central server at `central`; its members' address comes back
/// once it is bound (after it learned the settings upstream).
fn start_group(central: core::net::SocketAddr, g: u32) -> GroupRun {
    let logs = Arc::new(Mutex::new(Vec::new()));
    let l2 = Arc::clone(&logs);
    let (addr_tx, addr_rx) = std::sync::mpsc::channel();
    let join = thread::spawn(move || {
        let mut up = GroupOptions::new(central.to_string(), g);
        up.backoff.give_up_after = Duration::from_secs(5);
        let mut bind = |members: RunSettings| {
            assert!(!members.remote_groups, "members get the plain grouped settings");
            let server = TcpServer::bind("127.0.0.1:0", ServerOptions::new(members))?;
            let _ = addr_tx.send(server.local_addr()?);
            Ok(server)
        };
        run_group(&up, &mut bind, &plan(u64::MAX, 30), &mut |n| {
            if let Note::Log(line) = n {
                l2.lock().unwrap().push(line.to_owned());
            }
        })
    });
    let addr = addr_rx.recv_timeout(Duration::from_secs(20)).unwrap_or_else(|_| "127.0.0.1:9".parse().unwrap());
    (join, addr, logs)
}

#[test]
fn group_processes_over_tcp_match_in_process_grouped() {
    bounded(Duration::from_secs(120), || {
        let w = workload();
        let config = grouped();
        // The central server runs plain ASP over the G groups at the grouped learning rate.
        assert_eq!(settings().server_config().unwrap(), ProtocolConfig::Asp(AspConfig::new(GROUPS, LR)));
        // G aggregates per STEPS·n_g worker gradients: STEPS · G aggregates is STEPS · n.
        let central = start_server(ServerOptions::new(settings()), &w, plan(STEPS * u64::from(GROUPS), 60));
        let groups: Vec<GroupRun> = (0..GROUPS).map(|g| start_group(central.addr, g)).collect();
        let workers: Vec<_> = (0..WORKERS)
            .map(|i| {
                let g = config.group_of(WorkerId(i)).unwrap();
                let addr = groups[g as usize].1;
                spawn_worker(worker_options(addr, i), Arc::clone(&w))
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
        let threads = threads_accuracy(ProtocolConfig::Grouped(grouped()), STEPS * u64::from(WORKERS));
        eprintln!("grouped over group processes: tcp accuracy {tcp:.4}, in-process threads {threads:.4}");
        assert!(tcp > 0.9, "tcp accuracy {tcp}");
        assert!((tcp - threads).abs() < 0.02, "tcp {tcp} vs threads {threads}");
    });
}

#[test]
fn workers_and_groups_are_refused_where_they_do_not_belong() {
    bounded(Duration::from_secs(30), || {
        let w = workload();
        // A worker at a central server of remote groups.
        let central = start_server(ServerOptions::new(settings()), &w, plan(1000, 20));
        let mut o = worker_options(central.addr, 0);
        o.backoff.give_up_after = Duration::from_secs(2);
        let (r, _) = spawn_worker(o, Arc::clone(&w)).join().unwrap();
        let err = r.expect_err("a worker cannot join the central server").to_string();
        assert!(err.contains("this server takes only group servers, but a worker connected as 0"), "{err}");
        central.wait_log("this server takes only group servers", Duration::from_secs(5));
        central.handle.stop();
        assert_eq!(central.finish().sessions, 0);
        // A group at an ordinary server.
        let plain = start_server(ServerOptions::new(bsp(2)), &w, plan(1000, 20));
        let (join, _, _) = start_group(plain.addr, 0);
        let err = join.join().unwrap().expect_err("a group cannot join an ordinary server");
        assert!(err.0.contains("this server takes only workers, but a group server connected as 0"), "{err}");
        plain.handle.stop();
        assert_eq!(plain.finish().sessions, 0);
    });
}

#[test]
fn a_server_with_an_upstream_is_refused_without_an_uplink() {
    let members = RunSettings { remote_groups: false, ..settings() };
    let config = members.worker_config().unwrap();
    let dim = members.dim().unwrap();
    let scratch = vec![0.0f32; config.subserver_scratch_len(dim)];
    let group: AnyServer<f32, Vec<f32>, Heap> = AnyServer::subserver(&config, 0, 1, vec![0.0; dim], scratch).unwrap();
    assert!(group.has_upstream());
    let server = TcpServer::bind("127.0.0.1:0", ServerOptions::new(members)).unwrap();
    let err = server.drive(group, None, &plan(10, 5), &mut |_| {}).expect_err("no uplink");
    assert!(err.0.contains("no upstream connection"), "{err}");
}
