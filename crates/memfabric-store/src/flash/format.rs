//! The bytes on flash: a page header, self-describing records, and a per-page summary.
//!
//! ```text
//! page (page_size bytes, written once as a whole):
//!   0  u32 magic "MMFL"      4 u16 version   6 u16 reserved
//!   8  u64 seq               write sequence of the tier (newer pages have larger seq)
//!  16  u32 page              page number within the tier
//!  20  u32 records           24 u32 used: end of the records (summary starts here)
//!  28  u32 summary_len      32 u32 summary_crc   36..60 reserved
//!  60  u32 header_crc        crc32c of bytes 0..60
//!  64  records, each 8-aligned: the item header (40 bytes, item.rs layout), key, value
//! used summary: 24 bytes + key per entry, in the order things happened:
//!        0 u32 off   4 u8 key_len   5 u8 iflags   6 u8 class   7 u8 kind
//!        8 u32 exptime   12 u32 time   16 u64 cas   24 key, pad to 8
//!      kind RECORD: the record at `off` of this page holds `key`;
//!      kind INVALIDATE: the record at flash location `cas` (written earlier) is no longer
//!        its key's value (overwritten, deleted, dropped); no key;
//!      kind FLUSH: `flush_all` (`time` 0; records with a CAS below `cas` are dead) or
//!        `flush_all` delayed to `time` (records stored up to it die then); no key;
//!      kind CHAINED: as RECORD, for the head of a chained item, followed by a u64: the
//!        bytes the item counts in `extstore_bytes_used`.
//! ```
//! A chained item (a value larger than a slab chunk) is one head record and the pieces
//! of its value, written together, head first (so reclaiming pages oldest first reaches
//! the head before any piece). The head is a record whose value is the chain table
//! (`put_chain_table`): the crc of the whole value and each piece's flash location and
//! length. A piece is a record in the state CHAINED (never read as an item) whose
//! `flags` word is its index and whose `cas` is the item's, with the complement of the
//! record crc, so neither passes for the other. Pieces have no summary entries: nothing
//! points at them but their head.
//! A restart replays the summaries in page `seq` order (docs/flash.md).
//! A record's `crc` field covers its lengths, flags, exptime, time, CAS, key and value
//! (`record_crc`), so a record torn by a concurrent rewrite of its page, or read from a
//! page that now holds other records, never passes as an item.
use crate::item::{self, HDR};

pub const PAGE_HDR: usize = 64;
pub const MAGIC: u32 = 0x4C46_4D4D; // "MMFL"
/// Version 2 added chained items (kind CHAINED, pieces). A page of another version is
/// not read: a tier written by another format version starts empty (and an older
/// binary, which stops at an entry kind it does not know, never reads these pages).
pub const VERSION: u16 = 2;
/// Bytes of a summary entry before its key.
pub const SUMMARY_FIXED: usize = 24;
/// Summary entry kinds.
pub const KIND_RECORD: u8 = 0;
pub const KIND_INVALIDATE: u8 = 1;
pub const KIND_FLUSH: u8 = 2;
pub const KIND_CHAINED: u8 = 3;
/// Bytes of a chain table before its entries, and per entry.
pub const CHAIN_FIXED: usize = 8;
pub const CHAIN_ENTRY: usize = 16;

/// The fields of a record's header that it carries to flash.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct RecordHeader {
    pub class: u8,
    pub key_len: u8,
    pub iflags: u8,
    pub cas: u64,
    pub value_len: u32,
    pub flags: u32,
    pub exptime: u32,
    pub time: u32,
}

/// Bytes a record takes in a page (8-aligned).
pub fn record_len(key_len: usize, value_len: usize) -> usize {
    (HDR + key_len + value_len).next_multiple_of(8)
}

/// Bytes a record's summary entry takes.
pub fn summary_len(key_len: usize) -> usize {
    (SUMMARY_FIXED + key_len).next_multiple_of(8)
}

