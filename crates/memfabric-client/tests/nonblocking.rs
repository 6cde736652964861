//! The non-blocking API: many requests in flight, test/wait/wait_all, bset/bget; over TCP
//! and, against memfabricd, over UCX.

mod common;

use std::time::{Duration, Instant};

use bytes::Bytes;
use common::{Kind, Server};
use memfabric_client::{Client, Config, Error, Reply};

fn thousand_requests_in_flight_then_wait_all(kind: Kind) {
    let (a, b) = (Server::start(kind, &[]), Server::start(kind, &[]));
    let mut c = Client::new(
        format!("{},{}", a.url(), b.url()).as_str(),
        Config::default(),
    )
    .unwrap();
    let sets: Vec<_> = (0..1000)
        .map(|i| {
            c.iset(
                format!("key:{i}").as_bytes(),
                Bytes::from(format!("value-{i}")),
                i,
                0,
            )
        })
        .collect();
    assert_eq!(c.in_flight(), 1000);
    for r in c.wait_all(&sets, Duration::from_secs(5)) {
        assert!(matches!(r, Ok(Reply::Stored(_))), "{r:?}");
    }
    let gets: Vec<_> = (0..1000)
        .map(|i| c.iget(format!("key:{i}").as_bytes()))
        .collect();
    assert_eq!(c.in_flight(), 1000);
    for (i, r) in c
        .wait_all(&gets, Duration::from_secs(5))
        .into_iter()
        .enumerate()
    {
        match r {
            Ok(Reply::Value(Some(v))) => {
                assert_eq!(v.data, format!("value-{i}").as_bytes());
                assert_eq!(v.flags, i as u32);
            }
            r => panic!("{kind:?} key:{i}: {r:?}"),
        }
    }
    assert_eq!(c.in_flight(), 0);
}

#[test]
fn thousand_requests_in_flight_then_wait_all_memcached() {
    thousand_requests_in_flight_then_wait_all(Kind::Memcached);
}

#[test]
fn thousand_requests_in_flight_then_wait_all_memfabricd() {
    thousand_requests_in_flight_then_wait_all(Kind::Memfabricd);
}

#[test]
fn thousand_requests_in_flight_then_wait_all_memfabricd_ucx() {
    thousand_requests_in_flight_then_wait_all(Kind::MemfabricdUcx);
}

#[test]
fn test_polls_until_the_request_is_done_memfabricd() {
    test_polls_until_the_request_is_done(Kind::Memfabricd);
}

#[test]
fn test_polls_until_the_request_is_done_memfabricd_ucx() {
    test_polls_until_the_request_is_done(Kind::MemfabricdUcx);
}

fn test_polls_until_the_request_is_done(kind: Kind) {
    let s = Server::start(kind, &[]);
    let mut c = Client::new(s.url().as_str(), Config::default()).unwrap();
    let h = c.iset(b"k", Bytes::from_static(b"v"), 0, 0);
    let deadline = Instant::now() + Duration::from_secs(5);
    let r = loop {
        if let Some(r) = c.test(h) {
            break r;
        }
        assert!(Instant::now() < deadline, "test never completed");
    };
    assert!(matches!(r, Ok(Reply::Stored(_))));
    // A result is handed out once.
    assert_eq!(c.test(h), Some(Err(Error::UnknownHandle)));
    assert_eq!(
        c.wait(h, Duration::from_millis(10)),
        Err(Error::UnknownHandle)
    );
}

#[test]
fn bset_and_bget_let_the_caller_reuse_buffers_at_once_memcached() {
    bset_and_bget_let_the_caller_reuse_buffers_at_once(Kind::Memcached);
}

#[test]
fn bset_and_bget_let_the_caller_reuse_buffers_at_once_memfabricd_ucx() {
    bset_and_bget_let_the_caller_reuse_buffers_at_once(Kind::MemfabricdUcx);
}

fn bset_and_bget_let_the_caller_reuse_buffers_at_once(kind: Kind) {
    let s = Server::start(kind, &[]);
    let mut c = Client::new(s.url().as_str(), Config::default()).unwrap();
    let mut buf = b"first".to_vec();
    let mut key = b"bkey".to_vec();
    let h1 = c.bset(&key, &buf, 1, 0);
    buf.copy_from_slice(b"XXXXX"); // the request already holds its own copy
    key[0] = b'X';
    assert!(matches!(
        c.wait(h1, Duration::from_secs(1)),
        Ok(Reply::Stored(_))
    ));
    let h2 = c.bget(b"bkey");
    match c.wait(h2, Duration::from_secs(1)) {
        Ok(Reply::Value(Some(v))) => assert_eq!(&v.data[..], b"first"),
        r => panic!("{r:?}"),
    }
}

#[test]
fn errors_before_sending_complete_the_handle_memfabricd() {
    errors_before_sending_complete_the_handle(Kind::Memfabricd);
}

#[test]
fn errors_before_sending_complete_the_handle_memfabricd_ucx() {
    errors_before_sending_complete_the_handle(Kind::MemfabricdUcx);
}

fn errors_before_sending_complete_the_handle(kind: Kind) {
    let s = Server::start(kind, &[]);
    let mut c = Client::new(s.url().as_str(), Config::default()).unwrap();
    // Too long for every transport (whitespace in keys: ops.rs).
    let bad = c.iget(&[b'x'; 251]);
    let good = c.iget(b"good");
    let rs = c.wait_all(&[bad, good], Duration::from_secs(1));
    assert_eq!(rs[0], Err(Error::InvalidKey));
    assert_eq!(rs[1], Ok(Reply::Value(None)));
}

#[test]
fn max_in_flight_applies_back_pressure_without_losing_requests_memfabricd() {
    max_in_flight_applies_back_pressure_without_losing_requests(Kind::Memfabricd);
}

#[test]
fn max_in_flight_applies_back_pressure_without_losing_requests_memfabricd_ucx() {
    max_in_flight_applies_back_pressure_without_losing_requests(Kind::MemfabricdUcx);
}

fn max_in_flight_applies_back_pressure_without_losing_requests(kind: Kind) {
    let s = Server::start(kind, &[]);
    let config = Config {
        max_in_flight: 8,
        ..Config::default()
    };
    let mut c = Client::new(s.url().as_str(), config).unwrap();
    let hs: Vec<_> = (0..200)
        .map(|i| c.iset(format!("k{i}").as_bytes(), Bytes::from_static(b"v"), 0, 0))
        .collect();
    assert!(c.in_flight() <= 8);
    let rs = c.wait_all(&hs, Duration::from_secs(5));
    assert!(rs.iter().all(|r| matches!(r, Ok(Reply::Stored(_)))));
}
