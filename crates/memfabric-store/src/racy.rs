//! Copying and comparing bytes that another thread may be writing at the same time: the
//! only way lock-free readers look at item memory.
//!
//! A seqlock reader copies first and validates after (docs/store.md, "Concurrency
//! protocol"), so the bytes it reads may be changing under it. Forming a `&[u8]` over
//! them, or reading them with `ptr::copy_nonoverlapping`, would be a data race, undefined
//! behaviour even if the copy is thrown away later. These functions read with relaxed
//! atomic loads instead: one `AtomicU64` load per aligned 8-byte word (the unaligned head
//! and tail of a copy come from the aligned words that hold them; `racy_eq` uses
//! `AtomicU8` there). A racing write can then only make the result stale, which the
//! caller's validation detects.
//!
//! Speed: values up to 1 MiB are copied this way on every GET. Relaxed word loads compile
//! to plain `mov`s, but the compiler may not widen them into vector loads, and measured
//! (AMD EPYC, 16 KiB in cache) that runs at ~30-55 GB/s where `memcpy` does ~110-160. So
//! on x86_64 the copy is one `rep movsb` in inline assembly instead (except where the word
//! loop measured faster: `WORD_LOOP`), as fast as `memcpy` there: the assembly is opaque
//! to the compiler, and what it does to the source is, in Rust's memory model, a sequence
//! of relaxed atomic byte loads (every x86 load is at least that), so it is a racy read
//! the model allows. Other targets use the word loop.
use std::mem::MaybeUninit;
use std::ptr;
use std::sync::atomic::{AtomicU64, AtomicU8, Ordering};

const WORD: usize = 8;

/// Copy `dst.len()` bytes starting at `src` into `dst`.
///
/// # Safety
/// Every 8-aligned word that overlaps `src .. src + dst.len()` is valid for reads (mapped,
/// not freed) for the whole call: the copy may load whole words at the edges (any range
/// inside the arena qualifies: its base and length are multiples of the page size). The
/// range does not overlap `dst`. Other threads may write it concurrently.
#[inline]
pub(crate) unsafe fn racy_copy(dst: &mut [u8], src: *const u8) {
    let len = dst.len();
    // SAFETY: the caller's contract, and `dst` is valid for writes of `len` bytes.
    unsafe { copy(dst.as_mut_ptr(), src, len) }
}

/// Copy `dst.len()` bytes starting at `src` into `dst`, initialising all of it (for a
/// `Vec`'s spare capacity: no zero-fill pass before the copy).
///
/// # Safety
/// As for [`racy_copy`].
#[inline]
pub(crate) unsafe fn racy_copy_uninit(dst: &mut [MaybeUninit<u8>], src: *const u8) {
    let len = dst.len();
    // SAFETY: the caller's contract; `MaybeUninit<u8>` has the layout of `u8` and `dst` is
    // valid for writes of `len` bytes, each of which `copy` initialises.
    unsafe { copy(dst.as_mut_ptr().cast::<u8>(), src, len) }
}

