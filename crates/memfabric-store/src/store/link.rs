//! Linking items into the index and out of it, and freeing their chunks.
use std::sync::atomic::Ordering;

use crate::index::{self, KeyHash};
use crate::item::{self, HDR};
use crate::KEY_MAX_LEN;

use super::counters::Removal;
use super::state::Inner;

impl Inner {
    /// A reader met a dead item: remove it if its buckets are free right now.
    pub(super) fn reclaim_if_dead(&self, kh: &KeyHash, off: usize) {
        if !self.index.try_lock_pair(kh) {
            return;
        }
        let mut freed = None;
        if let Some((b, i)) = self.slot_pointing_at(kh, off) {
            let h = item::read_header(&self.arena, off);
            if h.state == item::LINKED && self.dead(&h, self.clock.now()).is_some() {
                self.unlink_at(b, i, off, Removal::Lookup);
                freed = Some(off);
            }
        }
        self.index.unlock_pair(kh);
        if let Some(off) = freed {
            self.free_item(off);
        }
    }

    fn slot_pointing_at(&self, kh: &KeyHash, off: usize) -> Option<(usize, usize)> {
        for b in [kh.b1, kh.b2] {
            for i in 0..index::SLOTS {
                if self.index.slot(b, i).is_some_and(|s| s.off == off) {
                    return Some((b, i));
                }
            }
        }
        None
    }

    /// Remove slot (b, i) which points at the live item `off` (bucket lock held). The
    /// caller frees the item afterwards.
    pub(super) fn unlink_at(&self, b: usize, i: usize, off: usize, why: Removal) {
        let h = item::read_header(&self.arena, off);
        // Evicted for space: the flash tier, if there is one and it takes the item, keeps
        // it, and the slot names it there instead.
        let to_flash = match why {
            Removal::Evicted | Removal::PageMove => self
                .index
                .slot(b, i)
                .and_then(|s| self.evict_to_flash(off, &h, s.tag)),
            _ => None,
        };
        self.index.set_raw_slot(b, i, to_flash.unwrap_or(0));
        item::set_state(&self.arena, off, item::UNLINKED);
        self.account(&h, -1);
        if to_flash.is_some() {
            return;
        }
        let k = &self.slabs.counters[h.class as usize];
        let fetched = h.iflags & item::F_FETCHED != 0;
        match why {
            Removal::Client | Removal::Lookup => {}
            Removal::Reclaimed => {
                self.c.reclaimed.fetch_add(1, Ordering::Relaxed);
                k.reclaimed.fetch_add(1, Ordering::Relaxed);
                if !fetched {
                    self.c.expired_unfetched.fetch_add(1, Ordering::Relaxed);
                    k.expired_unfetched.fetch_add(1, Ordering::Relaxed);
                }
            }
            Removal::Evicted | Removal::IndexFull | Removal::PageMove => {
                let now = self.clock.now();
                self.c.evictions.fetch_add(1, Ordering::Relaxed);
                k.evicted.fetch_add(1, Ordering::Relaxed);
                k.evicted_time.store(
                    now.saturating_sub(h.atime.max(h.time)) as u64,
                    Ordering::Relaxed,
                );
                if h.exptime != 0 {
                    k.evicted_nonzero.fetch_add(1, Ordering::Relaxed);
                }
                if !fetched {
                    self.c.evicted_unfetched.fetch_add(1, Ordering::Relaxed);
                    k.evicted_unfetched.fetch_add(1, Ordering::Relaxed);
                }
                if h.atime >= now.saturating_sub(60) && fetched {
                    self.c.evicted_active.fetch_add(1, Ordering::Relaxed);
                    k.evicted_active.fetch_add(1, Ordering::Relaxed);
                }
                match why {
                    Removal::IndexFull => {
                        self.c.index_evictions.fetch_add(1, Ordering::Relaxed);
                    }
                    Removal::PageMove => {
                        self.c
                            .slab_reassign_evictions
                            .fetch_add(1, Ordering::Relaxed);
                    }
                    _ => {}
                }
            }
        }
    }

    /// Link the filled item `off` into slot (b, i) (bucket lock held).
    pub(super) fn link_at(&self, b: usize, i: usize, off: usize, tag: u16, stored: bool) {
        let h = item::read_header(&self.arena, off);
        item::set_state(&self.arena, off, item::LINKED);
        let class = self.slabs.class_of(off);
        self.index
            .set_slot(b, i, Some(index::Slot { tag, class, off }));
        if stored {
            self.c.total_items.fetch_add(1, Ordering::Relaxed);
        }
        if h.exptime != 0 {
            self.slabs.note_due(off, h.exptime);
        }
        // A delayed flush_all kills this item when it comes: its page must be swept then,
        // even if the sweeper found the page empty (and so not due) before this link.
        let flush_time = self.index.flush_time().load(Ordering::Relaxed);
        if flush_time != 0 && h.time <= flush_time {
            self.slabs.note_due(off, flush_time);
        }
        self.queue_push(off, &h);
        self.account(&h, 1);
    }

