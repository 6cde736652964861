//! `-S`: SASL PLAIN on the binary protocol, against Debian's memcached `-S` with the same
//! users. memcached is built with Cyrus SASL (not `--enable-sasl-pwdb`), so it gets a
//! Cyrus sasldb made here with `saslpasswd2` (package sasl2-bin, installed by
//! scripts/setup.sh) and a config offering PLAIN (`SASL_CONF_PATH`); memfabricd gets the
//! same users as a `MEMCACHED_SASL_PWDB` file. Each case runs on a fresh connection of
//! each server; every request gets one reply packet, or the connection closes, and the
//! transcripts must be identical, and so must `auth_cmds` / `auth_errors` afterwards.
//! Then what memcached does not show the same way: start-up refusals, the file being
//! read at each attempt, and what an unauthenticated client can make the server hold.
//!
//! Servers run on 127.0.0.1 free ports inside guards that kill and reap them on drop.
//! No assertion is about time; waits are bounded so that a broken server fails the test.
mod common;

use std::io::{Read, Write};
use std::net::TcpStream;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};

use common::{closed, free_port, memfabricd, refuses_to_start, Server, WAIT};
use memfabric_proto::binary::{opcode, RequestHeader};
use memfabric_proto::sasl::plain_message;

const BIN: &str = env!("CARGO_BIN_EXE_memfabricd");
const MEMCACHED: &str = "/usr/bin/memcached";
const SASLPASSWD2: &str = "/usr/sbin/saslpasswd2";
const USERS: &[(&str, &str)] = &[("alice", "plainpw"), ("bob", "sec ret")];

/// A directory for one test's files, removed on drop.
struct Scratch(PathBuf);

impl Scratch {
    fn new(name: &str) -> Scratch {
        let p = std::env::temp_dir().join(format!("memfabric-sasl-{}-{name}", std::process::id()));
        let _ = std::fs::remove_dir_all(&p);
        std::fs::create_dir_all(&p).expect("scratch dir");
        Scratch(p)
    }
}

