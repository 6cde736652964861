//! The test bed itself, against real memfabricd servers in network namespaces: each
//! server is reached at its own address; kill, pause, cut and restart do what they say,
//! observed from a client (replies, timeouts, an emptied cache); dropping the cluster, or
//! the death of the process that owned it, leaves nothing behind.
//!
//! Needs root and `ip`, as CI has. `MEMFABRIC_SKIP_NETNS=1` skips these tests where that
//! is not available (the skip is printed, never silent).
use std::io::{ErrorKind, Read, Write};
use std::net::{SocketAddr, TcpStream};
use std::process::Command;
use std::time::Duration;

use memfabric_cluster::{Cluster, ClusterConfig};

/// A memcached text-protocol client with a read timeout.
struct Client(TcpStream);

impl Client {
    fn connect(addr: SocketAddr) -> std::io::Result<Client> {
        let s = TcpStream::connect_timeout(&addr, Duration::from_millis(500))?;
        s.set_read_timeout(Some(Duration::from_millis(500)))?;
        s.set_nodelay(true)?;
        Ok(Client(s))
    }

    /// Send `req` and read until the reply ends with `end` (or the timeout).
    fn call(&mut self, req: &str, end: &str) -> std::io::Result<String> {
        self.0.write_all(req.as_bytes())?;
        let mut got = Vec::new();
        let mut buf = [0u8; 4096];
        while !got.ends_with(end.as_bytes()) {
            // A signal to this process (CI saw one while a server was paused) interrupts a
            // read with a timeout instead of restarting it: read again.
            let n = match self.0.read(&mut buf) {
                Err(e) if e.kind() == ErrorKind::Interrupted => continue,
                other => other?,
            };
            if n == 0 {
                return Err(ErrorKind::UnexpectedEof.into());
            }
            got.extend_from_slice(&buf[..n]);
        }
        Ok(String::from_utf8_lossy(&got).into_owned())
    }

    fn set(&mut self, key: &str, value: &str) -> std::io::Result<String> {
        self.call(
            &format!("set {key} 0 0 {}\r\n{value}\r\n", value.len()),
            "\r\n",
        )
    }

    fn get(&mut self, key: &str) -> std::io::Result<String> {
        self.call(&format!("get {key}\r\n"), "END\r\n")
    }
}

fn namespaces() -> String {
    let out = Command::new("ip").args(["netns", "list"]).output().unwrap();
    String::from_utf8_lossy(&out.stdout).into_owned()
}

fn links() -> String {
    let out = Command::new("ip").args(["-o", "link"]).output().unwrap();
    String::from_utf8_lossy(&out.stdout).into_owned()
}

