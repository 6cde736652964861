//! Listeners: bind the TCP, UDP and unix sockets, and the accept loop that hands new
//! connections round-robin to the workers.
//!
//! The accept loop runs on the main thread. It also owns the signal pipe (SIGINT, SIGUSR1 and
//! SIGTERM stop the server) and enforces `-c`: over the limit, a new connection gets
//! memcached's `ERROR Too many open connections` and is closed at once
//! (`-o maxconns_fast`, the default), or is left in the kernel's accept queue until a slot
//! frees up (`-o no_maxconns_fast`).
use std::io::{self, Write};
use std::net::{IpAddr, Ipv4Addr, Ipv6Addr, SocketAddr, ToSocketAddrs};
use std::os::fd::AsRawFd;
use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::time::Duration;

use mio::net::{TcpListener, UnixListener};
use mio::{Events, Interest, Poll, Token};
use socket2::{Domain, Protocol, SockAddr, Socket, Type};

use crate::conn::{ConnEntry, ConnState, Stream};
use crate::exec::Shared;
use crate::settings::{bind_port, Settings};
use crate::tls::Tls;
use crate::worker::{NewConn, WorkerHandle};

/// What memcached answers a connection over the `-c` limit.
pub const TOO_MANY_CONNECTIONS: &[u8] = b"ERROR Too many open connections\r\n";

/// Why the listeners could not be set up.
#[derive(Debug, thiserror::Error)]
pub enum NetError {
    #[error("failed to listen on {addr}: {source}")]
    Bind { addr: String, source: io::Error },
    #[error("cannot resolve listen address {0}")]
    Resolve(String),
    /// An `-l` entry memcached refuses, with its message.
    #[error("{why}\nfailed to listen on one of interface(s) {spec}")]
    Listen { why: String, spec: String },
    #[error("unix socket {path}: {source}")]
    Unix { path: String, source: io::Error },
}

/// Bound, listening sockets.
pub struct Listeners {
    /// TCP listeners, their names, and whether their connections speak TLS (`-Z`, not
    /// `notls:`).
    pub tcp: Vec<(TcpListener, String, bool)>,
    pub unix: Option<(UnixListener, String)>,
    /// UDP sockets; each worker reads from a clone of each (as memcached's threads share
    /// one UDP socket).
    pub udp: Vec<(std::net::UdpSocket, String)>,
    /// UCX bootstrap listeners (`--ucx-port`): a client says HELLO here and is handed to a
    /// worker's UCX endpoint (crate::ucx_frontend).
    pub ucx: Vec<(TcpListener, String)>,
}

/// Turn one `-l` entry into addresses, read as memcached 1.6 reads it (`server_sockets`):
/// `[v6]` or `[v6]:port`; otherwise the text after the first `:` is a port when no
/// other `:` follows it, and an entry with more colons is an IPv6 address without a port
/// (`::1:8000` is that address, never `::1` on port 8000). The port is read as `safe_strtol`
/// reads numbers and, as memcached hands it to `getaddrinfo`, taken modulo 2^16. `*` is
/// every interface. Without a port, `default_port` is used.
pub fn resolve(spec: &str, default_port: u16) -> Result<Vec<SocketAddr>, NetError> {
    let invalid = |why: String| NetError::Listen {
        why,
        spec: spec.to_string(),
    };
    let (bracketed, rest) = match spec.strip_prefix('[') {
        Some(inner) => {
            let (host, rest) = inner
                .split_once(']')
                .ok_or_else(|| invalid(format!("Invalid IPV6 address: \"{spec}\"")))?;
            (Some(host), rest)
        }
        None => (None, spec),
    };
    let (host, port) = match rest.split_once(':') {
        Some((before, after)) if bracketed.is_some() || !after.contains(':') => {
            let port = memfabric_proto::number::safe_strtol(after.as_bytes())
                .ok_or_else(|| invalid(format!("Invalid port number: \"{after}\"")))?;
            // memcached prints the port and getaddrinfo keeps its low 16 bits.
            (bracketed.unwrap_or(before), port as u16)
        }
        // Text after `]` that has no `:` is ignored, as in memcached.
        _ => (bracketed.unwrap_or(rest), default_port),
    };
    if host == "*" {
        return Ok(vec![
            SocketAddr::new(IpAddr::V4(Ipv4Addr::UNSPECIFIED), port),
            SocketAddr::new(IpAddr::V6(Ipv6Addr::UNSPECIFIED), port),
        ]);
    }
    if let Ok(ip) = host.parse::<IpAddr>() {
        return Ok(vec![SocketAddr::new(ip, port)]);
    }
    let addrs: Vec<SocketAddr> = (host, port)
        .to_socket_addrs()
        .map_err(|_| NetError::Resolve(spec.to_string()))?
        .collect();
    if addrs.is_empty() {
        return Err(NetError::Resolve(spec.to_string()));
    }
    Ok(addrs)
}

