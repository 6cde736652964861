//! The one-sided read format: what a client reads from memfabricd's registered memory
//! with RMA reads, and how it decides whether what it read can be trusted
//! (docs/one-sided.md).
//!
//! Three things are read remotely, all little-endian:
//! - the **control block**, the last [`CTL_BYTES`] of the index mapping: geometry (hash
//!   seed, bucket count, chunk size per slab class) and the live words a reader checks
//!   items against (flush CAS, delayed-flush time, the server clock);
//! - **buckets**, 64 bytes each: a seqlock version, a writer lock word and 7 slots
//!   (`tag:16 | flash:1 | spare:1 | class:6 | offset/8:40`);
//! - **items**: a 40-byte header (seq, state, class, key length, flags, CAS, value length,
//!   client flags, exptime, store time, crc32c of key and value, atime), key, value.
//!
//! The store (`memfabric-store`) writes this format; this module only decodes it, so a
//! client needs no store internals. A test in the server crate checks that both agree.
//! Everything here is a pure function of bytes: a read that raced a writer yields a
//! verdict telling the reader to retry, never a panic and never a wrong value.
use std::ops::Range;

/// Bytes of the control block at the end of the index mapping.
pub const CTL_BYTES: usize = 4096;
/// "MMFX", read as a little-endian u32.
pub const CTL_MAGIC: u32 = 0x5846_4D4D;
/// The layout this decoder understands.
pub const CTL_LAYOUT: u32 = 1;
/// Control block words a reader re-reads on every GET (flush CAS, flush time, clock).
pub const CTL_LIVE: Range<usize> = 8..24;

pub const BUCKET_BYTES: usize = 64;
pub const SLOTS: usize = 7;
pub const ITEM_HDR: usize = 40;

/// Item states (header byte 4).
pub const STATE_LINKED: u8 = 2;
/// Item flag (header byte 7): the value is chained over several chunks.
pub const IFLAG_CHUNKED: u8 = 1;
/// Item flags (header byte 7) accesses set: fetched (the first), referenced (every one:
/// the eviction clock's second chance; the eviction scan clears it) and active (the
/// second, which moves the access time; cleared with referenced).
pub const IFLAG_FETCHED: u8 = 8;
pub const IFLAG_REFERENCED: u8 = 16;
pub const IFLAG_ACTIVE: u8 = 64;
/// Seconds after which an access moves an active item's access time again (the
/// server's `ACCESS_UPDATE_INTERVAL`).
pub const ACCESS_UPDATE_INTERVAL: u32 = 60;

/// Where in the item header each field lives.
mod hdr {
    pub const SEQ: usize = 0;
    pub const STATE: usize = 4;
    pub const KEY_LEN: usize = 6;
    pub const IFLAGS: usize = 7;
    pub const CAS: usize = 8;
    pub const VALUE_LEN: usize = 16;
    pub const FLAGS: usize = 20;
    pub const EXPTIME: usize = 24;
    pub const TIME: usize = 28;
    pub const CRC: usize = 32;
    pub const ATIME: usize = 36;
}

fn u32_at(b: &[u8], o: usize) -> u32 {
    b.get(o..o + 4)
        .and_then(|s| s.try_into().ok())
        .map_or(0, u32::from_le_bytes)
}

fn u64_at(b: &[u8], o: usize) -> u64 {
    b.get(o..o + 8)
        .and_then(|s| s.try_into().ok())
        .map_or(0, u64::from_le_bytes)
}

#[derive(Debug, thiserror::Error, PartialEq, Eq)]
pub enum LayoutError {
    #[error("control block too short")]
    Short,
    #[error("not a memfabric control block (magic {0:#x})")]
    Magic(u32),
    #[error("unsupported one-sided layout {0}")]
    Layout(u32),
    #[error("implausible geometry: {0}")]
    Geometry(&'static str),
}

/// What a reader needs to find items: read once, at connect.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Geometry {
    pub hash_seed: u64,
    pub hashpower: u32,
    /// Chunk size by slab class id (entry 0 unused).
    pub chunk_sizes: Vec<u32>,
    pub page_size: u32,
    pub arena_len: u64,
}

