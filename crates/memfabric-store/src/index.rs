//! The set-associative hash index: an array of 64-byte buckets.
//!
//! ```text
//! bucket (64 bytes, one cache line):
//!   0  u32 version   seqlock: odd while the slots are being changed
//!   4  u32 lock      writers' mutual exclusion (0 free, 1 held); readers never touch it
//!   8  u64 slot[7]   0 = empty, else  tag:16 | flash:1 | spare:1 | class:6 | offset/8:40
//! ```
//! A key hashes (xxh3, seeded) to a primary bucket and a tag; its alternate bucket is
//! derived from the primary and the tag (as in MemC3), so a remote reader can compute both
//! from the key alone. The class in the slot tells a reader how many bytes the item's chunk
//! spans, so one read fetches header, key and value in the common case.
//!
//! The buckets live in their own mapping (an `Arena`), so they can be registered for RDMA
//! like the item arena. The mapping ends with the control block (`remote.rs`): the
//! geometry and the live words (flush CAS, flush time, clock) a remote reader needs.
use std::sync::atomic::{fence, AtomicU32, AtomicU64, Ordering};

use crate::arena::{Allocate, Arena};
use crate::remote;
/// Bucket geometry: part of the remotely readable layout, so defined in `remote`.
pub use crate::remote::{BUCKET_BYTES, SLOTS};

const OFF_MASK: u64 = (1 << 40) - 1;
/// The slot names a flash location (SSD tier) instead of arena memory.
pub const FLASH_BIT: u64 = 1 << 47;
/// A flash slot whose item was read since it was written to flash (reinsertion at reclaim).
pub const FLASH_REFERENCED: u64 = 1 << 46;

/// A decoded slot.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Slot {
    pub tag: u16,
    pub class: u8,
    /// Arena offset of the item (multiple of 8).
    pub off: usize,
}

impl Slot {
    pub fn encode(self) -> u64 {
        ((self.tag as u64) << 48)
            | (((self.class & 0x3f) as u64) << 40)
            | ((self.off as u64 >> 3) & OFF_MASK)
    }

    /// A slot naming arena memory; `None` for an empty slot and for a flash slot (only
    /// the flash tier's own code reads those, through [`FlashSlot`]).
    pub fn decode(raw: u64) -> Option<Slot> {
        if raw == 0 || raw & FLASH_BIT != 0 {
            return None;
        }
        Some(Slot {
            tag: (raw >> 48) as u16,
            class: ((raw >> 40) & 0x3f) as u8,
            off: ((raw & OFF_MASK) << 3) as usize,
        })
    }
}

/// A slot that names an item on flash: its tag, slab class (how many bytes to read at
/// most) and flash byte offset (a multiple of 8).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct FlashSlot {
    pub tag: u16,
    pub class: u8,
    pub loc: u64,
}

impl FlashSlot {
    pub fn encode(self) -> u64 {
        ((self.tag as u64) << 48)
            | FLASH_BIT
            | (((self.class & 0x3f) as u64) << 40)
            | ((self.loc >> 3) & OFF_MASK)
    }

    /// The flash slot in `raw`, whatever its referenced bit.
    pub fn decode(raw: u64) -> Option<FlashSlot> {
        if raw & FLASH_BIT == 0 {
            return None;
        }
        Some(FlashSlot {
            tag: (raw >> 48) as u16,
            class: ((raw >> 40) & 0x3f) as u8,
            loc: (raw & OFF_MASK) << 3,
        })
    }
}

/// Where a key may live.
#[derive(Clone, Copy, Debug)]
pub struct KeyHash {
    pub tag: u16,
    pub b1: usize,
    pub b2: usize,
}

pub struct Index {
    mem: Arena,
    mask: usize,
    seed: u64,
    power: u32,
}

