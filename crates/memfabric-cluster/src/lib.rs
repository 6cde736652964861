//! memfabric-cluster: a cluster test bed. `Cluster::start` runs N memfabricd servers, each
//! in its own network namespace with its own address, reachable from the calling process
//! over a veth pair; any of them can be killed (`SIGKILL`), paused (`SIGSTOP`), cut off
//! (its link down) and restarted (empty, as a real restart is). Tests and benchmarks of
//! replication and erasure coding use it to fail servers for real.
//!
//! ```text
//!   this process (root namespace)              namespace mfc<B>-<i>
//!   10.<B>.<i>.1/24  mfc<B>h<i>  <── veth ──>  mfc<B>n<i>  10.<B>.<i>.2/24  memfabricd
//! ```
//!
//! Only the namespaces' own addresses are ever targeted (and loopback inside them). `<B>`
//! is a second octet free on this host, claimed for the cluster's lifetime by creating
//! `/run/memfabric-cluster/<B>` exclusively (holding the owner's pid), so clusters of
//! concurrent tests and processes never share addresses or names.
//!
//! Clean-up: dropping the `Cluster` (also while a failing test unwinds) kills its servers
//! and removes its links, namespaces and claim. A process that dies without dropping it
//! (SIGKILL) leaves them behind; the next `Cluster::start` on the host removes every
//! cluster whose owner is no longer running, and any `mfc*` namespace without a claim.
//!
//! Needs Linux, root (or CAP_NET_ADMIN and CAP_SYS_ADMIN) and `ip` (iproute2).
//!
//! Also here, for the tests of several crates: [`certs::TestCerts`] (TLS) and
//! [`ports::free_loopback_port`] (ports for servers on loopback).
pub mod certs;
pub mod ports;

use std::fs;
use std::io::{self, Read, Write};
use std::net::{Ipv4Addr, SocketAddr, SocketAddrV4, TcpStream};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::Mutex;
use std::time::{Duration, Instant};

use nix::sys::signal::{kill, Signal};
use nix::unistd::Pid;

/// Where clusters claim their second octet.
const CLAIMS: &str = "/run/memfabric-cluster";
/// The second octets tried, in order (10.200.0.0 and up: away from the usual 10.0/10.1).
const OCTETS: std::ops::RangeInclusive<u8> = 200..=254;
/// At most this many servers per cluster (one /24 each, under one second octet).
pub const MAX_SERVERS: usize = 250;

