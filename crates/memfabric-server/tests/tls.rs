//! `-Z` against hostile and heavy TLS clients (certificates made here with openssl; a
//! rustls client). What memcached does not show the same way, so not a differential
//! (tests/interop/test_tls.py is): junk where a ClientHello belongs is refused and counted
//! in `ssl_handshake_errors`; handshakes that never finish are closed at
//! `--auth-timeout`; a client that asks for large values and never reads them holds the
//! server to its output cap (RSS measured against what it asked for); `refresh_certs`
//! takes effect for new connections; `notls:` listeners stay plain.
//!
//! Servers run on 127.0.0.1 free ports inside guards that kill and reap them on drop.
//! No assertion is about time; waits are bounded so that a broken server fails the test.
use std::io::{Read, Write};
use std::net::{TcpListener, TcpStream};
use std::path::PathBuf;
use std::process::{Child, Command, Stdio};
use std::sync::Arc;
use std::time::{Duration, Instant};

use rustls::pki_types::pem::PemObject;
use rustls::pki_types::{CertificateDer, ServerName};

const BIN: &str = env!("CARGO_BIN_EXE_memfabricd");
const WAIT: Duration = Duration::from_secs(10);

struct Server {
    child: Child,
    port: u16,
}

impl Drop for Server {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

impl Server {
    fn rss(&self) -> u64 {
        let status = std::fs::read_to_string(format!("/proc/{}/status", self.child.id()))
            .expect("server is alive");
        let kb: u64 = status
            .lines()
            .find_map(|l| l.strip_prefix("VmRSS:"))
            .and_then(|v| v.trim().trim_end_matches("kB").trim().parse().ok())
            .expect("VmRSS");
        kb * 1024
    }
}

struct Certs(PathBuf);

impl Drop for Certs {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

impl Certs {
    fn make(name: &str) -> Certs {
        let dir =
            std::env::temp_dir().join(format!("memfabricd-tls-{}-{name}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        std::fs::create_dir_all(&dir).unwrap();
        let openssl = |args: &[&str]| {
            let out = Command::new("openssl")
                .args(args)
                .current_dir(&dir)
                .output()
                .expect("openssl (scripts/setup.sh installs it)");
            assert!(out.status.success(), "openssl {args:?}: {out:?}");
        };
        let ec = [
            "-newkey",
            "ec",
            "-pkeyopt",
            "ec_paramgen_curve:prime256v1",
            "-nodes",
        ];
        openssl(
            &[
                &["req", "-x509"][..],
                &ec,
                &[
                    "-keyout", "ca.key", "-out", "ca.crt", "-days", "2", "-subj", "/CN=ca",
                ],
            ]
            .concat(),
        );
        std::fs::write(dir.join("san.ext"), "subjectAltName=IP:127.0.0.1\n").unwrap();
        for (who, cn) in [("server", "one"), ("server2", "two")] {
            let (key, csr, crt) = (
                format!("{who}.key"),
                format!("{who}.csr"),
                format!("{who}.crt"),
            );
            let subj = format!("/CN={cn}");
            openssl(
                &[
                    &["req"][..],
                    &ec,
                    &["-keyout", &key, "-out", &csr, "-subj", &subj],
                ]
                .concat(),
            );
            openssl(&[
                "x509",
                "-req",
                "-in",
                &csr,
                "-CA",
                "ca.crt",
                "-CAkey",
                "ca.key",
                "-CAcreateserial",
                "-out",
                &crt,
                "-days",
                "2",
                "-extfile",
                "san.ext",
            ]);
        }
        Certs(dir)
    }

    fn path(&self, f: &str) -> PathBuf {
        self.0.join(f)
    }

    fn client_config(&self) -> Arc<rustls::ClientConfig> {
        let mut roots = rustls::RootCertStore::empty();
        for c in CertificateDer::pem_file_iter(self.path("ca.crt")).unwrap() {
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
}

fn free_port() -> u16 {
    let l = TcpListener::bind("127.0.0.1:0").expect("bind probe");
    l.local_addr().expect("probe addr").port()
}

fn start(certs: &Certs, extra: &[&str]) -> Server {
    let port = free_port();
    let opts = format!(
        "ssl_chain_cert={},ssl_key={}",
        certs.path("server.crt").display(),
        certs.path("server.key").display()
    );
    let child = Command::new(BIN)
        .args([
            "-p",
            &port.to_string(),
            "-l",
            "127.0.0.1",
            "-U",
            "0",
            "--ucx-port",
            "0",
        ])
        .args(["-Z", "-o", &opts])
        .args(extra)
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .expect("spawn");
    let server = Server { child, port };
    let start = Instant::now();
    while TcpStream::connect(("127.0.0.1", port)).is_err() {
        assert!(start.elapsed() < WAIT, "never listened");
        std::thread::sleep(Duration::from_millis(20));
    }
    server
}

type Tls = rustls::StreamOwned<rustls::ClientConnection, TcpStream>;

fn tls(s: &Server, certs: &Certs) -> Tls {
    let sock = TcpStream::connect(("127.0.0.1", s.port)).expect("connect");
    sock.set_read_timeout(Some(WAIT)).unwrap();
    let name = ServerName::try_from("127.0.0.1").unwrap();
    let conn = rustls::ClientConnection::new(certs.client_config(), name).unwrap();
    rustls::StreamOwned::new(conn, sock)
}

fn line(c: &mut impl Read) -> String {
    let mut got = Vec::new();
    let mut b = [0u8; 1];
    while !got.ends_with(b"\r\n") {
        match c.read(&mut b) {
            Ok(0) => break,
            Ok(_) => got.push(b[0]),
            Err(e) => panic!("no reply line ({e})"),
        }
    }
    String::from_utf8_lossy(&got).into_owned()
}

fn stat(s: &Server, certs: &Certs, name: &str) -> u64 {
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

/// The server closed the connection (reading what it still sent).
fn closed(c: &mut TcpStream) -> bool {
    let mut b = [0u8; 4096];
    loop {
        match c.read(&mut b) {
            Ok(0) => return true,
            Ok(_) => continue,
            Err(e) if e.kind() == std::io::ErrorKind::ConnectionReset => return true,
            Err(_) => return false,
        }
    }
}

#[test]
fn junk_and_stalled_handshakes_are_refused_counted_and_closed() {
    let certs = Certs::make("junk");
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

#[test]
fn a_tls_client_that_does_not_read_cannot_make_the_server_buffer_its_replies() {
    let certs = Certs::make("unread");
    let s = start(&certs, &["-m", "64"]);
    // One 500 KB value, asked for 400 times in a row (200 MB of replies) by clients that
    // never read.
    let mut c = tls(&s, &certs);
    let value = vec![b'v'; 500_000];
    c.write_all(format!("set big 0 0 {}\r\n", value.len()).as_bytes())
        .unwrap();
    c.write_all(&value).unwrap();
    c.write_all(b"\r\n").unwrap();
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
    let certs = Certs::make("refresh");
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
