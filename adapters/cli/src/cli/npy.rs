//! NumPy `.npy` files holding one flat float32 vector: what `serve --init` reads and
//! `serve --save` writes.
//!
//! Accepted: format versions 1, 2 and 3 (`\x93NUMPY`, major version, minor version, the
//! header's length as a `u16` for version 1 or a `u32` for 2 and 3, the header), a header
//! that is a Python dict literal with exactly the keys `descr`, `fortran_order` and
//! `shape`, `descr` `'<f4'` (little-endian float32), one dimension of at least one
//! element, and exactly `4 × n` bytes of data after the header. Everything else (another
//! dtype, another shape, a truncated file, trailing bytes) is refused with the reason, as
//! is a NaN or infinite element (naming its index). The reader never panics, whatever the
//! bytes.
//!
//! Only a regular file is read (a device or a FIFO is refused without reading or
//! blocking), and no more of it than its header announces: the header first, at most
//! [`MAX_HEADER_LEN`] bytes, then exactly the `4 × n` data bytes its shape names.
//!
//! Written files are version 1 with the header padded with spaces to a multiple of 64 bytes
//! (as NumPy writes them), by [`file::replace`] (atomic and durable; never over a device or
//! a FIFO).

use std::io::Read as _;
use std::path::Path;
use syncopate_transport::file;

/// The first six bytes of every `.npy` file.
const MAGIC: &[u8; 6] = b"\x93NUMPY";
/// The longest header this reader accepts (NumPy's own limit for untrusted files).
const MAX_HEADER_LEN: usize = 10_000;

/// Reads the flat float32 vector in the `.npy` file at `path`. The error is one line naming
/// the file and the reason.
pub(super) fn read_vector(path: &Path) -> Result<Vec<f32>, String> {
    let cannot = |e: std::io::Error| format!("{}: cannot read: {e}", path.display());
    let (mut f, _) = file::open_regular(path).map_err(cannot)?;
    let mut bytes = Vec::new();
    // Each part no further than the part before announces: the fixed start (magic, version,
    // the header's length), the header, then the data its shape names and one byte more
    // (which the decoder refuses as trailing data).
    let mut read_to = |bytes: &mut Vec<u8>, total: usize| {
        let more = total.saturating_sub(bytes.len()) as u64;
        (&mut f).take(more).read_to_end(bytes).map(drop).map_err(cannot)
    };
    read_to(&mut bytes, FIXED_LEN)?;
    if let Some(header_end) = header_end(&bytes) {
        read_to(&mut bytes, header_end)?;
        if let Ok((start, n)) = data_start(&bytes) {
            let end = n.checked_mul(4).and_then(|d| d.checked_add(start)).unwrap_or(usize::MAX);
            read_to(&mut bytes, end.saturating_add(1))?;
        }
    }
    decode_vector(&bytes).map_err(|why| format!("{}: {why}", path.display()))
}

/// The longest fixed start of a `.npy` file: magic, version and a 4-byte header length.
const FIXED_LEN: usize = MAGIC.len() + 2 + 4;

/// Where the header of the `.npy` file starting with `bytes` ends, if its fixed start is
/// whole and announces a header of at most [`MAX_HEADER_LEN`] bytes.
fn header_end(bytes: &[u8]) -> Option<usize> {
    let rest = bytes.strip_prefix(MAGIC.as_slice())?;
    let (fixed, len) = match rest.first()? {
        1 => (MAGIC.len() + 4, usize::from(u16::from_le_bytes(rest.get(2..4)?.try_into().ok()?))),
        2 | 3 => (FIXED_LEN, usize::try_from(u32::from_le_bytes(rest.get(2..6)?.try_into().ok()?)).ok()?),
        _ => return None,
    };
    (len <= MAX_HEADER_LEN).then_some(fixed + len)
}

/// Writes `values` to `path` as a version-1 `.npy` file of shape `(n,)` and dtype `<f4`,
/// atomically ([`file::replace`]).
pub(super) fn write_vector(path: &Path, values: &[f32]) -> Result<(), String> {
    file::replace(path, &encode_vector(values)).map_err(|e| format!("{}: cannot write: {e}", path.display()))
}