impl Index {
    /// `2^power` buckets and the control block, in an anonymous mapping (`alloc` = None)
    /// or in caller-supplied memory. The control block gets layout, seed and hashpower;
    /// `init_control` fills in the rest and then the magic.
    pub fn new_in(power: u32, seed: u64, alloc: Option<Allocate<'_>>) -> std::io::Result<Index> {
        let n = 1usize << power;
        let len = remote::index_len(power);
        let mem = match alloc {
            Some(alloc) => {
                let mem = Arena::with_memory(len, alloc)?;
                // Promised zeroed, but an all-zero index is what makes every slot empty
                // and every lock free: make sure.
                mem.zero_fill();
                mem
            }
            None => Arena::new(len)?,
        };
        let ix = Index {
            mem,
            mask: n - 1,
            seed,
            power,
        };
        ix.ctl_u64(remote::OFF_HASH_SEED)
            .store(seed, Ordering::Relaxed);
        ix.ctl_u32(remote::OFF_HASHPOWER)
            .store(power, Ordering::Relaxed);
        ix.ctl_u32(remote::OFF_ITEM_HDR)
            .store(crate::item::HDR as u32, Ordering::Relaxed);
        ix.ctl_u32(remote::OFF_LAYOUT)
            .store(remote::CTL_LAYOUT, Ordering::Relaxed);
        Ok(ix)
    }

    #[cfg(test)]
    pub fn new(power: u32, seed: u64) -> std::io::Result<Index> {
        Index::new_in(power, seed, None)
    }

    /// Fill in the arena geometry of the control block: chunk size per class id (entry 0
    /// unused), page size, arena length.
    pub fn init_control(&self, chunk_sizes: &[u32], page_size: usize, arena_len: usize) {
        let n = chunk_sizes
            .len()
            .min((remote::CTL_BYTES - remote::OFF_CHUNK_SIZES) / 4);
        for (i, &size) in chunk_sizes[..n].iter().enumerate() {
            self.ctl_u32(remote::OFF_CHUNK_SIZES + 4 * i)
                .store(size, Ordering::Relaxed);
        }
        self.ctl_u32(remote::OFF_CLASSES)
            .store(n as u32, Ordering::Relaxed);
        self.ctl_u32(remote::OFF_PAGE_SIZE)
            .store(page_size as u32, Ordering::Relaxed);
        self.ctl_u64(remote::OFF_ARENA_LEN)
            .store(arena_len as u64, Ordering::Relaxed);
        // Magic last: a reader that sees it sees a filled-in block.
        self.ctl_u32(remote::OFF_MAGIC)
            .store(remote::CTL_MAGIC, Ordering::Release);
    }

    /// Number of buckets.
    pub fn buckets(&self) -> usize {
        self.mask + 1
    }

    pub fn power(&self) -> u32 {
        self.power
    }

    pub fn seed(&self) -> u64 {
        self.seed
    }

    /// Base address and length of the index mapping (buckets + control block).
    pub fn region(&self) -> (*mut u8, usize) {
        self.mem.region()
    }

    /// Bytes of the index mapping (buckets + control block).
    pub fn bytes(&self) -> usize {
        self.mem.len()
    }

    fn ctl_off(&self) -> usize {
        (self.mask + 1) * BUCKET_BYTES
    }

    fn ctl_u32(&self, off: usize) -> &AtomicU32 {
        self.mem.u32_at(self.ctl_off() + off)
    }

    fn ctl_u64(&self, off: usize) -> &AtomicU64 {
        self.mem.u64_at(self.ctl_off() + off)
    }

    /// Control block: items with a CAS below this are flushed (0 = none).
    pub fn flush_cas(&self) -> &AtomicU64 {
        self.ctl_u64(remote::OFF_FLUSH_CAS)
    }

    /// Control block: delayed flush time (0 = none).
    pub fn flush_time(&self) -> &AtomicU32 {
        self.ctl_u32(remote::OFF_FLUSH_TIME)
    }

    /// Control block: the store's clock as remote readers see it.
    pub fn ctl_now(&self) -> &AtomicU32 {
        self.ctl_u32(remote::OFF_NOW)
    }

