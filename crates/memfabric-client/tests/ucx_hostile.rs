//! Hostile and broken UCX clients must not exhaust the server: idle bootstrap connections
//! count toward `-c` and are closed when they do not say HELLO in time; GET clients that die
//! or stall in the middle of a rendezvous reply do not keep their items pinned. Run under
//! each UCX_TLS the CI uses (`posix,cma,self` and `tcp,self`).
//!
//! Nothing here asserts a time: waits are bounded polls of the server's own counters.
//!
//! The GET clients are this test binary re-executed with `MF_STALLED_GET` set: they issue a
//! GET for a large value (sent by rendezvous: the client must pull it) and then never
//! progress UCX again, so the transfer stays in flight until the client is killed or the
//! server gives up on it.
mod common;

use std::io::{Read, Write};
use std::net::TcpStream;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use common::{Kind, Server};
use memfabric_client::{Client, Config, GetMode};

/// One `stats GROUP` value over the memcached protocol (TCP): works whatever state the UCX
/// sessions are in.
fn tcp_stat(server: &Server, group: &str, name: &str) -> Option<u64> {
    let mut s = TcpStream::connect(server.addr()).ok()?;
    s.set_read_timeout(Some(Duration::from_secs(10))).ok()?;
    let cmd = if group.is_empty() {
        "stats\r\n".to_string()
    } else {
        format!("stats {group}\r\n")
    };
    s.write_all(cmd.as_bytes()).ok()?;
    let mut got = Vec::new();
    let mut buf = [0u8; 4096];
    while !got.ends_with(b"END\r\n") {
        let n = s.read(&mut buf).ok()?;
        if n == 0 {
            return None;
        }
        got.extend_from_slice(&buf[..n]);
    }
    let text = String::from_utf8_lossy(&got).into_owned();
    text.lines().find_map(|l| {
        let mut it = l.split_whitespace();
        (it.next() == Some("STAT") && it.next() == Some(name))
            .then(|| it.next().and_then(|v| v.parse().ok()))
            .flatten()
    })
}

fn fabric(server: &Server, name: &str) -> u64 {
    tcp_stat(server, "fabric", name).unwrap_or_else(|| panic!("no {name} in stats fabric"))
}

/// Poll `cond` until it holds; fail after a generous bound (a hang is the failure, never a
/// slow machine).
fn eventually(what: &str, mut cond: impl FnMut() -> bool) {
    let limit = Instant::now() + Duration::from_secs(60);
    while !cond() {
        assert!(Instant::now() < limit, "never happened: {what}");
        std::thread::sleep(Duration::from_millis(50));
    }
}

/// Two-sided GETs (the server sends the value: one-sided reads pin nothing), and room for
/// a loaded machine.
fn config() -> Config {
    Config {
        timeout: Duration::from_secs(30),
        connect_timeout: Duration::from_secs(30),
        get_mode: GetMode::TwoSided,
        ..Config::default()
    }
}

/// Child mode: GET each of `keys` (comma-separated; rendezvous replies) and never
/// progress again.
fn stalled_get(url: &str, keys: &str) -> ! {
    let mut c = Client::new(url, config()).unwrap();
    // Wire the endpoint up first: afterwards a request leaves within the call that sends it.
    c.set(b"warm-up", b"x", 0, 0).unwrap();
    let _h: Vec<_> = keys.split(',').map(|k| c.bget(k.as_bytes())).collect();
    println!("sent");
    let _ = std::io::stdout().flush();
    loop {
        std::thread::sleep(Duration::from_secs(3600));
    }
}

/// A child that has sent a GET for `key` and stalls.
struct StalledGet(Child);

impl StalledGet {
    fn spawn(url: &str, key: &str) -> StalledGet {
        let child = Command::new(std::env::current_exe().unwrap())
            .args(["--exact", STALLED_GET_TEST, "--nocapture"])
            .env("MF_STALLED_GET", format!("{url} {key}"))
            .stdout(Stdio::piped())
            .spawn()
            .unwrap();
        let mut g = StalledGet(child);
        // The child says "sent" once its GET is out (or dies saying why on stderr).
        let mut out = g.0.stdout.take().unwrap();
        let mut got = Vec::new();
        let mut b = [0u8; 256];
        while !String::from_utf8_lossy(&got).contains("sent") {
            let n = out.read(&mut b).unwrap();
            assert!(
                n > 0,
                "the GET client died: {}",
                String::from_utf8_lossy(&got)
            );
            got.extend_from_slice(&b[..n]);
        }
        g
    }

