use super::*;
use crate::proto::asp::AspConfig;
use crate::proto::backup::BackupConfig;
use crate::proto::bap::BapConfig;
use crate::proto::bsp::BspConfig;
use crate::proto::dbw::DbwConfig;
use crate::proto::grouped::GroupedConfig;
use crate::proto::ssp::SspConfig;
use crate::proto::wbsp::WbspConfig;
use crate::proto::{AnyServer, ProtocolConfig, Recipient, Server, ServerOutput, ServerStats, WorkerSetup};
use crate::testkit::{ToServerOwned, ToWorkerOwned};
use crate::{Duration, WorkerStats};
use std::collections::VecDeque;
use std::vec;
use std::vec::Vec;

#[test]
fn the_layout_covers_the_model_in_contiguous_slices_of_at_least_one_element() {
    for dim in 1..40usize {
        for shards in 1..=dim as u32 {
            let layout = ShardLayout::new(dim, shards).unwrap();
            let mut next = 0;
            for k in 0..shards {
                let r = layout.range(k).unwrap();
                assert_eq!(r.start, next);
                assert!(!r.is_empty());
                assert!(r.len() == dim / shards as usize || r.len() == dim / shards as usize + 1);
                next = r.end;
            }
            assert_eq!(next, dim);
            assert_eq!(layout.range(shards), None);
            assert_eq!(layout.len(shards), 0);
        }
    }
    assert_eq!(ShardLayout::new(3, 4), Err(ConfigError::ShardLayout { dim: 3, shards: 4 }));
    assert_eq!(ShardLayout::new(3, 0), Err(ConfigError::ShardLayout { dim: 3, shards: 0 }));
    assert_eq!(ShardLayout::new(0, 1), Err(ConfigError::ShardLayout { dim: 0, shards: 1 }));
    let msg = std::format!("{}", ConfigError::ShardLayout { dim: 3, shards: 4 });
    assert_eq!(msg, "a model of 3 elements does not split into 4 shards of at least one element each");
}

fn setup(id: u32) -> WorkerSetup {
    WorkerSetup { id: WorkerId(id), epoch: 0, rejoin_after: None }
}

fn inner(config: &ProtocolConfig, id: u32, len: usize) -> ShardSlot<f64, Vec<f64>> {
    ShardSlot::new(AnyWorker::new(config, setup(id), vec![0.0; len], vec![0.0; len]).unwrap())
}

#[test]
fn a_worker_whose_inner_workers_do_not_match_the_layout_is_refused() {
    let config = ProtocolConfig::Bsp(BspConfig::new(2, 0.5));
    let layout = ShardLayout::new(5, 2).unwrap();
    let wrong = ConfigError::ShardLayout { dim: 5, shards: 2 };
    let short = vec![inner(&config, 0, 3), inner(&config, 0, 1)];
    assert_eq!(ShardedWorker::new(layout, short, vec![0.0; 5]).err(), Some(wrong));
    let count = vec![inner(&config, 0, 5)];
    assert_eq!(
        ShardedWorker::new(layout, count, vec![0.0; 5]).err(),
        Some(ConfigError::ShardLayout { dim: 5, shards: 1 })
    );
    let ids = vec![inner(&config, 0, 3), inner(&config, 1, 2)];
    assert_eq!(ShardedWorker::new(layout, ids, vec![0.0; 5]).err(), Some(ConfigError::Knob("shard worker id")));
    let ok = vec![inner(&config, 0, 3), inner(&config, 0, 2)];
    assert_eq!(
        ShardedWorker::new(layout, ok, vec![0.0; 4]).err(),
        Some(ConfigError::ScratchTooSmall { needed: 5, given: 4 })
    );
}

fn model(version: u64, values: &[f64]) -> ToWorker<'_, f64> {
    ToWorker::Model { version: Version(version), clock: version, values: crate::Values::Slice(values) }
}

#[derive(Debug, PartialEq)]
enum Out {
    Send(u32, ToServerOwned),
    Compute(u64, u64, Vec<f64>),
    Event(WorkerEvent),
}

