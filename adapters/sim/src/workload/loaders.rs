//! Loaders for data sets stored in files: dense CSV, sparse LIBSVM text and MNIST-style IDX.
//!
//! Every failure is a [`LoadError`] that displays as one line: the file (if known), the 1-based
//! line (for text formats) and what was wrong, e.g. `data.csv line 12: column 3: invalid
//! number 'x'`. Columns in messages are 1-based too.

use core::fmt;
use std::fs::File;
use std::io::{BufRead, BufReader, Read};
use std::path::{Path, PathBuf};

use flate2::read::MultiGzDecoder;

use super::dataset::{Dataset, Scaling};

/// Largest accepted LIBSVM feature index.
const MAX_FEATURE_INDEX: usize = 1 << 24;
/// Largest accepted dense data set, in `f32` cells (1 GiB).
const MAX_DENSE_CELLS: usize = 1 << 28;
/// Longest excerpt of a bad cell quoted in an error message, in characters.
const MAX_QUOTE: usize = 40;

/// Options for [`Dataset::from_csv_path`] and [`Dataset::from_csv_reader`].
#[derive(Clone, Debug, PartialEq)]
pub struct CsvOptions {
    /// 0-based index of the label column; `None` (the default) means the last column. All
    /// other columns are features, in file order.
    pub label_column: Option<usize>,
    /// Skip the first non-blank line (a header). Default `false`.
    pub has_header: bool,
    /// Cell separator. Default `,`.
    pub delimiter: char,
    /// Feature rescaling applied after loading. Default [`Scaling::Raw`].
    pub scaling: Scaling,
}

impl Default for CsvOptions {
    fn default() -> Self {
        Self { label_column: None, has_header: false, delimiter: ',', scaling: Scaling::Raw }
    }
}

/// Why a data set could not be loaded: where (file, line) and what was wrong.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct LoadError {
    path: Option<PathBuf>,
    line: Option<usize>,
    message: String,
}

impl LoadError {
    fn new(line: Option<usize>, message: impl Into<String>) -> Self {
        // Keep the Display output on one line whatever the message (e.g. from an io::Error).
        let message = message.into().replace(['\n', '\r'], " ");
        Self { path: None, line, message }
    }

    fn at(line: usize, message: impl Into<String>) -> Self {
        Self::new(Some(line), message)
    }

    fn whole(message: impl Into<String>) -> Self {
        Self::new(None, message)
    }

    fn with_path(mut self, path: &Path) -> Self {
        self.path = Some(path.to_path_buf());
        self
    }

    /// The file, when loading from a path.
    pub fn path(&self) -> Option<&Path> {
        self.path.as_deref()
    }

    /// The 1-based line, when the problem is on a particular line of a text file.
    pub fn line(&self) -> Option<usize> {
        self.line
    }

    /// What was wrong, without the location.
    pub fn message(&self) -> &str {
        &self.message
    }
}

impl fmt::Display for LoadError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match (&self.path, self.line) {
            (Some(p), Some(l)) => write!(f, "{} line {l}: {}", p.display(), self.message),
            (Some(p), None) => write!(f, "{}: {}", p.display(), self.message),
            (None, Some(l)) => write!(f, "line {l}: {}", self.message),
            (None, None) => f.write_str(&self.message),
        }
    }
}

impl core::error::Error for LoadError {}

/// `s` quoted for an error message: escaped and truncated.
fn quote(s: &str) -> String {
    let mut out: String = s.chars().take(MAX_QUOTE).flat_map(char::escape_debug).collect();
    if s.chars().nth(MAX_QUOTE).is_some() {
        out.push_str("...");
    }
    format!("'{out}'")
}

/// Opens `path`, gunzipping transparently when it starts with the gzip magic bytes.
fn open(path: &Path) -> Result<Box<dyn BufRead>, LoadError> {
    let file = File::open(path).map_err(|e| LoadError::whole(format!("cannot open: {e}")).with_path(path))?;
    let mut reader = BufReader::new(file);
    let gzipped = reader
        .fill_buf()
        .map_err(|e| LoadError::whole(format!("read error: {e}")).with_path(path))?
        .starts_with(&[0x1f, 0x8b]);
    Ok(if gzipped { Box::new(BufReader::new(MultiGzDecoder::new(reader))) } else { Box::new(reader) })
}

