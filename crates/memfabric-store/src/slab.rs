//! Slab classes and pages.
//!
//! The arena is cut into pages (1 MiB by default). A slab class owns a list of pages, each
//! carved into equal chunks, and a free list of chunk offsets. Pages are handed out on
//! demand; like memcached, a class that has no page yet may take one even when the memory
//! limit is reached (so every item size can be stored once memory is full), which is why
//! the arena reserves one extra page per class.
use std::collections::VecDeque;
use std::sync::atomic::{AtomicBool, AtomicU32, AtomicU64, AtomicU8, AtomicUsize, Ordering};
use std::sync::Mutex;

use crate::item::HDR;

/// Largest number of slab classes (ids 1..=62 fit the index slot's 6-bit class field).
pub const MAX_CLASSES: usize = 62;

/// Fixed description of a class.
#[derive(Clone, Copy, Debug)]
pub struct ClassInfo {
    pub id: u8,
    pub size: usize,
    pub per_page: usize,
}

/// Mutable state of a class, under its mutex.
#[derive(Default)]
pub struct ClassState {
    /// Page numbers owned by this class, in the order they were added.
    pub pages: Vec<u32>,
    /// Free chunk offsets (a stack: the most recently freed chunk is reused first).
    pub free: Vec<usize>,
    /// Eviction queue: the class's items in the order they were linked (`QueueEntry`).
    /// Eviction takes the front; an item read since it was queued goes to the back
    /// once instead (second chance). Entries of items since freed, replaced or moved
    /// are stale and skipped; the maintenance thread drops them when too many have
    /// accumulated (`Inner::compact_queues`).
    pub queue: VecDeque<QueueEntry>,
    /// Entries taken from the front of `queue` so far (compaction reconciles with it).
    pub popped: u64,
    /// Live entries the last compaction kept.
    pub kept: usize,
}

/// One entry of a class's eviction queue, packed in 8 bytes: the arena offset of a chunk
/// of the class (/8, 40 bits) and the low 24 bits of the CAS its item was linked with.
/// The chunk is the item's head, or for a chained item the first of its chunks in this
/// class. An entry is current while that chunk still belongs to an item linked with
/// that CAS: a chunk reused for a newer item has a new entry further back, so the old
/// one cannot make the newer item jump the queue.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct QueueEntry(u64);

impl QueueEntry {
    pub fn new(off: usize, cas: u64) -> QueueEntry {
        QueueEntry((((off as u64) >> 3) << 24) | (cas & 0xff_ffff))
    }

    pub fn off(self) -> usize {
        ((self.0 >> 24) << 3) as usize
    }

    /// Does this entry name an item linked with `cas`?
    pub fn cas_matches(self, cas: u64) -> bool {
        self.0 & 0xff_ffff == cas & 0xff_ffff
    }
}

impl ClassState {
    /// Take the front entry of the eviction queue.
    pub fn pop_entry(&mut self) -> Option<QueueEntry> {
        let e = self.queue.pop_front()?;
        self.popped += 1;
        Some(e)
    }

    /// Queue length at which stale entries are compacted away: a quarter of the class's
    /// chunks (+ 1024) more than it holds, so a compaction costs a few entry checks per
    /// link and the queue stays below 1.25 entries per chunk + 1024.
    pub fn compact_threshold(&self, per_page: usize) -> usize {
        let chunks = self.pages.len() * per_page;
        self.kept.max(chunks) + chunks / 4 + 1024
    }
}

/// Per-class counters (`stats items`), updated with relaxed atomics from any thread.
#[derive(Default)]
pub struct ClassCounters {
    pub evicted: AtomicU64,
    pub evicted_nonzero: AtomicU64,
    pub evicted_time: AtomicU64,
    pub evicted_unfetched: AtomicU64,
    pub evicted_active: AtomicU64,
    pub outofmemory: AtomicU64,
    pub reclaimed: AtomicU64,
    pub expired_unfetched: AtomicU64,
    pub crawler_reclaimed: AtomicU64,
    pub items: AtomicU64,
    pub requested: AtomicU64,
    /// Evictions seen by the automover at its last look.
    pub evicted_seen: AtomicU64,
}