fn drain(w: &mut HeapShardedWorker<f64>) -> Vec<Out> {
    let mut v = Vec::new();
    while let Some(o) = w.poll_output() {
        v.push(match o {
            ShardedOutput::Send { shard, msg } => Out::Send(shard, ToServerOwned::from(&msg)),
            ShardedOutput::Compute { id, version, params } => Out::Compute(id.0, version.0, params.to_vec()),
            ShardedOutput::Event(e) => Out::Event(e),
        });
    }
    v
}

#[test]
fn the_host_computes_once_every_shard_sent_its_slice_and_the_gradient_is_split_back() {
    let config = ProtocolConfig::Bsp(BspConfig::new(1, 0.5));
    let layout = ShardLayout::new(3, 2).unwrap();
    let mut w = ShardedWorker::allocated(&config, setup(4), layout).unwrap();
    assert_eq!(w.id(), WorkerId(4));
    assert_eq!(
        drain(&mut w),
        [Out::Send(0, ToServerOwned::Join { epoch: 0 }), Out::Send(1, ToServerOwned::Join { epoch: 0 })]
    );
    let now = Instant::ZERO;
    w.handle(now, 1, model(0, &[3.0])).unwrap();
    assert_eq!(drain(&mut w), []);
    assert!(w.handle(now, 2, model(0, &[3.0])).is_err());
    assert!(w.handle(now, 0, model(0, &[3.0])).is_err());
    w.handle(now, 0, model(0, &[1.0, 2.0])).unwrap();
    assert_eq!(drain(&mut w), [Out::Compute(0, 0, vec![1.0, 2.0, 3.0])]);
    assert_eq!(w.handle_gradient(now, ComputeId(1), &[0.0; 3]), Err(Reject::NoSuchComputation));
    assert!(matches!(w.handle_gradient(now, ComputeId(0), &[0.0; 2]), Err(Reject::WrongLength(_))));
    assert_eq!(w.handle_gradient(now, ComputeId(0), &[0.0, f64::NAN, 0.0]), Err(Reject::NotFinite));
    w.handle_gradient(now, ComputeId(0), &[7.0, 8.0, 9.0]).unwrap();
    let grads = |v: &[f64]| ToServerOwned::Grad { base: 0, iteration: 0, seq: 0, values: v.to_vec() };
    assert_eq!(drain(&mut w), [Out::Send(0, grads(&[7.0, 8.0])), Out::Send(1, grads(&[9.0]))]);
    assert_eq!(w.handle_gradient(now, ComputeId(0), &[7.0, 8.0, 9.0]), Err(Reject::NoSuchComputation));
    // A shard that moves on abandons the assembled computation; it is asked again with the
    // other shard's slice unchanged.
    w.handle(now, 0, model(1, &[1.5, 2.5])).unwrap();
    w.handle(now, 1, model(1, &[3.5])).unwrap();
    assert_eq!(drain(&mut w), [Out::Compute(1, 1, vec![1.5, 2.5, 3.5])]);
    w.handle(now, 1, model(2, &[4.0])).unwrap();
    assert_eq!(
        drain(&mut w),
        [Out::Event(WorkerEvent::Abandoned { id: ComputeId(1) }), Out::Compute(2, 1, vec![1.5, 2.5, 4.0])]
    );
    assert_eq!(w.handle_gradient(now, ComputeId(1), &[0.0; 3]), Err(Reject::NoSuchComputation));
    // An abort from one shard abandons it and nothing is computed until that shard sends a model.
    w.handle(now, 0, ToWorker::Abort { iteration: 1 }).unwrap();
    assert_eq!(drain(&mut w), [Out::Event(WorkerEvent::Abandoned { id: ComputeId(2) })]);
    assert_eq!(w.handle_gradient(now, ComputeId(2), &[0.0; 3]), Err(Reject::NoSuchComputation));
    // Stopped once every shard said so.
    w.handle(now, 0, ToWorker::Stop).unwrap();
    assert!(!w.is_stopped());
    assert_eq!(drain(&mut w), []);
    w.handle(now, 1, ToWorker::Stop).unwrap();
    assert!(w.is_stopped());
    assert_eq!(drain(&mut w), [Out::Event(WorkerEvent::Stopped)]);
    assert_eq!(w.outputs_lost(), 0);
}

