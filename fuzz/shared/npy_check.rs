//! The checks of the `npy` fuzz target, shared with `tests/tests/fuzz_parsers_corpus.rs`.
//!
//! Every input is parsed as the `.npy` file of `serve --init`. No panic and no error of more
//! than one line; what is accepted is a non-empty vector of finite values whose bytes are
//! the file's last `4 n` bytes; written again as `serve --save` writes it, it parses back
//! to the same bits, and that file is a fixed point of parse-then-write.

use syncopate_adapters::cli::{encode_npy_vector, parse_npy_vector};

fn bits(v: &[f32]) -> Vec<u32> {
    v.iter().map(|x| x.to_bits()).collect()
}

/// Runs every check on `data`; panics on a violation. Returns 1 if the input was accepted.
pub(crate) fn check(data: &[u8]) -> usize {
    match parse_npy_vector(data) {
        Err(e) => {
            assert!(!e.contains('\n'), "a .npy error of more than one line: {e:?}");
            0
        }
        Ok(values) => {
            assert!(!values.is_empty() && values.iter().all(|v| v.is_finite()));
            let start = data.len().checked_sub(4 * values.len()).expect("more values than bytes");
            let tail = data.get(start..).unwrap_or_default();
            let from_tail: Vec<u32> =
                tail.chunks_exact(4).map(|c| u32::from_le_bytes(c.try_into().unwrap_or_default())).collect();
            assert_eq!(bits(&values), from_tail, "the values are not the file's data bytes");
            let written = encode_npy_vector(&values);
            let back = parse_npy_vector(&written).unwrap_or_else(|e| panic!("a written .npy refused: {e}"));
            assert_eq!(bits(&back), bits(&values));
            assert!(encode_npy_vector(&back) == written, "writing a written .npy again changed it");
            1
        }
    }
}
