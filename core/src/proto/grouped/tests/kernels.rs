//! Properties of the fused kernels: each gives the bits of the passes it replaces.

use super::*;

/// A gradient element: mostly ordinary, sometimes large enough to overflow a squared norm or
/// a sum, sometimes not finite.
fn element() -> impl Strategy<Value = f64> {
    prop_oneof![
        8 => -4.0f64..4.0,
        1 => prop_oneof![Just(1e200f64), Just(-3e307f64), Just(f64::NAN), Just(f64::INFINITY), Just(-0.0f64)],
    ]
}

/// `values` as little-endian bytes.
fn le_bytes(values: &[f64]) -> Vec<u8> {
    let mut out = vec![0u8; values.len() * 8];
    for (v, b) in values.iter().zip(out.chunks_exact_mut(8)) {
        assert!(Scalar::write_le(*v, b));
    }
    out
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(64))]

    /// The fused kernels have the bits of the passes they replace: `add_measured` is
    /// `math::add` and `math::squared_norm` of the gradient, `add_scale_measured` is
    /// `math::add` (or `math::scaled_add`) then `scale_measured`, `apply_copy_clear` is
    /// `math::scaled_add`, `math::copy`, `math::fill_zero` (up to a NaN's payload),
    /// across the chunk boundary, near overflow and for non-finite values.
    #[test]
    fn fused_kernels_are_the_passes_they_replace(
        acc in proptest::collection::vec(proptest::num::f32::ANY, 0..40),
        x in proptest::collection::vec(proptest::num::f32::ANY, 0..40),
        big in proptest::collection::vec(-3.0e19f32..3.0e19, 0..40),
        factor in prop_oneof![Just(1.0f32), proptest::num::f32::ANY],
        w in proptest::num::f32::ANY,
    ) {
        let same = |a: f32, b: f32| a.to_bits() == b.to_bits() || (a.is_nan() && b.is_nan());
        // Bit for bit but for which NaN payload an operation on two NaNs keeps.
        let bits = |v: &[f32]| v.iter().map(|e| if e.is_nan() { u32::MAX } else { e.to_bits() }).collect::<Vec<_>>();
        for x in [x, big] {
            let len = acc.len().min(x.len());
            let (acc, x) = (&acc[..len], &x[..len]);

            let (mut fused, mut plain) = (acc.to_vec(), acc.to_vec());
            let sq = add_measured(&mut fused, x);
            math::add(&mut plain, x).unwrap();
            prop_assert!(same(sq, math::squared_norm(x)));
            prop_assert_eq!(bits(&fused), bits(&plain));

            let (mut fused, mut plain) = (acc.to_vec(), acc.to_vec());
            let sq = add_scale_measured(&mut fused, x, factor, w);
            if factor == 1.0 {
                math::add(&mut plain, x).unwrap();
            } else {
                math::scaled_add(&mut plain, factor, x).unwrap();
            }
            prop_assert!(same(sq, scale_measured(&mut plain, w)));
            prop_assert_eq!(bits(&fused), bits(&plain));

            let (mut params, mut agg, mut model) = (acc.to_vec(), x.to_vec(), vec![7.0f32; len]);
            apply_copy_clear(&mut params, w, &mut agg, &mut model);
            let mut plain = acc.to_vec();
            math::scaled_add(&mut plain, w, x).unwrap();
            prop_assert_eq!(bits(&params), bits(&plain));
            prop_assert_eq!(bits(&model), bits(&plain));
            prop_assert_eq!(bits(&agg), bits(&vec![0.0f32; len]));
        }
    }

    /// The fused paths of a group step (taken for gradients lent as slices) and the two-pass
    /// paths (taken for the same gradients as bytes) give the same refusals, outputs, group
    /// models and central model, bit for bit, whatever the partition, the local steps, the
    /// norm bound and the gradients (overflowing and non-finite ones included).
    #[test]
    fn fused_and_two_pass_group_steps_agree(
        n in 1u32..6,
        groups_seed in any::<u32>(),
        local_steps in 1u32..4,
        scaling in 0u8..3,
        bound in prop_oneof![Just(None), (0.5f64..20.0).prop_map(Some)],
        dim in 1usize..20,
        steps in proptest::collection::vec((any::<u32>(), any::<bool>(), proptest::collection::vec(element(), 20)), 1..80),
    ) {
        let mut c = GroupedConfig::new(n, 0.25, 1 + groups_seed % n);
        c.local_steps = local_steps;
        c.lr_scaling = [LrScaling::None, LrScaling::Linear, LrScaling::Sqrt][scaling as usize];
        c.gradient_policy.max_norm = bound;
        let (mut fused, mut plain) = (grouped(c, dim), grouped(c, dim));
        let show = |outs: Vec<Out>| std::format!("{outs:?}");
        prop_assert_eq!(show(drain_server(&mut fused)), show(drain_server(&mut plain)));
        let mut seqs = vec![0u64; n as usize];
        for (pick, stale, values) in &steps {
            let worker = WorkerId(pick % n);
            let g = c.group_of(worker).unwrap();
            let version = fused.group_version(g).unwrap();
            let base = if *stale { Version(version.0.saturating_sub(1)) } else { version };
            let seq = &mut seqs[worker.0 as usize];
            *seq += 1;
            let values = &values[..dim];
            let bytes = le_bytes(values);
            let slice = ToServer::Grad { base, iteration: 0, seq: *seq, values: Values::Slice(values), loss: None };
            let le = ToServer::Grad { base, iteration: 0, seq: *seq, values: Values::LittleEndian(&bytes), loss: None };
            let now = Instant::ZERO;
            prop_assert_eq!(fused.handle(now, worker, slice), plain.handle(now, worker, le));
            prop_assert_eq!(show(drain_server(&mut fused)), show(drain_server(&mut plain)));
        }
        let bits = |v: &[f64]| v.iter().map(|e| e.to_bits()).collect::<Vec<_>>();
        prop_assert_eq!(fused.version(), plain.version());
        prop_assert_eq!(bits(fused.params()), bits(plain.params()));
        for g in 0..c.groups {
            prop_assert_eq!(fused.group_version(g), plain.group_version(g));
            prop_assert_eq!(bits(fused.group_model(g).unwrap()), bits(plain.group_model(g).unwrap()));
        }
    }
}
