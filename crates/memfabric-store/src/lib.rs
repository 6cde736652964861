//! memfabric-store: the cache's storage engine.
//!
//! One arena (an mmap of its own, or caller-supplied `Memory`; never moved or unmapped
//! while the store lives, so it can be registered once for RDMA), carved into 1 MiB pages
//! that slab classes take on demand.
//! Items are self-describing (lengths, flags, exptime, CAS, a seqlock word and a crc32c
//! of key and value) so a reader that holds no lock, local or remote, can tell a torn or
//! stale read from a good one. The hash index is an array of 64-byte buckets with a
//! seqlock version and seven slots each; see `docs/store.md` for the byte layouts and
//! the concurrency protocol. The index mapping ends with a control block (`remote`) that
//! tells one-sided readers the geometry, the flush state and the store's clock; readers
//! report what they read with `Store::note_remote_access`, so eviction sees it.
//!
//! The store knows nothing of sockets or protocols: it offers memcached's storage
//! semantics (`ops`) and a small transaction API (`Txn`) for protocol features that need
//! to inspect and modify one key atomically (meta commands).

// `unsafe` lives in three modules only: the arena (its mapping), `racy` (lock-free
// readers' copies of memory writers change) and the flash tier's io_uring engine
// (submissions that point into memory); each block carries a `// SAFETY:` comment
// (`clippy::undocumented_unsafe_blocks`, denied workspace-wide).
#![deny(unsafe_code)]

#[allow(unsafe_code)]
mod arena;
mod clock;
mod config;
pub mod flash;
mod index;
mod item;
mod maintenance;
mod ops;
mod pin_table;
mod pins;
#[allow(unsafe_code)]
mod racy;
pub mod remote;
mod slab;
mod stats;
mod store;

pub use arena::{Allocate, Memory};
pub use clock::Clock;
pub use config::StoreConfig;
pub use flash::{FlashConfig, FlashStats};
pub use ops::{ArithStatus, DeleteStatus, Found, SetMode, StoreStatus};
pub use pins::{PendingItem, PinnedItem};
pub use stats::{ItemClassStats, SlabClassStats, StoreStats};
pub use store::{
    AllocError, ArithOptions, DumpCursor, FlashCandidates, FlashHit, FlashReader, GetOptions,
    ItemInfo, LinkOptions, NewItem, PrefetchHint, ReassignStatus, Store, Txn,
};

/// Longest key memcached accepts.
pub const KEY_MAX_LEN: usize = 250;
