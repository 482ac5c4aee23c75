//! Status codes, the last failure, and the boundary guard every entry point runs in.

use core::fmt;
use syncopate::wire::{DecodeError, EncodeError};
use syncopate::{ConfigError, Reject};

/// The status every entry point returns: [`SYNCOPATE_OK`] or one of the `SYNCOPATE_ERR_*`
/// codes; [`syncopate_last_error_message`](crate::syncopate_last_error_message) says more.
pub type SyncopateStatus = i32;

/// Success.
pub const SYNCOPATE_OK: SyncopateStatus = 0;
/// A pointer argument was null.
pub const SYNCOPATE_ERR_NULL_POINTER: SyncopateStatus = 1;
/// A pointer argument was not aligned for its type (handle memory: see the `*_align` queries).
pub const SYNCOPATE_ERR_MISALIGNED: SyncopateStatus = 2;
/// A caller buffer is shorter than the call needs (the message names both lengths).
pub const SYNCOPATE_ERR_BUFFER_TOO_SHORT: SyncopateStatus = 3;
/// A tensor has the wrong number of elements for the model.
pub const SYNCOPATE_ERR_WRONG_LENGTH: SyncopateStatus = 4;
/// The handle pointer does not point at a live handle (never initialised, or finished).
pub const SYNCOPATE_ERR_BAD_HANDLE: SyncopateStatus = 5;
/// The configuration is invalid (an unknown enum value or a knob out of range).
pub const SYNCOPATE_ERR_CONFIG: SyncopateStatus = 6;
/// The state machine refused the input; nothing changed.
pub const SYNCOPATE_ERR_REJECTED: SyncopateStatus = 7;
/// The bytes are not a valid message (see `core/WIRE.md`).
pub const SYNCOPATE_ERR_DECODE: SyncopateStatus = 8;
/// The message cannot be encoded (e.g. an unknown kind).
pub const SYNCOPATE_ERR_ENCODE: SyncopateStatus = 9;
/// A bug inside the library was caught at the boundary (std builds only); the handle
/// should be finished and rebuilt.
pub const SYNCOPATE_ERR_INTERNAL: SyncopateStatus = 10;
/// A caller buffer overlaps memory the handle owns (its model or its block): the call would
/// read or write the same bytes through two paths. Nothing changed.
pub const SYNCOPATE_ERR_OVERLAP: SyncopateStatus = 11;

/// The short name of a status code, for logs.
pub(crate) fn status_name(code: SyncopateStatus) -> &'static str {
    match code {
        SYNCOPATE_OK => "ok",
        SYNCOPATE_ERR_NULL_POINTER => "null pointer",
        SYNCOPATE_ERR_MISALIGNED => "misaligned pointer",
        SYNCOPATE_ERR_BUFFER_TOO_SHORT => "buffer too short",
        SYNCOPATE_ERR_WRONG_LENGTH => "wrong length",
        SYNCOPATE_ERR_BAD_HANDLE => "bad handle",
        SYNCOPATE_ERR_CONFIG => "invalid configuration",
        SYNCOPATE_ERR_REJECTED => "input rejected",
        SYNCOPATE_ERR_DECODE => "malformed message",
        SYNCOPATE_ERR_ENCODE => "cannot encode",
        SYNCOPATE_ERR_INTERNAL => "internal error",
        SYNCOPATE_ERR_OVERLAP => "overlapping buffers",
        _ => "unknown status",
    }
}

/// What went wrong beyond the code.
#[derive(Clone, Copy, Debug)]
pub(crate) enum Detail {
    None,
    Config(ConfigError),
    Reject(Reject),
    Decode(DecodeError),
    Encode(EncodeError),
    Lengths { given: usize, needed: usize },
    Value(u64),
}

/// A failed call: its code, the argument or step that failed, and the detail.
#[derive(Clone, Copy, Debug)]
pub(crate) struct Failure {
    pub(crate) code: SyncopateStatus,
    pub(crate) what: &'static str,
    pub(crate) detail: Detail,
}

impl Failure {
    pub(crate) const fn new(code: SyncopateStatus, what: &'static str) -> Self {
        Self { code, what, detail: Detail::None }
    }

    pub(crate) const fn with(self, detail: Detail) -> Self {
        Self { detail, ..self }
    }

    pub(crate) const fn null(what: &'static str) -> Self {
        Self::new(SYNCOPATE_ERR_NULL_POINTER, what)
    }

    pub(crate) const fn short(what: &'static str, given: usize, needed: usize) -> Self {
        Self::new(SYNCOPATE_ERR_BUFFER_TOO_SHORT, what).with(Detail::Lengths { given, needed })
    }

