#![no_main]
//! The flash tier's on-flash decoders on arbitrary bytes (what a restart or a read finds
//! on a damaged, truncated or foreign file): page header, record and summary parsers
//! never panic; a record they accept encodes back to the same bytes (so its crc covered
//! every byte that was read), and summary entries stay within the bytes given.
use libfuzzer_sys::fuzz_target;
use memfabric_store::flash::format::{
    parse_page_header, parse_record, put_record, record_len, summary_entries, PAGE_HDR,
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
    let mut seen = 0;
    for e in summary_entries(data) {
        seen += 24 + e.key.len();
        assert!(seen <= data.len());
    }
});
