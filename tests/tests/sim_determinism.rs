//! The simulator is deterministic: the same config and seed give the same report, event
//! trace and final model bits; another seed gives another run.

use syncopate::ProtocolConfig;
use syncopate::proto::asp::AspConfig;
use syncopate::proto::bsp::BspConfig;
use syncopate_adapters::sim::{self, ComputeModel, SimConfig};
use syncopate_adapters::workload::ModelKind;

fn config(protocol: ProtocolConfig, seed: u64) -> SimConfig {
    let n = protocol.workers();
    // Random straggler draws exercise the seeded samplers too.
    let mut compute = ComputeModel::all(n, &ComputeModel::ShiftedExp { shift: 1.0, rate: 2.0 });
    compute[1] = ComputeModel::Bursts { probability: 0.1, factor: 4.0, length: 3 };
    SimConfig::new(protocol, ModelKind::Softmax).with_seed(seed).with_compute(compute).with_max_updates(60)
}

#[test]
fn same_seed_same_report() {
    for protocol in [ProtocolConfig::Bsp(BspConfig::new(4, 0.5)), ProtocolConfig::Asp(AspConfig::new(4, 0.1))] {
        let c = config(protocol, 11);
        let w = c.digits_workload();
        let a = sim::run(&c, &w);
        let b = sim::run(&c, &w);
        assert_eq!(a, b, "{}", a.protocol);
        assert_eq!(a.trace_hash, b.trace_hash);
        assert_eq!(a.final_params_hash, b.final_params_hash);
        assert_eq!(
            a.final_params.iter().map(|x| x.to_bits()).collect::<Vec<_>>(),
            b.final_params.iter().map(|x| x.to_bits()).collect::<Vec<_>>()
        );
        assert!(a.events > 100 && a.updates == 60);
        assert_eq!(a.codec_errors, 0);
        // The JSON form is identical too.
        let (ja, jb) = (serde_json::to_string(&a).unwrap(), serde_json::to_string(&b).unwrap());
        assert_eq!(ja, jb);
        assert!(ja.contains("\"trace_hash\""));
    }
}

#[test]
fn different_seed_different_run() {
    let protocol = ProtocolConfig::Asp(AspConfig::new(4, 0.1));
    let a = config(protocol, 1);
    let b = config(protocol, 2);
    let w = a.digits_workload();
    let (ra, rb) = (sim::run(&a, &w), sim::run(&b, &w));
    assert_ne!(ra.trace_hash, rb.trace_hash);
    assert_ne!(ra.final_params_hash, rb.final_params_hash);
    assert_ne!(ra.compute_trace, rb.compute_trace);
}

#[test]
fn recorded_trace_replays_the_same_timing() {
    // Record the step times of a random-straggler run, replay them as traces: same schedule.
    let protocol = ProtocolConfig::Bsp(BspConfig::new(3, 0.5));
    let c = config(protocol, 5);
    let w = c.digits_workload();
    let recorded = sim::run(&c, &w);
    let replay = c.clone().with_compute((0..3).map(|i| ComputeModel::Trace(recorded.worker_trace(i))).collect());
    let replayed = sim::run(&replay, &w);
    assert_eq!(replayed.virtual_time_s, recorded.virtual_time_s);
    assert_eq!(replayed.final_params_hash, recorded.final_params_hash);
    assert_eq!(replayed.curve, recorded.curve);
}
