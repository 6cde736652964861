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
//! own answer, `connect_timeout` for the connect and as long again for the answer:
//! memcached's `version` (any reply counts, an authentication error or a closed connection
//! included: only a running server sends them), the TLS handshake with the pool's TLS
//! settings, or on a UCX bootstrap port a HELLO of a protocol version no server speaks
//! (answered at once, before UCX or any session is involved; docs/fabric-protocol.md
//! 1.1).
use std::io::{self, Read, Write};
use std::net::{TcpStream, ToSocketAddrs};
use std::sync::Arc;
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use rustls::pki_types::ServerName;
use rustls::{ClientConfig, ClientConnection};

use crate::addr::{Scheme, ServerAddr};
use crate::tls::TlsConfig;

/// What a probe sends to make the server answer.
#[derive(Clone)]
pub(crate) enum Hail {
    /// memcached's text protocol: `version`.
    Text,
    /// A TLS handshake (`-Z` servers) as the pool's connections make it; its client
    /// settings are loaded in the probe's thread (reading CA files is no work for the
    /// thread that serves requests).
    Tls(TlsConfig),
    /// A UCX bootstrap port: a HELLO of protocol version 0.
    UcxBootstrap,
}

impl Hail {
    /// How to probe `addr` for a pool whose connections use `tls`.
    pub(crate) fn for_server(addr: &ServerAddr, tls: Option<&TlsConfig>) -> Hail {
        match (addr.scheme, tls) {
            (Scheme::Ucx, _) => Hail::UcxBootstrap,
            (Scheme::Tcp, Some(t)) => Hail::Tls(t.clone()),
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
    /// The connect and the answer get `timeout` each (the pool's own connect needs one
    /// round trip, the probe two: a server that meets the pool's deadlines passes it).
    pub(crate) fn start(addr: &ServerAddr, timeout: Duration, hail: Hail) -> Option<Probe> {
        let (host, port) = (addr.host.clone(), addr.port);
        std::thread::Builder::new()
            .name("memfabric-probe".into())
            .spawn(move || {
                let Ok(addrs) = (host.as_str(), port).to_socket_addrs() else {
                    return false;
                };
                let hail = match hail {
                    Hail::Tls(t) => match crate::tls::client_config(&t) {
                        Ok(config) => Loaded::Tls {
                            config,
                            // The name the pool's own connections check: the server's host.
                            name: t.server_name.unwrap_or_else(|| host.clone()),
                        },
                        // The pool cannot connect either; any answer shows the server runs.
                        Err(_) => Loaded::Text,
                    },
                    Hail::Text => Loaded::Text,
                    Hail::UcxBootstrap => Loaded::UcxBootstrap,
                };
                addrs.into_iter().any(|sa| {
                    TcpStream::connect_timeout(&sa, timeout)
                        .is_ok_and(|sock| answers(&sock, &hail, Instant::now() + timeout))
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

/// [`Hail`] with its TLS settings loaded.
enum Loaded {
    Text,
    Tls {
        config: Arc<ClientConfig>,
        name: String,
    },
    UcxBootstrap,
}

/// Sets `sock`'s timeouts to what is left until `deadline`; false once nothing is.
fn time_left(sock: &TcpStream, deadline: Instant) -> bool {
    let left = deadline.saturating_duration_since(Instant::now());
    !left.is_zero()
        && sock.set_read_timeout(Some(left)).is_ok()
        && sock.set_write_timeout(Some(left)).is_ok()
}

/// Whether the server behind `sock` answers `hail` before `deadline`. The connection is
/// closed afterwards: the server sees a client that came and went, as memcached and
/// memfabricd take in their stride.
fn answers(sock: &TcpStream, hail: &Loaded, deadline: Instant) -> bool {
    let request = match hail {
        Loaded::Text => b"version\r\n".to_vec(),
        Loaded::UcxBootstrap => bogus_hello(),
        Loaded::Tls { config, name } => {
            return match tls_handshake_answers(sock, config, name, deadline) {
                Some(answered) => answered,
                // No handshake could be started: the text probe.
                None => answers(sock, &Loaded::Text, deadline),
            };
        }
    };
    if !time_left(sock, deadline) {
        return false;
    }
    let mut s = sock;
    if let Err(e) = s.write_all(&request) {
        return !ran_out_of_time(&e);
    }
    if !time_left(sock, deadline) {
        return false;
    }
    let mut byte = [0u8; 1];
    // A reply, or the server closed the connection (`UnexpectedEof`) or reset it: either
    // way it runs. Only silence until the deadline says it does not.
    match s.read_exact(&mut byte) {
        Ok(()) => true,
        Err(e) => !ran_out_of_time(&e),
    }
}

/// The TLS handshake with the pool's settings, each step within what is left until
/// `deadline`; a failure the server sent (an alert, a certificate the pool does not
/// accept) still shows that it runs. `None` when no handshake could be started (a server
/// name rustls does not take).
fn tls_handshake_answers(
    sock: &TcpStream,
    config: &Arc<ClientConfig>,
    name: &str,
    deadline: Instant,
) -> Option<bool> {
    let server_name = ServerName::try_from(name.to_string()).ok()?;
    let mut conn = ClientConnection::new(Arc::clone(config), server_name).ok()?;
    let mut s = sock;
    while conn.is_handshaking() {
        if !time_left(sock, deadline) {
            return Some(false);
        }
        if let Err(e) = conn.complete_io(&mut s) {
            return Some(!ran_out_of_time(&e));
        }
    }
    Some(true)
}

/// A socket timeout (the server did not answer in time) as opposed to an answer.
fn ran_out_of_time(e: &io::Error) -> bool {
    matches!(
        e.kind(),
        io::ErrorKind::WouldBlock | io::ErrorKind::TimedOut
    )
}

/// A HELLO no server accepts (protocol version 0, no worker address): memfabricd answers
/// it with WELCOME "unsupported version" and closes, counting nothing (with `-Y` it
/// answers with a challenge instead: equally an answer).
fn bogus_hello() -> Vec<u8> {
    memfabric_proto::ucx_wire::Hello {
        version: 0,
        ucx_version: 0,
        worker_address: Vec::new(),
    }
    .encode()
}
