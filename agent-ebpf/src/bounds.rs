//! Lengths handed to a helper that copies into a buffer, in a form every
//! kernel's verifier can follow.
//!
//! `len.min(N) & (2N - 1)` reads as a bound twice, and LLVM drops the mask
//! as redundant. Newer verifiers follow the `min`'s comparison to the
//! helper call through registers and stack copies alike; 6.1's does not
//! when the value was copied to the stack before the comparison, and then
//! refuses the program ("R2 min value is negative"). Hidden from LLVM
//! between the two, the mask stays, right before its use: a bound on the
//! very register every verifier checks.

/// `len` cut at `N` (a power of two), bounded where the helper reads it.
#[inline(always)]
pub fn within<const N: usize>(len: u64) -> usize {
    const { assert!(N.is_power_of_two()) };
    core::hint::black_box(len.min(N as u64) as usize) & (N * 2 - 1)
}
