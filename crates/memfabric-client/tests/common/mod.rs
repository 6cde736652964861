//! Test servers: Debian's memcached and memfabricd on free loopback ports, killed on drop.
//! memfabricd runs either TCP only (`--ucx-port 0`) or with its UCX data path on a second
//! free port, which clients reach as `ucx://127.0.0.1:<port>` ([`Server::url`]). The UCX
//! transports come from the environment (`UCX_TLS`), which the server inherits.
//!
//! memfabricd is `$MEMFABRICD` (relative to the workspace root) or
//! `target/{release,debug}/memfabricd`; build it first (`cargo build --release -p
//! memfabric-server`). A missing server binary fails the test, it never skips.

#![allow(dead_code)]

use std::net::TcpStream;
use std::path::PathBuf;
use std::process::{Child, Command, Stdio};
use std::thread::sleep;
use std::time::{Duration, Instant};

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Kind {
    Memcached,
    /// memfabricd, clients over TCP (memcached protocol).
    Memfabricd,
    /// memfabricd with `--ucx-port`, clients over UCX (`ucx://`, the fabric protocol).
    MemfabricdUcx,
}

pub const KINDS: [Kind; 3] = [Kind::Memcached, Kind::Memfabricd, Kind::MemfabricdUcx];

fn workspace_root() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../..")
}

fn memfabricd() -> PathBuf {
    if let Ok(p) = std::env::var("MEMFABRICD") {
        let p = PathBuf::from(p);
        let p = if p.is_absolute() {
            p
        } else {
            workspace_root().join(p)
        };
        assert!(p.exists(), "MEMFABRICD={} does not exist", p.display());
        return p;
    }
    let target = std::env::var("CARGO_TARGET_DIR")
        .map(PathBuf::from)
        .unwrap_or_else(|_| workspace_root().join("target"));
    for profile in ["release", "debug"] {
        let p = target.join(profile).join("memfabricd");
        if p.exists() {
            return p;
        }
    }
    panic!(
        "memfabricd not found under {}: cargo build --release -p memfabric-server",
        target.display()
    );
}

fn memcached() -> PathBuf {
    for p in ["/usr/bin/memcached", "/usr/local/bin/memcached"] {
        if std::path::Path::new(p).exists() {
            return p.into();
        }
    }
    panic!("memcached is not installed (scripts/setup.sh installs it)");
}

fn free_port() -> u16 {
    memfabric_cluster::ports::free_loopback_port()
}

fn is_root() -> bool {
    std::env::var("USER").map(|u| u == "root").unwrap_or(false)
        || Command::new("id")
            .arg("-u")
            .output()
            .map(|o| o.stdout.starts_with(b"0"))
            .unwrap_or(false)
}

/// A running server; killed (SIGKILL) when dropped.
pub struct Server {
    pub kind: Kind,
    /// The memcached-protocol TCP port (every kind has one).
    pub port: u16,
    /// The UCX bootstrap port (`--ucx-port`), for `Kind::MemfabricdUcx` only.
    pub ucx_port: Option<u16>,
    args: Vec<String>,
    child: Option<Child>,
    /// Where the server's standard error goes (`start_logged`); discarded otherwise.
    log: Option<PathBuf>,
    /// Environment variables the server starts with (`start_env`).
    env: Vec<(String, String)>,
}

impl Server {
    /// Starts `kind` on a free port with memcached's test flags plus `extra`.
    pub fn start(kind: Kind, extra: &[&str]) -> Server {
        Server::start_with(kind, extra, None, &[])
    }

    /// As `start`, with `env` added to the server's environment.
    pub fn start_env(kind: Kind, extra: &[&str], env: &[(&str, &str)]) -> Server {
        Server::start_with(kind, extra, None, env)
    }

    /// As `start`, with the server's standard error written to `log` (read it after the
    /// server is gone, or while it runs).
    pub fn start_logged(kind: Kind, extra: &[&str], log: &std::path::Path) -> Server {
        Server::start_with(kind, extra, Some(log.to_path_buf()), &[])
    }

    /// As `start_env`, with the server's standard error written to `log`.
    pub fn start_env_logged(
        kind: Kind,
        extra: &[&str],
        env: &[(&str, &str)],
        log: &std::path::Path,
    ) -> Server {
        Server::start_with(kind, extra, Some(log.to_path_buf()), env)
    }

