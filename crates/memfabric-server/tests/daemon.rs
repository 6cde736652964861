//! End-to-end tests of the `memfabricd` binary: started on free loopback ports, spoken to
//! over TCP, UDP and a unix socket, and always killed (a guard's Drop does it, even when
//! an assertion fails).
use std::io::{Read, Write};
use std::net::{TcpStream, UdpSocket};
use std::os::unix::net::UnixStream;
use std::path::PathBuf;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

const BIN: &str = env!("CARGO_BIN_EXE_memfabricd");
const TIMEOUT: Duration = Duration::from_secs(5);

/// A running daemon; killed and reaped on drop.
struct Daemon {
    child: Child,
    port: u16,
    unix: Option<PathBuf>,
}

impl Drop for Daemon {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
        if let Some(p) = &self.unix {
            let _ = std::fs::remove_file(p);
        }
    }
}

fn spawn<S: AsRef<std::ffi::OsStr>>(args: &[S]) -> Child {
    Command::new(BIN)
        .args(args)
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::inherit())
        .spawn()
        .expect("spawn memfabricd")
}

/// A port free for both TCP and UDP on 127.0.0.1 right now.
fn free_port() -> u16 {
    memfabric_cluster::ports::free_loopback_port()
}

impl Daemon {
    /// Start on a fresh TCP port (plus `extra` flags) and wait until it accepts.
    ///
    /// Another test may probe the same free port and start its daemon on it first: ours
    /// then fails to bind and exits, while the port answers — the other daemon's, killed
    /// when that test ends. So a start counts only if our child is still running once the
    /// port answers (a daemon that cannot bind exits at once); otherwise a new port.
    fn start(extra: &[&str]) -> Daemon {
        for _ in 0..5 {
            let port = free_port();
            let mut args: Vec<String> = vec![
                "-p".into(),
                port.to_string(),
                "-l".into(),
                "127.0.0.1".into(),
                "-t".into(),
                "2".into(),
            ];
            args.extend(extra.iter().map(|s| s.to_string()));
            let child = spawn(&args);
            let mut d = Daemon {
                child,
                port,
                unix: None,
            };
            d.wait_ready(|| TcpStream::connect(("127.0.0.1", port)).is_ok());
            std::thread::sleep(Duration::from_millis(50));
            if matches!(d.child.try_wait(), Ok(None)) {
                return d;
            }
        }
        panic!("memfabricd could not start on a free port five times");
    }

    fn start_unix(path: &PathBuf, extra: &[&str]) -> Daemon {
        let _ = std::fs::remove_file(path);
        let mut args = vec!["-s", path.to_str().expect("utf-8 path"), "-t", "2"];
        args.extend_from_slice(extra);
        let child = spawn(&args);
        let d = Daemon {
            child,
            port: 0,
            unix: Some(path.clone()),
        };
        d.wait_ready(|| UnixStream::connect(path).is_ok());
        d
    }

    fn wait_ready(&self, mut ready: impl FnMut() -> bool) {
        let start = Instant::now();
        while !ready() {
            assert!(start.elapsed() < TIMEOUT, "memfabricd did not come up");
            std::thread::sleep(Duration::from_millis(20));
        }
    }

    fn tcp(&self) -> TcpStream {
        let s = TcpStream::connect(("127.0.0.1", self.port)).expect("connect");
        s.set_read_timeout(Some(TIMEOUT)).expect("timeout");
        s.set_nodelay(true).expect("nodelay");
        s
    }
}

/// Read until `buf` ends with `end` (or time out).
fn read_until(s: &mut impl Read, end: &[u8]) -> Vec<u8> {
    let mut buf = Vec::new();
    let mut chunk = [0u8; 65536];
    while !buf.ends_with(end) {
        match s.read(&mut chunk) {
            Ok(0) => break,
            Ok(n) => buf.extend_from_slice(&chunk[..n]),
            Err(e) => panic!(
                "read failed ({e}) after {:?}",
                String::from_utf8_lossy(&buf[..buf.len().min(300)])
            ),
        }
    }
    buf
}

fn request(s: &mut (impl Read + Write), req: &[u8], end: &[u8]) -> Vec<u8> {
    s.write_all(req).expect("write");
    read_until(s, end)
}

fn stat(s: &mut TcpStream, name: &str) -> Option<u64> {
    let r = request(s, b"stats\r\n", b"END\r\n");
    let text = String::from_utf8_lossy(&r).to_string();
    text.lines().find_map(|l| {
        let mut it = l.split(' ');
        match (it.next(), it.next(), it.next()) {
            (Some("STAT"), Some(k), Some(v)) if k == name => v.parse().ok(),
            _ => None,
        }
    })
}

