#![no_main]
//! The flash tier's on-flash decoders on arbitrary bytes (what a restart or a read finds
//! on a damaged, truncated or foreign file): page header, record and summary parsers
//! never panic; a record they accept encodes back to the same bytes (so its crc covered
//! every byte that was read), a chained item's piece and chain table likewise, and
//! summary entries stay within the bytes given.
use libfuzzer_sys::fuzz_target;
use memfabric_store::flash::format::{
    parse_chain_table, parse_page_header, parse_piece, parse_record, put_chain_table,
    put_piece, put_record, record_len, summary_entries, PAGE_HDR,
};

fuzz_target!(|data: &[u8]| {
    if let Some(h) = parse_page_header(data, data.len().max(PAGE_HDR)) {
        assert!(h.used as usize >= PAGE_HDR);
        assert!(h.used as usize + h.summary_len as usize <= data.len().max(PAGE_HDR));
    }
    if let Some(r) = parse_record(data) {
        assert!(!r.key.is_empty());
        let n = record_len(r.key.len(), r.value.len());
        let mut again = vec![0u8; n];
        put_record(&mut again, &r.h, r.key, &[r.value]);
        let whole = 40 + r.key.len() + r.value.len();
        assert_eq!(&again[..whole], &data[..whole]);
    }
    // A piece of a chained item whose key and CAS the input's own header names.
    if data.len() > 48 {
        let klen = data[6] as usize;
        let cas = u64::from_le_bytes(data[8..16].try_into().unwrap());
        let index = u32::from_le_bytes(data[20..24].try_into().unwrap());
        if let Some(key) = data.get(40..40 + klen) {
            if let Some(piece) = parse_piece(data, key, cas, index) {
                assert!(parse_record(data).is_none(), "a piece passed for a record");
                let mut again = vec![0u8; record_len(klen, piece.len())];
                put_piece(&mut again, key, cas, index, &[piece]);
                let whole = 40 + klen + piece.len();
                assert_eq!(&again[..whole], &data[..whole]);
            }
        }
    }
    if let Some((crc, pieces)) = parse_chain_table(data) {
        assert_eq!(put_chain_table(crc, &pieces), data);
    }
    let mut seen = 0;
    for e in summary_entries(data) {
        seen += 24 + e.key.len() + if e.kind == 3 { 8 } else { 0 };
        assert!(seen <= data.len());
    }
});