#[derive(Debug, thiserror::Error)]
pub enum Error {
    #[error("`{cmd}` failed: {stderr}")]
    Command { cmd: String, stderr: String },
    #[error("{0}")]
    Io(#[from] io::Error),
    #[error("server {index} did not answer within {waited:?}; its log ends with:\n{log}")]
    NotUp {
        index: usize,
        waited: Duration,
        log: String,
    },
    #[error("no free address block: 10.{}.0.0/16 to 10.{}.0.0/16 are all in use", OCTETS.start(), OCTETS.end())]
    NoAddresses,
    #[error("{0}")]
    Config(String),
    #[error("signal: {0}")]
    Signal(#[from] nix::Error),
}

pub type Result<T> = std::result::Result<T, Error>;

/// What to start.
#[derive(Clone, Debug)]
pub struct ClusterConfig {
    /// Number of servers (1..=`MAX_SERVERS`).
    pub servers: usize,
    /// The server binary; `None`: `memfabricd` next to the running executable or one
    /// directory up (a test binary lives in `target/<profile>/deps`).
    pub memfabricd: Option<PathBuf>,
    /// TCP port of every server (each has its own address).
    pub port: u16,
    /// The UCX bootstrap port, or `None` for `--ucx-port 0` (no UCX).
    pub ucx_port: Option<u16>,
    /// More memfabricd arguments (`-m 64`, `-t 2`, ...).
    pub args: Vec<String>,
    /// How long a server may take to answer after it was started.
    pub startup_timeout: Duration,
    /// Shape every server's link to this rate, each way (a token bucket, `tc qdisc tbf`,
    /// on both ends of the veth pair): `None` leaves it at veth speed (memory copies).
    /// Each server then has a link of its own, as on separate hosts behind one switch,
    /// so transfers to several servers overlap where transfers to one queue.
    pub link_rate: Option<LinkRate>,
}

/// The MTU of shaped links.
const SHAPED_MTU: u32 = 9000;

/// A link's rate, in bits per second (at least 1 Mbit/s).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct LinkRate(u64);

impl LinkRate {
    pub fn bits_per_second(self) -> u64 {
        self.0
    }

    /// The token bucket's depth: what may leave back to back after a pause. Two
    /// (jumbo) frames, or 10 us at the rate if more, as a switch port serialises: a
    /// transfer of any size pays the rate (the kernel splits larger packets to fit;
    /// a deep bucket would let a 64 KiB value through at memory speed).
    fn burst_bytes(self) -> u64 {
        (2 * (SHAPED_MTU as u64 + 14)).max(self.0 / 8 / 100_000)
    }
}

impl std::str::FromStr for LinkRate {
    type Err = String;
    /// `10gbit`, `2.5gbit`, `800mbit`, `1000000000` (bits per second).
    fn from_str(s: &str) -> std::result::Result<LinkRate, String> {
        let t = s.trim().to_ascii_lowercase();
        let t = t.strip_suffix("bit").unwrap_or(&t);
        let (num, scale) = match t.as_bytes().last() {
            Some(b'g') => (&t[..t.len() - 1], 1e9),
            Some(b'm') => (&t[..t.len() - 1], 1e6),
            Some(b'k') => (&t[..t.len() - 1], 1e3),
            _ => (t, 1.0),
        };
        let bits = num
            .parse::<f64>()
            .ok()
            .filter(|v| v.is_finite() && *v > 0.0)
            .map(|v| v * scale)
            .ok_or_else(|| format!("'{s}' is not a link rate (like 10gbit, 800mbit)"))?;
        if !(1e6..=1e12).contains(&bits) {
            return Err(format!("link rate '{s}' is outside 1mbit..1000gbit"));
        }
        Ok(LinkRate(bits as u64))
    }
}

impl std::fmt::Display for LinkRate {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self.0 {
            b if b % 1_000_000_000 == 0 => write!(f, "{}gbit", b / 1_000_000_000),
            b if b % 1_000_000 == 0 => write!(f, "{}mbit", b / 1_000_000),
            b => write!(f, "{b}bit"),
        }
    }
}

impl Default for ClusterConfig {
    fn default() -> Self {
        ClusterConfig {
            servers: 3,
            memfabricd: None,
            port: 11211,
            ucx_port: None,
            args: Vec::new(),
            startup_timeout: Duration::from_secs(20),
            link_rate: None,
        }
    }
}

/// One server: its namespace, link, address and process.
#[derive(Debug)]
struct Node {
    netns: String,
    host_link: String,
    ns_link: String,
    addr: Ipv4Addr,
    child: Option<Child>,
    log: PathBuf,
    cut: bool,
}

/// A running cluster. Dropping it tears everything down.
#[derive(Debug)]
pub struct Cluster {
    cfg: ClusterConfig,
    binary: PathBuf,
    octet: u8,
    nodes: Vec<Node>,
    dir: PathBuf,
}

/// Serialises claiming within this process (the claim file serialises processes).
static CLAIMING: Mutex<()> = Mutex::new(());

impl Cluster {
    /// Build the namespaces and links and start every server; returns when all answer.
    pub fn start(cfg: ClusterConfig) -> Result<Cluster> {
        if cfg.servers == 0 || cfg.servers > MAX_SERVERS {
            return Err(Error::Config(format!(
                "servers must be 1..={MAX_SERVERS}, not {}",
                cfg.servers
            )));
        }
        let binary = match &cfg.memfabricd {
            Some(p) => p.clone(),
            None => find_memfabricd()?,
        };
        let octet = {
            let _one_at_a_time = CLAIMING.lock().unwrap_or_else(|e| e.into_inner());
            sweep_stale()?;
            claim_octet()?
        };
        let dir = std::env::temp_dir().join(format!("memfabric-cluster-{octet}"));
        // Whatever happens to a server's link, nothing addressed to the cluster's block
        // may leave by the default route.
        if let Err(e) = ip(&safety_route("add", octet)) {
            let _ = fs::remove_file(claim_path(octet));
            return Err(e);
        }
        let mut cluster = Cluster {
            cfg,
            binary,
            octet,
            nodes: Vec::new(),
            dir,
        };
        // From here on, Drop undoes whatever part was built.
        fs::create_dir_all(&cluster.dir)?;
        for i in 0..cluster.cfg.servers {
            let node = cluster.build_node(i)?;
            cluster.nodes.push(node);
        }
        for i in 0..cluster.nodes.len() {
            cluster.spawn(i)?;
        }
        for i in 0..cluster.nodes.len() {
            cluster.wait_up(i)?;
        }
        Ok(cluster)
    }