/// Bytes a chained item's head takes in a summary.
pub fn chained_summary_len(key_len: usize) -> usize {
    summary_len(key_len) + 8
}

/// Bytes of a chain table of `pieces` entries.
pub fn chain_table_len(pieces: usize) -> usize {
    CHAIN_FIXED + CHAIN_ENTRY * pieces
}

/// The crc a record carries: every header field it carries (class, lengths, flags,
/// exptime, time, CAS, marks), key and value.
pub fn record_crc(h: &RecordHeader, key: &[u8], value: &[&[u8]]) -> u32 {
    let mut fixed = [0u8; 27];
    fixed[25] = h.class;
    fixed[26] = h.iflags;
    fixed[0] = h.key_len;
    fixed[1..5].copy_from_slice(&h.value_len.to_le_bytes());
    fixed[5..9].copy_from_slice(&h.flags.to_le_bytes());
    fixed[9..13].copy_from_slice(&h.exptime.to_le_bytes());
    fixed[13..17].copy_from_slice(&h.time.to_le_bytes());
    fixed[17..25].copy_from_slice(&h.cas.to_le_bytes());
    let mut crc = memfabric_checksum::crc32c(&fixed);
    crc = memfabric_checksum::crc32c_append(crc, key);
    for v in value {
        crc = memfabric_checksum::crc32c_append(crc, v);
    }
    crc
}

/// Write a record at the start of `dst` (which is at least `record_len` long).
pub fn put_record(dst: &mut [u8], h: &RecordHeader, key: &[u8], value: &[&[u8]]) {
    put_any(dst, item::LINKED, record_crc(h, key, value), h, key, value)
}

/// Write piece `index` of the chained item (`key`, `cas`) at the start of `dst` (at
/// least `record_len(key.len(), piece length)` long).
pub fn put_piece(dst: &mut [u8], key: &[u8], cas: u64, index: u32, piece: &[&[u8]]) {
    let h = piece_header(key.len(), cas, index, piece.iter().map(|p| p.len()).sum());
    put_any(
        dst,
        item::CHAINED,
        !record_crc(&h, key, piece),
        &h,
        key,
        piece,
    )
}

fn piece_header(key_len: usize, cas: u64, index: u32, len: usize) -> RecordHeader {
    RecordHeader {
        class: 0,
        key_len: key_len as u8,
        iflags: 0,
        cas,
        value_len: len as u32,
        flags: index,
        exptime: 0,
        time: 0,
    }
}

fn put_any(dst: &mut [u8], state: u8, crc: u32, h: &RecordHeader, key: &[u8], value: &[&[u8]]) {
    dst[..HDR].fill(0);
    dst[item::OFF_STATE] = state;
    dst[item::OFF_CLASS] = h.class;
    dst[item::OFF_KEYLEN] = h.key_len;
    dst[item::OFF_IFLAGS] = h.iflags;
    dst[item::OFF_CAS..item::OFF_CAS + 8].copy_from_slice(&h.cas.to_le_bytes());
    dst[item::OFF_VLEN..item::OFF_VLEN + 4].copy_from_slice(&h.value_len.to_le_bytes());
    dst[item::OFF_FLAGS..item::OFF_FLAGS + 4].copy_from_slice(&h.flags.to_le_bytes());
    dst[item::OFF_EXPTIME..item::OFF_EXPTIME + 4].copy_from_slice(&h.exptime.to_le_bytes());
    dst[item::OFF_TIME..item::OFF_TIME + 4].copy_from_slice(&h.time.to_le_bytes());
    dst[item::OFF_CRC..item::OFF_CRC + 4].copy_from_slice(&crc.to_le_bytes());
    dst[HDR..HDR + key.len()].copy_from_slice(key);
    let mut at = HDR + key.len();
    for v in value {
        dst[at..at + v.len()].copy_from_slice(v);
        at += v.len();
    }
    let end = record_len(key.len(), at - HDR - key.len());
    dst[at..end].fill(0);
}