/// Calls `f(line_number, line)` for every line (1-based, without the line terminator).
fn for_each_line(
    mut r: impl BufRead,
    mut f: impl FnMut(usize, &str) -> Result<(), LoadError>,
) -> Result<(), LoadError> {
    let mut buf = String::new();
    let mut number = 0;
    loop {
        buf.clear();
        number += 1;
        match r.read_line(&mut buf) {
            Ok(0) => return Ok(()),
            Ok(_) => f(number, buf.trim_end_matches(['\n', '\r']))?,
            Err(e) => return Err(LoadError::at(number, format!("read error: {e}"))),
        }
    }
}

/// Parses a class label: an integer, optionally written as an integral float (`1.0`, `+1`).
fn parse_label(s: &str) -> Option<i64> {
    if let Ok(v) = s.parse::<i64>() {
        return Some(v);
    }
    let v = s.parse::<f64>().ok()?;
    (v.is_finite() && v.fract() == 0.0 && v.abs() < 9.0e15).then_some(v as i64)
}

/// Parses a feature value: a finite number.
fn parse_value(s: &str) -> Result<f32, String> {
    match s.parse::<f32>() {
        Ok(v) if v.is_finite() => Ok(v),
        Ok(_) => Err(format!("non-finite value {}", quote(s))),
        Err(_) => Err(format!("invalid number {}", quote(s))),
    }
}

/// Maps raw integer labels to `0..k` in ascending order of value; returns the labels and `k`.
fn remap_labels(raw: &[i64]) -> (Vec<u32>, usize) {
    let mut values = raw.to_vec();
    values.sort_unstable();
    values.dedup();
    let labels = raw.iter().map(|v| values.binary_search(v).map_or(0, |i| i as u32)).collect();
    (labels, values.len())
}

fn check_scaling(scaling: Scaling) -> Result<(), LoadError> {
    match scaling {
        Scaling::Divide(d) if !(d.is_finite() && d != 0.0) => {
            Err(LoadError::whole(format!("invalid scaling divisor {d} (must be finite and non-zero)")))
        }
        _ => Ok(()),
    }
}

impl Dataset {
    /// Loads a dense CSV file (gzip-compressed files are detected and decompressed). See
    /// [`Dataset::from_csv_reader`] for the format.
    ///
    /// # Errors
    ///
    /// As [`Dataset::from_csv_reader`], with the path in the error; also when the file cannot
    /// be opened.
    pub fn from_csv_path(path: &Path, options: &CsvOptions) -> Result<Self, LoadError> {
        Self::from_csv_reader(open(path)?, options).map_err(|e| e.with_path(path))
    }

    /// Reads dense CSV: one example per line, cells separated by `options.delimiter`, one
    /// column holding an integer class label (the last one unless `options.label_column` says
    /// otherwise), every other column a finite number. Blank lines are skipped, as is the
    /// first non-blank line if `options.has_header`. Labels are remapped to `0..k` in
    /// ascending order of value.
    ///
    /// # Errors
    ///
    /// On a read error, a non-numeric or non-finite cell, a non-integer label, a row whose
    /// column count differs from the first row's, a label column out of range, fewer than two
    /// columns, an invalid [`Scaling::Divide`] divisor, or no data rows.
    pub fn from_csv_reader(r: impl BufRead, options: &CsvOptions) -> Result<Self, LoadError> {
        check_scaling(options.scaling)?;
        let delimiter = options.delimiter;
        let mut header_pending = options.has_header;
        let mut n_columns = 0;
        let mut label_column = 0;
        let mut features = Vec::new();
        let mut raw_labels = Vec::new();
        for_each_line(r, |number, line| {
            if line.trim().is_empty() {
                return Ok(());
            }
            if header_pending {
                header_pending = false;
                return Ok(());
            }
            let count = line.split(delimiter).count();
            if n_columns == 0 {
                if count < 2 {
                    return Err(LoadError::at(number, format!("found {count} column, need a label and a feature")));
                }
                label_column = options.label_column.unwrap_or(count - 1);
                if label_column >= count {
                    return Err(LoadError::at(
                        number,
                        format!("label column {} out of range ({count} columns)", label_column + 1),
                    ));
                }
                n_columns = count;
            } else if count != n_columns {
                return Err(LoadError::at(number, format!("expected {n_columns} columns, found {count}")));
            }
            if (raw_labels.len() + 1).saturating_mul(n_columns - 1) > MAX_DENSE_CELLS {
                return Err(LoadError::at(number, format!("too large (limit {MAX_DENSE_CELLS} feature cells)")));
            }
            for (column, cell) in line.split(delimiter).enumerate() {
                let cell = cell.trim();
                if column == label_column {
                    let label = parse_label(cell).ok_or_else(|| {
                        LoadError::at(
                            number,
                            format!("column {}: invalid label {} (expected an integer)", column + 1, quote(cell)),
                        )
                    })?;
                    raw_labels.push(label);
                } else {
                    let v =
                        parse_value(cell).map_err(|m| LoadError::at(number, format!("column {}: {m}", column + 1)))?;
                    features.push(v);
                }
            }
            Ok(())
        })?;
        if raw_labels.is_empty() {
            return Err(LoadError::whole("no data rows"));
        }
        let (labels, n_classes) = remap_labels(&raw_labels);
        let mut data = Self { features, labels, n_features: n_columns - 1, n_classes };
        data.scale(options.scaling);
        Ok(data)
    }

