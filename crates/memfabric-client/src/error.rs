//! The client's error type.

/// Every way an operation can fail. Server-side answers that are not errors (a miss, `NOT_STORED`,
/// `EXISTS`, `NOT_FOUND`) are values of [`crate::Reply`], not errors.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum Error {
    /// The request did not complete within its deadline; the server has been marked down.
    #[error("{server}: timed out")]
    Timeout { server: String },
    /// The server is marked down (an earlier timeout or connection failure) and its retry time
    /// has not come yet, or it could not be connected to.
    #[error("{server}: server is marked down")]
    ServerDown { server: String },
    /// The connection failed (reset, closed by the peer, write error).
    #[error("{server}: {msg}")]
    Io { server: String, msg: String },
    /// The server wants credentials the pool was not given, or refused the ones it was
    /// (`Config::credentials`; memfabricd and memcached `-Y`).
    #[error("{server}: {msg}")]
    Auth { server: String, msg: String },
    /// The server sent something the client cannot parse, or a feature is missing.
    #[error("protocol error: {0}")]
    Protocol(String),
    /// `SERVER_ERROR <text>` from the server.
    #[error("SERVER_ERROR {0}")]
    Server(String),
    /// `CLIENT_ERROR <text>` (e.g. incr of a non-numeric value), or `ERROR` (text "ERROR").
    #[error("CLIENT_ERROR {0}")]
    Client(String),
    /// The value is larger than the server's item size limit.
    #[error("object too large for cache")]
    TooLarge,
    /// The pool has no server to send the request to.
    #[error("no servers")]
    NoServers,
    /// The key is empty, longer than 250 bytes, or contains whitespace or control characters.
    #[error("invalid key")]
    InvalidKey,
    /// The connection was closed by the client while the request was in flight.
    #[error("connection closed")]
    Closed,
    /// A handle that this client never issued, or whose result was already collected.
    #[error("unknown or already collected handle")]
    UnknownHandle,
    /// A replicated operation reached fewer copies than the pool's write policy asks for
    /// (writes), or could not rule out a copy it failed to reach (reads). The operation may
    /// have taken effect on some copies; `cause` is the last copy's error.
    #[error("{acked} of {copies} copies answered, {needed} needed: {cause}")]
    NotEnoughCopies {
        acked: u8,
        needed: u8,
        copies: u8,
        cause: String,
    },
    /// A pool without `ec` or `replicas` read one fragment of a value erasure coded with
    /// RS(`k`, `m`) (by a pool with `ec`), which is not the value. `get`, `gets`, `gat`
    /// and `get_multi` then read the value whole from its k+m servers and give this error
    /// only when that fails (`cause`); non-blocking reads give it for such keys, as do
    /// libmemfabric's and the Python package's per-server pools.
    #[error("the key holds a fragment of a value coded RS({k},{m}); reading it whole: {cause}")]
    CodedValue { k: u8, m: u8, cause: String },
    /// A server list or option that cannot be parsed.
    #[error("invalid configuration: {0}")]
    Config(String),
}