fn u32_at(b: &[u8], off: usize) -> u32 {
    u32::from_le_bytes(b[off..off + 4].try_into().unwrap_or([0; 4]))
}

fn u64_at(b: &[u8], off: usize) -> u64 {
    u64::from_le_bytes(b[off..off + 8].try_into().unwrap_or([0; 8]))
}

/// A record parsed and verified: header, key and value, as slices of `bytes`.
pub struct Record<'a> {
    pub h: RecordHeader,
    pub key: &'a [u8],
    pub value: &'a [u8],
}

/// Parse the record at the start of `bytes`; `None` unless it is whole and its crc
/// matches. Never trusts a length.
pub fn parse_record(bytes: &[u8]) -> Option<Record<'_>> {
    parse_any(bytes, item::LINKED)
}

/// Parse piece `index` of the chained item (`key`, `cas`) at the start of `bytes`: its
/// bytes of the value, `None` unless it is whole, its crc matches and it is that piece.
pub fn parse_piece<'a>(bytes: &'a [u8], key: &[u8], cas: u64, index: u32) -> Option<&'a [u8]> {
    // A piece's other header fields are always 0 (`put_piece`).
    parse_any(bytes, item::CHAINED)
        .filter(|r| r.key == key && r.h.cas == cas && r.h.flags == index)
        .filter(|r| (r.h.class, r.h.iflags, r.h.exptime, r.h.time) == (0, 0, 0, 0))
        .map(|r| r.value)
}

fn parse_any(bytes: &[u8], state: u8) -> Option<Record<'_>> {
    // A record's seq and atime words are always 0 on flash.
    if bytes.len() < HDR
        || bytes[item::OFF_STATE] != state
        || u32_at(bytes, item::OFF_SEQ) != 0
        || u32_at(bytes, item::OFF_ATIME) != 0
    {
        return None;
    }
    let h = RecordHeader {
        class: bytes[item::OFF_CLASS],
        key_len: bytes[item::OFF_KEYLEN],
        iflags: bytes[item::OFF_IFLAGS],
        cas: u64_at(bytes, item::OFF_CAS),
        value_len: u32_at(bytes, item::OFF_VLEN),
        flags: u32_at(bytes, item::OFF_FLAGS),
        exptime: u32_at(bytes, item::OFF_EXPTIME),
        time: u32_at(bytes, item::OFF_TIME),
    };
    let klen = h.key_len as usize;
    let vlen = h.value_len as usize;
    if klen == 0 || HDR.checked_add(klen)?.checked_add(vlen)? > bytes.len() {
        return None;
    }
    let key = &bytes[HDR..HDR + klen];
    let value = &bytes[HDR + klen..HDR + klen + vlen];
    let crc = record_crc(&h, key, &[value]);
    let crc = if state == item::CHAINED { !crc } else { crc };
    (crc == u32_at(bytes, item::OFF_CRC)).then_some(Record { h, key, value })
}

/// The value of a chained item's head: the crc32c of the whole value, then where each
/// piece is and how long it is.
pub fn put_chain_table(value_crc: u32, pieces: &[(u64, u32)]) -> Vec<u8> {
    let mut t = Vec::with_capacity(chain_table_len(pieces.len()));
    t.extend_from_slice(&value_crc.to_le_bytes());
    t.extend_from_slice(&(pieces.len() as u32).to_le_bytes());
    for &(loc, len) in pieces {
        t.extend_from_slice(&loc.to_le_bytes());
        t.extend_from_slice(&len.to_le_bytes());
        t.extend_from_slice(&[0; 4]);
    }
    t
}

