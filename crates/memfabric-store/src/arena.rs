//! The arena: one anonymous mapping that holds every item, never moved or unmapped while
//! the store lives (it will be registered once for RDMA), plus the raw accessors the rest
//! of the store uses. All `unsafe` memory access of the store goes through this module.
//!
//! Concurrency model: chunk bytes are written only by the thread that owns the chunk (the
//! allocator hands it out; see `slab.rs`) or by a writer holding the item's index bucket
//! lock, always inside the item's seqlock (`seq` odd while writing). Lock-free readers
//! copy bytes out and then validate the seqlock and the bucket version; a read that raced
//! a writer is thrown away. The words that readers themselves update (access flags and
//! time) are atomics.
use std::io;
use std::ptr;
use std::sync::atomic::{AtomicU32, AtomicU64, AtomicU8};

/// One anonymous, private mapping.
pub struct Arena {
    base: *mut u8,
    len: usize,
}

// SAFETY: the arena is plain memory; every access below goes through atomics or through
// the seqlock/ownership protocol described in the module docs, which is what makes
// sharing it between threads sound at the protocol level.
unsafe impl Send for Arena {}
// SAFETY: as above.
unsafe impl Sync for Arena {}

impl Arena {
    /// Map `len` bytes (rounded up to whole OS pages). Memory is committed lazily by the
    /// kernel as pages are first touched.
    pub fn new(len: usize) -> io::Result<Arena> {
        let len = len.max(4096).next_multiple_of(4096);
        // SAFETY: an anonymous private mapping with no address hint has no preconditions;
        // the result is checked against MAP_FAILED before use.
        let base = unsafe {
            libc::mmap(
                ptr::null_mut(),
                len,
                libc::PROT_READ | libc::PROT_WRITE,
                libc::MAP_PRIVATE | libc::MAP_ANONYMOUS | libc::MAP_NORESERVE,
                -1,
                0,
            )
        };
        if base == libc::MAP_FAILED {
            return Err(io::Error::last_os_error());
        }
        Ok(Arena {
            base: base as *mut u8,
            len,
        })
    }

    pub fn len(&self) -> usize {
        self.len
    }

    /// Base address and length of the mapping (for registration with a NIC).
    pub fn region(&self) -> (*mut u8, usize) {
        (self.base, self.len)
    }

    /// Address of the `n` bytes at `off` (bounds-checked), for foreign code that reads
    /// or writes them under the store's ownership rules (pending / pinned items).
    /// Producing the pointer is safe: `wrapping_add` dereferences nothing.
    pub fn ptr_at(&self, off: usize, n: usize) -> *mut u8 {
        self.check(off, n);
        self.base.wrapping_add(off)
    }

    /// The `n` bytes at `off` as a slice, for a value range that nobody writes while the
    /// borrow lives: a pinned item's value (pins.rs: a pinned item is never freed, reused
    /// or rewritten in place; writers build new items), or a linked item's value while
    /// its buckets are locked (`Txn::with_value_slices`: no writer, evictor or reclaimer
    /// touches an item without that lock).
    pub(crate) fn stable_bytes(&self, off: usize, n: usize) -> &[u8] {
        self.check(off, n);
        // SAFETY: in bounds (checked); the mapping lives as long as &self; the range is a
        // pinned value, or a value under its bucket locks, and no thread writes it until
        // the pin or the lock (each outlives the returned borrow: PinnedItem::value_slices
        // borrows the pin, Txn::with_value_slices scopes the slices to a closure) goes.
        unsafe { std::slice::from_raw_parts(self.base.add(off), n) }
    }

    /// The `n` bytes at `off` as a mutable slice, for the value range of a pending item
    /// (allocated, not yet linked): the chunk belongs to that item alone, so no store
    /// thread writes it; lock-free readers that still probe a chunk's old contents copy
    /// bytes out and discard them when the item's seq says it changed.
    #[allow(clippy::mut_from_ref)]
    pub(crate) fn pending_bytes_mut(&self, off: usize, n: usize) -> &mut [u8] {
        self.check(off, n);
        // SAFETY: in bounds (checked); the mapping lives as long as &self; the range is a
        // pending item's value, owned exclusively by the PendingItem whose &mut borrow
        // bounds the returned slice (PendingItem::value_slices_mut), and the ranges of one
        // item's segments do not overlap.
        unsafe { std::slice::from_raw_parts_mut(self.base.add(off), n) }
    }

    #[inline]
    fn check(&self, off: usize, n: usize) {
        assert!(
            off.checked_add(n).is_some_and(|end| end <= self.len),
            "arena access out of bounds: {off}+{n} > {}",
            self.len
        );
    }

    #[inline]
    fn check_aligned(&self, off: usize, n: usize) {
        self.check(off, n);
        assert!(off.is_multiple_of(n), "misaligned atomic access at {off}");
    }

