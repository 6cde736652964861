#![no_main]
//! The fabric protocol's decoders (AM request/response headers, bootstrap frames) on
//! arbitrary input: never panic, and whatever decodes re-encodes to the same bytes.
use libfuzzer_sys::fuzz_target;
use memfabric_proto::fabric;

fuzz_target!(|data: &[u8]| {
    if let Ok(r) = fabric::decode_request(data) {
        assert!(r.key.len() <= fabric::KEY_MAX);
        assert_eq!(r.to_vec(), data);
    }
    if let Ok(r) = fabric::decode_response(data) {
        // The two reserved bytes are not kept; everything else round-trips.
        let e = r.encode();
        assert_eq!((&e[..2], &e[4..]), (&data[..2], &data[4..]));
    }
    let _ = fabric::request_ids(data);
    if let Ok(Some((h, used))) = fabric::decode_hello(data) {
        assert!(used <= data.len());
        assert!(h.worker_address.len() <= fabric::BLOB_MAX);
    }
    if let Ok(Some((w, used))) = fabric::decode_welcome(data) {
        assert!(used <= data.len());
        assert!(w.arena_rkey.len() <= fabric::BLOB_MAX);
    }
});
