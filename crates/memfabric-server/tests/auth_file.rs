//! `-Y FILE`: memcached's ASCII authentication, against Debian's memcached with the same
//! file. Each handshake case runs on a fresh connection of each server and must get the
//! same reply bytes (one reply per case: memcached answers only the last of several
//! handshake requests that arrive in one read, a bug memfabricd does not copy); the
//! counters `auth_cmds` / `auth_errors` must agree afterwards. Then what memcached does
//! not show the same way: start-up refusals, SIGHUP reloading the file, and input an
//! unauthenticated client cannot make the server hold. (The UCX bootstrap's use of the
//! same file: `memfabric-client/tests/ucx_auth.rs`.)
//!
//! Servers run on 127.0.0.1 free ports inside guards that kill and reap them on drop.
//! No assertion is about time; waits are bounded so that a broken server fails the test.
mod common;

use std::io::{Read, Write};
use std::net::TcpStream;
use std::path::PathBuf;
use std::process::Command;
use std::time::{Duration, Instant};

use common::{closed, free_port, refuses_to_start, Server, WAIT};

const BIN: &str = env!("CARGO_BIN_EXE_memfabricd");
const MEMCACHED: &str = "/usr/bin/memcached";

fn auth_file(name: &str, text: &str) -> PathBuf {
    let p = std::env::temp_dir().join(format!("memfabric-auth-{}-{name}", std::process::id()));
    std::fs::write(&p, text).expect("write auth file");
    p
}

fn start(bin: &str, file: &PathBuf) -> Server {
    let port = free_port();
    let mut cmd = Command::new(bin);
    cmd.args(["-p", &port.to_string(), "-l", "127.0.0.1", "-U", "0", "-Y"])
        .arg(file);
    if bin == BIN {
        cmd.args(["--ucx-port", "0"]);
    } else if nix::unistd::geteuid().is_root() {
        cmd.args(["-u", "root"]);
    }
    Server::spawn(&mut cmd, port)
}

fn connect(s: &Server) -> TcpStream {
    let c = match TcpStream::connect(("127.0.0.1", s.port)) {
        Ok(c) => c,
        // (CI saw this refused, rarely, right after the server had listened.)
        Err(e) => {
            let state = s.state();
            panic!("connect to {}: {e}; {state}", s.port)
        }
    };
    c.set_read_timeout(Some(WAIT)).expect("timeout");
    c
}

/// Reads one `\r\n`-ended line (or what came before the server closed).
fn line(c: &mut TcpStream) -> Vec<u8> {
    let mut got = Vec::new();
    let mut b = [0u8; 1];
    while !got.ends_with(b"\r\n") {
        match c.read(&mut b) {
            Ok(0) => break,
            Ok(_) => got.push(b[0]),
            Err(e) => panic!(
                "no reply line ({e}); so far {:?}",
                String::from_utf8_lossy(&got)
            ),
        }
    }
    got
}

fn stat(s: &Server, name: &str) -> u64 {
    stat_in(s, "stats", name).parse().unwrap()
}

/// One `STAT` of `command` (`stats`, `stats settings`), asked after authenticating.
fn stat_in(s: &Server, command: &str, name: &str) -> String {
    let mut c = connect(s);
    c.write_all(b"set a 0 0 12\r\nalice secret\r\n").unwrap();
    assert_eq!(line(&mut c), b"STORED\r\n");
    c.write_all(format!("{command}\r\n").as_bytes()).unwrap();
    loop {
        let l = String::from_utf8(line(&mut c)).unwrap();
        assert_ne!(l, "END\r\n", "no {name}");
        if let Some(v) = l.strip_prefix(&format!("STAT {name} ")) {
            return v.trim().to_string();
        }
    }
}

