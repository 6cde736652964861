//! The value types of the `Store` API: what a read returns, and the options and outcomes of
//! its calls.

/// What a reader learns about an item besides its value.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct ItemInfo {
    /// Client flags (opaque 32 bits).
    pub flags: u32,
    /// CAS unique (0 when the store runs without CAS).
    pub cas: u64,
    /// Absolute expiry in server unix seconds; 0 = never.
    pub exptime: u32,
    /// Value length in bytes.
    pub value_len: u32,
    /// Server time of the last access (before this one).
    pub last_access: u32,
    /// Time the item was stored.
    pub time: u32,
    /// Whether the item had been fetched before this access.
    pub fetched: bool,
    /// Meta protocol: item was invalidated (`md I`, `ms I`) and is being served stale.
    pub stale: bool,
    /// Meta protocol: a recache "win" token has been handed out for this item.
    pub token_sent: bool,
    /// Meta protocol: the key was stored base64-encoded (`ms ... b`).
    pub key_binary: bool,
    /// Slab class holding the item.
    pub class_id: u8,
    /// The value is too large for one chunk and spans several (memcached's
    /// `ITEM_CHUNKED`: never a counter).
    pub chunked: bool,
}

/// Options of a retrieval.
#[derive(Clone, Copy, Debug)]
pub struct GetOptions {
    /// `gat`/`gats`/`mg T`: set a new absolute exptime (0 = never) while fetching.
    pub touch: Option<u32>,
    /// Record the access (fetched bit, last-access time, eviction recency). Default on.
    pub bump: bool,
    /// Values longer than this are not copied: the header callback and the returned info
    /// still report the hit and its length, and the caller fetches the value another way
    /// (`get_pinned`, to send it from item memory). Default: no limit.
    pub copy_limit: usize,
}

impl Default for GetOptions {
    fn default() -> Self {
        GetOptions {
            touch: None,
            bump: true,
            copy_limit: usize::MAX,
        }
    }
}

/// How `Txn::link` stamps the new item.
#[derive(Clone, Copy, Debug, Default)]
pub struct LinkOptions {
    /// Use this CAS value instead of a fresh one (meta `E` flag).
    pub explicit_cas: Option<u64>,
    /// Mark the item stale (meta invalidation).
    pub stale: bool,
    /// Mark that a win token was already handed out.
    pub token_sent: bool,
    /// Mark the item fetched, as the item it replaces was: memcached rewrites a counter
    /// in place, and the item keeps what it knew of its reads (`mg h`, `me`'s `fetch`,
    /// `evicted_unfetched`).
    pub fetched: bool,
}

/// Why an item could not be allocated.
#[derive(Clone, Copy, Debug, PartialEq, Eq, thiserror::Error)]
pub enum AllocError {
    /// Larger than `item_size_max` (memcached: "object too large for cache").
    #[error("object too large for cache")]
    TooLarge,
    /// No memory and eviction is off (`-M`) or found nothing to evict.
    #[error("out of memory storing object")]
    OutOfMemory,
}

/// Arguments of incr/decr beyond key and delta.
#[derive(Clone, Copy, Debug, Default)]
pub struct ArithOptions {
    /// Compare-and-swap: 0 = unconditional.
    pub cas: u64,
    /// Create the item on a miss with (initial value, flags, absolute exptime): binary
    /// incr/decr with an exptime other than 0xffffffff, and meta `ma N`.
    pub create: Option<(u64, u32, u32)>,
}

/// Outcome of `Store::slabs_reassign`, one per memcached reply.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum ReassignStatus {
    Ok,
    /// Another move is running, or no page of the source could be moved now.
    Busy,
    BadClass,
    NoSpare,
    Same,
}
