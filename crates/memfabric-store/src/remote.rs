//! The remotely readable layout, as constants: what a one-sided reader (a client with
//! RMA access to the index and arena mappings) may rely on. A cross-check test in
//! another crate compares these with the client-side decoder.
//!
//! The **control block** is the last [`CTL_BYTES`] of the index mapping (at byte offset
//! `buckets * BUCKET_BYTES` from `Store::index_region()`'s base). Little-endian, every
//! field naturally aligned and written with atomics:
//!
//! ```text
//! off size field
//!   0   4  magic        CTL_MAGIC (bytes "MMFX")
//!   4   4  layout       CTL_LAYOUT
//!   8   8  flush_cas    items with cas < flush_cas are dead (flush_all without delay); 0 = none
//!  16   4  flush_time   delayed flush: items with time <= flush_time die once
//!                       flush_time <= now; 0 = none
//!  20   4  now          the store's clock, unix seconds; refreshed by the maintenance
//!                       thread every tick (<= 250 ms) and by flush_all
//!  24   8  hash_seed    xxh3-64 seed of the index hash
//!  32   4  hashpower    log2(buckets)
//!  36   4  classes      number of slab class ids N (ids 1..N-1 are real; entry 0 unused)
//!  40   4  page_size
//!  44   4  item_hdr     ITEM_HDR (40)
//!  48   8  arena_len    bytes of the arena mapping
//!  56   8  reserved     0
//!  64 4*N  chunk_size[class id], u32 each (entry 0 = 0)
//! ```
use std::ops::Range;

/// Bytes of the control block at the end of the index mapping.
pub const CTL_BYTES: usize = 4096;
/// "MMFX" read as a little-endian u32.
pub const CTL_MAGIC: u32 = 0x5846_4D4D;
/// Version of this layout.
pub const CTL_LAYOUT: u32 = 1;

pub const OFF_MAGIC: usize = 0;
pub const OFF_LAYOUT: usize = 4;
pub const OFF_FLUSH_CAS: usize = 8;
pub const OFF_FLUSH_TIME: usize = 16;
pub const OFF_NOW: usize = 20;
pub const OFF_HASH_SEED: usize = 24;
pub const OFF_HASHPOWER: usize = 32;
pub const OFF_CLASSES: usize = 36;
pub const OFF_PAGE_SIZE: usize = 40;
pub const OFF_ITEM_HDR: usize = 44;
pub const OFF_ARENA_LEN: usize = 48;
pub const OFF_RESERVED: usize = 56;
/// Start of the `u32` chunk-size table, indexed by slab class id.
pub const OFF_CHUNK_SIZES: usize = 64;

/// The words a reader re-reads with every GET: flush_cas, flush_time, now.
pub const CTL_LIVE: Range<usize> = OFF_FLUSH_CAS..OFF_NOW + 4;

/// Index bucket geometry (`index.rs` describes a bucket; it takes these from here, so the
/// dependency runs one way: index -> remote).
pub const BUCKET_BYTES: usize = 64;
pub const SLOTS: usize = 7;

/// Item header size and field offsets (see `item.rs`).
pub const ITEM_HDR: usize = crate::item::HDR;
pub const ITEM_OFF_SEQ: usize = crate::item::OFF_SEQ;
pub const ITEM_OFF_STATE: usize = crate::item::OFF_STATE;
pub const ITEM_OFF_CLASS: usize = crate::item::OFF_CLASS;
pub const ITEM_OFF_KEY_LEN: usize = crate::item::OFF_KEYLEN;
pub const ITEM_OFF_IFLAGS: usize = crate::item::OFF_IFLAGS;
pub const ITEM_OFF_CAS: usize = crate::item::OFF_CAS;
pub const ITEM_OFF_VALUE_LEN: usize = crate::item::OFF_VLEN;
pub const ITEM_OFF_FLAGS: usize = crate::item::OFF_FLAGS;
pub const ITEM_OFF_EXPTIME: usize = crate::item::OFF_EXPTIME;
pub const ITEM_OFF_TIME: usize = crate::item::OFF_TIME;
/// Item flags an access sets (`note_remote_access`, a local GET).
pub const IFLAG_FETCHED: u8 = crate::item::F_FETCHED;
pub const IFLAG_REFERENCED: u8 = crate::item::F_REFERENCED;
pub const IFLAG_ACTIVE: u8 = crate::item::F_ACTIVE;
/// Seconds after which an access moves an active item's access time again.
pub const ACCESS_UPDATE_INTERVAL: u32 = crate::item::ACCESS_UPDATE_INTERVAL;
pub const ITEM_OFF_CRC: usize = crate::item::OFF_CRC;
pub const ITEM_OFF_ATIME: usize = crate::item::OFF_ATIME;
/// Item state byte: in the index, readable.
pub const STATE_LINKED: u8 = crate::item::LINKED;
/// Item flag: the value is chained over several chunks.
pub const IFLAG_CHUNKED: u8 = crate::item::F_CHUNKED;

/// Bytes of the index mapping for `2^hashpower` buckets (buckets + control block).
pub fn index_len(hashpower: u32) -> usize {
    (1usize << hashpower) * BUCKET_BYTES + CTL_BYTES
}

// Checked at compile time: the class table fits the block, u64 fields are 8-aligned.
const _: () = assert!(OFF_CHUNK_SIZES + 4 * (crate::slab::MAX_CLASSES + 1) <= CTL_BYTES);
const _: () = assert!(OFF_FLUSH_CAS.is_multiple_of(8) && OFF_HASH_SEED.is_multiple_of(8));
const _: () = assert!(OFF_ARENA_LEN.is_multiple_of(8) && OFF_RESERVED.is_multiple_of(8));

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn magic_spells_mmfx_and_live_words_are_bytes_8_to_24() {
        assert_eq!(&CTL_MAGIC.to_le_bytes(), b"MMFX");
        assert_eq!(CTL_LIVE, 8..24);
    }
}