/// An interface to bind: its address, whether failing to bind it stops the server, and
/// whether it was given as `notls:` (plain even with `-Z`).
struct Interface {
    addr: SocketAddr,
    required: bool,
    notls: bool,
}

/// The interfaces to bind: `-l` entries, or every interface (IPv4 and, where the host has
/// it, IPv6) as memcached does without `-l`.
fn interfaces(settings: &Settings, port: u16) -> Result<Vec<Interface>, NetError> {
    if settings.listen.is_empty() {
        let any = |ip, required| Interface {
            addr: SocketAddr::new(ip, port),
            required,
            notls: false,
        };
        return Ok(vec![
            any(IpAddr::V4(Ipv4Addr::UNSPECIFIED), true),
            // Optional: a host without IPv6 still starts.
            any(IpAddr::V6(Ipv6Addr::UNSPECIFIED), false),
        ]);
    }
    let mut v = Vec::new();
    for spec in &settings.listen {
        let (spec, notls) = match spec.strip_prefix("notls:") {
            Some(rest) => (rest, true),
            None => (spec.as_str(), false),
        };
        // `*` is every interface; its IPv6 half is optional, as without `-l` (memcached
        // skips an address family the host does not have).
        let star = spec == "*" || spec.starts_with("*:");
        for addr in resolve(spec, port)? {
            v.push(Interface {
                addr,
                required: !(star && addr.is_ipv6()),
                notls,
            });
        }
    }
    Ok(v)
}

fn socket_for(
    addr: &SocketAddr,
    ty: Type,
    proto: Protocol,
    mark: Option<u32>,
) -> io::Result<Socket> {
    let s = Socket::new(Domain::for_address(*addr), ty, Some(proto))?;
    s.set_reuse_address(true)?;
    if addr.is_ipv6() {
        // Keep IPv6 listeners from also claiming the IPv4 port we bind separately.
        s.set_only_v6(true)?;
    }
    if let Some(m) = mark {
        // `-o sock_cookie_id`: as memcached, a socket that cannot be marked (no
        // CAP_NET_ADMIN) is said and used anyway.
        if let Err(e) = s.set_mark(m) {
            tracing::warn!("setsockopt(SO_MARK {m}) on {addr}: {e}");
        }
    }
    Ok(s)
}

fn bind_tcp(addr: SocketAddr, backlog: u32, mark: Option<u32>) -> io::Result<TcpListener> {
    let s = socket_for(&addr, Type::STREAM, Protocol::TCP, mark)?;
    s.bind(&addr.into())?;
    s.listen(backlog.min(i32::MAX as u32) as i32)?;
    s.set_nonblocking(true)?;
    Ok(TcpListener::from_std(s.into()))
}

fn bind_udp(addr: SocketAddr, mark: Option<u32>) -> io::Result<std::net::UdpSocket> {
    let s = socket_for(&addr, Type::DGRAM, Protocol::UDP, mark)?;
    // memcached raises the send buffer so that a multi-datagram reply is not dropped.
    let _ = s.set_send_buffer_size(4 << 20);
    let _ = s.set_recv_buffer_size(4 << 20);
    s.bind(&addr.into())?;
    s.set_nonblocking(true)?;
    Ok(s.into())
}

