//! `-Z` against hostile and heavy TLS clients (certificates from memfabric-cluster's
//! `TestCerts`; a rustls client). What memcached does not show the same way, so not a differential
//! (tests/interop/test_tls.py is): junk where a ClientHello belongs is refused and counted
//! in `ssl_handshake_errors`; handshakes that never finish are closed at
//! `--auth-timeout`; a client that asks for large values and never reads them holds the
//! server to its output cap (RSS measured against what it asked for); `refresh_certs`
//! takes effect for new connections; `notls:` listeners stay plain.
//!
//! Servers run on 127.0.0.1 free ports inside guards that kill and reap them on drop.
//! No assertion is about time; waits are bounded so that a broken server fails the test.
mod common;

use std::io::{Read, Write};
use std::net::TcpStream;
use std::sync::Arc;
use std::time::Duration;

use common::{closed, free_port, line, memfabricd, Server, WAIT};
use memfabric_cluster::certs::TestCerts;
use rustls::pki_types::pem::PemObject;
use rustls::pki_types::{CertificateDer, ServerName};

fn client_config(certs: &TestCerts) -> Arc<rustls::ClientConfig> {
    let mut roots = rustls::RootCertStore::empty();
    for c in CertificateDer::pem_file_iter(certs.path("ca.crt")).unwrap() {
        roots.add(c.unwrap()).unwrap();
    }
    Arc::new(
        rustls::ClientConfig::builder_with_provider(Arc::new(
            rustls::crypto::ring::default_provider(),
        ))
        .with_safe_default_protocol_versions()
        .unwrap()
        .with_root_certificates(roots)
        .with_no_client_auth(),
    )
}

fn start(certs: &TestCerts, extra: &[&str]) -> Server {
    let port = free_port();
    let mut cmd = memfabricd(port);
    cmd.args(["-U", "0"])
        .args(certs.server_flags(""))
        .args(extra);
    Server::spawn(&mut cmd, port)
}

type Tls = rustls::StreamOwned<rustls::ClientConnection, TcpStream>;

fn tls(s: &Server, certs: &TestCerts) -> Tls {
    let sock = TcpStream::connect(("127.0.0.1", s.port)).expect("connect");
    sock.set_read_timeout(Some(WAIT)).unwrap();
    let name = ServerName::try_from("127.0.0.1").unwrap();
    let conn = rustls::ClientConnection::new(client_config(certs), name).unwrap();
    rustls::StreamOwned::new(conn, sock)
}

fn stat(s: &Server, certs: &TestCerts, name: &str) -> u64 {
    let mut c = tls(s, certs);
    c.write_all(b"stats\r\n").unwrap();
    let mut found = None;
    loop {
        let l = line(&mut c);
        if l == "END\r\n" || l.is_empty() {
            return found.unwrap_or_else(|| panic!("no {name}"));
        }
        if let Some(v) = l.strip_prefix(&format!("STAT {name} ")) {
            found = Some(v.trim().parse().unwrap());
        }
    }
}

#[test]
fn junk_and_stalled_handshakes_are_refused_counted_and_closed() {
    let certs = TestCerts::make("server-junk");
    let s = start(&certs, &["--auth-timeout", "2"]);
    // Plain text, an HTTP request, random bytes where a ClientHello belongs.
    let junk: [&[u8]; 3] = [
        b"version\r\nversion\r\nversion\r\n",
        b"GET / HTTP/1.1\r\nHost: x\r\n\r\n",
        &[0x16, 0x03, 0x01, 0x00, 0x05, 1, 2, 3, 4, 5, 6, 7, 8, 9],
    ];
    for bytes in junk {
        let mut c = TcpStream::connect(("127.0.0.1", s.port)).unwrap();
        c.set_read_timeout(Some(WAIT)).unwrap();
        c.write_all(bytes).unwrap();
        assert!(closed(&mut c), "{bytes:?} was not refused");
    }
    assert!(stat(&s, &certs, "ssl_handshake_errors") >= 3);
    // Handshakes that stop halfway: the first bytes of a ClientHello, then nothing; and
    // connections that say nothing at all. Both are closed at --auth-timeout; a finished
    // handshake is not.
    let mut stalled: Vec<TcpStream> = (0..50)
        .map(|i| {
            let mut c = TcpStream::connect(("127.0.0.1", s.port)).unwrap();
            c.set_read_timeout(Some(WAIT)).unwrap();
            if i % 2 == 0 {
                c.write_all(&[0x16, 0x03, 0x01, 0x02, 0x00, 0x01]).unwrap();
            }
            c
        })
        .collect();
    let mut good = tls(&s, &certs);
    good.write_all(b"version\r\n").unwrap();
    assert!(line(&mut good).starts_with("VERSION "));
    for c in stalled.iter_mut() {
        assert!(closed(c), "a stalled handshake outlived --auth-timeout");
    }
    good.write_all(b"version\r\n").unwrap();
    assert!(
        line(&mut good).starts_with("VERSION "),
        "the finished handshake was closed"
    );
    assert!(stat(&s, &certs, "idle_kicks") >= 50);
}

