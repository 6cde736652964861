//! Large values and long multiget lines through `exec::process` on every protocol: a
//! value that has not fully arrived is received straight into item memory, a large value
//! is answered from pinned item memory, and a multiget line longer than 64 KiB is served
//! as it arrives. Whatever the points at which the input is split, the replies and the
//! stored values are those of the same bytes given at once.
use std::sync::Arc;

use memfabric_proto::binary::{opcode, write_request};
use memfabric_server::counters::ThreadStats;
use memfabric_server::exec::{process, ExecCtx, Session, Shared, Transport};
use memfabric_server::outqueue::OutQueue;
use memfabric_server::settings::Settings;
use memfabric_store::Store;
use proptest::prelude::*;

fn server() -> Shared {
    let settings = Settings::default();
    let store = Store::new(settings.store.clone()).expect("store");
    Shared::new(settings, store)
}

/// Feed `chunks` as reads, keeping unconsumed input as a connection does; returns every
/// reply byte.
fn run(shared: &Shared, stats: &Arc<ThreadStats>, chunks: &[&[u8]]) -> Vec<u8> {
    let mut sess = Session::default();
    let mut pending = Vec::new();
    let mut queue = OutQueue::new();
    let mut replies = Vec::new();
    for chunk in chunks {
        pending.extend_from_slice(chunk);
        loop {
            let mut ctx = ExecCtx {
                shared,
                stats,
                transport: Transport::Tcp,
                conn_id: 1,
                waiter: None,
                completion: None,
            };
            let p = process(&mut ctx, &mut sess, &pending, &mut queue, 1000);
            replies.extend(queue.take_vec());
            pending.drain(..p.consumed);
            assert!(!p.close, "closed");
            if p.consumed == 0 {
                break;
            }
        }
    }
    replies
}

fn value(n: usize, seed: u8) -> Vec<u8> {
    (0..n)
        .map(|i| b'a' + ((i + seed as usize) % 26) as u8)
        .collect()
}

/// A session of large stores and reads on all three protocols.
fn session_bytes() -> Vec<u8> {
    let big = value(100_000, 1);
    let other = value(40_000, 7);
    let mut b = Vec::new();
    // ascii: set, append, a bad data chunk, cas, get of all.
    b.extend_from_slice(format!("set a 5 0 {}\r\n", big.len()).as_bytes());
    b.extend_from_slice(&big);
    b.extend_from_slice(b"\r\n");
    b.extend_from_slice(format!("append a 0 0 {}\r\n", other.len()).as_bytes());
    b.extend_from_slice(&other);
    b.extend_from_slice(b"\r\n");
    b.extend_from_slice(format!("set bad 0 0 {}\r\n", other.len()).as_bytes());
    b.extend_from_slice(&other);
    b.extend_from_slice(b"XY");
    b.extend_from_slice(format!("add a 0 0 {} noreply\r\n", other.len()).as_bytes());
    b.extend_from_slice(&other);
    b.extend_from_slice(b"\r\n");
    b.extend_from_slice(b"get a bad a\r\n");
    // meta: ms with opaque, base64 key, quiet; mg.
    b.extend_from_slice(format!("ms bWs= {} b O77 F3 T0\r\n", big.len()).as_bytes());
    b.extend_from_slice(&big);
    b.extend_from_slice(b"\r\n");
    b.extend_from_slice(format!("ms mq {} q\r\n", other.len()).as_bytes());
    b.extend_from_slice(&other);
    b.extend_from_slice(b"\r\n");
    b.extend_from_slice(b"mg mk v f\r\nmg mq s v\r\nmn\r\n");
    // binary: SETQ, ADD that fails, GETK.
    write_request(
        &mut b,
        opcode::SETQ,
        9,
        0,
        &[0, 0, 0, 4, 0, 0, 0, 0],
        b"bk",
        &big,
    );
    write_request(&mut b, opcode::ADD, 10, 0, &[0; 8], b"bk", &other);
    write_request(&mut b, opcode::GETK, 11, 0, &[], b"bk", &[]);
    b
}

