//! [`ArrayBuffer`]: a state machine's storage backed by a Python object's memory (a
//! C-contiguous, writable `float32` NumPy array), so the model is updated in place.

use core::ptr::NonNull;
use pyo3::buffer::PyBuffer;
use pyo3::exceptions::PyValueError;
use pyo3::prelude::*;

/// The memory of a `float32` array, held through a buffer export: while it is held, NumPy
/// refuses to resize or free the array, so the pointer stays valid.
pub(crate) struct ArrayBuffer {
    // Keeps the export (and so the memory) alive; released when the state machine drops.
    _export: PyBuffer<f32>,
    ptr: NonNull<f32>,
    len: usize,
}

impl ArrayBuffer {
    /// Borrows `array`'s memory; refuses anything but a writable, C-contiguous float32 buffer
    /// of `expected` elements (when given).
    pub(crate) fn new(array: &Bound<'_, PyAny>, what: &str, expected: Option<usize>) -> PyResult<Self> {
        let export = PyBuffer::<f32>::get(array)
            .map_err(|e| PyValueError::new_err(format!("{what} must be a float32 NumPy array (numpy.float32): {e}")))?;
        if export.readonly() {
            return Err(PyValueError::new_err(format!("{what} must be writable")));
        }
        if !export.is_c_contiguous() {
            return Err(PyValueError::new_err(format!("{what} must be C-contiguous (use numpy.ascontiguousarray)")));
        }
        let len = export.item_count();
        if let Some(n) = expected {
            if len != n {
                return Err(PyValueError::new_err(format!("{what} has {len} elements, expected {n}")));
            }
        }
        let ptr = NonNull::new(export.buf_ptr().cast::<f32>()).unwrap_or(NonNull::dangling());
        Ok(Self { _export: export, ptr, len })
    }

    /// The first element's address (to recognise outputs that point into this buffer).
    pub(crate) fn addr(&self) -> *const f32 {
        self.ptr.as_ptr()
    }
}

impl AsRef<[f32]> for ArrayBuffer {
    fn as_ref(&self) -> &[f32] {
        // SAFETY: the export guarantees `len` contiguous, aligned f32s stay allocated while it
        // is held; the classes holding an `ArrayBuffer` are `unsendable` and only touch it
        // with the GIL held, inside one method call at a time.
        unsafe { core::slice::from_raw_parts(self.ptr.as_ptr(), self.len) }
    }
}

impl AsMut<[f32]> for ArrayBuffer {
    fn as_mut(&mut self) -> &mut [f32] {
        // SAFETY: as above; the export is writable (checked in `new`), `&mut self` is unique.
        unsafe { core::slice::from_raw_parts_mut(self.ptr.as_ptr(), self.len) }
    }
}
