//! The arena: one anonymous mapping that holds every item, never moved or unmapped while
//! the store lives (it will be registered once for RDMA), plus the raw accessors the rest
//! of the store uses. All `unsafe` memory access of the store goes through this module.
//!
//! Concurrency model: chunk bytes are written only by the thread that owns the chunk (the
//! allocator hands it out; see `slab.rs`) or by a writer holding the item's index bucket
//! lock, always inside the item's seqlock (`seq` odd while writing). Lock-free readers
//! copy bytes out with atomic loads (`racy.rs`; never through a `&[u8]`) and then validate
//! the seqlock and the bucket version; a read that raced a writer is thrown away. The words that readers themselves update (access flags and
//! time) are atomics.
use std::io;
use std::ptr;
use std::sync::atomic::{AtomicU32, AtomicU64, AtomicU8, Ordering};

use crate::racy::{racy_copy, racy_copy_uninit, racy_eq};

/// Memory the store may use for its arena or index instead of its own anonymous mapping
/// (for example memory allocated by UCX so that shared-memory peers can read it directly).
///
/// # Safety
/// Implementors guarantee: [base, base+len) is mapped readable and writable, zero-filled
/// when handed over, base is 4096-aligned, and it stays mapped, unmoved and otherwise
/// unused by the process until the object is dropped (remote peers/NICs may read it).
#[allow(clippy::len_without_is_empty)]
pub unsafe trait Memory: Send + Sync + 'static {
    fn base(&self) -> *mut u8;
    fn len(&self) -> usize;
}

/// Gives the store memory of at least `len` bytes.
pub type Allocate<'a> = &'a (dyn Fn(usize) -> io::Result<Box<dyn Memory>> + Sync);

/// One mapping: an anonymous private one of our own, or caller-supplied `Memory`.
pub struct Arena {
    base: *mut u8,
    len: usize,
    /// Caller-supplied memory: kept alive for as long as the arena, freed by its own
    /// `Drop` after the arena is gone. `None`: `base`/`len` are our own mmap.
    owner: Option<Box<dyn Memory>>,
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
        Ok(Arena {
            base: map_anonymous(len)?,
            len,
            owner: None,
        })
    }

    /// Use `len` bytes (rounded up to whole OS pages) of caller-supplied memory, obtained
    /// from `alloc`. Fails if `alloc` fails or returns less than asked, an unaligned or
    /// null base.
    pub fn with_memory(len: usize, alloc: Allocate<'_>) -> io::Result<Arena> {
        let len = len.max(4096).next_multiple_of(4096);
        let mem = alloc(len)?;
        Arena::from_memory(mem, len)
    }

    /// Use the first `len` bytes of `mem` (see `Memory` for what it guarantees).
    pub fn from_memory(mem: Box<dyn Memory>, len: usize) -> io::Result<Arena> {
        let base = mem.base();
        if mem.len() < len {
            return Err(io::Error::new(
                io::ErrorKind::InvalidInput,
                format!("memory of {} bytes is smaller than {len}", mem.len()),
            ));
        }
        if base.is_null() || !(base as usize).is_multiple_of(4096) {
            return Err(io::Error::new(
                io::ErrorKind::InvalidInput,
                "memory base is null or not 4096-aligned",
            ));
        }
        Ok(Arena {
            base,
            len,
            owner: Some(mem),
        })
    }

    pub fn len(&self) -> usize {
        self.len
    }

    /// Make every byte zero, writing only the 4096-byte pieces that are not zero already
    /// (reading untouched anonymous memory commits nothing). For caller-supplied memory
    /// whose contents the store relies on (the index: empty slots, free locks), in case
    /// an allocator did not clear it. Construction time only: no other thread uses it.
    pub fn zero_fill(&self) {
        static ZERO: [u8; 4096] = [0; 4096];
        let mut off = 0;
        while off < self.len {
            let n = (self.len - off).min(ZERO.len());
            if !self.eq(off, &ZERO[..n]) {
                self.write(off, &ZERO[..n]);
            }
            off += n;
        }
    }

    /// Start loading the cache line holding byte `off` (a hint: nothing is read, and an
    /// offset out of range is ignored).
    #[inline]
    pub fn prefetch(&self, off: usize) {
        if off >= self.len {
            return;
        }
        #[cfg(target_arch = "x86_64")]
        {
            let p = self.base.wrapping_add(off) as *const i8;
            // SAFETY: a prefetch reads nothing architecturally and cannot fault; the
            // address is inside our mapping anyway (checked above).
            unsafe { std::arch::x86_64::_mm_prefetch(p, std::arch::x86_64::_MM_HINT_T0) };
        }
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
    /// and discard the copy if it raced (so the copy uses atomic loads: `racy.rs`).
    #[inline]
    pub fn read(&self, off: usize, dst: &mut [u8]) {
        self.check(off, dst.len());
        // SAFETY: the source is in bounds (checked) of a mapping that outlives `&self`;
        // base and length are page multiples, so every aligned word overlapping it is
        // mapped too; it cannot overlap `dst`, a buffer outside the arena or a distinct
        // `&mut`.
        unsafe { racy_copy(dst, self.base.add(off)) }
    }

    /// The `N` 8-byte words at `off` (8-aligned), each read with one relaxed atomic load:
    /// an item header in five loads and one bounds check, for readers that may race a
    /// writer (see `read`).
    #[inline]
    pub fn read_words<const N: usize>(&self, off: usize) -> [u64; N] {
        self.check(off, 8 * N);
        assert!(off.is_multiple_of(8), "misaligned atomic access at {off}");
        // SAFETY: N words in bounds (checked) and 8-aligned (checked; the base is
        // page-aligned) of a mapping that outlives `&self`; each `&AtomicU64` lives only
        // for its load.
        std::array::from_fn(|i| unsafe {
            AtomicU64::from_ptr(self.base.add(off + 8 * i).cast::<u64>()).load(Ordering::Relaxed)
        })
    }

    /// Append `n` bytes at `off` to `out` (see `read` for the race rules).
    #[inline]
    pub fn read_into(&self, off: usize, n: usize, out: &mut Vec<u8>) {
        self.check(off, n);
        out.reserve(n);
        let start = out.len();
        // SAFETY: the source is in bounds (checked) of a mapping that outlives `&self`,
        // whose page-multiple base and length cover every aligned word overlapping it; the
        // destination is `n` bytes of `out`'s spare capacity (reserved above), outside the
        // arena.
        unsafe { racy_copy_uninit(&mut out.spare_capacity_mut()[..n], self.base.add(off)) };
        // SAFETY: racy_copy_uninit initialised the `n` bytes past `start`.
        unsafe { out.set_len(start + n) };
    }

    /// Compare `n = expect.len()` arena bytes at `off` with `expect`. The bytes may be
    /// concurrently written: callers validate with the seqlock afterwards.
    #[inline]
    pub fn eq(&self, off: usize, expect: &[u8]) -> bool {
        self.check(off, expect.len());
        // SAFETY: in bounds (checked) of a mapping that outlives `&self`, whose page-multiple
        // base and length cover every aligned word overlapping the range.
        unsafe { racy_eq(self.base.add(off), expect) }
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
        crc32c_append(crc, s)
    }
}

