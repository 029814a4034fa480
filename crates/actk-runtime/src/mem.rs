//! `memcpy` and `memmove` of the static musl release build (issue 31).
//!
//! musl's x86_64 `memcpy` copies with `rep movsq` after and before single `movsb`s up to the
//! next 8-byte boundary. A string instruction has a start-up cost of tens of cycles whatever
//! the length, and most of a create's copies are short: on the DGX fixture a create makes about
//! 3 300 of them (callgrind), mostly strings of config.json and of CDI specs under 64 bytes, and
//! `perf record` of repeated creates put 14 % of the shim's CPU time in musl's `memcpy`. glibc
//! chooses a copy routine for the CPU at start-up; a static musl program cannot.
//!
//! [`copy`] copies up to 64 bytes with unaligned 4-, 8- and 16-byte loads, all made before the
//! first store (so that it is right for overlapping buffers too), and longer runs with
//! `rep movsb`, which CPUs with ERMSB (Intel since Ivy Bridge, AMD since Zen 3) run at full
//! speed from a few hundred bytes, and CPUs with FSRM (Intel since Ice Lake, AMD since Zen 3)
//! from the first byte. A backward-overlapping `memmove` copies from the end with the
//! direction flag set. Linked in, these two symbols replace musl's (the archive's members are
//! then never pulled in: `memmove.o` is the only user of `memcpy.o`'s `__memcpy_fwd`).
//!
//! actk-hook, the other static binary, includes this file as its own module.
//!
//! No crate provides C-ABI memory routines for a static musl program: `compiler_builtins`
//! has them only for targets without a libc.
#![allow(unsafe_code)]

/// Copies `n` bytes from `src` to `dst`; the two may overlap in either direction (the contract
/// of C's `memmove`, which is also a valid `memcpy`).
///
/// # Safety
/// `src` must be valid for reads and `dst` for writes of `n` bytes (any alignment).
#[inline(always)]
pub(crate) unsafe fn copy(dst: *mut u8, src: *const u8, n: usize) {
    // SAFETY (every block below): all offsets are below `n`, within the caller's buffers; every
    // load happens before the first store, so an overlap in either direction reads the source
    // as it was.
    unsafe {
        if n <= 16 {
            if n >= 8 {
                let a = src.cast::<u64>().read_unaligned();
                let b = src.add(n - 8).cast::<u64>().read_unaligned();
                dst.cast::<u64>().write_unaligned(a);
                dst.add(n - 8).cast::<u64>().write_unaligned(b);
            } else if n >= 4 {
                let a = src.cast::<u32>().read_unaligned();
                let b = src.add(n - 4).cast::<u32>().read_unaligned();
                dst.cast::<u32>().write_unaligned(a);
                dst.add(n - 4).cast::<u32>().write_unaligned(b);
            } else if n > 0 {
                // 1 to 3 bytes: the first, the middle and the last (some the same byte).
                let a = *src;
                let b = *src.add(n / 2);
                let c = *src.add(n - 1);
                *dst = a;
                *dst.add(n / 2) = b;
                *dst.add(n - 1) = c;
            }
        } else if n <= 32 {
            let a = src.cast::<u128>().read_unaligned();
            let b = src.add(n - 16).cast::<u128>().read_unaligned();
            dst.cast::<u128>().write_unaligned(a);
            dst.add(n - 16).cast::<u128>().write_unaligned(b);
        } else if n <= 64 {
            let a = src.cast::<u128>().read_unaligned();
            let b = src.add(16).cast::<u128>().read_unaligned();
            let c = src.add(n - 32).cast::<u128>().read_unaligned();
            let d = src.add(n - 16).cast::<u128>().read_unaligned();
            dst.cast::<u128>().write_unaligned(a);
            dst.add(16).cast::<u128>().write_unaligned(b);
            dst.add(n - 32).cast::<u128>().write_unaligned(c);
            dst.add(n - 16).cast::<u128>().write_unaligned(d);
        } else if (dst as usize).wrapping_sub(src as usize) < n {
            // dst starts inside the source: a forward copy would overwrite bytes not yet read.
            backward(dst, src, n);
        } else {
            forward(dst, src, n);
        }
    }
}

