//! Allocated, not yet linked items (`NewItem`): filled by their owner, then linked by a
//! `Txn` or freed on drop.
use std::sync::Arc;

use crate::item;

use super::state::Inner;

/// Who keeps the store alive for a `NewItem`: a borrow (`Store::alloc`, `Txn::alloc`) or
/// a share of the internals (`Store::alloc_pending`, which must not borrow the store).
pub(crate) enum Owner<'s> {
    Borrowed(&'s Inner),
    Shared(Arc<Inner>),
}

impl std::ops::Deref for Owner<'_> {
    type Target = Inner;
    fn deref(&self) -> &Inner {
        match self {
            Owner::Borrowed(i) => i,
            Owner::Shared(a) => a,
        }
    }
}

/// An allocated, not yet linked item. Dropping it frees its memory.
pub struct NewItem<'s> {
    pub(crate) owner: Owner<'s>,
    pub(crate) off: usize,
    pub(crate) chain: Vec<usize>,
    pub(super) value_len: usize,
    pub(super) key_len: usize,
    /// The checksum of the key and the value's first bytes, and how many value bytes it
    /// covers, once some of the value was declared final (`fold_checksum`).
    pub(super) crc_progress: Option<(u32, usize)>,
}

impl NewItem<'_> {
    pub fn value_len(&self) -> usize {
        self.value_len
    }

    /// The value's memory as (arena offset, length) pieces, in value order.
    pub(crate) fn segments(&self) -> impl Iterator<Item = (usize, usize)> + '_ {
        self.owner
            .value_segments(self.off, self.key_len, self.value_len, &self.chain)
    }

    /// Copy `bytes` into the value at `offset`. Bytes past the value's end are ignored.
    pub fn write(&mut self, offset: usize, bytes: &[u8]) {
        let end = offset.saturating_add(bytes.len()).min(self.value_len);
        if offset >= end {
            return;
        }
        if self.crc_progress.is_some_and(|(_, done)| offset < done) {
            // Bytes folded into the checksum changed after all: start it again.
            self.crc_progress = None;
        }
        let a = &self.owner.arena;
        let mut pos = 0;
        for (at, len) in self.segments() {
            let (lo, hi) = (offset.max(pos), end.min(pos + len));
            if lo < hi {
                a.write(at + (lo - pos), &bytes[lo - offset..hi - offset]);
            }
            pos += len;
            if pos >= end {
                break;
            }
        }
    }

    /// Append the value written so far (all of it) to `out`.
    pub(crate) fn read_value(&self, out: &mut Vec<u8>) {
        for (at, len) in self.segments() {
            self.owner.arena.read_into(at, len, out);
        }
    }

    /// The key this item was allocated for.
    pub fn key(&self) -> Vec<u8> {
        let mut k = vec![0u8; self.key_len];
        self.owner.arena.read(item::key_off(self.off), &mut k);
        k
    }

    /// Fill the value from consecutive parts (append/prepend build values this way).
    pub fn write_parts(&mut self, parts: &[&[u8]]) {
        let mut at = 0;
        for p in parts {
            self.write(at, p);
            at += p.len();
        }
    }

    /// crc32c of key and value.
    pub(super) fn checksum(&self) -> u32 {
        self.checksum_to(self.value_len).0
    }

    /// The value's first `upto` bytes are final (they will not be written again): fold
    /// them into the checksum now, so that linking the item later has only the rest to
    /// checksum. A value received over the network is folded in as it arrives.
    pub fn fold_checksum(&mut self, upto: usize) {
        self.crc_progress = Some(self.checksum_to(upto.min(self.value_len)));
    }

    /// The checksum of the key and the value's first `upto` bytes (continuing from what
    /// was folded already), and how many value bytes it covers.
    fn checksum_to(&self, upto: usize) -> (u32, usize) {
        if !self.chain.is_empty() {
            // A chained item is never read one-sided (a remote reader rejects the CHUNKED
            // flag before it looks at the checksum and asks the server), and nothing else
            // reads the checksum: it stays 0 rather than cost ~15 us per 512 KB on the
            // path of every large SET.
            return (0, upto);
        }
        let a = &self.owner.arena;
        let (mut crc, done) = self
            .crc_progress
            .unwrap_or_else(|| (a.crc(0, item::key_off(self.off), self.key_len), 0));
        if upto <= done {
            return (crc, done);
        }
        let mut pos = 0;
        for (at, len) in self.segments() {
            let (lo, hi) = (done.max(pos), upto.min(pos + len));
            if lo < hi {
                crc = a.crc(crc, at + (lo - pos), hi - lo);
            }
            pos += len;
            if pos >= upto {
                break;
            }
        }
        (crc, upto)
    }
}

impl Drop for NewItem<'_> {
    fn drop(&mut self) {
        if self.off != usize::MAX {
            item::seq_end(&self.owner.arena, self.off);
            self.owner.free_chunk(self.off);
            for &c in &self.chain {
                self.owner.free_chunk(c);
            }
        }
    }
}
