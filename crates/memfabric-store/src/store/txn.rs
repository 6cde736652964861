//! Locked writes: `Store::transact` and the `Txn` it hands out (find, link, unlink and
//! modify one key under its bucket locks).
use std::sync::atomic::Ordering;

use crate::arena::Arena;
use crate::index::{self, KeyHash};
use crate::item;
use crate::KEY_MAX_LEN;

use super::counters::Removal;
use super::new_item::{NewItem, Owner};
use super::options::{AllocError, ItemInfo, LinkOptions};
use super::state::{Inner, Store};

impl Store {
    /// Run `f` with `key`'s index buckets locked against other writers (readers never
    /// wait). Keep `f` short; it may allocate. Inside `f`, use only the `Txn`: calling
    /// another locking `Store` method for the same key would deadlock.
    pub fn transact<'s, R>(&'s self, key: &[u8], f: impl FnOnce(&mut Txn<'s>) -> R) -> R {
        self.transact_with(key, true, f)
    }

    /// `transact` for a write that replaces the key whatever it holds (a plain SET):
    /// a copy of the key on flash is dropped unread instead of being brought back to
    /// RAM first (`Txn::item` then sees only a RAM item). Its slots are found by tag, so
    /// another key's flash item that shares the tag and buckets goes too (a miss later,
    /// never a wrong value; with 16-bit tags, rare).
    pub fn transact_replacing<'s, R>(&'s self, key: &[u8], f: impl FnOnce(&mut Txn<'s>) -> R) -> R {
        self.transact_with(key, false, f)
    }

    fn transact_with<'s, R>(
        &'s self,
        key: &[u8],
        promote: bool,
        f: impl FnOnce(&mut Txn<'s>) -> R,
    ) -> R {
        let inner: &Inner = &self.inner;
        let kh = inner.index.hash(key);
        let mut key_buf = [0u8; KEY_MAX_LEN];
        let key_len = key.len().min(KEY_MAX_LEN);
        key_buf[..key_len].copy_from_slice(&key[..key_len]);
        inner.index.lock_pair(&kh);
        let mut t = Txn {
            inner,
            key_buf,
            key_len,
            kh,
            cur: None,
            to_free: Vec::new(),
            flash_unloaded: None,
        };
        t.cur = t.find_live();
        if t.cur.is_none() && inner.flash.is_some() {
            if promote {
                t.promote_from_flash();
            } else {
                t.drop_flash_copies();
            }
        }
        let r = f(&mut t);
        inner.index.unlock_pair(&kh);
        let to_free = std::mem::take(&mut t.to_free);
        for off in to_free {
            inner.free_item(off);
        }
        r
    }
}

/// A new key stays in its first bucket while that has this many empty slots.
const FIRST_BUCKET_SPARE: usize = 3;

/// One key's buckets, locked for writing. See `Store::transact`.
pub struct Txn<'s> {
    inner: &'s Inner,
    key_buf: [u8; KEY_MAX_LEN],
    key_len: usize,
    kh: KeyHash,
    /// The live item: bucket, slot, offset.
    cur: Option<(usize, usize, usize)>,
    /// Items unlinked in this transaction, freed after the buckets are unlocked.
    to_free: Vec<usize>,
    /// The key's item is on flash and could not be brought back to RAM (no memory): the
    /// record's CAS value. The record stays where it is; `item` is None, but the key is
    /// not absent.
    flash_unloaded: Option<u64>,
}

impl<'s> Txn<'s> {
    /// Find the key's live item; a dead one found on the way is removed.
    fn find_live(&mut self) -> Option<(usize, usize, usize)> {
        let inner = self.inner;
        let a = &inner.arena;
        let now = inner.clock.now();
        for b in [self.kh.b1, self.kh.b2] {
            for i in 0..index::SLOTS {
                let Some(s) = inner.index.slot(b, i) else {
                    continue;
                };
                if s.tag != self.kh.tag || item::state(a, s.off) != item::LINKED {
                    continue;
                }
                let h = item::read_header(a, s.off);
                if h.key_len as usize != self.key_len || !a.eq(item::key_off(s.off), self.key()) {
                    continue;
                }
                if let Some(flushed) = inner.dead(&h, now) {
                    inner.count_dead_lookup(flushed);
                    inner.unlink_at(b, i, s.off, Removal::Lookup);
                    self.to_free.push(s.off);
                    return None;
                }
                return Some((b, i, s.off));
            }
        }
        None
    }

