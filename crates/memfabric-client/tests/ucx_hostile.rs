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

/// Child mode: GET `key` (a rendezvous reply) and never progress again.
fn stalled_get(url: &str, key: &str) -> ! {
    let mut c = Client::new(url, config()).unwrap();
    // Wire the endpoint up first: afterwards a request leaves within the call that sends it.
    c.set(b"warm-up", b"x", 0, 0).unwrap();
    let _h = c.bget(key.as_bytes());
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
            .args([
                "--exact",
                "get_clients_killed_or_stalled_mid_rendezvous_release_their_pins",
                "--nocapture",
            ])
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
    println!("{in_flight} of 10 replies were still in flight when their client died or stopped");
    assert!(fabric(&server, "ucx_sends_cancelled") >= in_flight);
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
