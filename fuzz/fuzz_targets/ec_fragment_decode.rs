#![no_main]
//! The erasure-coded fragment decoder on arbitrary bytes: it never panics; what it
//! accepts has a possible geometry and exactly the payload its header implies, and
//! encodes back to the same bytes.
use libfuzzer_sys::fuzz_target;
use memfabric_proto::ec_fragment::{shard_len, FragmentHeader, HEADER_LEN};

fuzz_target!(|data: &[u8]| {
    if let Ok((h, payload)) = FragmentHeader::decode(data) {
        assert!(h.k >= 1 && u16::from(h.k) + u16::from(h.m) <= 255);
        assert!(u16::from(h.index) < u16::from(h.k) + u16::from(h.m));
        assert_eq!(payload.len() as u64, shard_len(h.value_len, h.k));
        assert_eq!(payload.len() + HEADER_LEN, data.len());
        let mut again = Vec::new();
        h.encode(payload, &mut again);
        assert_eq!(again, data);
    }
});