#[test]
fn a_reported_loss_goes_with_every_shard_slice_and_a_non_finite_one_reaches_none() {
    let config = ProtocolConfig::Bsp(BspConfig::new(1, 0.5));
    let layout = ShardLayout::new(3, 2).unwrap();
    let mut w = ShardedWorker::allocated(&config, setup(0), layout).unwrap();
    drain(&mut w);
    let now = Instant::ZERO;
    w.handle(now, 0, model(0, &[1.0, 2.0])).unwrap();
    w.handle(now, 1, model(0, &[3.0])).unwrap();
    assert_eq!(drain(&mut w), [Out::Compute(0, 0, vec![1.0, 2.0, 3.0])]);
    let grad = [7.0, 8.0, 9.0];
    assert_eq!(w.handle_gradient_with_loss(now, ComputeId(0), &grad, Some(f32::NAN)), Err(Reject::LossNotFinite));
    assert_eq!(drain(&mut w), [], "a refused gradient reaches no shard");
    w.handle_gradient_with_loss(now, ComputeId(0), &grad, Some(0.75)).unwrap();
    let mut losses = Vec::new();
    while let Some(o) = w.poll_output() {
        if let ShardedOutput::Send { shard, msg } = o {
            losses.push((shard, msg.loss()));
        }
    }
    assert_eq!(losses, [(0, Some(0.75)), (1, Some(0.75))]);
}

#[test]
fn timeouts_reach_every_inner_worker() {
    let config = ProtocolConfig::Bsp(BspConfig::new(1, 0.5));
    let mut s = setup(0);
    s.rejoin_after = Some(Duration::from_millis(10));
    let mut w = ShardedWorker::allocated(&config, s, ShardLayout::new(2, 2).unwrap()).unwrap();
    let _ = drain(&mut w);
    let at = w.poll_timeout().unwrap();
    assert_eq!(at, Instant::ZERO + Duration::from_millis(10));
    w.handle_timeout(at);
    assert_eq!(
        drain(&mut w),
        [Out::Send(0, ToServerOwned::Join { epoch: 0 }), Out::Send(1, ToServerOwned::Join { epoch: 0 })]
    );
}

/// Something in flight in the lockstep network.
#[derive(Debug)]
enum Msg {
    Up { worker: u32, shard: u32, msg: ToServerOwned },
    Down { worker: u32, shard: u32, msg: ToWorkerOwned },
    Done { worker: u32, id: ComputeId, grad: Vec<f64> },
}

/// A worker's pending outputs: messages with their shard, computations with their params.
type Outputs = (Vec<(u32, ToServerOwned)>, Vec<(ComputeId, Vec<f64>)>);

/// One output of a worker as the lockstep network reads it.
enum HostOutput {
    /// A message for the server of this shard.
    Send(u32, ToServerOwned),
    /// A computation on these params.
    Compute(ComputeId, Vec<f64>),
    /// An event (the network ignores it).
    Event,
}