    fn start_with(
        kind: Kind,
        extra: &[&str],
        log: Option<PathBuf>,
        env: &[(&str, &str)],
    ) -> Server {
        for _ in 0..5 {
            let mut s = Server {
                kind,
                port: free_port(),
                ucx_port: (kind == Kind::MemfabricdUcx).then(free_port),
                args: extra.iter().map(|s| s.to_string()).collect(),
                child: None,
                log: log.clone(),
                env: env
                    .iter()
                    .map(|(k, v)| (k.to_string(), v.to_string()))
                    .collect(),
            };
            if s.spawn() {
                return s;
            }
        }
        panic!("could not start {kind:?}");
    }

    /// The TCP (memcached protocol) address, whatever the kind.
    pub fn addr(&self) -> String {
        format!("127.0.0.1:{}", self.port)
    }

    /// What a client of this kind connects to: `ucx://127.0.0.1:<ucx port>` for
    /// `Kind::MemfabricdUcx`, the TCP address for the others.
    pub fn url(&self) -> String {
        match self.ucx_port {
            Some(p) => format!("ucx://127.0.0.1:{p}"),
            None => self.addr(),
        }
    }

    /// The server's name in the client's reports (`host:port` of [`Server::url`]).
    pub fn name(&self) -> String {
        format!("127.0.0.1:{}", self.ucx_port.unwrap_or(self.port))
    }

    pub fn pid(&self) -> u32 {
        self.child.as_ref().expect("not running").id()
    }

    fn spawn(&mut self) -> bool {
        let exe = match self.kind {
            Kind::Memcached => memcached(),
            Kind::Memfabricd | Kind::MemfabricdUcx => memfabricd(),
        };
        let mut cmd = Command::new(exe);
        cmd.args([
            "-p",
            &self.port.to_string(),
            "-U",
            "0",
            "-l",
            "127.0.0.1",
            "-t",
            "1",
        ]);
        if !self.args.iter().any(|a| a == "-m") {
            cmd.args(["-m", "64"]);
        }
        if self.kind != Kind::Memcached && !self.args.iter().any(|a| a == "--ucx-port") {
            // TCP only unless asked: the default UCX port (11311) is shared by every test.
            let ucx = self.ucx_port.unwrap_or(0).to_string();
            cmd.args(["--ucx-port", &ucx]);
        }
        cmd.args(&self.args);
        cmd.envs(self.env.iter().map(|(k, v)| (k.as_str(), v.as_str())));
        if self.kind == Kind::Memcached && is_root() {
            cmd.args(["-u", "root"]);
        }
        let stderr = match &self.log {
            Some(p) => std::fs::File::create(p)
                .map(Stdio::from)
                .expect("server log file"),
            None => Stdio::null(),
        };
        cmd.stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(stderr);
        let mut child = cmd.spawn().expect("spawn server");
        let deadline = Instant::now() + Duration::from_secs(10);
        while Instant::now() < deadline {
            if let Ok(Some(_)) = child.try_wait() {
                return false; // e.g. the port was taken in the meantime
            }
            if TcpStream::connect(("127.0.0.1", self.port)).is_ok() {
                // Make sure it is our server that answered, not one that held the port
                // before (another test binary running at the same time may have been
                // handed the same free port): its `stats` pid says whose it is. Servers
                // that answer no plain `stats` (-Y, -S) get the older, weaker check.
                match stats_pid(self.port) {
                    Some(pid) if pid != child.id() => {
                        let _ = child.kill();
                        let _ = child.wait();
                        return false;
                    }
                    Some(_) => {}
                    None => sleep(Duration::from_millis(20)),
                }
                if let Ok(Some(_)) = child.try_wait() {
                    return false;
                }
                // The UCX port is bound with the TCP one; a server that could not bind it
                // still runs (without its UCX path): try other ports then.
                if let Some(p) = self.ucx_port {
                    if TcpStream::connect(("127.0.0.1", p)).is_err() {
                        let _ = child.kill();
                        let _ = child.wait();
                        return false;
                    }
                }
                self.child = Some(child);
                return true;
            }
            sleep(Duration::from_millis(10));
        }
        let _ = child.kill();
        let _ = child.wait();
        false
    }

    /// Kills the server (SIGKILL) and waits for it.
    pub fn kill(&mut self) {
        if let Some(mut c) = self.child.take() {
            let _ = c.kill();
            let _ = c.wait();
        }
    }

