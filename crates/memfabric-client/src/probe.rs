//! Reachability probes for servers of a replicated or coded pool that were last lost to a
//! timeout (a cut link, a host gone): reconnecting to such a server inline blocked the
//! whole client for `connect_timeout` every `retry_timeout`, though the other copies
//! could serve meanwhile. Instead, a short-lived thread tries a TCP connection to the
//! server's address; until it has reached it the server stays out of the pool's
//! operations (they fail over or write fewer copies, as for a server marked down), and
//! the pool connects inline only once the probe succeeded (docs/resilience.md,
//! "Deadlines and unreachable servers").
use std::net::{TcpStream, ToSocketAddrs};
use std::thread::JoinHandle;
use std::time::Duration;

use crate::addr::ServerAddr;

/// One probe in flight (or finished, its result not yet taken).
pub(crate) struct Probe(JoinHandle<bool>);

impl Probe {
    /// Try `addr` in the background, each of its resolved addresses for at most `timeout`;
    /// `None` when no thread could be started (the pool then connects inline, as it would
    /// without probes).
    pub(crate) fn start(addr: &ServerAddr, timeout: Duration) -> Option<Probe> {
        let (host, port) = (addr.host.clone(), addr.port);
        std::thread::Builder::new()
            .name("memfabric-probe".into())
            .spawn(move || {
                let Ok(addrs) = (host.as_str(), port).to_socket_addrs() else {
                    return false;
                };
                // The connection is closed at once: the server sees a client that came
                // and went, as memcached and memfabricd take in their stride.
                addrs
                    .into_iter()
                    .any(|sa| TcpStream::connect_timeout(&sa, timeout).is_ok())
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
