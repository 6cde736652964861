//! Flash hits over the UCX path: many `iget`s in flight while the server reads flash (a
//! flash hit is answered eagerly or by rendezvous, like any value), and one-sided GETs
//! that meet a flash slot fall back to two-sided. Values encode their key, so a wrong
//! value cannot pass. Run under each UCX_TLS the CI uses.
mod common;

use std::io::{Read, Write};
use std::net::TcpStream;
use std::time::Duration;

use bytes::Bytes;
use common::{Kind, Server};
use memfabric_client::{Client, Config, GetMode, Reply};

const TIMEOUT: Duration = Duration::from_secs(20);

fn value(i: usize, len: usize) -> Vec<u8> {
    let mut v = format!("value-of-{i:06}:").into_bytes();
    while v.len() < len {
        v.push(b'a' + (v.len() % 26) as u8);
    }
    v
}

fn key(i: usize) -> String {
    format!("k{i:06}")
}

fn stat(s: &Server, name: &str) -> u64 {
    let mut t = TcpStream::connect(s.addr()).unwrap();
    t.set_read_timeout(Some(TIMEOUT)).unwrap();
    t.write_all(b"stats\r\n").unwrap();
    let mut got = Vec::new();
    let mut b = [0u8; 8192];
    while !got.ends_with(b"END\r\n") {
        let n = t.read(&mut b).unwrap();
        assert!(n > 0);
        got.extend_from_slice(&b[..n]);
    }
    String::from_utf8_lossy(&got)
        .lines()
        .find_map(|l| l.strip_prefix(&format!("STAT {name} ")).map(str::to_string))
        .unwrap_or_else(|| panic!("no {name}"))
        .parse()
        .unwrap()
}

/// (count, length): small values answered eagerly, large ones by rendezvous.
const SETS: [(usize, usize); 2] = [(20_000, 2_000), (400, 100_000)];

#[test]
fn igets_in_flight_are_served_from_flash_exactly_and_onesided_falls_back() {
    let dir = tempfile::Builder::new()
        .prefix("mfc-flash-")
        .tempdir()
        .unwrap();
    let ext = format!("ext_path={}:128m", dir.path().join("f").display());
    // Buffers for the whole load, so that a writer slowed by the disk drops nothing and
    // the counts below do not depend on its speed.
    let s = Server::start(
        Kind::MemfabricdUcx,
        &["-m", "8", "-o", &ext, "-o", "ext_wbuf_size=96"],
    );
    let config = Config {
        get_mode: GetMode::TwoSided,
        timeout: TIMEOUT,
        ..Config::default()
    };
    let mut c = Client::new(s.url().as_str(), config).expect("client");
    let mut keys = Vec::new();
    let mut base = 0;
    for (n, len) in SETS {
        for i in base..base + n {
            keys.push((i, len));
        }
        base += n;
    }
    // Large values a few at a time: each in flight holds a chunk of the server's 8 MB
    // until it has arrived.
    let (small, large) = keys.split_at(SETS[0].0);
    for chunk in small.chunks(64).chain(large.chunks(2)) {
        let hs: Vec<_> = chunk
            .iter()
            .map(|&(i, len)| c.iset(key(i).as_bytes(), Bytes::from(value(i, len)), 5, 0))
            .collect();
        for r in c.wait_all(&hs, TIMEOUT) {
            assert!(matches!(r, Ok(Reply::Stored(_))), "{r:?}");
        }
    }
    // Let the writer write what it holds, so reads go to the device too.
    std::thread::sleep(Duration::from_millis(500));
    let (mut hits, mut large_hits) = (0, 0);
    for chunk in keys.chunks(64) {
        let hs: Vec<_> = chunk
            .iter()
            .map(|&(i, _)| c.iget(key(i).as_bytes()))
            .collect();
        for (r, &(i, len)) in c.wait_all(&hs, TIMEOUT).into_iter().zip(chunk) {
            match r.expect("get") {
                Reply::Value(Some(v)) => {
                    assert_eq!(v.data.as_ref(), &value(i, len)[..], "{}", key(i));
                    assert_eq!(v.flags, 5);
                    hits += 1;
                    large_hits += usize::from(len > 16_384);
                }
                Reply::Value(None) => {}
                other => panic!("{other:?}"),
            }
        }
    }
    let flash_reads = stat(&s, "extstore_objects_read");
    // RAM (8 MB) holds under 4,000 of the small values.
    assert!(
        hits > 12_000 && flash_reads > 8_000,
        "{hits} hits, {flash_reads} from flash"
    );
    assert_eq!(stat(&s, "badcrc_from_extstore"), 0);
    // The 100 KB values' class holds a page or two of RAM: most came from flash, by
    // rendezvous.
    assert!(large_hits > 300, "{large_hits} large hits");
    // One-sided: a flash slot sends the GET the two-sided way, with the same answer.
    let mut one = Client::new(
        s.url().as_str(),
        Config {
            get_mode: GetMode::OneSided,
            timeout: TIMEOUT,
            ..Config::default()
        },
    )
    .expect("client");
    let before = stat(&s, "extstore_objects_read");
    for &(i, len) in keys.iter().take(2_000) {
        if let Some(v) = one.get(key(i).as_bytes()).expect("get") {
            assert_eq!(v.data.as_ref(), &value(i, len)[..], "{}", key(i));
        }
    }
    assert!(stat(&s, "extstore_objects_read") > before);
}

#[test]
fn chained_items_on_flash_come_back_over_ucx_by_rendezvous() {
    let dir = tempfile::Builder::new()
        .prefix("mfc-flash-chained-")
        .tempdir()
        .unwrap();
    let ext = format!("ext_path={}:128m", dir.path().join("f").display());
    let s = Server::start(
        Kind::MemfabricdUcx,
        &["-m", "8", "-I", "2m", "-o", &ext, "-o", "ext_wbuf_size=32"],
    );
    let config = Config {
        get_mode: GetMode::TwoSided,
        timeout: TIMEOUT,
        ..Config::default()
    };
    let mut c = Client::new(s.url().as_str(), config).expect("client");
    // 24 values of 0.6 to 1.3 MB (chained in RAM): three times the server's 8 MB.
    let keys: Vec<(usize, usize)> = (0..24).map(|i| (i, 600_000 + i * 31_337)).collect();
    for &(i, len) in &keys {
        let r = c.set(key(i).as_bytes(), &value(i, len), 6, 0);
        assert!(r.is_ok(), "{r:?}");
    }
    std::thread::sleep(Duration::from_millis(500));
    // All in flight at once: the server reads the flash ones while answering the rest.
    let hs: Vec<_> = keys
        .iter()
        .map(|&(i, _)| c.iget(key(i).as_bytes()))
        .collect();
    let mut hits = 0;
    for (r, &(i, len)) in c.wait_all(&hs, TIMEOUT).into_iter().zip(&keys) {
        match r.expect("get") {
            Reply::Value(Some(v)) => {
                assert!(v.data.as_ref() == &value(i, len)[..], "{}", key(i));
                assert_eq!(v.flags, 6);
                hits += 1;
            }
            Reply::Value(None) => {}
            other => panic!("{other:?}"),
        }
    }
    let chained_reads = stat(&s, "extstore_objects_read");
    assert!(stat(&s, "flash_chained_written") >= 12);
    assert!(
        hits >= 20 && chained_reads >= 10,
        "{hits} hits, {chained_reads} from flash"
    );
    assert_eq!(stat(&s, "badcrc_from_extstore"), 0);
}