    /// Loads a LIBSVM file (gzip-compressed files are detected and decompressed). See
    /// [`Dataset::from_libsvm_reader`] for the format.
    ///
    /// # Errors
    ///
    /// As [`Dataset::from_libsvm_reader`], with the path in the error; also when the file
    /// cannot be opened.
    pub fn from_libsvm_path(path: &Path) -> Result<Self, LoadError> {
        Self::from_libsvm_reader(open(path)?).map_err(|e| e.with_path(path))
    }

    /// Reads sparse LIBSVM text: one example per line, `label idx:val idx:val ...` separated
    /// by whitespace, with 1-based feature indices in any order (absent features are 0) and
    /// an optional `# comment` to the end of the line. Blank lines are skipped. The result is
    /// dense with `n_features` = the largest index seen; labels are integers (`+1`, `-1`,
    /// `3`, `2.0`) remapped to `0..k` in ascending order of value.
    ///
    /// # Errors
    ///
    /// On a read error, a non-integer label, a token that is not `idx:val`, an index that is
    /// 0, not a number, repeated on a line or above 2^24, a non-numeric or non-finite value,
    /// a result over 2^28 dense cells, or no data rows.
    pub fn from_libsvm_reader(r: impl BufRead) -> Result<Self, LoadError> {
        let mut entries: Vec<(u32, f32)> = Vec::new();
        let mut row_ends = Vec::new();
        let mut raw_labels = Vec::new();
        let mut n_features = 0;
        for_each_line(r, |number, line| {
            let content = line.split_once('#').map_or(line, |(before, _)| before);
            let mut tokens = content.split_whitespace();
            let Some(label) = tokens.next() else { return Ok(()) };
            let label = parse_label(label).ok_or_else(|| {
                LoadError::at(number, format!("invalid label {} (expected an integer)", quote(label)))
            })?;
            let row_start = entries.len();
            for token in tokens {
                let Some((index, value)) = token.split_once(':') else {
                    return Err(LoadError::at(number, format!("bad feature {} (expected index:value)", quote(token))));
                };
                let index: usize = index.parse().map_err(|_| {
                    LoadError::at(
                        number,
                        format!("bad feature index in {} (expected a positive integer)", quote(token)),
                    )
                })?;
                if index == 0 {
                    return Err(LoadError::at(
                        number,
                        format!("feature index 0 in {} (indices are 1-based)", quote(token)),
                    ));
                }
                if index > MAX_FEATURE_INDEX {
                    return Err(LoadError::at(
                        number,
                        format!("feature index {index} too large (limit {MAX_FEATURE_INDEX})"),
                    ));
                }
                let value = parse_value(value)
                    .map_err(|m| LoadError::at(number, format!("bad feature value in {}: {m}", quote(token))))?;
                entries.push((index as u32 - 1, value));
            }
            let row = &mut entries[row_start..];
            row.sort_unstable_by_key(|&(i, _)| i);
            if let Some(w) = row.windows(2).find(|w| w[0].0 == w[1].0) {
                return Err(LoadError::at(number, format!("duplicate feature index {}", w[0].0 + 1)));
            }
            if let Some(&(last, _)) = row.last() {
                n_features = n_features.max(last as usize + 1);
            }
            row_ends.push(entries.len());
            raw_labels.push(label);
            Ok(())
        })?;
        if raw_labels.is_empty() {
            return Err(LoadError::whole("no data rows"));
        }
        let cells = raw_labels.len().checked_mul(n_features).filter(|&c| c <= MAX_DENSE_CELLS).ok_or_else(|| {
            LoadError::whole(format!(
                "{} rows x {n_features} features is too large for dense storage (limit {MAX_DENSE_CELLS} cells)",
                raw_labels.len()
            ))
        })?;
        let mut features = vec![0.0; cells];
        let mut start = 0;
        for (dense, &end) in features.chunks_exact_mut(n_features.max(1)).zip(&row_ends) {
            for &(i, v) in &entries[start..end] {
                dense[i as usize] = v;
            }
            start = end;
        }
        let (labels, n_classes) = remap_labels(&raw_labels);
        Ok(Self { features, labels, n_features, n_classes })
    }