/// The live part of the control block, re-read with every GET.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Live {
    pub flush_cas: u64,
    pub flush_time: u32,
    /// The server clock, unix seconds.
    pub now: u32,
}

impl Live {
    /// Decode the control block's live words from a read of the [`CTL_LIVE`] range.
    pub fn decode(b: &[u8]) -> Live {
        Live {
            flush_cas: u64_at(b, 0),
            flush_time: u32_at(b, 8),
            now: u32_at(b, 12),
        }
    }
}

/// Decode the control block (the last [`CTL_BYTES`] of the index mapping).
pub fn decode_control(b: &[u8]) -> Result<(Geometry, Live), LayoutError> {
    if b.len() < 64 {
        return Err(LayoutError::Short);
    }
    let magic = u32_at(b, 0);
    if magic != CTL_MAGIC {
        return Err(LayoutError::Magic(magic));
    }
    let layout = u32_at(b, 4);
    if layout != CTL_LAYOUT {
        return Err(LayoutError::Layout(layout));
    }
    let hashpower = u32_at(b, 32);
    let classes = u32_at(b, 36) as usize;
    if !(1..=40).contains(&hashpower) {
        return Err(LayoutError::Geometry("hashpower"));
    }
    // Slots hold the class in 6 bits.
    if classes == 0 || classes > 64 {
        return Err(LayoutError::Geometry("class count"));
    }
    if u32_at(b, 44) as usize != ITEM_HDR {
        return Err(LayoutError::Geometry("item header size"));
    }
    let end = 64 + 4 * classes;
    if b.len() < end {
        return Err(LayoutError::Short);
    }
    let chunk_sizes = (0..classes).map(|c| u32_at(b, 64 + 4 * c)).collect();
    Ok((
        Geometry {
            hash_seed: u64_at(b, 24),
            hashpower,
            chunk_sizes,
            page_size: u32_at(b, 40),
            arena_len: u64_at(b, 48),
        },
        Live::decode(&b[CTL_LIVE]),
    ))
}

/// A key's tag and candidate buckets (the store's index hash).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct KeyHash {
    pub tag: u16,
    pub b1: u64,
    pub b2: u64,
}

impl Geometry {
    pub fn buckets(&self) -> u64 {
        1u64 << self.hashpower
    }

    /// Byte length of the index mapping: the buckets and the control block.
    pub fn index_len(&self) -> u64 {
        self.buckets() * BUCKET_BYTES as u64 + CTL_BYTES as u64
    }

    pub fn hash(&self, key: &[u8]) -> KeyHash {
        let h = xxhash_rust::xxh3::xxh3_64_with_seed(key, self.hash_seed);
        let mask = self.buckets() - 1;
        let tag = ((h >> 48) as u16).max(1);
        let b1 = h & mask;
        let mut b2 = (b1 ^ (tag as u64).wrapping_mul(0x5bd1_e995)) & mask;
        if b2 == b1 {
            b2 = (b1 + 1) & mask;
        }
        KeyHash { tag, b1, b2 }
    }

    /// Chunk size of a slot's class, if the class exists.
    pub fn chunk_size(&self, class: u8) -> Option<usize> {
        match self.chunk_sizes.get(class as usize) {
            Some(&s) if class > 0 && s as usize > ITEM_HDR => Some(s as usize),
            _ => None,
        }
    }
}

/// One slot of a bucket.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Slot {
    pub raw: u64,
    pub tag: u16,
    /// The slot names a flash location (SSD tier), not arena memory.
    pub flash: bool,
    pub class: u8,
    pub off: u64,
}

/// A bucket as read.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Bucket {
    pub version: u32,
    pub slots: [u64; SLOTS],
}

impl Bucket {
    pub fn decode(b: &[u8]) -> Bucket {
        let mut slots = [0u64; SLOTS];
        for (i, s) in slots.iter_mut().enumerate() {
            *s = u64_at(b, 8 + 8 * i);
        }
        Bucket {
            version: u32_at(b, 0),
            slots,
        }
    }

