//! Commands that complete later keep protocol order and never block their worker.
//!
//! memfabricd runs with one worker and the test store (`--debug-hold-keys slow:`): a
//! retrieval of a `slow:` key stays pending until a client sends `debug release`. Each
//! front end gets a pipeline with a slow key in the middle. Before the release, only the
//! replies ahead of the slow one may arrive, and another client on the same (only) worker
//! is served; `debug held` says the slow commands are waiting, so their replies cannot
//! have been sent yet. After the release every reply arrives, in request order.
use std::io::{Read, Write};
use std::net::{SocketAddr, TcpListener, TcpStream, UdpSocket};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use memfabric_cluster::answers_version;

const BIN: &str = env!("CARGO_BIN_EXE_memfabricd");
const TIMEOUT: Duration = Duration::from_secs(10);

/// memfabricd with one worker and the test store; killed on drop.
struct HoldingServer {
    child: Child,
    port: u16,
}

impl Drop for HoldingServer {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

impl HoldingServer {
    /// Start on a port free for TCP and UDP (both listen on it). Each test of this file
    /// takes ports from its own counter (tests run in parallel threads: two probing the
    /// kernel for a free port at once could be given the same one), and a server that
    /// exited (its port taken after all) is started again on the next port.
    fn start() -> HoldingServer {
        for _ in 0..10 {
            let port = next_free_port();
            let port_arg = port.to_string();
            let mut child = Command::new(BIN)
                .args([
                    "-p",
                    &port_arg,
                    "-U",
                    &port_arg,
                    "-l",
                    "127.0.0.1",
                    "-t",
                    "1",
                ])
                .args(["--ucx-port", "0", "--debug-hold-keys", "slow:"])
                .stdin(Stdio::null())
                .stdout(Stdio::null())
                .stderr(Stdio::inherit())
                .spawn()
                .expect("spawn memfabricd");
            let start = Instant::now();
            loop {
                if child.try_wait().expect("memfabricd status").is_some() {
                    break;
                }
                // A round trip, not just a connect: a server that bound its TCP port but
                // is exiting (its UDP port was taken meanwhile) accepts and then drops.
                if answers_version(SocketAddr::from(([127, 0, 0, 1], port)))
                    && child.try_wait().expect("status").is_none()
                {
                    return HoldingServer { child, port };
                }
                assert!(start.elapsed() < TIMEOUT, "memfabricd did not come up");
                std::thread::sleep(Duration::from_millis(20));
            }
        }
        panic!("memfabricd could not start on any port tried");
    }
    fn connect(&self) -> TcpStream {
        let s = TcpStream::connect(("127.0.0.1", self.port)).expect("connect");
        s.set_read_timeout(Some(TIMEOUT)).expect("timeout");
        s.set_nodelay(true).expect("nodelay");
        s
    }
}

/// A port free for TCP and UDP now, never handed to another test of this process.
fn next_free_port() -> u16 {
    use std::sync::atomic::{AtomicU16, Ordering};
    static NEXT: AtomicU16 = AtomicU16::new(0);
    let base = 30000 + (std::process::id() % 500) as u16 * 20;
    loop {
        let port = base + NEXT.fetch_add(1, Ordering::Relaxed) % 10000;
        if TcpListener::bind(("127.0.0.1", port)).is_ok()
            && UdpSocket::bind(("127.0.0.1", port)).is_ok()
        {
            return port;
        }
    }
}

/// Read exactly `n` bytes.
fn read_n(s: &mut impl Read, n: usize) -> Vec<u8> {
    let mut buf = vec![0u8; n];
    s.read_exact(&mut buf).expect("read reply");
    buf
}

/// Send `req` on `s` and read a reply of `reply.len()` bytes; it must be `reply`.
fn expect(s: &mut TcpStream, req: &[u8], reply: &[u8]) {
    s.write_all(req).expect("write");
    let got = read_n(s, reply.len());
    assert_eq!(
        String::from_utf8_lossy(&got),
        String::from_utf8_lossy(reply),
        "reply to {:?}",
        String::from_utf8_lossy(req)
    );
}

/// Wait until the test store holds `n` commands (the pipeline was read and run).
fn wait_held(admin: &mut TcpStream, n: usize) {
    let want = format!("HELD {n}\r\n");
    let start = Instant::now();
    loop {
        admin.write_all(b"debug held\r\n").expect("write");
        let mut line = Vec::new();
        while !line.ends_with(b"\r\n") {
            line.extend(read_n(admin, 1));
        }
        if line == want.as_bytes() {
            return;
        }
        assert!(
            start.elapsed() < TIMEOUT,
            "held: {}",
            String::from_utf8_lossy(&line)
        );
        std::thread::sleep(Duration::from_millis(5));
    }
}

/// Store the keys the pipelines read: `x`, `y` and the held `slow:1`.
fn seed(admin: &mut TcpStream) {
    for (key, value) in [("x", "X"), ("slow:1", "SS"), ("y", "Y")] {
        let req = format!("set {key} 0 0 {}\r\n{value}\r\n", value.len());
        expect(admin, req.as_bytes(), b"STORED\r\n");
    }
}

/// Run `pipeline` on one connection: `before` must be all that arrives while `held`
/// commands wait (meanwhile another client is served on the same worker), then `after`.
fn check_order(pipeline: &[u8], before: &[u8], held: usize, after: &[u8]) {
    let server = HoldingServer::start();
    let mut admin = server.connect();
    seed(&mut admin);
    let mut client = server.connect();
    client.write_all(pipeline).expect("write pipeline");
    assert_eq!(
        String::from_utf8_lossy(&read_n(&mut client, before.len())),
        String::from_utf8_lossy(before)
    );
    wait_held(&mut admin, held);
    // The worker is free while the slow commands wait.
    expect(&mut admin, b"get y\r\n", b"VALUE y 0 1\r\nY\r\nEND\r\n");
    expect(
        &mut admin,
        b"debug release\r\n",
        format!("RELEASED {held}\r\n").as_bytes(),
    );
    assert_eq!(
        String::from_utf8_lossy(&read_n(&mut client, after.len())),
        String::from_utf8_lossy(after)
    );
    // Nothing else was owed: the connection answers the next request at once.
    expect(&mut client, b"version\r\n", b"VERSION 1.6.18\r\n");
}

#[test]
fn ascii_gets_and_multigets_keep_their_order_around_a_slow_key() {
    check_order(
        b"get x\r\nget slow:1\r\nget y\r\nget x slow:1 y\r\ndelete x\r\n",
        b"VALUE x 0 1\r\nX\r\nEND\r\n",
        2,
        b"VALUE slow:1 0 2\r\nSS\r\nEND\r\n\
          VALUE y 0 1\r\nY\r\nEND\r\n\
          VALUE x 0 1\r\nX\r\nVALUE slow:1 0 2\r\nSS\r\nVALUE y 0 1\r\nY\r\nEND\r\n\
          DELETED\r\n",
    );
}

#[test]
fn meta_gets_keep_their_order_around_a_slow_key() {
    check_order(
        b"mg x v k O1\r\nmg slow:1 v k t O2\r\nmg y v k O3\r\nmn\r\n",
        b"VA 1 kx O1\r\nX\r\n",
        1,
        b"VA 2 kslow:1 t-1 O2\r\nSS\r\nVA 1 ky O3\r\nY\r\nMN\r\n",
    );
}

/// A binary request: GETK (0x0c) or NOOP (0x0a) with `key`, opaque `opaque`.
fn binary_request(opcode: u8, key: &[u8], opaque: u32) -> Vec<u8> {
    let mut r = vec![0x80, opcode];
    r.extend_from_slice(&(key.len() as u16).to_be_bytes());
    r.extend_from_slice(&[0, 0, 0, 0]);
    r.extend_from_slice(&(key.len() as u32).to_be_bytes());
    r.extend_from_slice(&opaque.to_be_bytes());
    r.extend_from_slice(&[0; 8]);
    r.extend_from_slice(key);
    r
}

/// The reply to a GETK hit: flags 0, the key, the value.
fn binary_hit(key: &[u8], value: &[u8], opaque: u32) -> (Vec<u8>, std::ops::Range<usize>) {
    let mut r = vec![0x81, 0x0c];
    r.extend_from_slice(&(key.len() as u16).to_be_bytes());
    r.extend_from_slice(&[4, 0, 0, 0]);
    r.extend_from_slice(&((4 + key.len() + value.len()) as u32).to_be_bytes());
    r.extend_from_slice(&opaque.to_be_bytes());
    // The CAS (bytes 16..24) is the server's: compared separately.
    let cas = 16..24;
    r.extend_from_slice(&[0; 8]);
    r.extend_from_slice(&[0; 4]);
    r.extend_from_slice(key);
    r.extend_from_slice(value);
    (r, cas)
}

#[test]
fn binary_gets_keep_their_order_around_a_slow_key() {
    let server = HoldingServer::start();
    let mut admin = server.connect();
    seed(&mut admin);
    let mut client = server.connect();
    let mut pipeline = binary_request(0x0c, b"x", 1);
    pipeline.extend(binary_request(0x0c, b"slow:1", 2));
    pipeline.extend(binary_request(0x0c, b"y", 3));
    pipeline.extend(binary_request(0x0a, b"", 4));
    client.write_all(&pipeline).expect("write");
    let strip_cas = |mut r: Vec<u8>, cas: std::ops::Range<usize>| {
        r[cas].fill(0);
        r
    };
    let (x, cas) = binary_hit(b"x", b"X", 1);
    assert_eq!(strip_cas(read_n(&mut client, x.len()), cas), x);
    wait_held(&mut admin, 1);
    expect(&mut admin, b"get y\r\n", b"VALUE y 0 1\r\nY\r\nEND\r\n");
    expect(&mut admin, b"debug release\r\n", b"RELEASED 1\r\n");
    let (slow, cas) = binary_hit(b"slow:1", b"SS", 2);
    assert_eq!(strip_cas(read_n(&mut client, slow.len()), cas), slow);
    let (y, cas) = binary_hit(b"y", b"Y", 3);
    assert_eq!(strip_cas(read_n(&mut client, y.len()), cas), y);
    let noop = read_n(&mut client, 24);
    assert_eq!(&noop[..2], &[0x81, 0x0a]);
    assert_eq!(&noop[12..16], &4u32.to_be_bytes());
}

#[test]
fn udp_replies_keep_their_order_around_a_slow_key() {
    let server = HoldingServer::start();
    let mut admin = server.connect();
    seed(&mut admin);
    let udp = UdpSocket::bind("127.0.0.1:0").expect("udp bind");
    udp.set_read_timeout(Some(TIMEOUT)).expect("timeout");
    udp.connect(("127.0.0.1", server.port))
        .expect("udp connect");
    let mut datagram = vec![0, 9, 0, 0, 0, 1, 0, 0];
    datagram.extend_from_slice(b"get x\r\nget slow:1\r\nget y\r\n");
    udp.send(&datagram).expect("send");
    let mut buf = [0u8; 2048];
    let mut next_reply = || {
        let n = udp.recv(&mut buf).expect("udp reply");
        assert_eq!(&buf[..2], &[0, 9], "request id");
        buf[8..n].to_vec()
    };
    assert_eq!(next_reply(), b"VALUE x 0 1\r\nX\r\nEND\r\n");
    wait_held(&mut admin, 1);
    expect(&mut admin, b"get y\r\n", b"VALUE y 0 1\r\nY\r\nEND\r\n");
    expect(&mut admin, b"debug release\r\n", b"RELEASED 1\r\n");
    assert_eq!(next_reply(), b"VALUE slow:1 0 2\r\nSS\r\nEND\r\n");
    assert_eq!(next_reply(), b"VALUE y 0 1\r\nY\r\nEND\r\n");
}

#[test]
fn a_connection_stops_running_requests_at_its_pending_limit_and_resumes() {
    // 64 pending commands is the most one connection may have: the 65th request waits
    // unrun (not dropped) until they complete.
    let server = HoldingServer::start();
    let mut admin = server.connect();
    seed(&mut admin);
    let mut client = server.connect();
    let mut pipeline = Vec::new();
    for _ in 0..70 {
        pipeline.extend_from_slice(b"get slow:1\r\n");
    }
    pipeline.extend_from_slice(b"get x\r\n");
    client.write_all(&pipeline).expect("write");
    wait_held(&mut admin, 64);
    expect(&mut admin, b"debug release\r\n", b"RELEASED 64\r\n");
    // The last six slow gets ran after the release: held again.
    wait_held(&mut admin, 6);
    expect(&mut admin, b"debug release\r\n", b"RELEASED 6\r\n");
    let mut want = Vec::new();
    for _ in 0..70 {
        want.extend_from_slice(b"VALUE slow:1 0 2\r\nSS\r\nEND\r\n");
    }
    want.extend_from_slice(b"VALUE x 0 1\r\nX\r\nEND\r\n");
    assert_eq!(read_n(&mut client, want.len()), want);
}

#[test]
fn a_client_that_leaves_with_commands_pending_costs_nothing_after() {
    let server = HoldingServer::start();
    let mut admin = server.connect();
    seed(&mut admin);
    {
        let mut client = server.connect();
        client
            .write_all(b"get slow:1\r\nget slow:1\r\n")
            .expect("write");
        wait_held(&mut admin, 2);
    }
    // The completions find the connection gone (or closing) and are dropped.
    expect(&mut admin, b"debug release\r\n", b"RELEASED 2\r\n");
    expect(&mut admin, b"get x\r\n", b"VALUE x 0 1\r\nX\r\nEND\r\n");
}
