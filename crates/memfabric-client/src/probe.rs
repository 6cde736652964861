//! Reachability probes for servers of a replicated or coded pool that were last lost to a
//! timeout (a cut link, a host gone, a paused process): reconnecting to such a server
//! inline blocked the whole client for `connect_timeout` every `retry_timeout`, though the
//! other copies could serve meanwhile. Instead, a short-lived thread asks the server to
//! answer; until it has, the server stays out of the pool's operations (they fail over or
//! write fewer copies, as for a server marked down), and the pool connects inline only
//! once the probe succeeded (docs/resilience.md, "Deadlines and unreachable servers").
//!
//! A TCP connection alone does not tell a live server from a paused one (the kernel
//! completes the handshake for a stopped process), so the probe waits for the server's
//! own answer, within `connect_timeout`: memcached's `version` (any reply counts, an
//! authentication error or a closed connection included: only a running server sends
//! them), the TLS handshake with the pool's TLS settings, or on a UCX bootstrap port a
//! HELLO of a protocol version no server speaks (answered at once with a refusal, before
//! UCX or any session is involved; docs/fabric-protocol.md 1.1).
use std::io::{self, Read, Write};
use std::net::{TcpStream, ToSocketAddrs};
use std::sync::Arc;
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use rustls::pki_types::ServerName;
use rustls::{ClientConfig, ClientConnection};

use crate::addr::{Scheme, ServerAddr};

/// What a probe sends to make the server answer.
pub(crate) enum Hail {
    /// memcached's text protocol: `version`.
    Text,
    /// A TLS handshake (`-Z` servers) as the pool's connections make it.
    Tls {
        config: Arc<ClientConfig>,
        name: String,
    },
    /// A UCX bootstrap port: a HELLO of protocol version 0.
    UcxBootstrap,
}

impl Hail {
    /// How to probe `addr` for a pool whose connections use `tls` (its client config and
    /// the name certificates are checked against; `None` when the pool has no TLS or its
    /// settings could not be loaded: then the text probe, which a TLS server answers by
    /// closing the connection, still tells a running server from a stopped one).
    pub(crate) fn for_server(addr: &ServerAddr, tls: Option<(Arc<ClientConfig>, String)>) -> Hail {
        match (addr.scheme, tls) {
            (Scheme::Ucx, _) => Hail::UcxBootstrap,
            (Scheme::Tcp, Some((config, name))) => Hail::Tls { config, name },
            (Scheme::Tcp, None) => Hail::Text,
        }
    }
}

/// One probe in flight (or finished, its result not yet taken).
pub(crate) struct Probe(JoinHandle<bool>);

impl Probe {
    /// Try `addr` in the background, each of its resolved addresses for at most `timeout`;
    /// `None` when no thread could be started (the pool then connects inline, as it would
    /// without probes).
    pub(crate) fn start(addr: &ServerAddr, timeout: Duration, hail: Hail) -> Option<Probe> {
        let (host, port) = (addr.host.clone(), addr.port);
        std::thread::Builder::new()
            .name("memfabric-probe".into())
            .spawn(move || {
                let Ok(addrs) = (host.as_str(), port).to_socket_addrs() else {
                    return false;
                };
                addrs.into_iter().any(|sa| {
                    let deadline = Instant::now() + timeout;
                    TcpStream::connect_timeout(&sa, timeout)
                        .is_ok_and(|sock| answers(&sock, &hail, deadline))
                })
            })
            .ok()
            .map(Probe)
    }

    /// Whether the probe still runs (the server counts as down meanwhile).
    pub(crate) fn running(&self) -> bool {
        !self.0.is_finished()
    }

    /// Whether the finished probe reached the server.
    pub(crate) fn reached(self) -> bool {
        self.0.join().unwrap_or(false)
    }
}

/// Whether the server behind `sock` answers `hail` before `deadline`. The connection is
/// closed afterwards: the server sees a client that came and went, as memcached and
/// memfabricd take in their stride.
fn answers(sock: &TcpStream, hail: &Hail, deadline: Instant) -> bool {
    let left = deadline
        .saturating_duration_since(Instant::now())
        .max(Duration::from_millis(1));
    if sock.set_read_timeout(Some(left)).is_err() || sock.set_write_timeout(Some(left)).is_err() {
        return false;
    }
    let mut s = sock;
    let said = match hail {
        Hail::Text => s.write_all(b"version\r\n"),
        Hail::UcxBootstrap => s.write_all(&bogus_hello()),
        Hail::Tls { config, name } => return tls_answers(sock, config, name),
    };
    if let Err(e) = said {
        return !ran_out_of_time(&e);
    }
    let mut byte = [0u8; 1];
    // A reply, or the server closed the connection (`UnexpectedEof`) or reset it: either
    // way it runs. Only silence until the deadline says it does not.
    match s.read_exact(&mut byte) {
        Ok(()) => true,
        Err(e) => !ran_out_of_time(&e),
    }
}

/// The TLS handshake with the pool's settings; a failure the server sent (an alert, a
/// certificate the pool does not accept) still shows that it runs.
fn tls_answers(sock: &TcpStream, config: &Arc<ClientConfig>, name: &str) -> bool {
    let Ok(server_name) = ServerName::try_from(name.to_string()) else {
        return true;
    };
    let Ok(mut conn) = ClientConnection::new(Arc::clone(config), server_name) else {
        return true;
    };
    let mut s = sock;
    while conn.is_handshaking() {
        match conn.complete_io(&mut s) {
            Ok(_) => {}
            Err(e) => return !ran_out_of_time(&e),
        }
    }
    true
}

/// A socket timeout (the server did not answer in time) as opposed to an answer.
fn ran_out_of_time(e: &io::Error) -> bool {
    matches!(
        e.kind(),
        io::ErrorKind::WouldBlock | io::ErrorKind::TimedOut
    )
}

/// A HELLO no server accepts (protocol version 0, no worker address): memfabricd answers
/// it with WELCOME "unsupported version" and closes, counting nothing (with `-Y`, a
/// challenge, equally an answer).
fn bogus_hello() -> Vec<u8> {
    memfabric_proto::ucx_wire::Hello {
        version: 0,
        ucx_version: 0,
        worker_address: Vec::new(),
    }
    .encode()
}