    /// Odd while a writer changes the slots.
    pub fn stable(&self) -> bool {
        self.version & 1 == 0
    }

    /// Slots whose tag matches, in slot order.
    pub fn matches(&self, tag: u16) -> impl Iterator<Item = Slot> + '_ {
        self.slots
            .iter()
            .filter(|&&raw| raw != 0)
            .map(|&raw| Slot {
                raw,
                tag: (raw >> 48) as u16,
                flash: raw & (1 << 47) != 0,
                class: ((raw >> 40) & 0x3f) as u8,
                off: (raw & ((1 << 40) - 1)) << 3,
            })
            .filter(move |s| s.tag == tag)
    }
}

/// An item that passed every check on its own bytes.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ItemOk {
    pub seq: u32,
    pub flags: u32,
    pub cas: u64,
    /// The value's bytes within the chunk that was read.
    pub value: Range<usize>,
    /// The header already shows every mark an access sets (fetched, referenced,
    /// active, an access time under `ACCESS_UPDATE_INTERVAL` old by the control block's
    /// clock): an access hint for it would change nothing.
    pub access_noted: bool,
}

/// Why an item read was not accepted.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Reject {
    /// `seq` odd: a writer was inside the item.
    Torn,
    /// Not in the index any more (being freed, reused, or not yet linked).
    NotLinked,
    /// Another key (a tag collision, or the chunk was reused).
    OtherKey,
    /// Lengths that do not fit the chunk: a reused chunk read mid-change.
    Malformed,
    /// crc32c of key and value does not match: torn or reused.
    Checksum,
    /// The value is chained over several chunks: one read cannot fetch it.
    Chained,
    /// Expired by the server clock.
    Expired,
    /// Older than the last flush_all.
    Flushed,
}

impl Reject {
    /// Worth reading again (a writer was in the way), as opposed to a definite answer
    /// about this slot.
    pub fn transient(self) -> bool {
        matches!(
            self,
            Reject::Torn | Reject::NotLinked | Reject::Malformed | Reject::Checksum
        )
    }

    pub fn name(self) -> &'static str {
        match self {
            Reject::Torn => "torn",
            Reject::NotLinked => "not_linked",
            Reject::OtherKey => "other_key",
            Reject::Malformed => "malformed",
            Reject::Checksum => "checksum",
            Reject::Chained => "chained",
            Reject::Expired => "expired",
            Reject::Flushed => "flushed",
        }
    }
}

/// The item header's `seq` word from a read of at least its first 4 bytes.
pub fn item_seq(b: &[u8]) -> u32 {
    u32_at(b, hdr::SEQ)
}

/// Check an item chunk read remotely against `key`, the control block's live words and
/// the reader's idea of the server clock `now` (unix seconds). Every field that a
/// concurrent writer could be changing is checked before it is used; a read that raced a
/// writer is rejected, never returned. The caller must still confirm that the item's
/// `seq` and its bucket did not change after this read (docs/one-sided.md).
pub fn check_item(chunk: &[u8], key: &[u8], live: &Live, now: u32) -> Result<ItemOk, Reject> {
    if chunk.len() < ITEM_HDR {
        return Err(Reject::Malformed);
    }
    let seq = u32_at(chunk, hdr::SEQ);
    if seq & 1 == 1 {
        return Err(Reject::Torn);
    }
    if chunk[hdr::STATE] != STATE_LINKED {
        return Err(Reject::NotLinked);
    }
    if chunk[hdr::IFLAGS] & IFLAG_CHUNKED != 0 {
        return Err(Reject::Chained);
    }
    let key_len = chunk[hdr::KEY_LEN] as usize;
    let value_len = u32_at(chunk, hdr::VALUE_LEN) as usize;
    let key_end = ITEM_HDR + key_len;
    let Some(value_end) = key_end.checked_add(value_len).filter(|&e| e <= chunk.len()) else {
        return Err(Reject::Malformed);
    };
    if chunk[ITEM_HDR..key_end] != *key {
        return Err(Reject::OtherKey);
    }
    if memfabric_checksum::crc32c(&chunk[ITEM_HDR..value_end]) != u32_at(chunk, hdr::CRC) {
        return Err(Reject::Checksum);
    }
    let exptime = u32_at(chunk, hdr::EXPTIME);
    if exptime != 0 && exptime <= now {
        return Err(Reject::Expired);
    }
    let cas = u64_at(chunk, hdr::CAS);
    if live.flush_cas != 0 && cas < live.flush_cas {
        return Err(Reject::Flushed);
    }
    let time = u32_at(chunk, hdr::TIME);
    if live.flush_time != 0 && live.flush_time <= now && time <= live.flush_time {
        return Err(Reject::Flushed);
    }
    let noted = IFLAG_FETCHED | IFLAG_REFERENCED | IFLAG_ACTIVE;
    Ok(ItemOk {
        seq,
        flags: u32_at(chunk, hdr::FLAGS),
        cas,
        value: key_end..value_end,
        access_noted: chunk[hdr::IFLAGS] & noted == noted
            && u32_at(chunk, hdr::ATIME).saturating_add(ACCESS_UPDATE_INTERVAL) > live.now,
    })
}