    /// The atomic byte at `off`.
    #[inline]
    pub fn u8_at(&self, off: usize) -> &AtomicU8 {
        self.check(off, 1);
        // SAFETY: in bounds (checked); AtomicU8 has alignment 1; the mapping lives as long
        // as `self`, which outlives the returned reference.
        unsafe { &*(self.base.add(off) as *const AtomicU8) }
    }

    /// The atomic u32 at `off` (must be 4-aligned).
    #[inline]
    pub fn u32_at(&self, off: usize) -> &AtomicU32 {
        self.check_aligned(off, 4);
        // SAFETY: in bounds and aligned (checked); the base is page-aligned; the mapping
        // outlives the reference.
        unsafe { &*(self.base.add(off) as *const AtomicU32) }
    }

    /// The atomic u64 at `off` (must be 8-aligned).
    #[inline]
    pub fn u64_at(&self, off: usize) -> &AtomicU64 {
        self.check_aligned(off, 8);
        // SAFETY: in bounds and aligned (checked); the mapping outlives the reference.
        unsafe { &*(self.base.add(off) as *const AtomicU64) }
    }

    /// Copy `dst.len()` bytes out of the arena at `off`. The bytes may be concurrently
    /// written by a writer that owns them; callers validate with the seqlock afterwards
    /// and discard the copy if it raced.
    #[inline]
    pub fn read(&self, off: usize, dst: &mut [u8]) {
        self.check(off, dst.len());
        // SAFETY: source in bounds (checked), destination is a distinct Rust buffer. A
        // racing writer can only make the copied bytes stale, which the seqlock
        // validation that follows every optimistic read detects.
        unsafe { ptr::copy_nonoverlapping(self.base.add(off), dst.as_mut_ptr(), dst.len()) }
    }

    /// Append `n` bytes at `off` to `out` (see `read` for the race rules).
    #[inline]
    pub fn read_into(&self, off: usize, n: usize, out: &mut Vec<u8>) {
        self.check(off, n);
        out.reserve(n);
        let start = out.len();
        // SAFETY: the source is in bounds (checked); the destination has `n` bytes of
        // reserved capacity past `start`, which become initialised by the copy before
        // `set_len` exposes them.
        unsafe {
            ptr::copy_nonoverlapping(self.base.add(off), out.as_mut_ptr().add(start), n);
            out.set_len(start + n);
        }
    }

    /// Compare `n = expect.len()` arena bytes at `off` with `expect`.
    #[inline]
    pub fn eq(&self, off: usize, expect: &[u8]) -> bool {
        self.check(off, expect.len());
        // SAFETY: in bounds (checked); a racing write can only make the comparison wrong,
        // which the caller's seqlock validation detects.
        let s = unsafe { std::slice::from_raw_parts(self.base.add(off), expect.len()) };
        s == expect
    }

    /// Write `src` at `off`. Only the owner of the chunk (fresh allocation) or a writer
    /// holding the item's bucket lock inside an odd seqlock may call this.
    #[inline]
    pub fn write(&self, off: usize, src: &[u8]) {
        self.check(off, src.len());
        // SAFETY: in bounds (checked); the caller owns these bytes per the protocol in the
        // module docs, so no other writer touches them; readers validate afterwards.
        unsafe { ptr::copy_nonoverlapping(src.as_ptr(), self.base.add(off), src.len()) }
    }

    /// crc32c of `n` bytes at `off`, continuing from `crc`.
    #[inline]
    pub fn crc(&self, crc: u32, off: usize, n: usize) -> u32 {
        self.check(off, n);
        // SAFETY: in bounds (checked); only called by the owner/locked writer of the bytes.
        let s = unsafe { std::slice::from_raw_parts(self.base.add(off), n) };
        crc32c::crc32c_append(crc, s)
    }
}

impl Drop for Arena {
    fn drop(&mut self) {
        // SAFETY: `base`/`len` are exactly what mmap returned; no reference into the
        // arena outlives it (all are borrowed from `&self`).
        unsafe {
            libc::munmap(self.base as *mut libc::c_void, self.len);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::atomic::Ordering;

    #[test]
    fn writes_are_read_back() {
        let a = Arena::new(1 << 16).unwrap();
        a.write(100, b"hello");
        let mut buf = [0u8; 5];
        a.read(100, &mut buf);
        assert_eq!(&buf, b"hello");
        assert!(a.eq(100, b"hello"));
        a.u64_at(8).store(42, Ordering::Relaxed);
        assert_eq!(a.u64_at(8).load(Ordering::Relaxed), 42);
    }

    #[test]
    #[should_panic]
    fn out_of_bounds_access_panics_instead_of_corrupting() {
        let a = Arena::new(4096).unwrap();
        a.write(4090, b"0123456789");
    }
}