pub struct Slabs {
    pub page_size: usize,
    /// Pages the memory limit allows (`cache_memlimit` changes it at run time).
    pub limit_pages: AtomicUsize,
    /// Largest limit the arena has room for.
    pub max_limit_pages: usize,
    /// Pages in the arena (largest limit + one reserve page per class).
    pub total_pages: usize,
    pub classes: Vec<ClassInfo>,
    pub state: Vec<Mutex<ClassState>>,
    pub counters: Vec<ClassCounters>,
    /// Owner class of each page (0 = unassigned).
    pub page_class: Vec<AtomicU8>,
    /// Page is being emptied for a move: frees into it are not reused.
    pub page_draining: Vec<AtomicBool>,
    /// Earliest time (unix seconds) at which an item linked in the page may die: the
    /// smallest exptime linked into it since the sweeper last looked, or a flush time
    /// (`u32::MAX` = nothing to do). The sweeper visits only pages that are due.
    pub page_due: Vec<AtomicU32>,
    /// Unassigned pages.
    pool: Mutex<Vec<u32>>,
    pub pages_used: AtomicU64,
}

/// Chunk sizes as memcached computes them: start at header + `min_chunk`, grow by
/// `factor`, 8-byte aligned, until `max_chunk`, which is the last class.
pub fn class_sizes(min_chunk: usize, factor: f64, max_chunk: usize) -> Vec<usize> {
    let mut sizes = Vec::new();
    let mut size = (HDR + min_chunk).next_multiple_of(8);
    let factor = if factor.is_finite() && factor > 1.0 {
        factor
    } else {
        1.25
    };
    while sizes.len() < MAX_CLASSES - 1 && (size as f64) < max_chunk as f64 / factor {
        sizes.push(size);
        let next = ((size as f64) * factor) as usize;
        size = next.max(size + 8).next_multiple_of(8);
    }
    sizes.push(max_chunk);
    sizes
}

impl Slabs {
    pub fn new(
        page_size: usize,
        limit_pages: usize,
        max_limit_pages: usize,
        sizes: &[usize],
    ) -> Slabs {
        let mut classes = vec![ClassInfo {
            id: 0,
            size: 0,
            per_page: 0,
        }];
        for (i, &size) in sizes.iter().enumerate() {
            classes.push(ClassInfo {
                id: (i + 1) as u8,
                size,
                per_page: page_size / size,
            });
        }
        let max_limit_pages = max_limit_pages.max(limit_pages);
        let total_pages = max_limit_pages + sizes.len();
        Slabs {
            page_size,
            limit_pages: AtomicUsize::new(limit_pages),
            max_limit_pages,
            total_pages,
            state: (0..classes.len())
                .map(|_| Mutex::new(ClassState::default()))
                .collect(),
            counters: (0..classes.len())
                .map(|_| ClassCounters::default())
                .collect(),
            classes,
            page_class: (0..total_pages).map(|_| AtomicU8::new(0)).collect(),
            page_draining: (0..total_pages).map(|_| AtomicBool::new(false)).collect(),
            page_due: (0..total_pages).map(|_| AtomicU32::new(u32::MAX)).collect(),
            pool: Mutex::new((0..total_pages as u32).rev().collect()),
            pages_used: AtomicU64::new(0),
        }
    }

    /// Smallest class whose chunks hold `n` bytes.
    pub fn class_for(&self, n: usize) -> Option<u8> {
        let i = self.classes[1..].partition_point(|c| c.size < n);
        (i + 1 < self.classes.len()).then_some((i + 1) as u8)
    }

    pub fn max_chunk(&self) -> usize {
        self.classes.last().map_or(0, |c| c.size)
    }