/// Whether the `expect.len()` bytes starting at `src` equal `expect`.
///
/// # Safety
/// Every 8-aligned word that overlaps `src .. src + expect.len()` is valid for reads for
/// the whole call (the tail is compared out of one whole word; see `racy_copy`). Other
/// threads may write it concurrently (the answer is then meaningless, and the caller's
/// validation says so).
#[inline]
pub(crate) unsafe fn racy_eq(src: *const u8, expect: &[u8]) -> bool {
    let len = expect.len();
    let e = expect.as_ptr();
    let head = src.align_offset(WORD).min(len);
    for i in 0..head {
        // SAFETY: i < len: in the caller's readable range; `expect` has `len` bytes.
        if unsafe { load_u8(src.add(i)) != *e.add(i) } {
            return false;
        }
    }
    let mut i = head;
    while i + WORD <= len {
        // SAFETY: src + i is 8-aligned (i - head is a multiple of 8) and i + 8 <= len;
        // the unaligned read of `expect` stays inside its `len` bytes.
        let same = unsafe { load_u64(src.add(i)) == e.add(i).cast::<u64>().read_unaligned() };
        if !same {
            return false;
        }
        i += WORD;
    }
    if i < len {
        // The last len - i (< 8) bytes: one load of the aligned word that holds them.
        // SAFETY: that word overlaps the source (the contract); src + i is 8-aligned.
        let word = u64::from_le_bytes(unsafe { load_u64(src.add(i)) }.to_ne_bytes());
        // Byte k of the tail at bits 8k, on both sides; a slice compare here would call
        // memcmp (measured: 6% of a 100-byte GET).
        let n = len - i;
        let want = expect[i..]
            .iter()
            .enumerate()
            .fold(0u64, |acc, (k, &b)| acc | (u64::from(b) << (8 * k)));
        return word & ((1u64 << (8 * n)) - 1) == want;
    }
    true
}

/// On x86_64, copies of `WORD_LOOP` bytes are done by the word loop, the rest by
/// `rep movsb`. Measured on the AMD EPYC these VMs run on (racy copies from an unaligned
/// source, best of 5): `rep movsb` copied 100 bytes at ~23 GB/s where the word loop did
/// ~13 (a GET of 100 bytes: 74 ns with `memcpy`, ~85-100 with the word loop), 128..512
/// bytes at half the word loop's rate, and ~1000 bytes and more at twice its rate (as
/// fast as `memcpy`). CPUs without fast short `rep movsb` pay ~30 cycles to start it,
/// about what the word loop spends on 100 bytes.
#[cfg(target_arch = "x86_64")]
const WORD_LOOP: std::ops::Range<usize> = 128..768;

#[cfg(target_arch = "x86_64")]
#[inline]
unsafe fn copy(dst: *mut u8, src: *const u8, len: usize) {
    if WORD_LOOP.contains(&len) {
        // SAFETY: the contract above, which is copy_words's.
        return unsafe { copy_words(dst, src, len) };
    }
    // SAFETY: the contract above bounds both ranges; `rep movsb` reads exactly
    // [src, src + len) and writes exactly [dst, dst + len), forwards (the ABI guarantees
    // the direction flag is clear on entry to inline assembly), and touches no stack or
    // flags; the registers it advances are declared clobbered.
    unsafe {
        std::arch::asm!(
            "rep movsb",
            inout("rcx") len => _,
            inout("rsi") src => _,
            inout("rdi") dst => _,
            options(nostack, preserves_flags),
        )
    }
}

/// The copy behind `racy_copy*` elsewhere: the word loop.
///
/// # Safety
/// As for `copy_words`.
#[cfg(not(target_arch = "x86_64"))]
#[inline]
unsafe fn copy(dst: *mut u8, src: *const u8, len: usize) {
    // SAFETY: the caller's contract, which is copy_words's.
    unsafe { copy_words(dst, src, len) }
}