/// The bytes of a version-1 `.npy` file holding `values` (shape `(n,)`, dtype `<f4`).
pub(super) fn encode_vector(values: &[f32]) -> Vec<u8> {
    let mut header = format!("{{'descr': '<f4', 'fortran_order': False, 'shape': ({},), }}", values.len());
    // Magic (6), version (2), header length (2), header ending in '\n': a multiple of 64.
    let unpadded = MAGIC.len() + 2 + 2 + header.len() + 1;
    header.push_str(&" ".repeat((64 - unpadded % 64) % 64));
    header.push('\n');
    let mut out = Vec::with_capacity(10 + header.len() + 4 * values.len());
    out.extend_from_slice(MAGIC);
    out.extend_from_slice(&[1, 0]);
    // A header of a few dozen bytes: its length fits a u16.
    out.extend_from_slice(&u16::try_from(header.len()).unwrap_or(u16::MAX).to_le_bytes());
    out.extend_from_slice(header.as_bytes());
    for v in values {
        out.extend_from_slice(&v.to_le_bytes());
    }
    out
}

/// Where the data of the `.npy` file starting with `bytes` starts, and its element count:
/// the header parsed and checked, the data not.
fn data_start(bytes: &[u8]) -> Result<(usize, usize), String> {
    let rest = bytes.strip_prefix(MAGIC.as_slice()).ok_or("not a NumPy .npy file (no \\x93NUMPY magic)")?;
    let (&major, rest) = rest.split_first().ok_or("truncated .npy header (no version)")?;
    let (_minor, rest) = rest.split_first().ok_or("truncated .npy header (no version)")?;
    let (header_len, rest) = match major {
        1 => {
            let (len, rest) = rest.split_at_checked(2).ok_or("truncated .npy header (no header length)")?;
            (usize::from(u16::from_le_bytes(len.try_into().unwrap_or_default())), rest)
        }
        2 | 3 => {
            let (len, rest) = rest.split_at_checked(4).ok_or("truncated .npy header (no header length)")?;
            let len = u32::from_le_bytes(len.try_into().unwrap_or_default());
            (usize::try_from(len).unwrap_or(usize::MAX), rest)
        }
        v => return Err(format!(".npy format version {v} is not supported (1, 2 or 3 are)")),
    };
    if header_len > MAX_HEADER_LEN {
        return Err(format!("the .npy header claims {header_len} bytes, more than {MAX_HEADER_LEN}"));
    }
    let (header, data) = rest.split_at_checked(header_len).ok_or("truncated .npy file (the header is cut short)")?;
    let header = std::str::from_utf8(header).map_err(|_| "the .npy header is not text".to_owned())?;
    Ok((bytes.len() - data.len(), parse_header(header)?))
}

/// The flat float32 vector in the bytes of a `.npy` file, or why they are not one.
pub(super) fn decode_vector(bytes: &[u8]) -> Result<Vec<f32>, String> {
    let (start, n) = data_start(bytes)?;
    let data = bytes.get(start..).unwrap_or_default();
    let expected = n.checked_mul(4).ok_or_else(|| format!("shape ({n},) is too large"))?;
    if data.len() < expected {
        return Err(format!(
            "truncated: shape ({n},) needs {expected} bytes of float32 data, the file has {}",
            data.len()
        ));
    }
    if data.len() > expected {
        return Err(format!(
            "{} bytes after the {n} float32 values of shape ({n},): not one array",
            data.len() - expected
        ));
    }
    let values: Vec<f32> = data.chunks_exact(4).map(|c| f32::from_le_bytes(c.try_into().unwrap_or_default())).collect();
    if let Some((i, v)) = values.iter().enumerate().find(|(_, v)| !v.is_finite()) {
        return Err(format!("element {i} is {v}: the initial parameters must be finite"));
    }
    Ok(values)
}

