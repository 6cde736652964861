//! Allocation and eviction: sizing an item, taking a chunk (free list, fresh page, eviction
//! from its class queue), carving pages, and the class queues.
use std::collections::VecDeque;
use std::sync::atomic::Ordering;

use crate::item::{self, Header, HDR};
use crate::slab::{ClassInfo, ClassState, QueueEntry};
use crate::KEY_MAX_LEN;

use super::counters::Removal;
use super::new_item::{NewItem, Owner};
use super::options::AllocError;
use super::state::{Inner, Store};

impl Store {
    /// Would memcached 1.6 reject an item of this shape as "object too large for cache"?
    pub fn too_large(&self, key_len: usize, value_len: usize, flags: u32) -> bool {
        self.inner.too_large(key_len, value_len, flags)
    }

    /// The size memcached 1.6 gives an item of this shape (meta `me` prints it, and the
    /// `-I` limit is checked against it).
    pub fn memcached_item_size(&self, key_len: usize, value_len: usize, flags: u32) -> usize {
        self.inner.memcached_item_size(key_len, value_len, flags)
    }

    /// The slab class a new item of this shape is allocated in (None if none holds it).
    /// memcached counts a storage command's `cmd_set` against the class of the item
    /// holding the request's data, whatever the command then does with it.
    pub fn item_class(&self, key_len: usize, value_len: usize) -> Option<u8> {
        let inner: &Inner = &self.inner;
        let max_chunk = inner.slabs.max_chunk();
        // The same layout as `alloc_item`: a value too large for one chunk is chained
        // and its head holds the key and the chain table.
        let head_size = if HDR + key_len + value_len > max_chunk {
            let nchain = value_len.div_ceil(max_chunk.checked_sub(HDR)?.max(1));
            (HDR + key_len).next_multiple_of(8) + 8 * nchain
        } else {
            HDR + key_len + value_len
        };
        inner.slabs.class_for(head_size)
    }

    /// Allocate an unlinked item for `key` with room for `value_len` bytes. Fill it with
    /// `NewItem::write`, then `Txn::link` it (or drop it to free it).
    pub fn alloc(
        &self,
        key: &[u8],
        value_len: usize,
        flags: u32,
        exptime: u32,
    ) -> Result<NewItem<'_>, AllocError> {
        let inner: &Inner = &self.inner;
        inner.alloc_item(Owner::Borrowed(inner), key, value_len, flags, exptime)
    }
}

impl Inner {
    /// Would memcached 1.6 call this item too large? Its header, key + NUL, value + CRLF,
    /// the flags suffix and the CAS field count against `-I`; matching that exactly keeps
    /// the too-large boundary identical for clients.
    pub(crate) fn too_large(&self, key_len: usize, value_len: usize, flags: u32) -> bool {
        self.memcached_item_size(key_len, value_len, flags) > self.cfg.item_size_max
    }

    fn memcached_item_size(&self, key_len: usize, value_len: usize, flags: u32) -> usize {
        48 + key_len
            + 1
            + if flags != 0 { 4 } else { 0 }
            + value_len.saturating_add(2)
            + if self.cfg.use_cas { 8 } else { 0 }
    }