impl Drop for Scratch {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

fn pwdb(dir: &Path, users: &[(&str, &str)]) -> PathBuf {
    let p = dir.join("pwdb");
    let text: String = users.iter().map(|(u, p)| format!("{u}:{p}\n")).collect();
    std::fs::write(&p, text).expect("pwdb");
    p
}

/// A Cyrus sasldb with `USERS` (realm: this host's name, which is what memcached's
/// Cyrus looks users up in) and a config offering PLAIN from it.
fn cyrus_config(dir: &Path) {
    assert!(
        Path::new(SASLPASSWD2).exists(),
        "{SASLPASSWD2} is missing: run scripts/setup.sh (it installs sasl2-bin)"
    );
    let db = dir.join("sasldb2");
    for (user, pass) in USERS {
        let mut child = Command::new(SASLPASSWD2)
            .args(["-p", "-a", "memcached", "-c", "-f"])
            .arg(&db)
            .arg(user)
            .stdin(Stdio::piped())
            .spawn()
            .expect("saslpasswd2");
        child
            .stdin
            .take()
            .unwrap()
            .write_all(pass.as_bytes())
            .unwrap();
        assert!(child.wait().unwrap().success(), "saslpasswd2 {user}");
    }
    std::fs::write(
        dir.join("memcached.conf"),
        format!("mech_list: plain\nsasldb_path: {}\n", db.display()),
    )
    .expect("sasl conf");
}

fn start(bin: &str, dir: &Path, extra: &[&str]) -> Server {
    let port = free_port();
    let mut cmd = Command::new(bin);
    cmd.args(["-p", &port.to_string(), "-l", "127.0.0.1", "-U", "0", "-S"])
        .args(extra);
    if bin == BIN {
        cmd.args(["--ucx-port", "0"])
            .env("MEMCACHED_SASL_PWDB", dir.join("pwdb"));
    } else {
        cmd.env("SASL_CONF_PATH", dir);
        if nix::unistd::geteuid().is_root() {
            cmd.args(["-u", "root"]);
        }
    }
    Server::spawn(&mut cmd, port)
}

fn connect(s: &Server) -> TcpStream {
    let c = TcpStream::connect(("127.0.0.1", s.port)).expect("connect");
    c.set_read_timeout(Some(WAIT)).expect("timeout");
    c
}

fn packet(op: u8, key: &[u8], extras: &[u8], value: &[u8], opaque: u32) -> Vec<u8> {
    let mut out = Vec::new();
    RequestHeader {
        opcode: op,
        key_len: key.len() as u16,
        extras_len: extras.len() as u8,
        body_len: (key.len() + extras.len() + value.len()) as u32,
        opaque,
        ..RequestHeader::default()
    }
    .encode(&mut out);
    out.extend_from_slice(extras);
    out.extend_from_slice(key);
    out.extend_from_slice(value);
    out
}

fn auth(message: &[u8]) -> Vec<u8> {
    packet(opcode::SASL_AUTH, b"PLAIN", &[], message, 0)
}

fn step(message: &[u8]) -> Vec<u8> {
    packet(opcode::SASL_STEP, b"PLAIN", &[], message, 0)
}

fn simple(op: u8) -> Vec<u8> {
    packet(op, &[], &[], &[], 0)
}

/// One reply packet, whole; `None` when the server closed instead.
fn reply(c: &mut TcpStream) -> Option<Vec<u8>> {
    let mut header = [0u8; 24];
    match c.read_exact(&mut header) {
        Ok(()) => {}
        Err(e)
            if matches!(
                e.kind(),
                std::io::ErrorKind::UnexpectedEof | std::io::ErrorKind::ConnectionReset
            ) =>
        {
            return None
        }
        Err(e) => panic!("no reply ({e})"),
    }
    let body = u32::from_be_bytes(header[8..12].try_into().unwrap()) as usize;
    let mut packet = header.to_vec();
    packet.resize(24 + body, 0);
    c.read_exact(&mut packet[24..]).expect("reply body");
    Some(packet)
}

/// Sends each request and reads its one reply; stops at a close.
fn transcript(s: &Server, requests: &[Vec<u8>]) -> Vec<Option<Vec<u8>>> {
    let mut c = connect(s);
    let mut got = Vec::new();
    for r in requests {
        c.write_all(r).unwrap();
        let one = reply(&mut c);
        let end = one.is_none();
        got.push(one);
        if end {
            break;
        }
    }
    got
}

/// `stats` values, asked after authenticating as alice.
fn stat(s: &Server, name: &str) -> String {
    let mut c = connect(s);
    c.write_all(&auth(&plain_message(b"alice", b"plainpw")))
        .unwrap();
    let ok = reply(&mut c).expect("authenticated");
    assert_eq!(&ok[24..], b"Authenticated");
    let group: &[u8] = if name.starts_with("auth_enabled") || name == "binding_protocol" {
        b"settings"
    } else {
        b""
    };
    c.write_all(&packet(opcode::STAT, group, &[], &[], 0))
        .unwrap();
    let mut found = None;
    loop {
        let p = reply(&mut c).expect("stat");
        let kl = u16::from_be_bytes([p[2], p[3]]) as usize;
        if kl == 0 {
            return found.unwrap_or_else(|| panic!("no stat {name}"));
        }
        if &p[24..24 + kl] == name.as_bytes() {
            found = Some(String::from_utf8_lossy(&p[24 + kl..]).into_owned());
        }
    }
}

fn cases() -> Vec<(&'static str, Vec<Vec<u8>>)> {
    let good = plain_message(b"alice", b"plainpw");
    let bad = plain_message(b"alice", b"bad");
    let bob = plain_message(b"bob", b"sec ret");
    let a = |m: &[u8]| auth(m);
    let s = |m: &[u8]| step(m);
    let noop = || simple(opcode::NOOP);
    let set = packet(opcode::SET, b"k", &[0; 8], b"v", 0);
    let get = packet(opcode::GET, b"k", &[], &[], 0);
    let mech = |name: &[u8], m: &[u8]| packet(opcode::SASL_AUTH, name, &[], m, 0);
    let mut big = b"\0alice\0".to_vec();
    big.resize(100_000, b'x');
    let mut huge = b"\0alice\0".to_vec();
    huge.resize(600_000, b'x');
    let mut key_over_body = packet(opcode::GET, &[b'x'; 10], &[], &[], 0);
    key_over_body[8..12].copy_from_slice(&5u32.to_be_bytes());
    vec![
        ("list mechanisms", vec![simple(opcode::SASL_LIST_MECHS)]),
        ("right password", vec![a(&good), set.clone(), get.clone()]),
        ("wrong then right", vec![a(&bad), a(&good), noop()]),
        ("lower-case mechanism", vec![mech(b"plain", &good), noop()]),
        (
            "mechanism ends at a NUL",
            vec![mech(b"PLAIN\0", &good), noop()],
        ),
        (
            "mechanism with a space",
            vec![mech(b"PLAIN ", &good), noop()],
        ),
        ("two mechanisms", vec![mech(b"PLAIN CRAM", &good), noop()]),
        (
            "mechanism not offered",
            vec![mech(b"CRAM-MD5", b""), noop()],
        ),
        ("unknown mechanism", vec![mech(b"FOO", &good), noop()]),
        ("32-byte mechanism", vec![mech(&[b'P'; 32], &good), noop()]),
        ("33-byte mechanism", vec![mech(&[b'P'; 33], &good), noop()]),
        ("300-byte mechanism", vec![mech(&[b'P'; 300], &good)]),
        ("empty then step", vec![a(b""), s(&good), noop()]),
        (
            "empty, wrong step, step",
            vec![a(b""), s(&bad), s(&good), noop()],
        ),
        ("empty, empty step", vec![a(b""), s(b""), s(&good), noop()]),
        ("empty then auth", vec![a(b""), a(&good), noop()]),
        ("empty twice", vec![a(b""), a(b""), noop()]),
        ("continue is not authenticated", vec![a(b""), noop()]),
        ("step first", vec![s(&good), noop()]),
        ("step after a failed auth", vec![a(&bad), s(&good), noop()]),
        (
            "step under another mechanism",
            vec![
                a(b""),
                packet(opcode::SASL_STEP, b"XYZ", &[], &good, 0),
                noop(),
            ],
        ),
        ("authzid = user", vec![a(b"alice\0alice\0plainpw"), noop()]),
        (
            "authzid another user",
            vec![a(b"bob\0alice\0plainpw"), noop()],
        ),
        ("one separator", vec![a(b"alice\0plainpw"), noop()]),
        (
            "NUL after the password",
            vec![a(b"\0alice\0plainpw\0"), noop()],
        ),
        ("no user", vec![a(b"\0\0plainpw"), noop()]),
        ("no password", vec![a(b"\0alice\0"), noop()]),
        ("only separators", vec![a(b"\0\0"), noop()]),
        ("unknown user", vec![a(b"\0eve\0plainpw"), noop()]),
        ("a password with a space", vec![a(&bob), noop()]),
        ("100 KB of data", vec![a(&big), noop()]),
        ("600 KB of data", vec![a(&huge), noop()]),
        ("success then wrong", vec![a(&good), a(&bad), noop()]),
        ("success twice", vec![a(&good), a(&good), noop()]),
        ("success then another user", vec![a(&good), a(&bob), noop()]),
        (
            "success, failure, success",
            vec![a(&good), a(&bad), a(&good), noop()],
        ),
        (
            "success, failure, bob",
            vec![a(&good), a(&bad), a(&bob), noop()],
        ),
        ("success then empty", vec![a(&good), a(b""), noop()]),
        (
            "success, empty, step",
            vec![a(&good), a(b""), s(&good), a(&good), noop()],
        ),
        (
            "success then step",
            vec![a(&good), s(&good), a(&good), a(&good), noop()],
        ),
        (
            "success then unknown mechanism",
            vec![a(&good), mech(b"FOO", &good), a(&good), noop()],
        ),
        (
            "success, unknown, step",
            vec![a(&good), mech(b"FOO", &good), s(&good), noop()],
        ),
        (
            "success, long mechanism",
            vec![a(&good), mech(&[b'P'; 40], &good), noop()],
        ),
        (
            "success then list",
            vec![a(&good), simple(opcode::SASL_LIST_MECHS)],
        ),
        ("unauthenticated get", vec![get.clone()]),
        (
            "unauthenticated getq",
            vec![packet(opcode::GETQ, b"k", &[], &[], 0)],
        ),
        ("unauthenticated noop", vec![noop()]),
        ("unauthenticated stat", vec![simple(opcode::STAT)]),
        ("unauthenticated quit", vec![simple(opcode::QUIT)]),
        ("unauthenticated unknown opcode", vec![simple(0x50)]),
        (
            "unauthenticated 300-byte key",
            vec![packet(opcode::GET, &[b'k'; 300], &[], &[], 0)],
        ),
        ("key longer than the body", vec![key_over_body]),
        ("version", vec![simple(opcode::VERSION), noop()]),
        (
            "version with a body",
            vec![packet(opcode::VERSION, &[], &[], b"x", 0)],
        ),
        (
            "auth with extras",
            vec![packet(opcode::SASL_AUTH, b"PLAIN", b"abcd", &good, 0)],
        ),
        (
            "auth without a mechanism",
            vec![packet(opcode::SASL_AUTH, b"", &[], &good, 0)],
        ),
        (
            "list with a body",
            vec![packet(opcode::SASL_LIST_MECHS, b"x", &[], &[], 0)],
        ),
        (
            "ascii",
            vec![b"get aaaaaaaaaaaaaaaaaaaaaaaaaaaa\r\n".to_vec()],
        ),
        (
            "opaque echoed",
            vec![
                packet(opcode::SASL_AUTH, b"PLAIN", &[], &good, 0x1234_5678),
                packet(opcode::SASL_LIST_MECHS, &[], &[], &[], 7),
            ],
        ),
    ]
}

#[test]
fn sasl_is_answered_as_memcached_answers_it() {
    let dir = Scratch::new("differential");
    cyrus_config(&dir.0);
    pwdb(&dir.0, USERS);
    let mc = start(MEMCACHED, &dir.0, &[]);
    let mf = start(BIN, &dir.0, &[]);
    for (name, requests) in cases() {
        let want = transcript(&mc, &requests);
        let got = transcript(&mf, &requests);
        assert_eq!(got, want, "case {name:?}: memfabricd, then memcached");
    }
    // Several requests in one write, as a pipelining client sends them.
    let good = plain_message(b"alice", b"plainpw");
    let pipelined = [
        auth(&good),
        packet(opcode::SET, b"k", &[0; 8], b"v", 0),
        packet(opcode::GET, b"k", &[], &[], 0),
        auth(b"\0alice\0wrong"),
        packet(opcode::GET, b"k", &[], &[], 0),
    ]
    .concat();
    let mut replies = Vec::new();
    for s in [&mc, &mf] {
        let mut c = connect(s);
        c.write_all(&pipelined).unwrap();
        let mut all = Vec::new();
        c.read_to_end(&mut all).unwrap();
        replies.push(all);
    }
    assert_eq!(
        replies[1], replies[0],
        "pipelined: memfabricd, then memcached"
    );
    for name in [
        "auth_cmds",
        "auth_errors",
        "auth_enabled_sasl",
        "binding_protocol",
    ] {
        assert_eq!(stat(&mf, name), stat(&mc, name), "{name}");
    }
    assert!(stat(&mf, "auth_errors").parse::<u64>().unwrap() >= 20);
}

#[test]
fn the_password_file_is_read_at_every_attempt() {
    let dir = Scratch::new("reread");
    let file = pwdb(&dir.0, &[("alice", "one")]);
    let mf = start(BIN, &dir.0, &[]);
    let try_auth = |user: &[u8], pass: &[u8]| {
        let mut c = connect(&mf);
        c.write_all(&auth(&plain_message(user, pass))).unwrap();
        let r = reply(&mut c).expect("reply");
        u16::from_be_bytes([r[6], r[7]]) == 0
    };
    assert!(try_auth(b"alice", b"one"));
    assert!(!try_auth(b"carol", b"three"));
    std::fs::write(&file, "carol:three\n").unwrap();
    assert!(try_auth(b"carol", b"three"), "an entry added");
    assert!(!try_auth(b"alice", b"one"), "an entry removed");
    std::fs::remove_file(&file).unwrap();
    assert!(!try_auth(b"carol", b"three"), "the file is gone");
}

#[test]
fn start_up_refuses_what_it_cannot_honour() {
    let dir = Scratch::new("refusals");
    let file = pwdb(&dir.0, USERS);
    let missing = dir.0.join("missing");
    let cases: Vec<(Vec<&str>, Option<&Path>, &str)> = vec![
        (vec![], None, "MEMCACHED_SASL_PWDB"),
        (vec![], Some(&missing), "cannot read the SASL password file"),
        (
            vec!["-B", "ascii"],
            Some(&file),
            "ERROR: You cannot allow the ASCII protocol while using SASL.",
        ),
        (
            vec!["-B", "auto"],
            Some(&file),
            "ERROR: You cannot allow the ASCII protocol while using SASL.",
        ),
        (
            vec!["-U", "11211"],
            Some(&file),
            "ERROR: Cannot enable UDP while using binary SASL authentication.",
        ),
        (vec!["-Y", "/dev/null"], Some(&file), "-S with -Y"),
    ];
    for (args, db, says) in cases {
        let port = free_port();
        let mut cmd = memfabricd(port);
        cmd.arg("-S").args(&args).env_remove("MEMCACHED_SASL_PWDB");
        if let Some(db) = db {
            cmd.env("MEMCACHED_SASL_PWDB", db);
        }
        let err = refuses_to_start(&mut cmd, port);
        assert!(err.contains(says), "{args:?}: {err}");
    }
}

/// Unauthenticated clients that send SASL data larger than any entry, many at once: the
/// server answers each as memcached does and discards the data as it arrives; its
/// memory does not grow with what they send, and connections that never authenticate
/// are closed after `--auth-timeout`.
#[test]
fn unauthenticated_clients_cannot_make_the_server_hold_their_input() {
    let dir = Scratch::new("hostile");
    pwdb(&dir.0, USERS);
    let mf = start(BIN, &dir.0, &["-m", "64", "--auth-timeout", "2"]);
    let before = mf.rss();
    const CLIENTS: usize = 64;
    const BODY: usize = 500_000;
    let mut sent = 0usize;
    let mut conns = Vec::new();
    for i in 0..CLIENTS {
        let mut c = connect(&mf);
        // Announce 500 KB of PLAIN data (failing: larger than any entry), send all but
        // the last byte, and keep the connection open.
        let mut p = packet(
            opcode::SASL_AUTH,
            b"PLAIN",
            &[],
            &vec![b'x'; BODY],
            i as u32,
        );
        p.pop();
        c.write_all(&p).unwrap();
        sent += p.len();
        let r = reply(&mut c).expect("a reply before the data is all here");
        assert_eq!(&r[24..], b"Auth failure.");
        conns.push(c);
    }
    // A body the size of the largest binary packet: "Out of memory", discarded.
    let mut c = connect(&mf);
    let mut p = packet(opcode::SASL_STEP, b"PLAIN", &[], &[], 0);
    p[8..12].copy_from_slice(&u32::MAX.to_be_bytes());
    c.write_all(&p).unwrap();
    let r = reply(&mut c).expect("reply");
    assert_eq!(&r[24..], b"Out of memory");
    for _ in 0..64 {
        c.write_all(&[0u8; 1 << 16]).unwrap();
        sent += 1 << 16;
    }
    let grown = mf.rss().saturating_sub(before);
    assert!(
        grown < (sent / 4) as u64,
        "the server grew by {grown} bytes while unauthenticated clients sent {sent}"
    );
    // None of it authenticated anything; all of them are closed at the deadline.
    conns.push(c);
    for c in conns.iter_mut() {
        assert!(
            closed(c),
            "an unauthenticated connection outlived --auth-timeout"
        );
    }
    let errors: u64 = stat(&mf, "auth_errors").parse().unwrap();
    assert_eq!(errors, CLIENTS as u64);
    assert!(stat(&mf, "idle_kicks").parse::<u64>().unwrap() >= CLIENTS as u64);
}
