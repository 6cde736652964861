#![no_main]
//! A metadump line on arbitrary bytes (what a server the pool walks may send): the parser
//! never panics, and what it accepts as an item has a key memcached could store.
use libfuzzer_sys::fuzz_target;
use memfabric_proto::metadump::{parse_line, DumpLine};
use memfabric_proto::KEY_MAX_LEN;

fuzz_target!(|data: &[u8]| {
    if let Ok(DumpLine::Entry(e)) = parse_line(data) {
        assert!(!e.key.is_empty() && e.key.len() <= KEY_MAX_LEN);
        assert!(data.starts_with(b"key="));
    }
});
