//! Reads: the lock-free GET (optimistic copy, then seqlock and bucket-version validation)
//! and its locked fallback.
use std::sync::atomic::{fence, Ordering};

use crate::index::{self, KeyHash};
use crate::item::{self, Header, HDR};
use crate::KEY_MAX_LEN;

use super::options::{GetOptions, ItemInfo};
use super::state::{Inner, Store};

impl Store {
    /// Look up `key`. On a hit, calls `header(info, out)` (so the caller can write a reply
    /// header that needs the length) and then appends the value to `out`. A torn read is
    /// retried internally, truncating `out` back first, so `header` may run more than
    /// once. Returns the item's info as it was before this access (fetched / last-access).
    pub fn get_into(
        &self,
        key: &[u8],
        opts: &GetOptions,
        out: &mut Vec<u8>,
        mut header: impl FnMut(&ItemInfo, &mut Vec<u8>),
    ) -> Option<ItemInfo> {
        if key.is_empty() || key.len() > KEY_MAX_LEN {
            return None;
        }
        if opts.touch.is_some() {
            return self.get_locked(key, opts, out, header);
        }
        let start = out.len();
        let _guard = self.grace.enter();
        let kh = self.index.hash(key);
        for _ in 0..OPTIMISTIC_TRIES {
            match self.try_read(key, &kh, out, start, opts.copy_limit, &mut header) {
                ReadOutcome::Hit(info, off) => {
                    if opts.bump {
                        self.touch_access(off);
                    }
                    return Some(info);
                }
                ReadOutcome::Miss => return None,
                ReadOutcome::Dead(off, flushed) => {
                    self.count_dead_lookup(flushed);
                    self.reclaim_if_dead(&kh, off);
                    return None;
                }
                ReadOutcome::Retry => {
                    out.truncate(start);
                    std::hint::spin_loop();
                }
            }
        }
        // A key written continuously: read it under its lock instead of spinning forever.
        out.truncate(start);
        self.get_locked(key, opts, out, header)
    }

    /// A read under the key's bucket locks (touching reads, and reads that lost too many
    /// races with writers).
    fn get_locked(
        &self,
        key: &[u8],
        opts: &GetOptions,
        out: &mut Vec<u8>,
        mut header: impl FnMut(&ItemInfo, &mut Vec<u8>),
    ) -> Option<ItemInfo> {
        self.transact(key, |t| {
            let info = t.item()?;
            if let Some(exptime) = opts.touch {
                t.set_exptime(exptime);
            }
            header(&info, out);
            if info.value_len as usize <= opts.copy_limit {
                t.read_value(out);
            }
            if opts.bump {
                t.mark_fetched();
            }
            Some(info)
        })
    }

    /// A hit's value handed to `f` in place (slices of item memory, under the key's
    /// bucket locks for the duration of the call), for callers that copy it onward
    /// anyway (a network send): one copy fewer than `get_into`. Records no access.
    pub fn with_locked_value<R>(
        &self,
        key: &[u8],
        f: impl FnOnce(&ItemInfo, &[&[u8]]) -> R,
    ) -> Option<R> {
        if key.is_empty() || key.len() > KEY_MAX_LEN {
            return None;
        }
        self.transact(key, |t| {
            let info = t.item()?;
            t.with_value_slices(|s| f(&info, s))
        })
    }

    /// Start loading the memory a request for `key` will touch first: its first index
    /// bucket (where a new key goes while that bucket has room: `Txn::free_slot`; the
    /// second is read only for a miss, or at high load, and a prefetch that misses the
    /// TLB costs a page walk even when its line is never used). A worker that read
    /// several connections' requests calls this for each before executing any, so the
    /// cache misses of one overlap the work of the others (the index is sized for the
    /// store's worst case and much larger than the cache and the TLB's reach: its buckets
    /// are nearly always misses). Reads nothing. The hint it returns is for
    /// [`Store::prefetch_item`].
    pub fn prefetch(&self, key: &[u8]) -> Option<PrefetchHint> {
        if key.is_empty() || key.len() > KEY_MAX_LEN {
            return None;
        }
        let kh = self.index.hash(key);
        self.index.prefetch(&kh);
        Some(PrefetchHint(kh))
    }