    fn signal(&self, sig: &str) {
        let ok = Command::new("kill")
            .args([&format!("-{sig}"), &self.0.id().to_string()])
            .status()
            .unwrap();
        assert!(ok.success());
    }
}

impl Drop for StalledGet {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

const BIG: usize = 20 << 20;

/// The test whose binary plays the stalled GET client.
const STALLED_GET_TEST: &str = "get_clients_killed_or_stalled_mid_rendezvous_release_their_pins";

/// GET clients killed (SIGKILL) or stopped (SIGSTOP) while the server is sending them a
/// large value by rendezvous: the server releases each pin, when the session dies or when
/// the transfer deadline passes, counts what it cancelled, and the memory is reused.
#[test]
fn get_clients_killed_or_stalled_mid_rendezvous_release_their_pins() {
    if let Ok(spec) = std::env::var("MF_STALLED_GET") {
        let (url, key) = spec.split_once(' ').unwrap();
        stalled_get(url, key);
    }
    // Room for 12 values of 20 MB; 10 leaked pins would leave no room for the refills.
    let server = Server::start(
        Kind::MemfabricdUcx,
        &["-I", "32m", "-m", "256", "--ucx-transfer-timeout", "2"],
    );
    let url = server.url();
    let mut c = Client::new(url.as_str(), config()).unwrap();
    let value = vec![b'v'; BIG];
    let mut in_flight = 0;
    for round in 0..10u64 {
        let key = format!("big-{round}");
        if let Err(e) = c.set(key.as_bytes(), &value, 0, 0) {
            panic!("set {key}: {e:?}");
        }
        let child = StalledGet::spawn(&url, &key);
        // The server has served the GET: its reply is in flight unless the transport took
        // it all already (TCP may, into socket buffers and UCX's own threads).
        eventually(&format!("GET {round} is served"), || {
            tcp_stat(&server, "", "cmd_get") == Some(round + 1)
        });
        let pinned = fabric(&server, "ucx_pins");
        if pinned == 1 {
            assert_eq!(fabric(&server, "ucx_pinned_bytes"), BIG as u64);
            in_flight += 1;
        }
        match round % 3 {
            // Dies: the lifeline closes.
            0 => drop(child),
            // Stopped, then killed: same, later.
            1 => {
                child.signal("STOP");
                std::thread::sleep(Duration::from_millis(200));
                drop(child);
            }
            // Stopped for good: only the transfer deadline frees the pin.
            _ => {
                child.signal("STOP");
                eventually("the stalled send is cancelled", || {
                    fabric(&server, "ucx_pins") == 0
                });
                drop(child);
            }
        }
        eventually("the pin is released", || fabric(&server, "ucx_pins") == 0);
        assert_eq!(fabric(&server, "ucx_pinned_bytes"), 0);
        // The item is gone for good: only a pin could keep its memory.
        c.delete(key.as_bytes()).unwrap();
    }
    // (Over TCP a reply seen in flight may still complete before its client is killed,
    // so the cancellations are reported, not counted exactly.)
    println!(
        "{in_flight} of 10 replies were in flight when their client died or stopped; {} cancelled",
        fabric(&server, "ucx_sends_cancelled")
    );
    // Every value's memory came back: ten new ones fit without evicting each other.
    let before = tcp_stat(&server, "", "evictions").unwrap();
    for round in 0..10 {
        let key = format!("refill-{round}");
        c.set(key.as_bytes(), &value, 0, 0).unwrap();
    }
    assert_eq!(tcp_stat(&server, "", "evictions").unwrap(), before);
    for round in 0..10 {
        let got = c
            .get(format!("refill-{round}").as_bytes())
            .unwrap()
            .unwrap();
        assert_eq!(got.data.len(), BIG);
    }
}

/// Read `s` until the server closes it; what it sent. A hang is the failure.
fn read_to_close(s: &mut TcpStream) -> Vec<u8> {
    s.set_read_timeout(Some(Duration::from_secs(60))).unwrap();
    let mut got = Vec::new();
    let mut buf = [0u8; 512];
    loop {
        match s.read(&mut buf) {
            Ok(0) => return got,
            Ok(n) => got.extend_from_slice(&buf[..n]),
            Err(e) if e.kind() == std::io::ErrorKind::ConnectionReset => return got,
            Err(e) => panic!("the server kept an idle bootstrap connection open: {e}"),
        }
    }
}

fn open_fds(pid: u32) -> usize {
    std::fs::read_dir(format!("/proc/{pid}/fd"))
        .unwrap()
        .count()
}

/// Idle connections to the UCX bootstrap port count toward `-c` like TCP ones: past the
/// limit they get memcached's refusal, so do TCP clients, and the ones that never say HELLO
/// are closed after the HELLO deadline, after which TCP clients are served again.
#[test]
fn idle_bootstrap_connections_count_toward_the_limit_and_time_out() {
    const LIMIT: usize = 40;
    let server = Server::start(
        Kind::MemfabricdUcx,
        &["-c", &LIMIT.to_string(), "--ucx-hello-timeout", "1"],
    );
    let ucx_port = server.ucx_port.unwrap();
    // A TCP client that holds its slot throughout, to read the counters.
    let mut admin = TcpStream::connect(server.addr()).unwrap();
    admin
        .set_read_timeout(Some(Duration::from_secs(10)))
        .unwrap();
    let mut stat = |name: &str| -> u64 {
        admin.write_all(b"stats\r\n").unwrap();
        let mut got = Vec::new();
        let mut buf = [0u8; 8192];
        while !got.ends_with(b"END\r\n") {
            let n = admin.read(&mut buf).unwrap();
            assert!(n > 0, "the admin connection was closed");
            got.extend_from_slice(&buf[..n]);
        }
        let text = String::from_utf8_lossy(&got).into_owned();
        text.lines()
            .find_map(|l| l.strip_prefix(&format!("STAT {name} ")))
            .unwrap_or_else(|| panic!("no {name}"))
            .trim()
            .parse()
            .unwrap()
    };
    let rejected_before = stat("rejected_connections");
    let idle: Vec<TcpStream> = (0..LIMIT * 3)
        .map(|_| TcpStream::connect(("127.0.0.1", ucx_port)).unwrap())
        .collect();
    // Every idle connection is answered: refused at once, or accepted and then closed.
    let mut refused = 0;
    for mut s in idle {
        let got = read_to_close(&mut s);
        if got == b"ERROR Too many open connections\r\n" {
            refused += 1;
        } else {
            assert!(got.is_empty(), "{:?}", String::from_utf8_lossy(&got));
        }
    }
    assert!(refused >= LIMIT * 2, "only {refused} refused");
    assert!(stat("rejected_connections") - rejected_before >= refused as u64);
    let timeouts = tcp_stat(&server, "fabric", "ucx_hello_timeouts").unwrap();
    assert_eq!(timeouts as usize, LIMIT * 3 - refused);
    // Descriptors went back: the server holds about as many as at the start.
    assert!(open_fds(server.pid()) < LIMIT + 64);
    // Slots are free again: TCP and UCX clients are served.
    let mut t = TcpStream::connect(server.addr()).unwrap();
    t.set_read_timeout(Some(Duration::from_secs(10))).unwrap();
    t.write_all(b"version\r\n").unwrap();
    let mut buf = [0u8; 64];
    let n = t.read(&mut buf).unwrap();
    assert!(buf[..n].starts_with(b"VERSION "), "{:?}", &buf[..n]);
    let mut c = Client::new(server.url().as_str(), config()).unwrap();
    c.set(b"after", b"served", 0, 0).unwrap();
    assert_eq!(&c.get(b"after").unwrap().unwrap().data[..], b"served");
}

/// At the limit, a memcached client gets memcached's refusal while idle bootstrap
/// connections hold every slot (before they time out).
#[test]
fn tcp_clients_get_memcacheds_refusal_while_bootstrap_connections_hold_the_slots() {
    const LIMIT: usize = 20;
    let server = Server::start(
        Kind::MemfabricdUcx,
        &["-c", &LIMIT.to_string(), "--ucx-hello-timeout", "600"],
    );
    let ucx_port = server.ucx_port.unwrap();
    // Idle bootstrap connections, one more each round, until a TCP client is refused
    // (connections the harness made at start-up may still hold a slot for a moment).
    let mut idle = Vec::new();
    let mut answer = Vec::new();
    for _ in 0..LIMIT * 10 {
        idle.push(TcpStream::connect(("127.0.0.1", ucx_port)).unwrap());
        let mut t = TcpStream::connect(server.addr()).unwrap();
        answer = read_to_close_or_reply(&mut t);
        if answer == b"ERROR Too many open connections\r\n" {
            break;
        }
    }
    assert_eq!(
        String::from_utf8_lossy(&answer),
        "ERROR Too many open connections\r\n",
        "curr_connections {:?} rejected {:?} sessions {:?}",
        tcp_stat(&server, "", "curr_connections"),
        tcp_stat(&server, "", "rejected_connections"),
        tcp_stat(&server, "fabric", "ucx_curr_sessions"),
    );
    // The server still holds no more descriptors than the limit allows.
    assert!(open_fds(server.pid()) < LIMIT + 64);
}

/// Say `version`; the server's first answer (a refusal comes unasked, then EOF).
fn read_to_close_or_reply(t: &mut TcpStream) -> Vec<u8> {
    t.set_read_timeout(Some(Duration::from_secs(10))).unwrap();
    let _ = t.write_all(b"version\r\n");
    let mut buf = [0u8; 256];
    match t.read(&mut buf) {
        Ok(n) => buf[..n].to_vec(),
        Err(_) => Vec::new(),
    }
}

/// A session that asks for more large values than `--ucx-session-inflight-max` allows
/// without taking them has at most the cap (plus one value) pinned: its further GETs wait,
/// and go when its session ends or its transfers complete. A client that does take its
/// values gets every one of them, however many it asks for at once.
#[test]
fn a_sessions_pinned_bytes_are_capped_and_waiting_gets_are_served_not_dropped() {
    const VALUE: usize = 5 << 20;
    const KEYS: usize = 10;
    let server = Server::start(
        Kind::MemfabricdUcx,
        &[
            "-I",
            "8m",
            "-m",
            "256",
            "--ucx-session-inflight-max",
            "8388608",
        ],
    );
    let url = server.url();
    let mut c = Client::new(url.as_str(), config()).unwrap();
    let keys: Vec<String> = (0..KEYS).map(|i| format!("capped-{i}")).collect();
    for (i, k) in keys.iter().enumerate() {
        c.set(k.as_bytes(), &vec![i as u8; VALUE], 0, 0).unwrap();
    }
    // A client that asks for all of them and never pulls one.
    let gets_before = tcp_stat(&server, "", "cmd_get").unwrap();
    let child = StalledGet::spawn(&url, &keys.join(","));
    eventually("every GET is served or waiting", || {
        let served = tcp_stat(&server, "", "cmd_get").unwrap() - gets_before;
        served + fabric(&server, "ucx_requests_deferred") >= KEYS as u64
    });
    // At most two replies of 5 MB under an 8 MB cap (the second may start while 5 MB are
    // in flight); on shared memory exactly two, and the other eight wait.
    for _ in 0..10 {
        assert!(fabric(&server, "ucx_pins") <= 2);
        assert!(fabric(&server, "ucx_pinned_bytes") <= 2 * VALUE as u64);
        std::thread::sleep(Duration::from_millis(20));
    }
    println!(
        "pinned {} deferred {}",
        fabric(&server, "ucx_pins"),
        fabric(&server, "ucx_requests_deferred")
    );
    drop(child);
    eventually("the stalled session's pins are released", || {
        fabric(&server, "ucx_pins") == 0
    });
    // A client that takes its values: all of them at once, all served.
    let handles: Vec<_> = keys.iter().map(|k| c.iget(k.as_bytes())).collect();
    let results = c.wait_all(&handles, Duration::from_secs(60));
    for (i, r) in results.into_iter().enumerate() {
        match r {
            Ok(memfabric_client::Reply::Value(Some(v))) => {
                assert_eq!(v.data.len(), VALUE);
                assert!(v.data.iter().all(|&b| b == i as u8));
            }
            other => panic!("GET {i}: {other:?}"),
        }
    }
    assert_eq!(fabric(&server, "ucx_sessions_overflowed"), 0);
}
