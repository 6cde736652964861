//! Pools of several servers: get_multi, failures mid-flight, timeouts, down-marking, recovery,
//! failover; over TCP and over UCX (memfabricd's `--ucx-port`).

mod common;

use std::collections::HashSet;
use std::thread::sleep;
use std::time::{Duration, Instant};

use bytes::Bytes;
use common::{key_on, Kind, Server};
use memfabric_client::{Client, Config, Error};

fn pool(servers: &[&Server], config: Config) -> Client {
    let list: Vec<String> = servers.iter().map(|s| s.url()).collect();
    Client::new(list.join(",").as_str(), config).unwrap()
}

fn get_multi_across_three_servers(kind: Kind) {
    let servers = [
        Server::start(kind, &[]),
        Server::start(kind, &[]),
        Server::start(kind, &[]),
    ];
    let mut c = pool(&[&servers[0], &servers[1], &servers[2]], Config::default());
    let keys: Vec<Vec<u8>> = (0..300)
        .map(|i| format!("multi:{i}").into_bytes())
        .collect();
    let homes: HashSet<String> = keys
        .iter()
        .map(|k| c.locate(k).unwrap().host_port())
        .collect();
    assert_eq!(homes.len(), 3, "keys should spread over all three servers");
    for (i, k) in keys.iter().enumerate().filter(|(i, _)| i % 3 != 0) {
        c.set(k, format!("v{i}").as_bytes(), i as u32, 0).unwrap();
    }
    let refs: Vec<&[u8]> = keys.iter().map(|k| &k[..]).collect();
    let got = c.get_multi(&refs).unwrap();
    assert_eq!(got.len(), 200);
    for (i, k) in keys.iter().enumerate() {
        match got.get(k) {
            Some(v) => {
                assert_ne!(i % 3, 0);
                assert_eq!(v.data, format!("v{i}").as_bytes());
                assert_eq!(v.flags, i as u32);
                assert_ne!(v.cas, 0);
            }
            None => assert_eq!(i % 3, 0),
        }
    }
    // Each key was stored on exactly the server it maps to.
    let names: Vec<String> = c.servers().iter().map(|a| a.host_port()).collect();
    for (s, server) in servers.iter().enumerate() {
        let mut one = pool(&[server], Config::default());
        for (i, k) in keys.iter().enumerate().filter(|(i, _)| i % 3 != 0).take(60) {
            let home = c.locate(k).unwrap().host_port() == names[s];
            assert_eq!(one.get(k).unwrap().is_some(), home, "key {i} on server {s}");
        }
    }
}

#[test]
fn get_multi_across_three_servers_memcached() {
    get_multi_across_three_servers(Kind::Memcached);
}

#[test]
fn get_multi_across_three_servers_memfabricd() {
    get_multi_across_three_servers(Kind::Memfabricd);
}

#[test]
fn get_multi_across_three_servers_memfabricd_ucx() {
    get_multi_across_three_servers(Kind::MemfabricdUcx);
}

#[test]
fn a_server_killed_mid_flight_fails_its_requests_and_the_others_keep_working_memfabricd() {
    a_server_killed_mid_flight_fails_its_requests_and_the_others_keep_working(Kind::Memfabricd);
}

#[test]
fn a_server_killed_mid_flight_fails_its_requests_and_the_others_keep_working_memfabricd_ucx() {
    a_server_killed_mid_flight_fails_its_requests_and_the_others_keep_working(Kind::MemfabricdUcx);
}