    pub fn lock(&self, class: u8) -> std::sync::MutexGuard<'_, ClassState> {
        self.state[class as usize]
            .lock()
            .unwrap_or_else(|e| e.into_inner())
    }

    /// Take an unassigned page for a class. Beyond the memory limit only a class that
    /// owns no page yet may take one.
    pub fn take_page(&self, class_has_pages: bool) -> Option<u32> {
        let used = self.pages_used.load(Ordering::Relaxed) as usize;
        if used >= self.limit_pages.load(Ordering::Relaxed) && class_has_pages {
            return None;
        }
        let mut pool = self.pool.lock().unwrap_or_else(|e| e.into_inner());
        let p = pool.pop()?;
        self.pages_used.fetch_add(1, Ordering::Relaxed);
        Some(p)
    }

    /// Give an emptied page back to the unassigned pool.
    pub fn return_to_pool(&self, page: u32) {
        self.page_class[page as usize].store(0, Ordering::Release);
        self.page_draining[page as usize].store(false, Ordering::Release);
        self.pool
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .push(page);
        self.pages_used.fetch_sub(1, Ordering::Relaxed);
    }

    pub fn page_of(&self, off: usize) -> usize {
        off / self.page_size
    }

    /// Something in the page at `off` dies at `at` (its header already says so): make
    /// the page due for the sweeper then. The fence pairs with the one after the
    /// sweeper's `swap` (`Inner::sweep_page`): either this load sees the sweeper's reset
    /// and lowers it again, or the sweeper's scan sees the header.
    pub fn note_due(&self, off: usize, at: u32) {
        if let Some(d) = self.page_due.get(self.page_of(off)) {
            std::sync::atomic::fence(Ordering::SeqCst);
            if d.load(Ordering::Relaxed) > at {
                d.fetch_min(at, Ordering::AcqRel);
            }
        }
    }

    /// Make every page due at `at` (a flush: any item may die then).
    pub fn all_due(&self, at: u32) {
        for d in &self.page_due {
            d.fetch_min(at, Ordering::AcqRel);
        }
    }

    /// Class owning the chunk at `off` (0 if none).
    pub fn class_of(&self, off: usize) -> u8 {
        self.page_class
            .get(self.page_of(off))
            .map_or(0, |c| c.load(Ordering::Acquire))
    }

    /// Offset of chunk `i` of page `p` in class `c`.
    pub fn chunk_off(&self, c: &ClassInfo, page: u32, i: usize) -> usize {
        page as usize * self.page_size + i * c.size
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn class_sizes_grow_by_the_factor_and_end_at_max_chunk() {
        let s = class_sizes(48, 1.25, 512 * 1024);
        assert_eq!(s[0], 88);
        assert_eq!(*s.last().unwrap(), 512 * 1024);
        for w in s.windows(2) {
            assert!(w[1] > w[0]);
            assert_eq!(w[0] % 8, 0);
        }
        assert!(s.len() < MAX_CLASSES);
    }

    #[test]
    fn class_for_picks_the_smallest_fitting_class() {
        let sl = Slabs::new(1 << 20, 4, 4, &class_sizes(48, 1.25, 512 * 1024));
        assert_eq!(sl.class_for(1), Some(1));
        assert_eq!(sl.class_for(88), Some(1));
        assert_eq!(sl.class_for(89), Some(2));
        assert_eq!(sl.class_for(512 * 1024), Some((sl.classes.len() - 1) as u8));
        assert_eq!(sl.class_for(512 * 1024 + 1), None);
    }

    #[test]
    fn queue_entries_round_trip_offset_and_cas_bits() {
        let e = QueueEntry::new(8 * 123_456_789_012, 0x1234_5678_9abc);
        assert_eq!(e.off(), 8 * 123_456_789_012);
        assert!(e.cas_matches(0x1234_5678_9abc));
        assert!(!e.cas_matches(0x1234_5678_9abd));
    }

    #[test]
    fn a_class_without_pages_may_exceed_the_limit_once() {
        let sl = Slabs::new(1 << 20, 1, 1, &[100, 200]);
        assert!(sl.take_page(false).is_some());
        assert!(sl.take_page(true).is_none());
        assert!(sl.take_page(false).is_some());
    }
}
