//! The store-wide counters (what `stats` reports) and the reasons an item can be removed,
//! which decide what is counted.
use std::sync::atomic::{AtomicI64, AtomicU64};

#[derive(Default)]
pub(crate) struct Counters {
    pub(super) curr_items: AtomicI64,
    pub(super) total_items: AtomicU64,
    pub(super) bytes: AtomicI64,
    pub(super) evictions: AtomicU64,
    pub(super) reclaimed: AtomicU64,
    pub(super) expired_unfetched: AtomicU64,
    pub(super) evicted_unfetched: AtomicU64,
    pub(super) evicted_active: AtomicU64,
    pub(super) get_expired: AtomicU64,
    pub(super) get_flushed: AtomicU64,
    pub(super) slabs_moved: AtomicU64,
    pub(super) slab_reassign_evictions: AtomicU64,
    pub(super) crawler_reclaimed: AtomicU64,
    pub(super) outofmemory: AtomicU64,
    pub(super) index_evictions: AtomicU64,
    pub(super) remote_hints: AtomicU64,
    pub(super) remote_hints_rejected: AtomicU64,
    /// Wake-ups of the maintenance thread (memcached's `lru_maintainer_juggles` counts its
    /// maintainer's rounds).
    pub(crate) maintainer_juggles: AtomicU64,
}

/// Why an item is being removed (for the counters).
#[derive(Clone, Copy, PartialEq, Eq)]
pub(super) enum Removal {
    /// Deleted or replaced by a client.
    Client,
    /// Dead (expired or flushed) and found by a lookup of its key (any command): the
    /// lookup counts `get_expired` / `get_flushed`, as memcached's `do_item_get` does;
    /// nothing else counts it.
    Lookup,
    /// Dead and found while looking for memory (the evictor, a full index bucket), or by
    /// the background sweeper: `reclaimed` (and `expired_unfetched` if never fetched),
    /// as memcached counts what its LRU tail pulls reclaim.
    Reclaimed,
    /// Evicted for space from the front of its class's queue.
    Evicted,
    /// Evicted because both index buckets of a new key were full.
    IndexFull,
    /// Evicted because its page moves to another class.
    PageMove,
}
