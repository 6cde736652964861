//! Item and chunk header layout (see docs/store.md for the picture).
//!
//! Every chunk starts with the same 40-byte header, so a scanner (eviction hand, page
//! drainer, a remote reader) can interpret any chunk boundary:
//!
//! ```text
//! off size field
//!   0   4  seq        seqlock word: odd while the chunk is written; bumped on every
//!                     write and on every reuse, so it doubles as the generation
//!   4   1  state      FREE / ALLOCATED / LINKED / UNLINKED / CHAINED
//!   5   1  class      slab class id of this chunk
//!   6   1  key_len    1..=250
//!   7   1  iflags     CHUNKED STALE TOKEN_SENT KEY_BINARY | FETCHED REFERENCED (atomic)
//!   8   8  cas        CAS unique (for a CHAINED chunk: offset of its head item)
//!  16   4  value_len
//!  20   4  flags      client flags
//!  24   4  exptime    absolute unix seconds, 0 = never
//!  28   4  time       unix seconds the item was stored (delayed flush_all)
//!  32   4  crc        crc32c(key ++ value)
//!  36   4  atime      last access, unix seconds (atomic, written by readers)
//!  40      key, then the value; for a CHUNKED item: key, padding to 8, then one u64
//!          arena offset per value chunk (each a CHAINED chunk holding up to
//!          chunk_size - 40 bytes of the value after its own header)
//! ```
use std::sync::atomic::Ordering;

use crate::arena::Arena;

pub const HDR: usize = 40;

pub const OFF_SEQ: usize = 0;
pub const OFF_STATE: usize = 4;
pub const OFF_CLASS: usize = 5;
pub const OFF_KEYLEN: usize = 6;
pub const OFF_IFLAGS: usize = 7;
pub const OFF_CAS: usize = 8;
pub const OFF_VLEN: usize = 16;
pub const OFF_FLAGS: usize = 20;
pub const OFF_EXPTIME: usize = 24;
pub const OFF_TIME: usize = 28;
pub const OFF_CRC: usize = 32;
pub const OFF_ATIME: usize = 36;

/// Chunk states.
pub const FREE: u8 = 0;
/// Handed out by the allocator, being filled, not yet in the index.
pub const ALLOCATED: u8 = 1;
/// In the index: readable.
pub const LINKED: u8 = 2;
/// Removed from the index, about to be freed by whoever removed it.
pub const UNLINKED: u8 = 3;
/// Part of a chunked item's value, owned by its head item.
pub const CHAINED: u8 = 4;

/// Item flags.
pub const F_CHUNKED: u8 = 1;
pub const F_STALE: u8 = 2;
pub const F_TOKEN_SENT: u8 = 4;
pub const F_FETCHED: u8 = 8;
pub const F_REFERENCED: u8 = 16;
/// What an access sets (a GET, or a one-sided reader's hint).
pub const F_ACCESSED: u8 = F_FETCHED | F_REFERENCED;
/// Meta protocol: the key was given base64-encoded (`b`), so replies echo it that way.
pub const F_KEY_BINARY: u8 = 32;
/// Fetched again after its first fetch (memcached's ITEM_ACTIVE): the access that sets it
/// moves the last-access time; the ones after it do not, until the item's second chance
/// in the eviction queue clears it.
pub const F_ACTIVE: u8 = 64;

/// Seconds after which an active item's access time moves again on its next access
/// (memcached's ITEM_UPDATE_INTERVAL).
pub const ACCESS_UPDATE_INTERVAL: u32 = 60;

/// A snapshot of an item header, read without locks (validate before trusting it).
#[derive(Clone, Copy, Debug, Default)]
pub struct Header {
    pub seq: u32,
    pub state: u8,
    pub class: u8,
    pub key_len: u8,
    pub iflags: u8,
    pub cas: u64,
    pub value_len: u32,
    pub flags: u32,
    pub exptime: u32,
    pub time: u32,
    pub crc: u32,
    pub atime: u32,
}

