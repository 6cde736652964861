#![no_main]
//! The UCX wire protocol's decoders (AM request/response headers, move answers, READY, bootstrap frames) on
//! arbitrary input: never panic, and whatever decodes re-encodes to the same bytes.
use libfuzzer_sys::fuzz_target;
use memfabric_proto::ucx_wire;

fuzz_target!(|data: &[u8]| {
    if let Ok(r) = ucx_wire::decode_request(data) {
        assert!(r.key.len() <= memfabric_proto::KEY_MAX_LEN);
        assert_eq!(r.to_vec(), data);
    }
    if let Ok(r) = ucx_wire::decode_response(data) {
        // The two reserved bytes are not kept; everything else round-trips.
        let e = r.encode();
        assert_eq!((&e[..2], &e[4..]), (&data[..2], &data[4..]));
    }
    let _ = ucx_wire::request_ids(data);
    if let Ok(a) = ucx_wire::decode_move_answer(data) {
        // The reserved byte (3) is not kept; everything else round-trips.
        let e = a.encode();
        assert_eq!((&e[..3], &e[4..]), (&data[..3], &data[4..]));
    }
    if let Ok(r) = ucx_wire::decode_ready(data) {
        // The reserved bytes (2, 3) are not kept; everything else round-trips.
        let e = r.encode();
        assert_eq!((&e[..2], &e[4..]), (&data[..2], &data[4..]));
    }
    if let Ok(Some((h, used))) = ucx_wire::decode_hello(data) {
        assert!(used <= data.len());
        assert!(h.worker_address.len() <= ucx_wire::BLOB_MAX);
    }
    if let Ok(Some((c, used))) = ucx_wire::decode_challenge(data) {
        assert_eq!(used, 8 + ucx_wire::NONCE_LEN);
        // The flags byte (7) is not kept; everything else round-trips.
        let e = c.encode();
        assert_eq!((&e[..7], &e[8..]), (&data[..7], &data[8..used]));
    }
    if let Ok(Some((p, used))) = ucx_wire::decode_proof(data) {
        assert!(p.user.len() <= ucx_wire::USER_MAX);
        assert_eq!(used, 12 + p.user.len() + ucx_wire::MAC_LEN);
    }
    if let Ok(Some((w, used))) = ucx_wire::decode_welcome(data) {
        assert!(used <= data.len());
        assert!(w.arena_rkey.len() <= ucx_wire::BLOB_MAX);
    }
});
