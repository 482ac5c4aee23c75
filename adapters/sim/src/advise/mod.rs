//! `syncopate advise`: which protocol, with which knobs, to run on a cluster whose step
//! times were recorded in a trace.
//!
//! - **From the trace**: the worker count, the step-time scale (the median step `m`) and the
//!   budget. Every knob that matters is swept with its protocol ([`candidates`]): backup
//!   workers `b`, SSP's and BAP's staleness `s`, BAP's iteration limit and WBSP's round
//!   deadline as multiples of `m`, the grouped protocol's `G`, and DBW.
//! - **The whole trace**: on the default workload, the noisy quadratic model (NQM, the
//!   reproduction's DBW workload), the target is calibrated so that an ideal BSP run on
//!   the trace (every step at its expected loss) reaches it after 90% of the trace's steps
//!   ([`Setting::for_trace`]): every candidate has to work through most of the trace, so a
//!   regime change late in it counts. The ladder's rungs are the losses after 25%, 50% and
//!   75% of the steps. Runs stop at the target or at the budget (3x the time BSP needs to
//!   replay the whole trace). With `digits` or `mnist5k` the target is an accuracy (the
//!   reproduction's ladder), and the report says how much of the trace the runs used.
//! - **Phases**: where the step-time distribution changes regime ([`phases::detect`]), each
//!   phase is swept on its own; when the best choice differs between phases, the advice says
//!   so and gives DBW's whole-trace time (it adapts `b` as it goes) next to the static pick.
//! - **Gradient noise**: the NQM's noise is set so that its critical batch is the operator's
//!   model's noise scale ([`noise`]): given ([`Options::noise_scale`]), or estimated from a
//!   recorded trace's gradient columns ([`noise_estimate`], [`Options::measured_noise`]),
//!   or else the built-in NQM's.
//! - **Robustness**: every candidate runs with several run seeds (minibatches) and as many
//!   data seeds (the NQM noise pool, or the train/test split), separate from each other; the
//!   time to target is reported as the mean with its 95% interval, and the pick is made
//!   among the candidates that reached the target on every seed by [`pick`]: the fastest
//!   mean, or, among the candidates statistically tied with it (paired interval of the
//!   difference includes zero, or means within 1%) and within 5% of it, the simplest.

mod candidates;
pub mod extend;
pub mod noise;
pub mod noise_estimate;
mod options;
pub mod phases;
mod race;
mod report;
mod setting;
pub mod stats;
mod table;
pub mod tracegen;

pub use candidates::{Candidate, candidates, simplicity};
pub use noise::nqm_expected_loss;
pub use noise_estimate::NoiseEstimate;
pub use options::{MeasuredNoise, Options, TIE_ALWAYS, TIE_WITHIN, WorkloadKind};
pub use race::{Measured, STOP_BEYOND, StoppedEarly, SweepResult, effective_batch, pick, sweep};
pub use setting::{BUDGET_FACTOR, FIRST_HORIZON, NQM_DIM, Setting, TARGET_SHARE};
pub use table::{TraceSummary, TraceTable};

use serde::Serialize;

/// One phase of the trace and its own sweep.
#[derive(Clone, Debug, Serialize)]
pub struct PhaseAdvice {
    /// First step.
    pub from_step: usize,
    /// First step after it.
    pub until_step: usize,
    /// Its median step.
    pub median_step_s: f64,
    /// Its mean spread `max_w t / median_w t` per step.
    pub spread: f64,
    /// The sweep on this phase alone (cycled), when the trace has several phases.
    pub sweep: Option<SweepResult>,
}

/// Everything `advise` found.
#[derive(Clone, Debug, Serialize)]
pub struct Advice {
    /// The trace.
    pub trace: TraceSummary,
    /// The sweep over the whole trace: its pick is the recommendation.
    pub whole: SweepResult,
    /// The phases (one when the trace keeps one regime).
    pub phases: Vec<PhaseAdvice>,
    /// When the best choice differs between phases: what to do about it.
    pub switch: Option<String>,
    /// The whole trace swept again at other critical batches ([`Options::sensitivity`]).
    pub sensitivity: Vec<NoiseSweep>,
    /// What the trace's gradient columns told about the noise scale ([`Options::measured_noise`]).
    pub measured_noise: Option<MeasuredNoise>,
    /// Whether the runs' noise was set from that estimate.
    pub noise_from_trace: bool,
}

/// The whole trace swept with the NQM's noise set to another critical batch.
#[derive(Clone, Debug, Serialize)]
pub struct NoiseSweep {
    /// The critical batch, examples.
    pub critical_batch: f64,
    /// The sweep (the same candidates as the whole trace's, extensions included).
    pub sweep: SweepResult,
}

/// The most rounds of extending knobs past their edge.
const MAX_EXTENSIONS: usize = 12;

