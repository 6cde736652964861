//! Pending and pinned items: item memory handed to foreign code (UCX zero-copy I/O).
//!
//! * A `PendingItem` is a `NewItem` that owns a share of the store internals instead of
//!   borrowing the `Store`, so a connection can keep it while a large value arrives over
//!   several event-loop rounds, written straight into item memory through
//!   `value_segments`. `Store::store_pending` links it like `Store::store_item`.
//! * A `PinnedItem` keeps a linked item's memory from being reused while an asynchronous
//!   send reads from it. The item may still be deleted, replaced, expired or evicted
//!   (unlinked) meanwhile; only the *reuse* of its chunks waits for the last pin.
//!
//! Pin protocol: pins are taken under the key's bucket locks on a LINKED item, and an
//! item is only freed after it was unlinked under the same locks. So once an item is
//! unlinked its pin count can only fall, and `defer_free` (called by whoever frees it)
//! decides race-free between "free now" and "the last unpin frees it". The chunks of a
//! pinned-and-unlinked item stay UNLINKED / CHAINED, which every reuse path (evictor,
//! sweeper, page mover) already leaves alone; page moves also skip pages that hold a
//! pinned chunk (`page_pinned`) and give a page back if a pin appears while it drains.
//! With no pin in the store, each check costs one relaxed load of `active`.
//!
//! Values are never rewritten in place while an item is linked (`arith`, append and
//! prepend build a new item and link it), and in-place header changes (touch, CAS bump,
//! access bits) do not touch value bytes, so a pinned value stays byte-for-byte stable.
use std::sync::Arc;

use crate::item;
use crate::ops::{Found, SetMode, StoreStatus};
use crate::store::{AllocError, GetOptions, Inner, ItemInfo, NewItem, Owner, Store};
use crate::KEY_MAX_LEN;

