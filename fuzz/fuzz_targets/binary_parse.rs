#![no_main]
//! The binary request framer on arbitrary bytes (the first byte forced to the request
//! magic half the time, so that framing is exercised, not only the magic check).
//! Beyond "never panics" it checks what the executor relies on:
//! - `NeedMore(n)` and `ValuePending { total }` ask for more than is there;
//! - a complete request occupies at least its 24-byte header and at least the header,
//!   extras and key it was judged on;
//! - framing is prefix-stable: whatever a prefix of the input frames as (a request or
//!   an error), the whole input frames the same way, so replies cannot depend on how
//!   the input was split into reads;
//! - a parsed header encodes back to the bytes it came from.
use libfuzzer_sys::fuzz_target;
use memfabric_proto::binary::{parse_request, Frame, RequestHeader, HEADER_LEN, REQUEST_MAGIC};

fuzz_target!(|data: &[u8]| {
    // The prefetch hint names a key inside the input, or nothing.
    if let Some(k) = memfabric_proto::key_hint::first_key(data) {
        let inside = data.as_ptr_range();
        assert!(!k.is_empty() && k.len() <= memfabric_proto::KEY_MAX_LEN);
        assert!(inside.start <= k.as_ptr() && k.as_ptr_range().end <= inside.end);
    }
    let Some((&mode, rest)) = data.split_first() else {
        return;
    };
    let mut input = rest.to_vec();
    if mode & 1 == 1 {
        if let Some(b) = input.first_mut() {
            *b = REQUEST_MAGIC;
        }
    }
    let whole = parse_request(&input);
    match &whole {
        Ok(Frame::NeedMore(n)) => assert!(*n > input.len()),
        Ok(Frame::ValuePending { total, head, .. }) => {
            assert!(*total > input.len());
            assert!(head.key.len() <= 250);
        }
        Ok(Frame::Request { request, len }) => {
            assert!(*len >= HEADER_LEN as u64);
            assert!(*len >= request.header.head_len() as u64);
            let mut enc = Vec::new();
            request.header.encode(&mut enc);
            assert_eq!(&enc[..], &input[..HEADER_LEN]);
            assert_eq!(RequestHeader::parse(&enc), Ok(Some(request.header)));
        }
        Err(_) => {}
    }
    // Prefix stability, at a cut chosen by the mode byte.
    let cut = (mode as usize >> 1) % (input.len() + 1);
    match parse_request(&input[..cut]) {
        Ok(Frame::NeedMore(_)) | Ok(Frame::ValuePending { .. }) => {}
        prefix => assert_eq!(prefix, whole),
    }
});
