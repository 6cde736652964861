//! The pin table: which items are pinned (their memory lent to foreign code, see
//! `pins.rs`) and which arena pages hold a pinned chunk. Counts only: it knows nothing of
//! items or the store, so the store's state can own one without depending on `pins.rs`.
use std::sync::atomic::{AtomicU32, AtomicUsize, Ordering};
use std::sync::Mutex;

use rustc_hash::FxHashMap;

const SHARDS: usize = 16;

#[derive(Default)]
struct PinEntry {
    count: usize,
    /// Unlinked and freed while pinned: the last unpin frees it.
    freed: bool,
}

/// The pin table: pinned items by head chunk offset, plus pinned chunks per page.
pub(crate) struct Pins {
    /// Pinned items (table entries); 0 makes every check a single relaxed load.
    active: AtomicUsize,
    shards: Vec<Mutex<FxHashMap<usize, PinEntry>>>,
    /// Per arena page: chunks of pinned items in it (page moves skip such pages).
    page_pins: Vec<AtomicU32>,
    page_size: usize,
}

impl Pins {
    pub(crate) fn new(total_pages: usize, page_size: usize) -> Pins {
        Pins {
            active: AtomicUsize::new(0),
            shards: (0..SHARDS).map(|_| Mutex::default()).collect(),
            page_pins: (0..total_pages).map(|_| AtomicU32::new(0)).collect(),
            page_size,
        }
    }

    fn shard(&self, head: usize) -> std::sync::MutexGuard<'_, FxHashMap<usize, PinEntry>> {
        self.shards[(head >> 3) % SHARDS]
            .lock()
            .unwrap_or_else(|e| e.into_inner())
    }

    fn count_pages(&self, chunks: &[usize], up: bool) {
        for &c in chunks {
            let p = &self.page_pins[c / self.page_size];
            if up {
                p.fetch_add(1, Ordering::SeqCst);
            } else {
                p.fetch_sub(1, Ordering::SeqCst);
            }
        }
    }

    /// Pin the LINKED item `head` whose chunks are `chunks` (caller holds its bucket locks).
    pub(crate) fn pin(&self, head: usize, chunks: &[usize]) {
        let mut t = self.shard(head);
        let e = t.entry(head).or_default();
        e.count += 1;
        if e.count == 1 {
            self.active.fetch_add(1, Ordering::SeqCst);
            self.count_pages(chunks, true);
        }
    }

    /// Drop one pin. Returns true when the item was freed while pinned and this was the
    /// last pin: the caller frees it now.
    pub(crate) fn unpin(&self, head: usize, chunks: &[usize]) -> bool {
        let mut t = self.shard(head);
        let Some(e) = t.get_mut(&head) else {
            debug_assert!(false, "unpin of an item that is not pinned");
            return false;
        };
        e.count -= 1;
        if e.count > 0 {
            return false;
        }
        let freed = e.freed;
        t.remove(&head);
        self.count_pages(chunks, false);
        self.active.fetch_sub(1, Ordering::SeqCst);
        freed
    }

    /// Whoever frees the unlinked item `head` asks first: true = it is pinned, its last
    /// unpin frees it (do not touch its chunks); false = free it now.
    pub(crate) fn defer_free(&self, head: usize) -> bool {
        // Relaxed is enough: a pin is taken under the item's bucket locks, and the item
        // was unlinked under them before it is freed, which orders the pin before this.
        if self.active.load(Ordering::Relaxed) == 0 {
            return false;
        }
        match self.shard(head).get_mut(&head) {
            Some(e) => {
                e.freed = true;
                true
            }
            None => false,
        }
    }

    /// Is `head` pinned right now? (A hint for the evictor; `defer_free` decides.)
    pub(crate) fn is_pinned(&self, head: usize) -> bool {
        self.active.load(Ordering::Relaxed) != 0 && self.shard(head).contains_key(&head)
    }

    /// Does page `page` hold a chunk of a pinned item?
    pub(crate) fn page_pinned(&self, page: usize) -> bool {
        self.active.load(Ordering::Relaxed) != 0 && self.page_pins[page].load(Ordering::SeqCst) != 0
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn pin_table_defers_frees_until_the_last_unpin() {
        let p = Pins::new(4, 1 << 20);
        assert!(!p.defer_free(64));
        p.pin(64, &[64, (1 << 20) + 8]);
        p.pin(64, &[64, (1 << 20) + 8]);
        assert!(p.is_pinned(64) && p.page_pinned(0) && p.page_pinned(1));
        assert!(!p.page_pinned(2));
        assert!(p.defer_free(64));
        assert!(!p.unpin(64, &[64, (1 << 20) + 8]));
        assert!(p.unpin(64, &[64, (1 << 20) + 8]), "last unpin frees");
        assert!(!p.is_pinned(64) && !p.page_pinned(0));
        p.pin(128, &[128]);
        assert!(!p.unpin(128, &[128]), "never freed: nothing to do");
    }
}