    /// Starts the server again on the same port(s).
    pub fn restart(&mut self) {
        self.kill();
        let deadline = Instant::now() + Duration::from_secs(10);
        while !self.spawn() {
            assert!(
                Instant::now() < deadline,
                "could not restart {:?} on {} (ucx {:?})",
                self.kind,
                self.port,
                self.ucx_port
            );
            sleep(Duration::from_millis(50));
        }
    }

    /// Sends a signal (e.g. "STOP", "CONT") to the server.
    pub fn signal(&self, sig: &str) {
        let ok = Command::new("kill")
            .args([&format!("-{sig}"), &self.pid().to_string()])
            .status()
            .unwrap();
        assert!(ok.success());
        if sig == "STOP" {
            // kill(2) returns before every thread has stopped: wait for the stopped state.
            let stat = format!("/proc/{}/stat", self.pid());
            let deadline = Instant::now() + Duration::from_secs(5);
            loop {
                let s = std::fs::read_to_string(&stat).unwrap_or_default();
                let state = s.rsplit(") ").next().and_then(|r| r.chars().next());
                if state == Some('T') {
                    break;
                }
                assert!(Instant::now() < deadline, "server did not stop: {s}");
                sleep(Duration::from_millis(1));
            }
        }
    }
}

impl Drop for Server {
    fn drop(&mut self) {
        if self.child.is_some() {
            // A stopped process must be continued to die promptly on some kernels; SIGKILL works
            // on stopped processes on Linux, so just kill.
            self.kill();
        }
    }
}

/// A key of pool `c` that lives on its server `index` (the first `TAG<n>` that does).
pub fn key_on(c: &memfabric_client::Client, index: usize, tag: &str) -> Vec<u8> {
    let want = c.servers()[index].clone();
    (0..)
        .map(|i| format!("{tag}{i}").into_bytes())
        .find(|k| c.locate(k) == Some(&want))
        .unwrap()
}

/// The pid a server on `port` reports in `stats`, if it answers plain ascii `stats`
/// within a couple of seconds.
fn stats_pid(port: u16) -> Option<u32> {
    use std::io::{Read, Write};
    let mut c = TcpStream::connect(("127.0.0.1", port)).ok()?;
    c.set_read_timeout(Some(Duration::from_secs(2))).ok()?;
    c.write_all(b"stats\r\n").ok()?;
    let mut got = Vec::new();
    let mut buf = [0u8; 4096];
    while !got.ends_with(b"END\r\n") && got.len() < 1 << 16 {
        let n = c.read(&mut buf).ok()?;
        if n == 0 {
            break;
        }
        got.extend_from_slice(&buf[..n]);
    }
    String::from_utf8_lossy(&got)
        .lines()
        .find_map(|l| l.strip_prefix("STAT pid "))
        .and_then(|p| p.trim().parse().ok())
}

/// splitmix64: the cluster tests' only randomness, seeded, so a failing run is replayed
/// with its seed.
pub struct Rng(pub u64);

impl Rng {
    pub fn next(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9e37_79b9_7f4a_7c15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
        z ^ (z >> 31)
    }
    pub fn below(&mut self, n: u64) -> u64 {
        self.next() % n
    }
}

/// A value length, uniform in the exponent: up to `2^big_bits` bytes for a quarter of the
/// values, up to `2^small_bits` for the rest (the large ones there without moving
/// gigabytes).
pub fn value_size(rng: &mut Rng, small_bits: u64, big_bits: u64) -> usize {
    let bits = if rng.below(4) == 0 {
        big_bits
    } else {
        small_bits
    };
    let e = rng.below(bits + 1);
    let lo = 1u64 << e.saturating_sub(1);
    let hi = 1u64 << e;
    (lo + rng.below(hi - lo + 1)).max(1) as usize
}

/// Write `version` of key `k`: a header naming both, then bytes derived from them, so
/// that any mix-up or damage is seen.
pub fn versioned_value(k: u32, version: u32, len: usize) -> Vec<u8> {
    let mut v = format!("{k}:{version}:").into_bytes();
    let mut x = (u64::from(k) << 32 | u64::from(version)).wrapping_mul(0x2545_f491_4f6c_dd1d);
    while v.len() < len {
        x ^= x << 13;
        x ^= x >> 7;
        x ^= x << 17;
        v.push(x as u8);
    }
    v.truncate(len.max(1));
    v
}

