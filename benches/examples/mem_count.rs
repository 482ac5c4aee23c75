//! A fixed amount of `overhead`'s `mem_n4` work for an instruction counter: warms up a
//! [`MemCluster`] for 1000 messages, then runs worker and server phases until the server has
//! handled `MESSAGES` more, and prints the count. The server phase is the non-inlined
//! `server_phase`, so that
//!
//! ```text
//! valgrind --tool=callgrind --toggle-collect='*mem_count*server_phase*' \
//!     target/release/examples/mem_count dbw 20000
//! ```
//!
//! counts exactly what the bench times (handle + drain per message); divide the total by
//! the printed message count. Arguments: protocol name (as `overhead` names it, default
//! `dbw`) and messages (default 20000).
//!
//! It also prints the wall time per message spent in server phases (two clock reads per
//! phase included, so only for A/B comparisons of builds run back to back).
//!
//! `mem_count rtts N ROUNDS` instead times DBW's per-worker round-trip estimate alone
//! (`--toggle-collect='*mem_count*estimate*'`) where every window changes every round, as
//! in a real cluster (unlike the bench's, whose round trips are all equal): `N` workers with
//! round trips `10 ms·(0.2 + Exp(1))` (a fixed pseudo-random sequence), the slowest quarter
//! cut (censored) at the round's close, one estimate per round.

use std::hint::black_box;
use syncopate::math::dbw_policy::WorkerRtts;
use syncopate::{Duration, Server};
use syncopate_benches::drive::all_protocols;
use syncopate_benches::inmem::MemCluster;

const DIM: usize = 16;

#[inline(never)]
fn server_phase(c: &mut MemCluster) -> usize {
    c.server_phase()
}

#[inline(never)]
fn estimate(w: &mut WorkerRtts<syncopate::proto::Heap>, n: usize, tau: &mut [f64]) -> bool {
    w.expected_order_statistics(n, |_| true, tau)
}

/// One estimate per round of `n` shifted-exponential workers, the slowest quarter censored.
fn rtts(n: usize, rounds: usize) {
    let mut w = WorkerRtts::<syncopate::proto::Heap>::new(n).expect("heap tables");
    let mut tau = vec![0.0; n];
    let mut state = 0x9e37_79b9_7f4a_7c15u64;
    let mut draws = vec![0.0f64; n];
    let mut ok = 0;
    for _ in 0..rounds {
        for d in &mut draws {
            // xorshift64*, uniform in (0, 1).
            state ^= state >> 12;
            state ^= state << 25;
            state ^= state >> 27;
            let u = ((state.wrapping_mul(0x2545_f491_4f6c_dd1d) >> 11) as f64 + 0.5) / (1u64 << 53) as f64;
            *d = 0.01 * (0.2 - u.ln());
        }
        let mut sorted = draws.clone();
        sorted.sort_by(f64::total_cmp);
        let close = sorted[(3 * n / 4).max(1) - 1];
        for (i, &d) in draws.iter().enumerate() {
            w.push(i, Duration::from_secs_f64(d.min(close)), d > close);
        }
        ok += usize::from(black_box(estimate(&mut w, n, &mut tau)));
    }
    println!("rtts: {n} workers, {rounds} estimates ({ok} made), tau({n}) = {}", tau[n - 1]);
}

fn main() {
    let mut args = std::env::args().skip(1);
    let name = args.next().unwrap_or_else(|| "dbw".into());
    if name == "rtts" {
        let n = args.next().and_then(|m| m.parse().ok()).unwrap_or(16);
        rtts(n, args.next().and_then(|m| m.parse().ok()).unwrap_or(1000));
        return;
    }
    let messages: usize = args.next().and_then(|m| m.parse().ok()).unwrap_or(20_000);
    let config = all_protocols(4).into_iter().find(|c| c.name() == name).expect("unknown protocol");
    let mut c = MemCluster::new(&config, DIM);
    c.run(1000);
    let mut handled = 0;
    let mut in_server = std::time::Duration::ZERO;
    while handled < messages {
        c.worker_phase();
        let start = std::time::Instant::now();
        handled += black_box(server_phase(&mut c));
        in_server += start.elapsed();
    }
    println!(
        "{name}: {handled} messages, version {}, {:.1} ns per message in server phases (timer included)",
        c.server().version().0,
        in_server.as_nanos() as f64 / handled as f64
    );
}
