//! A diverging run over TCP ends: `serve` with a learning rate that sends the model to
//! infinity stops as DIVERGED (its test loss is not finite), under BSP and under ASP, telling
//! its workers to stop, instead of waiting for gradients the workers refuse to send.

#[path = "procs/mod.rs"]
mod procs;

use core::time::Duration;
use procs::{json, serve, work};

#[test]
fn a_diverging_run_stops_as_diverged_under_bsp_and_asp() {
    for protocol in ["bsp", "asp"] {
        // The time limit only bounds a failure: the run must end long before it.
        let args = [
            "--protocol",
            protocol,
            "--model",
            "mlp",
            "--lr",
            "1e30",
            "--workers",
            "2",
            "--time-limit",
            "600",
            "--json",
        ];
        let (server, addr) = serve(&args);
        let workers: Vec<_> = (0..2).map(|i| work(&addr, i, &[])).collect();
        server.wait_err("the model has diverged, stopping", Duration::from_secs(60));
        let (code, out) = server.finish(Duration::from_secs(20));
        assert_eq!(code, 0, "{protocol}");
        let summary = json(&out);
        assert!(summary["diverged"].is_string(), "{protocol}: {summary}");
        for w in workers {
            let lines = w.lines();
            let (code, out) = w.finish(Duration::from_secs(40));
            // Every worker whose handshake completed is told to stop. ASP may diverge before
            // a worker's handshake completes: that worker finds the server gone and says so.
            let never_joined = !lines.iter().any(|l| l.contains("connected to"));
            assert!(code == 0 || (protocol == "asp" && never_joined), "{protocol}: exit {code}: {out} {lines:#?}");
        }
    }
}
