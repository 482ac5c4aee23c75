//! A TCP run under a server-side update rule, stopped at a checkpoint and resumed from it,
//! ends bit for bit where the same run without the stop ends: the checkpoint holds the rule's
//! whole state (AdamW's moments and update count, the schedule's position), and the rule is
//! in the run's settings.

use std::path::PathBuf;
use std::thread;
use syncopate::proto::{AdamW, Optimizer, Schedule};
use syncopate::{Version, WorkerId};
use syncopate_transport::protocol_spec::ProtocolKind;
use syncopate_transport::tcp::checkpoint;
use syncopate_transport::tcp::{ProtocolSettings, RunPlan, RunSettings, ServerOptions, TcpServer, WorkerOptions};

const DIM: usize = 5;

/// The gradient of `0.5·|x − t|²` (a deterministic function of the model).
fn gradient(params: &[f32], grad: &mut [f32]) {
    for (i, (g, x)) in grad.iter_mut().zip(params).enumerate() {
        *g = *x - (i as f32 * 0.5 - 1.0);
    }
}

fn settings(optimizer: Optimizer) -> RunSettings {
    let mut s = RunSettings::new(ProtocolSettings::named(ProtocolKind::Bsp, 1, 0.05), DIM);
    s.optimizer = optimizer;
    s
}

/// One BSP run with one worker from `params` at `version` for `gradients` gradients; the
/// final model and version. `checkpoint`: written every update and at the end; `state`:
/// the rule's state to go on from.
fn run(
    optimizer: Optimizer,
    params: Vec<f32>,
    version: Version,
    gradients: u64,
    checkpoint: Option<PathBuf>,
    state: Option<Vec<f32>>,
) -> (Vec<f32>, Version) {
    let mut options = ServerOptions::new(settings(optimizer));
    options.checkpoint = checkpoint.map(|p| (p, 1));
    options.optimizer_state = state;
    let server = TcpServer::bind("127.0.0.1:0", options).unwrap();
    let addr = server.local_addr().unwrap().to_string();
    let worker = thread::spawn(move || {
        let mut job = |p: &[f32], g: &mut [f32]| gradient(p, g);
        syncopate_transport::tcp::run_worker(&WorkerOptions::new(addr, WorkerId(0)), &mut job, &mut |_| {})
    });
    let plan = RunPlan { max_gradients: gradients, time_limit: Some(core::time::Duration::from_secs(60)) };
    let report = server.run(params, version, &plan, &mut |_| {}).unwrap();
    worker.join().unwrap().unwrap();
    (report.params, report.version)
}

#[test]
fn a_run_resumed_from_its_checkpoint_ends_where_the_uninterrupted_run_ends() {
    let dir = std::env::temp_dir().join(format!("syncopate-optimizer-resume-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let path = dir.join("m.ckpt");
    let rules = [
        Optimizer::adamw(AdamW { weight_decay: 0.1, ..AdamW::default() }).with_schedule(Schedule::WarmupCosine {
            warmup: 4,
            total: 16,
            floor: 0.1,
        }),
        Optimizer::nesterov(0.8).with_schedule(Schedule::Step { every: 3, gamma: 0.5 }),
        Optimizer::momentum(0.9),
    ];
    for optimizer in rules {
        let start = vec![0.25f32; DIM];
        let (whole, at) = run(optimizer, start.clone(), Version::ZERO, 12, None, None);
        assert_eq!(at, Version(12));
        let (half, at) = run(optimizer, start, Version::ZERO, 6, Some(path.clone()), None);
        assert_eq!(at, Version(6));
        let c = checkpoint::load(&path, "bsp", DIM).unwrap();
        assert_eq!((c.optimizer, c.version, &c.params), (optimizer, Version(6), &half));
        let state = c.optimizer_state.clone();
        assert_eq!(state.as_ref().map(Vec::len), Some(optimizer.state_len(DIM)));
        let (resumed, at) = run(optimizer, c.params, c.version, 6, None, state);
        assert_eq!(at, Version(12));
        let bits = |v: &[f32]| v.iter().map(|x| x.to_bits()).collect::<Vec<_>>();
        assert_eq!(bits(&resumed), bits(&whole), "{optimizer:?}: the resumed run went elsewhere");
        // Without its state the resumed run goes elsewhere: the test can tell.
        if optimizer.rule_name() == "adamw" {
            let (fresh, _) = run(optimizer, c_params(&path), Version(6), 6, None, None);
            assert_ne!(bits(&fresh), bits(&whole));
        }
    }
    std::fs::remove_dir_all(&dir).unwrap();
}

fn c_params(path: &std::path::Path) -> Vec<f32> {
    checkpoint::load(path, "bsp", DIM).unwrap().params
}

#[test]
fn a_rule_mean_server_refuses_checkpoints_and_a_state_of_another_length_is_refused() {
    let mut options = ServerOptions::new(settings(Optimizer::MEAN));
    options.checkpoint = Some((std::env::temp_dir().join("never.ckpt"), 1));
    let e = TcpServer::bind("127.0.0.1:0", options).err().unwrap();
    assert!(e.0.contains("no checkpoints under update rule mean"), "{}", e.0);
    let o = Optimizer::adamw(AdamW::default());
    let mut options = ServerOptions::new(settings(o));
    options.optimizer_state = Some(vec![0.0; 3]);
    let server = TcpServer::bind("127.0.0.1:0", options).unwrap();
    let plan = RunPlan { max_gradients: 1, time_limit: Some(core::time::Duration::from_secs(5)) };
    let e = server.run(vec![0.0; DIM], Version(3), &plan, &mut |_| {}).err().unwrap();
    assert!(e.0.contains("has 3 elements, the rule keeps 50"), "{}", e.0);
}
