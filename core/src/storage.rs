//! Where a server keeps its per-worker table: the [`Storage`] a caller names as a server's
//! last type parameter: [`Inline<N>`] inside the server, `Heap` (feature `alloc`) on the
//! heap. The estimators' windows ([`crate::math::estimate`]) live in the same storage.

use crate::error::ConfigError;
use core::fmt::Debug;

/// The default capacity of [`Inline`] tables: what every server type uses unless the caller
/// names a [`Storage`].
pub const DEFAULT_INLINE_WORKERS: usize = 256;

/// Where a server keeps its per-worker table: a type the caller names as a server's last
/// type parameter.
pub trait Storage {
    /// A table of `X`s.
    type Table<X: Copy + Debug>: AsRef<[X]> + AsMut<[X]> + Debug;

    /// A table of `len` copies of `fill`, or why this storage cannot hold that many.
    fn table<X: Copy + Debug>(len: usize, fill: X) -> Result<Self::Table<X>, ConfigError>;
}

/// Tables inside the server, of at most `N` records: no allocation.
#[derive(Clone, Copy, Debug, Default)]
pub struct Inline<const N: usize>;

impl<const N: usize> Storage for Inline<N> {
    type Table<X: Copy + Debug> = heapless::Vec<X, N>;

    fn table<X: Copy + Debug>(len: usize, fill: X) -> Result<Self::Table<X>, ConfigError> {
        let mut table = heapless::Vec::new();
        table.resize(len, fill).map_err(|_| ConfigError::TableTooSmall { needed: len, capacity: N })?;
        Ok(table)
    }
}

/// Tables on the heap, of exactly the length asked for (feature `alloc`).
#[cfg(any(feature = "alloc", test))]
#[derive(Clone, Copy, Debug, Default)]
pub struct Heap;

#[cfg(any(feature = "alloc", test))]
impl Storage for Heap {
    type Table<X: Copy + Debug> = alloc::vec::Vec<X>;

    fn table<X: Copy + Debug>(len: usize, fill: X) -> Result<Self::Table<X>, ConfigError> {
        let mut table = alloc::vec::Vec::new();
        table.try_reserve_exact(len).map_err(|_| ConfigError::TableTooSmall { needed: len, capacity: 0 })?;
        table.resize(len, fill);
        Ok(table)
    }
}
