//! The `memfabricd` binary's command line and set-up, end to end: flags it cannot honour
//! stop it before it listens, `-p -1 -U -1` with `MEMCACHED_PORT_FILENAME` reports real
//! ports as memcached does, and logs written to a pipe are plain text.
//!
//! Every server runs on 127.0.0.1 (ephemeral or free ports) inside a guard whose Drop
//! kills and reaps it, also when an assertion fails. No assertion is about time: waits are
//! bounded only so that a broken server fails the test instead of hanging it.
use std::io::{BufRead, BufReader, Read, Write};
use std::net::{TcpStream, UdpSocket};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, ExitStatus, Stdio};
use std::time::{Duration, Instant};

const BIN: &str = env!("CARGO_BIN_EXE_memfabricd");
const MEMCACHED: &str = "/usr/bin/memcached";
const WAIT: Duration = Duration::from_secs(10);

/// A started server process; killed and reaped on drop.
struct Guard {
    child: Child,
}

impl Drop for Guard {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

impl Guard {
    fn spawn(cmd: &mut Command) -> Guard {
        Guard {
            child: cmd.spawn().expect("spawn server"),
        }
    }

    /// The exit status, once it has exited (a server still running after `WAIT` fails).
    fn exit_status(&mut self) -> ExitStatus {
        let start = Instant::now();
        loop {
            if let Some(st) = self.child.try_wait().expect("try_wait") {
                return st;
            }
            assert!(
                start.elapsed() < WAIT,
                "the server kept running; it should have refused to start"
            );
            std::thread::sleep(Duration::from_millis(20));
        }
    }

    /// [`Guard::exit_status`], and what the server wrote to its (piped) standard error.
    fn exit_status_and_stderr(&mut self) -> (ExitStatus, String) {
        let status = self.exit_status();
        (status, self.stderr_text())
    }

