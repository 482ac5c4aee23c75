//! Properties: one group is BSP, groups of one are ASP, every gradient reaches the central model once.

use super::*;

proptest! {
    #![proptest_config(ProptestConfig::with_cases(48))]

    /// The fused scaling and screening of an aggregate writes the bits of `math::scale` and
    /// returns the bits of `math::squared_norm` of the result, up to a NaN's payload (so it passes and fails
    /// exactly the aggregates the central server's policy would), whatever the values:
    /// across the chunk boundary, near overflow, non-finite.
    #[test]
    fn fused_scale_and_measure_is_scale_then_squared_norm(
        x in proptest::collection::vec(proptest::num::f32::ANY, 0..40),
        big in proptest::collection::vec(-3.0e19f32..3.0e19, 0..40),
        a in proptest::num::f32::ANY,
    ) {
        for x in [x, big] {
            let (mut fused, mut plain) = (x.clone(), x);
            let sq = scale_measured(&mut fused, a);
            math::scale(&mut plain, a);
            // Bit for bit but for which NaN payload a sum of NaNs keeps.
            let want = math::squared_norm(&plain);
            prop_assert!(sq.to_bits() == want.to_bits() || (sq.is_nan() && want.is_nan()), "{sq} {want}");
            let bits = |v: &[f32]| v.iter().map(|e| e.to_bits()).collect::<Vec<_>>();
            prop_assert_eq!(bits(&fused), bits(&plain));
        }
    }

    /// H4: one group of n is BSP, message for message and bit for bit, under any
    /// delivery order and with duplicated messages.
    #[test]
    fn one_group_is_bsp(log_n in 0u32..4, dim in 1usize..4, seed in any::<u64>(), dup in 0u64..30, scaling in 0u8..3) {
        let n = 1u32 << log_n;
        let mut c = GroupedConfig::new(n, 0.5, 1);
        c.lr_scaling = [LrScaling::None, LrScaling::Linear, LrScaling::Sqrt][scaling as usize];
        let mut bsp = Plain(BspServer::<f64, Vec<f64>>::new(BspConfig::new(n, 0.5), vec![1.0; dim], vec![0.0; dim]).unwrap());
        let mut g = Plain(grouped(c, dim));
        let a = run(&mut bsp, n, seed, 12, dup, true);
        let b = run(&mut g, n, seed, 12, dup, true);
        prop_assert!(a.trace.len() > 10);
        prop_assert_eq!(&a.trace, &without_group_events(&b.trace));
        prop_assert_eq!(bsp.stats(), g.stats());
        // The stand-alone group server wired to a plain ASP central does the same.
        let mut w = Wired::new(c, dim);
        let d = run(&mut w, n, seed, 12, dup, true);
        prop_assert_eq!(&b.trace, &d.trace);
    }

    /// H4: n groups of one are ASP, message for message and bit for bit, under any delivery
    /// order and with duplicated gradients. (Not with duplicated models or joins: a worker
    /// handed a model twice, or answered twice, may compute on a model its group has since
    /// replaced; ASP applies that gradient with its staleness, a group drops it as stale,
    /// because its step on that version has closed.)
    #[test]
    fn n_groups_of_one_are_asp(n in 2u32..9, dim in 1usize..4, seed in any::<u64>(), dup in 0u64..30) {
        let mut asp = Plain(AspServer::<f64, Vec<f64>>::new(AspConfig::new(n, 0.5), vec![1.0; dim]).unwrap());
        let mut g = Plain(grouped(GroupedConfig::new(n, 0.5, n), dim));
        let a = run(&mut asp, n, seed, 40, dup, false);
        let b = run(&mut g, n, seed, 40, dup, false);
        prop_assert!(a.trace.len() > 40);
        prop_assert_eq!(&a.trace, &without_group_events(&b.trace));
        prop_assert_eq!(asp.stats(), g.stats());
        let mut w = Wired::new(GroupedConfig::new(n, 0.5, n), dim);
        let d = run(&mut w, n, seed, 40, dup, false);
        prop_assert_eq!(&b.trace, &d.trace);
    }

    /// H1–H3: every admitted worker gradient has exactly one outcome; each group step
    /// takes one gradient from each member at the group's version; each aggregate reaches
    /// the central model exactly once (C2: the central model is the initial one minus η
    /// times the weighted sum of exactly the gradients reported applied and exchanged);
    /// staleness is `version − 1 − base`. Any partition, G, H and scaling; the stand-alone
    /// deployment gives the same trace.
    #[test]
    fn every_gradient_reaches_the_central_model_once_through_its_group(
        n in 1u32..9,
        g_pick in any::<u32>(),
        h in 1u32..4,
        part in 0u8..3,
        table in proptest::collection::vec(any::<u8>(), 8),
        scaling in 0u8..3,
        seed in any::<u64>(),
        dup in 0u64..30,
    ) {
        let groups = 1 + g_pick % n;
        let mut c = GroupedConfig::new(n, 0.25, groups);
        c.local_steps = h;
        c.lr_scaling = [LrScaling::None, LrScaling::Linear, LrScaling::Sqrt][scaling as usize];
        c.partition = match part {
            0 => Partition::Contiguous,
            1 => Partition::RoundRobin,
            _ => {
                // A random table in which every group has a member.
                let mut t: Vec<u8> = (0..n).map(|i| (table[i as usize] as u32 % groups) as u8).collect();
                for g in 0..groups { t[g as usize] = g as u8; }
                Partition::explicit(&t).unwrap()
            }
        };
        let dim = 2;
        let mut s = Plain(grouped(c, dim));
        let r = run(&mut s, n, seed, 30, dup, true);
        let outcomes: Vec<&ServerEvent> = r.trace.iter().filter_map(|x| match x {
            Rec::Out(Out::Event(e @ (ServerEvent::Applied { .. } | ServerEvent::Dropped { .. }))) => Some(e),
            _ => None,
        }).collect();
        // Gradients in steps still open at the end have no outcome yet.
        let open: u64 = s.0.groups.iter().map(|g| u64::from(g.count)).sum();
        prop_assert_eq!(outcomes.len() as u64 + open, r.admitted);
        let stats = s.stats();
        prop_assert_eq!(stats.accepted, r.admitted);
        prop_assert_eq!(stats.applied + stats.dropped_total() + open, r.admitted);
        prop_assert_eq!(stats.dropped_total(), stats.dropped_for(DropReason::Stale));
        // Conservation and per-step membership.
        let mut expected = vec![1.0f64; dim];
        let mut pending: Vec<Vec<(f64, Vec<f64>)>> = vec![Vec::new(); groups as usize];
        let mut step_members: BTreeMap<(u32, u64), Vec<u32>> = BTreeMap::new();
        let mut last_group = None;
        let mut exchanges = 0u64;
        for x in &r.trace {
            match x {
                Rec::Out(Out::Event(ServerEvent::GroupApplied { group, base, version, staleness, contributions })) => {
                    prop_assert_eq!(*staleness, version.0 - 1 - base.0);
                    prop_assert_eq!(*contributions, c.local_steps * s.0.shared.layout.size[*group as usize] as u32);
                    last_group = Some(*group);
                    exchanges += 1;
                }
                Rec::Out(Out::Event(ServerEvent::Applied { worker, base, weight, .. })) => {
                    let g = c.group_of(*worker).unwrap();
                    let values = r.sent.get(&(worker.0, base.0)).unwrap().clone();
                    pending[g as usize].push((*weight, values));
                    step_members.entry((g, base.0)).or_default().push(worker.0);
                }
                Rec::Out(Out::Event(ServerEvent::ModelUpdated { version, .. })) => {
                    let g = last_group.take().unwrap() as usize;
                    for (weight, values) in pending[g].drain(..) {
                        for (e, v) in expected.iter_mut().zip(values) { *e -= 0.25 * weight * v; }
                    }
                    let (cv, params) = s.central();
                    if cv == *version {
                        for (p, e) in params.iter().zip(&expected) {
                            prop_assert!((p - e).abs() <= 1e-9 * (1.0 + e.abs()), "{:?} vs {:?}", params, expected);
                        }
                    }
                }
                _ => {}
            }
        }
        prop_assert_eq!(s.central().0, Version(exchanges));
        for ((g, _), members) in &step_members {
            let mut m = members.clone();
            m.sort_unstable();
            let expected: Vec<u32> = (0..n).filter(|w| c.group_of(WorkerId(*w)) == Some(*g)).collect();
            prop_assert_eq!(m, expected);
        }
        let mut w = Wired::new(c, dim);
        let d = run(&mut w, n, seed, 30, dup, true);
        prop_assert_eq!(&r.trace, &d.trace);
    }
}