/// Handshake requests that get exactly one reply line, each on a fresh connection.
const CASES: &[&[u8]] = &[
    b"get foo\r\n",
    b"version\r\n",
    b"mg foo v\r\n",
    b"\r\n",
    b"SET x 0 0 12\r\n",
    b"set x 0 12\r\n",
    b"set x 0 0 12x\r\n",
    b"set x 0 0 -1\r\n",
    b"add x 0 0 12\r\n",
    b"set x 0 0 12\r\nalice secret\r\n",
    b"set x 0 0 12\r\nalice wrongg\r\n",
    b"set x 0 0 12\r\nALICE secret\r\n",
    b"set x 0 0 11\r\nalice secre\r\n",
    b"set x 0 0 13\r\nalice secrets\r\n",
    b"set x 0 0 7\r\nbob pw2\r\n",
    b"set x 0 0 11\r\nbob pw2 xxx\r\n",
    b"set x 0 0 13\r\nalice  secret\r\n",
    b"set x 0 0 13\r\nalice secret \r\n",
    b"set x 0 0 12\r\nalice\tsecret\r\n",
    b"set x 0 0 5\r\nalice\r\n",
    b"set x 0 0 0\r\n\r\n",
    b"set x 0 0 3\r\nabcXY",
    b"set x 0 0 12\nalice secret\r\n",
    b"set  x 0 0 12 noreply\r\nalice secret\r\n",
    b"set x 0 0 +12\r\nalice secret\r\n",
    b"set x 0 0 12\r\nali\0e secret\r\n",
    b"set x 0 0 10\r\ncarol open\r\n",
];

#[test]
fn the_handshake_is_answered_as_memcached_answers_it() {
    let file = auth_file("users", "alice:secret\nbob:pw2\ncarol:open\r\n");
    let mc = start(MEMCACHED, &file);
    let mf = start(BIN, &file);
    for case in CASES {
        let mut replies = Vec::new();
        for s in [&mc, &mf] {
            let mut c = connect(s);
            c.write_all(case).unwrap();
            let mut got = line(&mut c);
            if got == b"STORED\r\n" {
                // Authenticated: the connection now serves requests.
                c.write_all(b"set k 1 0 1\r\nv\r\nmg k v\r\n").unwrap();
                got.extend(line(&mut c));
                got.extend(line(&mut c));
                got.extend(line(&mut c));
            }
            replies.push(got);
        }
        assert_eq!(
            String::from_utf8_lossy(&replies[1]),
            String::from_utf8_lossy(&replies[0]),
            "case {:?}: memfabricd, then memcached",
            String::from_utf8_lossy(case)
        );
    }
    for name in ["auth_cmds", "auth_errors"] {
        assert_eq!(stat(&mf, name), stat(&mc, name), "{name}");
    }
    assert!(stat(&mf, "auth_errors") >= 4);
    let setting = |s: &Server| stat_in(s, "stats settings", "auth_enabled_ascii");
    assert_eq!(setting(&mf), setting(&mc));
    assert_eq!(setting(&mf), file.display().to_string());
    let _ = std::fs::remove_file(file);
}

#[test]
fn sighup_reads_the_file_again_and_a_bad_file_keeps_the_old_entries() {
    let file = auth_file("reload", "alice:secret\n");
    let mf = start(BIN, &file);
    let try_auth = |cred: &[u8]| {
        let mut c = connect(&mf);
        c.write_all(format!("set x 0 0 {}\r\n", cred.len()).as_bytes())
            .unwrap();
        c.write_all(cred).unwrap();
        c.write_all(b"\r\n").unwrap();
        line(&mut c) == b"STORED\r\n"
    };
    assert!(!try_auth(b"dave pw"));
    std::fs::write(&file, "alice:secret\ndave:pw\n").unwrap();
    let hup = || {
        let pid = nix::unistd::Pid::from_raw(mf.child.id() as i32);
        nix::sys::signal::kill(pid, nix::sys::signal::Signal::SIGHUP).unwrap();
    };
    hup();
    let start = Instant::now();
    while !try_auth(b"dave pw") {
        assert!(start.elapsed() < WAIT, "SIGHUP did not read the file again");
        std::thread::sleep(Duration::from_millis(50));
    }
    // A malformed file: the entries in use stay (and the server is still there).
    std::fs::write(&file, "no colon here\n").unwrap();
    hup();
    std::thread::sleep(Duration::from_millis(700));
    assert!(try_auth(b"dave pw") && try_auth(b"alice secret"));
    let _ = std::fs::remove_file(file);
}

