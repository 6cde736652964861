//! memfabric's client library.
//!
//! Three layers, each knowing only the one below it:
//!
//! 1. **Operations** ([`op`]): what to do — [`Op`] (get, gat, store in six modes, delete,
//!    incr/decr, touch, flush_all, stats, version, noop) and its [`Reply`]. No I/O.
//! 2. **Pool and ketama** ([`client`], [`ketama`]): which server — a key is placed on the
//!    ring exactly as libmemcached's (weighted) ketama places it, so memfabric and libmemcached
//!    clients share a fleet. The [`Client`] owns the pool: it connects lazily, gives every
//!    request a deadline, marks a server down after a timeout or a connection failure (for
//!    `retry_timeout`; optionally failing over to the next live server on the ring), and
//!    exposes the async core: issue → [`Handle`] → [`Client::test`] / [`Client::wait`] /
//!    [`Client::wait_all`]. Blocking calls (`get`, `set`, ...) are issue + wait; the
//!    non-blocking `iset`/`iget` (complete later) and `bset`/`bget` (return once the caller's
//!    buffers may be reused) are thin names over the same core.
//! 3. **Transport** ([`transport`]): how bytes move — one [`Transport`] serves all servers of a
//!    pool. [`tcp`] speaks memcached's meta protocol ([`meta`]) over non-blocking sockets polled
//!    together with `mio`, pipelining requests and matching replies in order; [`ucx`] speaks
//!    memfabricd's fabric protocol. The transports depend on [`transport`] only; the pool
//!    picks one per scheme ([`client::make_transport`]).
//!
//! Beside them, [`ec`] cuts a value into erasure-coded fragments and rebuilds it from any
//! `k` of them (no I/O; the pool will place the fragments with
//! [`ketama::Continuum::successors`]).
//!
//! ```no_run
//! use memfabric_client::{Client, Config};
//! let mut c = Client::new("127.0.0.1:11211,127.0.0.1:11212", Config::default())?;
//! c.set(b"greeting", b"hello", 0, 0)?;
//! assert_eq!(&c.get(b"greeting")?.unwrap().data[..], b"hello");
//! let hs: Vec<_> = (0..100).map(|i| c.iget(format!("k{i}").as_bytes())).collect();
//! for r in c.wait_all(&hs, std::time::Duration::from_secs(1)) {
//!     let _ = r?;
//! }
//! # Ok::<(), memfabric_client::Error>(())
//! ```

pub mod addr;
pub mod client;
pub mod ec;
mod ec_pool;
pub mod error;
pub mod ketama;
pub mod meta;
mod modify;
mod onesided;
pub mod op;
mod probe;
mod refill;
mod repair;
pub mod replicate;
mod tasks;
pub mod tcp;
pub mod tls;
pub mod transport;
pub mod ucx;

pub use addr::{Scheme, ServerAddr};
pub use client::{Client, Config, Credentials, Handle, IntoServers, TlsConfig};
pub use ec::EcGeometry;
pub use error::Error;
pub use ketama::{Distribution, KeyHash};
pub use op::{Op, Reply, StoreMode, StoreStatus, Ttl, Value};
pub use repair::RepairCounters;
pub use tasks::{Acks, PoolCounters, WritePolicy};
pub use transport::{Completion, ConnId, GetMode, Transport};