    /// Allocate an item owned by `owner`, which must be (or point at) `self`.
    pub(crate) fn alloc_item<'s>(
        &self,
        owner: Owner<'s>,
        key: &[u8],
        value_len: usize,
        flags: u32,
        exptime: u32,
    ) -> Result<NewItem<'s>, AllocError> {
        debug_assert!(std::ptr::eq(&*owner, self));
        if key.is_empty() || key.len() > KEY_MAX_LEN || value_len > u32::MAX as usize - 8 {
            return Err(AllocError::TooLarge);
        }
        if self.too_large(key.len(), value_len, flags) {
            return Err(AllocError::TooLarge);
        }
        let klen = key.len();
        let max_chunk = self.slabs.max_chunk();
        let chunked = HDR + klen + value_len > max_chunk;
        let payload = max_chunk - HDR;
        let nchain = if chunked {
            value_len.div_ceil(payload)
        } else {
            0
        };
        let head_size = if chunked {
            (HDR + klen).next_multiple_of(8) + 8 * nchain
        } else {
            HDR + klen + value_len
        };
        let class = self
            .slabs
            .class_for(head_size)
            .ok_or(AllocError::TooLarge)?;
        let head = self.alloc_chunk(class)?;
        let mut it = NewItem {
            owner,
            off: head,
            chain: Vec::new(),
            value_len,
            key_len: klen,
            crc_progress: None,
        };
        let a = &self.arena;
        item::write_fields(
            a,
            head,
            &Header {
                class,
                key_len: klen as u8,
                value_len: value_len as u32,
                flags,
                exptime,
                ..Header::default()
            },
        );
        a.u8_at(head + item::OFF_IFLAGS)
            .store(if chunked { item::F_CHUNKED } else { 0 }, Ordering::Relaxed);
        a.u32_at(head + item::OFF_ATIME)
            .store(self.clock.now(), Ordering::Relaxed);
        a.write(item::key_off(head), key);
        if chunked {
            let table = item::chain_off(head, klen);
            let mut left = value_len;
            for i in 0..nchain {
                let take = left.min(payload);
                let cls = self
                    .slabs
                    .class_for(HDR + take)
                    .ok_or(AllocError::TooLarge)?;
                // On failure `it` drops and frees what was taken so far.
                let c = self.alloc_chunk(cls)?;
                it.chain.push(c);
                item::write_fields(
                    a,
                    c,
                    &Header {
                        class: cls,
                        value_len: take as u32,
                        cas: head as u64,
                        ..Header::default()
                    },
                );
                a.u8_at(c + item::OFF_IFLAGS).store(0, Ordering::Relaxed);
                item::set_state(a, c, item::CHAINED);
                item::seq_end(a, c);
                a.u64_at(table + 8 * i).store(c as u64, Ordering::Relaxed);
                left -= take;
            }
        }
        Ok(it)
    }

    /// Take a chunk of `class`: free list, then a fresh page, then eviction. The chunk is
    /// returned ALLOCATED with an odd seq (readers holding a stale pointer to it retry).
    fn alloc_chunk(&self, class: u8) -> Result<usize, AllocError> {
        let ci = self.slabs.classes[class as usize];
        let mut deferred = Vec::new();
        let got = {
            let mut st = self.slabs.lock(class);
            let mut got = st.free.pop();
            if got.is_none() {
                if let Some(page) = self.slabs.take_page(!st.pages.is_empty()) {
                    self.carve(&ci, &mut st, page);
                    got = st.free.pop();
                }
            }
            if got.is_none() && self.cfg.evict {
                got = self.evict_one(&ci, &mut st, &mut deferred);
            }
            if let Some(off) = got {
                item::set_state(&self.arena, off, item::ALLOCATED);
                item::seq_begin(&self.arena, off);
            }
            got
        };
        for off in deferred {
            self.free_chunk(off);
        }
        match got {
            Some(off) => Ok(off),
            None => {
                self.c.outofmemory.fetch_add(1, Ordering::Relaxed);
                self.slabs.counters[class as usize]
                    .outofmemory
                    .fetch_add(1, Ordering::Relaxed);
                self.wake_maintenance();
                Err(AllocError::OutOfMemory)
            }
        }
    }

    pub(crate) fn carve_page(&self, ci: &ClassInfo, st: &mut ClassState, page: u32) {
        self.carve(ci, st, page)
    }

    /// Give `page` to a class: mark every chunk boundary FREE and push the chunks.
    fn carve(&self, ci: &ClassInfo, st: &mut ClassState, page: u32) {
        for i in (0..ci.per_page).rev() {
            let off = self.slabs.chunk_off(ci, page, i);
            item::set_state(&self.arena, off, item::FREE);
            let s = self.arena.u32_at(off + item::OFF_SEQ);
            let v = s.load(Ordering::Relaxed);
            s.store(v.wrapping_add(v & 1), Ordering::Relaxed);
            st.free.push(off);
        }
        self.slabs.page_draining[page as usize].store(false, Ordering::Relaxed);
        self.slabs.page_class[page as usize].store(ci.id, Ordering::Release);
        st.pages.push(page);
    }

    /// Evict from the front of the class's queue (class lock held): skip stale entries,
    /// give an item read since it was queued a second chance (back of the queue, bit
    /// cleared), reclaim a dead item, evict the first cold one. Buckets are only
    /// try-locked here, so a thread that holds a bucket lock and allocates can never
    /// deadlock with an evictor. Chunks of other classes freed on the way go to
    /// `deferred`.
    fn evict_one(
        &self,
        ci: &ClassInfo,
        st: &mut ClassState,
        deferred: &mut Vec<usize>,
    ) -> Option<usize> {
        let a = &self.arena;
        let now = self.clock.now();
        // Every entry at most twice (once more after a second chance), then give up:
        // with everything pinned or locked the allocation fails instead of spinning.
        for _ in 0..2 * st.queue.len() + 2 {
            let e = st.pop_entry()?;
            let Some((victim, h)) = self.queued_item(ci, e) else {
                continue;
            };
            let off = e.off();
            let dead = self.dead(&h, now).is_some();
            if !dead && h.iflags & item::F_REFERENCED != 0 {
                // Its second chance; the next fetch after it moves its access time again.
                a.u8_at(victim + item::OFF_IFLAGS)
                    .fetch_and(!(item::F_REFERENCED | item::F_ACTIVE), Ordering::Relaxed);
                st.queue.push_back(e);
                continue;
            }
            let why = if dead {
                Removal::Reclaimed
            } else {
                Removal::Evicted
            };
            // A pinned item is being sent from: leave it (and its memory) alone.
            if self.pins.is_pinned(victim) || !self.unlink_by_location(victim, why) {
                st.queue.push_back(e);
                continue;
            }
            // Pinned between the check and the unlink: its last unpin frees it.
            if self.pins.defer_free(victim) {
                continue;
            }
            // The victim and its chain are ours now. Chunks of this class are reused or
            // pushed here (we hold its lock); others are freed by the caller.
            let mut mine = None;
            for c in self.item_chunks(victim) {
                if self.slabs.class_of(c) == ci.id {
                    item::set_state(a, c, item::FREE);
                    if c == off && mine.is_none() {
                        mine = Some(c);
                    } else {
                        st.free.push(c);
                    }
                } else {
                    deferred.push(c);
                }
            }
            if let Some(c) = mine {
                return Some(c);
            }
            if let Some(c) = st.free.pop() {
                return Some(c);
            }
        }
        None
    }

    /// The linked item a queue entry of class `ci` names, with its head's header, or
    /// None if the entry is stale (chunk freed, reused, re-carved; item replaced).
    pub(super) fn queued_item(&self, ci: &ClassInfo, e: QueueEntry) -> Option<(usize, Header)> {
        let a = &self.arena;
        let off = e.off();
        if off >= a.len()
            || self.slabs.class_of(off) != ci.id
            || !(off % self.slabs.page_size).is_multiple_of(ci.size)
        {
            return None;
        }
        let head = match item::state(a, off) {
            item::LINKED => off,
            // Part of a large item: the entry stands for the item that owns it.
            item::CHAINED => {
                let head = a.u64_at(off + item::OFF_CAS).load(Ordering::Relaxed) as usize;
                if !head.is_multiple_of(8)
                    || head + HDR > a.len()
                    || item::state(a, head) != item::LINKED
                {
                    return None;
                }
                head
            }
            _ => return None,
        };
        let h = item::read_header(a, head);
        (e.cas_matches(h.cas) && (head != off || h.class == ci.id)).then_some((head, h))
    }

    /// Queue a just-linked (or re-CASed) item for eviction: its head in the head's
    /// class, and for a chained item its first chunk in each class of its chain. Takes
    /// class locks (bucket lock -> class lock is the allowed order).
    pub(super) fn queue_push(&self, head: usize, h: &Header) {
        if h.iflags & item::F_CHUNKED == 0 {
            // The common case: one chunk, no chain table to read (and no Vec per SET).
            let class = self.slabs.class_of(head);
            if class != 0 {
                self.slabs
                    .lock(class)
                    .queue
                    .push_back(QueueEntry::new(head, h.cas));
            }
            return;
        }
        let mut done: [u8; 3] = [0; 3];
        for c in self.item_chunks(head) {
            let class = self.slabs.class_of(c);
            if class == 0 || done.contains(&class) {
                continue;
            }
            if let Some(slot) = done.iter_mut().find(|d| **d == 0) {
                *slot = class;
            }
            self.slabs
                .lock(class)
                .queue
                .push_back(QueueEntry::new(c, h.cas));
        }
    }

    /// Drop the stale entries of every class queue past its threshold (maintenance
    /// thread). The checks run without the class lock, on a copy: writers and evictors
    /// go on meanwhile, and since they only pop the front and push the back, the queue
    /// afterwards is the copy minus what was popped, then what was pushed. (An entry
    /// once stale stays stale: its chunk's item was unlinked or re-CASed, and a newer
    /// entry names whatever the chunk holds now.) `force`: every queue, past its
    /// threshold or not. Returns the entries dropped.
    pub(crate) fn compact_queues(&self, force: bool) -> usize {
        // One compaction at a time: a second one would reconcile against a queue whose
        // middle the first has changed.
        let _one = self.compacting.lock().unwrap_or_else(|e| e.into_inner());
        let mut dropped = 0;
        for ci in &self.slabs.classes[1..] {
            let (copy, popped) = {
                let st = self.slabs.lock(ci.id);
                if st.queue.is_empty()
                    || (!force && st.queue.len() < st.compact_threshold(ci.per_page))
                {
                    continue;
                }
                (st.queue.iter().copied().collect::<Vec<_>>(), st.popped)
            };
            let live: Vec<bool> = copy
                .iter()
                .map(|&e| self.queued_item(ci, e).is_some())
                .collect();
            let mut st = self.slabs.lock(ci.id);
            let gone = ((st.popped - popped) as usize).min(copy.len());
            let newer = st.queue.split_off(copy.len() - gone);
            let mut queue: VecDeque<QueueEntry> = copy[gone..]
                .iter()
                .zip(&live[gone..])
                .filter_map(|(&e, &ok)| ok.then_some(e))
                .collect();
            dropped += copy.len() - gone - queue.len();
            st.kept = queue.len();
            queue.extend(newer);
            st.queue = queue;
        }
        dropped
    }

    pub(super) fn oldest_age(&self, class: u8, now: u32) -> u64 {
        // The first current entries of the queue: the next eviction candidates.
        let ci = self.slabs.classes[class as usize];
        let st = self.slabs.lock(class);
        let oldest = st
            .queue
            .iter()
            .take(64)
            .filter_map(|&e| self.queued_item(&ci, e))
            .map(|(_, h)| h.atime.max(h.time))
            .min()
            .unwrap_or(now);
        now.saturating_sub(oldest) as u64
    }
}