    /// A copy of the control block, field by field with atomic loads of each field's own
    /// size (no field is torn; the table and the unused rest as u32 words).
    pub fn control_block(&self) -> Vec<u8> {
        const U64_FIELDS: [usize; 4] = [
            remote::OFF_FLUSH_CAS,
            remote::OFF_HASH_SEED,
            remote::OFF_ARENA_LEN,
            remote::OFF_RESERVED,
        ];
        let mut v = Vec::with_capacity(remote::CTL_BYTES);
        let mut o = 0;
        while o < remote::CTL_BYTES {
            if U64_FIELDS.contains(&o) {
                v.extend_from_slice(&self.ctl_u64(o).load(Ordering::Acquire).to_le_bytes());
                o += 8;
            } else {
                v.extend_from_slice(&self.ctl_u32(o).load(Ordering::Acquire).to_le_bytes());
                o += 4;
            }
        }
        v
    }

    pub fn hash(&self, key: &[u8]) -> KeyHash {
        let h = xxhash_rust::xxh3::xxh3_64_with_seed(key, self.seed);
        // Tag 0 is never used, so a slot is never all zeros.
        let tag = ((h >> 48) as u16).max(1);
        let b1 = (h as usize) & self.mask;
        let mut b2 = (b1 ^ ((tag as usize).wrapping_mul(0x5bd1_e995))) & self.mask;
        if b2 == b1 {
            b2 = (b1 + 1) & self.mask;
        }
        KeyHash { tag, b1, b2 }
    }

    fn version(&self, b: usize) -> &AtomicU32 {
        self.mem.u32_at(b * BUCKET_BYTES)
    }

    fn lock_word(&self, b: usize) -> &AtomicU32 {
        self.mem.u32_at(b * BUCKET_BYTES + 4)
    }

    fn slot_word(&self, b: usize, i: usize) -> &AtomicU64 {
        self.mem.u64_at(b * BUCKET_BYTES + 8 + i * 8)
    }

    /// Reader: an even version to validate against later, spinning past writers.
    pub fn read_begin(&self, b: usize) -> u32 {
        let mut spins = 0u32;
        loop {
            let v = self.version(b).load(Ordering::Acquire);
            if v & 1 == 0 {
                return v;
            }
            backoff(&mut spins);
        }
    }

    /// Reader: did the bucket stay unchanged since `read_begin` returned `v`?
    pub fn read_validate(&self, b: usize, v: u32) -> bool {
        fence(Ordering::Acquire);
        self.version(b).load(Ordering::Relaxed) == v
    }

    /// Start loading a key's first bucket (see `Store::prefetch`).
    #[inline]
    pub fn prefetch(&self, kh: &KeyHash) {
        self.mem.prefetch(kh.b1 * BUCKET_BYTES);
    }

    pub fn slot(&self, b: usize, i: usize) -> Option<Slot> {
        Slot::decode(self.slot_word(b, i).load(Ordering::Relaxed))
    }

    /// The raw slot word (0 = empty), for the flash tier.
    pub fn raw_slot(&self, b: usize, i: usize) -> u64 {
        self.slot_word(b, i).load(Ordering::Relaxed)
    }

    /// Writer (bucket lock held): store a raw slot word through the seqlock.
    pub fn set_raw_slot(&self, b: usize, i: usize, raw: u64) {
        let v = self.version(b);
        v.store(v.load(Ordering::Relaxed).wrapping_add(1), Ordering::Relaxed);
        fence(Ordering::Release);
        self.slot_word(b, i).store(raw, Ordering::Relaxed);
        v.store(v.load(Ordering::Relaxed).wrapping_add(1), Ordering::Release);
    }

    /// Reader: note that the flash slot (b, i) holding `raw` was read. No seqlock: the bit
    /// changes nothing a reader decodes, and a write that replaces the slot meanwhile
    /// wins (the compare fails).
    pub fn mark_flash_referenced(&self, b: usize, i: usize, raw: u64) {
        let _ = self.slot_word(b, i).compare_exchange(
            raw,
            raw | FLASH_REFERENCED,
            Ordering::Relaxed,
            Ordering::Relaxed,
        );
    }