    /// Loads an MNIST-style pair of IDX files (gzip-compressed files are detected and
    /// decompressed): `images` holds unsigned bytes with dimensions `n x d1 x d2 ...`, each
    /// image becoming one row of `d1 * d2 * ...` features scaled to `[0, 1]` (divided by
    /// 255); `labels` holds `n` unsigned bytes, remapped to `0..k` in ascending order.
    ///
    /// # Errors
    ///
    /// When a file cannot be read, has a bad magic number or element type (only unsigned
    /// bytes, type `0x08`, are supported), has the wrong number of dimensions, is truncated
    /// or has trailing bytes, is over 2^28 cells, or when the counts of images and labels
    /// differ.
    pub fn from_idx_paths(images: &Path, labels: &Path) -> Result<Self, LoadError> {
        let read = |path: &Path| -> Result<Vec<u8>, LoadError> {
            let mut bytes = Vec::new();
            open(path)?
                .read_to_end(&mut bytes)
                .map_err(|e| LoadError::whole(format!("read error: {e}")).with_path(path))?;
            Ok(bytes)
        };
        let image_bytes = read(images)?;
        let label_bytes = read(labels)?;
        let (dims, pixels) = parse_idx(&image_bytes).map_err(|e| e.with_path(images))?;
        let (label_dims, raw) = parse_idx(&label_bytes).map_err(|e| e.with_path(labels))?;
        let (&n, rest) = dims.split_first().filter(|_| dims.len() >= 2).ok_or_else(|| {
            LoadError::whole(format!("expected images with 2 or more dimensions, found {}", dims.len()))
                .with_path(images)
        })?;
        if label_dims.len() != 1 {
            return Err(LoadError::whole(format!("expected labels with 1 dimension, found {}", label_dims.len()))
                .with_path(labels));
        }
        if label_dims[0] != n {
            return Err(LoadError::whole(format!("{n} images but {} labels", label_dims[0])).with_path(labels));
        }
        if n == 0 {
            return Err(LoadError::whole("no data rows").with_path(images));
        }
        let n_features = rest.iter().product();
        let features = pixels.iter().map(|&p| f32::from(p) / 255.0).collect();
        let raw: Vec<i64> = raw.iter().map(|&b| i64::from(b)).collect();
        let (labels, n_classes) = remap_labels(&raw);
        Ok(Self { features, labels, n_features, n_classes })
    }
}