/// The portable racy copy: the unaligned head from one load of the aligned word that holds
/// it, then word loads four at a time (independent loads keep the CPU's load ports busy),
/// then single words, then the tail from one more aligned word. Edges cost one load and
/// at most three stores each, not a loop of byte loads (a 100-byte value at an odd offset
/// took ~160 instructions with byte loops at both ends). Stores to `dst` are plain: it is
/// ours alone. (Shifting every word of an unaligned source into place instead measured
/// 2-3x slower.)
///
/// # Safety
/// Every 8-aligned word that overlaps `[src, src + len)` is valid for reads (the edges
/// load whole words), `dst` is valid for writes of `len` bytes, the two do not overlap,
/// and no other thread accesses `dst`.
#[inline]
unsafe fn copy_words(dst: *mut u8, src: *const u8, len: usize) {
    let shift = src as usize % WORD;
    let mut i = 0;
    if shift != 0 && len != 0 {
        let head = (WORD - shift).min(len);
        // SAFETY: the aligned word holding `src` overlaps the source (the contract); the
        // `head` bytes written are dst[0..head), inside `len`.
        unsafe {
            let word = load_u64(src.wrapping_sub(shift)).to_ne_bytes();
            store_bytes(dst, &word, shift, head);
        }
        i = head;
    }
    // From here on `src + i` is 8-aligned (or i == len).
    while i + 4 * WORD <= len {
        // SAFETY: four aligned words inside the source (i + 32 <= len); the unaligned
        // stores stay inside `dst`'s `len` bytes.
        unsafe {
            let s = src.add(i);
            let w0 = load_u64(s);
            let w1 = load_u64(s.add(WORD));
            let w2 = load_u64(s.add(2 * WORD));
            let w3 = load_u64(s.add(3 * WORD));
            let d = dst.add(i).cast::<u64>();
            d.write_unaligned(w0);
            d.add(1).write_unaligned(w1);
            d.add(2).write_unaligned(w2);
            d.add(3).write_unaligned(w3);
        }
        i += 4 * WORD;
    }
    while i + WORD <= len {
        // SAFETY: as above, for one word ending at i + 8 <= len.
        unsafe {
            dst.add(i)
                .cast::<u64>()
                .write_unaligned(load_u64(src.add(i)))
        };
        i += WORD;
    }
    if i < len {
        // SAFETY: the aligned word at `src + i` overlaps the source's last `len - i` (< 8)
        // bytes (the contract); they go to dst[i..len).
        unsafe {
            let word = load_u64(src.add(i)).to_ne_bytes();
            store_bytes(dst.add(i), &word, 0, len - i);
        }
    }
}

/// Write `word[from..from + n]` (n < 8, from + n <= 8) to `dst` with at most three stores.
///
/// # Safety
/// `dst` is valid for writes of `n` bytes.
#[inline(always)]
unsafe fn store_bytes(dst: *mut u8, word: &[u8; 8], from: usize, n: usize) {
    debug_assert!(n < WORD && from + n <= WORD);
    let src = word.as_ptr().wrapping_add(from);
    let mut o = 0;
    // Each piece ends at o + piece <= n: reads stay inside `word[from..from + n]`, writes
    // inside `dst`'s `n` bytes, and a local array never overlaps `dst`.
    if n & 4 != 0 {
        // SAFETY: bytes 0..4 of the n (see above).
        unsafe { ptr::copy_nonoverlapping(src, dst, 4) };
        o = 4;
    }
    if n & 2 != 0 {
        // SAFETY: bytes o..o + 2 of the n (see above).
        unsafe { ptr::copy_nonoverlapping(src.add(o), dst.add(o), 2) };
        o += 2;
    }
    if n & 1 != 0 {
        // SAFETY: byte o of the n (see above).
        unsafe { dst.add(o).write(*src.add(o)) };
    }
}

/// # Safety
/// `p` is 8-aligned and valid for reads of 8 bytes for the call.
#[inline(always)]
unsafe fn load_u64(p: *const u8) -> u64 {
    // SAFETY: aligned and readable (the contract); the `&AtomicU64` lives only for this
    // load, and concurrent writers are what atomics are for.
    unsafe { AtomicU64::from_ptr(p.cast::<u64>().cast_mut()) }.load(Ordering::Relaxed)
}