/// A chain table read back: the value's crc and its pieces (location, length), if the
/// table is whole and its lengths add up to a value length (a u32).
pub fn parse_chain_table(t: &[u8]) -> Option<(u32, Vec<(u64, u32)>)> {
    if t.len() < CHAIN_FIXED {
        return None;
    }
    let n = u32_at(t, 4) as usize;
    if t.len() != chain_table_len(n) {
        return None;
    }
    let mut pieces = Vec::with_capacity(n);
    for i in 0..n {
        let at = CHAIN_FIXED + CHAIN_ENTRY * i;
        if u32_at(t, at + 12) != 0 {
            return None;
        }
        pieces.push((u64_at(t, at), u32_at(t, at + 8)));
    }
    pieces.iter().try_fold(0u32, |a, p| a.checked_add(p.1))?;
    Some((u32_at(t, 0), pieces))
}

/// One summary entry: a record (where it is and what a restart needs to index it), an
/// invalidation of an earlier record, or a flush.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct SummaryEntry<'a> {
    pub kind: u8,
    pub off: u32,
    pub class: u8,
    pub iflags: u8,
    pub exptime: u32,
    pub time: u32,
    /// The record's CAS; for an invalidation the flash location it invalidates.
    pub cas: u64,
    pub key: &'a [u8],
    /// A chained head's bytes in `extstore_bytes_used` (0 for the other kinds).
    pub bytes: u64,
}

impl SummaryEntry<'_> {
    /// A record or a chained item's head: something a slot can point at.
    pub fn is_record(&self) -> bool {
        self.kind == KIND_RECORD || self.kind == KIND_CHAINED
    }
}

pub fn put_summary(out: &mut Vec<u8>, off: u32, h: &RecordHeader, key: &[u8]) {
    put_entry(out, KIND_RECORD, off, h, key);
}

/// The summary entry of a chained item's head, counting `bytes` in `bytes_used`.
pub fn put_chained_summary(out: &mut Vec<u8>, off: u32, h: &RecordHeader, key: &[u8], bytes: u64) {
    put_entry(out, KIND_CHAINED, off, h, key);
    out.extend_from_slice(&bytes.to_le_bytes());
}

/// An invalidation of the record at flash location `loc`.
pub fn put_invalidation(out: &mut Vec<u8>, loc: u64) {
    let h = RecordHeader {
        class: 0,
        key_len: 0,
        iflags: 0,
        cas: loc,
        value_len: 0,
        flags: 0,
        exptime: 0,
        time: 0,
    };
    put_entry(out, KIND_INVALIDATE, 0, &h, &[]);
}

/// A flush: every item with a CAS below `cas` is dead (`time` 0), or what was stored up
/// to `time` dies when `time` comes.
pub fn put_flush(out: &mut Vec<u8>, time: u32, cas: u64) {
    let h = RecordHeader {
        class: 0,
        key_len: 0,
        iflags: 0,
        cas,
        value_len: 0,
        flags: 0,
        exptime: 0,
        time,
    };
    put_entry(out, KIND_FLUSH, 0, &h, &[]);
}

fn put_entry(out: &mut Vec<u8>, kind: u8, off: u32, h: &RecordHeader, key: &[u8]) {
    let start = out.len();
    out.extend_from_slice(&off.to_le_bytes());
    out.push(key.len() as u8);
    out.push(h.iflags);
    out.push(h.class);
    out.push(kind);
    out.extend_from_slice(&h.exptime.to_le_bytes());
    out.extend_from_slice(&h.time.to_le_bytes());
    out.extend_from_slice(&h.cas.to_le_bytes());
    out.extend_from_slice(key);
    out.resize(start + summary_len(key.len()), 0);
}

/// Bytes an entry takes in its summary.
fn entry_len(kind: u8, key_len: usize) -> usize {
    if kind == KIND_CHAINED {
        chained_summary_len(key_len)
    } else {
        summary_len(key_len)
    }
}

/// The entries of a summary that are not records (invalidations, flushes), as bytes.
pub fn non_records(s: &[u8]) -> Vec<u8> {
    let mut out = Vec::new();
    let mut at = 0;
    for e in summary_entries(s) {
        let len = entry_len(e.kind, e.key.len());
        if !e.is_record() {
            out.extend_from_slice(&s[at..at + len]);
        }
        at += len;
    }
    out
}

