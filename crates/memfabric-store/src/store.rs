//! The `Store`: lock-free reads, per-bucket locked writes, and the `Txn` API.
use crate::clock::Clock;
use crate::config::StoreConfig;

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
    /// Slab class holding the item.
    pub class_id: u8,
}

/// Options of a retrieval.
#[derive(Clone, Copy, Debug)]
pub struct GetOptions {
    /// `gat`/`gats`/`mg T`: set a new absolute exptime (0 = never) while fetching.
    pub touch: Option<u32>,
    /// Record the access (fetched bit, last-access time, eviction recency). Default on.
    pub bump: bool,
}

impl Default for GetOptions {
    fn default() -> Self {
        GetOptions {
            touch: None,
            bump: true,
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

/// The storage engine, shared by all worker threads (`Send + Sync`).
pub struct Store {
    _private: (),
}

impl Store {
    /// Map the arena and build the index.
    pub fn new(config: StoreConfig) -> std::io::Result<Store> {
        let _ = config;
        todo!()
    }

    pub fn config(&self) -> &StoreConfig {
        todo!()
    }

    pub fn clock(&self) -> &Clock {
        todo!()
    }

    /// Look up `key`. On a hit, calls `header(info, out)` (so the caller can write a reply
    /// header that needs the length) and then appends the value to `out`. A torn read is
    /// retried internally, truncating `out` back first, so `header` may run more than
    /// once. Returns the item's info as it was before this access (fetched / last-access).
    pub fn get_into(
        &self,
        key: &[u8],
        opts: &GetOptions,
        out: &mut Vec<u8>,
        header: impl FnMut(&ItemInfo, &mut Vec<u8>),
    ) -> Option<ItemInfo> {
        let _ = (key, opts, out, header);
        todo!()
    }

    /// `get_into` without a header.
    pub fn get(&self, key: &[u8], opts: &GetOptions, out: &mut Vec<u8>) -> Option<ItemInfo> {
        self.get_into(key, opts, out, |_, _| {})
    }

    /// Metadata only (no value copy, no access recorded).
    pub fn peek(&self, key: &[u8]) -> Option<ItemInfo> {
        let _ = key;
        todo!()
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
        let _ = (key, value_len, flags, exptime);
        todo!()
    }

    /// Run `f` with `key`'s index buckets locked against other writers (readers never
    /// wait). Keep `f` short; it may allocate.
    pub fn transact<R>(&self, key: &[u8], f: impl FnOnce(&mut Txn<'_>) -> R) -> R {
        let _ = (key, f);
        todo!()
    }

    /// set/add/replace/append/prepend/cas with memcached's semantics. `cas` is the value
    /// to compare (0 = none): binary set/add/replace with a CAS behave as `Cas`.
    pub fn store(
        &self,
        mode: SetMode,
        key: &[u8],
        value: &[u8],
        flags: u32,
        exptime: u32,
        cas: u64,
    ) -> StoreStatus {
        let _ = (mode, key, value, flags, exptime, cas);
        todo!()
    }

    /// Store a prefilled `NewItem` (large values received straight into item memory).
    pub fn store_item(&self, mode: SetMode, item: NewItem<'_>, cas: u64) -> StoreStatus {
        let _ = (mode, item, cas);
        todo!()
    }

    /// delete; `cas` 0 = unconditional.
    pub fn delete(&self, key: &[u8], cas: u64) -> DeleteStatus {
        let _ = (key, cas);
        todo!()
    }

    /// incr (`incr = true`, wraps at 2^64) or decr (floors at 0). A shorter result is
    /// padded with spaces to the old length, as memcached does in place.
    pub fn arith(&self, key: &[u8], incr: bool, delta: u64, opts: &ArithOptions) -> ArithStatus {
        let _ = (key, incr, delta, opts);
        todo!()
    }

    /// Set a new absolute exptime. Returns false on a miss.
    pub fn touch(&self, key: &[u8], exptime: u32) -> bool {
        let _ = (key, exptime);
        todo!()
    }

    /// Invalidate every item stored up to now (`at` = None) or up to absolute time `at`.
    pub fn flush_all(&self, at: Option<u32>) {
        let _ = at;
        todo!()
    }

    pub fn stats(&self) -> StoreStats {
        todo!()
    }

    pub fn slab_stats(&self) -> Vec<SlabClassStats> {
        todo!()
    }

    pub fn item_stats(&self) -> Vec<ItemClassStats> {
        todo!()
    }
}

/// An allocated, not yet linked item. Dropping it frees its memory.
pub struct NewItem<'s> {
    _store: &'s Store,
}

impl NewItem<'_> {
    pub fn value_len(&self) -> usize {
        todo!()
    }

    /// Copy `bytes` into the value at `offset`.
    pub fn write(&mut self, offset: usize, bytes: &[u8]) {
        let _ = (offset, bytes);
        todo!()
    }
}

/// One key's buckets, locked for writing. See `Store::transact`.
pub struct Txn<'s> {
    _store: &'s Store,
}

impl<'s> Txn<'s> {
    pub fn key(&self) -> &[u8] {
        todo!()
    }

    /// The live item under this key (expired and flushed items count as absent).
    pub fn item(&self) -> Option<ItemInfo> {
        todo!()
    }

    /// Append the live item's value to `out`.
    pub fn read_value(&self, out: &mut Vec<u8>) {
        let _ = out;
        todo!()
    }

    /// Allocate an item for this key (see `Store::alloc`).
    pub fn alloc(
        &self,
        value_len: usize,
        flags: u32,
        exptime: u32,
    ) -> Result<NewItem<'s>, AllocError> {
        let _ = (value_len, flags, exptime);
        todo!()
    }

    /// Link `item`, replacing the current one. Returns its CAS.
    pub fn link(&mut self, item: NewItem<'s>, opts: LinkOptions) -> u64 {
        let _ = (item, opts);
        todo!()
    }

    /// Remove the current item. Returns whether there was one.
    pub fn unlink(&mut self) -> bool {
        todo!()
    }

    /// Change the live item's exptime in place.
    pub fn set_exptime(&mut self, exptime: u32) {
        let _ = exptime;
        todo!()
    }

    /// Set or clear the meta-protocol stale / token-sent marks in place.
    pub fn set_marks(&mut self, stale: Option<bool>, token_sent: Option<bool>) {
        let _ = (stale, token_sent);
        todo!()
    }

    /// Give the live item a new CAS (fresh, or `explicit`). Returns it.
    pub fn bump_cas(&mut self, explicit: Option<u64>) -> u64 {
        let _ = explicit;
        todo!()
    }

    /// Record an access (fetched bit, last-access time).
    pub fn mark_fetched(&mut self) {
        todo!()
    }
}

use crate::ops::{ArithStatus, DeleteStatus, SetMode, StoreStatus};
use crate::stats::{ItemClassStats, SlabClassStats, StoreStats};
