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
//!        `flush_all` delayed to `time` (records stored up to it die then); no key.
//! ```
//! A restart replays the summaries in page `seq` order (docs/flash.md).
//! A record's `crc` field covers its lengths, flags, exptime, time, CAS, key and value
//! (`record_crc`), so a record torn by a concurrent rewrite of its page, or read from a
//! page that now holds other records, never passes as an item.
use crate::item::{self, HDR};

pub const PAGE_HDR: usize = 64;
pub const MAGIC: u32 = 0x4C46_4D4D; // "MMFL"
pub const VERSION: u16 = 1;
/// Bytes of a summary entry before its key.
pub const SUMMARY_FIXED: usize = 24;
/// Summary entry kinds.
pub const KIND_RECORD: u8 = 0;
pub const KIND_INVALIDATE: u8 = 1;
pub const KIND_FLUSH: u8 = 2;

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
    let mut crc = crc32c::crc32c(&fixed);
    crc = crc32c::crc32c_append(crc, key);
    for v in value {
        crc = crc32c::crc32c_append(crc, v);
    }
    crc
}

/// Write a record at the start of `dst` (which is at least `record_len` long).
pub fn put_record(dst: &mut [u8], h: &RecordHeader, key: &[u8], value: &[&[u8]]) {
    let crc = record_crc(h, key, value);
    dst[..HDR].fill(0);
    dst[item::OFF_STATE] = item::LINKED;
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
    // A record's seq and atime words are always 0 on flash.
    if bytes.len() < HDR
        || bytes[item::OFF_STATE] != item::LINKED
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
    (record_crc(&h, key, &[value]) == u32_at(bytes, item::OFF_CRC)).then_some(Record {
        h,
        key,
        value,
    })
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
}

pub fn put_summary(out: &mut Vec<u8>, off: u32, h: &RecordHeader, key: &[u8]) {
    put_entry(out, KIND_RECORD, off, h, key);
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

/// The entries of a summary that are not records (invalidations, flushes), as bytes.
pub fn non_records(s: &[u8]) -> Vec<u8> {
    let mut out = Vec::new();
    let mut at = 0;
    for e in summary_entries(s) {
        let len = summary_len(e.key.len());
        if e.kind != KIND_RECORD {
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
        let end = at + summary_len(klen);
        let sane = match kind {
            KIND_RECORD => klen > 0,
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
    let crc = crc32c::crc32c(&dst[..60]);
    dst[60..64].copy_from_slice(&crc.to_le_bytes());
}

/// The header of a page of `page_size` bytes, if it is one of ours and consistent.
pub fn parse_page_header(b: &[u8], page_size: usize) -> Option<PageHeader> {
    if b.len() < PAGE_HDR
        || u32_at(b, 0) != MAGIC
        || u32_at(b, 60) != crc32c::crc32c(&b[..60])
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
    fn summaries_and_headers_round_trip() {
        let mut s = Vec::new();
        put_summary(&mut s, 64, &hdr(3, 10), b"abc");
        put_summary(&mut s, 120, &hdr(5, 10), b"defgh");
        put_invalidation(&mut s, 1 << 33);
        put_flush(&mut s, 77, 0);
        let e: Vec<_> = summary_entries(&s).collect();
        assert_eq!(e.len(), 4);
        assert_eq!((e[0].kind, e[0].class), (KIND_RECORD, 7));
        assert_eq!((e[2].kind, e[2].cas), (KIND_INVALIDATE, 1 << 33));
        assert_eq!((e[3].kind, e[3].time), (KIND_FLUSH, 77));
        assert_eq!((e[0].off, e[0].key, e[0].exptime), (64, &b"abc"[..], 1234));
        assert_eq!((e[1].off, e[1].key, e[1].cas), (120, &b"defgh"[..], 99));
        // A truncated summary yields what is whole.
        assert_eq!(summary_entries(&s[..s.len() - 1]).count(), 3);
        let p = PageHeader {
            seq: 7,
            page: 3,
            records: 2,
            used: 200,
            summary_len: s.len() as u32,
            summary_crc: crc32c::crc32c(&s),
        };
        let mut page = vec![0u8; 4096];
        put_page_header(&mut page, &p);
        assert_eq!(parse_page_header(&page, 4096), Some(p));
        page[9] ^= 1;
        assert_eq!(parse_page_header(&page, 4096), None);
    }
}