    /// Number of servers.
    pub fn len(&self) -> usize {
        self.nodes.len()
    }

    pub fn is_empty(&self) -> bool {
        self.nodes.is_empty()
    }

    /// Server `i`'s TCP address.
    pub fn addr(&self, i: usize) -> SocketAddr {
        SocketAddr::V4(SocketAddrV4::new(self.nodes[i].addr, self.cfg.port))
    }

    /// Server `i`'s UCX bootstrap address, when UCX is on.
    pub fn ucx_addr(&self, i: usize) -> Option<SocketAddr> {
        self.cfg
            .ucx_port
            .map(|p| SocketAddr::V4(SocketAddrV4::new(self.nodes[i].addr, p)))
    }

    /// Every server's TCP address, in order.
    pub fn addrs(&self) -> Vec<SocketAddr> {
        (0..self.len()).map(|i| self.addr(i)).collect()
    }

    /// Server `i`'s namespace (for `ip netns exec`).
    pub fn netns(&self, i: usize) -> &str {
        &self.nodes[i].netns
    }

    /// Server `i`'s process id, while it runs.
    pub fn pid(&self, i: usize) -> Option<u32> {
        self.nodes[i].child.as_ref().map(Child::id)
    }

    /// Whether server `i`'s process is alive (running or paused).
    pub fn is_running(&mut self, i: usize) -> bool {
        match self.nodes[i].child.as_mut() {
            Some(c) => matches!(c.try_wait(), Ok(None)),
            None => false,
        }
    }

    /// `SIGKILL` server `i` and reap it. Its address stays; nothing answers there.
    pub fn kill(&mut self, i: usize) -> Result<()> {
        let node = &mut self.nodes[i];
        if let Some(mut child) = node.child.take() {
            let _ = child.kill();
            child.wait()?;
        }
        Ok(())
    }

    /// `SIGSTOP` server `i`: its sockets stay open and its kernel keeps accepting TCP
    /// connections and data, but nothing is answered.
    pub fn pause(&mut self, i: usize) -> Result<()> {
        self.signal(i, Signal::SIGSTOP)?;
        // The signal is only queued when `kill` returns: a thread running on another CPU
        // can still answer a request. Return once every thread has stopped.
        let pid = self.pid(i).unwrap_or(0);
        let start = Instant::now();
        while !all_threads_stopped(pid) {
            if start.elapsed() > self.cfg.startup_timeout {
                return Err(Error::Config(format!("server {i} did not stop")));
            }
            std::thread::sleep(Duration::from_millis(1));
        }
        Ok(())
    }

    /// `SIGCONT` server `i`.
    pub fn resume(&mut self, i: usize) -> Result<()> {
        self.signal(i, Signal::SIGCONT)?;
        Ok(())
    }

    /// Take server `i`'s link down: packets to and from it are lost (connections hang
    /// until their timeouts; new ones do not complete), the process runs on. The
    /// namespace's end goes down, so this side keeps its route (the packets go into the
    /// veth and are dropped there, never anywhere else).
    pub fn cut(&mut self, i: usize) -> Result<()> {
        self.set_link(i, false)
    }