#[test]
fn large_values_on_every_protocol_round_trip() {
    let s = server();
    let stats = s.register_thread();
    let input = session_bytes();
    // The binary part needs its own connection (the first byte picks the protocol).
    let split = input
        .windows(1)
        .position(|w| w[0] == 0x80)
        .expect("binary part");
    let text = run(&s, &stats, &[&input[..split]]);
    let big = value(100_000, 1);
    let other = value(40_000, 7);
    let mut want = Vec::new();
    want.extend_from_slice(b"STORED\r\nSTORED\r\nCLIENT_ERROR bad data chunk\r\n");
    want.extend_from_slice(format!("VALUE a 5 {}\r\n", big.len() + other.len()).as_bytes());
    want.extend_from_slice(&big);
    want.extend_from_slice(&other);
    want.extend_from_slice(b"\r\n");
    want.extend_from_slice(format!("VALUE a 5 {}\r\n", big.len() + other.len()).as_bytes());
    want.extend_from_slice(&big);
    want.extend_from_slice(&other);
    want.extend_from_slice(b"\r\nEND\r\n");
    want.extend_from_slice(b"HD O77\r\n");
    want.extend_from_slice(format!("VA {} f3\r\n", big.len()).as_bytes());
    want.extend_from_slice(&big);
    want.extend_from_slice(b"\r\n");
    want.extend_from_slice(format!("VA {} s{}\r\n", other.len(), other.len()).as_bytes());
    want.extend_from_slice(&other);
    want.extend_from_slice(b"\r\nMN\r\n");
    assert_eq!(
        String::from_utf8_lossy(&text),
        String::from_utf8_lossy(&want)
    );

    let bin = run(&s, &stats, &[&input[split..]]);
    // ADD of an existing key: KeyExists (status 2), then GETK's hit with the value.
    assert_eq!(bin[0], 0x81);
    assert_eq!(bin[1], opcode::ADD);
    assert_eq!(u16::from_be_bytes([bin[6], bin[7]]), 2);
    let add_len = 24 + u32::from_be_bytes([bin[8], bin[9], bin[10], bin[11]]) as usize;
    let getk = &bin[add_len..];
    assert_eq!(getk[1], opcode::GETK);
    assert_eq!(u16::from_be_bytes([getk[6], getk[7]]), 0);
    assert!(getk.ends_with(&big));
    assert_eq!(getk.len(), 24 + 4 + 2 + big.len());
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 24, ..ProptestConfig::default() })]

    /// Split anywhere (including inside values, their `\r\n` and the binary headers),
    /// the replies are those of the whole input.
    #[test]
    fn large_values_give_the_same_replies_however_the_input_is_split(
        cuts in proptest::collection::vec(any::<prop::sample::Index>(), 1..12),
    ) {
        let input = session_bytes();
        let split = input.iter().position(|&b| b == 0x80).expect("binary part");
        for part in [&input[..split], &input[split..]] {
            let whole = {
                let s = server();
                let stats = s.register_thread();
                run(&s, &stats, &[part])
            };
            let mut points: Vec<usize> = cuts.iter().map(|c| c.index(part.len())).collect();
            points.sort_unstable();
            points.dedup();
            let mut chunks = Vec::new();
            let mut at = 0;
            for p in points {
                chunks.push(&part[at..p]);
                at = p;
            }
            chunks.push(&part[at..]);
            let s = server();
            let stats = s.register_thread();
            let pieces = run(&s, &stats, &chunks);
            prop_assert_eq!(pieces, whole);
        }
    }
}

/// A multiget line long enough to be served as it arrives, ending in `last_key`.
fn long_get_line(verb: &str, last_key: &[u8], after: &[u8]) -> Vec<u8> {
    let mut line = verb.as_bytes().to_vec();
    for i in 0..10_000 {
        line.extend_from_slice(format!(" key{i:05}").as_bytes());
    }
    line.push(b' ');
    line.extend_from_slice(last_key);
    line.extend_from_slice(after);
    line
}

/// Replies to `setup` then `line` + `mn`, with `line` cut at every point in `cuts`
/// (counted from its end).
fn replies_split_near_the_end(setup: &[u8], line: &[u8], cuts: &[usize]) -> Vec<Vec<u8>> {
    cuts.iter()
        .map(|&from_end| {
            let s = server();
            let stats = s.register_thread();
            let mut input = setup.to_vec();
            let at = input.len() + line.len() - from_end;
            input.extend_from_slice(line);
            input.extend_from_slice(b"mn\r\n");
            run(&s, &stats, &[&input[..at], &input[at..]])
        })
        .collect()
}

#[test]
fn a_streamed_multiget_ending_in_a_250_byte_key_serves_it_wherever_the_line_is_cut() {
    let key = [b'K'; 250];
    let mut setup = b"set ".to_vec();
    setup.extend_from_slice(&key);
    setup.extend_from_slice(b" 0 0 3\r\nabc\r\n");
    // (Only get and gets lines may be this long while they arrive: memcached closes a
    // connection whose unfinished line of anything else passes 2048 bytes.)
    for verb in ["get", "gets"] {
        let line = long_get_line(verb, &key, b"\r\n");
        // Whole, between `\r` and `\n`, before the `\r`, inside the key, before it.
        for reply in replies_split_near_the_end(&setup, &line, &[0, 1, 2, 12, 252]) {
            let text = String::from_utf8_lossy(&reply);
            assert!(
                text.starts_with("STORED\r\nVALUE KKK"),
                "{verb}: {text:.80}"
            );
            assert!(text.ends_with("abc\r\nEND\r\nMN\r\n"), "{verb}: {text:.80}");
        }
    }
}

#[test]
fn a_streamed_multiget_with_a_too_long_key_answers_only_the_error_wherever_the_line_is_cut() {
    let line = long_get_line("get", &[b'x'; 300], b" more\r\n");
    // The line's end in the same read, in a later read, and the bad key cut in two.
    for reply in replies_split_near_the_end(b"", &line, &[0, 1, 7, 100, 400]) {
        assert_eq!(
            String::from_utf8_lossy(&reply),
            "CLIENT_ERROR bad command line format\r\nMN\r\n"
        );
    }
}