/// A worker as the lockstep network drives it: plain (one server) or sharded.
trait HostWorker {
    fn deliver(&mut self, now: Instant, shard: u32, msg: ToWorker<'_, f64>);
    fn gradient(&mut self, now: Instant, id: ComputeId, grad: &[f64]);
    /// The next pending output, if any.
    fn next_output(&mut self) -> Option<HostOutput>;
    /// The pending outputs: messages with their shard, computations with their params.
    fn outputs(&mut self) -> Outputs {
        let (mut sends, mut jobs) = (Vec::new(), Vec::new());
        while let Some(o) = self.next_output() {
            match o {
                HostOutput::Send(shard, msg) => sends.push((shard, msg)),
                HostOutput::Compute(id, params) => jobs.push((id, params)),
                HostOutput::Event => {}
            }
        }
        (sends, jobs)
    }
}

impl HostWorker for AnyWorker<f64, Vec<f64>> {
    fn deliver(&mut self, now: Instant, _shard: u32, msg: ToWorker<'_, f64>) {
        let _ = self.handle(now, msg);
    }
    fn gradient(&mut self, now: Instant, id: ComputeId, grad: &[f64]) {
        let _ = self.handle_gradient(now, id, grad);
    }
    fn next_output(&mut self) -> Option<HostOutput> {
        self.poll_output().map(|o| match o {
            WorkerOutput::Send(m) => HostOutput::Send(0, ToServerOwned::from(&m)),
            WorkerOutput::Compute { id, params, .. } => HostOutput::Compute(id, params.to_vec()),
            WorkerOutput::Event(_) => HostOutput::Event,
        })
    }
}

impl HostWorker for HeapShardedWorker<f64> {
    fn deliver(&mut self, now: Instant, shard: u32, msg: ToWorker<'_, f64>) {
        let _ = self.handle(now, shard, msg);
    }
    fn gradient(&mut self, now: Instant, id: ComputeId, grad: &[f64]) {
        let _ = self.handle_gradient(now, id, grad);
    }
    fn next_output(&mut self) -> Option<HostOutput> {
        self.poll_output().map(|o| match o {
            ShardedOutput::Send { shard, msg } => HostOutput::Send(shard, ToServerOwned::from(&msg)),
            ShardedOutput::Compute { id, params, .. } => HostOutput::Compute(id, params.to_vec()),
            ShardedOutput::Event(_) => HostOutput::Event,
        })
    }
}

/// What a lockstep run ends with: per server, its slice of the model when its version first
/// reached the target (with that version) and its counters; per server, what the workers
/// sent it.
struct Outcome {
    snapshots: Vec<Option<(u64, Vec<f64>, ServerStats)>>,
    stats: Vec<ServerStats>,
    sent: Vec<WorkerStats>,
    in_flight: Vec<u64>,
}

/// The deterministic gradient of worker `w` at `params`: elementwise, so a slice of it is the
/// gradient of the slice.
fn gradient(w: u32, params: &[f64]) -> Vec<f64> {
    params.iter().enumerate().map(|(i, p)| 0.5 * p + 0.1 * f64::from(w + 1) * (i as f64 + 1.0) - 0.3).collect()
}

/// Runs `servers` (one per shard of `layout`) and `workers` over a FIFO network that
/// delivers one message at a time, until every server's version reached `target` or the
/// step budget ran out. Time advances one millisecond per finished computation.
fn lockstep<W: HostWorker>(
    layout: ShardLayout,
    mut servers: Vec<AnyServer<f64, Vec<f64>>>,
    mut workers: Vec<W>,
    target: u64,
) -> Outcome {
    let shards = servers.len();
    let mut fifo: VecDeque<Msg> = VecDeque::new();
    let mut sent = vec![WorkerStats::default(); shards];
    let mut snapshots: Vec<Option<(u64, Vec<f64>, ServerStats)>> = vec![None; shards];
    let mut now = Instant::ZERO;
    let mut buf = Vec::new();
    let push_worker = |fifo: &mut VecDeque<Msg>, sent: &mut Vec<WorkerStats>, w: u32, worker: &mut W| {
        let (sends, jobs) = worker.outputs();
        for (shard, msg) in sends {
            sent[shard as usize].record(&msg.as_msg::<f64>(&mut Vec::new()));
            fifo.push_back(Msg::Up { worker: w, shard, msg });
        }
        for (id, params) in jobs {
            // The assembled model is the whole model: its element indices are global.
            fifo.push_back(Msg::Done { worker: w, id, grad: gradient(w, &params) });
        }
    };
    for (w, worker) in workers.iter_mut().enumerate() {
        push_worker(&mut fifo, &mut sent, w as u32, worker);
    }
    for _ in 0..20_000 {
        if snapshots.iter().all(Option::is_some) {
            break;
        }
        let Some(msg) = fifo.pop_front() else { break };
        match msg {
            Msg::Up { worker, shard, msg } => {
                let server = &mut servers[shard as usize];
                let _ = server.handle(now, WorkerId(worker), msg.as_msg(&mut buf));
                while let Some(out) = server.poll_output() {
                    if let ServerOutput::Send { to, msg } = out {
                        let owned = ToWorkerOwned::from(&msg);
                        let targets: Vec<u32> = match to {
                            Recipient::Worker(w) => vec![w.0],
                            Recipient::AllWorkers => (0..workers.len() as u32).collect(),
                        };
                        for w in targets {
                            fifo.push_back(Msg::Down { worker: w, shard, msg: owned.clone() });
                        }
                    }
                }
                if snapshots[shard as usize].is_none() && server.version().0 >= target {
                    snapshots[shard as usize] = Some((server.version().0, server.params().to_vec(), *server.stats()));
                }
            }
            Msg::Down { worker, shard, msg } => {
                let w = &mut workers[worker as usize];
                w.deliver(now, shard, msg.as_msg(&mut buf));
                push_worker(&mut fifo, &mut sent, worker, w);
            }
            Msg::Done { worker, id, grad } => {
                now = now + Duration::from_millis(1);
                let w = &mut workers[worker as usize];
                w.gradient(now, id, &grad);
                push_worker(&mut fifo, &mut sent, worker, w);
            }
        }
    }
    let mut in_flight = vec![0u64; shards];
    for m in &fifo {
        if let Msg::Up {
            shard,
            msg: ToServerOwned::Grad { .. } | ToServerOwned::Delta { .. } | ToServerOwned::Clock { .. },
            ..
        } = m
        {
            in_flight[*shard as usize] += 1;
        }
    }
    let _ = layout;
    Outcome { snapshots, stats: servers.iter().map(|s| *s.stats()).collect(), sent, in_flight }
}

fn initial(dim: usize) -> Vec<f64> {
    (0..dim).map(|i| 1.0 - 0.25 * i as f64).collect()
}

fn servers(config: &ProtocolConfig, layout: ShardLayout) -> Vec<AnyServer<f64, Vec<f64>>> {
    let start = initial(layout.dim());
    (0..layout.shards())
        .map(|k| {
            let r = layout.range(k).unwrap();
            let scratch = vec![0.0; config.server_scratch_len(r.len())];
            AnyServer::new(config, start[r].to_vec(), scratch).unwrap()
        })
        .collect()
}

fn configs(n: u32) -> Vec<ProtocolConfig> {
    let mut wbsp_overlap = WbspConfig::new(n, 0.1);
    wbsp_overlap.overlap = true;
    vec![
        ProtocolConfig::Bsp(BspConfig::new(n, 0.1)),
        ProtocolConfig::Asp(AspConfig::new(n, 0.1)),
        ProtocolConfig::Backup(BackupConfig::new(n, 0.1, n.saturating_sub(1).min(1))),
        ProtocolConfig::Dbw(DbwConfig::new(n, 0.1)),
        ProtocolConfig::Wbsp(WbspConfig::new(n, 0.1)),
        ProtocolConfig::Wbsp(wbsp_overlap),
        ProtocolConfig::Grouped(GroupedConfig::new(n, 0.1, n.min(2))),
        ProtocolConfig::Ssp(SspConfig::new(n, 0.1, 1)),
        ProtocolConfig::Bap(BapConfig::new(n, 0.1, 1)),
    ]
}

/// Every contribution a worker sent a shard is accepted, refused, or still in flight; every
/// accepted one is applied, dropped, or held by the shard.
fn assert_ledger(out: &Outcome, name: &str) {
    for (k, (stats, sent)) in out.stats.iter().zip(&out.sent).enumerate() {
        let (contributions, resent) = (sent.contributions + sent.resent, out.in_flight[k]);
        assert!(
            stats.accepted + stats.rejected + resent >= contributions && stats.accepted + resent <= contributions,
            "{name}: shard {k}: sent {contributions}, accepted {}, refused {}, in flight {resent}",
            stats.accepted,
            stats.rejected
        );
        assert!(stats.applied + stats.dropped_total() <= stats.accepted, "{name}: shard {k}: {stats:?}");
        assert_eq!(stats.outputs_lost, 0, "{name}: shard {k}");
    }
}

proptest::proptest! {
    #![proptest_config(proptest::prelude::ProptestConfig::with_cases(48))]
    // With the same inputs in the same order, `S` shards each running the unchanged protocol
    // over its slice give the unsharded run's model, bit for bit, slice by slice, at the
    // same version, and each shard's counters are the unsharded server's: a gradient's
    // fate does not depend on its slice. Every shard's ledger balances. DBW, whose choice of
    // k depends on the norms each shard sees, is held to the ledger only.
    #[test]
    fn sharded_runs_assemble_the_unsharded_model(
        n in 1u32..5,
        shards in 1u32..5,
        extra in 0usize..9,
        target in 1u64..6,
    ) {
        let dim = shards as usize + extra;
        let layout = ShardLayout::new(dim, shards).unwrap();
        let whole = ShardLayout::new(dim, 1).unwrap();
        for config in configs(n) {
            let name = config.name();
            let plain: Vec<AnyWorker<f64, Vec<f64>>> = (0..n)
                .map(|w| AnyWorker::new(&config, setup(w), vec![0.0; dim], vec![0.0; dim]).unwrap())
                .collect();
            let reference = lockstep(whole, servers(&config, whole), plain, target);
            let sharded: Vec<_> =
                (0..n).map(|w| ShardedWorker::allocated(&config, setup(w), layout).unwrap()).collect();
            let got = lockstep(layout, servers(&config, layout), sharded, target);
            assert_ledger(&reference, name);
            assert_ledger(&got, name);
            if let ProtocolConfig::Dbw(_) = config {
                // DBW's k comes from each shard's own norm estimates: every shard reaches the
                // target and balances its ledger, its model may differ (docs/PROTOCOLS.md,
                // "Sharded servers").
                proptest::prop_assert!(got.snapshots.iter().all(Option::is_some));
                continue;
            }
            let (version, model, b) = reference.snapshots[0].clone().expect("the unsharded run reaches the target");
            for k in 0..shards {
                let (v, slice, a) = got.snapshots[k as usize].clone().expect("every shard reaches the target");
                let r = layout.range(k).unwrap();
                proptest::prop_assert_eq!(v, version, "{} shard {}", name, k);
                let bits = |xs: &[f64]| xs.iter().map(|x| x.to_bits()).collect::<Vec<_>>();
                proptest::prop_assert_eq!(bits(&slice), bits(&model[r]), "{} shard {}", name, k);
                proptest::prop_assert_eq!((a.applied, a.dropped, a.updates), (b.applied, b.dropped, b.updates), "{} shard {}", name, k);
            }
        }
    }
}

/// A `Compute`'s params are the contents of `params_buffer`, for one server's worker of
/// every protocol and for a sharded worker: a transport may hand the buffer to another
/// thread instead of a copy.
#[test]
fn a_computes_params_are_the_params_buffer() {
    use crate::msg::Values;
    use crate::proto::{Worker, WorkerOutput};
    let model = [0.25f64; 5];
    let configs = [
        ProtocolConfig::Bsp(BspConfig::new(2, 0.5)),
        ProtocolConfig::Asp(AspConfig::new(2, 0.5)),
        ProtocolConfig::Ssp(SspConfig::new(2, 0.5, 3)),
        ProtocolConfig::Bap(BapConfig::new(2, 0.5, 1)),
        ProtocolConfig::Wbsp(WbspConfig::new(2, 0.5)),
    ];
    for config in configs {
        let mut w = AnyWorker::new(&config, setup(0), vec![0.0; 5], vec![0.0; config.worker_scratch_len(5)]).unwrap();
        while w.poll_output().is_some() {}
        w.handle(Instant::ZERO, ToWorker::Model { version: Version(1), clock: 1, values: Values::Slice(&model) })
            .unwrap();
        let mut seen = None;
        while let Some(out) = w.poll_output() {
            if let WorkerOutput::Compute { params, .. } = out {
                seen = Some((params.as_ptr(), params.len()));
            }
        }
        let buf = w.params_buffer();
        assert_eq!(seen, Some((buf.as_ptr(), buf.len())), "{}", config.name());
    }
    let config = ProtocolConfig::Bsp(BspConfig::new(2, 0.5));
    let layout = ShardLayout::new(5, 2).unwrap();
    let slots = vec![inner(&config, 0, 3), inner(&config, 0, 2)];
    let mut w = ShardedWorker::new(layout, slots, vec![0.0; 5]).unwrap();
    while w.poll_output().is_some() {}
    for (k, part) in [(0u32, &model[..3]), (1, &model[3..])] {
        w.handle(Instant::ZERO, k, ToWorker::Model { version: Version(1), clock: 1, values: Values::Slice(part) })
            .unwrap();
    }
    let mut seen = None;
    while let Some(out) = w.poll_output() {
        if let ShardedOutput::Compute { params, .. } = out {
            seen = Some((params.as_ptr(), params.len(), params.to_vec()));
        }
    }
    let buf = w.params_buffer();
    assert_eq!(seen, Some((buf.as_ptr(), buf.len(), model.to_vec())));
}

#[test]
fn a_restarted_shard_abandons_the_assembled_computation_and_joins_again() {
    let config = ProtocolConfig::Bsp(BspConfig::new(1, 0.5));
    let layout = ShardLayout::new(3, 2).unwrap();
    let mut w = ShardedWorker::allocated(&config, setup(4), layout).unwrap();
    let _ = drain(&mut w);
    let now = Instant::ZERO;
    w.handle(now, 0, model(0, &[1.0, 2.0])).unwrap();
    w.handle(now, 1, model(0, &[3.0])).unwrap();
    assert_eq!(drain(&mut w), [Out::Compute(0, 0, vec![1.0, 2.0, 3.0])]);
    let fresh = |id: u32, epoch: u32, len: usize| {
        let setup = WorkerSetup { id: WorkerId(id), epoch, rejoin_after: None };
        AnyWorker::new(&config, setup, vec![0.0; len], vec![0.0; len]).unwrap()
    };
    assert_eq!(w.restart_shard(1, fresh(4, 1, 2)).err(), Some(ConfigError::ShardLayout { dim: 3, shards: 2 }));
    assert_eq!(w.restart_shard(2, fresh(4, 1, 1)).err(), Some(ConfigError::ShardLayout { dim: 3, shards: 2 }));
    assert_eq!(w.restart_shard(1, fresh(5, 1, 1)).err(), Some(ConfigError::Knob("shard worker id")));
    w.restart_shard(1, fresh(4, 1, 1)).unwrap();
    assert_eq!(
        drain(&mut w),
        [Out::Event(WorkerEvent::Abandoned { id: ComputeId(0) }), Out::Send(1, ToServerOwned::Join { epoch: 1 })]
    );
    assert_eq!(w.handle_gradient(now, ComputeId(0), &[0.0; 3]), Err(Reject::NoSuchComputation));
    // Shard 0's computation stands; the new session's model completes the next one.
    w.handle(now, 1, model(5, &[9.0])).unwrap();
    assert_eq!(drain(&mut w), [Out::Compute(1, 0, vec![1.0, 2.0, 9.0])]);
    w.handle_gradient(now, ComputeId(1), &[1.0, 1.0, 1.0]).unwrap();
    // The new session's sequence numbers carry its epoch.
    let grad = |base: u64, seq: u64, v: &[f64]| ToServerOwned::Grad { base, iteration: 0, seq, values: v.to_vec() };
    assert_eq!(drain(&mut w), [Out::Send(0, grad(0, 0, &[1.0, 1.0])), Out::Send(1, grad(5, 1 << 32, &[1.0]))]);
}