fn a_server_killed_mid_flight_fails_its_requests_and_the_others_keep_working(kind: Kind) {
    let mut servers = [
        Server::start(kind, &[]),
        Server::start(kind, &[]),
        Server::start(kind, &[]),
    ];
    let config = Config {
        timeout: Duration::from_secs(1),
        retry_timeout: Duration::from_secs(30),
        ..Config::default()
    };
    let mut c = pool(&[&servers[0], &servers[1], &servers[2]], config);
    let value = Bytes::from(vec![b'x'; 64 << 10]);
    let hs: Vec<_> = (0..600)
        .map(|i| c.iset(format!("k{i}").as_bytes(), value.clone(), 0, 0))
        .collect();
    servers[1].kill();
    let started = Instant::now();
    let rs = c.wait_all(&hs, Duration::from_secs(10));
    assert!(started.elapsed() < Duration::from_secs(10));
    let victim = c.servers()[1].clone();
    for (i, r) in rs.iter().enumerate() {
        let key = format!("k{i}");
        if c.locate(key.as_bytes()) != Some(&victim) {
            assert!(r.is_ok(), "{key} on a live server: {r:?}");
        }
    }
    // The dead server's keys fail (fast, it is marked down); the others work.
    let dead_key = key_on(&c, 1, "d");
    assert!(matches!(
        c.get(&dead_key),
        Err(Error::ServerDown { .. } | Error::Io { .. })
    ));
    let started = Instant::now();
    assert!(matches!(
        c.set(&dead_key, b"v", 0, 0),
        Err(Error::ServerDown { .. })
    ));
    assert!(started.elapsed() < Duration::from_millis(500));
    assert!(c.is_down(1));
    for s in [0, 2] {
        let k = key_on(&c, s, "live");
        c.set(&k, b"ok", 0, 0).unwrap();
        assert_eq!(&c.get(&k).unwrap().unwrap().data[..], b"ok");
    }
    // Server-wide operations report the dead server and answer for the others.
    let versions = c.version();
    assert!(versions[0].1.is_ok() && versions[1].1.is_err() && versions[2].1.is_ok());
}

#[test]
fn a_stopped_server_times_out_and_is_marked_down_memcached() {
    a_stopped_server_times_out_and_is_marked_down(Kind::Memcached);
}

#[test]
fn a_stopped_server_times_out_and_is_marked_down_memfabricd_ucx() {
    a_stopped_server_times_out_and_is_marked_down(Kind::MemfabricdUcx);
}

fn a_stopped_server_times_out_and_is_marked_down(kind: Kind) {
    let servers = [Server::start(kind, &[]), Server::start(kind, &[])];
    let config = Config {
        timeout: Duration::from_millis(300),
        retry_timeout: Duration::from_secs(30),
        ..Config::default()
    };
    let mut c = pool(&[&servers[0], &servers[1]], config);
    let k0 = key_on(&c, 0, "a");
    let k1 = key_on(&c, 1, "b");
    c.set(&k0, b"v", 0, 0).unwrap(); // connected before the stop
    servers[0].signal("STOP");
    let started = Instant::now();
    // A request the stopped server must answer (a one-sided GET over shared memory would
    // still be served from its memory, which is consistent while it is stopped).
    let r = c.set(&k0, b"w", 0, 0);
    let took = started.elapsed();
    servers[0].signal("CONT");
    assert!(matches!(r, Err(Error::Timeout { .. })), "{r:?}");
    assert!(took < Duration::from_secs(5), "{took:?}");
    assert!(c.is_down(0));
    assert!(matches!(c.get(&k0), Err(Error::ServerDown { .. })));
    c.set(&k1, b"fine", 0, 0).unwrap();
    assert_eq!(&c.get(&k1).unwrap().unwrap().data[..], b"fine");
}

#[test]
fn a_wait_shorter_than_the_deadline_abandons_only_that_request_memfabricd() {
    a_wait_shorter_than_the_deadline_abandons_only_that_request(Kind::Memfabricd);
}

#[test]
fn a_wait_shorter_than_the_deadline_abandons_only_that_request_memfabricd_ucx() {
    a_wait_shorter_than_the_deadline_abandons_only_that_request(Kind::MemfabricdUcx);
}

fn a_wait_shorter_than_the_deadline_abandons_only_that_request(kind: Kind) {
    let s = Server::start(kind, &[]);
    let mut c = pool(&[&s], Config::default());
    // Connected first: a UCX connection needs the server's WELCOME, which a stopped server
    // never sends (the connect would time out and rightly mark it down).
    c.set(b"warm", b"up", 0, 0).unwrap();
    s.signal("STOP");
    let h = c.iget(b"k");
    let r = c.wait(h, Duration::from_millis(50));
    s.signal("CONT");
    assert!(matches!(r, Err(Error::Timeout { .. })));
    assert!(
        !c.is_down(0),
        "an abandoned wait does not mark the server down"
    );
    c.set(b"k", b"v", 0, 0).unwrap();
    assert_eq!(&c.get(b"k").unwrap().unwrap().data[..], b"v");
}