    /// Everything on the server's piped standard error (to its end: call once it exited).
    fn stderr_text(&mut self) -> String {
        let mut err = String::new();
        self.child
            .stderr
            .take()
            .expect("stderr")
            .read_to_string(&mut err)
            .expect("read stderr");
        err
    }
}

fn free_port() -> u16 {
    memfabric_cluster::ports::free_loopback_port()
}

/// A fresh path in the temp directory (removed first, with its `.lck`).
fn temp_path(name: &str) -> PathBuf {
    let p = std::env::temp_dir().join(format!("memfabric-flags-{}-{name}", std::process::id()));
    let _ = std::fs::remove_file(&p);
    let _ = std::fs::remove_file(lck(&p));
    p
}

fn lck(p: &Path) -> PathBuf {
    let mut s = p.as_os_str().to_owned();
    s.push(".lck");
    PathBuf::from(s)
}

/// Wait until `path` exists and return its text.
fn wait_for_file(path: &Path, server: &mut Guard) -> String {
    let start = Instant::now();
    loop {
        if let Ok(text) = std::fs::read_to_string(path) {
            return text;
        }
        if let Some(st) = server.child.try_wait().expect("try_wait") {
            panic!("server exited ({st}) before writing {}", path.display());
        }
        assert!(start.elapsed() < WAIT, "{} never appeared", path.display());
        std::thread::sleep(Duration::from_millis(20));
    }
}

fn tcp_version(port: u16) -> Vec<u8> {
    let mut s = TcpStream::connect(("127.0.0.1", port)).expect("connect to reported port");
    s.set_read_timeout(Some(WAIT)).expect("timeout");
    s.write_all(b"version\r\n").expect("send");
    let mut reply = Vec::new();
    let mut buf = [0u8; 256];
    while !reply.ends_with(b"\r\n") {
        let n = s.read(&mut buf).expect("read version");
        assert!(n > 0, "connection closed before the version line");
        reply.extend_from_slice(&buf[..n]);
    }
    reply
}

fn udp_version(port: u16) -> Vec<u8> {
    let s = UdpSocket::bind("127.0.0.1:0").expect("udp bind");
    s.set_read_timeout(Some(WAIT)).expect("timeout");
    // The 8-byte UDP frame header: request id 7, sequence 0, one datagram.
    let mut req = vec![0, 7, 0, 0, 0, 1, 0, 0];
    req.extend_from_slice(b"version\r\n");
    s.send_to(&req, ("127.0.0.1", port)).expect("udp send");
    let mut buf = [0u8; 512];
    let n = s.recv(&mut buf).expect("udp reply");
    assert_eq!(&buf[..8], &[0, 7, 0, 0, 0, 1, 0, 0], "UDP frame header");
    buf[8..n].to_vec()
}

/// The lines of a port file with each number replaced by `N`: its shape.
fn shape(text: &str) -> Vec<String> {
    text.lines()
        .map(|l| match l.rsplit_once(": ") {
            Some((head, port)) if port.parse::<u16>().is_ok() => format!("{head}: N"),
            _ => l.to_string(),
        })
        .collect()
}

/// (protocol, family, port) for each line of a port file.
fn ports(text: &str) -> Vec<(String, String, u16)> {
    text.lines()
        .map(|l| {
            let (head, port) = l.split_once(": ").expect("`PROTO FAMILY: port` line");
            let (proto, family) = head.split_once(' ').expect("`PROTO FAMILY`");
            let port = port.parse().expect("a port number");
            (proto.to_string(), family.to_string(), port)
        })
        .collect()
}

#[test]
fn flags_for_missing_features_exit_non_zero_with_one_line_and_never_listen() {
    let mem = temp_path("memfile");
    let mem_s = mem.to_str().expect("utf-8 temp path");
    let cases: &[(&[&str], &str)] = &[
        (&["-S"], "-S"),
        (&["-e", mem_s], "-e"),
        // (`-o ext_path` gives the flash tier: docs/flash.md, tests/flash.rs.)
        (&["-o", "ssl_chain_cert=/tmp/cert.pem"], "ssl_chain_cert"),
        (&["-o", "ssl_session_cache"], "ssl_session_cache"),
    ];
    for (flags, name) in cases {
        let port = free_port();
        let mut args = vec!["-p".to_string(), port.to_string()];
        args.extend(["-l", "127.0.0.1", "-U", "0", "--ucx-port", "0"].map(String::from));
        args.extend(flags.iter().map(|s| s.to_string()));
        let mut g = Guard::spawn(
            Command::new(BIN)
                .args(&args)
                .stdin(Stdio::null())
                .stdout(Stdio::null())
                .stderr(Stdio::piped()),
        );
        let (status, err) = g.exit_status_and_stderr();
        assert_eq!(status.code(), Some(64), "{flags:?}: {err}");
        assert_eq!(err.lines().count(), 1, "{flags:?}: one line, got {err:?}");
        assert!(
            err.contains(name),
            "{flags:?}: the line names the flag: {err}"
        );
        assert!(
            err.contains("refusing to start"),
            "{flags:?}: says why: {err}"
        );
        assert!(
            TcpStream::connect(("127.0.0.1", port)).is_err(),
            "{flags:?}: something listens on {port}"
        );
    }
    assert!(!mem.exists(), "-e must not create its memory file");
}

/// A UCX tier whose transports UCX cannot use is refused, not silently dropped (a
/// server that looked as if it had the tier it was asked for would not have it).
#[test]
fn ucx_tier_transports_that_ucx_cannot_use_refuse_to_start() {
    for flag in ["--ucx-hot-tls", "--ucx-cold-tls"] {
        let port = free_port();
        let ucx_port = free_port();
        let mut g = Guard::spawn(
            Command::new(BIN)
                .args(["-p", &port.to_string(), "-l", "127.0.0.1", "-U", "0"])
                .args([
                    "--ucx-port",
                    &ucx_port.to_string(),
                    flag,
                    "no-such-transport",
                ])
                .stdin(Stdio::null())
                .stdout(Stdio::null())
                .stderr(Stdio::piped()),
        );
        let (status, err) = g.exit_status_and_stderr();
        assert!(!status.success(), "{flag}: started anyway: {err}");
        assert!(
            err.contains(&format!("{flag} no-such-transport")),
            "{flag}: the message names the flag: {err}"
        );
        assert!(
            TcpStream::connect(("127.0.0.1", port)).is_err(),
            "{flag}: something listens on {port}"
        );
    }
}

/// Without `--ucx-port`, memfabricd tries the default UCX port (11311) on every interface
/// and, when any of them is taken, has no UCX listener at all: never one on `[::]` while
/// another process holds `127.0.0.1:11311`, which `stats fabric` would then advertise and
/// send this server's UCX clients to the other process. TCP is served either way.
#[test]
fn a_default_ucx_port_taken_on_one_interface_is_given_up_everywhere() {
    // Held here if free; if another process holds it already, the server must not
    // advertise it either.
    let _holder = std::net::TcpListener::bind("127.0.0.1:11311");
    let port = free_port();
    let log = temp_path("default-ucx-port.log");
    let mut g = Guard::spawn(
        Command::new(BIN)
            .args(["-p", &port.to_string(), "-U", "0"])
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(std::fs::File::create(&log).expect("log file")),
    );
    let start = Instant::now();
    let mut c = loop {
        if let Ok(c) = TcpStream::connect(("127.0.0.1", port)) {
            break c;
        }
        if let Some(status) = g.child.try_wait().expect("try_wait") {
            panic!(
                "memfabricd exited ({status}): {}",
                std::fs::read_to_string(&log).unwrap_or_default()
            );
        }
        assert!(start.elapsed() < WAIT, "never listened on {port}");
        std::thread::sleep(Duration::from_millis(20));
    };
    c.set_read_timeout(Some(WAIT)).unwrap();
    c.write_all(b"stats fabric\r\n").unwrap();
    let mut stats = String::new();
    for line in BufReader::new(&mut c).lines() {
        let line = line.expect("stats fabric reply");
        if line == "END" {
            break;
        }
        stats.push_str(&line);
        stats.push('\n');
    }
    assert!(
        stats.contains("STAT instance_id "),
        "no stats fabric: {stats}"
    );
    assert!(
        !stats.contains("STAT ucx_port"),
        "advertises a UCX port another process holds on 127.0.0.1: {stats}"
    );
    let said = std::fs::read_to_string(&log).unwrap_or_default();
    assert!(said.contains("11311"), "no warning names the port: {said}");
    let _ = std::fs::remove_file(&log);
}

/// `--ucx-port` equal to `-p` is refused with a message that says so, before anything
/// listens (both are TCP listeners: the second bind would only say "in use").
#[test]
fn a_ucx_port_equal_to_the_tcp_port_is_refused_before_listening() {
    let port = free_port();
    let mut g = Guard::spawn(
        Command::new(BIN)
            .args(["-p", &port.to_string(), "-l", "127.0.0.1", "-U", "0"])
            .args(["--ucx-port", &port.to_string()])
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::piped()),
    );
    let (status, err) = g.exit_status_and_stderr();
    assert_eq!(status.code(), Some(64), "{err}");
    assert!(
        err.contains(&format!(
            "--ucx-port {port}: that is the memcached TCP port (-p)"
        )),
        "{err}"
    );
    assert!(TcpStream::connect(("127.0.0.1", port)).is_err());
}

