//! `memcpy`, `memmove`, `memcmp` and `bcmp` of the static musl release build (issue 31).
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
//! direction flag set. Linked in, these symbols (and `memcmp` and `bcmp` below) replace
//! musl's (the archive's members are then never pulled in: `memmove.o` is the only user of
//! `memcpy.o`'s `__memcpy_fwd`; `memcmp.o` and `bcmp.o` define only their own).
//!
//! musl's `memcmp` compares a byte at a time (four instructions a byte), and its `bcmp`
//! calls it. Rust's `==` on strings and paths ends in `bcmp`, its `Ord` in `memcmp`: a DGX
//! discovery create makes 1 335 such calls on library and device paths, 25 bytes alike on
//! average before they differ or end, 153 k of its 2.1 M instructions (callgrind). [`compare`]
//! reads 8 bytes at a time, each word as big-endian so that the first byte that differs
//! decides the order as in C, and a short tail or a string under 8 bytes by words that overlap
//! what was already found equal.
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

/// Compares `n` bytes at `a` and `b` as C's `memcmp` does: negative, zero or positive as the
/// first byte that differs (as an unsigned value) is smaller in `a`, none differs, or it is
/// larger in `a`.
///
/// # Safety
/// `a` and `b` must be valid for reads of `n` bytes (any alignment).
#[inline(always)]
pub(crate) unsafe fn compare(a: *const u8, b: *const u8, n: usize) -> i32 {
    // A word read big-endian orders as its bytes do, the first byte most significant.
    #[inline(always)]
    unsafe fn word(p: *const u8) -> u64 {
        // SAFETY: the caller's 8 readable bytes.
        u64::from_be_bytes(unsafe { p.cast::<[u8; 8]>().read_unaligned() })
    }
    #[inline(always)]
    fn order(x: u64, y: u64) -> i32 {
        if x < y { -1 } else { 1 }
    }
    // SAFETY (every read below): each offset plus its width is at most `n`.
    unsafe {
        if n >= 8 {
            let mut i = 0;
            while i + 8 <= n {
                let (x, y) = (word(a.add(i)), word(b.add(i)));
                if x != y {
                    return order(x, y);
                }
                i += 8;
            }
            if i < n {
                // The last 8 bytes, overlapping some already found equal: the first that
                // differs is in the part not compared yet.
                let (x, y) = (word(a.add(n - 8)), word(b.add(n - 8)));
                if x != y {
                    return order(x, y);
                }
            }
            0
        } else if n >= 4 {
            // The first 4 and the last 4 (overlapping for n < 8) as one big-endian word.
            let half = |p: *const u8| {
                let hi = u32::from_be_bytes(p.cast::<[u8; 4]>().read_unaligned());
                let lo = u32::from_be_bytes(p.add(n - 4).cast::<[u8; 4]>().read_unaligned());
                (u64::from(hi) << 32) | u64::from(lo)
            };
            let (x, y) = (half(a), half(b));
            if x == y { 0 } else { order(x, y) }
        } else {
            let mut i = 0;
            while i < n {
                let (x, y) = (*a.add(i), *b.add(i));
                if x != y {
                    return i32::from(x) - i32::from(y);
                }
                i += 1;
            }
            0
        }
    }
}

/// C's `memcmp` for the static musl build: [`compare`].
///
/// # Safety
/// C's contract: `a` and `b` readable for `n` bytes.
#[cfg(all(target_env = "musl", target_arch = "x86_64", not(test)))]
#[unsafe(no_mangle)]
pub unsafe extern "C" fn memcmp(a: *const u8, b: *const u8, n: usize) -> i32 {
    // SAFETY: the caller's contract.
    unsafe { compare(a, b, n) }
}

/// C's `bcmp` (zero when the bytes are equal, not zero otherwise) for the static musl build:
/// [`compare`].
///
/// # Safety
/// C's contract: `a` and `b` readable for `n` bytes.
#[cfg(all(target_env = "musl", target_arch = "x86_64", not(test)))]
#[unsafe(no_mangle)]
pub unsafe extern "C" fn bcmp(a: *const u8, b: *const u8, n: usize) -> i32 {
    // SAFETY: the caller's contract.
    unsafe { compare(a, b, n) }
}

#[cfg(test)]
mod tests {
    use super::{compare, copy};

    /// The order `compare` gives, as Rust's slice order (which is C's `memcmp` order).
    fn ordering(a: &[u8], b: &[u8]) -> std::cmp::Ordering {
        assert_eq!(a.len(), b.len());
        // SAFETY: both slices hold a.len() bytes.
        unsafe { compare(a.as_ptr(), b.as_ptr(), a.len()) }.cmp(&0)
    }

    /// Every length from 0 to 80 at every alignment within 8 bytes, with one byte changed at
    /// every position to values below, above and across the sign bit (0x7f against 0x80: C
    /// compares bytes unsigned), and two bytes changed (the first decides): the sign equals
    /// the slices' order, and equal bytes compare as 0.
    #[test]
    fn orders_as_the_first_byte_that_differs() {
        let base: Vec<u8> = (0..100u32).map(|i| (i * 37 + 11) as u8).collect();
        for n in 0..=80usize {
            for off in 0..8 {
                let a = &base[off..off + n];
                // Equal bytes at another address.
                let same = a.to_vec();
                assert_eq!(ordering(a, &same), std::cmp::Ordering::Equal, "n {n} +{off}");
                for at in 0..n {
                    for (x, y) in [(0x00u8, 0xff), (0x7f, 0x80), (0x10, 0x11), (0xfe, 0xff)] {
                        let (mut l, mut r) = (a.to_vec(), a.to_vec());
                        l[at] = x;
                        r[at] = y;
                        assert_eq!(ordering(&l, &r), l.cmp(&r), "n {n} +{off} byte {at}");
                        assert_eq!(ordering(&r, &l), r.cmp(&l), "n {n} +{off} byte {at}");
                        // A later difference the other way does not change the order.
                        if at + 1 < n {
                            r[n - 1] = r[n - 1].wrapping_sub(1);
                            l[n - 1] = l[n - 1].wrapping_add(1);
                            assert_eq!(ordering(&l, &r), std::cmp::Ordering::Less, "n {n} +{off} byte {at}, last");
                        }
                    }
                }
            }
        }
    }

    /// Random byte strings drawn from a few values (so that long equal prefixes are common),
    /// up to three bytes apart: the order equals the slices' order.
    #[test]
    fn orders_random_strings_as_slices_do() {
        let mut seed = 0x9e37_79b9_7f4a_7c15u64;
        let mut next = move || {
            seed ^= seed << 13;
            seed ^= seed >> 7;
            seed ^= seed << 17;
            seed
        };
        for _ in 0..200_000 {
            let n = (next() % 70) as usize;
            let pick = |r: u64| [0u8, 1, 0x7f, 0x80, 0xff][(r % 5) as usize];
            let a: Vec<u8> = (0..n).map(|_| pick(next())).collect();
            let mut b = a.clone();
            // Up to three bytes changed: within one word, the first decides.
            for _ in 0..(if n > 0 { next() % 4 } else { 0 }) {
                let at = (next() as usize) % n;
                b[at] = pick(next());
            }
            assert_eq!(ordering(&a, &b), a.cmp(&b), "{a:?} {b:?}");
        }
    }

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