#[test]
fn a_down_server_recovers_after_restart_and_retry_timeout_memfabricd() {
    a_down_server_recovers_after_restart_and_retry_timeout(Kind::Memfabricd);
}

#[test]
fn a_down_server_recovers_after_restart_and_retry_timeout_memfabricd_ucx() {
    a_down_server_recovers_after_restart_and_retry_timeout(Kind::MemfabricdUcx);
}

fn a_down_server_recovers_after_restart_and_retry_timeout(kind: Kind) {
    let mut s = Server::start(kind, &[]);
    let retry = Duration::from_millis(300);
    let mut c = pool(
        &[&s],
        Config {
            retry_timeout: retry,
            ..Config::default()
        },
    );
    c.set(b"k", b"v1", 0, 0).unwrap();
    s.kill();
    assert!(c.get(b"k").is_err());
    assert!(matches!(c.get(b"k"), Err(Error::ServerDown { .. })));
    s.restart();
    // Still within retry_timeout (or just past it): either fast failure or success; after it,
    // the client reconnects.
    sleep(retry + Duration::from_millis(50));
    assert_eq!(c.get(b"k").unwrap(), None, "a restarted server is empty");
    c.set(b"k", b"v2", 0, 0).unwrap();
    assert_eq!(&c.get(b"k").unwrap().unwrap().data[..], b"v2");
    assert!(!c.is_down(0));
}

#[test]
fn a_server_down_at_connect_is_marked_down_then_retried_memcached() {
    a_server_down_at_connect_is_marked_down_then_retried(Kind::Memcached);
}

#[test]
fn a_server_down_at_connect_is_marked_down_then_retried_memfabricd_ucx() {
    a_server_down_at_connect_is_marked_down_then_retried(Kind::MemfabricdUcx);
}

fn a_server_down_at_connect_is_marked_down_then_retried(kind: Kind) {
    let mut s = Server::start(kind, &[]);
    let retry = Duration::from_millis(200);
    let mut c = pool(
        &[&s],
        Config {
            retry_timeout: retry,
            ..Config::default()
        },
    );
    s.kill();
    assert!(matches!(
        c.get(b"k"),
        Err(Error::Io { .. } | Error::ServerDown { .. })
    ));
    assert!(matches!(c.get(b"k"), Err(Error::ServerDown { .. })));
    s.restart();
    sleep(retry + Duration::from_millis(50));
    assert_eq!(c.get(b"k").unwrap(), None);
}

#[test]
fn failover_sends_keys_of_a_down_server_to_the_next_live_one_memfabricd() {
    failover_sends_keys_of_a_down_server_to_the_next_live_one(Kind::Memfabricd);
}

#[test]
fn failover_sends_keys_of_a_down_server_to_the_next_live_one_memfabricd_ucx() {
    failover_sends_keys_of_a_down_server_to_the_next_live_one(Kind::MemfabricdUcx);
}

fn failover_sends_keys_of_a_down_server_to_the_next_live_one(kind: Kind) {
    let mut servers = [
        Server::start(kind, &[]),
        Server::start(kind, &[]),
        Server::start(kind, &[]),
    ];
    let config = Config {
        failover: true,
        retry_timeout: Duration::from_secs(30),
        ..Config::default()
    };
    let mut c = pool(&[&servers[0], &servers[1], &servers[2]], config);
    let k = key_on(&c, 2, "f");
    c.set(&k, b"home", 0, 0).unwrap();
    servers[2].kill();
    let _ = c.get(&k); // discovers the failure (or already fails over)
    assert!(c.is_down(2));
    c.set(&k, b"elsewhere", 0, 0).unwrap();
    assert_eq!(&c.get(&k).unwrap().unwrap().data[..], b"elsewhere");
}