fn bind_unix(path: &str, mask: u32, backlog: u32) -> io::Result<UnixListener> {
    use std::os::unix::fs::{FileTypeExt, PermissionsExt};
    // A socket file left by a previous run would make bind fail; memcached removes it.
    if let Ok(meta) = std::fs::symlink_metadata(path) {
        if meta.file_type().is_socket() {
            std::fs::remove_file(path)?;
        }
    }
    let s = Socket::new(Domain::UNIX, Type::STREAM, None)?;
    s.bind(&SockAddr::unix(path)?)?;
    std::fs::set_permissions(path, std::fs::Permissions::from_mode(mask & 0o777))?;
    s.listen(backlog.min(i32::MAX as u32) as i32)?;
    s.set_nonblocking(true)?;
    Ok(UnixListener::from_std(s.into()))
}

/// Bind everything the settings ask for.
pub fn bind(settings: &Settings) -> Result<Listeners, NetError> {
    let mut l = Listeners {
        tcp: Vec::new(),
        unix: None,
        udp: Vec::new(),
        ucx: Vec::new(),
    };
    if let Some(path) = &settings.unix_socket {
        let u = bind_unix(path, settings.unix_mask, settings.backlog).map_err(|source| {
            NetError::Unix {
                path: path.clone(),
                source,
            }
        })?;
        l.unix = Some((u, format!("unix:{path}")));
        return Ok(l);
    }
    let mark = settings.sock_cookie_id;
    // -1 binds port 0 on each interface: each listener gets its own ephemeral port, as in
    // memcached, and MEMCACHED_PORT_FILENAME reports them (`port_file_text`).
    if let Some(tcp_port) = bind_port(settings.tcp_port) {
        for Interface {
            addr,
            required,
            notls,
        } in interfaces(settings, tcp_port)?
        {
            match bind_tcp(addr, settings.backlog, mark) {
                Ok(t) => {
                    let name = t.local_addr().map_or(addr, |a| a);
                    let tls = settings.tls.is_some() && !notls;
                    l.tcp.push((t, format!("tcp:{name}"), tls));
                }
                Err(source) if required => {
                    return Err(NetError::Bind {
                        addr: addr.to_string(),
                        source,
                    })
                }
                Err(e) => tracing::info!("not listening on {addr}: {e}"),
            }
        }
    }
    if let Some(udp_port) = bind_port(settings.udp_port) {
        for Interface { addr, required, .. } in interfaces(settings, udp_port)? {
            // `-l ip:port` names a TCP port; UDP always uses -U.
            let addr = SocketAddr::new(addr.ip(), udp_port);
            match bind_udp(addr, mark) {
                Ok(u) => {
                    let name = u.local_addr().map_or(addr, |a| a);
                    l.udp.push((u, format!("udp:{name}")));
                }
                Err(source) if required => {
                    return Err(NetError::Bind {
                        addr: addr.to_string(),
                        source,
                    })
                }
                Err(e) => tracing::info!("not listening on udp {addr}: {e}"),
            }
        }
    }
    if settings.ucx_port != 0 {
        let mut bound: Vec<IpAddr> = Vec::new();
        for Interface { addr, required, .. } in interfaces(settings, settings.ucx_port)? {
            // `-l 127.0.0.1 -l notls:127.0.0.1:P` names one host twice: its TCP ports
            // differ, but the UCX port is one per host, bound once.
            if bound.contains(&addr.ip()) {
                continue;
            }
            bound.push(addr.ip());
            let addr = SocketAddr::new(addr.ip(), settings.ucx_port);
            match bind_tcp(addr, settings.backlog, None) {
                Ok(t) => {
                    let name = t.local_addr().map_or(addr, |a| a);
                    l.ucx.push((t, format!("ucx:{name}")));
                }
                // A port the operator named must be ours: a server left TCP-only there
                // would have its clients' HELLOs answered by whoever holds the port.
                Err(source)
                    if settings.ucx_port_given
                        && (required || source.kind() == io::ErrorKind::AddrInUse) =>
                {
                    return Err(NetError::Bind {
                        addr: format!("{addr} (--ucx-port)"),
                        source,
                    })
                }
                // The default port is an addition: without it the server still serves
                // every memcached client, and a second server on the host still starts.
                // But all of it or none: listening on `[::]` while another process holds
                // `127.0.0.1:11311`, `stats fabric` would send this server's UCX clients
                // to that process.
                Err(e) if required || e.kind() == io::ErrorKind::AddrInUse => {
                    tracing::warn!(
                        "UCX data path off: port {} is not ours on {} ({e}); serving                          TCP/UDP/unix only (--ucx-port chooses another)",
                        settings.ucx_port,
                        addr.ip()
                    );
                    l.ucx.clear();
                    break;
                }
                // An optional interface (IPv6 on a host without it).
                Err(e) => tracing::info!("UCX data path not listening on {addr}: {e}"),
            }
        }
    }
    Ok(l)
}