/// Splits an IDX file of unsigned bytes into its dimensions and data, checking the length.
fn parse_idx(bytes: &[u8]) -> Result<(Vec<usize>, &[u8]), LoadError> {
    let [0, 0, kind, n_dims, rest @ ..] = bytes else {
        return Err(LoadError::whole("not an IDX file (bad magic number)"));
    };
    if *kind != 0x08 {
        return Err(LoadError::whole(format!("unsupported IDX element type 0x{kind:02x} (only unsigned bytes, 0x08)")));
    }
    let header_len = usize::from(*n_dims) * 4;
    if rest.len() < header_len {
        return Err(LoadError::whole("truncated IDX header"));
    }
    let (header, data) = rest.split_at(header_len);
    let dims: Vec<usize> =
        header.chunks_exact(4).map(|c| u32::from_be_bytes([c[0], c[1], c[2], c[3]]) as usize).collect();
    let cells =
        dims.iter().try_fold(1usize, |acc, &d| acc.checked_mul(d)).filter(|&c| c <= MAX_DENSE_CELLS).ok_or_else(
            || LoadError::whole(format!("dimensions {dims:?} too large (limit {MAX_DENSE_CELLS} cells)")),
        )?;
    if data.len() != cells {
        return Err(LoadError::whole(format!("dimensions {dims:?} need {cells} bytes of data, found {}", data.len())));
    }
    Ok((dims, data))
}

#[cfg(test)]
mod tests {
    use super::*;
    use core::sync::atomic::{AtomicUsize, Ordering};

