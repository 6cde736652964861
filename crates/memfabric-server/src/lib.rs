//! memfabricd: listeners, worker loops and command execution against the store.
//!
//! Path of a request: `net` (listener hands a connection to a worker) → `worker` (event
//! loop) → `conn` (reads bytes) → `exec::process` (detects ascii or binary, frames
//! requests, runs them against `memfabric_store::Store`, appends replies) → `conn` writes
//! the replies. UDP datagrams go `worker` → `udp` → `exec::process`. `runtime` wires it
//! all up from `Settings` (which `cli` builds from memcached's flags). `fabric` is the UCX
//! active-message path, served by the same worker loops.

pub mod auth;
pub mod bounds;
pub mod cli;
pub mod command;
pub mod conn;
pub mod counters;
pub mod exec;
pub mod flash_reads;
pub mod net;
pub mod outqueue;
pub mod pending;
pub mod runtime;
pub mod settings;
pub mod shared;
pub mod tls;
pub mod ucx_context;
pub mod ucx_frontend;
pub mod udp;
pub mod worker;

// The store sizes its key buffers by its own limit (it knows no protocol); every key the
// protocols accept must fit them.
const _: () = assert!(memfabric_store::KEY_MAX_LEN == memfabric_proto::KEY_MAX_LEN);
