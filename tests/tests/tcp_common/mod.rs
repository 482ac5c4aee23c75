//! Shared pieces of the TCP tests: an in-process server and worker threads over real
//! loopback sockets, each bounded in time.

#![allow(dead_code, unreachable_pub)]

use core::net::SocketAddr;
use core::sync::atomic::AtomicBool;
use core::time::Duration;
use std::sync::{Arc, Mutex};
use std::thread::{self, JoinHandle};
use std::time::Instant;
use syncopate::{ProtocolConfig, Version, WorkerId};
use syncopate_adapters::scenario::ProtocolKind;
use syncopate_adapters::tcp::handshake::{ClientSide, Role};
use syncopate_adapters::tcp::{DEFAULT_LOST_AFTER, WorkerKey};
use syncopate_adapters::tcp::{
    Note, ProtocolSettings, RunPlan, RunSettings, ServerHandle, ServerOptions, ServerReport, TcpError, TcpServer,
    WorkerJob, WorkerOptions, WorkerReport, run_worker,
};
use syncopate_adapters::thread::ThreadConfig;
use syncopate_adapters::workload::{BatchSampler, ModelKind, Workload};

pub const SEED: u64 = 5;
pub const BATCH: usize = 32;

pub fn workload() -> Arc<Workload> {
    Arc::new(Workload::digits(ModelKind::Softmax, SEED))
}

/// The run's settings for `protocol` on the test workload's model.
pub fn run_settings(protocol: ProtocolSettings) -> RunSettings {
    RunSettings::new(protocol, workload().model.dim())
}

/// BSP over `n` workers at learning rate 0.5, reporting stalls after 200 ms.
pub fn bsp(n: u32) -> RunSettings {
    let mut p = ProtocolSettings::named(ProtocolKind::Bsp, n, 0.5);
    p.stall_report_ms = Some(200.0);
    run_settings(p)
}

/// ASP over `n` workers (learning rate 0.5 / n per gradient).
pub fn asp(n: u32) -> RunSettings {
    run_settings(ProtocolSettings::named(ProtocolKind::Asp, n, 0.5))
}

/// A running in-process server.
pub struct Running {
    pub addr: SocketAddr,
    pub handle: ServerHandle,
    pub logs: Arc<Mutex<Vec<String>>>,
    pub events: Arc<Mutex<Vec<syncopate::ServerEvent>>>,
    pub join: JoinHandle<Result<ServerReport, TcpError>>,
}

impl Running {
    pub fn logs_contain(&self, needle: &str) -> bool {
        self.logs.lock().unwrap().iter().any(|l| l.contains(needle))
    }

    /// Waits (bounded) until a log line contains `needle`.
    #[track_caller]
    pub fn wait_log(&self, needle: &str, within: Duration) {
        let end = Instant::now() + within;
        while Instant::now() < end {
            if self.logs_contain(needle) {
                return;
            }
            thread::sleep(Duration::from_millis(10));
        }
        panic!("no log line with {needle:?} within {within:?}; logs: {:#?}", self.logs.lock().unwrap());
    }

    /// Waits for the run's end; checks the server's side of the conservation ledger.
    pub fn finish(self) -> ServerReport {
        let report = self.join.join().expect("server thread panicked").expect("server failed");
        check_server_ledger(&report);
        report
    }
}

/// The server's side of the conservation ledger (`syncopate_tests::ledger`): every
/// contribution read was accepted or refused, every accepted one applied, dropped or held at
/// the stop, and the per-session counts add up to the totals.
#[track_caller]
pub fn check_server_ledger(r: &ServerReport) {
    let l = syncopate_tests::ledger::Ledger::from_server(&r.stats).unwrap_or_else(|e| panic!("{e}"));
    assert_eq!(r.received, l.accepted + r.refused_contributions, "received = accepted + refused: {r:?}");
    let s = &r.session_ledgers;
    let sum = |f: fn(&syncopate_adapters::tcp::SessionLedger) -> u64| s.iter().map(f).sum::<u64>();
    assert_eq!(sum(|x| x.received), r.received);
    assert_eq!(sum(|x| x.refused), r.refused_contributions);
    assert_eq!(sum(|x| x.discarded), r.discarded);
    assert_eq!(sum(|x| x.in_flight_at_stop), r.in_flight_at_stop);
}

/// The whole ledger of an in-process run: what the workers wrote (their reports, across
/// sessions) = applied + dropped + held + in flight at the stop + lost (refused, discarded
/// with a replaced session). Exact: no process died, the kernel delivered every byte.
#[track_caller]
pub fn check_ledger(r: &ServerReport, workers: &[WorkerReport]) {
    use syncopate_tests::ledger::{Ledger, Loss};
    check_server_ledger(r);
    let mut l = Ledger::from_server(&r.stats).unwrap_or_else(|e| panic!("{e}"));
    l.sent = workers.iter().map(|w| w.sent + w.resent).sum();
    l.in_flight = r.in_flight_at_stop;
    l.add_lost(Loss::Refused, r.refused_contributions);
    l.add_lost(Loss::ConnectionLost, r.discarded);
    l.check().unwrap_or_else(|e| panic!("{e}"));
}