/// Read the header of the chunk at `off`. `seq` is loaded with Acquire first, so a
/// later re-load of `seq` that sees the same even value proves the rest is consistent.
pub fn read_header(a: &Arena, off: usize) -> Header {
    let seq = a.u32_at(off + OFF_SEQ).load(Ordering::Acquire);
    // The header is five aligned words, each one atomic load; fields are taken out of them
    // by shifts (the layout is little-endian: field at byte k of a word = bits 8k..).
    let [w0, cas, w2, w3, _]: [u64; HDR / 8] = a.read_words(off);
    Header {
        seq,
        state: (w0 >> (8 * OFF_STATE)) as u8,
        class: (w0 >> (8 * OFF_CLASS)) as u8,
        key_len: (w0 >> (8 * OFF_KEYLEN)) as u8,
        iflags: a.u8_at(off + OFF_IFLAGS).load(Ordering::Relaxed),
        cas,
        value_len: w2 as u32,
        flags: (w2 >> 32) as u32,
        exptime: w3 as u32,
        time: (w3 >> 32) as u32,
        crc: a.u32_at(off + OFF_CRC).load(Ordering::Relaxed),
        atime: a.u32_at(off + OFF_ATIME).load(Ordering::Relaxed),
    }
}

// `read_header` decodes words by shifts: the byte layout above is little-endian, and so
// are the fields' offsets within their words.
const _: () = assert!(
    cfg!(target_endian = "little"),
    "the item layout is little-endian"
);
const _: () = assert!(OFF_VLEN == 16 && OFF_FLAGS == 20 && OFF_EXPTIME == 24 && OFF_TIME == 28);
const _: () = assert!(OFF_CAS == 8 && OFF_CRC == 32 && OFF_ATIME == 36);

/// Store the fixed fields of a header (owner or locked writer only, inside odd `seq`).
pub fn write_fields(a: &Arena, off: usize, h: &Header) {
    a.u8_at(off + OFF_CLASS).store(h.class, Ordering::Relaxed);
    a.u8_at(off + OFF_KEYLEN)
        .store(h.key_len, Ordering::Relaxed);
    a.u64_at(off + OFF_CAS).store(h.cas, Ordering::Relaxed);
    a.u32_at(off + OFF_VLEN)
        .store(h.value_len, Ordering::Relaxed);
    a.u32_at(off + OFF_FLAGS).store(h.flags, Ordering::Relaxed);
    a.u32_at(off + OFF_EXPTIME)
        .store(h.exptime, Ordering::Relaxed);
    a.u32_at(off + OFF_TIME).store(h.time, Ordering::Relaxed);
    a.u32_at(off + OFF_CRC).store(h.crc, Ordering::Relaxed);
}

/// Begin modifying the chunk at `off`: make `seq` odd. Returns the odd value.
pub fn seq_begin(a: &Arena, off: usize) -> u32 {
    let s = a.u32_at(off + OFF_SEQ);
    let v = s.load(Ordering::Relaxed);
    let odd = if v & 1 == 0 {
        v.wrapping_add(1)
    } else {
        v.wrapping_add(2)
    };
    s.store(odd, Ordering::Relaxed);
    // Readers that see the new data must also see the odd seq.
    std::sync::atomic::fence(Ordering::Release);
    odd
}

/// Finish modifying: make `seq` even again (publishes the writes).
pub fn seq_end(a: &Arena, off: usize) {
    let s = a.u32_at(off + OFF_SEQ);
    let v = s.load(Ordering::Relaxed);
    s.store(v.wrapping_add(1), Ordering::Release);
}

pub fn state(a: &Arena, off: usize) -> u8 {
    a.u8_at(off + OFF_STATE).load(Ordering::Acquire)
}

pub fn set_state(a: &Arena, off: usize, st: u8) {
    a.u8_at(off + OFF_STATE).store(st, Ordering::Release);
}

/// Offset of the key / value / chain table inside the item at `off`.
pub fn key_off(off: usize) -> usize {
    off + HDR
}

pub fn value_off(off: usize, key_len: usize) -> usize {
    off + HDR + key_len
}

pub fn chain_off(off: usize, key_len: usize) -> usize {
    (off + HDR + key_len).next_multiple_of(8)
}
