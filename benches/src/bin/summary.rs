//! Prints the kernel and state-machine tables (markdown) from criterion's last results in
//! `target/criterion`: medians, bytes per second, and the ratios the targets are stated in.
//!
//! `cargo run -p syncopate-benches --release --bin summary`

use syncopate_benches::{KERNEL_DIMS, criterion_median_ns};

/// (kernel id, its 16-lane baseline id, what it does)
const KERNELS: [(&str, Option<&str>, &str); 14] = [
    ("accumulate", Some("accumulate_simd"), "acc += g"),
    ("accumulate_le", Some("accumulate_le_simd"), "acc += decode_le(payload)"),
    ("admit_accumulate_le", Some("accumulate_le_simd"), "admit (len, finite, norm) + acc += decode_le"),
    (
        "admit_accumulate_le_fused",
        Some("accumulate_le_simd"),
        "one pass: spare = acc + decode_le, norm; swap on accept",
    ),
    ("average", Some("average_simd"), "acc *= 1/k"),
    ("apply", Some("apply_simd"), "w += a*acc; acc = 0"),
    ("norm", Some("norm_simd"), "sum g^2"),
    ("norm_le", Some("norm_simd"), "sum decode_le(payload)^2"),
    ("finite", Some("finite_scalar"), "all finite (SIMD column: the scalar fold it replaced)"),
    ("finite_le", Some("finite_le_scalar"), "all finite, decode_le (SIMD column: the scalar loop)"),
    ("worker_grad", Some("worker_grad_2pass"), "buf = g while checking finite (SIMD column: check, then copy)"),
    ("worker_grad_2pass_scalar", None, "scalar finite check, then copy (before)"),
    ("close_folded_le", Some("close_2pass_le"), "w += a*(acc + decode_le); acc = 0 (SIMD column: add, then apply)"),
    ("copy", None, "copy_from_slice (baseline)"),
];

fn fmt_ns(ns: f64) -> String {
    if ns >= 1e6 {
        format!("{:.2} ms", ns / 1e6)
    } else if ns >= 1e3 {
        format!("{:.1} µs", ns / 1e3)
    } else {
        format!("{ns:.0} ns")
    }
}

fn main() {
    println!("### Kernels (f32, throughput = 4·d bytes / median time)\n");
    println!("| kernel | d | median | GB/s | copy / kernel | SIMD loop / kernel |");
    println!("|---|---:|---:|---:|---:|---:|");
    for (name, simd, what) in KERNELS {
        for d in KERNEL_DIMS {
            let Some(t) = criterion_median_ns(&format!("kernels/{name}/{d}")) else { continue };
            let copy = criterion_median_ns(&format!("kernels/copy/{d}"));
            let base = simd.and_then(|s| criterion_median_ns(&format!("kernels/{s}/{d}")));
            let gbs = (4 * d) as f64 / t;
            let ratio = |b: Option<f64>| b.map_or("–".to_string(), |b| format!("{:.2}x", b / t));
            println!("| {name} ({what}) | {d:.0e} | {} | {gbs:.1} | {} | {} |", fmt_ns(t), ratio(copy), ratio(base));
        }
    }
    println!();
    println!("### State machines (ns per control message, n = 4, d = 16)\n");
    println!("handle + drain: `handle` of in-memory messages (`Values::Slice`) and draining `poll_output`");
    println!("(each output copied once); with wire codec: also decoding each inbound message and encoding");
    println!("each reply for each recipient.\n");
    println!("| protocol | handle + drain (ns/msg) | with wire codec (ns/msg) |");
    println!("|---|---:|---:|");
    let Ok(dir) = std::fs::read_dir(syncopate_benches::criterion_dir().join("overhead")) else { return };
    let mut protocols: Vec<String> =
        dir.flatten().map(|p| p.file_name().to_string_lossy().into_owned()).filter(|p| p != "report").collect();
    protocols.sort();
    let cell = |id: String| criterion_median_ns(&id).map_or("–".to_string(), |t| format!("{t:.0}"));
    for p in protocols {
        let (mem, wire) = (format!("overhead/{p}/mem_n4"), format!("overhead/{p}/wire_n4"));
        if criterion_median_ns(&mem).is_none() && criterion_median_ns(&wire).is_none() {
            continue;
        }
        println!("| {p} | {} | {} |", cell(mem), cell(wire));
    }
}
