/// Everything the store needs to know, with memcached 1.6's defaults.
#[derive(Clone, Debug)]
pub struct StoreConfig {
    /// Arena size in bytes (`-m`, megabytes on the command line; default 64 MiB).
    pub memory_limit: usize,
    /// Size of the pages slab classes take from the arena (memcached: 1 MiB).
    pub page_size: usize,
    /// Chunk size growth factor between slab classes (`-f`, default 1.25).
    pub growth_factor: f64,
    /// Minimum space for key + value in the smallest chunk (`-n`, default 48).
    pub min_chunk: usize,
    /// Largest item accepted (`-I`, default 1 MiB). Items larger than a page are chained.
    pub item_size_max: usize,
    /// Evict when memory is full; `false` is `-M` (return an error instead).
    pub evict: bool,
    /// Hand out CAS uniques (`-C` turns them off: CAS reads as 0).
    pub use_cas: bool,
    /// log2 of the number of index buckets; `None` sizes the index from `memory_limit`.
    pub hashpower: Option<u8>,
    /// Move pages between slab classes when the value-size mix changes (`slab_automove`).
    pub slab_automove: bool,
    /// Reclaim expired items in the background (`lru_crawler`).
    pub background_sweeper: bool,
    /// While requests arrive (`Store::note_activity`) and the machine's CPUs have time to
    /// spare, the maintenance thread wakes this often, as memcached's LRU maintainer sleeps
    /// 1 ms at a time while it has work (`maintenance.rs` says why and when). Zero
    /// (`-o no_lru_maintainer`): never.
    pub busy_tick: std::time::Duration,
    /// The flash tier items evicted from RAM go to (memcached's extstore); `None`: RAM only.
    pub flash: Option<crate::flash::FlashConfig>,
    /// Values that `append` and `prepend` must leave as they are (`NOT_STORED`, as for a
    /// missing key), told by their bytes: the server gives memfabric's erasure-coded
    /// fragments, which a client without the code would otherwise damage beyond what the
    /// code's readers can recognise. `None`: every value may be appended to, as in
    /// memcached.
    pub sealed: Option<fn(&[u8]) -> bool>,
}

impl Default for StoreConfig {
    fn default() -> Self {
        StoreConfig {
            memory_limit: 64 << 20,
            page_size: 1 << 20,
            growth_factor: 1.25,
            min_chunk: 48,
            item_size_max: 1 << 20,
            evict: true,
            use_cas: true,
            hashpower: None,
            slab_automove: true,
            background_sweeper: true,
            busy_tick: std::time::Duration::from_millis(1),
            flash: None,
            sealed: None,
        }
    }
}
