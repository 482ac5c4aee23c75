//! The built-in data sets, embedded in the binary as gzip CSV and decoded by the CSV loader.

use std::io::Read;

use flate2::read::GzDecoder;

use super::dataset::{Dataset, Scaling};
use super::loaders::CsvOptions;

/// The digits data set as gzip CSV: 1797 rows of 64 pixel counts (0..=16) and a label (0..=9).
/// Alpaydin & Kaynak 1998, UCI Machine Learning Repository, CC BY 4.0.
const DIGITS_CSV_GZ: &[u8] = include_bytes!("../../data/digits.csv.gz");
/// 5,000 MNIST images (see `adapters/data/README.md` for the source and licence).
const MNIST5K_CSV_GZ: &[u8] = include_bytes!("../../data/mnist_5k.csv.gz");

impl Dataset {
    /// The built-in handwritten digits data set: 1797 rows, 64 features (8x8 pixel counts
    /// divided by 16, so in `[0, 1]`), 10 classes. Decompressed from data embedded in the
    /// binary; each call decodes afresh (a few milliseconds), so keep the result.
    ///
    /// Source: E. Alpaydin and C. Kaynak, "Optical Recognition of Handwritten Digits", UCI
    /// Machine Learning Repository, 1998, CC BY 4.0.
    pub fn digits() -> Self {
        let mut text = Vec::new();
        GzDecoder::new(DIGITS_CSV_GZ).read_to_end(&mut text).expect("embedded digits data is valid gzip");
        let options = CsvOptions { scaling: Scaling::Divide(16.0), ..CsvOptions::default() };
        Self::from_csv_reader(&text[..], &options).expect("embedded digits data is valid CSV")
    }

    /// The built-in 5,000-image MNIST subset: 784 grey levels scaled by 1/255, 10 classes,
    /// 500 rows each (source in the [module docs](super)).
    pub fn mnist5k() -> Self {
        let mut text = Vec::new();
        GzDecoder::new(MNIST5K_CSV_GZ).read_to_end(&mut text).expect("embedded MNIST data is valid gzip");
        let options = CsvOptions { scaling: Scaling::Divide(255.0), ..CsvOptions::default() };
        Self::from_csv_reader(&text[..], &options).expect("embedded MNIST data is valid CSV")
    }
}