#[test]
fn help_lists_memcached_flags_and_exits_zero() {
    let out = Command::new(BIN)
        .arg("--help")
        .output()
        .expect("run --help");
    assert!(out.status.success());
    let text = String::from_utf8_lossy(&out.stdout);
    for flag in ["-p", "-U", "-s", "-m", "-c", "-t", "-I", "-o", "--poll-us"] {
        assert!(text.contains(flag), "--help lacks {flag}");
    }
}

#[test]
fn item_size_over_half_of_memory_is_a_usage_error() {
    let out = Command::new(BIN)
        .args(["-I", "40m", "-p", "0"])
        .output()
        .expect("run");
    assert_eq!(out.status.code(), Some(64));
    assert!(String::from_utf8_lossy(&out.stderr).contains("1/2 of memory max"));
}

#[test]
fn memcached_extended_options_are_accepted() {
    let d = Daemon::start(&["-o", "hot_lru_pct=20,modern,idle_timeout=100"]);
    let mut c = d.tcp();
    assert_eq!(
        request(&mut c, b"version\r\n", b"\r\n"),
        b"VERSION 1.6.18\r\n"
    );
}

#[test]
fn tcp_set_then_get_round_trips() {
    let d = Daemon::start(&[]);
    let mut c = d.tcp();
    assert_eq!(
        request(&mut c, b"set foo 5 0 3\r\nbar\r\n", b"\r\n"),
        b"STORED\r\n"
    );
    assert_eq!(
        request(&mut c, b"get foo\r\n", b"END\r\n"),
        b"VALUE foo 5 3\r\nbar\r\nEND\r\n"
    );
}

#[test]
fn pipelined_requests_in_one_write_are_all_answered_in_order() {
    let d = Daemon::start(&[]);
    let mut c = d.tcp();
    let mut req = Vec::new();
    let mut want = Vec::new();
    // More than -R (20) requests, so the connection must yield and come back.
    for i in 0..200 {
        req.extend_from_slice(
            format!("set k{i} 0 0 {}\r\nv{i}\r\n", format!("v{i}").len()).as_bytes(),
        );
        want.extend_from_slice(b"STORED\r\n");
    }
    for i in 0..200 {
        req.extend_from_slice(format!("get k{i}\r\n").as_bytes());
        want.extend_from_slice(
            format!("VALUE k{i} 0 {}\r\nv{i}\r\nEND\r\n", format!("v{i}").len()).as_bytes(),
        );
    }
    c.write_all(&req).expect("write");
    let mut got = Vec::new();
    let mut chunk = [0u8; 65536];
    while got.len() < want.len() {
        let n = c.read(&mut chunk).expect("read");
        assert!(n > 0, "closed early");
        got.extend_from_slice(&chunk[..n]);
    }
    assert_eq!(
        String::from_utf8_lossy(&got),
        String::from_utf8_lossy(&want)
    );
    assert!(stat(&mut c, "conn_yields").unwrap_or(0) > 0);
}

#[test]
fn client_sending_half_a_request_does_not_block_another() {
    let d = Daemon::start(&["-t", "1"]);
    let mut slow = d.tcp();
    slow.write_all(b"set slow 0 0 10\r\nabc").expect("write");
    let mut stalled_line = d.tcp();
    stalled_line.write_all(b"get never_fin").expect("write");
    let mut fast = d.tcp();
    let start = Instant::now();
    assert_eq!(
        request(&mut fast, b"set f 0 0 1\r\nx\r\nget f\r\n", b"END\r\n"),
        b"STORED\r\nVALUE f 0 1\r\nx\r\nEND\r\n"
    );
    assert!(start.elapsed() < Duration::from_secs(2));
    // The slow client finishes later and is answered.
    assert_eq!(request(&mut slow, b"defghij\r\n", b"\r\n"), b"STORED\r\n");
}

#[test]
fn large_value_streams_in_while_others_are_served() {
    let d = Daemon::start(&["-t", "1", "-I", "4m"]);
    let mut big = d.tcp();
    let value = vec![b'z'; 3 << 20];
    big.write_all(format!("set big 0 0 {}\r\n", value.len()).as_bytes())
        .expect("write");
    big.write_all(&value[..1 << 20]).expect("write");
    let mut other = d.tcp();
    assert_eq!(
        request(&mut other, b"version\r\n", b"\r\n"),
        b"VERSION 1.6.18\r\n"
    );
    big.write_all(&value[1 << 20..]).expect("write");
    assert_eq!(request(&mut big, b"\r\n", b"\r\n"), b"STORED\r\n");
    let r = request(&mut big, b"get big\r\n", b"END\r\n");
    assert_eq!(
        r.len(),
        value.len() + "VALUE big 0 3145728\r\n\r\nEND\r\n".len()
    );
}

