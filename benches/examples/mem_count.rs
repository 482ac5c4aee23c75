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

use std::hint::black_box;
use syncopate::Server;
use syncopate_benches::drive::all_protocols;
use syncopate_benches::inmem::MemCluster;

const DIM: usize = 16;

#[inline(never)]
fn server_phase(c: &mut MemCluster) -> usize {
    c.server_phase()
}

fn main() {
    let mut args = std::env::args().skip(1);
    let name = args.next().unwrap_or_else(|| "dbw".into());
    let messages: usize = args.next().and_then(|m| m.parse().ok()).unwrap_or(20_000);
    let config = all_protocols(4).into_iter().find(|c| c.name() == name).expect("unknown protocol");
    let mut c = MemCluster::new(&config, DIM);
    c.run(1000);
    let mut handled = 0;
    while handled < messages {
        c.worker_phase();
        handled += black_box(server_phase(&mut c));
    }
    println!("{name}: {handled} messages, version {}", c.server().version().0);
}
