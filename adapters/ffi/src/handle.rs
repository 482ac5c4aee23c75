//! What server and worker handles share: the liveness tag, checking the caller's memory
//! block, and turning a handle pointer back into a reference.

use crate::config::SyncopateConfig;
use crate::engine::Layout;
use crate::error::{
    Failure, SYNCOPATE_ERR_BAD_HANDLE, SYNCOPATE_ERR_CONFIG, SYNCOPATE_ERR_MISALIGNED, SYNCOPATE_ERR_WRONG_LENGTH,
};
use crate::raw::{self, RawSlice};
use core::ffi::c_void;
use core::ptr::NonNull;
use syncopate::ProtocolConfig;

/// A `repr(C)` handle type whose first field is a `u64` liveness tag.
pub(crate) trait Tagged {
    /// The tag of a live handle of this type.
    const LIVE: u64;
}

/// The handle behind `ptr`.
///
/// # Safety
/// `ptr` is null or points at memory the caller passed to this type's `*_init` (live or
/// finished), not used by another thread during `'a`.
pub(crate) unsafe fn get<'a, H: Tagged>(ptr: *mut H, what: &'static str) -> Result<&'a mut H, Failure> {
    let p = raw::checked(ptr.cast_const(), what)?;
    // SAFETY: non-null and aligned for `H`, hence for its first field, the `u64` tag; only
    // the tag is read before it proves the block holds a live `H` (a pointer to anything
    // else of at least 8 bytes is refused here, short of a forged tag).
    let tag = unsafe { p.as_ptr().cast::<u64>().read() };
    if tag != H::LIVE {
        return Err(Failure::new(SYNCOPATE_ERR_BAD_HANDLE, what));
    }
    // SAFETY: the tag says `_init` wrote a whole `H` here, still live (not finished).
    Ok(unsafe { &mut *p.as_ptr() })
}

/// The configuration behind a C pointer.
///
/// # Safety
/// `config` is null or points at an initialised `SyncopateConfig`.
pub(crate) unsafe fn protocol(config: *const SyncopateConfig) -> Result<ProtocolConfig, Failure> {
    // SAFETY: forwarded.
    unsafe { raw::ref_in(config, "`config`") }?.protocol_config()
}

/// A server's configuration behind a C pointer: the protocol and the momentum coefficient.
///
/// # Safety
/// `config` is null or points at an initialised `SyncopateConfig`.
pub(crate) unsafe fn server_config(config: *const SyncopateConfig) -> Result<(ProtocolConfig, f64), Failure> {
    // SAFETY: forwarded.
    let c = unsafe { raw::ref_in(config, "`config`") }?;
    Ok((c.protocol_config()?, c.momentum))
}

/// The model buffer the caller lends a handle.
///
/// # Safety
/// `params` is null or valid for reads and writes of `dim` floats for the handle's life.
pub(crate) unsafe fn params(params: *mut f32, dim: usize) -> Result<RawSlice, Failure> {
    if dim == 0 {
        return Err(Failure::new(SYNCOPATE_ERR_WRONG_LENGTH, "`dim` is 0: the model needs at least one parameter"));
    }
    // SAFETY: forwarded; the slice only checks the pointer here.
    let p = unsafe { raw::slice_out(params, dim, "`params`") }?;
    // SAFETY: checked non-null and aligned for `dim` floats; the handle's contract keeps it valid.
    Ok(unsafe { RawSlice::new(NonNull::from(p).cast::<f32>(), dim) })
}

/// Checks the caller's block for a handle of type `H` laid out as `l`, and that it does not
/// overlap the model buffer.
pub(crate) fn block<H>(
    mem: *mut c_void,
    mem_len: usize,
    l: Option<Layout>,
    params: &RawSlice,
) -> Result<(NonNull<u8>, Layout), Failure> {
    let l = l.ok_or(Failure::new(SYNCOPATE_ERR_CONFIG, "the model is too large to address"))?;
    let base = NonNull::new(mem.cast::<u8>()).ok_or(Failure::null("`mem`"))?;
    if (mem as usize) % align_of::<H>() != 0 {
        return Err(Failure::new(SYNCOPATE_ERR_MISALIGNED, "`mem` (see the *_align query)"));
    }
    if mem_len < l.bytes {
        return Err(Failure::short("`mem_len` (see the *_size query)", mem_len, l.bytes));
    }
    let (m0, m1) = (mem as usize, (mem as usize).saturating_add(l.bytes));
    let p0 = params.as_ref().as_ptr() as usize;
    let p1 = p0.saturating_add(size_of_val(params.as_ref()));
    if m0 < p1 && p0 < m1 {
        return Err(Failure::new(SYNCOPATE_ERR_CONFIG, "`params` overlaps the handle's memory"));
    }
    Ok((base, l))
}

/// The byte addresses `[start, end)` of `len` elements of `T` at `ptr`.
pub(crate) fn span<T>(ptr: *const T, len: usize) -> (usize, usize) {
    let start = ptr as usize;
    (start, start.saturating_add(len.saturating_mul(size_of::<T>())))
}

/// The memory a handle owns: its model and its block (the handle and its scratch). A caller
/// buffer handed to a call must not overlap either.
#[derive(Clone, Copy, Debug)]
pub(crate) struct Owned {
    model: (usize, usize),
    block: (usize, usize),
}

impl Owned {
    /// The model `params` and the block of `bytes` at `base`.
    pub(crate) fn new(params: &RawSlice, base: NonNull<u8>, bytes: usize) -> Self {
        let model = span(params.as_ref().as_ptr(), params.as_ref().len());
        Self { model, block: span(base.as_ptr().cast_const(), bytes) }
    }

    /// Refuses a caller buffer (`span`) that shares a byte with the handle's memory.
    pub(crate) fn check(&self, buffer: (usize, usize), what: &'static str) -> Result<(), Failure> {
        let overlaps = |(a0, a1): (usize, usize), (b0, b1): (usize, usize)| a0 < b1 && b0 < a1;
        if overlaps(buffer, self.model) || overlaps(buffer, self.block) {
            return Err(Failure::new(crate::error::SYNCOPATE_ERR_OVERLAP, what));
        }
        Ok(())
    }
}

/// Writes `handle` into the block and returns its address through `out`.
///
/// # Safety
/// `base` was checked by [`block`] for `H`; `out` is null or valid for one pointer write.
pub(crate) unsafe fn place<H>(base: NonNull<u8>, handle: H, out: *mut *mut H) -> Result<(), Failure> {
    let target = base.cast::<H>();
    // SAFETY: `block` checked the alignment and that the block holds at least `size_of::<H>()`.
    unsafe { target.as_ptr().write(handle) };
    // SAFETY: forwarded.
    unsafe { raw::write_out(out, target.as_ptr(), "`out`") }
}