/// `-P`: the pid is written (through `<file>.tmp`, renamed, as memcached does) and the
/// file is removed at shutdown; a pid file that cannot be written is said and, as with
/// memcached, the server runs anyway.
#[test]
fn pid_file_is_written_and_an_unwritable_one_does_not_stop_the_server() {
    let pidfile = temp_path("pidfile");
    for (path, written) in [
        (pidfile.display().to_string(), true),
        ("/nonexistent-memfabric-dir/x.pid".to_string(), false),
    ] {
        let port = free_port();
        let mut g = Guard::spawn(
            Command::new(BIN)
                .args(["-p", &port.to_string(), "-l", "127.0.0.1", "-U", "0"])
                .args(["--ucx-port", "0", "-P", &path])
                .stdin(Stdio::null())
                .stdout(Stdio::null())
                .stderr(Stdio::null()),
        );
        let start = Instant::now();
        while TcpStream::connect(("127.0.0.1", port)).is_err() {
            assert!(
                g.child.try_wait().expect("try_wait").is_none(),
                "-P {path}: the server exited"
            );
            assert!(start.elapsed() < WAIT, "-P {path}: never listened");
            std::thread::sleep(Duration::from_millis(20));
        }
        if written {
            let got = std::fs::read_to_string(&path).expect("pid file");
            assert_eq!(got.trim(), g.child.id().to_string());
            assert!(!Path::new(&format!("{path}.tmp")).exists());
        }
    }
    let _ = std::fs::remove_file(&pidfile);
}

