//! Sharded servers in the simulator: every protocol learns digits to 0.90 with the model
//! split over 2 and 3 shards, every shard's ledger balances, sharded BSP learns what the
//! unsharded server does, co-located shards bring a BSP round near a ring allreduce, and a model that does not split into S slices of at least one
//! element is refused at start.

use syncopate::proto::asp::AspConfig;
use syncopate::proto::backup::BackupConfig;
use syncopate::proto::bap::BapConfig;
use syncopate::proto::bsp::BspConfig;
use syncopate::proto::dbw::DbwConfig;
use syncopate::proto::grouped::GroupedConfig;
use syncopate::proto::ssp::SspConfig;
use syncopate::proto::wbsp::WbspConfig;
use syncopate::{ConfigError, ProtocolConfig};
use syncopate_adapters::sim::{self, ComputeModel, GradientSource, SimConfig, SimError};
use syncopate_adapters::workload::{ModelKind, Workload};

const N: u32 = 8;
const LR: f64 = 0.5;

fn protocols() -> Vec<ProtocolConfig> {
    vec![
        ProtocolConfig::Bsp(BspConfig::new(N, LR)),
        ProtocolConfig::Asp(AspConfig::new(N, 0.1)),
        ProtocolConfig::Backup(BackupConfig::new(N, LR, 1)),
        ProtocolConfig::Dbw(DbwConfig::new(N, LR)),
        ProtocolConfig::Wbsp(WbspConfig::new(N, LR)),
        ProtocolConfig::Wbsp(WbspConfig { overlap: true, ..WbspConfig::new(N, LR) }),
        ProtocolConfig::Grouped(GroupedConfig::new(N, LR, 2)),
        ProtocolConfig::Ssp(SspConfig::new(N, LR, 3)),
        ProtocolConfig::Bap(BapConfig::new(N, LR, 1)),
    ]
}

#[test]
fn every_protocol_learns_digits_on_two_and_three_shards_and_every_ledger_balances() {
    let w = Workload::digits(ModelKind::Softmax, 1);
    for protocol in protocols() {
        for shards in [2, 3] {
            for colocate in [false, true] {
                let c = SimConfig::new(protocol, ModelKind::Softmax)
                    .with_compute(ComputeModel::one_straggler(N, 3, 2.0))
                    .with_shards(shards, colocate)
                    .stop_at_target(0.90)
                    .with_max_updates(40_000);
                let r = sim::run(&c, &w);
                eprintln!(
                    "{:>5} S={shards} colocated {colocate}: time to 0.90 {:?} s, updates {}, {}",
                    r.protocol, r.time_to_target, r.updates, r.stop_reason
                );
                assert_eq!(r.stop_reason, "target", "{} S={shards}", r.protocol);
                assert!(r.final_accuracy >= 0.90, "{} S={shards}: {}", r.protocol, r.final_accuracy);
                assert_eq!(r.codec_errors, 0);
                assert_eq!(r.shards.len(), shards as usize);
                assert_eq!(r.shards.iter().map(|s| s.elements).sum::<usize>(), w.model.dim());
                for s in &r.shards {
                    assert!(s.balanced(), "{} S={shards}: shard {} does not balance: {s:?}", r.protocol, s.shard);
                    assert!(s.applied > 0, "{} shard {}", r.protocol, s.shard);
                }
            }
        }
    }
}

#[test]
fn sharded_bsp_learns_as_the_unsharded_server_does() {
    // The same minibatches and the same rounds; only the order in which a round's gradients
    // are summed differs between shards (their arrival order), so the models agree to
    // rounding (bit for bit in the core's lockstep proptest, where the order is the same).
    let w = Workload::digits(ModelKind::Softmax, 1);
    let c = SimConfig::new(ProtocolConfig::Bsp(BspConfig::new(4, LR)), ModelKind::Softmax).with_max_updates(30);
    let one = sim::run(&c, &w);
    for shards in [2, 3, 7] {
        let r = sim::run(&c.clone().with_shards(shards, false), &w);
        assert_eq!(r.updates, 30);
        let gap = r.final_params.iter().zip(&one.final_params).map(|(a, b)| (a - b).abs()).fold(0.0f32, f32::max);
        assert!(gap < 1e-4, "S={shards}: {gap}");
        assert_eq!(r.applied, one.applied * u64::from(shards));
        assert!(r.shards.iter().all(|s| s.balanced() && s.applied == one.applied));
    }
}

#[test]
fn co_located_shards_make_a_bsp_round_close_to_a_ring_allreduce() {
    // 16 workers, 10^6 parameters (4 MB), 10 Gb/s cards, 50 us latency, no compute time:
    // the round is communication only. One server receives and sends n·d floats; S = n
    // co-located shards move 2(n−1)/n·d per card, as a ring allreduce does.
    let n = 16u32;
    let dim = 1_000_000;
    let w = Workload::nqm(dim, 1, 1);
    let mut c = SimConfig::new(ProtocolConfig::Bsp(BspConfig::new(n, 0.1)), ModelKind::Nqm { dim })
        .with_gradient(GradientSource::Constant(0.0))
        .with_max_updates(3);
    c.base_step = syncopate::Duration::ZERO;
    c.eval_interval = syncopate::Duration::ZERO;
    c.network.bandwidth = 1.25e9;
    c.network.latency = syncopate::Duration::from_micros(50);
    let round = |r: &sim::SimReport| {
        r.shards.iter().map(|s| (s.update_times_s[2] - s.update_times_s[0]) / 2.0).fold(0.0f64, f64::max)
    };
    let one = sim::try_run_sharded(&c.clone().with_shards(1, false), &w).unwrap();
    let per_round_one = round(&one);
    let sharded = sim::run(&c.clone().with_shards(n, true), &w);
    let ring = 2.0 * f64::from(n - 1) / f64::from(n) * dim as f64 * 4.0 / 1.25e9 + 2.0 * f64::from(n - 1) * 50e-6;
    let t = round(&sharded);
    eprintln!("one server {per_round_one:.4} s/round, {n} co-located shards {t:.4} s/round, ring {ring:.4} s");
    assert!(t < 1.2 * ring, "{t} against {ring}");
    assert!(t * 4.0 < per_round_one);
}

#[test]
fn a_model_that_does_not_split_into_s_slices_is_refused_at_start() {
    let w = Workload::nqm(3, 4, 1);
    let c =
        SimConfig::new(ProtocolConfig::Bsp(BspConfig::new(2, 0.1)), ModelKind::Nqm { dim: 3 }).with_shards(4, false);
    assert_eq!(sim::try_run(&c, &w).err(), Some(SimError::Config(ConfigError::ShardLayout { dim: 3, shards: 4 })));
    let c = c.with_shards(0, false);
    assert_eq!(sim::try_run(&c, &w).err(), Some(SimError::Config(ConfigError::ShardLayout { dim: 3, shards: 0 })));
    let c = c.with_shards(3, true);
    assert_eq!(sim::try_run(&c, &w).err(), Some(SimError::Unsupported("more co-located shards than workers")));
}
