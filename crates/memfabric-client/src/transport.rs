//! The transport interface: one transport object carries the requests to all servers of a pool.
//! The transports (`tcp`, `ucx`) depend on this module, never the reverse: the pool
//! (`client.rs`) is where a scheme picks one.

use std::time::Duration;

use crate::addr::ServerAddr;
use crate::error::Error;
use crate::op::{Op, Reply};

/// A connection of a transport, named by the transport.
pub type ConnId = usize;

/// A finished request.
#[derive(Debug)]
pub struct Completion {
    pub id: u64,
    pub result: Result<Reply, Error>,
}

/// One transport serves all servers of a pool (a UCX transport shares one UCX worker across
/// them). Requests on one connection complete in the order they were submitted.
pub trait Transport {
    /// Opens a connection, waiting at most `timeout`.
    fn connect(&mut self, addr: &ServerAddr, timeout: Duration) -> Result<ConnId, Error>;
    /// Queue `op` with request id `id` on `conn`; may send at once or at the next progress.
    fn submit(&mut self, conn: ConnId, id: u64, op: Op) -> Result<(), Error>;
    /// Send what is queued and collect finished requests. Blocks at most `timeout` (ZERO = poll
    /// once) and returns early as soon as at least one completion is pushed. A connection that
    /// fails completes all its in-flight requests with an error and is reported in `failed`.
    fn progress(
        &mut self,
        timeout: Duration,
        done: &mut Vec<Completion>,
        failed: &mut Vec<ConnId>,
    ) -> Result<(), Error>;
    /// Drop a connection; its in-flight requests are completed with Error::Closed at the next
    /// progress.
    fn close(&mut self, conn: ConnId);
    /// The server's instance id, when the connection's handshake carried it (UCX's
    /// WELCOME); `None` = ask the server (`stats fabric`).
    fn instance(&self, _conn: ConnId) -> Option<String> {
        None
    }
    /// The transport's own counters (e.g. how GETs were served), name and value.
    fn counters(&self) -> Vec<(String, u64)> {
        Vec::new()
    }
}

/// How GETs reach a server that offers one-sided reads (`ucx://` servers; TCP servers are
/// always two-sided).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum GetMode {
    /// Always ask the server (an active message).
    TwoSided,
    /// Read the item from the server's memory with RMA reads, wherever the transport can
    /// (falling back to asking the server when a read is not conclusive).
    OneSided,
    /// One-sided where the transport reads natively (shared memory, RDMA verbs), two-sided
    /// where UCX would only emulate RMA (TCP).
    #[default]
    Auto,
}

impl std::str::FromStr for GetMode {
    type Err = String;
    fn from_str(s: &str) -> Result<Self, String> {
        match s {
            "two-sided" | "twosided" => Ok(GetMode::TwoSided),
            "one-sided" | "onesided" => Ok(GetMode::OneSided),
            "auto" => Ok(GetMode::Auto),
            _ => Err(format!(
                "unknown GET mode '{s}' (two-sided, one-sided, auto)"
            )),
        }
    }
}

/// A user of a server's `-Y` file. Over TCP the pool sends memcached's ascii handshake
/// on every new connection; over UCX it answers the bootstrap's challenge with a MAC of
/// the password (docs/fabric-protocol.md 1.4). Neither may contain a space (memcached's
/// handshake splits at spaces).
#[derive(Clone, PartialEq, Eq)]
pub struct Credentials {
    pub username: String,
    pub password: String,
}

/// The password is not printed.
impl std::fmt::Debug for Credentials {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Credentials")
            .field("username", &self.username)
            .finish_non_exhaustive()
    }
}