    pub(crate) const fn config(what: &'static str, e: ConfigError) -> Self {
        Self::new(SYNCOPATE_ERR_CONFIG, what).with(Detail::Config(e))
    }

    pub(crate) const fn rejected(e: Reject) -> Self {
        let code = match e {
            Reject::WrongLength(_) => SYNCOPATE_ERR_WRONG_LENGTH,
            _ => SYNCOPATE_ERR_REJECTED,
        };
        Self::new(code, "the state machine refused the input").with(Detail::Reject(e))
    }
}

impl fmt::Display for Failure {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}: {}", status_name(self.code), self.what)?;
        match self.detail {
            Detail::None => Ok(()),
            Detail::Config(e) => write!(f, ": {e}"),
            Detail::Reject(e) => write!(f, ": {e}"),
            Detail::Decode(e) => write!(f, ": {e}"),
            Detail::Encode(e) => write!(f, ": {e}"),
            Detail::Lengths { given, needed } => write!(f, " ({given} given, {needed} needed)"),
            Detail::Value(v) => write!(f, " (got {v})"),
        }
    }
}

#[cfg(feature = "std")]
mod slot {
    use super::Failure;
    use core::cell::Cell;

    std::thread_local! {
        static LAST: Cell<Option<Failure>> = const { Cell::new(None) };
    }

    pub(crate) fn set(f: Failure) {
        LAST.with(|c| c.set(Some(f)));
    }

    pub(crate) fn get() -> Option<Failure> {
        LAST.with(Cell::get)
    }
}

#[cfg(not(feature = "std"))]
mod slot {
    use super::Failure;
    use core::cell::UnsafeCell;
    use core::sync::atomic::{AtomicBool, Ordering};

    /// One slot for the whole program, guarded by a try-lock: a thread that finds it busy
    /// skips the update (or reads nothing) rather than spin.
    struct Slot {
        busy: AtomicBool,
        value: UnsafeCell<Option<Failure>>,
    }

    // SAFETY: `value` is only touched by the thread that won `busy` (acquire) until it
    // releases it, so accesses never overlap.
    unsafe impl Sync for Slot {}

    static LAST: Slot = Slot { busy: AtomicBool::new(false), value: UnsafeCell::new(None) };

    fn with<R>(f: impl FnOnce(&mut Option<Failure>) -> R) -> Option<R> {
        LAST.busy.compare_exchange(false, true, Ordering::Acquire, Ordering::Relaxed).ok()?;
        // SAFETY: this thread holds the try-lock, so no other reference to the value exists.
        let r = f(unsafe { &mut *LAST.value.get() });
        LAST.busy.store(false, Ordering::Release);
        Some(r)
    }

    pub(crate) fn set(f: Failure) {
        let _ = with(|v| *v = Some(f));
    }

    pub(crate) fn get() -> Option<Failure> {
        with(|v| *v).flatten()
    }
}

pub(crate) use slot::get as last_failure;

/// Runs the body of an entry point: records a failure as the last error and returns its
/// code. With std a panic (a bug) is caught here and never unwinds into C.
pub(crate) fn guard(body: impl FnOnce() -> Result<(), Failure>) -> SyncopateStatus {
    #[cfg(feature = "std")]
    let result = std::panic::catch_unwind(core::panic::AssertUnwindSafe(body))
        .unwrap_or(Err(Failure::new(SYNCOPATE_ERR_INTERNAL, "a panic was caught at the C boundary")));
    #[cfg(not(feature = "std"))]
    let result = body();
    match result {
        Ok(()) => SYNCOPATE_OK,
        Err(f) => {
            slot::set(f);
            f.code
        }
    }
}

/// A `fmt::Write` into a C buffer that truncates, always leaves room for the NUL, and counts
/// the full length.
pub(crate) struct Truncating<'a> {
    pub(crate) buf: &'a mut [u8],
    pub(crate) written: usize,
    pub(crate) total: usize,
}

impl fmt::Write for Truncating<'_> {
    fn write_str(&mut self, s: &str) -> fmt::Result {
        let room = self.buf.len().saturating_sub(1).saturating_sub(self.written);
        let n = room.min(s.len());
        if let (Some(dst), Some(src)) = (self.buf.get_mut(self.written..self.written + n), s.as_bytes().get(..n)) {
            dst.copy_from_slice(src);
            self.written += n;
        }
        self.total = self.total.saturating_add(s.len());
        Ok(())
    }
}
