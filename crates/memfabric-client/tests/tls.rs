//! The client library over TLS (`Config::tls`) against memcached `-Z` and memfabricd `-Z`
//! with the same certificates, made here with openssl: the same operations give the same
//! results on both, large values and pipelined batches included; a client certificate is
//! presented where the server asks for one (`ssl_verify_mode=2`), and a client without
//! one is refused by both; a pool without TLS cannot talk to either.

mod common;

use std::path::Path;

use common::{Kind, Server};
use memfabric_client::{Client, Config, Error, TlsConfig};
use memfabric_cluster::certs::TestCerts;

fn config(certs: &TestCerts, client_cert: bool) -> Config {
    Config {
        tls: Some(TlsConfig {
            ca_file: Some(certs.path("ca.crt")),
            cert_file: client_cert.then(|| certs.path("client.crt")),
            key_file: client_cert.then(|| certs.path("client.key")),
            server_name: None,
        }),
        ..Config::default()
    }
}

fn start(kind: Kind, flags: &[String]) -> Server {
    let flags: Vec<&str> = flags.iter().map(String::as_str).collect();
    Server::start(kind, &flags)
}

/// What the same operations return on a server.
fn workload(c: &mut Client) -> Vec<String> {
    let big: Vec<u8> = (0..700_000u32).map(|i| (i % 251) as u8).collect();
    let mut out = Vec::new();
    c.set(b"k", b"v", 3, 0).unwrap();
    out.push(format!(
        "{:?}",
        c.get(b"k").unwrap().map(|v| (v.data, v.flags))
    ));
    c.set(b"big", &big, 0, 0).unwrap();
    out.push(format!("{}", c.get(b"big").unwrap().unwrap().data == big));
    out.push(format!("{:?}", c.incr(b"n", 1)));
    c.set(b"n", b"41", 0, 0).unwrap();
    out.push(format!("{:?}", c.incr(b"n", 1)));
    // A pipelined batch: 500 sets in flight, then 500 gets.
    let keys: Vec<Vec<u8>> = (0..500).map(|i| format!("p{i}").into_bytes()).collect();
    let handles: Vec<_> = keys
        .iter()
        .map(|k| c.iset(k, bytes::Bytes::from(k.clone()), 0, 0))
        .collect();
    for r in c.wait_all(&handles, std::time::Duration::from_secs(10)) {
        r.unwrap();
    }
    let got = c
        .get_multi(&keys.iter().map(Vec::as_slice).collect::<Vec<_>>())
        .unwrap();
    out.push(format!("{}", got.len()));
    out.push(format!("{:?}", c.delete(b"k")));
    out.push(format!("{:?}", c.get(b"k").unwrap().map(|v| v.data)));
    out
}

#[test]
fn the_client_speaks_tls_to_memcached_and_memfabricd_alike() {
    let certs = TestCerts::make("client-pool");
    let mut results = Vec::new();
    for kind in [Kind::Memcached, Kind::Memfabricd] {
        let server = start(kind, &certs.server_flags(""));
        let mut c = Client::new(server.addr().as_str(), config(&certs, false)).unwrap();
        results.push(workload(&mut c));
        // Without TLS the same server is not reachable.
        let mut plain = Client::new(server.addr().as_str(), Config::default()).unwrap();
        assert!(plain.get(b"k").is_err(), "{kind:?} served a plain client");
    }
    assert_eq!(results[1], results[0], "memfabricd, then memcached");
}

#[test]
fn client_certificates_are_presented_and_required() {
    let certs = TestCerts::make("client-verify");
    let ca = certs.path("ca.crt").display().to_string();
    for kind in [Kind::Memcached, Kind::Memfabricd] {
        let server = start(
            kind,
            &certs.server_flags(&format!("ssl_verify_mode=2,ssl_ca_cert={ca}")),
        );
        let mut with = Client::new(server.addr().as_str(), config(&certs, true)).unwrap();
        with.set(b"k", b"v", 0, 0).unwrap();
        assert_eq!(&with.get(b"k").unwrap().unwrap().data[..], b"v", "{kind:?}");
        let mut without = Client::new(server.addr().as_str(), config(&certs, false)).unwrap();
        let e = without.get(b"k").unwrap_err();
        assert!(
            matches!(
                e,
                Error::Io { .. } | Error::ServerDown { .. } | Error::Timeout { .. }
            ),
            "{kind:?}: {e:?}"
        );
    }
}

#[test]
fn a_ca_file_that_cannot_be_read_is_an_error_at_once() {
    let config = Config {
        tls: Some(TlsConfig {
            ca_file: Some(Path::new("/nonexistent/ca.pem").to_path_buf()),
            ..TlsConfig::default()
        }),
        ..Config::default()
    };
    let e = Client::new("127.0.0.1:1", config).map(|_| ()).unwrap_err();
    assert!(e.to_string().contains("/nonexistent/ca.pem"), "{e}");
}

/// A paused TLS server: the pool's probe makes the TLS handshake (a TCP connect alone
/// reaches a stopped process's kernel), so the pool never blocks on an inline handshake
/// with it (`common::paused_copy_is_probed_not_connected`).
#[test]
fn a_paused_tls_copy_is_probed_with_a_handshake_instead_of_connected() {
    let certs = TestCerts::make("client-probe");
    for kind in [Kind::Memfabricd, Kind::Memcached] {
        let servers: Vec<Server> = (0..3)
            .map(|_| start(kind, &certs.server_flags("")))
            .collect();
        let config = memfabric_client::Config {
            replicas: 2,
            write_policy: memfabric_client::WritePolicy::Quorum,
            ..config(&certs, false)
        };
        common::paused_copy_is_probed_not_connected(&format!("{kind:?} -Z"), &servers, config);
    }
}