#[test]
fn client_that_never_reads_replies_does_not_stall_others() {
    let d = Daemon::start(&["-t", "1"]);
    let mut c = d.tcp();
    let v = vec![b'q'; 100_000];
    c.write_all(format!("set v 0 0 {}\r\n", v.len()).as_bytes())
        .expect("write");
    c.write_all(&v).expect("write");
    assert_eq!(request(&mut c, b"\r\n", b"\r\n"), b"STORED\r\n");
    // Ask for ~100 MB of replies and read none of them.
    let mut hog = d.tcp();
    hog.set_write_timeout(Some(Duration::from_secs(2)))
        .expect("timeout");
    let gets = b"get v\r\n".repeat(1000);
    let _ = hog.write_all(&gets);
    let start = Instant::now();
    assert_eq!(
        request(&mut c, b"version\r\n", b"\r\n"),
        b"VERSION 1.6.18\r\n"
    );
    assert!(start.elapsed() < Duration::from_secs(2));
}

#[test]
fn udp_multiget_of_large_values_arrives_whole_in_framed_datagrams() {
    // Values this large are written from pinned item memory, not copied: the datagrams
    // are cut from the pinned pieces.
    let port = free_port();
    let d = Daemon::start(&["-U", &port.to_string()]);
    let mut c = d.tcp();
    let value: Vec<u8> = (0..30_000).map(|i| b'a' + (i % 26) as u8).collect();
    c.write_all(b"set big 0 0 30000\r\n").expect("write");
    c.write_all(&value).expect("write");
    assert_eq!(request(&mut c, b"\r\n", b"\r\n"), b"STORED\r\n");

    let u = UdpSocket::bind("127.0.0.1:0").expect("udp bind");
    u.set_read_timeout(Some(TIMEOUT)).expect("timeout");
    u.connect(("127.0.0.1", port)).expect("udp connect");
    let mut req = vec![0, 7, 0, 0, 0, 1, 0, 0];
    req.extend_from_slice(b"get big nope big\r\n");
    u.send(&req).expect("send");
    let mut parts: Vec<Vec<u8>> = Vec::new();
    let mut buf = [0u8; 65536];
    loop {
        let n = u.recv(&mut buf).expect("recv");
        let count = u16::from_be_bytes([buf[4], buf[5]]) as usize;
        parts.push(buf[..n].to_vec());
        if parts.len() == count {
            break;
        }
    }
    parts.sort_by_key(|d| u16::from_be_bytes([d[2], d[3]]));
    let body: Vec<u8> = parts.iter().flat_map(|p| p[8..].to_vec()).collect();
    let mut want = Vec::new();
    for _ in 0..2 {
        want.extend_from_slice(b"VALUE big 0 30000\r\n");
        want.extend_from_slice(&value);
        want.extend_from_slice(b"\r\n");
    }
    want.extend_from_slice(b"END\r\n");
    assert_eq!(body.len(), want.len());
    assert!(body == want, "reassembled reply differs");
}