    /// Bring server `i`'s link back up.
    pub fn heal(&mut self, i: usize) -> Result<()> {
        self.set_link(i, true)
    }

    fn set_link(&mut self, i: usize, up: bool) -> Result<()> {
        let node = &mut self.nodes[i];
        let state = if up { "up" } else { "down" };
        let link = ["link", "set", &node.ns_link, state];
        ip(&[&["netns", "exec", &node.netns, "ip"][..], &link[..]].concat())?;
        node.cut = !up;
        if up {
            // Usable when it says so: carrier on this end, and no neighbour entry left
            // failed by the cut (the kernel would wait a second before asking again).
            let start = Instant::now();
            while !ip_output(&["-o", "link", "show", "dev", &node.host_link])?.contains("LOWER_UP")
            {
                if start.elapsed() > self.cfg.startup_timeout {
                    return Err(Error::Config(format!("link {} stays down", node.host_link)));
                }
                std::thread::sleep(Duration::from_millis(5));
            }
            let _ = ip(&["neigh", "flush", "dev", &node.host_link]);
        }
        Ok(())
    }

    /// Kill server `i` if it runs and start it again, empty; returns when it answers.
    /// The link is brought up if it was cut.
    pub fn restart(&mut self, i: usize) -> Result<()> {
        self.kill(i)?;
        if self.nodes[i].cut {
            self.heal(i)?;
        }
        self.spawn(i)?;
        self.wait_up(i)
    }

    /// The last `max` bytes of server `i`'s output (stdout and stderr, all its lives).
    pub fn log_tail(&self, i: usize, max: usize) -> String {
        tail(&self.nodes[i].log, max)
    }

    fn signal(&mut self, i: usize, sig: Signal) -> Result<()> {
        let pid = self
            .pid(i)
            .ok_or_else(|| Error::Config(format!("server {i} is not running")))?;
        kill(Pid::from_raw(pid as i32), sig)?;
        Ok(())
    }

    fn build_node(&self, i: usize) -> Result<Node> {
        let b = self.octet;
        let netns = format!("mfc{b}-{i}");
        let host_link = format!("mfc{b}h{i}");
        let ns_link = format!("mfc{b}n{i}");
        let host_addr = format!("10.{b}.{i}.1/24");
        let addr = Ipv4Addr::new(10, b, i as u8, 2);
        ip(&["netns", "add", &netns])?;
        let node = Node {
            netns: netns.clone(),
            host_link: host_link.clone(),
            ns_link: ns_link.clone(),
            addr,
            child: None,
            log: self.dir.join(format!("server-{i}.log")),
            cut: false,
        };
        let link_rate = self.cfg.link_rate;
        // Recorded before the rest is built: a failure below is undone by Drop.
        let built = (|| {
            ip(&[
                "link", "add", &host_link, "type", "veth", "peer", "name", &ns_link,
            ])?;
            if link_rate.is_some() {
                // Jumbo frames, as data-centre and HPC fabrics use: a sixth of the
                // per-packet work of shaping on this machine's few cores.
                for dev in [&host_link, &ns_link] {
                    ip(&["link", "set", dev, "mtu", &SHAPED_MTU.to_string()])?;
                }
            }
            ip(&["link", "set", &ns_link, "netns", &netns])?;
            ip(&["addr", "add", &host_addr, "dev", &host_link])?;
            ip(&["link", "set", &host_link, "up"])?;
            let in_ns = |args: &[&str]| {
                let mut all = vec!["netns", "exec", &netns, "ip"];
                all.extend_from_slice(args);
                ip(&all)
            };
            in_ns(&["addr", "add", &format!("{addr}/24"), "dev", &ns_link])?;
            in_ns(&["link", "set", &ns_link, "up"])?;
            in_ns(&["link", "set", "lo", "up"])?;
            // The rest of the cluster's block (the other host ends, where a client may
            // bind: UCX's TCP transport listens on every interface it uses) is reached
            // through this server's own link; nothing else is routed from here.
            in_ns(&[
                "route",
                "add",
                &format!("10.{b}.0.0/16"),
                "via",
                &format!("10.{b}.{i}.1"),
            ])?;
            if let Some(rate) = link_rate {
                let shape = |dev: &str| {
                    [
                        "qdisc".to_string(),
                        "replace".into(),
                        "dev".into(),
                        dev.into(),
                        "root".into(),
                        "tbf".into(),
                        "rate".into(),
                        format!("{}bit", rate.bits_per_second()),
                        "burst".into(),
                        rate.burst_bytes().to_string(),
                        // A queue deep enough that shaping never drops (TCP would then
                        // measure its loss recovery, not the link).
                        "latency".into(),
                        "100ms".into(),
                    ]
                };
                tc(&shape(&host_link))?;
                let mut ns_tc = vec!["netns".to_string(), "exec".into(), netns.clone()];
                ns_tc.push("tc".into());
                ns_tc.extend(shape(&ns_link));
                ip(&ns_tc)?;
            }
            Ok::<(), Error>(())
        })();
        match built {
            Ok(()) => Ok(node),
            Err(e) => {
                remove_node(&node);
                Err(e)
            }
        }
    }

