//! Who may connect to a memfabricd started with `-Y FILE`: the UCX bootstrap's challenge
//! and proof (docs/fabric-protocol.md 1.2a) and memcached's ascii handshake over TCP,
//! from the client library and from a raw, hostile peer. The raw peer checks what the
//! library cannot: a replayed proof is refused, a wrong one is refused before the HELLO's
//! worker address reaches UCX (a garbage address that UCX would choke on is sent), and
//! the server keeps serving.

mod common;

use std::io::{Read, Write};
use std::net::TcpStream;
use std::path::PathBuf;
use std::time::Duration;

use common::{Kind, Server};
use memfabric_client::{Client, Config, Credentials, Error};
use memfabric_proto::ucx_wire as fp;

const WAIT: Duration = Duration::from_secs(10);

fn users(name: &str) -> PathBuf {
    let p = std::env::temp_dir().join(format!("memfabric-ucx-auth-{}-{name}", std::process::id()));
    std::fs::write(&p, "alice:secret\nbob:pw2\n").unwrap();
    p
}

fn config(user: Option<(&str, &str)>) -> Config {
    Config {
        credentials: user.map(|(u, p)| Credentials {
            username: u.into(),
            password: p.into(),
        }),
        ..Config::default()
    }
}

/// One authenticated `stats` value.
fn stat(server: &Server, name: &str) -> u64 {
    let mut c = Client::new(server.addr().as_str(), config(Some(("alice", "secret")))).unwrap();
    let stats = c.stats(None).remove(0).1.unwrap();
    stats
        .iter()
        .find(|(k, _)| k == name)
        .map(|(_, v)| v.parse().unwrap())
        .unwrap()
}

#[test]
fn a_pool_with_a_users_credentials_works_over_ucx_and_tcp_and_others_are_refused() {
    let file = users("pool");
    let server = Server::start(Kind::MemfabricdUcx, &["-Y", file.to_str().unwrap()]);
    for url in [server.url(), server.addr()] {
        let mut c = Client::new(url.as_str(), config(Some(("bob", "pw2")))).unwrap();
        c.set(b"k", b"v", 7, 0).unwrap();
        let got = c.get(b"k").unwrap().unwrap();
        assert_eq!((&got.data[..], got.flags), (&b"v"[..], 7), "{url}");
        // Large values (rendezvous over UCX) too.
        c.set(b"big", &vec![3u8; 300_000], 0, 0).unwrap();
        assert_eq!(c.get(b"big").unwrap().unwrap().data.len(), 300_000);
    }
    let before = (stat(&server, "auth_cmds"), stat(&server, "auth_errors"));
    let mut wrong = Client::new(server.url().as_str(), config(Some(("bob", "pw3")))).unwrap();
    let e = wrong.get(b"k").unwrap_err();
    assert!(matches!(e, Error::Auth { .. }), "{e:?}");
    let mut nobody = Client::new(server.url().as_str(), config(None)).unwrap();
    let e = nobody.get(b"k").unwrap_err();
    assert!(
        matches!(&e, Error::Auth { msg, .. } if msg.contains("asks for credentials")),
        "{e:?}"
    );
    let mut wrong_tcp = Client::new(server.addr().as_str(), config(Some(("bob", "x")))).unwrap();
    let e = wrong_tcp.get(b"k").unwrap_err();
    assert!(
        matches!(&e, Error::Auth { msg, .. } if msg.contains("authentication failure")),
        "{e:?}"
    );
    let mut nobody_tcp = Client::new(server.addr().as_str(), config(None)).unwrap();
    assert!(nobody_tcp.get(b"k").is_err());
    let after = (stat(&server, "auth_cmds"), stat(&server, "auth_errors"));
    // Two wrong proofs or passwords, each counted; the UCX client without credentials
    // never sent a proof.
    assert!(after.1 >= before.1 + 2, "{before:?} {after:?}");
    let _ = std::fs::remove_file(file);
}

/// `-S`: the UCX bootstrap proves the SASL password file's credentials (the TCP port
/// speaks binary SASL only, which this client does not: docs/security.md).
#[test]
fn the_ucx_bootstrap_proves_the_sasl_password_file_with_minus_s() {
    let file = users("sasl");
    let server = Server::start_env(
        Kind::MemfabricdUcx,
        &["-S"],
        &[("MEMCACHED_SASL_PWDB", file.to_str().unwrap())],
    );
    let mut c = Client::new(server.url().as_str(), config(Some(("bob", "pw2")))).unwrap();
    c.set(b"k", &vec![5u8; 200_000], 3, 0).unwrap();
    assert_eq!(c.get(b"k").unwrap().unwrap().data.len(), 200_000);
    let mut wrong = Client::new(server.url().as_str(), config(Some(("bob", "pw")))).unwrap();
    assert!(matches!(wrong.get(b"k").unwrap_err(), Error::Auth { .. }));
    let mut nobody = Client::new(server.url().as_str(), config(None)).unwrap();
    assert!(matches!(nobody.get(b"k").unwrap_err(), Error::Auth { .. }));
    // An entry removed from the file is refused at the next bootstrap.
    std::fs::write(&file, "alice:secret\n").unwrap();
    let mut removed = Client::new(server.url().as_str(), config(Some(("bob", "pw2")))).unwrap();
    assert!(matches!(removed.get(b"k").unwrap_err(), Error::Auth { .. }));
    let stats = c.stats(None).remove(0).1.unwrap();
    let errors: u64 = stats
        .iter()
        .find(|(k, _)| k == "auth_errors")
        .map(|(_, v)| v.parse().unwrap())
        .unwrap();
    assert_eq!(errors, 2, "the wrong password and the removed entry");
    let _ = std::fs::remove_file(file);
}