/// Two `-l` entries on one host (`-l 127.0.0.1 -l notls:127.0.0.1:P`, memcached's way to
/// add a second TCP port) still give one UCX listener on that host: the server starts with
/// both TCP ports and its `--ucx-port` (it once tried to bind the UCX port twice and, now
/// that a taken `--ucx-port` stops it, refused to start).
#[test]
fn one_host_named_twice_gets_one_ucx_listener() {
    let (port, second, ucx) = (free_port(), free_port(), free_port());
    let mut g = Guard::spawn(
        Command::new(BIN)
            .args(["-p", &port.to_string(), "-U", "0", "-l", "127.0.0.1"])
            .args(["-l", &format!("127.0.0.1:{second}")])
            .args(["--ucx-port", &ucx.to_string()])
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::piped()),
    );
    let start = Instant::now();
    let all_listen = || {
        [port, second, ucx]
            .iter()
            .all(|p| TcpStream::connect(("127.0.0.1", *p)).is_ok())
    };
    while !all_listen() {
        if let Some(status) = g.child.try_wait().expect("try_wait") {
            panic!("memfabricd exited ({status}): {}", g.stderr_text());
        }
        assert!(
            start.elapsed() < WAIT,
            "not listening on {port}, {second} and {ucx}"
        );
        std::thread::sleep(Duration::from_millis(20));
    }
    assert!(g.child.try_wait().expect("try_wait").is_none(), "it exited");
}

/// A `--ucx-port` that is taken stops the server, as a taken `-p` does: left running
/// TCP-only, its UCX clients' HELLOs would go to whatever holds the port and time out (two
/// test suites once handed the same free port to two servers this way).
#[test]
fn a_ucx_port_that_is_taken_refuses_to_start() {
    let holder = std::net::TcpListener::bind("127.0.0.1:0").expect("bind a holder");
    let taken = holder.local_addr().unwrap().port();
    let port = free_port();
    let mut g = Guard::spawn(
        Command::new(BIN)
            .args(["-p", &port.to_string(), "-l", "127.0.0.1", "-U", "0"])
            .args(["--ucx-port", &taken.to_string()])
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::piped()),
    );
    let (status, err) = g.exit_status_and_stderr();
    assert!(!status.success(), "started anyway: {err}");
    assert!(
        err.contains(&format!("127.0.0.1:{taken} (--ucx-port)")),
        "the message names the port and the flag: {err}"
    );
    assert!(
        TcpStream::connect(("127.0.0.1", port)).is_err(),
        "something listens on {port}"
    );
    drop(holder);
}

#[test]
fn unknown_extended_option_exits_1_with_memcacheds_message() {
    let mut g = Guard::spawn(
        Command::new(BIN)
            .args(["-p", "0", "-U", "0", "--ucx-port", "0"])
            .args(["-o", "modern,bogus_option"])
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::piped()),
    );
    let (status, err) = g.exit_status_and_stderr();
    assert_eq!(status.code(), Some(1));
    assert_eq!(err, "Illegal suboption \"bogus_option\"\n");
}

#[test]
fn unknown_flags_and_missing_values_exit_1_as_memcached_does() {
    for args in [&["-j"][..], &["--bogus"][..], &["-p"][..]] {
        let mut g = Guard::spawn(
            Command::new(BIN)
                .args(args)
                .stdin(Stdio::null())
                .stdout(Stdio::null())
                .stderr(Stdio::null()),
        );
        assert_eq!(g.exit_status().code(), Some(1), "{args:?}");
    }
}

