//! RAM use: the static sections' size and the stack's high-water mark.
//!
//! The stack runs from the top of RAM (`_stack_start`) down towards the end of the static
//! sections (`_stack_end`, both from cortex-m-rt's linker script). [`paint`] fills the part
//! below the current stack pointer with a pattern; [`high_water`] finds the lowest word
//! that no longer holds it. A frame that happened to write the pattern itself would be
//! missed, so the figure is a lower bound by at most that frame.
//!
//! This is the crate's only `unsafe` code: reading and writing memory that no Rust object
//! owns (the free stack) through raw pointers, and taking linker symbols' addresses.
#![allow(unsafe_code)]

use core::ptr;

const PATTERN: u32 = 0xCAFE_F00D;
/// Bytes left unpainted below the stack pointer for [`paint`]'s own use.
const MARGIN: usize = 256;

unsafe extern "C" {
    static _stack_start: u32;
    static _stack_end: u32;
    static __sdata: u32;
    static __edata: u32;
    static __sbss: u32;
    static __ebss: u32;
    static __suninit: u32;
    static __euninit: u32;
}

/// Paints the free stack. Call it first thing in `main`.
#[inline(never)]
pub fn paint() {
    let bottom = (&raw const _stack_end) as usize;
    let sp = cortex_m::register::msp::read() as usize;
    let mut word = bottom as *mut u32;
    while (word as usize) + 4 <= sp.saturating_sub(MARGIN) {
        // SAFETY: `word` is 4-aligned (cortex-m-rt aligns `_stack_end`) and lies between the
        // end of the statics and the live stack, memory no Rust object owns and nothing
        // else in this single-threaded program touches while it is below the stack pointer.
        unsafe {
            ptr::write_volatile(word, PATTERN);
            word = word.add(1);
        }
    }
}

/// Bytes of stack used since [`paint`], at most.
#[inline(never)]
pub fn high_water() -> usize {
    let (bottom, top) = ((&raw const _stack_end) as usize, (&raw const _stack_start) as usize);
    let mut word = bottom as *const u32;
    // SAFETY: as in `paint`: aligned words of the stack region, below the live frames until
    // the first word that differs from the pattern (the deepest the stack reached).
    while (word as usize) < top && unsafe { ptr::read_volatile(word) } == PATTERN {
        word = word.wrapping_add(1);
    }
    top - word as usize
}

/// Bytes of initialised (`.data`) and zeroed or uninitialised (`.bss`, `.uninit`) statics.
pub fn statics() -> usize {
    let span = |start: *const u32, end: *const u32| (end as usize).saturating_sub(start as usize);
    span(&raw const __sdata, &raw const __edata)
        + span(&raw const __sbss, &raw const __ebss)
        + span(&raw const __suninit, &raw const __euninit)
}
