//! Checked conversions of C pointers into Rust references, and [`RawSlice`], the buffer type
//! the state machines run on (memory the caller owns).

use crate::error::{Failure, SYNCOPATE_ERR_MISALIGNED};
use core::ptr::NonNull;

/// A caller-owned `f32` array that a handle borrows for its whole life. The `*_init` contract
/// makes it valid: the memory stays allocated, and is written by nothing else, until the
/// handle is finished.
#[derive(Debug)]
pub(crate) struct RawSlice {
    ptr: NonNull<f32>,
    len: usize,
}

impl RawSlice {
    /// An empty slice (no memory behind it).
    pub(crate) const fn empty() -> Self {
        Self { ptr: NonNull::dangling(), len: 0 }
    }

    /// # Safety
    /// `ptr` is non-null, aligned, and valid for reads and writes of `len` elements that
    /// nothing else accesses while the returned value (or the handle holding it) lives.
    pub(crate) const unsafe fn new(ptr: NonNull<f32>, len: usize) -> Self {
        Self { ptr, len }
    }
}

impl AsRef<[f32]> for RawSlice {
    fn as_ref(&self) -> &[f32] {
        // SAFETY: `new`'s contract: valid, aligned, exclusively ours for `len` elements.
        unsafe { core::slice::from_raw_parts(self.ptr.as_ptr(), self.len) }
    }
}

impl AsMut<[f32]> for RawSlice {
    fn as_mut(&mut self) -> &mut [f32] {
        // SAFETY: as in `as_ref`; `&mut self` makes this the only borrow.
        unsafe { core::slice::from_raw_parts_mut(self.ptr.as_ptr(), self.len) }
    }
}

/// A non-null, aligned pointer to `T`.
pub(crate) fn checked<T>(ptr: *const T, what: &'static str) -> Result<NonNull<T>, Failure> {
    let p = NonNull::new(ptr.cast_mut()).ok_or(Failure::null(what))?;
    if (ptr as usize) % align_of::<T>() != 0 {
        return Err(Failure::new(SYNCOPATE_ERR_MISALIGNED, what));
    }
    Ok(p)
}

/// Checks `ptr`/`len` for a slice of `T` (null is allowed when `len` is 0).
fn checked_slice<T>(ptr: *const T, len: usize, what: &'static str) -> Result<NonNull<T>, Failure> {
    if len == 0 && ptr.is_null() {
        return Ok(NonNull::dangling());
    }
    let p = checked(ptr, what)?;
    if len.checked_mul(size_of::<T>()).is_none_or(|bytes| bytes > isize::MAX as usize) {
        return Err(Failure::new(crate::error::SYNCOPATE_ERR_WRONG_LENGTH, what));
    }
    Ok(p)
}

/// # Safety
/// When non-null, `ptr` is valid for reads of `len` elements for `'a`, not written meanwhile.
pub(crate) unsafe fn slice_in<'a, T>(ptr: *const T, len: usize, what: &'static str) -> Result<&'a [T], Failure> {
    let p = checked_slice(ptr, len, what)?;
    // SAFETY: checked non-null (or dangling for 0), aligned, size fits; validity is the caller's.
    Ok(unsafe { core::slice::from_raw_parts(p.as_ptr(), len) })
}

/// # Safety
/// When non-null, `ptr` is valid for writes of `len` elements for `'a`, accessed by nothing else.
pub(crate) unsafe fn slice_out<'a, T>(ptr: *mut T, len: usize, what: &'static str) -> Result<&'a mut [T], Failure> {
    let p = checked_slice(ptr, len, what)?;
    // SAFETY: as in `slice_in`, for writes; exclusivity is the caller's.
    Ok(unsafe { core::slice::from_raw_parts_mut(p.as_ptr(), len) })
}

/// # Safety
/// When non-null, `ptr` points at a valid, initialised `T` not written during `'a`.
pub(crate) unsafe fn ref_in<'a, T>(ptr: *const T, what: &'static str) -> Result<&'a T, Failure> {
    let p = checked(ptr, what)?;
    // SAFETY: non-null and aligned; validity is the caller's.
    Ok(unsafe { p.as_ref() })
}

/// Writes `value` through an output pointer.
///
/// # Safety
/// When non-null, `ptr` is valid for a write of one `T`.
pub(crate) unsafe fn write_out<T>(ptr: *mut T, value: T, what: &'static str) -> Result<(), Failure> {
    let p = checked(ptr, what)?;
    // SAFETY: non-null and aligned; writable per the caller; `write` does not read the old value.
    unsafe { p.as_ptr().write(value) };
    Ok(())
}
