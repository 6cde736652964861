#![no_main]
//! The client's meta reply decoder on arbitrary input, as each kind of request would read
//! it: it must never panic, a decoded reply must lie within the input (its value inside
//! the bytes it used), an incomplete one must ask for more than it has, and the answer
//! must not depend on how much of the stream follows the reply.
use libfuzzer_sys::fuzz_target;
use memfabric_proto::meta_client::{decode, Decoded, Expect, Reply};

const EXPECTS: [Expect; 10] = [
    Expect::Get,
    Expect::Store,
    Expect::Delete,
    Expect::Arith,
    Expect::Touch,
    Expect::Ttl,
    Expect::FlushAll,
    Expect::Stats,
    Expect::Version,
    Expect::Noop,
];

fuzz_target!(|data: &[u8]| {
    // The first byte picks the request kind; the rest is the stream.
    let Some((&pick, stream)) = data.split_first() else {
        return;
    };
    let expect = EXPECTS[pick as usize % EXPECTS.len()];
    // Replies are read back to back, as a pipelining connection reads them.
    let mut at = 0;
    while at < stream.len() {
        let buf = &stream[at..];
        match decode(buf, expect) {
            Err(_) => break,
            Ok(Decoded::Incomplete { need }) => {
                assert!(need > buf.len());
                break;
            }
            Ok(Decoded::Done { reply, len }) => {
                assert!(len > 0 && len <= buf.len());
                if let Ok(Reply::Value(Some(v))) = &reply {
                    assert!(v.data.start <= v.data.end && v.data.end + 2 == len);
                }
                // The reply alone decodes the same as the reply with the stream after it.
                assert_eq!(
                    decode(&buf[..len], expect),
                    Ok(Decoded::Done { reply, len })
                );
                at += len;
            }
        }
    }
});
