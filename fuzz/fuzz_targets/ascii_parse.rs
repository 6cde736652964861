//! Fuzz the classic ascii parser: it must never panic, must never claim more bytes than
//! it was given, must agree with itself when the input arrives in two pieces, and what
//! it parses and can encode must parse back to the same request.
#![no_main]
use libfuzzer_sys::fuzz_target;
use memfabric_proto::ascii::{parse, Limits, Parse};

fuzz_target!(|data: &[u8]| {
    // The prefetch hint names a key inside the input, or nothing.
    if let Some(k) = memfabric_proto::key_hint::first_key(data) {
        let inside = data.as_ptr_range();
        assert!(!k.is_empty() && k.len() <= memfabric_proto::KEY_MAX_LEN);
        assert!(inside.start <= k.as_ptr() && k.as_ptr_range().end <= inside.end);
    }
    // Small limits so that the long-line and too-large paths are reached too.
    let limits = Limits {
        max_line: 64,
        max_multiget_line: 512,
        item_size_max: 256,
    };
    let whole = parse(data, &limits, 0);
    match &whole {
        Parse::Complete { req, len } => {
            assert!(*len > 0 && *len <= data.len());
            let mut enc = Vec::new();
            if req.encode(&mut enc).is_ok() {
                match parse(&enc, &Limits::default(), 0) {
                    Parse::Complete { req: again, len } => {
                        assert_eq!(len, enc.len());
                        assert_eq!(&again, req);
                    }
                    other => panic!("re-parse of {enc:?} gave {other:?}"),
                }
            }
        }
        Parse::Incomplete { scanned, .. } => assert!(*scanned <= data.len()),
        Parse::Close(_) => {}
    }
    // Feeding a prefix first gives either "incomplete" or the same answer, except that a
    // prefix without a newline may already be too long (memcached closes then as well).
    if data.len() > 1 {
        let cut = data[0] as usize % data.len();
        match parse(&data[..cut], &limits, 0) {
            Parse::Incomplete { scanned, .. } => {
                assert_eq!(parse(data, &limits, scanned), whole);
            }
            Parse::Close(_) => {}
            done => assert_eq!(done, whole),
        }
    }
});