/// The lines memcached writes to `MEMCACHED_PORT_FILENAME`: one per TCP listener, then
/// one per UDP socket, each `TCP INET: <port>` (`INET6` for IPv6, `UDP` for UDP). The UCX
/// bootstrap port is not a memcached port and is not listed.
pub fn port_file_text(l: &Listeners) -> String {
    let tcp = l.tcp.iter().filter_map(|(t, _, _)| t.local_addr().ok());
    let udp = l.udp.iter().filter_map(|(u, _)| u.local_addr().ok());
    let mut text = String::new();
    for (proto, addr) in tcp.map(|a| ("TCP", a)).chain(udp.map(|a| ("UDP", a))) {
        let family = if addr.is_ipv6() { "INET6" } else { "INET" };
        text.push_str(&format!("{proto} {family}: {}\n", addr.port()));
    }
    text
}

/// Write the bound ports to `path` as memcached does: appended to `<path>.lck`, which is
/// then renamed to `path`, so a reader never sees a half-written file.
pub fn write_port_file(path: &std::path::Path, l: &Listeners) -> io::Result<()> {
    let mut lck = path.as_os_str().to_owned();
    lck.push(".lck");
    let mut f = std::fs::OpenOptions::new()
        .create(true)
        .append(true)
        .open(&lck)?;
    f.write_all(port_file_text(l).as_bytes())?;
    drop(f);
    std::fs::rename(&lck, path)
}

const SIGNAL: Token = Token(usize::MAX - 1);
const WAKE: Token = Token(usize::MAX - 2);
const UNIX: Token = Token(usize::MAX - 3);
/// UCX bootstrap listeners use tokens UCX_LISTENER.. (TCP listeners use 0..).
const UCX_LISTENER: usize = 1 << 20;