#[test]
fn servers_are_separate_and_fail_as_told() {
    if memfabric_cluster::skip_netns_tests() {
        return;
    }
    let mut c = Cluster::start(ClusterConfig {
        servers: 3,
        args: vec!["-m".into(), "64".into()],
        ..ClusterConfig::default()
    })
    .expect("cluster");
    let addrs = c.addrs();
    assert_eq!(addrs.len(), 3);
    for (i, a) in addrs.iter().enumerate() {
        assert_ne!(
            a.ip(),
            addrs[(i + 1) % 3].ip(),
            "each server has its own address"
        );
    }
    // Separate servers: a key set on one is not on the others.
    for (i, a) in addrs.iter().enumerate() {
        let mut cl = Client::connect(*a).expect("connect");
        assert_eq!(
            cl.set(&format!("k{i}"), &format!("v{i}")).unwrap(),
            "STORED\r\n"
        );
    }
    for (i, a) in addrs.iter().enumerate() {
        let mut cl = Client::connect(*a).expect("connect");
        for j in 0..3 {
            let reply = cl.get(&format!("k{j}")).unwrap();
            if i == j {
                assert_eq!(reply, format!("VALUE k{j} 0 2\r\nv{j}\r\nEND\r\n"));
            } else {
                assert_eq!(reply, "END\r\n");
            }
        }
    }

    // Pause: connected, nothing answered; resumed, the queued request is answered.
    let mut cl = Client::connect(addrs[1]).unwrap();
    // Answered once first, so the server has accepted this connection before it stops.
    assert_eq!(cl.get("k1").unwrap(), "VALUE k1 0 2\r\nv1\r\nEND\r\n");
    c.pause(1).unwrap();
    let err = cl.get("k1").unwrap_err();
    assert!(
        matches!(err.kind(), ErrorKind::WouldBlock | ErrorKind::TimedOut),
        "{err:?}"
    );
    assert!(c.is_running(1));
    c.resume(1).unwrap();
    let mut answer = Vec::new();
    let mut buf = [0u8; 256];
    while !answer.ends_with(b"END\r\n") {
        let n = cl.0.read(&mut buf).expect("the paused request is answered");
        assert!(n > 0);
        answer.extend_from_slice(&buf[..n]);
    }
    assert_eq!(answer, b"VALUE k1 0 2\r\nv1\r\nEND\r\n");

    // Cut: requests go unanswered and new connections do not complete; healed, the
    // server is there with its data.
    let mut cl = Client::connect(addrs[2]).unwrap();
    c.cut(2).unwrap();
    assert!(cl.get("k2").is_err());
    assert!(Client::connect(addrs[2]).is_err());
    assert!(c.is_running(2), "cutting the link leaves the process");
    c.heal(2).unwrap();
    let mut cl = Client::connect(addrs[2]).expect("reachable again");
    assert_eq!(cl.get("k2").unwrap(), "VALUE k2 0 2\r\nv2\r\nEND\r\n");

    // Kill: refused; restart: the same address, empty.
    let pid = c.pid(0).unwrap();
    c.kill(0).unwrap();
    assert!(!c.is_running(0));
    assert!(!std::path::Path::new(&format!("/proc/{pid}")).exists());
    assert!(Client::connect(addrs[0]).is_err());
    c.restart(0).unwrap();
    assert_ne!(c.pid(0), Some(pid));
    let mut cl = Client::connect(addrs[0]).expect("restarted");
    assert_eq!(
        cl.get("k0").unwrap(),
        "END\r\n",
        "a restarted server is empty"
    );

    // A cut server restarts with its link up.
    c.cut(1).unwrap();
    c.restart(1).unwrap();
    let mut cl = Client::connect(addrs[1]).expect("restarted and healed");
    assert_eq!(cl.set("again", "x").unwrap(), "STORED\r\n");

    // The other servers were untouched throughout.
    let mut cl = Client::connect(addrs[2]).unwrap();
    assert_eq!(cl.get("k2").unwrap(), "VALUE k2 0 2\r\nv2\r\nEND\r\n");

    // Drop removes the namespaces and links, and a paused server goes too.
    let names: Vec<String> = (0..3).map(|i| c.netns(i).to_string()).collect();
    c.pause(2).unwrap();
    let pids: Vec<u32> = (0..3).filter_map(|i| c.pid(i)).collect();
    drop(c);
    let (ns, ls) = (namespaces(), links());
    for n in &names {
        assert!(!ns.contains(n.as_str()), "{n} left behind: {ns}");
        let host_link = n.replace('-', "h");
        assert!(
            !ls.contains(&format!(" {host_link}@")),
            "{host_link} left behind"
        );
    }
    for pid in pids {
        assert!(
            !std::path::Path::new(&format!("/proc/{pid}")).exists(),
            "server {pid} left running"
        );
    }
}

#[test]
fn clusters_side_by_side_get_their_own_addresses() {
    if memfabric_cluster::skip_netns_tests() {
        return;
    }
    let one = ClusterConfig {
        servers: 2,
        ..ClusterConfig::default()
    };
    let a = Cluster::start(one.clone()).expect("first");
    let b = Cluster::start(one).expect("second");
    for i in 0..2 {
        for j in 0..2 {
            assert_ne!(a.addr(i).ip(), b.addr(j).ip());
        }
        assert!(memfabric_cluster::answers_version(a.addr(i)));
        assert!(memfabric_cluster::answers_version(b.addr(i)));
    }
}