/// `rep movsb` from the first byte up.
#[inline(always)]
unsafe fn forward(dst: *mut u8, src: *const u8, n: usize) {
    #[cfg(target_arch = "x86_64")]
    // SAFETY: the caller's buffers; the direction flag is clear, as the ABI keeps it.
    unsafe {
        core::arch::asm!(
            "rep movsb",
            inout("rcx") n => _,
            inout("rdi") dst => _,
            inout("rsi") src => _,
            options(nostack, preserves_flags)
        );
    }
    #[cfg(not(target_arch = "x86_64"))]
    // SAFETY: the caller's buffers; never reached by an overlap that `copy` sends backward.
    unsafe {
        for i in 0..n {
            dst.add(i).write_volatile(src.add(i).read_volatile());
        }
    }
}

/// `rep movsb` from the last byte down, the direction flag set for it and cleared after.
#[inline(always)]
unsafe fn backward(dst: *mut u8, src: *const u8, n: usize) {
    #[cfg(target_arch = "x86_64")]
    // SAFETY: the caller's buffers (n > 0); the direction flag is cleared again before return.
    unsafe {
        core::arch::asm!(
            "std",
            "rep movsb",
            "cld",
            inout("rcx") n => _,
            inout("rdi") dst.add(n - 1) => _,
            inout("rsi") src.add(n - 1) => _,
            options(nostack)
        );
    }
    #[cfg(not(target_arch = "x86_64"))]
    // SAFETY: the caller's buffers.
    unsafe {
        for i in (0..n).rev() {
            dst.add(i).write_volatile(src.add(i).read_volatile());
        }
    }
}

/// C's `memcpy` for the static musl build: [`copy`].
///
/// # Safety
/// C's contract: `src` readable and `dst` writable for `n` bytes.
#[cfg(all(target_env = "musl", target_arch = "x86_64", not(test)))]
#[unsafe(no_mangle)]
pub unsafe extern "C" fn memcpy(dst: *mut u8, src: *const u8, n: usize) -> *mut u8 {
    // SAFETY: the caller's contract.
    unsafe { copy(dst, src, n) };
    dst
}

/// C's `memmove` for the static musl build: [`copy`].
///
/// # Safety
/// C's contract: `src` readable and `dst` writable for `n` bytes; they may overlap.
#[cfg(all(target_env = "musl", target_arch = "x86_64", not(test)))]
#[unsafe(no_mangle)]
pub unsafe extern "C" fn memmove(dst: *mut u8, src: *const u8, n: usize) -> *mut u8 {
    // SAFETY: the caller's contract.
    unsafe { copy(dst, src, n) };
    dst
}

#[cfg(test)]
mod tests {
    use super::copy;

    /// Every length from 0 to 300 at every source and destination offset within 16 bytes,
    /// disjoint: the copied bytes equal the source, and no byte around them changes.
    #[test]
    fn copies_every_length_and_alignment() {
        let src: Vec<u8> = (0..400u32).map(|i| (i * 7 + 3) as u8).collect();
        for n in 0..=300 {
            for so in 0..16 {
                for d_off in 0..16 {
                    let mut dst = vec![0xA5u8; 340];
                    // SAFETY: so + n <= 316 < 400 and d_off + n <= 316 < 340.
                    unsafe { copy(dst.as_mut_ptr().add(d_off), src.as_ptr().add(so), n) };
                    assert_eq!(&dst[d_off..d_off + n], &src[so..so + n], "n {n} src +{so} dst +{d_off}");
                    assert!(dst[..d_off].iter().all(|&b| b == 0xA5), "n {n}: wrote before dst");
                    assert!(dst[d_off + n..].iter().all(|&b| b == 0xA5), "n {n}: wrote past dst");
                }
            }
        }
    }

    /// Overlapping copies in both directions, as `memmove` must make them: the result equals
    /// `copy_within` (Rust's memmove) of the same buffer.
    #[test]
    fn overlapping_copies_equal_copy_within() {
        for n in 0..=300usize {
            for shift in [1usize, 2, 3, 7, 8, 15, 16, 17, 31, 33, 63, 64, 65, 100] {
                for forward in [true, false] {
                    let mut want: Vec<u8> = (0..420u32).map(|i| (i * 13 + 1) as u8).collect();
                    let mut got = want.clone();
                    let (from, to) = if forward { (10, 10 + shift) } else { (10 + shift, 10) };
                    want.copy_within(from..from + n, to);
                    let p = got.as_mut_ptr();
                    // SAFETY: from + n and to + n are at most 10 + 100 + 300 < 420.
                    unsafe { copy(p.add(to), p.add(from), n) };
                    assert_eq!(got, want, "n {n} shift {shift} dst after src: {forward}");
                }
            }
        }
    }
}
