//! The conservation ledger at the end of thread-adapter runs, every protocol of the fault
//! suite (`fault::protocols`: bsp, asp, backup, dbw, wbsp, wbsp-overlap, grouped, ssp, bap)
//! on the digits workload: what the workers sent (distinct contributions and retransmissions) =
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
        let config = ThreadConfig {
            protocol,
            batch_size: 16,
            seed: 5,
            max_gradients: 40 * u64::from(protocol.workers()),
            time_limit: Some(Duration::from_secs(20)),
            eval_interval: Duration::from_secs(10),
            rejoin_after: Some(Duration::from_millis(300)),
            target_accuracy: 0.9,
            momentum: 0.0,
        };
        // A run that never ends fails (it did for wbsp-overlap: an overlap worker that asks for
        // its next job at once never read its inbox, nor its `Stop`); the bound only catches
        // a hang, a run takes well under a second.
        let (tx, rx) = std::sync::mpsc::channel();
        let w2 = Arc::clone(&w);
        std::thread::spawn(move || {
            let _ = tx.send(thread::run(&config, w2, Vec::new(), &mut |_| {}).map_err(|e| e.to_string()));
        });
        let r = match rx.recv_timeout(Duration::from_secs(300)) {
            Ok(r) => r.unwrap(),
            Err(e) => panic!("{name}: the threaded run did not end within 300 s ({e})"),
        };
        let l = ledger(&r);
        println!("{name}: {}", l.line());
        assert!(l.sent > 0 && l.applied > 0, "{name}: {}", l.line());
        l.check().unwrap_or_else(|e| panic!("{name}: {e}"));
    }
}