/// The entries of a summary; stops at the first entry that does not fit or make sense.
pub fn summary_entries(s: &[u8]) -> impl Iterator<Item = SummaryEntry<'_>> {
    let mut at = 0;
    std::iter::from_fn(move || {
        if at + SUMMARY_FIXED > s.len() {
            return None;
        }
        let klen = s[at + 4] as usize;
        let kind = s[at + 7];
        let end = at + entry_len(kind, klen);
        let sane = match kind {
            KIND_RECORD | KIND_CHAINED => klen > 0,
            KIND_INVALIDATE | KIND_FLUSH => klen == 0,
            _ => false,
        };
        if !sane || end > s.len() {
            return None;
        }
        let e = SummaryEntry {
            kind,
            off: u32_at(s, at),
            iflags: s[at + 5],
            class: s[at + 6],
            exptime: u32_at(s, at + 8),
            time: u32_at(s, at + 12),
            cas: u64_at(s, at + 16),
            key: &s[at + SUMMARY_FIXED..at + SUMMARY_FIXED + klen],
            bytes: if kind == KIND_CHAINED {
                u64_at(s, end - 8)
            } else {
                0
            },
        };
        at = end;
        Some(e)
    })
}

/// A page header.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct PageHeader {
    pub seq: u64,
    pub page: u32,
    pub records: u32,
    pub used: u32,
    pub summary_len: u32,
    pub summary_crc: u32,
}

pub fn put_page_header(dst: &mut [u8], p: &PageHeader) {
    dst[..PAGE_HDR].fill(0);
    dst[0..4].copy_from_slice(&MAGIC.to_le_bytes());
    dst[4..6].copy_from_slice(&VERSION.to_le_bytes());
    dst[8..16].copy_from_slice(&p.seq.to_le_bytes());
    dst[16..20].copy_from_slice(&p.page.to_le_bytes());
    dst[20..24].copy_from_slice(&p.records.to_le_bytes());
    dst[24..28].copy_from_slice(&p.used.to_le_bytes());
    dst[28..32].copy_from_slice(&p.summary_len.to_le_bytes());
    dst[32..36].copy_from_slice(&p.summary_crc.to_le_bytes());
    let crc = memfabric_checksum::crc32c(&dst[..60]);
    dst[60..64].copy_from_slice(&crc.to_le_bytes());
}

