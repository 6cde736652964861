//! Counting: the counters updated as items are linked, removed and found dead, and the
//! statistics (`stats`, `stats slabs`, `stats items`) built from them.
use std::sync::atomic::{AtomicU64, Ordering};

use crate::item::{self, Header, HDR};
use crate::stats::{ItemClassStats, SlabClassStats, StoreStats};

use super::state::{Inner, Store};

impl Store {
    pub fn stats(&self) -> StoreStats {
        let c = &self.c;
        let r = |a: &AtomicU64| a.load(Ordering::Relaxed);
        StoreStats {
            curr_items: c.curr_items.load(Ordering::Relaxed).max(0) as u64,
            total_items: r(&c.total_items),
            bytes: c.bytes.load(Ordering::Relaxed).max(0) as u64,
            evictions: r(&c.evictions),
            reclaimed: r(&c.reclaimed),
            expired_unfetched: r(&c.expired_unfetched),
            evicted_unfetched: r(&c.evicted_unfetched),
            evicted_active: r(&c.evicted_active),
            get_expired: r(&c.get_expired),
            get_flushed: r(&c.get_flushed),
            limit_maxbytes: (self.slabs.limit_pages.load(Ordering::Relaxed) * self.slabs.page_size)
                as u64,
            total_malloced: self.slabs.pages_used.load(Ordering::Relaxed)
                * self.slabs.page_size as u64,
            slabs_moved: r(&c.slabs_moved),
            slab_reassign_evictions: r(&c.slab_reassign_evictions),
            crawler_reclaimed: r(&c.crawler_reclaimed),
            hash_power_level: self.index.power(),
            hash_bytes: self.index.bytes() as u64,
            outofmemory: r(&c.outofmemory),
            index_evictions: r(&c.index_evictions),
            malloc_fails: 0,
            remote_hints: r(&c.remote_hints),
            remote_hints_rejected: r(&c.remote_hints_rejected),
            maintainer_juggles: r(&c.maintainer_juggles),
        }
    }

    pub fn slab_stats(&self) -> Vec<SlabClassStats> {
        let mut v = Vec::new();
        for ci in &self.slabs.classes[1..] {
            let st = self.slabs.lock(ci.id);
            if st.pages.is_empty() {
                continue;
            }
            let total = (st.pages.len() * ci.per_page) as u64;
            let free = st.free.len() as u64;
            v.push(SlabClassStats {
                id: ci.id,
                chunk_size: ci.size as u32,
                chunks_per_page: ci.per_page as u32,
                total_pages: st.pages.len() as u64,
                total_chunks: total,
                used_chunks: total - free.min(total),
                free_chunks: free,
                mem_requested: self.slabs.counters[ci.id as usize]
                    .requested
                    .load(Ordering::Relaxed),
            });
        }
        v
    }

    pub fn item_stats(&self) -> Vec<ItemClassStats> {
        let now = self.clock.now();
        let mut v = Vec::new();
        for ci in &self.slabs.classes[1..] {
            let k = &self.slabs.counters[ci.id as usize];
            let number = k.items.load(Ordering::Relaxed);
            let r = |a: &AtomicU64| a.load(Ordering::Relaxed);
            if number == 0 && r(&k.evicted) == 0 && r(&k.outofmemory) == 0 {
                continue;
            }
            v.push(ItemClassStats {
                id: ci.id,
                number,
                age: self.oldest_age(ci.id, now),
                evicted: r(&k.evicted),
                evicted_nonzero: r(&k.evicted_nonzero),
                evicted_time: r(&k.evicted_time),
                outofmemory: r(&k.outofmemory),
                reclaimed: r(&k.reclaimed),
                expired_unfetched: r(&k.expired_unfetched),
                evicted_unfetched: r(&k.evicted_unfetched),
                evicted_active: r(&k.evicted_active),
                crawler_reclaimed: r(&k.crawler_reclaimed),
            });
        }
        v
    }
}

impl Inner {
    /// A lookup of a key found its item dead (memcached's `do_item_get` counts this for
    /// every command that looks a key up, stores included).
    pub(super) fn count_dead_lookup(&self, flushed: bool) {
        let c = if flushed {
            &self.c.get_flushed
        } else {
            &self.c.get_expired
        };
        c.fetch_add(1, Ordering::Relaxed);
    }

    /// Bytes an item occupies in memory (memcached's "bytes" counts item totals).
    fn item_total(&self, h: &Header) -> usize {
        if h.iflags & item::F_CHUNKED != 0 {
            let payload = self.slabs.max_chunk() - HDR;
            let n = (h.value_len as usize).div_ceil(payload);
            (HDR + h.key_len as usize).next_multiple_of(8) + 8 * n + h.value_len as usize
        } else {
            HDR + h.key_len as usize + h.value_len as usize
        }
    }

    /// Item and byte counts, store-wide and per class, for an item entering (+1) or
    /// leaving (-1) the index.
    pub(super) fn account(&self, h: &Header, sign: i64) {
        let total = self.item_total(h) as i64;
        self.c.curr_items.fetch_add(sign, Ordering::Relaxed);
        self.c.bytes.fetch_add(sign * total, Ordering::Relaxed);
        let k = &self.slabs.counters[h.class as usize];
        k.items.fetch_add(sign as u64, Ordering::Relaxed);
        k.requested
            .fetch_add((sign * total) as u64, Ordering::Relaxed);
    }

    // ----- allocation ---------------------------------------------------------------

    pub(crate) fn count_page_move(&self) {
        self.c.slabs_moved.fetch_add(1, Ordering::Relaxed);
    }
}