    pub fn lock(&self, b: usize) {
        let mut spins = 0u32;
        while self
            .lock_word(b)
            .compare_exchange_weak(0, 1, Ordering::Acquire, Ordering::Relaxed)
            .is_err()
        {
            backoff(&mut spins);
        }
    }

    pub fn try_lock(&self, b: usize) -> bool {
        self.lock_word(b)
            .compare_exchange(0, 1, Ordering::Acquire, Ordering::Relaxed)
            .is_ok()
    }

    pub fn unlock(&self, b: usize) {
        self.lock_word(b).store(0, Ordering::Release);
    }

    /// Lock both candidate buckets in a fixed order (no deadlock between writers).
    pub fn lock_pair(&self, kh: &KeyHash) {
        let (lo, hi) = order(kh.b1, kh.b2);
        self.lock(lo);
        if hi != lo {
            self.lock(hi);
        }
    }

    pub fn try_lock_pair(&self, kh: &KeyHash) -> bool {
        let (lo, hi) = order(kh.b1, kh.b2);
        if !self.try_lock(lo) {
            return false;
        }
        if hi != lo && !self.try_lock(hi) {
            self.unlock(lo);
            return false;
        }
        true
    }

    pub fn unlock_pair(&self, kh: &KeyHash) {
        let (lo, hi) = order(kh.b1, kh.b2);
        if hi != lo {
            self.unlock(hi);
        }
        self.unlock(lo);
    }

    /// Writer (holding the bucket lock): replace slot `i` of bucket `b`, publishing the
    /// change through the bucket's seqlock.
    pub fn set_slot(&self, b: usize, i: usize, s: Option<Slot>) {
        self.set_raw_slot(b, i, s.map_or(0, Slot::encode));
    }
}

fn order(a: usize, b: usize) -> (usize, usize) {
    if a <= b {
        (a, b)
    } else {
        (b, a)
    }
}

/// Spin briefly, then yield: lock holders never block, but on a 2-core machine the holder
/// may be descheduled.
pub fn backoff(spins: &mut u32) {
    *spins += 1;
    if *spins < 64 {
        std::hint::spin_loop();
    } else {
        std::thread::yield_now();
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn slot_encoding_round_trips() {
        let s = Slot {
            tag: 0xabcd,
            class: 42,
            off: 8 * 123_456_789,
        };
        assert_eq!(Slot::decode(s.encode()), Some(s));
        assert_eq!(Slot::decode(0), None);
        let f = FlashSlot {
            tag: 0xabcd,
            class: 42,
            loc: 8 * 123_456_789,
        };
        assert_eq!(FlashSlot::decode(f.encode()), Some(f));
        assert_eq!(FlashSlot::decode(f.encode() | FLASH_REFERENCED), Some(f));
        // Code that knows only arena slots never sees a flash slot as one.
        assert_eq!(Slot::decode(f.encode()), None);
        assert_eq!(FlashSlot::decode(s.encode()), None);
    }

    #[test]
    fn candidate_buckets_differ_and_tag_is_never_zero() {
        let ix = Index::new(4, 7).unwrap();
        for i in 0..1000u32 {
            let kh = ix.hash(&i.to_le_bytes());
            assert_ne!(kh.b1, kh.b2);
            assert_ne!(kh.tag, 0);
            assert!(kh.b1 < 16 && kh.b2 < 16);
        }
    }

    #[test]
    fn version_is_even_after_each_write() {
        let ix = Index::new(2, 1).unwrap();
        let v0 = ix.read_begin(1);
        ix.lock(1);
        ix.set_slot(
            1,
            3,
            Some(Slot {
                tag: 5,
                class: 1,
                off: 64,
            }),
        );
        ix.unlock(1);
        let v1 = ix.read_begin(1);
        assert_eq!(v1, v0 + 2);
        assert!(!ix.read_validate(1, v0));
        assert_eq!(ix.slot(1, 3).map(|s| s.off), Some(64));
    }
}