/// # Safety
/// `p` is valid for reads of 1 byte for the call.
#[inline(always)]
unsafe fn load_u8(p: *const u8) -> u8 {
    // SAFETY: readable (the contract); AtomicU8 has alignment 1.
    unsafe { AtomicU8::from_ptr(p.cast_mut()) }.load(Ordering::Relaxed)
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::atomic::AtomicBool;
    use std::sync::Arc;

    /// 8-aligned backing store, so tests control the source's alignment exactly.
    fn aligned_pattern(n: usize) -> Vec<u64> {
        (0..n.div_ceil(8) as u64)
            .map(|w| u64::from_ne_bytes(std::array::from_fn(|b| (w * 8 + b as u64) as u8 ^ 0x5a)))
            .collect()
    }

    fn bytes(words: &[u64]) -> &[u8] {
        // SAFETY: u64s are plain bytes; the slice covers exactly the vector's memory.
        unsafe { std::slice::from_raw_parts(words.as_ptr().cast::<u8>(), words.len() * 8) }
    }

    #[test]
    fn copies_and_compares_every_alignment_and_length() {
        let words = aligned_pattern(160);
        let src = bytes(&words);
        for start in 0..9 {
            for len in 0..(160 - start) {
                let want = &src[start..start + len];
                let mut got = vec![0u8; len];
                // SAFETY: inside `src`, which outlives the call; no other thread.
                unsafe { racy_copy(&mut got, src.as_ptr().add(start)) };
                assert_eq!(got, want, "start {start} len {len}");
                let mut portable = vec![0u8; len];
                // SAFETY: as above; `portable` has `len` bytes.
                unsafe { copy_words(portable.as_mut_ptr(), src.as_ptr().add(start), len) };
                assert_eq!(portable, want, "word loop: start {start} len {len}");
                // SAFETY: as above.
                assert!(unsafe { racy_eq(src.as_ptr().add(start), want) });
                for flip in 0..len {
                    let mut other = want.to_vec();
                    other[flip] ^= 1;
                    // SAFETY: as above.
                    assert!(!unsafe { racy_eq(src.as_ptr().add(start), &other) });
                }
            }
        }
    }

    #[test]
    fn uninit_destination_is_fully_initialised() {
        let words = aligned_pattern(1000);
        let src = &bytes(&words)[3..];
        let mut out: Vec<u8> = Vec::with_capacity(src.len());
        // SAFETY: `src` is readable for its length; the spare capacity is ours.
        unsafe { racy_copy_uninit(&mut out.spare_capacity_mut()[..src.len()], src.as_ptr()) };
        // SAFETY: racy_copy_uninit initialised exactly these bytes.
        unsafe { out.set_len(src.len()) };
        assert_eq!(out, src);
    }

    /// A writer flips whole words between two patterns while readers copy. The word loop
    /// reads whole old or new words, never a mix within a word; `racy_copy` (which may be
    /// `rep movsb`) promises whole bytes only. Either way nothing but the two patterns
    /// appears: a race makes a copy stale, never invents bytes.
    #[test]
    fn a_racing_writer_yields_only_old_or_new_data() {
        const N: usize = 512;
        let shared: Arc<Vec<AtomicU64>> = Arc::new((0..N).map(|_| AtomicU64::new(0)).collect());
        let stop = Arc::new(AtomicBool::new(false));
        let writer = {
            let (shared, stop) = (Arc::clone(&shared), Arc::clone(&stop));
            std::thread::spawn(move || {
                let mut v = 0u64;
                while !stop.load(Ordering::Relaxed) {
                    v = !v;
                    for w in shared.iter() {
                        w.store(v, Ordering::Relaxed);
                    }
                }
            })
        };
        let src = shared.as_ptr().cast::<u8>();
        let mut copy = vec![0u8; N * 8];
        for _ in 0..2000 {
            // SAFETY: the vector of atomics lives (Arc) for the call; writes to it are
            // atomic stores; `copy` has N * 8 bytes.
            unsafe { copy_words(copy.as_mut_ptr(), src, copy.len()) };
            for w in copy.chunks_exact(8) {
                let w = u64::from_ne_bytes(w.try_into().unwrap());
                assert!(w == 0 || w == u64::MAX, "torn word {w:#x}");
            }
            // SAFETY: as above.
            unsafe { racy_copy(&mut copy, src) };
            assert!(copy.iter().all(|&b| b == 0 || b == 0xff));
        }
        stop.store(true, Ordering::Relaxed);
        writer.join().unwrap();
    }
}
