use super::*;

#[test]
fn events_pop_in_time_then_insertion_order() {
    let mut q = BinaryHeap::new();
    let t = Instant::from_nanos;
    for (seq, at) in [(0, 5), (1, 3), (2, 5), (3, 3), (4, 0)] {
        q.push(Scheduled { at: t(at), seq, event: Event::Eval });
    }
    let order: Vec<(u64, u64)> = core::iter::from_fn(|| q.pop()).map(|s| (s.at.as_nanos(), s.seq)).collect();
    assert_eq!(order, [(0, 4), (3, 1), (3, 3), (5, 0), (5, 2)]);
}

#[test]
fn time_to_target_does_not_depend_on_the_evaluation_interval() {
    use crate::workload::ModelKind;
    use syncopate::ProtocolConfig;
    use syncopate::proto::asp::AspConfig;
    use syncopate::proto::bsp::BspConfig;
    for protocol in [ProtocolConfig::Bsp(BspConfig::new(4, 0.5)), ProtocolConfig::Asp(AspConfig::new(4, 0.125))] {
        let mut config = SimConfig::new(protocol, ModelKind::Softmax)
            .with_compute(super::super::ComputeModel::one_straggler(4, 0, 3.0))
            .with_max_time(Duration::from_secs(3));
        let w = config.digits_workload();
        let mut times = Vec::new();
        for eval_ms in [1, 10, 50, 400] {
            config.eval_interval = Duration::from_millis(eval_ms);
            let report = super::super::run(&config, &w);
            times.push((report.time_to_target, report.updates_to_target));
        }
        assert!(times[0].0.is_some(), "{times:?}");
        assert!(times.iter().all(|t| *t == times[0]), "{times:?}");
    }
}

/// A run stopped at its target may end before any evaluation shows the target (the
/// crossing is found when the kept models are checked): the target's rung of a ladder is
/// still reached, at the exact crossing, and lower rungs no later.
#[test]
fn a_ladder_sees_the_target_a_stopped_run_reached_between_evaluations() {
    use super::super::Target;
    use crate::workload::ModelKind;
    use syncopate::ProtocolConfig;
    use syncopate::proto::bsp::BspConfig;
    let mut config = SimConfig::new(ProtocolConfig::Bsp(BspConfig::new(4, 0.5)), ModelKind::Softmax)
        .with_max_time(Duration::from_secs(3));
    config.stop.stop_at_target = true;
    config.eval_interval = Duration::from_millis(400);
    let w = config.digits_workload();
    let report = super::super::run(&config, &w);
    let exact = report.time_to_target.expect("the target is reached");
    let target = Target::Accuracy(report.target_accuracy);
    // The case this test is about: the evaluations alone miss the crossing.
    let evaluated = report.curve.iter().find(|p| target.reached(p)).map(|p| p.time_s);
    assert_ne!(evaluated, Some(exact), "the evaluations saw the crossing: the case is not exercised");
    assert_eq!(report.time_to(target), Some(exact));
    let lower = report.time_to(Target::Accuracy(report.target_accuracy - 0.05)).expect("a lower rung");
    assert!(lower <= exact, "{lower} > {exact}");
}

#[test]
fn a_run_stops_at_its_event_budget() {
    use crate::workload::ModelKind;
    use syncopate::ProtocolConfig;
    use syncopate::proto::bsp::BspConfig;
    let mut config = SimConfig::new(ProtocolConfig::Bsp(BspConfig::new(4, 0.5)), ModelKind::Softmax);
    config.stop.max_events = 500;
    let report = super::super::run(&config, &config.digits_workload());
    assert_eq!(report.stop_reason, "max_events");
    assert_eq!(report.events, 500);
    assert!(report.virtual_time_s < 60.0);
}

#[test]
fn message_buffers_are_reused() {
    use crate::workload::ModelKind;
    use syncopate::ProtocolConfig;
    use syncopate::proto::bsp::BspConfig;
    let config = SimConfig::new(ProtocolConfig::Bsp(BspConfig::new(4, 0.5)), ModelKind::Softmax);
    let w = config.digits_workload();
    let short = super::super::run(&config.clone().with_max_updates(10), &w);
    let long = super::super::run(&config.with_max_updates(200), &w);
    assert!(long.messages_delivered > 10 * short.messages_delivered);
    assert_eq!(long.buffers_allocated, short.buffers_allocated);
    // Four gradients and four model copies (one shared buffer) in flight at most.
    assert!(long.buffers_allocated <= 4 + 4 + 1, "{}", long.buffers_allocated);
}

/// Workers report their minibatch loss with each gradient: every update's event carries the
/// mean of its contributions' losses, close to the evaluated loss of the model they were
/// computed on.
#[test]
fn workers_report_their_minibatch_loss_with_each_gradient() {
    use super::super::Observation;
    use crate::workload::ModelKind;
    use syncopate::ProtocolConfig;
    use syncopate::proto::bsp::BspConfig;
    let config = SimConfig::new(ProtocolConfig::Bsp(BspConfig::new(4, 0.5)), ModelKind::Softmax)
        .with_max_time(Duration::from_millis(300));
    let w = config.digits_workload();
    let mut losses = Vec::new();
    super::super::run_observed(&config, &w, &mut |o| {
        if let Observation::Server { event: ServerEvent::ModelUpdated { mean_loss, .. }, .. } = o {
            losses.push(*mean_loss);
        }
    });
    assert!(losses.len() > 5, "{losses:?}");
    assert!(losses.iter().all(|l| l.is_some_and(|l| l.is_finite() && l > 0.0)), "{losses:?}");
    // The first update's gradients were computed at the initial model: uniform prediction.
    let first = losses[0].unwrap_or(0.0);
    assert!((f64::from(first) - 10f64.ln()).abs() < 0.05, "{first}");
    let last = losses[losses.len() - 1].unwrap_or(f32::MAX);
    assert!(last < first, "{first} then {last}");
}
