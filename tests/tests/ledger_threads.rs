//! The conservation ledger at the end of thread-adapter runs, the protocols of the fault
//! suite (`fault::protocols`: bsp, asp, backup, dbw, wbsp, grouped, ssp, bap; not
//! wbsp-overlap, whose thread run with this configuration did not end — an open finding) on
//! the digits workload: what the workers sent (distinct contributions and retransmissions) =
//! applied + dropped + held at the stop + in flight at the stop + refused, exactly, checked by
//! the one checker (`syncopate_tests::ledger::Ledger`).

use core::time::Duration;
use std::sync::Arc;
use syncopate_adapters::thread::{self, ThreadConfig, ThreadReport};
use syncopate_adapters::workload::{ModelKind, Workload};
use syncopate_tests::fault::protocols;
use syncopate_tests::ledger::{Ledger, Loss};

fn ledger(r: &ThreadReport) -> Ledger {
    let mut l = Ledger::from_server(&r.stats).unwrap_or_else(|e| panic!("{e}"));
    assert_eq!(r.ledger.received, l.accepted + r.ledger.refused, "received = accepted + refused");
    assert!(r.ledger.complete, "every worker ended before the count closed");
    l.sent = r.workers.iter().map(|w| w.sent + w.resent).sum();
    l.in_flight = r.ledger.in_flight_at_stop;
    l.add_lost(Loss::Refused, r.ledger.refused);
    l
}

#[test]
fn every_thread_run_balances_its_ledger() {
    let w = Arc::new(Workload::digits(ModelKind::Softmax, 5));
    for (name, protocol) in protocols() {
        if name == "wbsp-overlap" {
            continue;
        }
        let config = ThreadConfig {
            protocol,
            batch_size: 16,
            seed: 5,
            max_gradients: 40 * u64::from(protocol.workers()),
            time_limit: Some(Duration::from_secs(20)),
            eval_interval: Duration::from_secs(10),
            rejoin_after: Some(Duration::from_millis(300)),
            target_accuracy: 0.9,
        };
        let r = thread::run(&config, Arc::clone(&w), Vec::new(), &mut |_| {}).unwrap();
        let l = ledger(&r);
        println!("{name}: {}", l.line());
        assert!(l.sent > 0 && l.applied > 0, "{name}: {}", l.line());
        l.check().unwrap_or_else(|e| panic!("{name}: {e}"));
    }
}