#[test]
fn shaped_links_have_a_token_bucket_at_both_ends_and_carry_large_values_whole() {
    if memfabric_cluster::skip_netns_tests() {
        return;
    }
    let c = Cluster::start(ClusterConfig {
        servers: 2,
        args: vec!["-m".into(), "64".into()],
        link_rate: Some("1gbit".parse().unwrap()),
        ..ClusterConfig::default()
    })
    .expect("cluster");
    let qdiscs = |netns: Option<&str>| {
        let out = match netns {
            Some(ns) => Command::new("ip")
                .args(["netns", "exec", ns, "tc", "qdisc", "show"])
                .output(),
            None => Command::new("tc").args(["qdisc", "show"]).output(),
        };
        String::from_utf8_lossy(&out.unwrap().stdout).into_owned()
    };
    let host = qdiscs(None);
    for i in 0..2 {
        // Namespace mfc<B>-<i>; its links are mfc<B>h<i> (here) and mfc<B>n<i> (there).
        let block = c
            .netns(i)
            .trim_start_matches("mfc")
            .split('-')
            .next()
            .unwrap();
        for (text, dev) in [
            (host.clone(), format!("mfc{block}h{i}")),
            (qdiscs(Some(c.netns(i))), format!("mfc{block}n{i}")),
        ] {
            let line = text
                .lines()
                .find(|l| l.contains(" tbf ") && l.contains(&format!("dev {dev} ")))
                .unwrap_or_else(|| panic!("no token bucket on {dev}:\n{text}"));
            assert!(line.contains("rate 1Gbit"), "{line}");
        }
    }
    // A value many times the bucket's depth crosses intact (queued, not dropped).
    let value: String = (0..300_000)
        .map(|i| (b'a' + (i % 26) as u8) as char)
        .collect();
    for i in 0..2 {
        let mut cl = Client::connect(c.addr(i)).expect("connect");
        assert_eq!(cl.set("big", &value).unwrap(), "STORED\r\n");
        let reply = cl.get("big").unwrap();
        assert_eq!(
            reply,
            format!("VALUE big 0 {}\r\n{value}\r\nEND\r\n", value.len())
        );
    }
}

#[test]
fn what_a_killed_owner_left_is_removed_by_the_next_cluster() {
    if memfabric_cluster::skip_netns_tests() {
        return;
    }
    // A child process (this test binary, running the helper below) builds a cluster
    // and is SIGKILLed with it up: no Drop runs.
    let exe = std::env::current_exe().unwrap();
    let mut child = Command::new(exe)
        .args([
            "--exact",
            "owner_that_will_be_killed",
            "--ignored",
            "--nocapture",
        ])
        .env("MEMFABRIC_CLUSTER_OWNER", "1")
        .stdout(std::process::Stdio::piped())
        .spawn()
        .unwrap();
    let mut out = child.stdout.take().unwrap();
    let mut seen = String::new();
    let mut buf = [0u8; 512];
    while !seen.contains("UP ") {
        let n = out.read(&mut buf).unwrap();
        assert!(n > 0, "the owner exited before its cluster was up: {seen}");
        seen.push_str(&String::from_utf8_lossy(&buf[..n]));
    }
    let line = seen
        .lines()
        .find(|l| l.starts_with("UP "))
        .unwrap()
        .to_string();
    let left: Vec<&str> = line.split_whitespace().skip(1).collect();
    let (netns, server_pid) = (left[0].to_string(), left[1].to_string());
    child.kill().unwrap();
    child.wait().unwrap();
    assert!(namespaces().contains(&netns), "the orphan is there before");
    assert!(std::path::Path::new(&format!("/proc/{server_pid}")).exists());
    // The next cluster on the host sweeps it away.
    let c = Cluster::start(ClusterConfig {
        servers: 1,
        ..ClusterConfig::default()
    })
    .expect("cluster");
    assert!(!namespaces().contains(&format!("{netns}\n")) || c.netns(0) == netns);
    let gone = (0..100).any(|_| {
        std::thread::sleep(Duration::from_millis(20));
        !std::path::Path::new(&format!("/proc/{server_pid}")).exists()
    });
    assert!(gone, "the orphaned server {server_pid} still runs");
}

/// Helper for the test above: only runs in its child process.
#[test]
#[ignore = "run by what_a_killed_owner_left_is_removed_by_the_next_cluster"]
fn owner_that_will_be_killed() {
    if std::env::var_os("MEMFABRIC_CLUSTER_OWNER").is_none() {
        return;
    }
    let c = Cluster::start(ClusterConfig {
        servers: 1,
        ..ClusterConfig::default()
    })
    .expect("cluster");
    println!("UP {} {}", c.netns(0), c.pid(0).unwrap());
    std::io::stdout().flush().unwrap();
    std::thread::sleep(Duration::from_secs(60));
}
