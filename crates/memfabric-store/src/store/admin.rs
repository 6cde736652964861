//! Whole-store commands: `flush_all`, reclaiming dead items, `cache_memlimit`, `slabs
//! reassign` and `stats cachedump`.
use std::sync::atomic::Ordering;

use crate::item;

use super::options::ReassignStatus;
use super::state::Store;

impl Store {
    /// Invalidate every item stored up to now (`at` = None) or up to absolute time `at`.
    /// Both words live in the index's control block, where remote readers see them.
    pub fn flush_all(&self, at: Option<u32>) {
        let now = self.clock.now();
        self.refresh_remote_clock(now);
        match at {
            Some(t) if t > now => {
                // memcached: items stored before the flush time die when it comes.
                self.index.flush_time().store(t - 1, Ordering::SeqCst);
                self.slabs.all_due(t - 1);
            }
            _ => {
                let c = self.next_cas.fetch_add(1, Ordering::SeqCst) + 1;
                self.index.flush_cas().store(c, Ordering::SeqCst);
                self.index.flush_time().store(0, Ordering::SeqCst);
                self.slabs.all_due(now);
                // Reclaim at once, as memcached's LRU maintainer does (within a second).
                self.wake_maintenance();
            }
        }
    }

    /// Reclaim every dead (expired or flushed) item now, as the maintenance thread does
    /// in the background within a tick of their death (memcached's LRU maintainer does
    /// the same within about a second). Returns how many items it removed; they count
    /// as `reclaimed` (and `expired_unfetched` if never fetched).
    pub fn reclaim_dead(&self) -> usize {
        self.inner.sweep_due(usize::MAX).0
    }

    /// `cache_memlimit`: change the memory limit at run time. Growing is possible up to
    /// twice the limit the store started with (the arena's reserved address space);
    /// shrinking stops new pages from being taken (pages in use stay). Returns false
    /// when the new limit does not fit.
    pub fn set_memory_limit(&self, bytes: usize) -> bool {
        let pages = bytes.div_ceil(self.slabs.page_size).max(2);
        if pages > self.slabs.max_limit_pages {
            return false;
        }
        self.slabs.limit_pages.store(pages, Ordering::Relaxed);
        true
    }

    /// `slabs reassign <src> <dst>`: move one page from class `src` (-1 = any class with
    /// a spare page) to class `dst` (0 = the unassigned pool), evicting its items.
    pub fn slabs_reassign(&self, src: i32, dst: i32) -> ReassignStatus {
        let largest = (self.slabs.classes.len() - 1) as i32;
        if src == dst {
            return ReassignStatus::Same;
        }
        let src = if src == -1 {
            // The class with the most pages, as memcached's "pick any" prefers a donor
            // that can spare one.
            (1..=largest)
                .filter(|&c| c != dst)
                .max_by_key(|&c| self.slabs.lock(c as u8).pages.len())
                .unwrap_or(-1)
        } else {
            src
        };
        if !(1..=largest).contains(&src) || !(0..=largest).contains(&dst) {
            return ReassignStatus::BadClass;
        }
        if self.slabs.lock(src as u8).pages.len() < 2 {
            return ReassignStatus::NoSpare;
        }
        let _one_at_a_time = match self.reassigning.try_lock() {
            Ok(g) => g,
            Err(_) => return ReassignStatus::Busy,
        };
        if self.inner.move_page(src as u8, dst as u8) {
            ReassignStatus::Ok
        } else {
            ReassignStatus::Busy
        }
    }

    /// `stats cachedump <class> <limit>`: up to `limit` live items of a class (0 = as
    /// many as fit in 2 MB of output, like memcached), as (key, value length, exptime).
    pub fn cachedump(&self, class: u8, limit: usize) -> Vec<(Vec<u8>, u32, u32)> {
        let Some(ci) = self.slabs.classes.get(class as usize).copied() else {
            return Vec::new();
        };
        if class == 0 {
            return Vec::new();
        }
        let now = self.clock.now();
        let st = self.slabs.lock(class);
        let mut v = Vec::new();
        let mut bytes = 0;
        'pages: for &p in &st.pages {
            for i in 0..ci.per_page {
                let off = self.slabs.chunk_off(&ci, p, i);
                if item::state(&self.arena, off) != item::LINKED {
                    continue;
                }
                let h = item::read_header(&self.arena, off);
                if self.dead(&h, now).is_some() {
                    continue;
                }
                let mut key = vec![0u8; h.key_len as usize];
                self.arena.read(item::key_off(off), &mut key);
                bytes += key.len() + 40;
                v.push((key, h.value_len, h.exptime));
                if (limit != 0 && v.len() >= limit) || bytes > (2 << 20) - 1024 {
                    break 'pages;
                }
            }
        }
        v
    }
}
