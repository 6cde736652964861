//! What one-sided (RMA) readers see and tell: the control block and its clock, item
//! locations, and their access hints.
use std::sync::atomic::Ordering;

use crate::index;
use crate::item::{self, HDR};
use crate::KEY_MAX_LEN;

use super::grace::GraceGuard;
use super::state::{Inner, Store};

impl Store {
    /// The xxh3-64 seed of the index hash (also in the control block).
    pub fn hash_seed(&self) -> u64 {
        self.index.seed()
    }

    /// A copy of the index's control block (`remote` describes the layout), read field
    /// by field with atomic loads.
    pub fn control_block(&self) -> Vec<u8> {
        self.index.control_block()
    }

    /// Arena offset and header `seq` of `key`'s live item, as a one-sided reader would
    /// find them (tests and diagnostics; takes the key's bucket locks).
    pub fn item_location(&self, key: &[u8]) -> Option<(u64, u32)> {
        if key.is_empty() || key.len() > KEY_MAX_LEN {
            return None;
        }
        let a = &self.arena;
        self.transact(key, |t| {
            let off = t.current_off()?;
            Some((off as u64, item::read_header(a, off).seq))
        })
    }

    /// A remote reader read the item at arena offset `off` whose header seq was `seq`.
    /// Marks it referenced/fetched and bumps its atime exactly like a local GET does, if
    /// and only if `off` is the start of a chunk of a carved page (page's class, chunk
    /// boundary), the chunk is LINKED (the index points at it) and its seq is still
    /// `seq`. Untrusted input: any `off`/`seq` is answered with false, never a panic,
    /// never a write anywhere else. Lock-free (no bucket or class lock).
    pub fn note_remote_access(&self, off: u64, seq: u32) -> bool {
        let guard = self.grace.enter();
        let ok = self.inner.remote_access(&guard, off, seq);
        let c = if ok {
            &self.c.remote_hints
        } else {
            &self.c.remote_hints_rejected
        };
        c.fetch_add(1, Ordering::Relaxed);
        ok
    }

    /// `note_remote_access` for a batch of (offset, seq) hints, inside one grace period
    /// (cheaper per hint). Returns how many were accepted.
    pub fn note_remote_accesses(&self, hints: &[(u64, u32)]) -> usize {
        let guard = self.grace.enter();
        let ok = hints
            .iter()
            .filter(|&&(off, seq)| self.inner.remote_access(&guard, off, seq))
            .count();
        self.c.remote_hints.fetch_add(ok as u64, Ordering::Relaxed);
        self.c
            .remote_hints_rejected
            .fetch_add((hints.len() - ok) as u64, Ordering::Relaxed);
        ok
    }
}

impl Inner {
    /// Publish the store's clock in the control block (maintenance tick, flush_all).
    pub(crate) fn refresh_remote_clock(&self, now: u32) {
        let w = self.index.ctl_now();
        if w.load(Ordering::Relaxed) != now {
            w.store(now, Ordering::Release);
        }
    }

    /// `Store::note_remote_access` without the counters, inside the caller's grace period
    /// (`_in_grace`: a batch shares one).
    ///
    /// The access-bit write must obey the rule of the lock-free reader (`get_into`): it
    /// may only land on the header of an item that was linked *after* this thread entered
    /// the grace period. Then a page move that re-carves the item's page must have
    /// unlinked it after we entered, so its `synchronize` waits for us, and the chunk
    /// boundaries cannot shift under the write. "Linked after we entered" is proven as
    /// the local reader proves it: a slot of one of the key's buckets points at `off`,
    /// and both that bucket's version and the item's `seq` are unchanged across the
    /// checks. The cheap geometry checks (carved page, class, chunk boundary) come first
    /// so garbage is rejected without reading a key out of the middle of a value.
    fn remote_access(&self, _in_grace: &GraceGuard<'_>, off: u64, seq: u32) -> bool {
        if seq & 1 == 1 {
            return false;
        }
        let Ok(off) = usize::try_from(off) else {
            return false;
        };
        let a = &self.arena;
        if off >= a.len() {
            return false;
        }
        let class = self.slabs.class_of(off);
        let Some(ci) = self.slabs.classes.get(class as usize).copied() else {
            return false;
        };
        if class == 0 || ci.size < HDR {
            return false;
        }
        let in_page = off % self.slabs.page_size;
        if !in_page.is_multiple_of(ci.size) || in_page / ci.size >= ci.per_page {
            return false;
        }
        // The chunk lies inside its page, which lies inside the arena.
        if off + ci.size > a.len() {
            return false;
        }
        let h = item::read_header(a, off);
        if h.seq != seq || h.state != item::LINKED || h.class != class {
            return false;
        }
        if self.access_already_noted(off) {
            // The hint would change nothing: no write, so none of the checks below that
            // guard it (the key's buckets, validation). A hot item read one-sidedly
            // again and again costs its server one header read per hint.
            return true;
        }
        let klen = h.key_len as usize;
        if klen == 0 || klen > KEY_MAX_LEN || HDR + klen > ci.size {
            return false;
        }
        let mut key = [0u8; KEY_MAX_LEN];
        a.read(item::key_off(off), &mut key[..klen]);
        let kh = self.index.hash(&key[..klen]);
        for b in [kh.b1, kh.b2] {
            let v = self.index.read_begin(b);
            let points_here = (0..index::SLOTS).any(|i| {
                self.index
                    .slot(b, i)
                    .is_some_and(|s| s.off == off && s.tag == kh.tag && s.class == class)
            });
            if points_here {
                // Linked (the bucket did not change while we looked) and the header is
                // the one we checked (seq unchanged): record the access.
                if !self.validate(off, seq, b, v) {
                    return false;
                }
                self.touch_access(off);
                return true;
            }
        }
        false
    }
}