/// An allocated, not yet linked item that does not borrow the `Store` (see
/// `Store::alloc_pending`). Dropping it frees its memory. `Send`: it may move between
/// threads.
pub struct PendingItem(NewItem<'static>);

impl PendingItem {
    pub fn value_len(&self) -> usize {
        self.0.value_len()
    }

    /// The key this item was allocated for.
    pub fn key(&self) -> Vec<u8> {
        self.0.key()
    }

    /// Copy `bytes` into the value at `offset`. Bytes past the value's end are ignored.
    pub fn write(&mut self, offset: usize, bytes: &[u8]) {
        self.0.write(offset, bytes)
    }

    /// A copy of the value's first `n` bytes (fewer when it is shorter).
    pub fn value_prefix(&self, n: usize) -> Vec<u8> {
        let mut out = Vec::with_capacity(n.min(self.value_len()));
        for (at, len) in self.0.segments() {
            let take = len.min(n - out.len());
            self.0.owner.arena.read_into(at, take, &mut out);
            if out.len() == n {
                break;
            }
        }
        out
    }

    /// The value's first `upto` bytes are final: fold them into the item's checksum now
    /// (see `NewItem::fold_checksum`), so that storing it has only the rest to do.
    pub fn fold_checksum(&mut self, upto: usize) {
        self.0.fold_checksum(upto)
    }

    /// The value's memory as (pointer, len) segments in value order: one for a normal
    /// item, one per chained chunk for a large one (none for an empty value). Valid
    /// until the item is stored or dropped; foreign code (UCX) writes the value through
    /// them. Producing the pointers is safe; writing through them is the caller's
    /// responsibility (only within the segments, only before `store_pending`).
    pub fn value_segments(&mut self) -> Vec<(*mut u8, usize)> {
        let a = &self.0.owner.arena;
        self.0
            .segments()
            .map(|(off, len)| (a.ptr_at(off, len), len))
            .collect()
    }

    /// The value's memory as mutable slices in value order (see `value_segments`): what
    /// a zero-copy receive fills.
    pub fn value_slices_mut(&mut self) -> Vec<&mut [u8]> {
        let a = &self.0.owner.arena;
        self.0
            .segments()
            .map(|(off, len)| a.pending_bytes_mut(off, len))
            .collect()
    }
}

/// A linked item's value, kept in place: until this is dropped the item's chunks are
/// never freed, reused, evicted into reuse or re-carved by a page move. The item may
/// still be unlinked meanwhile (then its memory is freed when the last pin goes).
/// `Send`: it may move between threads.
pub struct PinnedItem {
    inner: Arc<Inner>,
    head: usize,
    /// Head first, then the chain.
    chunks: Vec<usize>,
    /// (arena offset, length) of the value's pieces.
    segments: Vec<(usize, usize)>,
    value_len: usize,
}

impl PinnedItem {
    pub fn value_len(&self) -> usize {
        self.value_len
    }

    /// Segments of the value (pointer, len) in order; stable while pinned.
    pub fn value_segments(&self) -> Vec<(*const u8, usize)> {
        let a = &self.inner.arena;
        self.segments
            .iter()
            .map(|&(off, len)| (a.ptr_at(off, len) as *const u8, len))
            .collect()
    }

    /// The value as slices in value order, borrowed from the pinned memory: what a
    /// zero-copy send reads.
    pub fn value_slices(&self) -> Vec<&[u8]> {
        let a = &self.inner.arena;
        self.segments
            .iter()
            .map(|&(off, len)| a.stable_bytes(off, len))
            .collect()
    }

    /// Append a copy of the value to `out` (tests, fallbacks).
    pub fn read_value(&self, out: &mut Vec<u8>) {
        out.reserve(self.value_len);
        for &(off, len) in &self.segments {
            self.inner.arena.read_into(off, len, out);
        }
    }
}

impl Drop for PinnedItem {
    fn drop(&mut self) {
        if self.inner.pins.unpin(self.head, &self.chunks) {
            self.inner.free_item(self.head);
        }
    }
}

impl Store {
    /// Like `alloc`, but the result owns a share of the store internals (no borrow), so
    /// it can be kept in a connection while the value arrives. Dropping it frees the
    /// memory.
    pub fn alloc_pending(
        &self,
        key: &[u8],
        value_len: usize,
        flags: u32,
        exptime: u32,
    ) -> Result<PendingItem, AllocError> {
        let owner = Owner::Shared(self.shared());
        (**self)
            .alloc_item(owner, key, value_len, flags, exptime)
            .map(PendingItem)
    }

    /// `store_item` for a `PendingItem`: same semantics, every `SetMode` (append and
    /// prepend copy the old value into a new item, as `store` does). An item allocated
    /// by another store is not stored (`NotStored`) and is freed.
    pub fn store_pending(&self, mode: SetMode, item: PendingItem, cas: u64) -> StoreStatus {
        self.store_pending_found(mode, item, cas).status
    }

    /// `store_pending`, also telling the class of the item that was under the key.
    pub fn store_pending_found(
        &self,
        mode: SetMode,
        item: PendingItem,
        cas: u64,
    ) -> Found<StoreStatus> {
        if !std::ptr::eq(&*item.0.owner, &**self) {
            return Found::unfound(StoreStatus::NotStored);
        }
        self.store_item_found(mode, item.0, cas)
    }

    /// [`Store::store_found_unless`] of a value received into `item`.
    pub fn store_pending_unless(
        &self,
        item: PendingItem,
        keep_old: impl FnOnce(&[&[u8]]) -> bool,
    ) -> Found<StoreStatus> {
        if !std::ptr::eq(&*item.0.owner, &**self) {
            return Found::unfound(StoreStatus::NotStored);
        }
        self.store_item_unless(item.0, keep_old)
    }

    /// Look `key` up (same rules as `get_into`: expiry, flush, `opts.bump`,
    /// `opts.touch`) and pin the item. Runs under the key's bucket locks (the pin must
    /// be taken before anyone can unlink the item), so use it for large values, where
    /// the lock costs nothing next to the copy it saves.
    pub fn get_pinned(&self, key: &[u8], opts: &GetOptions) -> Option<(ItemInfo, PinnedItem)> {
        if key.is_empty() || key.len() > KEY_MAX_LEN {
            return None;
        }
        let inner = self.shared();
        self.transact(key, |t| {
            let info = t.item()?;
            let head = t.current_off()?;
            if let Some(exptime) = opts.touch {
                t.set_exptime(exptime);
            }
            if opts.bump {
                t.mark_fetched();
            }
            let h = item::read_header(&inner.arena, head);
            let chunks = inner.item_chunks(head);
            let segments = inner
                .value_segments(head, h.key_len as usize, h.value_len as usize, &chunks[1..])
                .collect();
            inner.pins.pin(head, &chunks);
            let pinned = PinnedItem {
                inner: inner.clone(),
                head,
                chunks,
                segments,
                value_len: h.value_len as usize,
            };
            Some((info, pinned))
        })
    }

    /// Base address and length of the arena mapping (for `ucp_mem_map` registration).
    pub fn arena_region(&self) -> (*mut u8, usize) {
        self.arena.region()
    }

    /// Base address and length of the index mapping (one-sided reads).
    pub fn index_region(&self) -> (*mut u8, usize) {
        self.index.region()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn assert_send<T: Send>() {}

    #[test]
    fn pending_and_pinned_items_are_send() {
        assert_send::<PendingItem>();
        assert_send::<PinnedItem>();
    }
}