/// The number of elements a header describes, if it is a C-order one-dimensional `<f4`
/// array.
fn parse_header(header: &str) -> Result<usize, String> {
    let body = header
        .trim_end_matches(['\n', ' ', '\0'])
        .trim()
        .strip_prefix('{')
        .and_then(|b| b.strip_suffix('}'))
        .ok_or("the .npy header is not a dict")?;
    let (mut descr, mut fortran, mut shape) = (None, None, None);
    let mut rest = body.trim_start();
    while !rest.is_empty() {
        let (key, after) = quoted(rest).ok_or("malformed .npy header (expected a quoted key)")?;
        let after = after.trim_start().strip_prefix(':').ok_or("malformed .npy header (expected ':')")?;
        let after = after.trim_start();
        let after = match key {
            "descr" => {
                let (v, after) = quoted(after).ok_or("malformed .npy header ('descr' is not a string)")?;
                descr = Some(v);
                after
            }
            "fortran_order" => {
                let (v, after) = if let Some(a) = after.strip_prefix("False") {
                    (false, a)
                } else if let Some(a) = after.strip_prefix("True") {
                    (true, a)
                } else {
                    return Err("malformed .npy header ('fortran_order' is not True or False)".into());
                };
                fortran = Some(v);
                after
            }
            "shape" => {
                let open = after.strip_prefix('(').ok_or("malformed .npy header ('shape' is not a tuple)")?;
                let close = open.find(')').ok_or("malformed .npy header ('shape' is not closed)")?;
                let inner = open.get(..close).unwrap_or_default();
                let dims: Vec<&str> = inner.split(',').map(str::trim).filter(|d| !d.is_empty()).collect();
                // Python reads `(10)` as the number 10, not a tuple: NumPy refuses it.
                if dims.len() == 1 && !inner.contains(',') {
                    return Err(format!(
                        "malformed .npy header ('shape' ({inner}) is not a tuple: one dimension is written ({inner},))",
                        inner = inner.escape_default()
                    ));
                }
                let dims: Vec<usize> = dims
                    .iter()
                    .map(|d| d.trim_end_matches('L').parse::<usize>())
                    .collect::<Result<_, _>>()
                    .map_err(|_| format!("malformed .npy header (shape ({}))", inner.escape_default()))?;
                shape = Some(dims);
                open.get(close + 1..).unwrap_or_default()
            }
            other => return Err(format!("malformed .npy header (unknown key '{}')", other.escape_default())),
        };
        let after = after.trim_start();
        rest = match after.strip_prefix(',') {
            Some(a) => a.trim_start(),
            None if after.is_empty() => after,
            None => return Err("malformed .npy header (expected ',' between entries)".into()),
        };
    }
    let descr = descr.ok_or("malformed .npy header (no 'descr')")?;
    fortran.ok_or("malformed .npy header (no 'fortran_order')")?;
    let shape = shape.ok_or("malformed .npy header (no 'shape')")?;
    if descr != "<f4" {
        return Err(format!(
            "dtype '{}': expected '<f4' (little-endian float32; numpy: a.astype(np.float32))",
            descr.escape_default()
        ));
    }
    match shape[..] {
        [0] => Err("shape (0,): the vector is empty".into()),
        // One dimension is laid out the same in C and Fortran order.
        [n] => Ok(n),
        _ => {
            let dims: Vec<String> = shape.iter().map(usize::to_string).collect();
            let shown = if dims.len() == 1 { format!("({},)", dims[0]) } else { format!("({})", dims.join(", ")) };
            Err(format!("shape {shown}: expected one dimension (numpy: a.reshape(-1))"))
        }
    }
}

