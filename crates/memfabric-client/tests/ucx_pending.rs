//! A UCX request that completes later (the server's test store holds `slow:` keys until
//! `debug release`) is answered by its own id after later requests, without blocking the
//! session or the server's only worker.

mod common;

use std::io::{Read, Write};
use std::net::TcpStream;
use std::time::{Duration, Instant};

use bytes::Bytes;
use common::{Kind, Server};
use memfabric_client::{Client, Config, GetMode, Op, Reply, StoreMode, StoreStatus};

const TIMEOUT: Duration = Duration::from_secs(10);

/// One ascii line request on the server's TCP port; the reply line.
fn admin(tcp: &mut TcpStream, line: &str) -> String {
    tcp.write_all(format!("{line}\r\n").as_bytes())
        .expect("write");
    let mut reply = Vec::new();
    let mut byte = [0u8; 1];
    while !reply.ends_with(b"\r\n") {
        tcp.read_exact(&mut byte).expect("read");
        reply.push(byte[0]);
    }
    String::from_utf8_lossy(&reply).trim_end().to_string()
}

fn value(r: Reply) -> Vec<u8> {
    match r {
        Reply::Value(Some(v)) => v.data.to_vec(),
        r => panic!("not a hit: {r:?}"),
    }
}

#[test]
fn a_held_ucx_get_completes_after_later_ones_by_its_own_id() {
    let server = Server::start(
        Kind::MemfabricdUcx,
        &["-t", "1", "--debug-hold-keys", "slow:"],
    );
    let mut tcp = TcpStream::connect(server.addr()).expect("tcp");
    tcp.set_read_timeout(Some(TIMEOUT)).expect("timeout");
    // Two-sided: a one-sided GET reads item memory without asking the server, and the
    // test store holds only what the server is asked.
    let config = Config {
        get_mode: GetMode::TwoSided,
        ..Config::default()
    };
    let mut c = Client::new(server.url().as_str(), config).expect("client");
    for (k, v) in [("x", "X"), ("slow:1", "SS"), ("y", "Y")] {
        let h = c.iset(k.as_bytes(), Bytes::from(v), 0, 0);
        assert!(matches!(c.wait(h, TIMEOUT), Ok(Reply::Stored(_))));
    }
    let slow = c.iget(b"slow:1");
    let x = c.iget(b"x");
    let y = c.iget(b"y");
    // Later requests complete while the slow one waits.
    assert_eq!(value(c.wait(x, TIMEOUT).expect("x")), b"X");
    assert_eq!(value(c.wait(y, TIMEOUT).expect("y")), b"Y");
    let start = Instant::now();
    while admin(&mut tcp, "debug held") != "HELD 1" {
        assert!(start.elapsed() < TIMEOUT, "the slow get was never held");
        std::thread::sleep(Duration::from_millis(5));
    }
    // It is still pending: the server holds it.
    assert!(c.test(slow).is_none());
    // The only worker serves TCP meanwhile.
    assert_eq!(admin(&mut tcp, "incr missing 1"), "NOT_FOUND");
    assert_eq!(admin(&mut tcp, "debug release"), "RELEASED 1");
    assert_eq!(value(c.wait(slow, TIMEOUT).expect("slow")), b"SS");
    let stats = admin(&mut tcp, "version");
    assert!(stats.starts_with("VERSION"), "{stats}");
}

/// A value that comes by rendezvous is stored when its bytes arrive, after requests sent
/// behind it have arrived: those that touch its key wait for it, so one session's requests
/// on a key take effect in the order it sent them (a quorum write's last copies are still
/// travelling when the same client deletes the key). Requests on other keys do not wait.
#[test]
fn requests_behind_a_rendezvous_set_of_their_key_run_after_it() {
    let server = Server::start(Kind::MemfabricdUcx, &["-t", "1"]);
    let config = Config {
        get_mode: GetMode::TwoSided,
        ..Config::default()
    };
    let mut c = Client::new(server.url().as_str(), config).expect("client");
    let big = Bytes::from(vec![7u8; 512 * 1024]);
    c.set(b"other", b"o", 0, 0).expect("set other");
    for round in 0..100u32 {
        let key = format!("k{}", round % 4);
        let key = key.as_bytes();
        // set, delete: gone.
        let set = c.iset(key, big.clone(), round, 0);
        let other = c.iget(b"other");
        let del = c.submit(Op::Delete { key: key.to_vec() });
        assert!(matches!(
            c.wait(set, TIMEOUT),
            Ok(Reply::Stored(StoreStatus::Stored { .. }))
        ));
        assert_eq!(value(c.wait(other, TIMEOUT).expect("other")), b"o");
        assert!(
            matches!(c.wait(del, TIMEOUT), Ok(Reply::Deleted(true))),
            "round {round}: the delete ran before the set it followed"
        );
        assert!(c.get(key).expect("get").is_none(), "round {round}");
        // set, get, append: the get sees the new value, the append extends it.
        let set = c.iset(key, big.clone(), round, 0);
        let get = c.iget(key);
        let append = c.submit(Op::Store {
            mode: StoreMode::Append,
            key: key.to_vec(),
            value: Bytes::from_static(b"!"),
            flags: 0,
            exptime: 0,
            cas: 0,
        });
        assert!(matches!(
            c.wait(set, TIMEOUT),
            Ok(Reply::Stored(StoreStatus::Stored { .. }))
        ));
        let got = value(c.wait(get, TIMEOUT).expect("get"));
        assert!(got.len() == big.len(), "round {round}: {} bytes", got.len());
        assert!(matches!(
            c.wait(append, TIMEOUT),
            Ok(Reply::Stored(StoreStatus::Stored { .. }))
        ));
        let v = c.get(key).expect("get").expect("hit");
        assert_eq!((v.data.len(), v.flags), (big.len() + 1, round));
    }
}
