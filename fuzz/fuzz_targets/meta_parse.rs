#![no_main]
//! The meta parser on arbitrary input: it must never panic, every accepted request must
//! respect memcached's limits, and framing must not depend on where the input is cut.
use libfuzzer_sys::fuzz_target;
use memfabric_proto::meta::{self, MetaCommand};

fuzz_target!(|data: &[u8]| {
    let _ = meta::is_meta_line(data);
    let _ = meta::decode_base64_key(data);

    // Line by line, as a connection frames its input.
    let mut at = 0;
    let mut whole = Vec::new();
    while let Some((line, used)) = meta::split_line(&data[at..]) {
        assert!(used > 0 && at + used <= data.len());
        let r = meta::parse(line);
        if let Ok(req) = &r {
            assert!(req.flags.tokens().len() <= meta::MAX_FLAGS);
            assert!(req.key.len() <= memfabric_proto::KEY_MAX_LEN);
            assert!(req.flags.tokens().iter().all(|t| !t.is_empty()));
            if req.command != MetaCommand::Set {
                assert_eq!(req.data_len, 0);
            }
        }
        if let Err(e) = &r {
            // Only ms knows a data length to discard.
            assert!(e.swallow == 0 || e.swallow >= 2);
        }
        whole.push(format!("{r:?}"));
        at += used;
    }

    // The same input cut in two at a point taken from the data itself.
    if let Some(&b) = data.first() {
        let cut = (b as usize * data.len()) / 256;
        let mut pending = data[..cut].to_vec();
        let mut got = Vec::new();
        let mut drain = |buf: &mut Vec<u8>| {
            let mut at = 0;
            while let Some((line, used)) = meta::split_line(&buf[at..]) {
                got.push(format!("{:?}", meta::parse(line)));
                at += used;
            }
            buf.drain(..at);
        };
        drain(&mut pending);
        pending.extend_from_slice(&data[cut..]);
        drain(&mut pending);
        assert_eq!(got, whole);
    }

    // Reply encoders accept any bytes.
    let mut out = Vec::new();
    meta::push_key(&mut out, data, true);
    meta::push_key(&mut out, data, false);
    meta::push_opaque(&mut out, data);
});
