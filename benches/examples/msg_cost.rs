//! Deterministic per-message cost of a protocol's server, for instruction counting:
//! warms a [`MemCluster`] up (joins, first models), then runs server phases until `messages`
//! inputs were handled, each phase through [`server_phase`] (kept out of line so a profiler
//! can count it alone). Prints the messages handled.
//!
//! ```text
//! cargo build --release -p syncopate-benches --example msg_cost
//! valgrind --tool=callgrind --toggle-collect='*msg_cost*server_phase*' \
//!     target/release/examples/msg_cost asp 20000
//! ```
//!
//! Instructions per message = the collected `Ir` / the messages printed. With a third
//! argument `time`, it also prints the wall-clock nanoseconds per message of the server
//! phases (summed as the `overhead` bench sums them, without subtracting the clock reads):
//! a rough check on a loaded machine, where the minimum over repeated runs is the figure
//! least disturbed.

use syncopate_benches::drive::all_protocols;
use syncopate_benches::inmem::MemCluster;

/// One timed server phase (what `overhead`'s `mem_n4` bench times).
#[inline(never)]
fn server_phase(cluster: &mut MemCluster) -> usize {
    cluster.server_phase()
}

fn main() {
    let mut args = std::env::args().skip(1);
    let name = args.next().unwrap_or_else(|| "asp".into());
    let messages: usize = args.next().and_then(|s| s.parse().ok()).unwrap_or(20_000);
    let config = all_protocols(4).into_iter().find(|c| c.name() == name).expect("protocol name");
    let mut cluster = MemCluster::new(&config, 16);
    cluster.run(1000);
    let timed = args.next().is_some_and(|a| a == "time");
    let (mut handled, mut spent) = (0, std::time::Duration::ZERO);
    while handled < messages {
        cluster.worker_phase();
        let start = std::time::Instant::now();
        handled += server_phase(&mut cluster);
        spent += start.elapsed();
    }
    assert_eq!((cluster.overflow, cluster.rejected), (0, 0), "{name}");
    if timed {
        println!("{name} {handled} {:.1}", spent.as_nanos() as f64 / handled as f64);
    } else {
        println!("{name} {handled}");
    }
}