/// A request and the client's close_notify in one flight, the socket left open: the
/// server answers, sees the end behind the request, and closes (no readiness edge comes
/// after that flight).
#[test]
fn a_close_notify_behind_a_request_closes_the_connection() {
    let certs = TestCerts::make("server-close-notify");
    let s = start(&certs, &[]);
    let mut c = tls(&s, &certs);
    c.write_all(b"version\r\n").unwrap();
    assert!(line(&mut c).starts_with("VERSION "));
    c.conn.writer().write_all(b"version\r\n").unwrap();
    c.conn.send_close_notify();
    let mut flight = Vec::new();
    while c.conn.wants_write() {
        c.conn.write_tls(&mut flight).unwrap();
    }
    c.sock.write_all(&flight).unwrap();
    assert!(line(&mut c).starts_with("VERSION "));
    assert!(
        closed(&mut c.sock),
        "the connection outlived the client's close_notify"
    );
    // `time_since_server_cert_refresh` counts from start, not from 1970.
    assert!(stat(&s, &certs, "time_since_server_cert_refresh") < 3600);
}

#[test]
fn a_tls_client_that_does_not_read_cannot_make_the_server_buffer_its_replies() {
    let certs = TestCerts::make("server-unread");
    let s = start(&certs, &["-m", "64"]);
    // One 500 KB value, asked for 400 times in a row (200 MB of replies) by clients that
    // never read.
    let value = vec![b'v'; 500_000];
    let set = [
        format!("set big 0 0 {}\r\n", value.len()).into_bytes(),
        value,
        b"\r\n".to_vec(),
    ];
    // Twice in CI (2026-11-29, 2026-12-01) the first write of this setup (the handshake,
    // then the value) met a connection reset, with the server running and silent; no
    // local run has repeated it (20 runs of this binary, 2026-12-01). Not understood (see
    // the stop notes): the reset is printed with the server's state, and the setup is
    // made once more on a new connection. What the test checks comes after it.
    let store = || -> Result<Tls, std::io::Error> {
        let mut c = tls(&s, &certs);
        for part in &set {
            c.write_all(part)?;
        }
        Ok(c)
    };
    let mut c = store().unwrap_or_else(|e| {
        // A handshake the server refused shows in ssl_handshake_errors (its alert can be
        // lost behind the reset of a socket closed with our bytes unread).
        eprintln!(
            "storing the value: {e}; {}; ssl_handshake_errors {}; trying once more",
            s.state(),
            stat(&s, &certs, "ssl_handshake_errors")
        );
        store().unwrap_or_else(|e| panic!("storing the value again: {e}; {}", s.state()))
    });
    assert_eq!(line(&mut c), "STORED\r\n");
    let before = s.rss();
    let mut hogs = Vec::new();
    for _ in 0..4 {
        let mut h = tls(&s, &certs);
        h.sock
            .set_write_timeout(Some(Duration::from_secs(2)))
            .unwrap();
        for _ in 0..100 {
            // The server stops reading once its output is full: writes then block, and
            // the timeout ends this client's sending.
            if h.write_all(b"get big\r\n").is_err() {
                break;
            }
        }
        hogs.push(h);
    }
    // Still serving others.
    c.write_all(b"get big\r\n").unwrap();
    assert_eq!(line(&mut c), "VALUE big 0 500000\r\n");
    let mut got = vec![0u8; 500_002];
    c.read_exact(&mut got).unwrap();
    assert_eq!(line(&mut c), "END\r\n");
    let grown = s.rss().saturating_sub(before);
    let asked = 4 * 100 * 500_000u64;
    eprintln!("RSS grew {grown} bytes for {asked} bytes of replies asked for and not read");
    assert!(
        grown < 64 << 20,
        "the server grew by {grown} bytes for {asked} bytes of unread replies"
    );
}