/// Run the accept loop until a signal or `shutdown` stops the server. `signals` is the
/// read end of the self-pipe the signal handlers write to; `hup` is set by SIGHUP (the
/// `-Y` file is read again, within one turn of the loop).
pub fn accept_loop(
    shared: &Arc<Shared>,
    listeners: &mut Listeners,
    workers: &[WorkerHandle],
    mut signals: mio::net::UnixStream,
    hup: &std::sync::atomic::AtomicBool,
) -> io::Result<()> {
    let mut poll = Poll::new()?;
    let waker = mio::Waker::new(poll.registry(), WAKE)?;
    // Only the first runtime sets it; a second (tests) would just not be woken early.
    let _ = shared.shutdown_waker.set(waker);
    poll.registry()
        .register(&mut signals, SIGNAL, Interest::READABLE)?;
    for (i, (t, name, _)) in listeners.tcp.iter_mut().enumerate() {
        poll.registry().register(t, Token(i), Interest::READABLE)?;
        let fd = t.as_raw_fd() as u64;
        let e = ConnEntry::new(name.clone(), None, false, ConnState::Listening);
        // memcached's listener counts `secs_since_last_cmd` from when it was made.
        e.touch(shared.store.clock().now());
        shared.conns.insert(fd, Arc::new(e));
    }
    for (i, (t, _)) in listeners.ucx.iter_mut().enumerate() {
        poll.registry()
            .register(t, Token(UCX_LISTENER + i), Interest::READABLE)?;
    }
    if let Some((u, name)) = listeners.unix.as_mut() {
        poll.registry().register(u, UNIX, Interest::READABLE)?;
        let e = ConnEntry::new(name.clone(), None, false, ConnState::Listening);
        e.touch(shared.store.clock().now());
        shared.conns.insert(u.as_raw_fd() as u64, Arc::new(e));
    }

    let mut events = Events::with_capacity(64);
    let mut rr = 0usize;
    // Set when accepting stopped early (fd exhaustion, or at the limit without
    // maxconns_fast): readiness is edge-triggered, so retry on a timer.
    let mut retry = false;
    while !shared.is_shutting_down() {
        let timeout = if retry && ACCEPT_FAILING.load(Ordering::Relaxed) {
            // Out of descriptors: back off (closing connections free some meanwhile).
            Duration::from_millis(100)
        } else if retry {
            Duration::from_millis(10)
        } else {
            Duration::from_millis(500)
        };
        match poll.poll(&mut events, Some(timeout)) {
            Ok(()) => {}
            Err(e) if e.kind() == io::ErrorKind::Interrupted => continue,
            Err(e) => return Err(e),
        }
        for ev in events.iter() {
            if ev.token() == SIGNAL {
                let mut buf = [0u8; 64];
                while matches!(io::Read::read(&mut signals, &mut buf), Ok(n) if n > 0) {}
                tracing::info!("Signal handled: stopping.");
                shared.request_shutdown();
            }
        }
        if shared.is_shutting_down() {
            break;
        }
        if hup.swap(false, Ordering::Relaxed) {
            if let Some(auth) = shared.settings.auth.as_ref() {
                match auth.reload() {
                    Ok(n) => tracing::info!("SIGHUP: auth file read again, {n} entries"),
                    Err(e) => tracing::warn!("SIGHUP: {e}; the previous entries stay"),
                }
            }
        }
        // Accept on every listener each round: cheap when nothing is pending, and it
        // covers listeners whose edge we left unconsumed last time.
        retry = false;
        for (t, name, tls) in listeners.tcp.iter() {
            let tls = tls.then_some(shared.settings.tls.as_ref()).flatten();
            retry |= accept_all(shared, workers, &mut rr, name, tls, || {
                t.accept().map(|(s, _)| {
                    let _ = s.set_nodelay(true);
                    Stream::Tcp(s)
                })
            });
        }
        if let Some((u, name)) = listeners.unix.as_ref() {
            retry |= accept_all(shared, workers, &mut rr, name, None, || {
                u.accept().map(|(s, _)| Stream::Unix(s))
            });
        }
        for (t, name) in listeners.ucx.iter() {
            retry |= accept_ucx(shared, t, name, workers, &mut rr);
        }
    }
    // Listeners close when the caller drops them; forget them in `stats conns` now.
    for (t, _, _) in &listeners.tcp {
        shared.conns.remove(t.as_raw_fd() as u64);
    }
    if let Some((u, _)) = &listeners.unix {
        shared.conns.remove(u.as_raw_fd() as u64);
    }
    Ok(())
}

/// Hand every pending UCX bootstrap connection to a worker, round-robin. A bootstrap
/// connection, and the UCX session it becomes, is a connection like any other: it counts
/// toward `-c` and is refused as memcached refuses TCP ones over the limit (the fabric
/// worker gives its slot back when the session ends, crate::ucx_frontend).
fn accept_ucx(
    shared: &Shared,
    t: &TcpListener,
    name: &str,
    workers: &[WorkerHandle],
    rr: &mut usize,
) -> bool {
    accept_into(shared, workers, rr, name, true, None, || {
        t.accept().map(|(s, _)| {
            let _ = s.set_nodelay(true);
            Stream::Tcp(s)
        })
    })
}

/// Whether accept() is failing (descriptors exhausted): logged once when it starts and
/// once when it ends, never per attempt. Process-wide, as descriptors are.
static ACCEPT_FAILING: std::sync::atomic::AtomicBool = std::sync::atomic::AtomicBool::new(false);