    /// The second step of [`Store::prefetch`], once the first bucket is likely cached:
    /// start loading the header (and the key after it) of the item a slot there with the
    /// key's tag points at. A hint: slots are read without validation, and a wrong guess
    /// only costs a wasted load.
    pub fn prefetch_item(&self, hint: &PrefetchHint) {
        let kh = &hint.0;
        for i in 0..index::SLOTS {
            if let Some(slot) = self.index.slot(kh.b1, i).filter(|s| s.tag == kh.tag) {
                self.arena.prefetch(slot.off);
                self.arena.prefetch(slot.off + 64);
                return;
            }
        }
    }

    /// `get_into` without a header.
    pub fn get(&self, key: &[u8], opts: &GetOptions, out: &mut Vec<u8>) -> Option<ItemInfo> {
        self.get_into(key, opts, out, |_, _| {})
    }

    /// Metadata only (no value copy, no access recorded).
    pub fn peek(&self, key: &[u8]) -> Option<ItemInfo> {
        if key.is_empty() || key.len() > KEY_MAX_LEN {
            return None;
        }
        self.transact(key, |t| t.item())
    }
}

/// Where a key lives, from [`Store::prefetch`], so that its second step need not hash
/// the key again.
#[derive(Clone, Copy, Debug)]
pub struct PrefetchHint(KeyHash);

/// Bounded optimistic attempts before a read takes the key's lock.
const OPTIMISTIC_TRIES: usize = 64;

enum ReadOutcome {
    Hit(ItemInfo, usize),
    Miss,
    /// Found but expired or flushed (`true` = flushed).
    Dead(usize, bool),
    Retry,
}

impl Inner {
    /// Is an item with this header dead (expired or flushed) at `now`?
    pub(super) fn dead(&self, h: &Header, now: u32) -> Option<bool> {
        if h.exptime != 0 && h.exptime <= now {
            return Some(false);
        }
        let fc = self.index.flush_cas().load(Ordering::Relaxed);
        if fc != 0 && h.cas < fc {
            return Some(true);
        }
        let ft = self.index.flush_time().load(Ordering::Relaxed);
        if ft != 0 && ft <= now && h.time <= ft {
            return Some(true);
        }
        None
    }

    pub(super) fn info(&self, h: &Header) -> ItemInfo {
        ItemInfo {
            flags: h.flags,
            cas: if self.cfg.use_cas { h.cas } else { 0 },
            exptime: h.exptime,
            value_len: h.value_len,
            last_access: h.atime,
            time: h.time,
            fetched: h.iflags & item::F_FETCHED != 0,
            stale: h.iflags & item::F_STALE != 0,
            token_sent: h.iflags & item::F_TOKEN_SENT != 0,
            key_binary: h.iflags & item::F_KEY_BINARY != 0,
            class_id: h.class,
            chunked: h.iflags & item::F_CHUNKED != 0,
        }
    }

    /// One optimistic (lock-free) lookup. Never writes shared memory.
    fn try_read(
        &self,
        key: &[u8],
        kh: &KeyHash,
        out: &mut Vec<u8>,
        start: usize,
        copy_limit: usize,
        header: &mut impl FnMut(&ItemInfo, &mut Vec<u8>),
    ) -> ReadOutcome {
        let a = &self.arena;
        for b in [kh.b1, kh.b2] {
            let v = self.index.read_begin(b);
            for i in 0..index::SLOTS {
                let Some(slot) = self.index.slot(b, i) else {
                    continue;
                };
                if slot.tag != kh.tag {
                    continue;
                }
                let off = slot.off;
                let Some(cls) = self.slabs.classes.get(slot.class as usize).copied() else {
                    return ReadOutcome::Retry;
                };
                if !off.is_multiple_of(8) || off.saturating_add(cls.size) > a.len() {
                    return ReadOutcome::Retry;
                }
                let h = item::read_header(a, off);
                if h.seq & 1 == 1 || h.state != item::LINKED {
                    return ReadOutcome::Retry;
                }
                if h.key_len as usize != key.len() || !a.eq(item::key_off(off), key) {
                    // A tag collision, or the slot changed under us: re-check the bucket.
                    if !self.index.read_validate(b, v) {
                        return ReadOutcome::Retry;
                    }
                    continue;
                }
                let now = self.clock.now();
                if let Some(flushed) = self.dead(&h, now) {
                    if !self.validate(off, h.seq, b, v) {
                        return ReadOutcome::Retry;
                    }
                    return ReadOutcome::Dead(off, flushed);
                }
                let info = self.info(&h);
                out.truncate(start);
                header(&info, out);
                let copied =
                    h.value_len as usize > copy_limit || self.copy_value(off, &h, cls.size, out);
                if !copied || !self.validate(off, h.seq, b, v) {
                    return ReadOutcome::Retry;
                }
                return ReadOutcome::Hit(info, off);
            }
            if !self.index.read_validate(b, v) {
                return ReadOutcome::Retry;
            }
        }
        ReadOutcome::Miss
    }

