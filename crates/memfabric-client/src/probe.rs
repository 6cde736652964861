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
pub(crate) struct Probe(Option<JoinHandle<bool>>);

impl Probe {
    /// Try `addr` in the background, each of its resolved addresses for at most `timeout`.
    pub(crate) fn start(addr: &ServerAddr, timeout: Duration) -> Probe {
        let (host, port) = (addr.host.clone(), addr.port);
        let spawned = std::thread::Builder::new()
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
            });
        // Without a thread, the pool connects inline as it would without probes.
        Probe(spawned.ok())
    }

    /// Whether the probe still runs (the server counts as down meanwhile).
    pub(crate) fn running(&self) -> bool {
        self.0.as_ref().is_some_and(|h| !h.is_finished())
    }

    /// `None` while the probe runs; then whether it reached the server (taken once: the
    /// caller drops the probe with its result).
    pub(crate) fn result(&mut self) -> Option<bool> {
        match &self.0 {
            None => Some(true),
            Some(h) if !h.is_finished() => None,
            Some(_) => self.0.take().map(|h| h.join().unwrap_or(false)),
        }
    }
}