    fn spawn(&mut self, i: usize) -> Result<()> {
        let port = self.cfg.port.to_string();
        let ucx_port = self.cfg.ucx_port.unwrap_or(0).to_string();
        let node = &mut self.nodes[i];
        let log = fs::OpenOptions::new()
            .create(true)
            .append(true)
            .open(&node.log)?;
        let child = Command::new("ip")
            .args(["netns", "exec", &node.netns])
            .arg(&self.binary)
            .args(["-p", &port, "-U", "0", "-l", &node.addr.to_string()])
            .args(["--ucx-port", &ucx_port, "-u", "root"])
            .args(&self.cfg.args)
            .stdin(Stdio::null())
            .stdout(log.try_clone()?)
            .stderr(log)
            .spawn()?;
        node.child = Some(child);
        Ok(())
    }

    /// Wait until server `i` answers `version` (a round trip, not just a connect: the
    /// kernel completes connections to a listening socket whatever its process does).
    fn wait_up(&mut self, i: usize) -> Result<()> {
        let addr = self.addr(i);
        let timeout = self.cfg.startup_timeout;
        let start = Instant::now();
        loop {
            if answers_version(addr) {
                return Ok(());
            }
            let exited = !self.is_running(i);
            if exited || start.elapsed() > timeout {
                return Err(Error::NotUp {
                    index: i,
                    waited: start.elapsed(),
                    log: self.log_tail(i, 2000),
                });
            }
            std::thread::sleep(Duration::from_millis(20));
        }
    }
}

impl Drop for Cluster {
    fn drop(&mut self) {
        for i in 0..self.nodes.len() {
            let _ = self.kill(i);
        }
        for node in &self.nodes {
            remove_node(node);
        }
        let _ = fs::remove_dir_all(&self.dir);
        let _ = ip(&safety_route("del", self.octet));
        let _ = fs::remove_file(claim_path(self.octet));
    }
}

/// Whether tests that need network namespaces should skip themselves here:
/// `MEMFABRIC_SKIP_NETNS` is set (a machine without root or `ip`). The skip is printed,
/// never silent; CI does not set it.
pub fn skip_netns_tests() -> bool {
    let skip = std::env::var_os("MEMFABRIC_SKIP_NETNS").is_some();
    if skip {
        eprintln!("MEMFABRIC_SKIP_NETNS is set: network-namespace test skipped");
    }
    skip
}

/// Whether every thread of process `pid` is stopped (state `T` in `/proc`).
fn all_threads_stopped(pid: u32) -> bool {
    let Ok(tasks) = fs::read_dir(format!("/proc/{pid}/task")) else {
        return false;
    };
    tasks.flatten().all(|t| {
        fs::read_to_string(t.path().join("stat")).is_ok_and(|stat| {
            // The state follows the command name, which is in parentheses.
            stat.rsplit_once(") ")
                .is_some_and(|(_, rest)| rest.starts_with('T') || rest.starts_with('t'))
        })
    })
}

/// Whether a server at `addr` answers `version` within a second.
pub fn answers_version(addr: SocketAddr) -> bool {
    let Ok(mut s) = TcpStream::connect_timeout(&addr, Duration::from_millis(500)) else {
        return false;
    };
    let _ = s.set_read_timeout(Some(Duration::from_secs(1)));
    let mut reply = [0u8; 8];
    s.write_all(b"version\r\n").is_ok()
        && s.read_exact(&mut reply).is_ok()
        && reply.starts_with(b"VERSION ")
}

/// Remove a node's link and namespace (and with it anything left inside). The host end
/// is deleted first: that removes both ends at once, where a namespace's own teardown
/// is asynchronous.
fn remove_node(node: &Node) {
    let _ = ip(&["link", "del", &node.host_link]);
    kill_processes_in(&node.netns);
    let _ = ip(&["netns", "del", &node.netns]);
}

/// SIGKILL whatever still runs in namespace `netns`.
fn kill_processes_in(netns: &str) {
    if let Ok(out) = Command::new("ip").args(["netns", "pids", netns]).output() {
        for pid in String::from_utf8_lossy(&out.stdout).split_whitespace() {
            if let Ok(pid) = pid.parse::<i32>() {
                let _ = kill(Pid::from_raw(pid), Signal::SIGKILL);
            }
        }
    }
}

/// `ip route add|del unreachable 10.B.0.0/16`: the cluster's whole block, behind the
/// servers' own /24 routes.
fn safety_route(verb: &str, octet: u8) -> [String; 6] {
    [
        "route".into(),
        verb.into(),
        "unreachable".into(),
        format!("10.{octet}.0.0/16"),
        "metric".into(),
        "4242".into(),
    ]
}

fn claim_path(octet: u8) -> PathBuf {
    Path::new(CLAIMS).join(octet.to_string())
}

/// Claim a second octet no other cluster holds and no address or route of this host
/// uses.
fn claim_octet() -> Result<u8> {
    fs::create_dir_all(CLAIMS)?;
    let in_use = host_networks()?;
    for b in OCTETS {
        if in_use.contains(&format!("10.{b}.")) {
            continue;
        }
        match fs::OpenOptions::new()
            .write(true)
            .create_new(true)
            .open(claim_path(b))
        {
            Ok(mut f) => {
                writeln!(f, "{}", std::process::id())?;
                return Ok(b);
            }
            Err(e) if e.kind() == io::ErrorKind::AlreadyExists => continue,
            Err(e) => return Err(e.into()),
        }
    }
    Err(Error::NoAddresses)
}

/// This host's addresses and routes, as text (enough to see whether `10.B.` appears).
fn host_networks() -> Result<String> {
    let mut text = ip_output(&["-o", "addr", "show"])?;
    text.push_str(&ip_output(&["route", "show", "table", "all"])?);
    Ok(text)
}

/// Remove what dead processes left: every claimed cluster whose owner is gone, and every
/// `mfc*` namespace no claim covers.
fn sweep_stale() -> Result<()> {
    let namespaces = ip_output(&["netns", "list"])?;
    let ours: Vec<String> = namespaces
        .lines()
        .filter_map(|l| l.split_whitespace().next())
        .filter(|n| parse_netns(n).is_some())
        .map(str::to_string)
        .collect();
    let mut live = Vec::new();
    if let Ok(entries) = fs::read_dir(CLAIMS) {
        for e in entries.flatten() {
            let Some(b) = e.file_name().to_str().and_then(|n| n.parse::<u8>().ok()) else {
                continue;
            };
            let owner = fs::read_to_string(e.path())
                .ok()
                .and_then(|s| s.trim().parse::<u32>().ok());
            if owner.is_some_and(|pid| Path::new(&format!("/proc/{pid}")).exists()) {
                live.push(b);
            } else {
                for n in ours
                    .iter()
                    .filter(|n| parse_netns(n).map(|x| x.0) == Some(b))
                {
                    remove_stale(n);
                }
                let _ = ip(&safety_route("del", b));
                let _ = fs::remove_file(e.path());
            }
        }
    }
    for n in &ours {
        if parse_netns(n).is_some_and(|(b, _)| !live.contains(&b)) {
            remove_stale(n);
        }
    }
    Ok(())
}

fn remove_stale(netns: &str) {
    if let Some((b, i)) = parse_netns(netns) {
        let _ = ip(&["link", "del", &format!("mfc{b}h{i}")]);
    }
    kill_processes_in(netns);
    let _ = ip(&["netns", "del", netns]);
}

/// `mfc<B>-<i>` → (B, i).
fn parse_netns(name: &str) -> Option<(u8, usize)> {
    let rest = name.strip_prefix("mfc")?;
    let (b, i) = rest.split_once('-')?;
    Some((b.parse().ok()?, i.parse().ok()?))
}

/// `tc ARGS` (iproute2); an error carries its stderr.
fn tc(args: &[String]) -> Result<()> {
    let out = Command::new("tc").args(args).output()?;
    if out.status.success() {
        Ok(())
    } else {
        Err(Error::Command {
            cmd: format!("tc {}", args.join(" ")),
            stderr: String::from_utf8_lossy(&out.stderr).trim().to_string(),
        })
    }
}

/// Run `ip ARGS`; an error carries its stderr.
fn ip<S: AsRef<std::ffi::OsStr> + AsRef<str>>(args: &[S]) -> Result<()> {
    ip_output(args).map(drop)
}

fn ip_output<S: AsRef<std::ffi::OsStr> + AsRef<str>>(args: &[S]) -> Result<String> {
    let out = Command::new("ip").args(args).output()?;
    if !out.status.success() {
        return Err(Error::Command {
            cmd: format!(
                "ip {}",
                args.iter()
                    .map(AsRef::<str>::as_ref)
                    .collect::<Vec<_>>()
                    .join(" ")
            ),
            stderr: String::from_utf8_lossy(&out.stderr).trim().to_string(),
        });
    }
    Ok(String::from_utf8_lossy(&out.stdout).into_owned())
}

/// `memfabricd` next to the running executable, or one directory up.
fn find_memfabricd() -> Result<PathBuf> {
    let exe = std::env::current_exe()?;
    for dir in exe.ancestors().skip(1).take(2) {
        let candidate = dir.join("memfabricd");
        if candidate.is_file() {
            return Ok(candidate);
        }
    }
    Err(Error::Config(format!(
        "no memfabricd next to {} or one directory up: build it (cargo build --release -p memfabric-server) or set ClusterConfig::memfabricd",
        exe.display()
    )))
}

fn tail(path: &Path, max: usize) -> String {
    let text = fs::read(path).unwrap_or_default();
    let from = text.len().saturating_sub(max);
    String::from_utf8_lossy(&text[from..]).into_owned()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn namespace_names_parse_back() {
        assert_eq!(parse_netns("mfc200-0"), Some((200, 0)));
        assert_eq!(parse_netns("mfc254-17"), Some((254, 17)));
        assert_eq!(parse_netns("mfc-1"), None);
        assert_eq!(parse_netns("other"), None);
        assert_eq!(parse_netns("mfc300-1"), None);
    }

    #[test]
    fn link_rates_parse_as_tc_writes_them() {
        let rate = |s: &str| s.parse::<LinkRate>().map(LinkRate::bits_per_second);
        assert_eq!(rate("10gbit"), Ok(10_000_000_000));
        assert_eq!(rate("2.5Gbit"), Ok(2_500_000_000));
        assert_eq!(rate("800mbit"), Ok(800_000_000));
        assert_eq!(rate("1000000"), Ok(1_000_000));
        for bad in [
            "", "gbit", "fast", "-1gbit", "0", "nangbit", "999kbit", "2000gbit",
        ] {
            assert!(rate(bad).is_err(), "{bad:?} accepted");
        }
        assert_eq!("25gbit".parse::<LinkRate>().unwrap().to_string(), "25gbit");
        assert_eq!(
            "800mbit".parse::<LinkRate>().unwrap().to_string(),
            "800mbit"
        );
    }
}