#[test]
fn an_unauthenticated_client_cannot_make_the_server_hold_its_input() {
    let file = auth_file("hostile", "alice:secret\n");
    let mf = start(BIN, &file);
    // A line that never ends: closed after 1 KiB, as memcached does.
    let mut c = connect(&mf);
    c.write_all(&[b'x'; 2048]).unwrap();
    assert!(closed(&mut c), "a 2 KiB line without a newline");
    // A binary packet is text to a server with -Y: no newline, so the same.
    let mut c = connect(&mf);
    let mut packet = vec![0x80u8, 0x00, 0x00, 0x03, 0, 0, 0, 0, 0, 0, 0, 3];
    packet.extend([0u8; 12]);
    packet.extend(b"foo");
    c.write_all(&packet).unwrap();
    c.write_all(&[0u8; 1100]).unwrap();
    assert!(closed(&mut c), "binary junk");
    // A credential payload larger than any entry: closed before it is buffered.
    let mut c = connect(&mf);
    c.write_all(b"set x 0 0 100000000\r\n").unwrap();
    assert!(closed(&mut c), "a 100 MB payload announced");
    // Requests that are not the handshake are answered (each) and change nothing.
    let mut c = connect(&mf);
    for _ in 0..1000 {
        c.write_all(b"set k 0 0 1\r\nv\r\n").unwrap();
    }
    for _ in 0..1000 {
        assert_eq!(
            line(&mut c),
            b"CLIENT_ERROR bad authentication token format\r\n"
        );
    }
    assert_eq!(stat(&mf, "curr_items"), 0, "nothing was stored");
    let _ = std::fs::remove_file(file);
}

#[test]
fn start_up_refuses_what_memcached_refuses() {
    let good = auth_file("good", "alice:secret\n");
    let bad = auth_file("bad", "alice:secret\nnocolon\n");
    let missing = std::env::temp_dir().join("memfabric-auth-does-not-exist");
    let cases: Vec<(Vec<String>, &str)> = vec![
        (
            vec![
                "-Y".into(),
                bad.display().to_string(),
                "-U".into(),
                "0".into(),
                "--ucx-port".into(),
                "0".into(),
            ],
            "has a malformed entry. Should be 'user:password'",
        ),
        (
            vec![
                "-Y".into(),
                missing.display().to_string(),
                "-U".into(),
                "0".into(),
                "--ucx-port".into(),
                "0".into(),
            ],
            "Could not open authfile",
        ),
        (
            vec![
                "-Y".into(),
                good.display().to_string(),
                "-U".into(),
                "11211".into(),
                "--ucx-port".into(),
                "0".into(),
            ],
            "Cannot use UDP with ascii authentication enabled (-U 0 to disable)",
        ),
    ];
    for (args, says) in cases {
        let port = free_port();
        let mut cmd = Command::new(BIN);
        cmd.args(["-p", &port.to_string(), "-l", "127.0.0.1"])
            .args(&args);
        let err = refuses_to_start(&mut cmd, port);
        assert!(err.contains(says), "{args:?}: {err}");
    }
    let _ = std::fs::remove_file(good);
    let _ = std::fs::remove_file(bad);
}

#[test]
fn a_connection_that_does_not_authenticate_in_time_is_closed_and_others_stay() {
    let file = auth_file("deadline", "alice:secret\n");
    let port = free_port();
    let mut cmd = Command::new(BIN);
    cmd.args(["-p", &port.to_string(), "-l", "127.0.0.1", "-U", "0"])
        .args(["--ucx-port", "0", "--auth-timeout", "1", "-Y"])
        .arg(&file);
    let mf = Server::spawn(&mut cmd, port);
    let mut silent = connect(&mf);
    let mut halfway = connect(&mf);
    halfway.write_all(b"set x 0 0 12\r\nalice").unwrap();
    let mut authed = connect(&mf);
    authed
        .write_all(b"set x 0 0 12\r\nalice secret\r\n")
        .unwrap();
    assert_eq!(line(&mut authed), b"STORED\r\n");
    assert!(closed(&mut silent), "a connection that says nothing");
    assert!(closed(&mut halfway), "a handshake never finished");
    // The authenticated one is not touched (no -o idle_timeout): still answers after the
    // others were closed.
    authed.write_all(b"mn\r\n").unwrap();
    assert_eq!(line(&mut authed), b"MN\r\n");
    assert!(stat(&mf, "idle_kicks") >= 2);
    let _ = std::fs::remove_file(file);
}