/// The header of a page of `page_size` bytes, if it is one of ours and consistent.
pub fn parse_page_header(b: &[u8], page_size: usize) -> Option<PageHeader> {
    if b.len() < PAGE_HDR
        || u32_at(b, 0) != MAGIC
        || u32_at(b, 60) != memfabric_checksum::crc32c(&b[..60])
        || u16::from_le_bytes([b[4], b[5]]) != VERSION
    {
        return None;
    }
    let p = PageHeader {
        seq: u64_at(b, 8),
        page: u32_at(b, 16),
        records: u32_at(b, 20),
        used: u32_at(b, 24),
        summary_len: u32_at(b, 28),
        summary_crc: u32_at(b, 32),
    };
    let end = (p.used as usize).checked_add(p.summary_len as usize)?;
    ((p.used as usize) >= PAGE_HDR && end <= page_size).then_some(p)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn hdr(klen: usize, vlen: usize) -> RecordHeader {
        RecordHeader {
            class: 7,
            key_len: klen as u8,
            iflags: 0,
            cas: 99,
            value_len: vlen as u32,
            flags: 5,
            exptime: 1234,
            time: 1000,
        }
    }

    #[test]
    fn records_round_trip_and_any_flipped_bit_is_caught() {
        let key = b"some:key";
        let value = b"the value of the key, 39 bytes long....";
        let h = hdr(key.len(), value.len());
        let mut buf = vec![0u8; record_len(key.len(), value.len())];
        put_record(&mut buf, &h, key, &[&value[..10], &value[10..]]);
        let r = parse_record(&buf).unwrap();
        assert_eq!((r.h, r.key, r.value), (h, &key[..], &value[..]));
        for byte in [0usize, 4, 5, 6, 7, 8, 16, 20, 24, 28, 32, 36, 40, 50, 80] {
            let mut bad = buf.clone();
            bad[byte] ^= 0x10;
            assert!(parse_record(&bad).is_none(), "flip at {byte} undetected");
        }
        assert!(parse_record(&buf[..buf.len() - 8]).is_none());
    }

    #[test]
    fn pieces_and_records_never_pass_for_each_other() {
        let key = b"big";
        let data = [&b"first part "[..], &b"and the second"[..]];
        let n: usize = data.iter().map(|d| d.len()).sum();
        let mut buf = vec![0u8; record_len(key.len(), n)];
        put_piece(&mut buf, key, 42, 3, &data);
        assert_eq!(
            parse_piece(&buf, key, 42, 3),
            Some(&b"first part and the second"[..])
        );
        assert!(parse_record(&buf).is_none());
        assert!(parse_piece(&buf, key, 42, 2).is_none(), "wrong index");
        assert!(parse_piece(&buf, key, 41, 3).is_none(), "wrong CAS");
        assert!(parse_piece(&buf, b"bug", 42, 3).is_none(), "wrong key");
        // The same fields as a record: its crc is not a piece's.
        let h = hdr(key.len(), n);
        put_record(&mut buf, &h, key, &data);
        buf[item::OFF_STATE] = item::CHAINED;
        assert!(parse_piece(&buf, key, 99, 0).is_none());
        let t = put_chain_table(7, &[(1 << 20, 100), (2 << 20, 5)]);
        assert_eq!(
            parse_chain_table(&t),
            Some((7, vec![(1 << 20, 100), (2 << 20, 5)]))
        );
        assert!(parse_chain_table(&t[..t.len() - 1]).is_none());
    }

    #[test]
    fn summaries_and_headers_round_trip() {
        let mut s = Vec::new();
        put_summary(&mut s, 64, &hdr(3, 10), b"abc");
        put_summary(&mut s, 120, &hdr(5, 10), b"defgh");
        put_invalidation(&mut s, 1 << 33);
        put_flush(&mut s, 77, 0);
        put_chained_summary(&mut s, 4096, &hdr(2, 40), b"xy", 1_234_567);
        let e: Vec<_> = summary_entries(&s).collect();
        assert_eq!(e.len(), 5);
        assert_eq!(
            (e[4].kind, e[4].key, e[4].bytes),
            (KIND_CHAINED, &b"xy"[..], 1_234_567)
        );
        assert!(e[4].is_record() && e[0].is_record() && !e[2].is_record());
        assert_eq!((e[0].kind, e[0].class), (KIND_RECORD, 7));
        assert_eq!((e[2].kind, e[2].cas), (KIND_INVALIDATE, 1 << 33));
        assert_eq!((e[3].kind, e[3].time), (KIND_FLUSH, 77));
        assert_eq!((e[0].off, e[0].key, e[0].exptime), (64, &b"abc"[..], 1234));
        assert_eq!((e[1].off, e[1].key, e[1].cas), (120, &b"defgh"[..], 99));
        // A truncated summary yields what is whole.
        assert_eq!(summary_entries(&s[..s.len() - 1]).count(), 4);
        let p = PageHeader {
            seq: 7,
            page: 3,
            records: 2,
            used: 200,
            summary_len: s.len() as u32,
            summary_crc: memfabric_checksum::crc32c(&s),
        };
        let mut page = vec![0u8; 4096];
        put_page_header(&mut page, &p);
        assert_eq!(parse_page_header(&page, 4096), Some(p));
        page[9] ^= 1;
        assert_eq!(parse_page_header(&page, 4096), None);
    }
}
