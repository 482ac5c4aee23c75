//! Dynamic backup workers against every static number of backup workers, in the simulator:
//! 16 workers whose compute times are shifted-exponential (`base · (1 + Exp(1))`, so the
//! random part is as large as the fixed part on average) learning digits with softmax
//! regression. DBW, untuned, reaches 0.90 test accuracy within 1.2× of the best static `b`
//! (mean over seeds 1..=16: measured 1.08×; on the held-out seeds 17..=32: 1.08×), far ahead
//! of BSP, and its `b_t` trajectory is printed (mean over the seeds by version, and seed 1
//! in full). The minimum over 16 noisy static means is biased low, so the test also prints
//! DBW against a static `b` tuned on the other seed set (as a user tuning `b` by preliminary
//! runs would): measured 1.06× and 1.02×, pooled 1.04×.
//!
//! The table and trajectory: `cargo test -p syncopate-tests --test dbw_sweep -- --nocapture`.

use syncopate::proto::backup::BackupConfig;
use syncopate::proto::dbw::DbwConfig;
use syncopate::{Duration, ProtocolConfig, ServerEvent};
use syncopate_adapters::sim::{self, ComputeModel, Observation, SimConfig, SimReport};
use syncopate_adapters::workload::{ModelKind, Workload};

const N: u32 = 16;
const LR: f64 = 0.5;
const BATCH: usize = 16;
const TARGET: f64 = 0.90;
/// Time to target varies a lot between seeds; the comparison is of means over a seed set.
/// The assertion is on the first set; the second, disjoint one checks that the result is
/// not an artefact of those seeds.
const SEEDS: std::ops::RangeInclusive<u64> = 1..=16;
const HOLDOUT: std::ops::RangeInclusive<u64> = 17..=32;

fn config(protocol: ProtocolConfig, seed: u64) -> SimConfig {
    let mut c = SimConfig::new(protocol, ModelKind::Softmax)
        .with_seed(seed)
        .with_compute(ComputeModel::all(N, &ComputeModel::ShiftedExp { shift: 1.0, rate: 1.0 }))
        .stop_at_target(TARGET)
        .with_max_updates(5_000);
    c.batch_size = BATCH;
    c.eval_interval = Duration::from_millis(5);
    c
}

/// One DBW decision: version, k, τ̂(k), observed time of the previous iteration, Lη, Ĝ, Ŝ.
type Decision = (u64, u32, f32, f32, f32, f32, f32);

fn run(protocol: ProtocolConfig, seed: u64, w: &Workload) -> (SimReport, Vec<Decision>) {
    let mut decisions = Vec::new();
    let report = sim::run_observed(&config(protocol, seed), w, &mut |o| {
        if let Observation::Server {
            event:
                ServerEvent::BackupChosen {
                    version,
                    k,
                    tau_estimate,
                    observed_iteration_time,
                    l_eta_estimate,
                    g_estimate,
                    s_estimate,
                },
            ..
        } = o
        {
            decisions.push((
                version.0,
                *k,
                *tau_estimate,
                *observed_iteration_time,
                *l_eta_estimate,
                *g_estimate,
                *s_estimate,
            ));
        }
    });
    (report, decisions)
}

/// Mean time to target, its standard error, and mean updates over `seeds` (every run must reach it), and each seed's
/// decisions.
fn mean_time(
    protocol: ProtocolConfig,
    w: &Workload,
    seeds: &std::ops::RangeInclusive<u64>,
) -> (f64, f64, f64, Vec<Vec<Decision>>) {
    let (mut times, mut updates, mut all) = (Vec::new(), 0.0, Vec::new());
    for seed in seeds.clone() {
        let (r, d) = run(protocol, seed, w);
        let t = r.time_to_target.unwrap_or_else(|| panic!("{} seed {seed} missed the target", r.protocol));
        assert_eq!(r.codec_errors, 0);
        // Every accepted gradient is applied or dropped, except those in the round still
        // open when the run stopped.
        assert!(r.accepted >= r.applied + r.dropped.values().sum::<u64>());
        assert!(in_flight(&r) < u64::from(N));
        times.push(t);
        updates += r.updates_to_target.unwrap_or(0) as f64;
        all.push(d);
    }
    let s = times.len() as f64;
    let mean = times.iter().sum::<f64>() / s;
    let var = times.iter().map(|t| (t - mean) * (t - mean)).sum::<f64>() / (s - 1.0).max(1.0);
    (mean, (var / s).sqrt(), updates / s, all)
}

/// One seed set's sweep: BSP's mean time, the best static `(time, b)`, DBW's mean time, DBW's
/// decisions per seed, and every static `b`'s mean time (index `b`).
struct Sweep {
    bsp: f64,
    best: (f64, u32),
    dbw: f64,
    decisions: Vec<Vec<Decision>>,
    static_times: Vec<f64>,
}