/// Races `candidates` on `trace` and, with `extend`, extends knobs past their edge.
fn extended_sweep(
    trace: &TraceTable,
    candidates: &[Candidate],
    setting: &Setting,
    seeds: (&[u64], &[u64]),
    extend: bool,
    jobs: usize,
    done: &(dyn Fn() + Sync),
) -> Result<SweepResult, String> {
    let mut race = race::Race::new(trace, setting, seeds.0, seeds.1, jobs, done);
    race.add(candidates, false);
    race.run()?;
    if !extend {
        return Ok(race.result(None));
    }
    let mut notes = Vec::new();
    for _ in 0..MAX_EXTENSIONS {
        let so_far = race.result(None);
        let next = extend::past_edges(&so_far.rows, &race.candidates(), trace.workers, setting.median_step_s);
        if next.is_empty() {
            break;
        }
        let (added, why): (Vec<Candidate>, Vec<String>) = next.into_iter().unzip();
        notes.extend(why);
        race.add(&added, true);
        race.run()?;
    }
    let so_far = race.result(None);
    notes.extend(extend::summary(&so_far.rows, &race.candidates(), trace.workers));
    Ok(race.result(Some(notes)))
}

/// The run and data seeds of `options`.
pub fn seeds(options: &Options) -> (Vec<u64>, Vec<u64>) {
    let r = u64::from(options.repeats.max(1));
    (
        (0..r).map(|i| options.seed.wrapping_add(i)).collect(),
        (0..r).map(|i| options.split_seed.wrapping_add(i)).collect(),
    )
}

/// Sweeps `candidates` over the whole `trace` and, when it changes regime, over each phase.
pub fn advise(
    trace: &TraceTable,
    candidates: &[Candidate],
    options: &Options,
    jobs: usize,
    done: &(dyn Fn() + Sync),
) -> Result<Advice, String> {
    let (run_seeds, split_seeds) = seeds(options);
    let measured = match &options.measured_noise {
        Some(MeasuredNoise::Estimated(e)) if options.noise_scale.is_none() && options.workload == WorkloadKind::Nqm => {
            Some(e.gradients * f64::from(options.worker_batch.max(1)))
        }
        _ => None,
    };
    let with_measured = Options { noise_scale: options.noise_scale.or(measured), ..options.clone() };
    let options = &with_measured;
    let setting = Setting::for_trace(trace, options)?;
    let whole = extended_sweep(trace, candidates, &setting, (&run_seeds, &split_seeds), options.extend, jobs, done)?;
    let mut sensitivity = Vec::new();
    if options.workload == WorkloadKind::Nqm {
        for &b in &options.sensitivity {
            let s = Setting::for_trace(trace, &Options { noise_scale: Some(b), ..options.clone() })?;
            let sweep = sweep(trace, &whole.candidates, &s, &run_seeds, &split_seeds, jobs, done)?;
            sensitivity.push(NoiseSweep { critical_batch: b, sweep });
        }
    }
    let (level, spread) = trace.level_and_spread();
    let ranges = if options.phases { phases::detect(&level, &spread) } else { vec![(0, trace.steps)] };
    let mut phases = Vec::with_capacity(ranges.len());
    for &(from, until) in &ranges {
        let part = trace.slice(from, until);
        let sweep = if ranges.len() > 1 {
            let phase_options = Options { target: None, budget_s: None, ..options.clone() };
            let phase_options = if options.workload == WorkloadKind::Nqm {
                phase_options
            } else {
                Options { target: options.target, ..phase_options }
            };
            let s = Setting::for_trace(&part, &phase_options)?;
            Some(sweep(&part, candidates, &s, &run_seeds, &split_seeds, jobs, done)?)
        } else {
            None
        };
        let spread_mean = spread[from..until].iter().map(|x| x.exp()).sum::<f64>() / (until - from).max(1) as f64;
        phases.push(PhaseAdvice {
            from_step: from,
            until_step: until,
            median_step_s: part.median_step(),
            spread: spread_mean,
            sweep,
        });
    }
    let picks: Vec<&str> = phases.iter().filter_map(|p| p.sweep.as_ref()).map(|s| s.label(s.pick)).collect();
    let switch = (picks.len() > 1 && picks.windows(2).any(|w| w[0] != w[1])).then(|| {
        let steps: Vec<String> = phases
            .iter()
            .zip(&picks)
            .map(|(p, label)| format!("steps {}..{}: {label}", p.from_step, p.until_step))
            .collect();
        let dbw = whole.rows.iter().find(|r| r.protocol == "dbw");
        let dbw_note = dbw.map_or(String::new(), |r| {
            format!(
                "; DBW, which adapts b as the trace changes, takes {:.3} ± {:.3} s on the whole trace against the static pick's {:.3} s",
                r.time.mean,
                r.time.half_width(),
                whole.pick.and_then(|i| whole.rows.get(i)).map_or(f64::NAN, |p| p.time.mean)
            )
        });
        format!(
            "the best static choice changes with the regime ({}): switch at the phase boundary, or run DBW{dbw_note}",
            steps.join("; ")
        )
    });
    Ok(Advice {
        trace: TraceSummary::of(trace),
        whole,
        phases,
        switch,
        sensitivity,
        measured_noise: options.measured_noise.clone(),
        noise_from_trace: measured.is_some(),
    })
}