fn accept_failed(e: &io::Error) {
    if !ACCEPT_FAILING.swap(true, Ordering::Relaxed) {
        tracing::warn!("accept(): {e}; new connections wait in the queue until it succeeds");
    }
}

fn accept_succeeded() {
    if ACCEPT_FAILING.swap(false, Ordering::Relaxed) {
        tracing::warn!("accept() works again");
    }
}

/// Accept until the listener has nothing more. Returns true if it stopped early and
/// should be retried soon. With `tls`, each connection speaks TLS.
fn accept_all(
    shared: &Shared,
    workers: &[WorkerHandle],
    rr: &mut usize,
    listen_name: &str,
    tls: Option<&Arc<Tls>>,
    accept: impl FnMut() -> io::Result<Stream>,
) -> bool {
    accept_into(shared, workers, rr, listen_name, false, tls, accept)
}

/// `accept_all` for memcached (`ucx` false) or UCX bootstrap (`ucx` true) listeners.
fn accept_into(
    shared: &Shared,
    workers: &[WorkerHandle],
    rr: &mut usize,
    listen_name: &str,
    ucx: bool,
    tls: Option<&Arc<Tls>>,
    mut accept: impl FnMut() -> io::Result<Stream>,
) -> bool {
    loop {
        let limit = shared.settings.max_connections as u64;
        if !shared.settings.maxconns_fast && shared.curr_connections.load(Ordering::SeqCst) >= limit
        {
            shared.listen_disabled_num.fetch_add(1, Ordering::Relaxed);
            return true;
        }
        let mut stream = match accept() {
            Ok(s) => s,
            Err(e) if e.kind() == io::ErrorKind::WouldBlock => return false,
            Err(e) if e.kind() == io::ErrorKind::Interrupted => continue,
            Err(e) if e.kind() == io::ErrorKind::ConnectionAborted => continue,
            Err(e) => {
                // EMFILE/ENFILE and friends: the connection waits in the queue.
                accept_failed(&e);
                shared.listen_disabled_num.fetch_add(1, Ordering::Relaxed);
                return true;
            }
        };
        accept_succeeded();
        if shared.curr_connections.load(Ordering::SeqCst) >= limit {
            // Best effort: a fresh socket's send buffer takes this without blocking.
            let _ = stream.write(TOO_MANY_CONNECTIONS);
            shared.rejected_connections.fetch_add(1, Ordering::Relaxed);
            tracing::info!("Too many open connections");
            continue;
        }
        if workers.is_empty() {
            continue;
        }
        // TLS starts after the connection limit's plain refusal, as in memcached.
        let stream = match (tls, stream) {
            (Some(tls), Stream::Tcp(s)) => match tls.accept(s) {
                Ok(t) => Stream::Tls(Box::new(t)),
                Err(e) => {
                    tracing::warn!("cannot start TLS on a connection: {e}");
                    continue;
                }
            },
            (_, s) => s,
        };
        shared.curr_connections.fetch_add(1, Ordering::SeqCst);
        shared.total_connections.fetch_add(1, Ordering::Relaxed);
        let w = &workers[*rr % workers.len()];
        *rr = rr.wrapping_add(1);
        if w.send(NewConn {
            stream,
            listen_addr: listen_name.to_string(),
            ucx,
        })
        .is_err()
        {
            shared.curr_connections.fetch_sub(1, Ordering::SeqCst);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn listen_spec_with_port_overrides_default() {
        let a = resolve("127.0.0.1:5000", 11211).unwrap();
        assert_eq!(a, vec!["127.0.0.1:5000".parse().unwrap()]);
        let a = resolve("127.0.0.1", 11211).unwrap();
        assert_eq!(a, vec!["127.0.0.1:11211".parse().unwrap()]);
        let a = resolve("::1", 7).unwrap();
        assert_eq!(a, vec!["[::1]:7".parse().unwrap()]);
        let a = resolve("[::1]:8", 7).unwrap();
        assert_eq!(a, vec!["[::1]:8".parse().unwrap()]);
    }

    /// Each case checked against memcached 1.6.18 (`-p P -l SPEC`, then `ss -ltn`).
    #[test]
    fn listen_specs_read_as_memcached_reads_them() {
        let one = |spec: &str| -> Vec<String> {
            resolve(spec, 7)
                .unwrap()
                .iter()
                .map(ToString::to_string)
                .collect()
        };
        // More than one colon and no brackets: an address without a port (`::1:8000` is
        // the address ::0.1:8000; `::1:40341` none at all).
        assert_eq!(one("::1:8000"), ["[::1:8000]:7"]);
        assert!(resolve("::1:40341", 7).is_err());
        assert_eq!(one("::1"), ["[::1]:7"]);
        // After `]`, text without a colon is ignored.
        assert_eq!(one("[::1]x"), ["[::1]:7"]);
        assert_eq!(one("*"), ["0.0.0.0:7", "[::]:7"]);
        assert_eq!(one("*:8"), ["0.0.0.0:8", "[::]:8"]);
        assert_eq!(one("127.0.0.1:8 "), ["127.0.0.1:8"]);
        // getaddrinfo keeps the port's low 16 bits.
        assert_eq!(one("127.0.0.1:70000"), ["127.0.0.1:4464"]);
        let msg = |spec: &str| resolve(spec, 7).unwrap_err().to_string();
        assert_eq!(
            msg("127.0.0.1:abc"),
            "Invalid port number: \"abc\"\nfailed to listen on one of interface(s) 127.0.0.1:abc"
        );
        assert_eq!(
            msg("[::1"),
            "Invalid IPV6 address: \"[::1\"\nfailed to listen on one of interface(s) [::1"
        );
    }

    #[test]
    fn sock_cookie_id_marks_tcp_and_udp_listeners() {
        let addr: SocketAddr = "127.0.0.1:0".parse().unwrap();
        let t = bind_tcp(addr, 16, Some(7)).unwrap();
        let u = bind_udp(addr, Some(7)).unwrap();
        let unmarked = bind_tcp(addr, 16, None).unwrap();
        // Setting SO_MARK needs CAP_NET_ADMIN; without it the listener still exists
        // (memcached's behaviour) and is simply unmarked.
        let probe = Socket::new(Domain::IPV4, Type::STREAM, None).unwrap();
        let want = if probe.set_mark(7).is_ok() { 7 } else { 0 };
        assert_eq!(socket2::SockRef::from(&t).mark().unwrap(), want);
        assert_eq!(socket2::SockRef::from(&u).mark().unwrap(), want);
        assert_eq!(socket2::SockRef::from(&unmarked).mark().unwrap(), 0);
    }

    #[test]
    fn port_file_lists_tcp_then_udp_with_their_family() {
        let v4: SocketAddr = "127.0.0.1:0".parse().unwrap();
        let v6: SocketAddr = "[::1]:0".parse().unwrap();
        let t = bind_tcp(v4, 16, None).unwrap();
        let u = bind_udp(v4, None).unwrap();
        let (tp, up) = (
            t.local_addr().unwrap().port(),
            u.local_addr().unwrap().port(),
        );
        let mut l = Listeners {
            tcp: vec![(t, "t".into(), false)],
            unix: None,
            udp: vec![(u, "u".into())],
            ucx: vec![(bind_tcp(v4, 16, None).unwrap(), "x".into())],
        };
        let mut want = format!("TCP INET: {tp}\n");
        // IPv6 loopback, where the host has it.
        if let Ok(t6) = bind_tcp(v6, 16, None) {
            want.push_str(&format!("TCP INET6: {}\n", t6.local_addr().unwrap().port()));
            l.tcp.push((t6, "t6".into(), false));
        }
        want.push_str(&format!("UDP INET: {up}\n"));
        assert_eq!(port_file_text(&l), want);
    }

    #[test]
    fn localhost_resolves() {
        let a = resolve("localhost", 9).unwrap();
        assert!(a.iter().all(|s| s.port() == 9 && s.ip().is_loopback()));
    }
}