    pub fn key(&self) -> &[u8] {
        &self.key_buf[..self.key_len]
    }

    pub(super) fn inner(&self) -> &'s Inner {
        self.inner
    }

    pub(super) fn key_hash(&self) -> KeyHash {
        self.kh
    }

    /// Whether the key holds an item on flash that this transaction could not bring into
    /// RAM (no memory: eviction found nothing it could take). `item` is then None, but the
    /// item exists and stays on flash: `add` must not store over it. Linking a new item
    /// replaces it (its flash copies go), as for any item.
    pub fn held_on_flash(&self) -> bool {
        self.flash_unloaded.is_some()
    }

    /// The CAS value of the item `held_on_flash` names.
    pub fn held_on_flash_cas(&self) -> Option<u64> {
        self.flash_unloaded
    }

    pub(super) fn set_flash_unloaded(&mut self, cas: u64) {
        self.flash_unloaded = Some(cas);
    }

    /// Remove the item `held_on_flash` names (its flash copies). `false` if there is none.
    pub fn drop_held_on_flash(&mut self) -> bool {
        if self.flash_unloaded.take().is_none() {
            return false;
        }
        self.drop_flash_copies();
        true
    }

    /// Arena offset of the live item.
    pub(crate) fn current_off(&self) -> Option<usize> {
        self.cur.map(|(_, _, off)| off)
    }

    /// The live item under this key (expired and flushed items count as absent).
    pub fn item(&self) -> Option<ItemInfo> {
        let (_, _, off) = self.cur?;
        Some(self.inner.info(&item::read_header(&self.inner.arena, off)))
    }

    /// Call `f` with the live item's value as slices of item memory (no copy), valid for
    /// the call: the buckets stay locked, so nothing can change or free the item.
    pub fn with_value_slices<R>(&self, f: impl FnOnce(&[&[u8]]) -> R) -> Option<R> {
        let (_, _, off) = self.cur?;
        let h = item::read_header(&self.inner.arena, off);
        let chunks = self.inner.item_chunks(off);
        let a = &self.inner.arena;
        let slices: Vec<&[u8]> = self
            .inner
            .value_segments(off, h.key_len as usize, h.value_len as usize, &chunks[1..])
            .map(|(o, n)| a.stable_bytes(o, n))
            .collect();
        Some(f(&slices))
    }

    /// Append the live item's value to `out`.
    pub fn read_value(&self, out: &mut Vec<u8>) {
        let Some((_, _, off)) = self.cur else { return };
        let h = item::read_header(&self.inner.arena, off);
        let size = self.inner.slabs.classes[h.class as usize].size;
        // Under the bucket lock the item cannot change, so this cannot fail.
        let ok = self.inner.copy_value(off, &h, size, out);
        debug_assert!(ok);
    }

    /// Whether `value` (the live item's) is one `append` and `prepend` leave alone
    /// (`StoreConfig::sealed`).
    pub fn sealed(&self, value: &[u8]) -> bool {
        self.inner.cfg.sealed.is_some_and(|sealed| sealed(value))
    }

    /// Allocate an item for this key (see `Store::alloc`).
    pub fn alloc(
        &self,
        value_len: usize,
        flags: u32,
        exptime: u32,
    ) -> Result<NewItem<'s>, AllocError> {
        let inner = self.inner;
        inner.alloc_item(
            Owner::Borrowed(inner),
            self.key(),
            value_len,
            flags,
            exptime,
        )
    }

    /// Link `item`, replacing the current one. Returns its CAS.
    pub fn link(&mut self, item: NewItem<'s>, opts: LinkOptions) -> u64 {
        self.link_counted(item, opts, true)
    }

    /// `link`, counting the item in `total_items` only if `stored` (memcached counts
    /// stores; an `incr`/`decr` it does in place is not one).
    pub(crate) fn link_counted(
        &mut self,
        mut item: NewItem<'s>,
        opts: LinkOptions,
        stored: bool,
    ) -> u64 {
        // An item left on flash for want of memory is replaced like a RAM one: its flash
        // copies go, or a later lookup could find the old value.
        self.drop_held_on_flash();
        let inner = self.inner;
        let a = &inner.arena;
        let off = item.off;
        let cas = opts.explicit_cas.unwrap_or_else(|| inner.next_cas());
        let crc = item.checksum();
        a.u64_at(off + item::OFF_CAS).store(cas, Ordering::Relaxed);
        a.u32_at(off + item::OFF_TIME)
            .store(inner.clock.now(), Ordering::Relaxed);
        a.u32_at(off + item::OFF_CRC).store(crc, Ordering::Relaxed);
        let mut marks = 0;
        if opts.stale {
            marks |= item::F_STALE;
        }
        if opts.token_sent {
            marks |= item::F_TOKEN_SENT;
        }
        if opts.fetched {
            marks |= item::F_ACCESSED;
        }
        a.u8_at(off + item::OFF_IFLAGS)
            .fetch_or(marks, Ordering::Relaxed);
        item::seq_end(a, off);
        item.off = usize::MAX; // linked: no longer freed on drop
        let (b, i) = match self.cur.take() {
            Some((b, i, old)) => {
                inner.unlink_at(b, i, old, Removal::Client);
                self.to_free.push(old);
                (b, i)
            }
            None => self.free_slot(),
        };
        inner.link_at(b, i, off, self.kh.tag, stored);
        self.cur = Some((b, i, off));
        if inner.cfg.use_cas {
            cas
        } else {
            0
        }
    }

    /// An empty slot for a new key: in its first bucket while that has at least
    /// `FIRST_BUCKET_SPARE` empty slots (a lookup reads the first bucket first, so a hit
    /// there costs one bucket read), else in the emptier of the two (two choices keep
    /// the buckets even: see `index_power`). When both are full, the coldest occupant of
    /// the two buckets is evicted.
    fn free_slot(&mut self) -> (usize, usize) {
        let inner = self.inner;
        let empty = |b: usize| (0..index::SLOTS).filter(move |&i| inner.index.slot(b, i).is_none());
        let (b1, b2) = (self.kh.b1, self.kh.b2);
        let free1 = empty(b1).count();
        let b = if free1 < FIRST_BUCKET_SPARE && empty(b2).count() > free1 {
            b2
        } else {
            b1
        };
        // A slot that names a flash item counts as empty for RAM items (the flash copy
        // is the cheaper loss), but a truly empty one is taken first, in either bucket.
        let unused = |b: usize| (0..index::SLOTS).find(|&i| inner.index.raw_slot(b, i) == 0);
        let other = if b == b1 { b2 } else { b1 };
        let (b, unused) = match (unused(b), unused(other)) {
            (Some(i), _) => (b, Some(i)),
            (None, Some(i)) => (other, Some(i)),
            (None, None) => (b, None),
        };
        if let Some(i) = unused.or_else(|| empty(b).next()) {
            let raw = inner.index.raw_slot(b, i);
            if raw != 0 {
                inner.index.set_raw_slot(b, i, 0);
                inner.forget_flash_slot(raw);
                if let Some(f) = inner.flash.as_ref() {
                    f.c.index_drops.fetch_add(1, Ordering::Relaxed);
                }
            }
            return (b, i);
        }
        let a = &inner.arena;
        let mut best: Option<(usize, usize, usize, (bool, u32))> = None;
        for b in [self.kh.b1, self.kh.b2] {
            for i in 0..index::SLOTS {
                let Some(s) = inner.index.slot(b, i) else {
                    continue;
                };
                let h = item::read_header(a, s.off);
                let rank = (h.iflags & item::F_REFERENCED != 0, h.atime.max(h.time));
                if best.is_none_or(|x| rank < x.3) {
                    best = Some((b, i, s.off, rank));
                }
            }
        }
        let (b, i, off, _) = best.unwrap_or((self.kh.b1, 0, 0, (false, 0)));
        if let Some(s) = inner.index.slot(b, i) {
            let h = item::read_header(a, s.off);
            let why = if inner.dead(&h, inner.clock.now()).is_some() {
                Removal::Reclaimed
            } else {
                Removal::IndexFull
            };
            inner.unlink_at(b, i, off, why);
            self.to_free.push(off);
        }
        (b, i)
    }

    /// Remove the current item. Returns whether there was one.
    pub fn unlink(&mut self) -> bool {
        match self.cur.take() {
            Some((b, i, off)) => {
                self.inner.unlink_at(b, i, off, Removal::Client);
                self.to_free.push(off);
                true
            }
            None => false,
        }
    }

    /// Modify the live item's header in place inside its seqlock.
    fn modify(&mut self, f: impl FnOnce(&Arena, usize)) {
        let Some((_, _, off)) = self.cur else { return };
        let a = &self.inner.arena;
        item::seq_begin(a, off);
        f(a, off);
        item::seq_end(a, off);
    }

    /// Change the live item's exptime in place.
    pub fn set_exptime(&mut self, exptime: u32) {
        self.modify(|a, off| {
            a.u32_at(off + item::OFF_EXPTIME)
                .store(exptime, Ordering::Relaxed)
        });
        if let (Some((_, _, off)), true) = (self.cur, exptime != 0) {
            self.inner.slabs.note_due(off, exptime);
        }
    }

    /// Set or clear the meta-protocol stale / token-sent marks in place.
    pub fn set_marks(&mut self, stale: Option<bool>, token_sent: Option<bool>) {
        let Some((_, _, off)) = self.cur else { return };
        let f = self.inner.arena.u8_at(off + item::OFF_IFLAGS);
        for (want, bit) in [(stale, item::F_STALE), (token_sent, item::F_TOKEN_SENT)] {
            match want {
                Some(true) => {
                    f.fetch_or(bit, Ordering::Relaxed);
                }
                Some(false) => {
                    f.fetch_and(!bit, Ordering::Relaxed);
                }
                None => {}
            }
        }
    }

    /// Mark whether the live item's key was given base64-encoded (meta `b`).
    pub fn set_key_binary(&mut self, binary: bool) {
        let Some((_, _, off)) = self.cur else { return };
        let f = self.inner.arena.u8_at(off + item::OFF_IFLAGS);
        if binary {
            f.fetch_or(item::F_KEY_BINARY, Ordering::Relaxed);
        } else {
            f.fetch_and(!item::F_KEY_BINARY, Ordering::Relaxed);
        }
    }

    /// Give the live item a new CAS (fresh, or `explicit`). Returns it.
    pub fn bump_cas(&mut self, explicit: Option<u64>) -> u64 {
        if self.cur.is_none() {
            return 0;
        }
        let cas = explicit.unwrap_or_else(|| self.inner.next_cas());
        self.modify(|a, off| a.u64_at(off + item::OFF_CAS).store(cas, Ordering::Relaxed));
        // The queue entry names the item by its CAS: queue it again (at the back, as
        // memcached bumps an item it modifies).
        if let Some((_, _, off)) = self.cur {
            let h = item::read_header(&self.inner.arena, off);
            self.inner.queue_push(off, &h);
        }
        if self.inner.cfg.use_cas {
            cas
        } else {
            0
        }
    }

    /// Make the item recently used for eviction without counting a fetch.
    pub(crate) fn mark_referenced(&mut self) {
        if let Some((_, _, off)) = self.cur {
            self.inner
                .arena
                .u8_at(off + item::OFF_IFLAGS)
                .fetch_or(item::F_REFERENCED, Ordering::Relaxed);
        }
    }

    /// Record an access (fetched bit, last-access time).
    pub fn mark_fetched(&mut self) {
        if let Some((_, _, off)) = self.cur {
            self.inner.touch_access(off);
        }
    }
}