/// A paused server accepts TCP connections in its kernel, so a probe that only connects
/// took it for a live one, and the pool then connected inline and waited (over UCX the
/// HELLO, over TLS the handshake, each its `connect_timeout`, blocking every operation;
/// over plain TCP requests that timed out). The probe waits for the server's own answer:
/// a paused copy fails its probes, no inline connect is made, every operation is served by
/// the other copies; resumed, it is used again. `servers`: three, of one kind; `config`: a
/// replicated pool's (`replicas` 2, `quorum`), its deadlines shortened here, its TLS
/// settings (if any) used for a direct client of server 0 too.
pub fn paused_copy_is_probed_not_connected(
    label: &str,
    servers: &[Server],
    config: memfabric_client::Config,
) {
    use memfabric_client::{Client, Config};
    let timeout = Duration::from_millis(300);
    let direct_config = Config {
        tls: config.tls.clone(),
        ..Config::default()
    };
    let config = Config {
        timeout,
        connect_timeout: timeout,
        retry_timeout: Duration::from_millis(400),
        ..config
    };
    let list: Vec<String> = servers.iter().map(Server::url).collect();
    let mut c = Client::new(list.join(",").as_str(), config).unwrap();
    let keys: Vec<Vec<u8>> = (0..30)
        .map(|i| key_on(&c, i % 3, &format!("p{i}:")))
        .collect();
    for k in &keys {
        assert!(
            c.set_acked(k, b"before", 0, 0).unwrap().acked >= 2,
            "{label}"
        );
    }
    // Every copy written and every connection open before the pause.
    assert!(c.drain(Duration::from_secs(10)), "{label}");
    servers[0].signal("STOP");
    // Until three probes failed (each a retry time and a probe's deadline after the last:
    // ~0.7 s), at most 20 s or 500,000 operations.
    let paused = Instant::now();
    let (n, _) = pairs_until_three_probes_failed(&mut c, &keys, label);
    let counters = c.pool_counters().clone();
    eprintln!(
        "{label}: {n} writes and reads in {:?} while paused; {counters:?}",
        paused.elapsed()
    );
    assert!(
        counters.reconnect_probes_failed >= 3,
        "{label}: probes of the paused copy did not fail: {counters:?}"
    );
    assert_eq!(
        counters.connect_failures, 0,
        "{label}: an inline connect to the paused copy: {counters:?}"
    );
    servers[0].signal("CONT");
    // Back in use: a write through the pool reaches server 0 (read there directly).
    let mut direct = Client::new(servers[0].url().as_str(), direct_config).unwrap();
    let deadline = Instant::now() + Duration::from_secs(20);
    let key = &keys[0];
    for m in 0.. {
        let v = format!("resumed-{m}");
        c.set(key, v.as_bytes(), 0, 0).unwrap();
        if direct
            .get(key)
            .unwrap()
            .is_some_and(|got| got.data[..] == *v.as_bytes())
        {
            break;
        }
        assert!(
            Instant::now() < deadline,
            "{label}: server 0 never written again"
        );
        sleep(Duration::from_millis(20));
    }
    let counters = c.pool_counters();
    assert_eq!(counters.connect_failures, 0, "{label}: {counters:?}");
    assert!(
        counters.reconnect_probes > counters.reconnect_probes_failed,
        "{label}: {counters:?}"
    );
}

/// Set-then-get pairs over `keys` through replicated pool `c` (each write acknowledged by
/// at least two copies, each read the value just written) until three probes of an
/// unreachable server failed (each a retry time and a probe's deadline after the last:
/// ~0.7 s with the tests' settings), at most 20 s or 500,000 pairs (20,000 took an idle
/// machine 2.1 s, before the third probe had failed). The pairs made and the slowest.
pub fn pairs_until_three_probes_failed(
    c: &mut memfabric_client::Client,
    keys: &[Vec<u8>],
    label: &str,
) -> (usize, Duration) {
    let deadline = Instant::now() + Duration::from_secs(20);
    let mut slowest = Duration::ZERO;
    let mut n = 0;
    while c.pool_counters().reconnect_probes_failed < 3 && Instant::now() < deadline && n < 500_000
    {
        let op = Instant::now();
        let k = &keys[n % keys.len()];
        let v = format!("{label}-{n}");
        let a = c.set_acked(k, v.as_bytes(), 0, 0).expect("a quorum write");
        assert!(a.acked >= 2, "{label} #{n}: {a:?}");
        assert_eq!(
            &c.get(k).unwrap().expect("the value").data[..],
            v.as_bytes()
        );
        slowest = slowest.max(op.elapsed());
        n += 1;
    }
    (n, slowest)
}
