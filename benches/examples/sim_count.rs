//! A fixed simulator run for an instruction counter: one protocol, `n` workers, the trivial
//! workload (a constant gradient, so the count is the simulator's and the protocol's, not a
//! model's), stopped after a fixed number of accepted gradients. It prints the events the
//! run processed, so that
//!
//! ```text
//! valgrind --tool=callgrind --toggle-collect='*sim_count*simulate*' \
//!     target/release/examples/sim_count bsp 10000 16 200000
//! ```
//!
//! counts the run's instructions (building the workload is outside the count; building the
//! simulator and its `n` workers is inside it). The cost of an event at that `n` is the
//! difference between this run and one stopped at the first gradient (last argument 1),
//! divided by the difference in the events they print, so that the one-off cost of the `n`
//! workers (a tenth of a 200,000-gradient run at n = 10,000) is not spread over the events.
//! Comparing `n` = 100, 1,000 and 10,000 shows how the cost of an event grows with the
//! worker count, free of the machine's noise and of cache effects (which wall-clock events
//! per second, `tests/tests/sim_scale.rs`, include).
//!
//! Arguments: protocol name (as `overhead` names it, default `bsp`), workers (default
//! 10000), model dimension (a quadratic of that size, default 16) and accepted gradients
//! (default 200000).

use std::hint::black_box;
use syncopate_adapters::sim::{self, GradientSource, SimConfig, SimReport};
use syncopate_adapters::workload::{ModelKind, Workload};
use syncopate_benches::drive::all_protocols;

#[inline(never)]
fn simulate(config: &SimConfig, workload: &Workload) -> SimReport {
    sim::run(config, workload)
}

fn main() {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let arg = |i: usize, default: u64| -> u64 {
        args.get(i).map_or(default, |a| a.parse().unwrap_or_else(|_| panic!("argument {}: not a number: {a}", i + 1)))
    };
    let name = args.first().map_or("bsp", String::as_str);
    let n = u32::try_from(arg(1, 10_000)).expect("workers fit in u32");
    let dim = usize::try_from(arg(2, 16)).expect("dimension fits in usize");
    let gradients = arg(3, 200_000);
    let protocol =
        all_protocols(n).into_iter().find(|c| c.name() == name).unwrap_or_else(|| panic!("unknown protocol {name}"));
    let workload = Workload::nqm(dim, 64, 1);
    let mut config = SimConfig::new(protocol, ModelKind::Nqm { dim }).with_gradient(GradientSource::Constant(1e-3));
    config.stop.max_time = None;
    config.stop.max_gradients = Some(gradients);
    config.eval_interval = syncopate::Duration::ZERO;
    config.record_trace = false;
    let report = black_box(simulate(&config, &workload));
    assert_eq!((report.rejected, report.codec_errors), (0, 0), "{name}: refused input");
    println!(
        "{name} n={n} d={dim}: {} events, {} updates, {} accepted",
        report.events, report.updates, report.accepted
    );
}