/// A string literal in single or double quotes at the start of `s`, and what follows it.
fn quoted(s: &str) -> Option<(&str, &str)> {
    let q = s.chars().next().filter(|c| *c == '\'' || *c == '"')?;
    let inner = s.get(1..)?;
    let end = inner.find(q)?;
    Some((inner.get(..end)?, inner.get(end + 1..)?))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn npy(version: u8, header: &str, data: &[u8]) -> Vec<u8> {
        let mut out = MAGIC.to_vec();
        out.extend_from_slice(&[version, 0]);
        if version == 1 {
            out.extend_from_slice(&(header.len() as u16).to_le_bytes());
        } else {
            out.extend_from_slice(&(header.len() as u32).to_le_bytes());
        }
        out.extend_from_slice(header.as_bytes());
        out.extend_from_slice(data);
        out
    }

    fn floats(v: &[f32]) -> Vec<u8> {
        v.iter().flat_map(|x| x.to_le_bytes()).collect()
    }

    const F4: &str = "{'descr': '<f4', 'fortran_order': False, 'shape': (3,), }          \n";

    #[test]
    fn a_written_vector_reads_back_with_a_header_aligned_to_64_bytes() {
        for values in [vec![1.5f32], vec![0.0, -2.0, 3.25, f32::MIN_POSITIVE], vec![0.5; 5994]] {
            let bytes = encode_vector(&values);
            let data_start = bytes.len() - 4 * values.len();
            assert_eq!(data_start % 64, 0, "NumPy pads the header to a multiple of 64 bytes");
            assert_eq!(decode_vector(&bytes).unwrap(), values);
        }
    }

    #[test]
    fn versions_1_2_and_3_are_read() {
        let data = floats(&[1.0, 2.0, 3.0]);
        for v in [1, 2, 3] {
            assert_eq!(decode_vector(&npy(v, F4, &data)).unwrap(), vec![1.0, 2.0, 3.0], "version {v}");
        }
        let h = "{\"shape\": (3,), \"fortran_order\": True, \"descr\": \"<f4\"}\n";
        assert_eq!(decode_vector(&npy(1, h, &data)).unwrap(), vec![1.0, 2.0, 3.0], "any key order; 1-D Fortran = C");
        assert_eq!(
            decode_vector(&npy(4, F4, &data)).unwrap_err(),
            ".npy format version 4 is not supported (1, 2 or 3 are)"
        );
    }

    #[test]
    fn another_dtype_or_shape_is_refused_with_the_reason() {
        let f8 = "{'descr': '<f8', 'fortran_order': False, 'shape': (3,), }\n";
        let e = decode_vector(&npy(1, f8, &[0; 24])).unwrap_err();
        assert!(e.starts_with("dtype '<f8': expected '<f4'"), "{e}");
        let big = "{'descr': '>f4', 'fortran_order': False, 'shape': (3,), }\n";
        assert!(decode_vector(&npy(1, big, &[0; 12])).unwrap_err().starts_with("dtype '>f4'"));
        let two = "{'descr': '<f4', 'fortran_order': False, 'shape': (3, 2), }\n";
        assert_eq!(
            decode_vector(&npy(1, two, &[0; 24])).unwrap_err(),
            "shape (3, 2): expected one dimension (numpy: a.reshape(-1))"
        );
        let scalar = "{'descr': '<f4', 'fortran_order': False, 'shape': (), }\n";
        assert!(decode_vector(&npy(1, scalar, &[0; 4])).unwrap_err().starts_with("shape (): expected one dimension"));
        let empty = "{'descr': '<f4', 'fortran_order': False, 'shape': (0,), }\n";
        assert_eq!(decode_vector(&npy(1, empty, &[])).unwrap_err(), "shape (0,): the vector is empty");
    }

    #[test]
    fn a_truncated_file_trailing_bytes_and_non_finite_values_are_refused() {
        let e = decode_vector(&npy(1, F4, &floats(&[1.0, 2.0]))).unwrap_err();
        assert_eq!(e, "truncated: shape (3,) needs 12 bytes of float32 data, the file has 8");
        let mut long = floats(&[1.0, 2.0, 3.0]);
        long.push(0);
        assert!(decode_vector(&npy(1, F4, &long)).unwrap_err().starts_with("1 bytes after the 3 float32 values"));
        let e = decode_vector(&npy(1, F4, &floats(&[1.0, f32::NAN, 3.0]))).unwrap_err();
        assert_eq!(e, "element 1 is NaN: the initial parameters must be finite");
        let e = decode_vector(&npy(2, F4, &floats(&[1.0, 2.0, f32::NEG_INFINITY]))).unwrap_err();
        assert_eq!(e, "element 2 is -inf: the initial parameters must be finite");
    }

    #[test]
    fn malformed_headers_are_refused() {
        let data = floats(&[1.0, 2.0, 3.0]);
        let cases = [
            ("[1, 2]\n", "the .npy header is not a dict"),
            ("{'descr': '<f4', 'shape': (3,)}\n", "malformed .npy header (no 'fortran_order')"),
            ("{'descr': '<f4', 'fortran_order': 0, 'shape': (3,)}\n", "'fortran_order' is not True or False"),
            ("{'descr': '<f4', 'fortran_order': False, 'shape': 3}\n", "'shape' is not a tuple"),
            ("{'descr': '<f4', 'fortran_order': False, 'shape': (3,}\n", "'shape' is not closed"),
            ("{'descr': '<f4', 'fortran_order': False, 'shape': (3)}\n", "'shape' (3) is not a tuple"),
            ("{'descr': '<f4', 'fortran_order': False, 'shape': (-3,)}\n", "shape (-3,)"),
            ("{'descr': '<f4', 'fortran_order': False, 'shape': (3,), 'x': 1}\n", "unknown key 'x'"),
            ("{'descr': '<f4' 'fortran_order': False, 'shape': (3,)}\n", "expected ',' between entries"),
            ("{descr: '<f4'}\n", "expected a quoted key"),
            ("{'descr' '<f4'}\n", "expected ':'"),
            ("{'descr': <f4}\n", "'descr' is not a string"),
        ];
        for (header, reason) in cases {
            let e = decode_vector(&npy(1, header, &data)).unwrap_err();
            assert!(e.contains(reason), "{header:?}: {e}");
        }
        assert!(decode_vector(b"PK\x03\x04").unwrap_err().starts_with("not a NumPy .npy file"));
        assert!(decode_vector(b"\x93NUMPY\x01").unwrap_err().starts_with("truncated .npy header"));
        assert!(decode_vector(b"\x93NUMPY\x01\x00\x10").unwrap_err().starts_with("truncated .npy header"));
        let mut cut = npy(1, F4, &data);
        cut.truncate(20);
        assert_eq!(decode_vector(&cut).unwrap_err(), "truncated .npy file (the header is cut short)");
        let mut huge = MAGIC.to_vec();
        huge.extend_from_slice(&[2, 0, 0xff, 0xff, 0xff, 0xff]);
        assert!(decode_vector(&huge).unwrap_err().contains("more than 10000"));
        let mut not_text = npy(1, F4, &data);
        not_text[12] = 0xff;
        assert_eq!(decode_vector(&not_text).unwrap_err(), "the .npy header is not text");
    }

    #[test]
    fn no_bytes_make_the_reader_panic() {
        let good = npy(3, F4, &floats(&[1.0, 2.0, 3.0]));
        let mut rng = syncopate::rng::Rng::derive(7, 33);
        for _ in 0..20_000 {
            let mut b = good.clone();
            let len = (rng.next_f64() * (b.len() + 4) as f64) as usize;
            b.resize(len, 0);
            for _ in 0..((rng.next_f64() * 4.0) as usize) {
                if !b.is_empty() {
                    let i = (rng.next_f64() * b.len() as f64) as usize % b.len();
                    b[i] = (rng.next_f64() * 256.0) as u8;
                }
            }
            let _ = decode_vector(&b);
        }
        for n in 0..64 {
            let _ = decode_vector(&good[..n.min(good.len())]);
        }
    }

    #[test]
    fn a_vector_is_written_atomically_and_reads_back() {
        use std::fs;
        let dir = std::env::temp_dir().join(format!("syncopate-npy-{}", std::process::id()));
        fs::create_dir_all(&dir).unwrap();
        let path = dir.join("model.npy");
        write_vector(&path, &[1.0, 2.0]).unwrap();
        write_vector(&path, &[3.0, 4.0, 5.0]).unwrap();
        assert_eq!(read_vector(&path).unwrap(), vec![3.0, 4.0, 5.0]);
        let names: Vec<_> = fs::read_dir(&dir).unwrap().map(|e| e.unwrap().file_name()).collect();
        assert_eq!(names, vec![std::ffi::OsString::from("model.npy")], "no temporary file left");
        let e = read_vector(&dir.join("missing.npy")).unwrap_err();
        assert!(e.contains("missing.npy: cannot read"), "{e}");
        fs::remove_dir_all(&dir).unwrap();
    }

    #[cfg(unix)]
    #[test]
    fn a_device_or_a_fifo_is_refused_without_reading_or_blocking() {
        let e = read_vector(Path::new("/dev/zero")).unwrap_err();
        assert_eq!(e, "/dev/zero: cannot read: a character device, not a regular file");
        let dir = std::env::temp_dir().join(format!("syncopate-npy-fifo-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let fifo = dir.join("f.npy");
        assert!(std::process::Command::new("mkfifo").arg(&fifo).status().unwrap().success());
        assert!(read_vector(&fifo).unwrap_err().ends_with("cannot read: a FIFO, not a regular file"));
        std::fs::remove_dir_all(&dir).unwrap();
    }

    #[test]
    fn a_file_longer_than_its_header_announces_is_refused_after_reading_one_byte_more() {
        let dir = std::env::temp_dir().join(format!("syncopate-npy-long-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let path = dir.join("long.npy");
        let mut bytes = encode_vector(&[1.0, 2.0, 3.0]);
        bytes.extend_from_slice(&[0u8; 1 << 16]);
        std::fs::write(&path, &bytes).unwrap();
        let e = read_vector(&path).unwrap_err();
        assert!(e.ends_with("1 bytes after the 3 float32 values of shape (3,): not one array"), "{e}");
        std::fs::remove_dir_all(&dir).unwrap();
    }
}
