//! A scenario whose ordering is known by construction. Without stragglers, every protocol
//! that degenerates to BSP (SSP with s = 0, backup workers with b = 0, grouped with G = 1)
//! reaches the target exactly when BSP does, so BSP is within 0% of the best of them; with one
//! persistent 4x straggler, aggregating the fastest n − 1 (b = 1) is faster than waiting for
//! all.

use syncopate_adapters::compare;
use syncopate_adapters::scenario::Scenario;

fn times(text: &str) -> Vec<(String, f64)> {
    let s = Scenario::parse(text, "test.toml").expect("valid scenario");
    let c = compare::run(&s, None, 2, &|_| {}).expect("runs");
    c.rows.iter().map(|r| (r.label.clone(), r.time_to_target_s.expect("every run reaches the target"))).collect()
}

#[test]
fn without_stragglers_the_degenerate_protocols_equal_bsp() {
    let t = times(
        r#"
        workers = 4
        seeds = 3
        max_time_s = 2.0
        eval_interval_ms = 5.0
        [[protocols]]
        name = "bsp"
        [[protocols]]
        name = "ssp"
        staleness = 0
        [[protocols]]
        name = "backup"
        backup_workers = 0
        [[protocols]]
        name = "grouped"
        groups = 1
        "#,
    );
    let bsp = t[0].1;
    assert_eq!(t.len(), 4);
    // The time to target is exact (the first model reaching it), so it also resolves the
    // transfer times of the protocols' messages, whose sizes differ (SSP s=0 reached the
    // target 0.3 µs after BSP here); the models are BSP's.
    for (label, time) in &t[1..] {
        assert!((*time - bsp).abs() < 1e-5, "{label} must reproduce BSP: {time} against {bsp}");
    }
}

#[test]
fn with_one_straggler_backup_workers_beat_bsp() {
    let t = times(
        r#"
        workers = 8
        seeds = 3
        max_time_s = 3.0
        [[stragglers]]
        workers = "0"
        model = "slow=4"
        [[protocols]]
        name = "bsp"
        [[protocols]]
        name = "backup"
        backup_workers = 1
        "#,
    );
    assert!(t[1].1 < 0.8 * t[0].1, "{t:?}");
}