    /// Remove the item at `off` if it is still linked (and, for the sweeper, still dead),
    /// waiting for its bucket locks. Call with no class lock held.
    pub(crate) fn remove_at_location(&self, off: usize, swept: bool) -> bool {
        let a = &self.arena;
        let Some(kh) = self.key_hash_at(off) else {
            return false;
        };
        self.index.lock_pair(&kh);
        let mut removed = false;
        if let Some((b, i)) = self.slot_pointing_at(&kh, off) {
            let h = item::read_header(a, off);
            if h.state == item::LINKED && (!swept || self.is_dead(&h, self.clock.now())) {
                self.unlink_at(
                    b,
                    i,
                    off,
                    if swept {
                        Removal::Reclaimed
                    } else {
                        Removal::PageMove
                    },
                );
                removed = true;
            }
        }
        self.index.unlock_pair(&kh);
        if removed {
            self.free_item(off);
        }
        removed
    }

    /// The value of an item as (arena offset, length) pieces in value order: one for a
    /// normal item (`chain` empty), one per chained chunk for a large one. Empty pieces
    /// are left out. The one place that knows how a value is spread over its chunks.
    pub(crate) fn value_segments<'a>(
        &self,
        head: usize,
        key_len: usize,
        value_len: usize,
        chain: &'a [usize],
    ) -> impl Iterator<Item = (usize, usize)> + 'a {
        let payload = self.slabs.max_chunk() - HDR;
        let single = chain
            .is_empty()
            .then(|| (item::value_off(head, key_len), value_len));
        let mut left = value_len;
        let chained = chain.iter().map(move |&c| {
            let take = left.min(payload);
            left -= take;
            (c + HDR, take)
        });
        single.into_iter().chain(chained).filter(|s| s.1 > 0)
    }

    /// Every chunk of an item: the head and its chain.
    pub(crate) fn item_chunks(&self, off: usize) -> Vec<usize> {
        let a = &self.arena;
        let mut v = vec![off];
        let h = item::read_header(a, off);
        if h.iflags & item::F_CHUNKED != 0 {
            let payload = self.slabs.max_chunk() - HDR;
            let n = (h.value_len as usize).div_ceil(payload);
            let table = item::chain_off(off, h.key_len as usize);
            for i in 0..n {
                v.push(a.u64_at(table + 8 * i).load(Ordering::Relaxed) as usize);
            }
        }
        v
    }

    /// Where the key of the item at `off` is indexed (None if the header is not an item's).
    fn key_hash_at(&self, off: usize) -> Option<KeyHash> {
        let klen = item::read_header(&self.arena, off).key_len as usize;
        // The chunk may have been reused (even re-carved) since the caller looked at it:
        // treat its header as untrusted.
        if klen == 0 || klen > KEY_MAX_LEN || item::key_off(off) + klen > self.arena.len() {
            return None;
        }
        let mut key = [0u8; KEY_MAX_LEN];
        self.arena.read(item::key_off(off), &mut key[..klen]);
        Some(self.index.hash(&key[..klen]))
    }

    /// Unlink the LINKED item at `off` if its buckets can be locked right now and still
    /// point at it. On success the item is UNLINKED and owned by the caller.
    pub(super) fn unlink_by_location(&self, off: usize, why: Removal) -> bool {
        let a = &self.arena;
        let Some(kh) = self.key_hash_at(off) else {
            return false;
        };
        if !self.index.try_lock_pair(&kh) {
            return false;
        }
        let ok = match self.slot_pointing_at(&kh, off) {
            Some((b, i)) if item::state(a, off) == item::LINKED => {
                self.unlink_at(b, i, off, why);
                true
            }
            _ => false,
        };
        self.index.unlock_pair(&kh);
        ok
    }

    /// Free an UNLINKED (or never linked) item and its chain. Takes class locks; call
    /// with no class lock held.
    /// A pinned item is not freed here: its last `PinnedItem` frees it (see `pins.rs`).
    pub(crate) fn free_item(&self, off: usize) {
        if self.pins.defer_free(off) {
            return;
        }
        for c in self.item_chunks(off) {
            self.free_chunk(c);
        }
    }

    pub(super) fn free_chunk(&self, off: usize) {
        let class = self.slabs.class_of(off);
        if class == 0 {
            return;
        }
        let mut st = self.slabs.lock(class);
        item::set_state(&self.arena, off, item::FREE);
        let page = self.slabs.page_of(off);
        if !self.slabs.page_draining[page].load(Ordering::Acquire) {
            st.free.push(off);
        }
    }
}