#[test]
fn ephemeral_ports_are_reported_in_memcached_port_filename_and_answer_version() {
    let file = temp_path("ports");
    let mut g = Guard::spawn(
        Command::new(BIN)
            .args(["-p", "-1", "-U", "-1", "-l", "127.0.0.1", "--ucx-port", "0"])
            .env("MEMCACHED_PORT_FILENAME", &file)
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::null()),
    );
    let text = wait_for_file(&file, &mut g);
    assert_eq!(shape(&text), ["TCP INET: N", "UDP INET: N"], "{text:?}");
    assert!(!lck(&file).exists(), "the .lck file is renamed into place");
    let p = ports(&text);
    assert!(p.iter().all(|(_, _, port)| *port != 0), "{text:?}");
    assert_eq!(tcp_version(p[0].2), b"VERSION 1.6.18\r\n");
    assert_eq!(udp_version(p[1].2), b"VERSION 1.6.18\r\n");
    drop(g);
    let _ = std::fs::remove_file(&file);
}

#[test]
fn port_file_has_the_lines_memcached_writes_for_the_same_flags() {
    // Without -l: IPv4 and (where the host has it) IPv6, each with its own ephemeral port.
    let root_flags: &[&str] = if is_root() { &["-u", "root"] } else { &[] };
    let mut shapes = Vec::new();
    for bin in [MEMCACHED, BIN] {
        let file = temp_path(if bin == BIN { "mf-ports" } else { "mc-ports" });
        let mut cmd = Command::new(bin);
        cmd.args(["-p", "-1", "-U", "-1"])
            .args(root_flags)
            .env("MEMCACHED_PORT_FILENAME", &file)
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::null());
        if bin == BIN {
            cmd.args(["--ucx-port", "0"]);
        }
        let mut g = Guard::spawn(&mut cmd);
        let text = wait_for_file(&file, &mut g);
        for (proto, family, port) in ports(&text) {
            if proto == "TCP" && family == "INET" {
                assert_eq!(tcp_version(port), b"VERSION 1.6.18\r\n", "{bin}");
            }
            if proto == "UDP" && family == "INET" {
                assert_eq!(udp_version(port), b"VERSION 1.6.18\r\n", "{bin}");
            }
        }
        shapes.push(shape(&text));
        drop(g);
        let _ = std::fs::remove_file(&file);
    }
    assert_eq!(shapes[0], shapes[1], "memcached's lines, then memfabricd's");
}

fn is_root() -> bool {
    nix::unistd::geteuid().is_root()
}

#[test]
fn logs_written_to_a_pipe_carry_no_escape_bytes() {
    // -v logs the start-up line (its timestamp and level are what a terminal sees
    // coloured); -t 65 adds memcached's warning about many threads.
    let port = free_port().to_string();
    let mut g = Guard::spawn(
        Command::new(BIN)
            .args(["-p", &port, "-U", "0", "-l", "127.0.0.1", "--ucx-port", "0"])
            .args(["-v", "-t", "65"])
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::piped()),
    );
    let stderr = g.child.stderr.take().expect("stderr");
    let (tx, rx) = std::sync::mpsc::channel();
    std::thread::spawn(move || {
        for line in BufReader::new(stderr).split(b'\n') {
            let Ok(line) = line else { break };
            if tx.send(line).is_err() {
                break;
            }
        }
    });
    let mut lines = Vec::new();
    while !lines
        .iter()
        .any(|l: &Vec<u8>| String::from_utf8_lossy(l).contains("ready"))
    {
        match rx.recv_timeout(WAIT) {
            Ok(l) => lines.push(l),
            Err(e) => panic!("no start-up line ({e}); got {lines:?}"),
        }
    }
    drop(g);
    let text: Vec<String> = lines
        .iter()
        .map(|l| String::from_utf8_lossy(l).into_owned())
        .collect();
    assert!(
        text.iter()
            .any(|l| l.contains("WARN") && l.contains("high number of workerthreads")),
        "{text:?}"
    );
    for l in &lines {
        assert!(
            !l.contains(&0x1b),
            "ESC in a log line: {:?}",
            String::from_utf8_lossy(l)
        );
    }
}
