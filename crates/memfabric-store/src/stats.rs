//! Counters the store keeps; names follow memcached's `stats`, `stats slabs`, `stats items`.

/// Store-wide counters (`stats`).
#[derive(Clone, Debug, Default)]
pub struct StoreStats {
    pub curr_items: u64,
    pub total_items: u64,
    /// Bytes of items currently stored (memcached's "bytes").
    pub bytes: u64,
    pub evictions: u64,
    pub reclaimed: u64,
    pub expired_unfetched: u64,
    pub evicted_unfetched: u64,
    pub evicted_active: u64,
    pub get_expired: u64,
    pub get_flushed: u64,
    pub limit_maxbytes: u64,
    /// Pages handed to slab classes, in bytes ("total_malloced").
    pub total_malloced: u64,
    pub slabs_moved: u64,
    pub slab_reassign_evictions: u64,
    pub crawler_reclaimed: u64,
    pub hash_power_level: u32,
    pub hash_bytes: u64,
    pub outofmemory: u64,
    /// Items dropped because both candidate index buckets were full.
    pub index_evictions: u64,
    pub malloc_fails: u64,
    /// Access hints from one-sided readers that marked an item (`note_remote_access`).
    pub remote_hints: u64,
    /// Access hints that named no linked item with that seq (stale, or garbage).
    pub remote_hints_rejected: u64,
    /// Rounds of the maintenance thread since start (`lru_maintainer_juggles`).
    pub maintainer_juggles: u64,
}

/// One slab class (`stats slabs`).
#[derive(Clone, Debug, Default)]
pub struct SlabClassStats {
    pub id: u8,
    pub chunk_size: u32,
    pub chunks_per_page: u32,
    pub total_pages: u64,
    pub total_chunks: u64,
    pub used_chunks: u64,
    pub free_chunks: u64,
    /// Bytes of the chunks' payload actually requested.
    pub mem_requested: u64,
}

/// One slab class's items (`stats items`).
#[derive(Clone, Debug, Default)]
pub struct ItemClassStats {
    pub id: u8,
    pub number: u64,
    /// Age in seconds of the least recently used item.
    pub age: u64,
    pub evicted: u64,
    pub evicted_nonzero: u64,
    pub evicted_time: u64,
    pub outofmemory: u64,
    pub reclaimed: u64,
    pub expired_unfetched: u64,
    pub evicted_unfetched: u64,
    pub evicted_active: u64,
    pub crawler_reclaimed: u64,
}