#[test]
fn credentials_do_no_harm_with_servers_that_have_none() {
    for kind in [Kind::MemfabricdUcx, Kind::Memfabricd, Kind::Memcached] {
        let server = Server::start(kind, &[]);
        let mut c = Client::new(server.url().as_str(), config(Some(("alice", "secret")))).unwrap();
        c.set(b"k", b"v", 0, 0).unwrap();
        assert_eq!(&c.get(b"k").unwrap().unwrap().data[..], b"v", "{kind:?}");
        // The TCP handshake stored nothing.
        let items = c.stats(None).remove(0).1.unwrap();
        let curr: u64 = items
            .iter()
            .find(|(k, _)| k == "curr_items")
            .map(|(_, v)| v.parse().unwrap())
            .unwrap();
        assert_eq!(curr, 1, "{kind:?}");
    }
}

/// A raw bootstrap: HELLO with `address`, then the server's first frame.
fn hello(server: &Server, address: &[u8]) -> (TcpStream, Vec<u8>) {
    let mut s = TcpStream::connect(("127.0.0.1", server.ucx_port.unwrap())).unwrap();
    s.set_read_timeout(Some(WAIT)).unwrap();
    let h = fp::Hello {
        version: fp::VERSION,
        worker_address: address.to_vec(),
    };
    s.write_all(&h.encode()).unwrap();
    let mut frame = vec![0u8; 8 + fp::NONCE_LEN];
    s.read_exact(&mut frame).unwrap();
    (s, frame)
}

/// What the server says to a proof: WELCOME's status byte, and whether it then closed.
fn answer(s: &mut TcpStream, proof: &fp::Proof) -> u8 {
    s.write_all(&proof.encode()).unwrap();
    let mut head = [0u8; 8];
    s.read_exact(&mut head).unwrap();
    let mut rest = Vec::new();
    let _ = s.read_to_end(&mut rest);
    head[6]
}

#[test]
fn proofs_are_bound_to_their_challenge_and_checked_before_ucx_sees_the_address() {
    let file = users("raw");
    let server = Server::start(Kind::MemfabricdUcx, &["-Y", file.to_str().unwrap()]);
    // Not a UCX worker address: UCX would abort on it. Only a correct proof gets past the
    // challenge, and then the address check refuses it (status 2), not UCX.
    let garbage = vec![0xffu8; 64];
    let (mut s, frame) = hello(&server, &garbage);
    let (challenge, _) = fp::decode_challenge(&frame).unwrap().unwrap();
    let good = fp::Proof {
        user: b"alice".to_vec(),
        mac: fp::proof_mac(b"secret", &challenge.nonce, &garbage),
    };
    assert_eq!(answer(&mut s, &good), fp::WELCOME_REFUSED);
    // The same proof on another connection (another nonce): refused as a failed proof.
    let (mut s, _) = hello(&server, &garbage);
    assert_eq!(answer(&mut s, &good), fp::WELCOME_AUTH_FAILED);
    // A proof for another address, another user's name, a wrong password.
    for (user, pass, addr) in [
        (&b"alice"[..], &b"secret"[..], &b"other address"[..]),
        (b"bob", b"secret", &garbage[..]),
        (b"alice", b"Secret", &garbage[..]),
        (b"", b"", &garbage[..]),
    ] {
        let (mut s, frame) = hello(&server, &garbage);
        let (challenge, _) = fp::decode_challenge(&frame).unwrap().unwrap();
        let proof = fp::Proof {
            user: user.to_vec(),
            mac: fp::proof_mac(pass, &challenge.nonce, addr),
        };
        assert_eq!(answer(&mut s, &proof), fp::WELCOME_AUTH_FAILED);
    }
    // Junk instead of a proof: closed without an answer.
    let (mut s, _) = hello(&server, &garbage);
    s.write_all(b"GET / HTTP/1.0\r\n\r\n").unwrap();
    let mut rest = Vec::new();
    let _ = s.read_to_end(&mut rest);
    assert!(rest.is_empty(), "{rest:?}");
    // Still serving, and every failure counted.
    let mut c = Client::new(server.url().as_str(), config(Some(("alice", "secret")))).unwrap();
    c.set(b"after", b"ok", 0, 0).unwrap();
    assert_eq!(&c.get(b"after").unwrap().unwrap().data[..], b"ok");
    assert!(stat(&server, "auth_errors") >= 5);
    let _ = std::fs::remove_file(file);
}

#[test]
fn the_tcp_handshake_authenticates_with_memcached_too() {
    let file = users("memcached");
    let server = Server::start(Kind::Memcached, &["-Y", file.to_str().unwrap()]);
    let mut c = Client::new(server.addr().as_str(), config(Some(("alice", "secret")))).unwrap();
    c.set(b"k", b"v", 0, 0).unwrap();
    assert_eq!(&c.get(b"k").unwrap().unwrap().data[..], b"v");
    let mut wrong = Client::new(server.addr().as_str(), config(Some(("alice", "nope")))).unwrap();
    let e = wrong.get(b"k").unwrap_err();
    assert!(matches!(e, Error::Auth { .. }), "{e:?}");
    let _ = std::fs::remove_file(file);
}