/// The sweep on one seed set: every static `b`, then DBW.
fn sweep(w: &Workload, seeds: &std::ops::RangeInclusive<u64>) -> Sweep {
    let mut times = Vec::new();
    for b in 0..N {
        times.push(mean_time(ProtocolConfig::Backup(BackupConfig::new(N, LR, b)), w, seeds));
    }
    let dbw = mean_time(ProtocolConfig::Dbw(DbwConfig::new(N, LR)), w, seeds);
    let best = (0..N).map(|b| (times[b as usize].0, b)).min_by(|x, y| x.0.total_cmp(&y.0)).unwrap_or((f64::NAN, 0));
    let static_times = times.iter().map(|t| t.0).collect();
    let decisions = {
        eprintln!("seeds {seeds:?}");
        eprintln!("{:>10} {:>3} {:>9} {:>7} {:>8}", "protocol", "b", "time (s)", "± s.e.", "updates");
        for (b, (t, e, u, _)) in times.iter().enumerate() {
            eprintln!("{:>10} {b:>3} {t:>9.3} {e:>7.3} {u:>8.1}", "backup");
        }
        eprintln!("{:>10} {:>3} {:>9.3} {:>7.3} {:>8.1}", "dbw", "b_t", dbw.0, dbw.1, dbw.2);
        eprintln!("best static b = {} ({:.3} s); DBW / best = {:.3}", best.1, best.0, dbw.0 / best.0);
        dbw.3
    };
    Sweep { bsp: times[0].0, best, dbw: dbw.0, decisions, static_times }
}

/// Gradients accepted into the round that was open when the run stopped.
fn in_flight(r: &SimReport) -> u64 {
    r.accepted - r.applied - r.dropped.values().sum::<u64>()
}

#[test]
fn dbw_against_every_static_b() {
    let w = Workload::digits(ModelKind::Softmax, 1);
    eprintln!(
        "16 workers, compute 10 ms x (1 + Exp(1)), softmax on digits, lr {LR}, batch {BATCH}, \
         time to {TARGET} test accuracy, mean over seeds"
    );
    let first = sweep(&w, &SEEDS);
    let holdout = sweep(&w, &HOLDOUT);
    let (bsp, best, t, decisions) = (first.bsp, first.best, first.dbw, &first.decisions);
    let (holdout_best, holdout_t) = (holdout.best, holdout.dbw);
    eprintln!(
        "DBW / best static b: {:.3} on seeds {SEEDS:?}, {:.3} on seeds {HOLDOUT:?}",
        t / best.0,
        holdout_t / holdout_best.0
    );
    // The minimum of 16 noisy means is biased low (selection). The unbiased comparison is the
    // one a user tuning `b` by preliminary runs gets: `b` chosen on one seed set, measured on
    // the other (both ways, pooled).
    let at = |s: &Sweep, b: u32| s.static_times.get(b as usize).copied().unwrap_or(f64::NAN);
    let (tuned_on_holdout, tuned_on_first) = (at(&first, holdout_best.1), at(&holdout, best.1));
    eprintln!(
        "static b tuned on the other set: b={} on seeds {SEEDS:?} {tuned_on_holdout:.3} s (DBW / it {:.3}), \
         b={} on seeds {HOLDOUT:?} {tuned_on_first:.3} s (DBW / it {:.3}); pooled DBW / tuned static {:.3}",
        holdout_best.1,
        t / tuned_on_holdout,
        best.1,
        holdout_t / tuned_on_first,
        (t + holdout_t) / (tuned_on_holdout + tuned_on_first)
    );
    // Mean b_t per version over the seeds (runs that stopped earlier drop out).
    eprintln!("DBW mean b_t by version over seeds {SEEDS:?} (runs still going):");
    let longest = decisions.iter().map(Vec::len).max().unwrap_or(0);
    let mut line = String::new();
    for v in 0..longest.min(40) {
        let ks: Vec<u32> = decisions.iter().filter_map(|d| d.get(v)).map(|d| d.1).collect();
        let b = ks.iter().map(|k| f64::from(N - k)).sum::<f64>() / ks.len() as f64;
        line += &format!(" v{}:{b:.1}", v + 1);
    }
    eprintln!(" {line}");
    eprintln!("DBW trajectory (seed 1): version, b_t, tau_est (s), observed previous (s), L*eta, G, S");
    for (v, k, tau, obs, l_eta, g, s) in decisions.first().into_iter().flatten() {
        eprintln!("  v{v:<4} b={:<2} tau={tau:.4} obs={obs:.4} L*eta={l_eta:.3} G={g:.4} S={s:.4}", N - k);
    }
    // Measured with the current defaults (the smaller of the greedy and the noise-scale k,
    // growth at most 2× per iteration, per-worker windows, warm-up at 4): 1.059 and, held
    // out, 1.138; against a static b tuned on the other seed set 1.034 / 1.068, pooled 1.051
    // (the split-curvature rule with a hold: 1.113 / 1.136; before: 1.13 / 1.11 with the
    // secant Lη and a full warm-up).
    assert!(t <= 1.2 * best.0, "DBW {t:.3} s vs best static b={} {:.3} s", best.1, best.0);
    assert!(
        holdout_t <= 1.2 * holdout_best.0,
        "held out: DBW {holdout_t:.3} s vs best static b={} {:.3} s",
        holdout_best.1,
        holdout_best.0
    );
    // Stragglers hurt: the best static b beats BSP (b = 0) by far, and so does DBW.
    assert!(best.1 > 0 && t < 0.6 * bsp, "bsp {bsp:.3} s, dbw {t:.3} s");
    // It actually cuts stragglers after the warm-up.
    assert!(decisions.iter().flatten().skip(2).all(|d| d.1 < N), "{decisions:?}");
}