#[test]
fn udp_get_of_10kb_value_arrives_in_framed_datagrams() {
    let port = free_port();
    let d = Daemon::start(&["-U", &port.to_string()]);
    let mut c = d.tcp();
    let value = vec![b'v'; 10_000];
    c.write_all(b"set big 0 0 10000\r\n").expect("write");
    c.write_all(&value).expect("write");
    assert_eq!(request(&mut c, b"\r\n", b"\r\n"), b"STORED\r\n");

    let u = UdpSocket::bind("127.0.0.1:0").expect("udp bind");
    u.set_read_timeout(Some(TIMEOUT)).expect("timeout");
    u.connect(("127.0.0.1", port)).expect("udp connect");
    let mut req = vec![0x12, 0x34, 0, 0, 0, 1, 0, 0];
    req.extend_from_slice(b"get big\r\n");
    u.send(&req).expect("send");
    let mut parts: Vec<Vec<u8>> = Vec::new();
    let mut buf = [0u8; 65536];
    loop {
        let n = u.recv(&mut buf).expect("recv");
        let d = &buf[..n];
        assert!(n <= 1400, "datagram of {n} bytes");
        assert_eq!(&d[0..2], &[0x12, 0x34], "request id");
        assert_eq!(&d[6..8], &[0, 0], "reserved");
        let count = u16::from_be_bytes([d[4], d[5]]) as usize;
        assert_eq!(count, 8);
        parts.push(d.to_vec());
        if parts.len() == count {
            break;
        }
    }
    parts.sort_by_key(|d| u16::from_be_bytes([d[2], d[3]]));
    for (i, p) in parts.iter().enumerate() {
        assert_eq!(u16::from_be_bytes([p[2], p[3]]) as usize, i);
    }
    let body: Vec<u8> = parts.iter().flat_map(|p| p[8..].to_vec()).collect();
    let mut want = b"VALUE big 0 10000\r\n".to_vec();
    want.extend_from_slice(&value);
    want.extend_from_slice(b"\r\nEND\r\n");
    assert_eq!(body, want);

    // A set over UDP, and a multi-datagram request that is dropped without a reply.
    let mut req = vec![0, 9, 0, 0, 0, 1, 0, 0];
    req.extend_from_slice(b"set u 0 0 1\r\nz\r\n");
    u.send(&req).expect("send");
    let n = u.recv(&mut buf).expect("recv");
    assert_eq!(&buf[..n], b"\x00\x09\x00\x00\x00\x01\x00\x00STORED\r\n");
    let mut req = vec![0, 10, 0, 0, 0, 2, 0, 0];
    req.extend_from_slice(b"get u\r\n");
    u.send(&req).expect("send");
    let mut req = vec![0, 11, 0, 0, 0, 1, 0, 0];
    req.extend_from_slice(b"get u\r\n");
    u.send(&req).expect("send");
    let n = u.recv(&mut buf).expect("recv");
    assert_eq!(
        &buf[..2],
        &[0, 11],
        "the multi-datagram request got a reply"
    );
    assert_eq!(&buf[8..n], b"VALUE u 0 1\r\nz\r\nEND\r\n");
}

#[test]
fn unix_socket_round_trips_with_requested_mask() {
    use std::os::unix::fs::PermissionsExt;
    let path = std::env::temp_dir().join(format!("memfabricd-test-{}.sock", std::process::id()));
    let d = Daemon::start_unix(&path, &["-a", "770"]);
    let mode = std::fs::metadata(&path)
        .expect("socket file")
        .permissions()
        .mode();
    assert_eq!(mode & 0o777, 0o770);
    let mut c = UnixStream::connect(&path).expect("connect");
    c.set_read_timeout(Some(TIMEOUT)).expect("timeout");
    assert_eq!(
        request(&mut c, b"set a 0 0 2\r\nhi\r\nget a\r\n", b"END\r\n"),
        b"STORED\r\nVALUE a 0 2\r\nhi\r\nEND\r\n"
    );
    drop(d);
}

#[test]
fn connections_over_the_limit_get_an_error_and_are_counted() {
    let d = Daemon::start(&["-c", "3"]);
    // The start-up probe connection may still be closing: wait until it is gone, then
    // prove each held connection is served, so that exactly three are open.
    std::thread::sleep(Duration::from_millis(200));
    let mut held = Vec::new();
    for _ in 0..3 {
        let mut c = d.tcp();
        assert_eq!(
            request(&mut c, b"version\r\n", b"\r\n"),
            b"VERSION 1.6.18\r\n"
        );
        held.push(c);
    }
    let mut over = d.tcp();
    let mut got = Vec::new();
    let _ = over.read_to_end(&mut got);
    assert_eq!(got, b"ERROR Too many open connections\r\n");
    let mut first = held.remove(0);
    assert_eq!(stat(&mut first, "rejected_connections"), Some(1));
    assert_eq!(stat(&mut first, "max_connections"), Some(3));
}

#[test]
fn sigterm_stops_the_server_and_removes_its_socket() {
    // SIGUSR1 too: memcached 1.6's graceful stop (it killed memfabricd, exit by signal).
    for sig in ["TERM", "INT", "USR1"] {
        let path =
            std::env::temp_dir().join(format!("memfabricd-{sig}-{}.sock", std::process::id()));
        let mut d = Daemon::start_unix(&path, &[]);
        let status = Command::new("kill")
            .args([&format!("-{sig}"), &d.child.id().to_string()])
            .status()
            .expect("kill");
        assert!(status.success());
        let start = Instant::now();
        loop {
            if let Some(st) = d.child.try_wait().expect("wait") {
                assert!(st.success(), "SIG{sig}: exit status {st:?}");
                break;
            }
            assert!(start.elapsed() < TIMEOUT, "did not stop on SIG{sig}");
            std::thread::sleep(Duration::from_millis(20));
        }
        assert!(!path.exists(), "SIG{sig}: socket file left behind");
    }
}

