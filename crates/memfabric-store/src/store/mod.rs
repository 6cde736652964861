//! The `Store`: lock-free reads, per-bucket locked writes, and the `Txn` API. Its parts:
//! `state` (the shared state and its construction), `read` (the lock-free GET), `txn`
//! (locked writes), `new_item` (allocated items before they are linked), `alloc`
//! (allocation and eviction), `link` (index linking and freeing), `accounting` and
//! `counters` (what `stats` reports), `flash_ops` (the flash tier's side in the store), `remote_access` (one-sided readers), `admin`
//! (whole-store commands), `grace` (page-move grace periods), `options` (API value types).
mod accounting;
mod admin;
mod alloc;
mod counters;
mod flash_ops;
mod grace;
mod link;
mod new_item;
mod options;
mod read;
mod remote_access;
mod state;
mod txn;

#[cfg(test)]
mod tests;

pub use admin::DumpCursor;
pub use flash_ops::{FlashCandidates, FlashHit, FlashLookup, FlashReader, LookupStep};
pub use new_item::NewItem;
pub(crate) use new_item::Owner;
pub use options::{AllocError, ArithOptions, GetOptions, ItemInfo, LinkOptions, ReassignStatus};
pub use read::PrefetchHint;
pub use state::{Inner, Store};
pub use txn::Txn;
