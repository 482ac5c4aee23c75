//! The checker's own rules on hand-made logs.

use super::checker::Ctx;
use super::*;
use syncopate::{Version, WorkerId};

/// Found by the soak run on the swarm's first network (SSP seed 4375, C2 at version 979):
/// worker 2's session 13 sent clock 317, crashed, and its session 14 started on a model
/// sent after the restart (its `Join` late), so it sent clock 317 too, with other values,
/// before session 13's delayed copy arrived. The server rightly applied both (distinct
/// updates of two sessions); the checker, keying values by `(worker, clock)`, used session
/// 14's values for session 13's update and reported a model mismatch.
#[test]
fn ssp_clock_of_two_sessions_each_applied_with_its_own_values() {
    let ctx = Ctx::of(&ProtocolConfig::Ssp(SspConfig::new(4, LR, 2)));
    let mut c = Checker::new("ssp", 4, &[0.0; DIM]);
    let old = vec![0.1875, -0.0, 0.0625, -0.0625];
    let new = vec![-0.1875, -0.0, -0.0625, -0.125];
    let clock = |seq: u64, values: &Vec<f64>| ToServerOwned::Clock { clock: 317, seq, values: values.clone() };
    let (m13, m14) = (clock((13 << 32) + 2, &old), clock(14 << 32, &new));
    c.sent(2, 13, &m13);
    c.sent(2, 14, &m14);
    let mut version = 0;
    let mut apply = |c: &mut Checker, epoch: u32, msg: &ToServerOwned| {
        version += 1;
        c.handled(2, epoch, msg, Ok(()));
        let worker = WorkerId(2);
        let applied =
            ServerEvent::Applied { worker, base: Version(0), version: Version(version), staleness: 0, weight: 1.0 };
        c.event(&applied, &ctx);
        c.event(&ServerEvent::ModelUpdated { version: Version(version), contributions: 1, mean_loss: None }, &ctx);
    };
    apply(&mut c, 13, &m13);
    assert_eq!(c.reference, old, "session 13's update has session 13's values");
    apply(&mut c, 14, &m14);
    let both: Vec<f64> = old.iter().zip(&new).map(|(a, b)| a + b).collect();
    assert_eq!(c.reference, both);
    assert_eq!(c.violation, None);
}

/// A retransmission (same session and sequence number) with other values is a violation.
#[test]
fn a_retransmission_with_other_values_is_reported() {
    let mut c = Checker::new("ssp", 4, &[0.0; DIM]);
    c.sent(1, 3, &ToServerOwned::Clock { clock: 5, seq: 3 << 32, values: vec![0.25; DIM] });
    c.sent(1, 3, &ToServerOwned::Clock { clock: 5, seq: 3 << 32, values: vec![0.25; DIM] });
    assert_eq!(c.violation, None);
    c.sent(1, 3, &ToServerOwned::Clock { clock: 5, seq: 3 << 32, values: vec![0.5; DIM] });
    assert!(c.violation.as_deref().is_some_and(|v| v.contains("sent again with other values")), "{:?}", c.violation);
}
