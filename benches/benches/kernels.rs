//! Aggregation kernels: the server's hot paths at d = 1e3 … 1e7 `f32`, each next to a plain
//! `copy_from_slice` of the same bytes and a hand-written 16-lane loop doing the same work,
//! all in one run. Throughput is the gradient's bytes (4·d) per second.
//!
//! Ids: `kernels/<kernel>/<d>`; `summary` turns them into ratios.

use criterion::{BenchmarkId, Criterion, Throughput, criterion_group, criterion_main};
use std::hint::black_box;
use std::time::Duration;
use syncopate::math;
use syncopate::proto::GradientPolicy;
use syncopate::{Scalar, Values};
use syncopate_benches::{
    KERNEL_DIMS, simd_add, simd_add_le, simd_apply_and_clear, simd_scale, simd_squared_norm, test_vector, to_le_bytes,
};

fn kernels(c: &mut Criterion) {
    let mut group = c.benchmark_group("kernels");
    for d in KERNEL_DIMS {
        let big = d >= 1_000_000;
        group.sample_size(if big { 10 } else { 30 });
        group.warm_up_time(Duration::from_millis(if big { 500 } else { 300 }));
        group.throughput(Throughput::Bytes((d * f32::BYTES) as u64));
        let g = test_vector(d, 1);
        let g_le = to_le_bytes(&g);
        let mut acc = test_vector(d, 2);
        let mut params = test_vector(d, 3);
        let policy = GradientPolicy::default();

        group.bench_function(BenchmarkId::new("copy", d), |b| b.iter(|| acc.copy_from_slice(black_box(&g))));

        // Accumulate a gradient: `acc += g` (in-process payload).
        group.bench_function(BenchmarkId::new("accumulate", d), |b| {
            b.iter(|| Values::Slice(black_box(&g[..])).add_into(&mut acc))
        });
        group.bench_function(BenchmarkId::new("accumulate_simd", d), |b| b.iter(|| simd_add(&mut acc, black_box(&g))));

        // Decode a little-endian payload into the accumulator: `acc += decode(bytes)`.
        group.bench_function(BenchmarkId::new("accumulate_le", d), |b| {
            b.iter(|| Values::<f32>::LittleEndian(black_box(&g_le[..])).add_into(&mut acc))
        });
        group.bench_function(BenchmarkId::new("accumulate_le_simd", d), |b| {
            b.iter(|| simd_add_le(&mut acc, black_box(&g_le)))
        });

        // The server's whole per-gradient path: admission (length, finiteness, norm) then
        // accumulation, as `Round::add` does it.
        group.bench_function(BenchmarkId::new("admit_accumulate_le", d), |b| {
            b.iter(|| {
                let v = Values::<f32>::LittleEndian(black_box(&g_le[..]));
                let f = policy.admit(&v, d).unwrap_or(1.0);
                if f == 1.0 { v.add_into(&mut acc) } else { v.scaled_add_into(&mut acc, f) }
            })
        });

        // The same, fused: one pass reads `acc` and the payload, writes `spare = acc + g` and
        // measures the norm; the accumulators swap on acceptance (`Round` with a spare).
        let mut spare = test_vector(d, 4);
        group.bench_function(BenchmarkId::new("admit_accumulate_le_fused", d), |b| {
            b.iter(|| {
                let v = Values::<f32>::LittleEndian(black_box(&g_le[..]));
                if policy.admit_add_to(&v, &acc, &mut spare).is_ok() {
                    std::mem::swap(&mut acc, &mut spare);
                }
            })
        });

        // Finiteness checks: the vectorised kernels next to the scalar fold they replaced.
        group.bench_function(BenchmarkId::new("finite", d), |b| b.iter(|| math::all_finite(black_box(&g[..]))));
        group.bench_function(BenchmarkId::new("finite_scalar", d), |b| b.iter(|| scalar_all_finite(black_box(&g))));
        group.bench_function(BenchmarkId::new("finite_le", d), |b| {
            b.iter(|| Values::<f32>::LittleEndian(black_box(&g_le[..])).all_finite())
        });
        group.bench_function(BenchmarkId::new("finite_le_scalar", d), |b| {
            b.iter(|| scalar_all_finite_le(black_box(&g_le)))
        });

        // The worker taking a gradient (`GradientWorker::handle_gradient`): check + copy into
        // its buffer in one pass, against two passes (vectorised check, and the scalar one).
        group.bench_function(BenchmarkId::new("worker_grad", d), |b| {
            b.iter(|| math::copy_finite(&mut acc, black_box(&g)))
        });
        group.bench_function(BenchmarkId::new("worker_grad_2pass", d), |b| {
            b.iter(|| {
                if math::all_finite(black_box(&g)) {
                    acc.copy_from_slice(&g);
                }
            })
        });
        group.bench_function(BenchmarkId::new("worker_grad_2pass_scalar", d), |b| {
            b.iter(|| {
                if scalar_all_finite(black_box(&g)) {
                    acc.copy_from_slice(&g);
                }
            })
        });

        // BSP's round close with its last gradient (after admission): the add folded into
        // the update (`params += a·(acc + g); acc = 0`) against add then apply-and-clear.
        group.bench_function(BenchmarkId::new("close_folded_le", d), |b| {
            b.iter(|| {
                let v = Values::<f32>::LittleEndian(black_box(&g_le[..]));
                v.add_apply_and_clear(1.0, &mut params, black_box(-1e-3), &mut acc)
            })
        });
        group.bench_function(BenchmarkId::new("close_2pass_le", d), |b| {
            b.iter(|| {
                let v = Values::<f32>::LittleEndian(black_box(&g_le[..]));
                let _ = v.add_into(&mut acc);
                math::apply_and_clear(&mut params, black_box(-1e-3), &mut acc)
            })
        });

        // Average k: `acc /= k`.
        group.bench_function(BenchmarkId::new("average", d), |b| b.iter(|| math::mean_of(&mut acc, black_box(4))));
        group.bench_function(BenchmarkId::new("average_simd", d), |b| b.iter(|| simd_scale(&mut acc, black_box(0.25))));

        // Apply a scaled update and clear the accumulator: `w += a·acc; acc = 0`.
        group.bench_function(BenchmarkId::new("apply", d), |b| {
            b.iter(|| math::apply_and_clear(&mut params, black_box(-1e-3), &mut acc))
        });
        group.bench_function(BenchmarkId::new("apply_simd", d), |b| {
            b.iter(|| simd_apply_and_clear(&mut params, black_box(-1e-3), &mut acc))
        });

        // Squared norm, of a slice and of a wire payload.
        group.bench_function(BenchmarkId::new("norm", d), |b| b.iter(|| math::squared_norm(black_box(&g[..]))));
        group.bench_function(BenchmarkId::new("norm_le", d), |b| {
            b.iter(|| Values::<f32>::LittleEndian(black_box(&g_le[..])).squared_norm())
        });
        group.bench_function(BenchmarkId::new("norm_simd", d), |b| b.iter(|| simd_squared_norm(black_box(&g))));
        black_box((&acc, &params));
    }
    group.finish();
}

/// The finiteness check as it was before it was vectorised (the baseline of `finite`).
fn scalar_all_finite(x: &[f32]) -> bool {
    x.iter().fold(true, |ok, v| ok & v.is_finite())
}

/// The little-endian check as it was before it was vectorised (the baseline of `finite_le`).
fn scalar_all_finite_le(b: &[u8]) -> bool {
    b.chunks_exact(4).all(|c| f32::from_le(c).is_some_and(|v| v.is_finite()))
}

criterion_group! {
    name = benches;
    config = Criterion::default().measurement_time(Duration::from_secs(2)).without_plots();
    targets = kernels
}
criterion_main!(benches);