    pub(super) fn validate(&self, off: usize, seq: u32, b: usize, v: u32) -> bool {
        fence(Ordering::Acquire);
        self.arena
            .u32_at(off + item::OFF_SEQ)
            .load(Ordering::Relaxed)
            == seq
            && self.index.read_validate(b, v)
    }

    /// Copy an item's value (possibly chained) into `out` without trusting the header:
    /// every length and offset is bounds-checked; `false` means "inconsistent, retry".
    pub(super) fn copy_value(
        &self,
        off: usize,
        h: &Header,
        chunk_size: usize,
        out: &mut Vec<u8>,
    ) -> bool {
        let a = &self.arena;
        let klen = h.key_len as usize;
        let vlen = h.value_len as usize;
        if h.iflags & item::F_CHUNKED == 0 {
            if HDR + klen + vlen > chunk_size {
                return false;
            }
            a.read_into(item::value_off(off, klen), vlen, out);
            return true;
        }
        let payload = self.slabs.max_chunk() - HDR;
        let n = vlen.div_ceil(payload);
        let table = item::chain_off(off, klen);
        if vlen > self.cfg.item_size_max.max(payload) || table + 8 * n > off + chunk_size {
            return false;
        }
        let mut left = vlen;
        for i in 0..n {
            let c = a.u64_at(table + 8 * i).load(Ordering::Relaxed) as usize;
            let take = left.min(payload);
            if !c.is_multiple_of(8) || c.saturating_add(HDR + take) > a.len() {
                return false;
            }
            a.read_into(c + HDR, take, out);
            left -= take;
        }
        true
    }

    /// Whether `touch_access(off)` would write nothing: fetched, active and referenced,
    /// its access time within `ACCESS_UPDATE_INTERVAL`. Only reads.
    pub(super) fn access_already_noted(&self, off: usize) -> bool {
        let all = item::F_ACCESSED | item::F_ACTIVE;
        let at = self
            .arena
            .u32_at(off + item::OFF_ATIME)
            .load(Ordering::Relaxed);
        self.arena
            .u8_at(off + item::OFF_IFLAGS)
            .load(Ordering::Relaxed)
            & all
            == all
            && at.saturating_add(item::ACCESS_UPDATE_INTERVAL) > self.clock.now()
    }

    /// Record an access as memcached's fetch bumps an item: the first sets the fetched
    /// bit only, and leaves the last-access time at the item's store; the second makes
    /// it active and moves the time to now; later ones move it only once it is
    /// `ACCESS_UPDATE_INTERVAL` old (memcached's ITEM_UPDATE_INTERVAL, at which its LRU
    /// maintainer bumps active items again), so `mg ... l`, `me`'s `la=` and metadump's
    /// `la=` report what memcached's do, and eviction still tells a key hot for an hour
    /// from one hot an hour ago. Every access also marks it referenced (a second chance
    /// in the eviction queue, which clears it and ACTIVE). Writes only atomic words that
    /// no validation depends on.
    pub(super) fn touch_access(&self, off: usize) {
        let f = self.arena.u8_at(off + item::OFF_IFLAGS);
        let flags = f.load(Ordering::Relaxed);
        if flags & item::F_FETCHED == 0 {
            f.fetch_or(item::F_ACCESSED, Ordering::Relaxed);
            return;
        }
        let now = self.clock.now();
        let at = self.arena.u32_at(off + item::OFF_ATIME);
        if flags & item::F_ACTIVE == 0 {
            f.fetch_or(item::F_ACTIVE | item::F_REFERENCED, Ordering::Relaxed);
            at.store(now, Ordering::Relaxed);
            return;
        }
        if flags & item::F_REFERENCED == 0 {
            f.fetch_or(item::F_REFERENCED, Ordering::Relaxed);
        }
        if at
            .load(Ordering::Relaxed)
            .saturating_add(item::ACCESS_UPDATE_INTERVAL)
            <= now
        {
            at.store(now, Ordering::Relaxed);
        }
    }
}