pub fn start_server_at(
    addr: &str,
    options: ServerOptions,
    params: Vec<f32>,
    version: Version,
    plan: RunPlan,
) -> Running {
    let server = TcpServer::bind(addr, options).expect("bind");
    let addr = server.local_addr().unwrap();
    let handle = server.handle();
    let logs = Arc::new(Mutex::new(Vec::new()));
    let events = Arc::new(Mutex::new(Vec::new()));
    let (l2, e2) = (Arc::clone(&logs), Arc::clone(&events));
    let join = thread::spawn(move || {
        server.run(params, version, &plan, &mut |n| match n {
            Note::Log(line) => l2.lock().unwrap().push(line.to_owned()),
            Note::Event(ev) => e2.lock().unwrap().push(*ev),
            Note::Model { .. } | Note::Started | Note::Contribution { .. } | Note::Checkpoint { .. } => {}
        })
    });
    Running { addr, handle, logs, events, join }
}

pub fn start_server(options: ServerOptions, w: &Workload, plan: RunPlan) -> Running {
    let mut params = vec![0.0f32; w.model.dim()];
    w.model.init(SEED, &mut params);
    start_server_at("127.0.0.1:0", options, params, Version::ZERO, plan)
}

pub fn plan(max_gradients: u64, secs: u64) -> RunPlan {
    RunPlan { max_gradients, time_limit: Some(Duration::from_secs(secs)) }
}

pub fn worker_options(addr: SocketAddr, id: u32) -> WorkerOptions {
    let mut o = WorkerOptions::new(addr.to_string(), WorkerId(id));
    o.backoff.give_up_after = Duration::from_secs(10);
    o.rejoin_after = Some(Duration::from_millis(500));
    o
}

/// Runs a worker thread computing real gradients of `w`.
pub fn spawn_worker(
    options: WorkerOptions,
    w: Arc<Workload>,
) -> JoinHandle<(Result<WorkerReport, TcpError>, Vec<String>)> {
    spawn_worker_paced(options, w, Duration::ZERO)
}

/// Gradients of the test workload, each step held for an extra `step` (an emulated compute
/// time, during which the worker still reads the server).
struct Paced {
    w: Arc<Workload>,
    sampler: BatchSampler,
    scratch: syncopate_adapters::workload::Scratch,
    batch: Vec<usize>,
    step: Duration,
}

impl WorkerJob for Paced {
    fn gradient(&mut self, params: &[f32], grad: &mut [f32]) -> Duration {
        self.sampler.next_batch(BATCH, &mut self.batch);
        self.w.model.gradient(params, &self.w.train, &self.batch, grad, &mut self.scratch);
        self.step
    }
}

/// Runs a worker thread computing real gradients of `w`, each step taking at least `step`.
pub fn spawn_worker_paced(
    options: WorkerOptions,
    w: Arc<Workload>,
    step: Duration,
) -> JoinHandle<(Result<WorkerReport, TcpError>, Vec<String>)> {
    thread::spawn(move || {
        let seed = SEED ^ (u64::from(options.id.0) + 1).wrapping_mul(0x9E37_79B9_7F4A_7C15);
        let mut job = Paced {
            sampler: BatchSampler::new(w.train.len(), seed),
            scratch: w.model.scratch(),
            batch: Vec::new(),
            step,
            w,
        };
        let mut logs = Vec::new();
        let r = run_worker(&options, &mut job, &mut |line| logs.push(line.to_owned()));
        (r, logs)
    })
}

pub fn kill_switch() -> Arc<AtomicBool> {
    Arc::new(AtomicBool::new(false))
}

pub fn accuracy(w: &Workload, params: &[f32]) -> f64 {
    w.model.evaluate(params, &w.test).accuracy
}

/// The test accuracy of `protocol` trained on the test workload for `max_gradients` by the
/// threaded adapter (no sockets): the reference a TCP run is compared with.
pub fn threads_accuracy(protocol: ProtocolConfig, max_gradients: u64) -> f64 {
    let w = workload();
    let config = ThreadConfig {
        protocol,
        batch_size: BATCH,
        seed: SEED,
        max_gradients,
        time_limit: Some(Duration::from_secs(30)),
        eval_interval: Duration::from_millis(50),
        rejoin_after: Some(Duration::from_secs(1)),
        target_accuracy: 0.9,
        momentum: 0.0,
    };
    let report = syncopate_adapters::thread::run(&config, Arc::clone(&w), Vec::new(), &mut |_| {}).unwrap();
    accuracy(&w, &report.params)
}

/// A worker's side of the handshake as `run_worker` makes it: worker `id`, authenticated with
/// `key` if given, asking for no model and offering none.
pub fn worker_side(id: u32, key: Option<&WorkerKey>) -> ClientSide<'_> {
    ClientSide {
        worker: WorkerId(id),
        role: Role::Worker,
        key,
        want: None,
        dim: None,
        lost_after: DEFAULT_LOST_AFTER,
        wire: None,
    }
}

/// Fails the test if `f` takes longer than `limit` (runs it on a thread).
#[track_caller]
pub fn bounded<T: Send + 'static>(limit: Duration, f: impl FnOnce() -> T + Send + 'static) -> T {
    let (tx, rx) = std::sync::mpsc::channel();
    thread::spawn(move || {
        let _ = tx.send(f());
    });
    match rx.recv_timeout(limit) {
        Ok(v) => v,
        Err(std::sync::mpsc::RecvTimeoutError::Timeout) => panic!("test exceeded its time bound of {limit:?}"),
        Err(std::sync::mpsc::RecvTimeoutError::Disconnected) => panic!("test body panicked (see above)"),
    }
}
