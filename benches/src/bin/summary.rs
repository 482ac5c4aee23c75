//! Prints the kernel and state-machine tables (markdown) from criterion's last results in
//! `target/criterion`: medians, bytes per second, and the ratios the targets are stated in.
//!
//! `cargo run -p syncopate-benches --release --bin summary`

use syncopate_benches::{KERNEL_DIMS, criterion_median_ns};

/// (kernel id, its 16-lane baseline id, what it does)
const KERNELS: [(&str, Option<&str>, &str); 8] = [
    ("accumulate", Some("accumulate_simd"), "acc += g"),
    ("accumulate_le", Some("accumulate_le_simd"), "acc += decode_le(payload)"),
    ("admit_accumulate_le", Some("accumulate_le_simd"), "admit (len, finite, norm) + acc += decode_le"),
    ("average", Some("average_simd"), "acc *= 1/k"),
    ("apply", Some("apply_simd"), "w += a*acc; acc = 0"),
    ("norm", Some("norm_simd"), "sum g^2"),
    ("norm_le", Some("norm_simd"), "sum decode_le(payload)^2"),
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
    println!("### State machines (ns per control message: handle + drain, d = 16)\n");
    println!("| protocol | message | ns/msg |");
    println!("|---|---|---:|");
    let Ok(dir) = std::fs::read_dir(syncopate_benches::criterion_dir().join("overhead")) else { return };
    let mut rows: Vec<(String, String, f64)> = Vec::new();
    for proto in dir.flatten() {
        let proto_name = proto.file_name().to_string_lossy().into_owned();
        let Ok(sub) = std::fs::read_dir(proto.path()) else { continue };
        for msg in sub.flatten() {
            let msg_name = msg.file_name().to_string_lossy().into_owned();
            if msg_name == "report" {
                continue;
            }
            if let Some(t) = criterion_median_ns(&format!("overhead/{proto_name}/{msg_name}")) {
                rows.push((proto_name.clone(), msg_name, t));
            }
        }
    }
    rows.sort_by(|a, b| a.partial_cmp(b).unwrap_or(std::cmp::Ordering::Equal));
    for (p, m, t) in rows {
        println!("| {p} | {m} | {t:.0} |");
    }
}