/// Access hints: the items a client read one-sidedly, sent in batches (AM id
/// [`crate::ucx_frontend::AM_HINTS`]) so that the server's eviction sees them as used.
/// Header: session id (u32), count (u32); data: `count` entries of item offset (u64),
/// seq (u32), reserved (u32).
pub const HINT_BYTES: usize = 16;
/// Most hints in one message.
pub const HINTS_MAX: usize = 256;

pub fn encode_hints_header(session: u32, count: u32) -> Vec<u8> {
    let mut v = Vec::with_capacity(8);
    v.extend_from_slice(&session.to_le_bytes());
    v.extend_from_slice(&count.to_le_bytes());
    v
}

pub fn encode_hint(out: &mut Vec<u8>, off: u64, seq: u32) {
    out.extend_from_slice(&off.to_le_bytes());
    out.extend_from_slice(&seq.to_le_bytes());
    out.extend_from_slice(&0u32.to_le_bytes());
}

/// Decode a hints message: the session, and the (offset, seq) pairs. Malformed input
/// (short header, a count that disagrees with the data, too many) yields `None`.
pub fn decode_hints<'a>(
    header: &[u8],
    data: &'a [u8],
) -> Option<(u32, impl Iterator<Item = (u64, u32)> + 'a)> {
    if header.len() != 8 {
        return None;
    }
    let session = u32_at(header, 0);
    let count = u32_at(header, 4) as usize;
    if count > HINTS_MAX || data.len() != count * HINT_BYTES {
        return None;
    }
    Some((
        session,
        data.chunks_exact(HINT_BYTES)
            .map(|c| (u64_at(c, 0), u32_at(c, 8))),
    ))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn item(key: &[u8], value: &[u8], chunk: usize) -> Vec<u8> {
        let mut b = vec![0u8; chunk];
        b[hdr::SEQ..4].copy_from_slice(&2u32.to_le_bytes());
        b[hdr::STATE] = STATE_LINKED;
        b[hdr::KEY_LEN] = key.len() as u8;
        b[hdr::CAS..hdr::CAS + 8].copy_from_slice(&77u64.to_le_bytes());
        b[hdr::VALUE_LEN..hdr::VALUE_LEN + 4].copy_from_slice(&(value.len() as u32).to_le_bytes());
        b[hdr::FLAGS..hdr::FLAGS + 4].copy_from_slice(&9u32.to_le_bytes());
        b[hdr::TIME..hdr::TIME + 4].copy_from_slice(&1000u32.to_le_bytes());
        b[ITEM_HDR..ITEM_HDR + key.len()].copy_from_slice(key);
        let v0 = ITEM_HDR + key.len();
        b[v0..v0 + value.len()].copy_from_slice(value);
        let crc = memfabric_checksum::crc32c(&b[ITEM_HDR..v0 + value.len()]);
        b[hdr::CRC..hdr::CRC + 4].copy_from_slice(&crc.to_le_bytes());
        b
    }

    const LIVE: Live = Live {
        flush_cas: 0,
        flush_time: 0,
        now: 2000,
    };

    #[test]
    fn a_linked_item_with_its_key_and_checksum_is_accepted() {
        let b = item(b"k1", b"hello", 88);
        let ok = check_item(&b, b"k1", &LIVE, 2000).unwrap();
        assert_eq!(&b[ok.value.clone()], b"hello");
        assert_eq!((ok.flags, ok.cas, ok.seq), (9, 77, 2));
    }

    #[test]
    fn an_access_already_noted_is_reported() {
        let mut b = item(b"k1", b"hello", 88);
        let noted = |b: &[u8]| check_item(b, b"k1", &LIVE, 2000).unwrap().access_noted;
        assert!(!noted(&b), "never accessed");
        b[hdr::IFLAGS] |= IFLAG_FETCHED | IFLAG_REFERENCED;
        assert!(!noted(&b), "fetched once: the next access makes it active");
        b[hdr::IFLAGS] |= IFLAG_ACTIVE;
        b[hdr::ATIME..hdr::ATIME + 4].copy_from_slice(&1941u32.to_le_bytes());
        assert!(noted(&b));
        b[hdr::ATIME..hdr::ATIME + 4].copy_from_slice(&1940u32.to_le_bytes());
        assert!(!noted(&b), "active, but its access time is a minute old");
        b[hdr::ATIME..hdr::ATIME + 4].copy_from_slice(&1999u32.to_le_bytes());
        b[hdr::IFLAGS] &= !(IFLAG_REFERENCED | IFLAG_ACTIVE);
        assert!(!noted(&b), "the eviction scan cleared its second chance");
    }

    #[test]
    fn each_race_is_rejected_for_its_own_reason() {
        let good = item(b"k1", b"hello", 88);
        let mut b = good.clone();
        b[0] = 3;
        assert_eq!(check_item(&b, b"k1", &LIVE, 2000), Err(Reject::Torn));
        let mut b = good.clone();
        b[hdr::STATE] = 3;
        assert_eq!(check_item(&b, b"k1", &LIVE, 2000), Err(Reject::NotLinked));
        assert_eq!(check_item(&good, b"k2", &LIVE, 2000), Err(Reject::OtherKey));
        let mut b = good.clone();
        b[ITEM_HDR + 3] ^= 1; // a value byte changed under the reader
        assert_eq!(check_item(&b, b"k1", &LIVE, 2000), Err(Reject::Checksum));
        let mut b = good.clone();
        b[hdr::VALUE_LEN..hdr::VALUE_LEN + 4].copy_from_slice(&1000u32.to_le_bytes());
        assert_eq!(check_item(&b, b"k1", &LIVE, 2000), Err(Reject::Malformed));
        let mut b = good.clone();
        b[hdr::IFLAGS] |= IFLAG_CHUNKED;
        assert_eq!(check_item(&b, b"k1", &LIVE, 2000), Err(Reject::Chained));
        assert_eq!(
            check_item(&good[..20], b"k1", &LIVE, 2000),
            Err(Reject::Malformed)
        );
    }

    #[test]
    fn expiry_and_both_kinds_of_flush_are_honoured() {
        let mut b = item(b"k", b"v", 88);
        b[hdr::EXPTIME..hdr::EXPTIME + 4].copy_from_slice(&2000u32.to_le_bytes());
        assert_eq!(check_item(&b, b"k", &LIVE, 2000), Err(Reject::Expired));
        assert!(check_item(&b, b"k", &LIVE, 1999).is_ok());
        let b = item(b"k", b"v", 88);
        let flushed = Live {
            flush_cas: 78,
            ..LIVE
        };
        assert_eq!(check_item(&b, b"k", &flushed, 2000), Err(Reject::Flushed));
        // Delayed flush: dies only once the flush time has come.
        let delayed = Live {
            flush_time: 1500,
            ..LIVE
        };
        assert_eq!(check_item(&b, b"k", &delayed, 2000), Err(Reject::Flushed));
        assert!(check_item(&b, b"k", &delayed, 1400).is_ok());
    }

    #[test]
    fn slots_decode_tag_class_and_offset() {
        let mut raw = [0u8; 64];
        raw[0..4].copy_from_slice(&4u32.to_le_bytes());
        let slot = (0xabcdu64 << 48) | (5u64 << 40) | (4096 >> 3);
        raw[16..24].copy_from_slice(&slot.to_le_bytes());
        let b = Bucket::decode(&raw);
        assert!(b.stable());
        let m: Vec<Slot> = b.matches(0xabcd).collect();
        assert_eq!(m.len(), 1);
        assert_eq!((m[0].class, m[0].off, m[0].flash), (5, 4096, false));
        assert_eq!(b.matches(0x1234).count(), 0);
    }

    #[test]
    fn control_block_round_trip_and_rejections() {
        let mut b = vec![0u8; CTL_BYTES];
        b[0..4].copy_from_slice(&CTL_MAGIC.to_le_bytes());
        b[4..8].copy_from_slice(&CTL_LAYOUT.to_le_bytes());
        b[8..16].copy_from_slice(&5u64.to_le_bytes());
        b[20..24].copy_from_slice(&123u32.to_le_bytes());
        b[24..32].copy_from_slice(&42u64.to_le_bytes());
        b[32..36].copy_from_slice(&10u32.to_le_bytes());
        b[36..40].copy_from_slice(&3u32.to_le_bytes());
        b[44..48].copy_from_slice(&40u32.to_le_bytes());
        b[68..72].copy_from_slice(&88u32.to_le_bytes());
        b[72..76].copy_from_slice(&112u32.to_le_bytes());
        let (g, live) = decode_control(&b).unwrap();
        assert_eq!(g.chunk_sizes, vec![0, 88, 112]);
        assert_eq!((live.flush_cas, live.now), (5, 123));
        assert_eq!(g.chunk_size(1), Some(88));
        assert_eq!(g.chunk_size(0), None);
        assert_eq!(g.chunk_size(9), None);
        assert_eq!(g.index_len(), 1024 * 64 + 4096);
        let h = g.hash(b"some key");
        assert!(h.b1 < 1024 && h.b2 < 1024 && h.b1 != h.b2 && h.tag != 0);
        let mut bad = b.clone();
        bad[0] = 0;
        assert!(matches!(decode_control(&bad), Err(LayoutError::Magic(_))));
        let mut bad = b.clone();
        bad[36..40].copy_from_slice(&1000u32.to_le_bytes());
        assert!(decode_control(&bad).is_err());
        assert_eq!(decode_control(&b[..10]), Err(LayoutError::Short));
    }

    #[test]
    fn hints_round_trip_and_malformed_batches_are_refused() {
        let mut data = Vec::new();
        encode_hint(&mut data, 4096, 6);
        encode_hint(&mut data, 8192, 8);
        let h = encode_hints_header(7, 2);
        let (session, it) = decode_hints(&h, &data).unwrap();
        assert_eq!(session, 7);
        assert_eq!(it.collect::<Vec<_>>(), vec![(4096, 6), (8192, 8)]);
        assert!(decode_hints(&encode_hints_header(7, 3), &data).is_none());
        assert!(decode_hints(&h[..4], &data).is_none());
        assert!(decode_hints(&encode_hints_header(7, 1000), &vec![0; 16000]).is_none());
    }

    proptest::proptest! {
        #[test]
        fn arbitrary_bytes_never_panic(chunk in proptest::collection::vec(proptest::num::u8::ANY, 0..300),
                                       key in proptest::collection::vec(proptest::num::u8::ANY, 0..20)) {
            let _ = check_item(&chunk, &key, &LIVE, 2000);
            let _ = decode_control(&chunk);
            let b = Bucket::decode(&chunk);
            let _ = b.matches(1).count();
            let _ = decode_hints(&chunk[..chunk.len().min(8)], &chunk);
        }
    }
}