#[test]
fn refresh_certs_serves_new_connections_the_new_certificate() {
    let certs = TestCerts::make("server-refresh");
    let plain_port = free_port();
    let s = start(&certs, &["-l", &format!("notls:127.0.0.1:{plain_port}")]);
    let peer_cn = |s: &Server| -> Vec<u8> {
        let mut c = tls(s, &certs);
        c.write_all(b"version\r\n").unwrap();
        let _ = line(&mut c);
        let cert = c.conn.peer_certificates().unwrap()[0].to_vec();
        cert
    };
    let first = peer_cn(&s);
    for ext in ["crt", "key"] {
        std::fs::copy(
            certs.path(&format!("server2.{ext}")),
            certs.path(&format!("server.{ext}")),
        )
        .unwrap();
    }
    let mut c = tls(&s, &certs);
    c.write_all(b"refresh_certs\r\n").unwrap();
    assert_eq!(line(&mut c), "OK\r\n");
    assert_ne!(peer_cn(&s), first, "the new certificate is served");
    // A file that is not a certificate: memcached's error; the one in use stays.
    std::fs::write(certs.path("server.crt"), "junk\n").unwrap();
    c.write_all(b"refresh_certs\r\n").unwrap();
    assert!(line(&mut c).starts_with("Error loading the certificate chain: "));
    c.write_all(b"refresh_certs noreply\r\nversion\r\n")
        .unwrap();
    assert!(line(&mut c).starts_with("Error loading the certificate chain: "));
    assert!(line(&mut c).starts_with("VERSION "));
    // The notls: listener speaks plain text.
    let mut p = TcpStream::connect(("127.0.0.1", plain_port)).unwrap();
    p.set_read_timeout(Some(WAIT)).unwrap();
    p.write_all(b"version\r\n").unwrap();
    assert!(line(&mut p).starts_with("VERSION "));
}

/// Many clients that start a handshake (a ClientHello) and never finish it: what each
/// costs the server, measured (RSS before and after, per connection), bounded by `-c`
/// and closed at `--auth-timeout`.
#[test]
fn unfinished_handshakes_cost_a_bounded_amount_each() {
    let certs = TestCerts::make("server-many-hellos");
    let s = start(&certs, &["-c", "4096", "--auth-timeout", "30"]);
    let hello = {
        let name = ServerName::try_from("127.0.0.1").unwrap();
        let mut conn = rustls::ClientConnection::new(client_config(&certs), name).unwrap();
        let mut flight = Vec::new();
        while conn.wants_write() {
            conn.write_tls(&mut flight).unwrap();
        }
        flight
    };
    let before = s.rss();
    const CLIENTS: usize = 1000;
    let mut held = Vec::with_capacity(CLIENTS);
    for _ in 0..CLIENTS {
        let mut c = TcpStream::connect(("127.0.0.1", s.port)).unwrap();
        c.set_read_timeout(Some(WAIT)).unwrap();
        c.write_all(&hello).unwrap();
        held.push(c);
    }
    // Every one was answered (the server's first flight), so every one was read.
    for c in held.iter_mut() {
        let mut b = [0u8; 1];
        c.read_exact(&mut b).unwrap();
    }
    let grown = s.rss().saturating_sub(before);
    let each = grown / CLIENTS as u64;
    eprintln!("{CLIENTS} unfinished handshakes: RSS +{grown} bytes, {each} bytes each");
    assert!(
        each < 64 << 10,
        "an unfinished handshake holds {each} bytes of server memory"
    );
}

/// TLS clients that announce a large value, send part of it in small records, and die:
/// the half-received items are freed (nothing stored, memory within `-m`), and the next
/// client stores and reads the same key whole.
#[test]
fn tls_clients_that_die_mid_value_leave_nothing_behind() {
    let certs = TestCerts::make("server-die-mid-value");
    let s = start(&certs, &["-m", "64"]);
    let before = s.rss();
    for _ in 0..20 {
        let mut c = tls(&s, &certs);
        c.write_all(b"set big 0 0 500000\r\n").unwrap();
        for _ in 0..200 {
            // One small TLS record per write.
            c.write_all(&[b'x'; 1000]).unwrap();
        }
        c.flush().unwrap();
        drop(c);
    }
    let mut c = tls(&s, &certs);
    c.write_all(b"get big\r\n").unwrap();
    assert_eq!(line(&mut c), "END\r\n", "a half-sent value was stored");
    let value = vec![b'v'; 500_000];
    c.write_all(b"set big 0 0 500000\r\n").unwrap();
    c.write_all(&value).unwrap();
    c.write_all(b"\r\nget big\r\n").unwrap();
    assert_eq!(line(&mut c), "STORED\r\n");
    assert_eq!(line(&mut c), "VALUE big 0 500000\r\n");
    let mut got = vec![0u8; 500_002];
    c.read_exact(&mut got).unwrap();
    assert_eq!(&got[..500_000], &value[..]);
    assert_eq!(stat(&s, &certs, "curr_items"), 1);
    let grown = s.rss().saturating_sub(before);
    eprintln!("RSS grew {grown} bytes after 20 clients died mid-value");
    assert!(grown < 64 << 20, "the server grew by {grown} bytes");
}
