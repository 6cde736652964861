//! What the server's process-level tests share: a server guard (killed and reaped on
//! drop, also when a test fails), free loopback ports, reading until the server closes, a
//! request answered up to its end marker, and the machine's CPU time from /proc/stat. Each test binary uses part of it.
#![allow(dead_code)]

use std::io::{Read, Write};
use std::net::TcpStream;
use std::process::{Child, Command, Stdio};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::{Duration, Instant};

/// How long any wait may last before the test fails.
pub const WAIT: Duration = Duration::from_secs(10);

/// A running server on 127.0.0.1:`port`.
pub struct Server {
    pub child: Child,
    pub port: u16,
}

impl Drop for Server {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
        let _ = std::fs::remove_file(server_log(self.port));
    }
}

/// Where a spawned server's standard error goes.
pub fn server_log(port: u16) -> std::path::PathBuf {
    std::env::temp_dir().join(format!(
        "memfabric-test-server-{}-{port}.stderr",
        std::process::id()
    ))
}

impl Server {
    /// Runs `cmd` (its port flags already given as `port`) and waits until it listens.
    /// Its standard error goes to a file ([`server_log`]) that failures quote.
    pub fn spawn(cmd: &mut Command, port: u16) -> Server {
        let log = server_log(port);
        let child = cmd
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(std::fs::File::create(&log).expect("server log"))
            .spawn()
            .expect("spawn server");
        let mut server = Server { child, port };
        let start = Instant::now();
        while TcpStream::connect(("127.0.0.1", port)).is_err() {
            if let Some(status) = server.child.try_wait().expect("try_wait") {
                let said = std::fs::read_to_string(&log).unwrap_or_default();
                panic!("{cmd:?} exited ({status}) before it listened on {port}: {said}");
            }
            assert!(
                start.elapsed() < WAIT,
                "the server never listened on {port}"
            );
            std::thread::sleep(Duration::from_millis(20));
        }
        server
    }

    /// Runs `cmd`, which asks for a port the kernel picks (`-p -1`), and returns once the
    /// server has bound it: the port is read back from the file memcached's
    /// `MEMCACHED_PORT_FILENAME` names, written after listening. The port is the server's
    /// own from the moment it is known (a port chosen by the test and bound later by the
    /// server could be another process's meanwhile), so a connection that fails later
    /// means this server stopped ([`Server::state`] says how).
    pub fn spawn_on_own_port(cmd: &mut Command) -> Server {
        static STARTED: AtomicUsize = AtomicUsize::new(0);
        let n = STARTED.fetch_add(1, Ordering::Relaxed);
        let base = std::env::temp_dir().join(format!(
            "memfabric-test-server-{}-start{n}",
            std::process::id()
        ));
        let ports = base.with_extension("ports");
        let log = base.with_extension("stderr");
        let _ = std::fs::remove_file(&ports);
        let child = cmd
            .env("MEMCACHED_PORT_FILENAME", &ports)
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(std::fs::File::create(&log).expect("server log"))
            .spawn()
            .expect("spawn server");
        let mut server = Server { child, port: 0 };
        let start = Instant::now();
        server.port = loop {
            let text = std::fs::read_to_string(&ports).unwrap_or_default();
            if let Some(p) = text
                .lines()
                .find_map(|l| l.strip_prefix("TCP INET: "))
                .and_then(|p| p.trim().parse().ok())
            {
                break p;
            }
            let said = || std::fs::read_to_string(&log).unwrap_or_default();
            if let Some(status) = server.child.try_wait().expect("try_wait") {
                panic!("{cmd:?} exited ({status}) at start: {}", said());
            }
            assert!(start.elapsed() < WAIT, "{cmd:?} did not start: {}", said());
            std::thread::sleep(Duration::from_millis(20));
        };
        let _ = std::fs::remove_file(&ports);
        // The server keeps writing to the renamed file; failures and Drop find it by port.
        std::fs::rename(&log, server_log(server.port)).expect("rename server log");
        server
    }