    /// A fresh directory under the system temp dir, unique per test and process.
    fn temp_dir(name: &str) -> PathBuf {
        static COUNTER: AtomicUsize = AtomicUsize::new(0);
        let n = COUNTER.fetch_add(1, Ordering::Relaxed);
        let dir = std::env::temp_dir().join(format!("syncopate-workload-{}-{name}-{n}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        std::fs::create_dir_all(&dir).unwrap();
        dir
    }

    fn write(dir: &Path, name: &str, contents: &[u8]) -> PathBuf {
        let path = dir.join(name);
        std::fs::write(&path, contents).unwrap();
        path
    }

    #[track_caller]
    fn csv_error(dir: &Path, name: &str, contents: &str, options: &CsvOptions) -> String {
        let path = write(dir, name, contents.as_bytes());
        let e = Dataset::from_csv_path(&path, options).unwrap_err();
        let shown = e.to_string();
        assert!(!shown.contains('\n'), "{shown}");
        assert!(shown.starts_with(&path.display().to_string()), "{shown}");
        shown
    }

    #[track_caller]
    fn libsvm_error(dir: &Path, name: &str, contents: &str) -> String {
        let path = write(dir, name, contents.as_bytes());
        let e = Dataset::from_libsvm_path(&path).unwrap_err();
        let shown = e.to_string();
        assert!(!shown.contains('\n'), "{shown}");
        assert_eq!(e.path(), Some(path.as_path()));
        let location = shown.strip_prefix(&path.display().to_string()).unwrap().to_string();
        std::fs::remove_file(&path).unwrap();
        location
    }

    #[test]
    fn csv_loads_with_header_label_column_and_scaling() {
        let dir = temp_dir("csv-ok");
        let path = write(&dir, "data.csv", b"a,b,label\n1,2,7\n\n3, 4 ,3\r\n5,6,7\n");
        let o = CsvOptions { has_header: true, ..CsvOptions::default() };
        let d = Dataset::from_csv_path(&path, &o).unwrap();
        assert_eq!((d.len(), d.n_features, d.n_classes), (3, 2, 2));
        assert_eq!(d.features, vec![1.0, 2.0, 3.0, 4.0, 5.0, 6.0]);
        assert_eq!(d.labels, vec![1, 0, 1]); // 3 -> 0, 7 -> 1

        let path = write(&dir, "first.csv", b"-1;0.5;10\n+1;1.5;20\n1.0;2.5;30\n");
        let o = CsvOptions { label_column: Some(0), delimiter: ';', scaling: Scaling::MinMax, ..CsvOptions::default() };
        let d = Dataset::from_csv_path(&path, &o).unwrap();
        assert_eq!((d.n_features, d.n_classes), (2, 2));
        assert_eq!(d.labels, vec![0, 1, 1]);
        assert_eq!(d.features, vec![0.0, 0.0, 0.5, 0.5, 1.0, 1.0]);

        // Reader variant and gzip detection on paths.
        let d2 = Dataset::from_csv_reader(&b"-1;0.5;10\n+1;1.5;20\n1.0;2.5;30\n"[..], &o).unwrap();
        assert_eq!(d, d2);
        let mut gz = flate2::write::GzEncoder::new(Vec::new(), flate2::Compression::default());
        std::io::Write::write_all(&mut gz, b"-1;0.5;10\n+1;1.5;20\n1.0;2.5;30\n").unwrap();
        let path = write(&dir, "first.csv.gz", &gz.finish().unwrap());
        assert_eq!(Dataset::from_csv_path(&path, &o).unwrap(), d);
        std::fs::remove_dir_all(&dir).unwrap();
    }

    #[test]
    fn csv_errors_name_file_line_and_problem() {
        let dir = temp_dir("csv-bad");
        let o = CsvOptions::default();
        let e = csv_error(&dir, "data.csv", "1,2,0\n1,2,1\n3,x,1\n", &o);
        assert!(e.ends_with("data.csv line 3: column 2: invalid number 'x'"), "{e}");
        let e = csv_error(&dir, "cols.csv", "1,2,0\n\n1,1\n", &o);
        assert!(e.ends_with("cols.csv line 3: expected 3 columns, found 2"), "{e}");
        let e = csv_error(&dir, "label.csv", "1,2,0\n1,2,cat\n", &o);
        assert!(e.ends_with("label.csv line 2: column 3: invalid label 'cat' (expected an integer)"), "{e}");
        let e = csv_error(&dir, "frac.csv", "1,2,0.5\n", &o);
        assert!(e.ends_with("frac.csv line 1: column 3: invalid label '0.5' (expected an integer)"), "{e}");
        let e = csv_error(&dir, "inf.csv", "1,inf,0\n", &o);
        assert!(e.ends_with("inf.csv line 1: column 2: non-finite value 'inf'"), "{e}");
        let e = csv_error(&dir, "empty.csv", "h1,h2\n\n", &CsvOptions { has_header: true, ..o.clone() });
        assert!(e.ends_with("empty.csv: no data rows"), "{e}");
        let e = csv_error(&dir, "lc.csv", "1,2,3\n", &CsvOptions { label_column: Some(3), ..o.clone() });
        assert!(e.ends_with("lc.csv line 1: label column 4 out of range (3 columns)"), "{e}");
        let e = csv_error(&dir, "one.csv", "1\n", &o);
        assert!(e.ends_with("one.csv line 1: found 1 column, need a label and a feature"), "{e}");
        let long = format!("1,{},0\n", "z".repeat(100));
        let e = csv_error(&dir, "long.csv", &long, &o);
        assert!(e.ends_with(&format!("column 2: invalid number '{}...'", "z".repeat(40))), "{e}");
        let e = csv_error(&dir, "div.csv", "1,0\n", &CsvOptions { scaling: Scaling::Divide(0.0), ..o.clone() });
        assert!(e.ends_with("div.csv: invalid scaling divisor 0 (must be finite and non-zero)"), "{e}");
        let missing = dir.join("missing.csv");
        let e = Dataset::from_csv_path(&missing, &o).unwrap_err();
        assert_eq!(e.path(), Some(missing.as_path()));
        assert!(e.to_string().contains("missing.csv: cannot open: "), "{e}");
        // Without a path, the location is just the line.
        let e = Dataset::from_csv_reader(&b"1,0\nq,1\n"[..], &o).unwrap_err();
        assert_eq!(e.to_string(), "line 2: column 1: invalid number 'q'");
        assert_eq!((e.line(), e.path(), e.message()), (Some(2), None, "column 1: invalid number 'q'"));
        std::fs::remove_dir_all(&dir).unwrap();
    }

    #[test]
    fn libsvm_loads_sparse_rows() {
        let dir = temp_dir("libsvm-ok");
        let text = "# a comment line\n+1 1:0.5 3:2\n-1 2:1.5 # trailing comment\n\n+1\n-1 3:-1 1:4\n";
        let path = write(&dir, "train.svm", text.as_bytes());
        let d = Dataset::from_libsvm_path(&path).unwrap();
        assert_eq!((d.len(), d.n_features, d.n_classes), (4, 3, 2));
        assert_eq!(d.labels, vec![1, 0, 1, 0]);
        assert_eq!(d.features, vec![0.5, 0.0, 2.0, 0.0, 1.5, 0.0, 0.0, 0.0, 0.0, 4.0, 0.0, -1.0]);
        let multi = Dataset::from_libsvm_reader(&b"3 1:1\n10 2:1\n3 1:2\n7 4:1\n"[..]).unwrap();
        assert_eq!((multi.n_features, multi.n_classes), (4, 3));
        assert_eq!(multi.labels, vec![0, 2, 0, 1]);
        std::fs::remove_dir_all(&dir).unwrap();
    }

    #[test]
    fn libsvm_errors_name_file_line_and_problem() {
        let dir = temp_dir("libsvm-bad");
        let cases = [
            ("1 1:1\nfoo 1:1\n", " line 2: invalid label 'foo' (expected an integer)"),
            ("1 1:1\n0 2:1\n1 3\n", " line 3: bad feature '3' (expected index:value)"),
            ("1 0:1\n", " line 1: feature index 0 in '0:1' (indices are 1-based)"),
            ("1 x:1\n", " line 1: bad feature index in 'x:1' (expected a positive integer)"),
            ("1 -2:1\n", " line 1: bad feature index in '-2:1' (expected a positive integer)"),
            ("1 2:y\n", " line 1: bad feature value in '2:y': invalid number 'y'"),
            ("1 2:NaN\n", " line 1: bad feature value in '2:NaN': non-finite value 'NaN'"),
            ("1 2:1 2:3\n", " line 1: duplicate feature index 2"),
            ("1 99999999:1\n", " line 1: feature index 99999999 too large (limit 16777216)"),
            ("# only a comment\n\n", ": no data rows"),
        ];
        for (i, (text, want)) in cases.iter().enumerate() {
            let got = libsvm_error(&dir, &format!("bad{i}.svm"), text);
            assert_eq!(&got, want, "case {i}: {text:?}");
        }
        std::fs::remove_dir_all(&dir).unwrap();
    }

    fn idx(kind: u8, dims: &[u32], data: &[u8]) -> Vec<u8> {
        let mut out = vec![0, 0, kind, dims.len() as u8];
        for d in dims {
            out.extend_from_slice(&d.to_be_bytes());
        }
        out.extend_from_slice(data);
        out
    }

    #[test]
    fn idx_loads_images_and_labels() {
        let dir = temp_dir("idx");
        let images = write(&dir, "img.idx", &idx(8, &[3, 2, 2], &[0, 255, 51, 0, 1, 2, 3, 4, 255, 255, 255, 255]));
        let labels = write(&dir, "lab.idx", &idx(8, &[3], &[7, 2, 7]));
        let d = Dataset::from_idx_paths(&images, &labels).unwrap();
        assert_eq!((d.len(), d.n_features, d.n_classes), (3, 4, 2));
        assert_eq!(d.row(0), &[0.0, 1.0, 0.2, 0.0]);
        assert_eq!(d.labels, vec![1, 0, 1]);

        let short = write(&dir, "short.idx", &idx(8, &[3, 2, 2], &[0; 11]));
        let e = Dataset::from_idx_paths(&short, &labels).unwrap_err().to_string();
        assert!(e.ends_with("short.idx: dimensions [3, 2, 2] need 12 bytes of data, found 11"), "{e}");
        let floats = write(&dir, "f.idx", &idx(0x0d, &[3, 1], &[0; 12]));
        let e = Dataset::from_idx_paths(&floats, &labels).unwrap_err().to_string();
        assert!(e.ends_with("f.idx: unsupported IDX element type 0x0d (only unsigned bytes, 0x08)"), "{e}");
        let two = write(&dir, "two.idx", &idx(8, &[2], &[1, 2]));
        let e = Dataset::from_idx_paths(&images, &two).unwrap_err().to_string();
        assert!(e.ends_with("two.idx: 3 images but 2 labels"), "{e}");
        let text = write(&dir, "text.idx", b"1,2,3\n");
        let e = Dataset::from_idx_paths(&text, &labels).unwrap_err().to_string();
        assert!(e.ends_with("text.idx: not an IDX file (bad magic number)"), "{e}");
        let huge = write(&dir, "huge.idx", &idx(8, &[u32::MAX, u32::MAX, 2], &[]));
        let e = Dataset::from_idx_paths(&huge, &labels).unwrap_err().to_string();
        assert!(e.contains("huge.idx: dimensions [4294967295, 4294967295, 2] too large"), "{e}");
        std::fs::remove_dir_all(&dir).unwrap();
    }
}