impl Drop for Arena {
    fn drop(&mut self) {
        if self.owner.is_some() {
            // Caller-supplied memory: its own Drop (after this one) frees it.
            return;
        }
        // SAFETY: `base`/`len` are exactly what map_anonymous returned; no reference into
        // the arena outlives it (all are borrowed from `&self`).
        unsafe { unmap_anonymous(self.base, self.len) };
    }
}

/// A fresh anonymous private mapping of `len` bytes (zero-filled, committed lazily).
fn map_anonymous(len: usize) -> io::Result<*mut u8> {
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
    Ok(base as *mut u8)
}

/// Undo `map_anonymous`.
///
/// # Safety
/// `base`/`len` are exactly what `map_anonymous` returned, unmapped once, and nothing
/// reads or writes the range afterwards.
unsafe fn unmap_anonymous(base: *mut u8, len: usize) {
    // SAFETY: the caller's contract above.
    unsafe { libc::munmap(base as *mut libc::c_void, len) };
}

/// crc32c of `data`, continuing from `crc`: the project's one implementation
/// (`memfabric-checksum`: large buffers by whichever of two engines is faster on this CPU).
pub use memfabric_checksum::crc32c_append;

#[cfg(test)]
pub(crate) mod tests {
    use super::*;

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

    /// Anonymous mapping handed over as caller memory (what UCX-allocated memory is).
    pub(crate) struct TestMemory {
        base: *mut u8,
        len: usize,
    }

    impl TestMemory {
        pub(crate) fn new(len: usize) -> io::Result<TestMemory> {
            Ok(TestMemory {
                base: map_anonymous(len)?,
                len,
            })
        }
    }

    impl TestMemory {
        /// Set every byte to `byte` (memory an allocator handed over dirty).
        pub(crate) fn fill(&self, byte: u8) {
            // SAFETY: the mapping is `len` writable bytes owned by this object, and no
            // arena uses it yet (tests fill it before handing it over).
            unsafe { ptr::write_bytes(self.base, byte, self.len) };
        }

        pub(crate) fn base(&self) -> usize {
            self.base as usize
        }
    }

    impl Drop for TestMemory {
        fn drop(&mut self) {
            // SAFETY: exactly the mapping map_anonymous returned in `new`; the arena that
            // used it has been dropped before this box (Arena::drop leaves it mapped).
            unsafe { unmap_anonymous(self.base, self.len) };
        }
    }

    // SAFETY: the pointer is a private mapping owned by this object alone.
    unsafe impl Send for TestMemory {}
    // SAFETY: as above; the object itself never touches the memory.
    unsafe impl Sync for TestMemory {}

    // SAFETY: a fresh anonymous mapping is readable, writable, zero-filled and
    // page-aligned (4096 on every platform we run on), and it stays mapped until Drop.
    unsafe impl Memory for TestMemory {
        fn base(&self) -> *mut u8 {
            self.base
        }
        fn len(&self) -> usize {
            self.len
        }
    }

    #[test]
    fn caller_memory_is_used_in_place_and_must_be_large_enough() {
        let alloc = |n: usize| -> io::Result<Box<dyn Memory>> { Ok(Box::new(TestMemory::new(n)?)) };
        let a = Arena::with_memory(10_000, &alloc).unwrap();
        assert_eq!(a.len(), 12_288);
        a.write(12_000, b"end");
        assert!(a.eq(12_000, b"end"));
        let short =
            |n: usize| -> io::Result<Box<dyn Memory>> { Ok(Box::new(TestMemory::new(n - 4096)?)) };
        assert!(Arena::with_memory(1 << 16, &short).is_err());
    }

    #[test]
    #[should_panic]
    fn out_of_bounds_access_panics_instead_of_corrupting() {
        let a = Arena::new(4096).unwrap();
        a.write(4090, b"0123456789");
    }
}