    /// Why a connection to the server failed: whether it is still running, and what it
    /// said on standard error.
    pub fn state(&self) -> String {
        // From /proc, so that a shared reference will do (`Z`: exited, not yet reaped).
        let stat = std::fs::read_to_string(format!("/proc/{}/stat", self.child.id()));
        let running = match stat.as_deref().ok().and_then(|st| st.rsplit(") ").next()) {
            Some(rest) if rest.starts_with('Z') => "the server exited".to_string(),
            Some(rest) => format!("the server is running (state {})", &rest[..1]),
            None => "the server is gone".to_string(),
        };
        let said = std::fs::read_to_string(server_log(self.port)).unwrap_or_default();
        format!("{running}; its stderr: {said:?}")
    }

    /// Resident memory, from /proc.
    pub fn rss(&self) -> u64 {
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

/// memfabricd on 127.0.0.1:`port`, without its UCX port (more flags to add).
pub fn memfabricd(port: u16) -> Command {
    let mut cmd = Command::new(env!("CARGO_BIN_EXE_memfabricd"));
    cmd.args([
        "-p",
        &port.to_string(),
        "-l",
        "127.0.0.1",
        "--ucx-port",
        "0",
    ]);
    cmd
}

/// A loopback port no other server of this test run is given (see `memfabric_cluster::ports`).
pub fn free_port() -> u16 {
    memfabric_cluster::ports::free_loopback_port()
}

/// Whether the server closed the connection (reading whatever it still sent).
pub fn closed(c: &mut impl Read) -> bool {
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

/// One `\r\n`-ended line (or what came before the server closed).
pub fn line(c: &mut impl Read) -> String {
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
    String::from_utf8_lossy(&got).into_owned()
}

/// Runs `cmd` (which names `port`), expecting it to refuse to start: it must exit
/// unsuccessfully without ever listening on `port`. Returns what it said on stderr. A
/// server that starts after all is killed (by the guard) and fails the test.
pub fn refuses_to_start(cmd: &mut Command, port: u16) -> String {
    let child = cmd
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .spawn()
        .expect("run");
    let mut server = Server { child, port };
    let start = Instant::now();
    let status = loop {
        if let Some(st) = server.child.try_wait().expect("try_wait") {
            break st;
        }
        assert!(start.elapsed() < WAIT, "{cmd:?} started");
        std::thread::sleep(Duration::from_millis(20));
    };
    let mut err = String::new();
    let _ = server
        .child
        .stderr
        .take()
        .expect("stderr")
        .read_to_string(&mut err);
    assert!(!status.success(), "{cmd:?} started");
    assert!(TcpStream::connect(("127.0.0.1", port)).is_err());
    err
}

/// Send `req` and read its reply, up to and including `end`.
pub fn request(c: &mut TcpStream, req: &str, end: &[u8]) -> String {
    c.write_all(req.as_bytes()).unwrap();
    let mut got = Vec::new();
    let mut buf = [0u8; 4096];
    while !got.ends_with(end) {
        let n = c.read(&mut buf).expect("a reply");
        assert!(n > 0, "the server closed the connection");
        got.extend_from_slice(&buf[..n]);
    }
    String::from_utf8_lossy(&got).into_owned()
}

/// Idle and total jiffies (1/100 s) of all CPUs since boot (the `cpu` line of /proc/stat).
pub fn cpu_jiffies() -> (u64, u64) {
    let stat = std::fs::read_to_string("/proc/stat").expect("/proc/stat");
    let v: Vec<u64> = stat
        .lines()
        .next()
        .and_then(|l| l.strip_prefix("cpu "))
        .expect("the cpu line")
        .split_whitespace()
        .take(8)
        .map(|f| f.parse().expect("a number"))
        .collect();
    (v[3] + v[4], v.iter().sum())
}