#[test]
fn shutdown_command_with_dash_a_stops_the_server() {
    let mut d = Daemon::start(&["-A"]);
    let mut c = d.tcp();
    c.write_all(b"shutdown\r\n").expect("write");
    let start = Instant::now();
    loop {
        if let Some(st) = d.child.try_wait().expect("wait") {
            assert!(st.success(), "exit status {st:?}");
            break;
        }
        assert!(start.elapsed() < TIMEOUT, "did not stop on shutdown");
        std::thread::sleep(Duration::from_millis(20));
    }
}

#[test]
fn stats_conns_lists_listener_udp_sockets_and_clients() {
    let port = free_port();
    let d = Daemon::start(&["-U", &port.to_string()]);
    let mut c = d.tcp();
    let r = String::from_utf8(request(&mut c, b"stats conns\r\n", b"END\r\n")).expect("utf-8");
    assert!(
        r.contains(&format!(":addr tcp:127.0.0.1:{}\r\n", d.port)),
        "{r}"
    );
    assert!(r.contains(":state conn_listening\r\n"), "{r}");
    // One UDP line per worker, as memcached lists one per thread.
    assert_eq!(r.matches(":UDP UDP\r\n").count(), 2, "{r}");
    assert!(
        r.contains(&format!(":listen_addr tcp:127.0.0.1:{}\r\n", d.port)),
        "{r}"
    );
    assert!(r.contains(":state conn_parse_cmd\r\n"), "{r}");
}

/// `-o idle_timeout` closes connections waiting for a command (nothing sent, or half a
/// line), as memcached does (conn_new_cmd, conn_read), and never one moving data however
/// slowly: a value part way in, or replies the client has not read yet. It used to close
/// those too, losing a slow uploader's `set` and most of a slow reader's replies.
#[test]
fn idle_timeout_closes_connections_waiting_for_a_command_not_ones_moving_data() {
    let d = Daemon::start(&["-o", "idle_timeout=1", "-I", "2m", "-m", "128"]);
    let mut admin = d.tcp();
    let big = vec![b'v'; 1 << 20];
    let mut set = format!("set big 0 0 {}\r\n", big.len()).into_bytes();
    set.extend_from_slice(&big);
    set.extend_from_slice(b"\r\n");
    assert_eq!(request(&mut admin, &set, b"\r\n"), b"STORED\r\n");
    // Busy ones first: were they closable, they would be idle longer than the idle ones
    // and closed no later.
    let mut uploading = d.tcp();
    uploading.write_all(b"set x 0 0 5\r\nabc").unwrap();
    let mut unread = d.tcp();
    let gets = b"get big\r\n".repeat(40);
    unread.write_all(&gets).unwrap();
    let mut idle = d.tcp();
    let mut half = d.tcp();
    half.write_all(b"get ab").unwrap();
    let deadline = Instant::now() + Duration::from_secs(30);
    let kicks = |admin: &mut TcpStream| stat(admin, "idle_kicks").unwrap();
    let await_kicks = |admin: &mut TcpStream, n: u64| {
        while kicks(admin) < n {
            assert!(
                Instant::now() < deadline,
                "the idle connections were never closed"
            );
            std::thread::sleep(Duration::from_millis(100));
        }
    };
    await_kicks(&mut admin, 2);
    let mut byte = [0u8; 1];
    for s in [&mut idle, &mut half] {
        assert_eq!(s.read(&mut byte).unwrap(), 0, "closed");
    }
    assert_eq!(kicks(&mut admin), 2);
    assert_eq!(request(&mut uploading, b"de\r\n", b"\r\n"), b"STORED\r\n");
    let mut got = 0usize;
    let want = 40 * (big.len() + "VALUE big 0 1048576\r\n\r\nEND\r\n".len());
    let mut chunk = vec![0u8; 1 << 16];
    while got < want {
        match unread.read(&mut chunk) {
            Ok(0) => panic!("closed after {got} of {want} bytes"),
            Ok(n) => got += n,
            Err(e) => panic!("{e} after {got} of {want} bytes"),
        }
    }
    assert_eq!(got, want);
    // Waiting for a command again: closed in turn.
    await_kicks(&mut admin, 4);
}
